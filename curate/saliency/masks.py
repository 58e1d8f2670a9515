"""Object masks carried through the model's own preprocessing, pixel-aligned with the maps.

Saliency maps live on the model input (after its resize and crop), so a mask must go through
the same geometry. :func:`mask_transform_for` reads the model's eval transform (a torchvision
``Compose``, as open_clip and timm build it) and keeps its geometric steps (``Resize``,
``CenterCrop``, ``ResizeKeepRatio``, ``CenterCropOrPad``, ``Pad``), dropping the photometric
ones (``ToTensor``, ``Normalize``, colour-mode conversion). The mask is drawn as a 0/255 gray
image and passed through those steps *with the image's own interpolation* (so resized exactly
like the image, antialiasing included), then thresholded at half (a downscaled mask pixel is
relevant when most of its area is). Padding is filled with 0 (not relevant).

Bad masks (docs/design.md "The dataset on disk" allows 0/1 or instance ids):

- instance ids / 0-255 masks: every non-zero pixel is the object (the union, papers/004 §3.1);
- a mask whose size differs from the image's: resized to the image when the aspect ratios agree
  within 1% (``"mask_resized"``), otherwise refused (``"mask_size_mismatch"``: the sample is
  scored NaN and counted, never silently dropped);
- an unreadable mask file: ``"mask_unreadable"``.
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

from curate.saliency.base import SaliencyError

logger = logging.getLogger(__name__)

#: Geometric transforms (by class name) that masks go through.
GEOMETRIC = ("Resize", "CenterCrop", "ResizeKeepRatio", "CenterCropOrPad", "Pad", "ResizeMaxSize")
#: Transforms that do not move pixels (by class or function name): skipped for masks.
PHOTOMETRIC = ("ToTensor", "MaybeToTensor", "PILToTensor", "MaybePILToTensor", "Normalize", "ConvertImageDtype",
               "MaybeConvertMode", "ToNumpy", "Grayscale", "_convert_to_rgb", "convert_to_rgb", "ToDtype",
               "ToImage")
#: Aspect-ratio tolerance for resizing a mask of the wrong size to its image.
ASPECT_TOLERANCE = 0.01


def _name(t: Any) -> str:
    return getattr(t, "__name__", None) or type(t).__name__


class MaskTransform:
    """The geometric steps of a preprocessing pipeline, applied to a mask (picklable, for workers)."""

    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps

    def __call__(self, mask: np.ndarray) -> torch.Tensor:
        """``(H, W)`` mask (any non-zero = relevant) -> ``(h, w)`` bool tensor on the model input."""
        image = Image.fromarray(np.where(np.asarray(mask) != 0, 255, 0).astype(np.uint8), mode="L")
        for step in self.steps:
            image = step(image)
        if isinstance(image, torch.Tensor):
            array = image.squeeze().cpu().numpy()
            scale = 1.0 if array.dtype != np.uint8 and array.max() <= 1.0 else 255.0
            return torch.from_numpy(array.astype(np.float32) / scale >= 0.5)
        return torch.from_numpy(np.asarray(image) >= 128)

    def __repr__(self) -> str:
        return f"MaskTransform({', '.join(_name(s) for s in self.steps)})"


def mask_transform_for(preprocess: Any) -> MaskTransform:
    """A function ``(H, W) mask -> (h, w) bool tensor`` applying ``preprocess``'s geometry.

    Raises :class:`SaliencyError` naming a transform it cannot carry a mask through (pass your
    own ``mask_transform`` then).
    """
    steps = list(getattr(preprocess, "transforms", [preprocess]))
    kept: list[Any] = []
    for step in steps:
        name = _name(step)
        if name in PHOTOMETRIC:
            continue
        if name in GEOMETRIC:
            step = copy.copy(step)
            if hasattr(step, "fill"):
                step.fill = 0
            kept.append(step)
            continue
        raise SaliencyError(
            f"cannot carry masks through the model's transform {name} ({step!r}); pass mask_transform= "
            "(a function from an (H, W) mask array to the (h, w) bool mask on the model input)"
        )
    return MaskTransform(kept)


def check_mask(mask: np.ndarray, image_size: tuple[int, int]) -> tuple[np.ndarray | None, str | None, bool]:
    """Validate a stored mask against its image ``(width, height)``.

    Returns ``(binary mask or None, problem or None, had_instance_ids)`` where ``problem`` is
    ``"mask_resized"`` (fixed), ``"mask_size_mismatch"`` or ``"mask_not_2d"`` (refused).
    """
    array = np.asarray(mask)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[..., 0]
    if array.ndim != 2:
        return None, "mask_not_2d", False
    instance_ids = bool(array.size) and int(array.max()) > 1
    binary = array != 0
    width, height = image_size
    if binary.shape == (height, width):
        return binary, None, instance_ids
    mh, mw = binary.shape
    if mh and mw and abs((mw / mh) / (width / height) - 1.0) <= ASPECT_TOLERANCE:
        resized = Image.fromarray(binary.astype(np.uint8) * 255, mode="L").resize((width, height), Image.NEAREST)
        return np.asarray(resized) >= 128, "mask_resized", instance_ids
    return None, "mask_size_mismatch", instance_ids


def input_mask(preprocess_mask: Callable[[np.ndarray], torch.Tensor], mask: np.ndarray,
               expected: tuple[int, int]) -> torch.Tensor:
    """Apply ``preprocess_mask`` and check the result is ``expected`` (h, w)."""
    out = preprocess_mask(mask)
    if tuple(out.shape[-2:]) != tuple(expected):
        raise SaliencyError(
            f"the mask transform gives {tuple(out.shape[-2:])} but the model input is {tuple(expected)}: the mask "
            "would not be aligned with the map"
        )
    return out.bool()
