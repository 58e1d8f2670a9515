"""Small JPEG/PNG dataset folders for the input-pipeline suites (tests/test_feed_*.py)."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from curate.store import Dataset, NewSample

CLASSES = (9, 296, 100)


def photo(rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    """A smooth "photo" (gradients and a disc, plus mild noise): JPEG-friendly, unlike pure noise."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = rng.uniform(0, 255, 3)
    slope = rng.uniform(-0.6, 0.6, (3, 2))
    img = np.stack([base[c] + slope[c, 0] * x + slope[c, 1] * y for c in range(3)], axis=-1)
    cx, cy, r = rng.uniform(0.3, 0.7) * w, rng.uniform(0.3, 0.7) * h, rng.uniform(0.15, 0.3) * min(w, h)
    img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 6, img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def encoded(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def make_photo_folder(root: Path, *, n: int = 12, fmt: str = "JPEG", seed: int = 0, masks: bool = False,
                      size: tuple[int, int] = (64, 48)) -> Dataset:
    """``n`` photos stored as ``fmt`` (sizes vary around ``size``), classes in turn, optionally
    with a human mask each (the disc's bounding square)."""
    rng = np.random.default_rng(seed)
    ds = Dataset.create(root, name="feedtest")
    items = []
    for i in range(n):
        w, h = size[0] + int(rng.integers(0, 9)), size[1] + int(rng.integers(0, 9))
        image = photo(rng, (w, h))
        mask = None
        if masks:
            mask = np.zeros((h, w), np.uint8)
            mask[h // 4: 3 * h // 4, w // 4: 3 * w // 4] = 1
        items.append(NewSample(image=encoded(image, fmt), class_index=CLASSES[i % len(CLASSES)], status="accepted",
                               background="grass" if i % 2 else "water", background_source="human",
                               group="easy" if i % 2 else "hard", mask=mask,
                               mask_status="human" if masks else None))
    report = ds.add_samples(items)
    assert not report.quarantined, report
    return ds
