"""Drawing primitives of the synthetic world: silhouettes, object fills, background textures.

The layer both :mod:`curate.collect.synthetic` (the world) and :mod:`curate.collect.planted`
(its planted problems) draw with; it imports neither. Every function draws from the
``numpy.random.Generator`` it is given, in a fixed order, so a world is deterministic for a
seed (moving these here from ``synthetic`` changed no draw: the worlds are byte-identical).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["BACKGROUNDS", "OBJECT_PALETTE", "SHAPES", "background_texture", "draw_mask", "eroded", "object_texture",
           "smooth_noise"]

#: The background textures the world can draw (the paper's vocabulary, §2.1).
BACKGROUNDS: tuple[str, ...] = ("snow", "water", "sky", "grass", "sand", "rock", "earth", "tree", "indoor", "road")


# ---------------------------------------------------------------------------------------------
# Shapes: polygons in unit coordinates (centred at 0, radius ~1), rotated/scaled per sample.
# ---------------------------------------------------------------------------------------------


def _regular(n: int, phase: float = 0.0) -> np.ndarray:
    t = np.linspace(0, 2 * math.pi, n, endpoint=False) + phase
    return np.stack([np.cos(t), np.sin(t)], axis=1)


def _star(points: int = 5, inner: float = 0.45) -> np.ndarray:
    t = np.linspace(0, 2 * math.pi, 2 * points, endpoint=False) - math.pi / 2
    r = np.where(np.arange(2 * points) % 2 == 0, 1.0, inner)
    return np.stack([r * np.cos(t), r * np.sin(t)], axis=1)


def _heart() -> np.ndarray:
    t = np.linspace(0, 2 * math.pi, 40, endpoint=False)
    x = 16 * np.sin(t) ** 3
    y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
    pts = np.stack([x, y], axis=1) / 17.0
    return pts - pts.mean(axis=0)


SHAPES: dict[str, Callable[[], np.ndarray]] = {
    "circle": lambda: _regular(40),
    "triangle": lambda: _regular(3, -math.pi / 2),
    "square": lambda: _regular(4, math.pi / 4),
    "hexagon": lambda: _regular(6),
    "star": _star,
    "cross": lambda: np.array(
        [[-0.3, -1], [0.3, -1], [0.3, -0.3], [1, -0.3], [1, 0.3], [0.3, 0.3], [0.3, 1], [-0.3, 1],
         [-0.3, 0.3], [-1, 0.3], [-1, -0.3], [-0.3, -0.3]], dtype=float
    ),
    "crescent": lambda: _regular(40),  # the bite is cut in draw_mask
    "arrow": lambda: np.array(
        [[-1, -0.3], [0.2, -0.3], [0.2, -0.8], [1, 0], [0.2, 0.8], [0.2, 0.3], [-1, 0.3]], dtype=float
    ),
    "heart": _heart,
    "ring": lambda: _regular(40),  # the hole is cut in draw_mask
}

# Object colours shared by all classes (so colour never identifies the class).
OBJECT_PALETTE = np.array(
    [[200, 60, 50], [230, 160, 40], [120, 70, 160], [60, 60, 60], [240, 240, 240], [150, 100, 60],
     [50, 120, 200], [220, 100, 170]], dtype=np.float32
)


def draw_mask(shape: str, size: int, rng: np.random.Generator, *, scale: float = 1.0) -> np.ndarray:
    """Binary (size x size) mask of one randomly placed, rotated and scaled silhouette.

    ``scale`` multiplies the drawn radius after every draw, so the stream advances the same for
    any ``scale`` and ``scale=1.0`` is exactly the unscaled silhouette.
    """
    pts = SHAPES[shape]()
    angle = rng.uniform(-0.35, 0.35)  # bounded rotation: silhouettes stay recognisable at 48 px
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    radius = rng.uniform(0.28, 0.38) * size
    centre = size / 2 + rng.uniform(-0.12, 0.12, size=2) * size
    radius = radius * scale
    xy = pts @ rot.T * radius + centre
    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    draw.polygon([tuple(p) for p in xy], fill=1)
    if shape == "ring":
        hole = _regular(40) @ rot.T * radius * 0.5 + centre
        draw.polygon([tuple(p) for p in hole], fill=0)
    elif shape == "crescent":
        bite = (_regular(40) * 0.8 + np.array([0.55, 0.0])) @ rot.T * radius + centre
        draw.polygon([tuple(p) for p in bite], fill=0)
    return np.asarray(canvas, dtype=np.uint8)


def object_texture(size: int, rng: np.random.Generator) -> np.ndarray:
    """An object fill: a palette colour with random stripes or dots (shared by all classes)."""
    base = OBJECT_PALETTE[rng.integers(len(OBJECT_PALETTE))]
    second = OBJECT_PALETTE[rng.integers(len(OBJECT_PALETTE))]
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    kind = rng.integers(3)
    if kind == 0:
        weight = np.zeros((size, size), np.float32)
    elif kind == 1:
        freq, ang = rng.uniform(0.3, 0.8), rng.uniform(0, math.pi)
        weight = (np.sin(freq * (xx * math.cos(ang) + yy * math.sin(ang))) > 0.3).astype(np.float32)
    else:
        weight = (np.sin(0.7 * xx) * np.sin(0.7 * yy) > 0.5).astype(np.float32)
    img = base[None, None, :] * (1 - weight[..., None] * 0.6) + second[None, None, :] * (weight[..., None] * 0.6)
    return img + rng.normal(0, 6, size=(size, size, 3)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Backgrounds: procedural textures, each with a strong colour and a pattern of its own.
# ---------------------------------------------------------------------------------------------


def smooth_noise(size: int, rng: np.random.Generator, cells: int) -> np.ndarray:
    """Value noise in [0, 1]: a coarse random grid upsampled bilinearly."""
    grid = rng.random((cells + 1, cells + 1)).astype(np.float32)
    img = Image.fromarray((grid * 255).astype(np.uint8)).resize((size, size), Image.BILINEAR)
    return np.asarray(img, dtype=np.float32) / 255.0


def background_texture(size: int, rng: np.random.Generator, kind: str) -> np.ndarray:
    """A (size x size x 3) float32 texture of background ``kind`` (one of :data:`BACKGROUNDS`)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    n1 = smooth_noise(size, rng, 4)
    n2 = smooth_noise(size, rng, 12)
    fine = rng.random((size, size)).astype(np.float32)

    def mix(c1: Sequence[float], c2: Sequence[float], w: np.ndarray) -> np.ndarray:
        a, b = np.asarray(c1, np.float32), np.asarray(c2, np.float32)
        return a * (1 - w[..., None]) + b * w[..., None]

    if kind == "grass":
        blades = (np.sin(xx * size * rng.uniform(1.6, 2.4) + n2 * 6) > 0.2).astype(np.float32)
        img = mix([40, 110, 30], [110, 180, 60], 0.5 * blades + 0.5 * n2)
    elif kind == "water":
        waves = 0.5 + 0.5 * np.sin(yy * size * rng.uniform(0.5, 0.8) + n1 * 5)
        img = mix([20, 60, 140], [80, 150, 210], 0.7 * waves + 0.3 * n2)
    elif kind == "snow":
        img = mix([215, 220, 235], [250, 250, 255], n1) - 25 * (fine > 0.92)[..., None]
    elif kind == "sand":
        ripples = 0.5 + 0.5 * np.sin((yy + 0.3 * xx) * size * 0.9 + n1 * 3)
        img = mix([190, 160, 110], [235, 210, 160], 0.4 * ripples + 0.6 * fine)
    elif kind == "sky":
        img = mix([90, 150, 230], [180, 215, 250], yy)
        clouds = np.clip((n1 - 0.55) * 4, 0, 1)
        img = img * (1 - clouds[..., None]) + 250 * clouds[..., None]
    elif kind == "rock":
        cells = (n2 > 0.5).astype(np.float32)
        img = mix([90, 90, 95], [160, 158, 150], 0.6 * cells + 0.4 * fine)
    elif kind == "earth":
        img = mix([90, 60, 35], [150, 105, 65], 0.5 * n1 + 0.5 * fine)
    elif kind == "tree":
        trunks = (np.sin(xx * size * 0.35 + n1 * 2) > 0.75).astype(np.float32)
        leaves = mix([20, 70, 25], [60, 120, 40], n2)
        img = leaves * (1 - trunks[..., None]) + np.asarray([95, 65, 40], np.float32) * trunks[..., None]
    elif kind == "indoor":
        planks = (np.mod(yy * size, size / 5.0) < 1.0).astype(np.float32)
        img = mix([200, 170, 130], [170, 130, 90], 0.7 * planks + 0.3 * n2)
    elif kind == "road":
        line = (np.abs(xx - 0.5 - 0.05 * (n1 - 0.5)) < 0.025).astype(np.float32)
        img = mix([55, 55, 60], [85, 85, 90], fine) * (1 - line[..., None]) + np.asarray([230, 200, 40], np.float32) * line[..., None]
    else:
        raise ValueError(f"no texture for background {kind!r}; known: {', '.join(BACKGROUNDS)}")
    return img.astype(np.float32)


def eroded(mask: np.ndarray) -> np.ndarray:
    """3x3 binary erosion (a pixel stays when its 8 neighbours are all inside; borders count as outside)."""
    return _neighbourhood(mask, grow=False)


def dilated(mask: np.ndarray) -> np.ndarray:
    """3x3 binary dilation (a pixel joins when any of its 8 neighbours is inside; outside the image is outside)."""
    return _neighbourhood(mask, grow=True)


def _neighbourhood(mask: np.ndarray, *, grow: bool) -> np.ndarray:
    """Any (``grow``) or all (not ``grow``) of each pixel's 3x3 neighbourhood, the image padded with False."""
    padded = np.pad(mask, 1, constant_values=False)
    h, w = mask.shape
    windows = [padded[dy:dy + h, dx:dx + w] for dy in (0, 1, 2) for dx in (0, 1, 2)]
    return (np.logical_or if grow else np.logical_and).reduce(windows)
