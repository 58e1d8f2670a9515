"""Planted curation problems for the synthetic world (the ground truth of ``curate audit``).

papers/003 §2.1 ("Data Curation") removes raw photos for four situations: label noise (not the
queried class), feature noise (pixels disrupted or missing), obscurity (more than one object
class), clarity (the animal largely occluded, or not occupying most of the photo); curate adds
duplicates. A :class:`curate.collect.synthetic.WorldSpec` with non-zero rates plants each at a
known rate, and records what was planted in the sample's ``extra`` (keys ``planted``,
``planted_detail``, ``true_class``, ``duplicate_of``): a truth column that the audit checks
never read (they read pixels, masks, labels and CLIP features only; see docs/design.md#audit).

Kinds (at most one per sample, drawn from its own random stream ``[seed, index, 7]``,
:func:`plant_rng`, so the clean part of every sample is exactly what the world without
problems draws; it draws with :mod:`curate.collect.world_draw` and never imports
:mod:`curate.collect.synthetic`, which imports it):

==================  ===============================================================
``wrong_label``     the silhouette of another class, labelled with the sample's class
``exact_duplicate`` a copy of an earlier clean sample of the class, one pixel changed by one
                    grey level (identical to the eye and to a perceptual hash; the store is
                    content-addressed, so byte-identical copies could not be two samples)
``near_duplicate``  a re-encoded copy: down-scaled to 75-90% and back, brightness x0.9-1.1,
                    Gaussian noise sigma 3 (not shifted: see docs/design.md#audit)
``feature_noise``   blur (Gaussian, radius 1.5-2.5 px), noise (sigma 40) or a missing block
                    (a flat grey/black rectangle over 25-45% of the image, like a truncated file)
``second_object``   a second silhouette of another class in a corner (obscurity)
``small_object``    the object shrunk to ~35% of its size, or 60-80% of it occluded by
                    background (clarity); the mask keeps exactly the visible object pixels
==================  ===============================================================
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from PIL import Image, ImageFilter

from curate.collect.world_draw import draw_mask, eroded, object_texture

#: Planted kind -> the WorldSpec field holding its rate (in the order kinds are drawn).
RATE_FIELDS: dict[str, str] = {
    "wrong_label": "wrong_label_rate",
    "exact_duplicate": "duplicate_rate",
    "near_duplicate": "near_duplicate_rate",
    "feature_noise": "feature_noise_rate",
    "second_object": "second_object_rate",
    "small_object": "small_object_rate",
}
PLANT_STREAM = 7


def rates_of(spec) -> dict[str, float]:
    """``{kind: rate}`` of the spec's non-zero rates."""
    return {kind: float(getattr(spec, name)) for kind, name in RATE_FIELDS.items() if getattr(spec, name)}


def check_rates(spec) -> None:
    for name in RATE_FIELDS.values():
        rate = float(getattr(spec, name))
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {rate}")
    total = sum(rates_of(spec).values())
    if total > 1.0:
        raise ValueError(f"the planted problem rates add up to {total:.3f} > 1 (each sample gets at most one)")


def plant_rng(spec, index: int) -> np.random.Generator:
    """Sample ``index``'s planting stream ``[seed, index, PLANT_STREAM]`` (its first draw picks the kind)."""
    return np.random.default_rng([spec.seed, index, PLANT_STREAM])


def problem_of(spec, index: int) -> str | None:
    """The kind planted in sample ``index`` (None for a clean sample); cheap, no drawing."""
    rates = rates_of(spec)
    if not rates:
        return None
    u = plant_rng(spec, index).random()
    edge = 0.0
    for kind, rate in rates.items():
        edge += rate
        if u < edge:
            if kind in ("exact_duplicate", "near_duplicate") and duplicate_source(spec, index) is None:
                return None  # the first clean sample of a class has nothing to copy
            return kind
    return None


def duplicate_source(spec, index: int) -> int | None:
    """The sample a duplicate copies: the nearest earlier sample of the same class with no problem."""
    start = (index // spec.per_class) * spec.per_class
    for j in range(index - 1, start - 1, -1):
        u = plant_rng(spec, j).random()
        edge, kind_j = 0.0, None
        for kind, rate in rates_of(spec).items():
            edge += rate
            if u < edge:
                kind_j = kind
                break
        if kind_j is None:
            return j
    return None


def other_class(spec, index: int, rng: np.random.Generator, cls):
    others = [c for c in spec.classes if c != cls]
    if not others:
        raise ValueError("planting a wrong label or a second object needs at least two classes")
    return others[int(rng.integers(len(others)))]


def _outline(obj: np.ndarray, mask: np.ndarray, bg: np.ndarray) -> np.ndarray:
    edge = mask.astype(bool) & ~eroded(mask.astype(bool))
    luminance = float((bg @ np.array([0.299, 0.587, 0.114], np.float32)).mean())
    out = obj.copy()
    out[edge] = 20.0 if luminance > 110 else 235.0
    return out


def _compose(bg: np.ndarray, obj: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)
    return np.clip(bg * (1 - m) + obj * m, 0, 255).astype(np.uint8)


def apply_problem(kind: str, spec, index: int, cls, bg: np.ndarray, obj: np.ndarray, mask: np.ndarray,
                  image: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
    """(image, mask, truth) of a sample with ``kind`` planted (not for duplicates or wrong labels,
    which are drawn differently; see :func:`curate.collect.synthetic.generate_sample`)."""
    rng = plant_rng(spec, index)
    rng.random()  # the draw that chose the kind
    size = spec.image_size
    truth: dict = {"planted": kind}
    if kind == "feature_noise":
        detail = ("blur", "noise", "block")[int(rng.integers(3))]
        truth["planted_detail"] = detail
        if detail == "blur":
            radius = float(rng.uniform(1.5, 2.5)) * size / 48
            image = np.asarray(Image.fromarray(image).filter(ImageFilter.GaussianBlur(radius)), dtype=np.uint8)
        elif detail == "noise":
            image = np.clip(image.astype(np.float32) + rng.normal(0, 40, image.shape), 0, 255).astype(np.uint8)
        else:
            area = rng.uniform(0.25, 0.45)
            if rng.random() < 0.5:  # truncated: the bottom rows never arrived
                rows = int(round(area * size))
                box = (size - rows, size, 0, size)
            else:
                side = int(round(math.sqrt(area) * size))
                y0, x0 = (int(v) for v in rng.integers(0, size - side + 1, size=2))
                box = (y0, y0 + side, x0, x0 + side)
            image = image.copy()
            image[box[0]:box[1], box[2]:box[3]] = 128 if rng.random() < 0.5 else 0
            mask = mask.copy()
            mask[box[0]:box[1], box[2]:box[3]] = 0
        return image, mask, truth
    if kind == "second_object":
        second = other_class(spec, index, rng, cls)
        truth["planted_detail"] = second.name
        small = draw_mask(second.shape, size, rng)
        # shrink the second silhouette to ~70% and move it to the corner farthest from the object
        scale = 0.7
        inner = int(round(size * scale))
        shrunk = np.asarray(Image.fromarray(small * 255).resize((inner, inner), Image.NEAREST)) > 127
        ys, xs = np.nonzero(mask)
        cy, cx = (ys.mean(), xs.mean()) if len(ys) else (size / 2, size / 2)
        oy = 0 if cy > size / 2 else size - inner
        ox = 0 if cx > size / 2 else size - inner
        second_mask = np.zeros((size, size), bool)
        second_mask[oy:oy + inner, ox:ox + inner] = shrunk
        obj2 = _outline(object_texture(size, rng), second_mask.astype(np.uint8), bg)
        image = image.copy()
        image[second_mask] = np.clip(obj2[second_mask], 0, 255).astype(np.uint8)
        mask = (mask.astype(bool) & ~second_mask).astype(np.uint8)
        return image, mask, truth
    if kind == "small_object":
        if rng.random() < 0.5:
            truth["planted_detail"] = "shrunk"
            factor = float(rng.uniform(0.3, 0.4))
            inner = max(4, int(round(size * factor)))
            small = np.asarray(Image.fromarray(mask * 255).resize((inner, inner), Image.NEAREST)) > 127
            oy, ox = (int(v) for v in rng.integers(0, size - inner + 1, size=2))
            mask = np.zeros((size, size), np.uint8)
            mask[oy:oy + inner, ox:ox + inner] = small
        else:
            truth["planted_detail"] = "occluded"
            ys, xs = np.nonzero(mask)
            y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
            cover = float(rng.uniform(0.6, 0.8))
            if rng.random() < 0.5:  # a band of background over the object, from one side
                cut = y0 + int(round(cover * (y1 - y0)))
                occluder = np.zeros_like(mask, bool)
                occluder[y0:cut, :] = True
            else:
                cut = x0 + int(round(cover * (x1 - x0)))
                occluder = np.zeros_like(mask, bool)
                occluder[:, x0:cut] = True
            mask = (mask.astype(bool) & ~occluder).astype(np.uint8)
        image = _compose(bg, _outline(obj, mask, bg), mask)
        return image, mask, truth
    raise ValueError(f"unknown planted kind {kind!r}; known: {', '.join(RATE_FIELDS)}")


def duplicate_of(kind: str, spec, index: int, source_image: np.ndarray, source_mask: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, dict]:
    """(image, mask, truth) of a duplicate of ``source`` (see the module docstring)."""
    rng = plant_rng(spec, index)
    rng.random()
    image = source_image.copy()
    mask = source_mask.copy()
    if kind == "exact_duplicate":
        y, x, c = (int(rng.integers(n)) for n in image.shape)
        image[y, x, c] = image[y, x, c] + 1 if image[y, x, c] < 255 else 254
    else:
        size = image.shape[0]
        small = max(8, int(round(size * rng.uniform(0.75, 0.9))))
        image = np.asarray(Image.fromarray(image).resize((small, small), Image.BILINEAR).resize((size, size), Image.BILINEAR))
        image = image.astype(np.float32) * rng.uniform(0.9, 1.1) + rng.normal(0, 3, image.shape)
        image = np.clip(image, 0, 255).astype(np.uint8)
    return image, mask, {"planted": kind}


def planted_truth(extras: Mapping[str, Mapping]) -> dict[str, str]:
    """``{sample_id: kind}`` from the samples' ``extra`` (sample id -> parsed extra). The source
    of a duplicate (``duplicate_of`` names its ``source_id``) is marked ``duplicate_source``:
    a duplicate pair is the problem, and a check ranking both members found it."""
    by_source = {str(e.get("source_id")): sid for sid, e in extras.items() if e.get("source_id") is not None}
    out: dict[str, str] = {}
    for sid, extra in extras.items():
        kind = extra.get("planted")
        if kind:
            out[sid] = str(kind)
            source = by_source.get(str(extra.get("duplicate_of")))
            if source is not None and source not in out:
                out[source] = "duplicate_source"
    return out
