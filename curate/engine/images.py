"""What every engine runs per image batch: decoding and preprocessing files, the model's output.

The floor below both the engines (:mod:`curate.engine.local`, :mod:`curate.engine.ray_data`,
:func:`curate.engine.base.encode_batch`) and the feature cache (:mod:`curate.features`, which
calls the engines): it imports neither. Importing it imports no torch.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where images are encoded
    import torch

__all__ = ["ImageFiles", "default_workers", "model_output"]


class ImageFiles:
    """Decodes and preprocesses images; a failure yields a zero tensor and its reason.

    A map-style dataset for ``torch.utils.data.DataLoader`` (``__len__`` + ``__getitem__``; no
    ``Dataset`` base class, so defining it does not import torch)."""

    def __init__(self, paths: Sequence[Path], preprocess: Callable, image_size: tuple[int, int]) -> None:
        self.paths = list(paths)
        self.preprocess = preprocess
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        from PIL import Image

        try:
            with Image.open(self.paths[index]) as image:
                image.load()
                tensor = self.preprocess(image.convert("RGB"))
            return index, tensor, ""
        except Exception as error:  # reported per sample, never fatal for the batch
            import torch

            return index, torch.zeros(3, *self.image_size), f"{type(error).__name__}: {error}"[:300]


def model_output(model: Any, kind: str, batch: torch.Tensor) -> torch.Tensor:
    """The cached output of ``kind`` for a preprocessed batch: the L2-normalised image embedding
    (``embedding``) or the classifier's logits (``logits``)."""
    if kind == "embedding":
        return model.encode_image(batch, normalize=True)
    return model.logits(batch)


def default_workers(device: torch.device) -> int:
    """Decoding workers: several on a GPU machine; none on CPU, where the model needs the cores."""
    cpus = os.cpu_count() or 1
    return min(8, max(1, cpus - 1)) if device.type == "cuda" else 0
