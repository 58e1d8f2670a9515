"""Pixel operations behind the background interventions: pure numpy and PIL, no model.

Images are ``uint8`` arrays ``H x W x 3``; masks are bool arrays ``H x W`` that are True on the
object's pixels (any other mask is coerced with ``np.asarray(mask) > 0``). Every function returns
a new array and never modifies its inputs.

The variants follow two anchors:

- Xiao et al. 2020, "Noise or Signal: The Role of Image Backgrounds in Object Recognition"
  (ImageNet-9): Only-FG (:func:`only_foreground`), No-FG (:func:`no_foreground`), Only-BG-T
  (:func:`fill_hole`) and the Mixed-Same/Rand/Next swaps (:func:`paste` on a donor's
  :func:`fit_background`);
- Singla & Feizi 2022 (Salient ImageNet) and Moayeri et al. 2022 (Hard ImageNet): Gaussian noise
  on the foreground or on the background (:func:`gaussian_noise`).
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

__all__ = [
    "FILLS",
    "Filled",
    "area_fraction",
    "box_hole",
    "fill_hole",
    "fit_background",
    "fit_mask",
    "gaussian_noise",
    "hole_margin",
    "mask_box",
    "neutral_object",
    "no_foreground",
    "object_hole",
    "only_foreground",
    "paste",
    "png_bytes",
    "uncovered_fraction",
]

#: The hole fills (:func:`fill_hole`): ``tile`` (Xiao et al.'s Only-BG-T), ``telea`` / ``ns``
#: (OpenCV's fast-marching and Navier-Stokes inpainting), and ``box-`` + one of them: the hole's
#: bounding box is filled instead of the hole, so the fill keeps no outline of the donor's object.
FILLS: tuple[str, ...] = ("tile", "telea", "ns", "box-tile", "box-telea", "box-ns")
#: Radius (pixels) of OpenCV's inpainting neighbourhood.
INPAINT_RADIUS = 3


# --- validation -------------------------------------------------------------------------------


def _as_image(image: np.ndarray, name: str = "image") -> np.ndarray:
    """``image`` as a ``uint8`` ``H x W x 3`` array; ValueError otherwise."""
    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"{name} must be H x W x 3, got shape {arr.shape}")
    if arr.dtype != np.uint8:
        raise ValueError(f"{name} must be uint8, got {arr.dtype}")
    return arr


def _as_mask(mask: np.ndarray, name: str = "mask") -> np.ndarray:
    """``mask`` as a bool ``H x W`` array (``np.asarray(mask) > 0`` when it is not bool)."""
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        arr = arr > 0
    if arr.ndim != 2:
        raise ValueError(f"{name} must be H x W, got shape {arr.shape}")
    return arr


def _image_and_mask(image: np.ndarray, mask: np.ndarray, mask_name: str = "mask") -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(image, mask)``; ValueError naming both shapes when the mask's ``H x W`` differs."""
    img = np.asarray(image)
    msk = np.asarray(mask)
    if msk.ndim != 2 or img.ndim < 2 or img.shape[:2] != msk.shape:
        raise ValueError(f"{mask_name} shape {msk.shape} does not match image shape {img.shape}")
    return _as_image(img), _as_mask(msk, mask_name)


def _check_shape(shape: tuple[int, int]) -> tuple[int, int]:
    h, w = (int(s) for s in shape)
    if h < 1 or w < 1:
        raise ValueError(f"shape must be positive (H, W), got {tuple(shape)}")
    return h, w


# --- the hole ---------------------------------------------------------------------------------


def hole_margin(shape: tuple[int, int], fraction: float = 0.02) -> int:
    """Pixels the object's hole is grown by: ``max(1, round(fraction * min(H, W)))``.

    ``shape`` is ``(H, W)`` (a longer shape such as ``image.shape`` is read for its first two
    entries); ``round`` is Python's (half to even).
    """
    if fraction < 0:
        raise ValueError(f"fraction must be >= 0, got {fraction}")
    h, w = _check_shape(tuple(shape)[:2])
    return max(1, round(fraction * min(h, w)))


def object_hole(mask: np.ndarray, margin: int) -> np.ndarray:
    """The region removed with the object: the mask dilated by ``margin`` pixels.

    ``hole[y, x] = max(mask[y', x'] for |y' - y| <= margin and |x' - x| <= margin)``: a
    ``(2 * margin + 1)`` square structuring element (pixels outside the image count as
    background); ``margin`` 0 returns the mask. Growing the hole takes the object's edge, halo
    and contact shadow with it, which a cut along the mask would leave behind (Xiao et al.
    remove a whole bounding box for the same reason). The hole always contains the mask.

    Our own separable maximum (rows, then columns, ``2 * margin + 1`` shifted ORs each) rather
    than PIL's ``ImageFilter.MaxFilter``: a square's maximum is separable, and the rank filter
    costs O(margin^2) per pixel (55 ms at 384 px and margin 8, against 1 ms here).
    """
    m = _as_mask(mask)
    margin = int(margin)
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if margin == 0 or not m.any():
        return m.copy()
    return _grow(_grow(m, margin, axis=0), margin, axis=1)


def _grow(mask: np.ndarray, margin: int, axis: int) -> np.ndarray:
    """1-D dilation along ``axis``: OR of the mask shifted by -margin..margin (zero-padded)."""
    size = mask.shape[axis]
    reach = min(margin, size - 1)
    padded = np.pad(mask, [(reach, reach) if a == axis else (0, 0) for a in range(mask.ndim)])
    out = np.zeros_like(mask)
    for shift in range(2 * reach + 1):
        out |= np.take(padded, range(shift, shift + size), axis=axis)
    return out


@dataclass(frozen=True)
class Filled:
    """The result of :func:`fill_hole`."""

    image: np.ndarray  # uint8 H x W x 3
    method: str  # "tile-left" | ... | "mean" | "telea" | "ns" | "box-<one of those>" | "none"
    fraction: float  # share of the image's pixels that were filled: hole.sum() / (H * W)


def _bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    """``(y0, y1, x0, x1)`` of a non-empty mask's bounding box, inclusive-exclusive."""
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


def _tile_fill(image: np.ndarray, hole: np.ndarray) -> Filled:
    """Only-BG-T (Xiao et al. 2020): replace the hole with tiles of background taken from outside it.

    Rule: let ``(y0, y1, x0, x1)`` be the hole's bounding box (inclusive-exclusive). The candidate
    strips outside the box are ``left = image[:, :x0]``, ``right = image[:, x1:]``,
    ``top = image[:y0, :]`` and ``bottom = image[y1:, :]``. The strip with the most pixels is
    used (ties broken in the order left, right, top, bottom); it holds no hole pixel by
    construction. With a left or right strip of width ``w`` a hole pixel ``(y, x)`` gets
    ``strip[y, (x - x0) % w]`` (rows continue horizontally); with a top or bottom strip of height
    ``h`` it gets ``strip[(y - y0) % h, x]`` (columns continue vertically).

    When every strip is empty (the hole's box spans the whole image) the hole gets the mean
    colour of the non-hole pixels, ``round(mean)`` per channel (``np.round``, half to even),
    method ``"mean"``; when there is no non-hole pixel either, ValueError. An empty hole returns
    a copy of the image with method ``"none"`` and fraction 0.0. Pixels outside the hole are never
    changed; ``fraction = hole.sum() / (H * W)``.
    """
    img, hl = _image_and_mask(image, hole, "hole")
    out = img.copy()
    height, width = hl.shape
    n_hole = int(hl.sum())
    if n_hole == 0:
        return Filled(image=out, method="none", fraction=0.0)
    fraction = n_hole / (height * width)
    y0, y1, x0, x1 = _bbox(hl)
    sizes = {
        "left": height * x0,
        "right": height * (width - x1),
        "top": y0 * width,
        "bottom": (height - y1) * width,
    }
    side = max(sizes, key=lambda k: sizes[k])  # max returns the first maximum: the tie order above
    ys, xs = np.nonzero(hl)
    if sizes[side] == 0:
        keep = ~hl
        if not keep.any():
            raise ValueError("the object covers the whole image: no background to keep")
        colour = np.round(img[keep].astype(np.float64).mean(axis=0))
        out[ys, xs] = np.clip(colour, 0, 255).astype(np.uint8)
        return Filled(image=out, method="mean", fraction=fraction)
    if side == "left":
        src_y, src_x = ys, (xs - x0) % x0
    elif side == "right":
        src_y, src_x = ys, x1 + (xs - x0) % (width - x1)
    elif side == "top":
        src_y, src_x = (ys - y0) % y0, xs
    else:
        src_y, src_x = y1 + (ys - y0) % (height - y1), xs
    out[ys, xs] = img[src_y, src_x]
    return Filled(image=out, method=f"tile-{side}", fraction=fraction)


def box_hole(hole: np.ndarray) -> np.ndarray:
    """The bounding box of a hole as a mask (an empty hole stays empty): a region with no object outline."""
    hl = _as_mask(hole, "hole")
    out = np.zeros_like(hl)
    if hl.any():
        y0, y1, x0, x1 = _bbox(hl)
        out[y0:y1, x0:x1] = True
    return out


def _inpaint(image: np.ndarray, hole: np.ndarray, method: str) -> Filled:
    """OpenCV's inpainting of the hole (``cv2.INPAINT_TELEA``: Telea 2004, fast marching;
    ``cv2.INPAINT_NS``: Bertalmio et al. 2001, Navier-Stokes), radius :data:`INPAINT_RADIUS`."""
    try:
        import cv2
    except ImportError as error:  # pragma: no cover - opencv is a dependency of the interventions
        raise ValueError(f"the {method!r} fill needs OpenCV: pip install opencv-python-headless ({error})") from None
    img, hl = _image_and_mask(image, hole, "hole")
    n_hole = int(hl.sum())
    if n_hole == 0:
        return Filled(image=img.copy(), method="none", fraction=0.0)
    if hl.all():
        raise ValueError("the object covers the whole image: no background to keep")
    flag = cv2.INPAINT_TELEA if method == "telea" else cv2.INPAINT_NS
    filled = cv2.inpaint(np.ascontiguousarray(img), hl.astype(np.uint8) * 255, INPAINT_RADIUS, flag)
    out = np.where(hl[..., None], filled, img).astype(np.uint8)
    return Filled(image=out, method=method, fraction=n_hole / hl.size)


def fill_hole(image: np.ndarray, hole: np.ndarray, method: str = "tile") -> Filled:
    """The image with its hole filled by ``method`` (one of :data:`FILLS`).

    ``tile`` is :func:`_tile_fill` (below); ``telea`` and ``ns`` are OpenCV's inpainting
    (:func:`_inpaint`); ``box-<fill>`` fills the hole's bounding box (:func:`box_hole`) with
    ``<fill>``, so no pixel of the result follows the outline of the object that was there (the
    *ghost* a shape-reading model can take for the class, docs/interventions.md). The method
    recorded is the fill's own (``tile-left``, ``telea``, ...) prefixed with ``box-`` for a box;
    ``fraction`` is the share of the image that was filled. Pixels outside the (box) hole never change.
    """
    if method not in FILLS:
        raise ValueError(f"unknown fill {method!r}; known: {', '.join(FILLS)}")
    if method.startswith("box-"):
        img, hl = _image_and_mask(image, hole, "hole")
        box = box_hole(hl)
        if box.all() and not hl.all():  # the box spans the image: fill the hole itself
            box = hl
        inner = fill_hole(img, box, method[len("box-"):])
        return Filled(image=inner.image, method=f"box-{inner.method}", fraction=inner.fraction)
    if method == "tile":
        return _tile_fill(image, hole)
    return _inpaint(image, hole, method)


def neutral_object(background: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The mask filled with the background's mean colour (``round(mean)`` per channel over the whole
    image): an object-shaped patch with no texture, for the ghost control."""
    bg, m = _image_and_mask(background, mask)
    colour = np.clip(np.round(bg.reshape(-1, 3).astype(np.float64).mean(axis=0)), 0, 255).astype(np.uint8)
    return np.where(m[..., None], colour, bg).astype(np.uint8)


def uncovered_fraction(hole: np.ndarray, mask: np.ndarray) -> float:
    """Share of a donor's hole the pasted object leaves showing: ``|hole & ~mask| / |hole|`` (0.0 for
    an empty hole). The rest of the hole is under the object; what shows keeps the donor object's outline."""
    hl, m = _as_mask(hole, "hole"), _as_mask(mask)
    if hl.shape != m.shape:
        raise ValueError(f"mask shape {m.shape} does not match hole shape {hl.shape}")
    total = int(hl.sum())
    return 0.0 if total == 0 else float((hl & ~m).sum() / total)


# --- foreground / background variants ---------------------------------------------------------


def only_foreground(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Only-FG (Xiao et al.): ``m * x``; the background is black."""
    img, m = _image_and_mask(image, mask)
    return np.where(m[..., None], img, np.uint8(0)).astype(np.uint8)


def no_foreground(image: np.ndarray, hole: np.ndarray) -> np.ndarray:
    """No-FG (Xiao et al.): ``(1 - hole) * x``; the hole is black."""
    img, hl = _image_and_mask(image, hole, "hole")
    return np.where(hl[..., None], np.uint8(0), img).astype(np.uint8)


def paste(obj_image: np.ndarray, mask: np.ndarray, background: np.ndarray) -> np.ndarray:
    """``m * obj + (1 - m) * background``: binary and exact (no blending).

    The object image, the mask and the background must share ``H x W`` (ValueError naming both
    shapes otherwise); fit a donor first with :func:`fit_background`.
    """
    obj, m = _image_and_mask(obj_image, mask)
    bg = np.asarray(background)
    if bg.shape != obj.shape:
        raise ValueError(f"background shape {bg.shape} does not match object image shape {obj.shape}")
    bg = _as_image(bg, "background")
    return np.where(m[..., None], obj, bg).astype(np.uint8)


# --- donor geometry ---------------------------------------------------------------------------


def _cover(src: tuple[int, int], dst: tuple[int, int]) -> tuple[int, int, int, int]:
    """Cover-and-centre-crop geometry: ``(new_h, new_w, top, left)``.

    ``s = max(H / H', W / W')`` scales the source ``H' x W'`` to ``max(H, round(s H')) x
    max(W, round(s W'))``, which covers the target ``H x W``; the crop starts at
    ``top = (new_h - H) // 2``, ``left = (new_w - W) // 2``.
    """
    (sh, sw), (dh, dw) = src, dst
    scale = max(dh / sh, dw / sw)
    new_h = max(dh, round(sh * scale))
    new_w = max(dw, round(sw * scale))
    return new_h, new_w, (new_h - dh) // 2, (new_w - dw) // 2


def fit_background(background: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A donor background at the source's geometry ``(H, W)``.

    Scaled by ``s = max(H / H', W / W')`` to cover ``H x W`` (aspect kept, bilinear, PIL), then
    centre-cropped, so the object keeps its position and scale and the background is never
    stretched. A background already ``H x W`` is returned unchanged (a copy); one that only needs
    cropping is cropped without resampling.
    """
    bg = _as_image(background, "background")
    h, w = _check_shape(tuple(shape)[:2])
    new_h, new_w, top, left = _cover(bg.shape[:2], (h, w))
    if (new_h, new_w) != bg.shape[:2]:
        bg = np.asarray(Image.fromarray(bg).resize((new_w, new_h), Image.Resampling.BILINEAR))
    return bg[top : top + h, left : left + w].copy()


def fit_mask(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The cover-and-centre-crop geometry of :func:`fit_background` for a bool mask (nearest neighbour).

    A donor's hole then follows its background pixel for pixel.
    """
    m = _as_mask(mask)
    h, w = _check_shape(tuple(shape)[:2])
    new_h, new_w, top, left = _cover(m.shape, (h, w))
    if (new_h, new_w) != m.shape:
        img = Image.fromarray(m.astype(np.uint8) * 255).resize((new_w, new_h), Image.Resampling.NEAREST)
        m = np.asarray(img) > 127
    return m[top : top + h, left : left + w].copy()


# --- noise ------------------------------------------------------------------------------------


def gaussian_noise(image: np.ndarray, region: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian noise inside ``region`` (Salient ImageNet, Hard ImageNet).

    On the [0, 1] pixel scale ``x' = clip(x / 255 + n, 0, 1)`` with ``n ~ N(0, sigma^2)`` per pixel
    and channel (``sigma = 0.25`` is a quarter of the range), returned as ``round(255 x')`` in
    ``uint8`` inside the region; pixels outside the region are unchanged. The noise is drawn for
    the whole image (``rng.normal(0, sigma, (H, W, 3))``) and applied in the region, so the
    foreground and background variants of one image made with the same seed share their noise
    field.
    """
    img, reg = _image_and_mask(image, region, "region")
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    noise = rng.normal(0.0, sigma, img.shape)
    noisy = np.round(np.clip(img / 255.0 + noise, 0.0, 1.0) * 255.0).astype(np.uint8)
    return np.where(reg[..., None], noisy, img).astype(np.uint8)


# --- measurements and output ------------------------------------------------------------------


def mask_box(mask: np.ndarray) -> tuple[float, float, float, float]:
    """``(centre_y, centre_x, height, width)`` of the mask's bounding box as fractions of the image.

    With the box ``(y0, y1, x0, x1)`` inclusive-exclusive: ``centre_y = (y0 + y1) / 2 / H``,
    ``centre_x = (x0 + x1) / 2 / W``, ``height = (y1 - y0) / H``, ``width = (x1 - x0) / W``, all
    in 0..1. ValueError on an empty mask.
    """
    m = _as_mask(mask)
    if not m.any():
        raise ValueError("mask_box of an empty mask: no object")
    h, w = m.shape
    y0, y1, x0, x1 = _bbox(m)
    return (y0 + y1) / 2 / h, (x0 + x1) / 2 / w, (y1 - y0) / h, (x1 - x0) / w


def area_fraction(mask: np.ndarray) -> float:
    """Share of the image the mask covers: ``mask.mean()``."""
    return float(_as_mask(mask).mean())


def png_bytes(image: np.ndarray) -> bytes:
    """PNG bytes of ``image`` (PIL, ``compress_level=6``, no ``optimize``).

    Deterministic: the same pixels give the same bytes, so re-runs are byte-identical.
    """
    img = _as_image(image)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", compress_level=6, optimize=False)
    return buf.getvalue()
