"""Shared pieces of :mod:`curate.saliency`: errors, warnings and the result of one batch.

Importable without torch (the errors are raised by the torch-free method registry,
:mod:`curate.saliency.registry`); torch is imported where a function needs it.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)


class SaliencyError(ValueError):
    """Bad saliency input: an unknown method or target, a model the method cannot explain, ..."""


class UnknownLayerError(SaliencyError, LookupError):
    """A layer name that the model does not have; ``candidates`` lists names that exist."""

    def __init__(self, message: str, candidates: list[str]) -> None:
        self.candidates = list(candidates)
        super().__init__(message)


class TargetIgnoredWarning(UserWarning):
    """The method's map does not depend on the target (EigenCAM, attention rollout).

    Every target of an image gets the same map, so per-class and per-target comparisons made
    with such a method say nothing about the target. Issued once per method and process.
    """


_warned: set[str] = set()


def warn_once(key: str, message: str, category: type[Warning] = UserWarning, stacklevel: int = 3) -> None:
    """``warnings.warn`` the first time ``key`` is seen in this process."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, category, stacklevel=stacklevel)


def is_oom(error: BaseException) -> bool:
    """Whether ``error`` is a device out-of-memory error (CUDA, MPS, or XPU)."""
    import torch

    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(error, oom_type):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def free_device_memory(device: torch.device) -> None:
    """Release cached blocks after an out-of-memory error (no-op on CPU)."""
    import torch

    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif device.type == "mps" and hasattr(torch, "mps"):
        try:
            torch.mps.empty_cache()
        except (RuntimeError, AttributeError) as error:  # pragma: no cover - depends on the build
            logger.debug("could not empty the MPS cache: %s", error)


@dataclass
class SaliencyResult:
    """Maps of one batch, still on the model's device.

    Attributes:
        maps: ``(N, K, H, W)`` float32 in [0, 1] (min-max normalised per map, as
            pytorch-grad-cam), aligned with the model input (``H, W`` = input size).
        targets: ``(N, K)`` logit columns explained (see ``columns``).
        target_scores: ``(N, K)`` logits of the targets (CLIP: 100 x cosine).
        logits: ``(N, C)`` all logits of the columns (top-1 = prediction).
        flat: ``(N, K)`` True where the raw map was constant before normalisation (it carries
            no localisation; after normalisation it is all zero, so SSS/RMA are NaN).
        columns: label-space class index of each logit column.
        method: the method's name.
        layer: the layer used (None for methods that use several: rollout, fullgrad).
    """

    maps: torch.Tensor
    targets: torch.Tensor
    target_scores: torch.Tensor
    logits: torch.Tensor
    flat: torch.Tensor
    columns: list[int]
    method: str
    layer: str | None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def target_classes(self) -> torch.Tensor:
        """``(N, K)`` label-space class indices of the targets."""
        import torch

        lookup = torch.as_tensor(self.columns, device=self.targets.device)
        return lookup[self.targets]

    @property
    def predicted_classes(self) -> torch.Tensor:
        """``(N,)`` label-space class index of the top-1 prediction."""
        import torch

        lookup = torch.as_tensor(self.columns, device=self.logits.device)
        return lookup[self.logits.argmax(dim=1)]
