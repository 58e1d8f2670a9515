"""The common face of every model curate loads, and the errors loading can raise.

A :class:`LoadedModel` wraps one ``torch.nn.Module`` together with what scoring needs: its own
eval transform (``preprocess``), its input size, a stable ``model_id`` (the cache key of the
features cache) and the encode functions. Two kinds exist:

- ``"clip"`` (:class:`curate.models.clip.ClipModel`): image and text towers; zero-shot logits
  are built elsewhere (``curate.zeroshot``) as ``100 * normalise(image) @ normalise(text).T``.
- ``"classifier"`` (:class:`curate.models.classifier.ClassifierModel`): an ImageNet-1K
  classifier scored on its own 1000-way logits.

Outputs are always float32 tensors on the model's device, whatever the precision the model
runs in, so that downstream matrix work does not depend on it.

This module imports torch lazily so that ``import curate.models`` stays cheap.
"""

from __future__ import annotations

import abc
import contextlib
import difflib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image

#: Precisions a loader accepts. ``fp16``/``bf16`` cast the weights (open_clip keeps its
#: LayerNorms in fp32); ``amp``/``amp_bf16`` keep fp32 weights and run under autocast.
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "amp", "amp_bf16")


class ModelError(Exception):
    """Base class of curate's model-loading errors."""


class ModelNotFoundError(ModelError, LookupError):
    """A model name, zoo name or pretrained tag that no registry knows.

    ``suggestions`` holds close matches (also spelled out in the message).
    """

    def __init__(self, message: str, suggestions: Sequence[str] = ()) -> None:
        self.suggestions = list(suggestions)
        if self.suggestions:
            message = f"{message}; did you mean: {', '.join(repr(s) for s in self.suggestions)}?"
        super().__init__(message)


class WeightsNotFoundError(ModelError, FileNotFoundError):
    """Pretrained weights that are not on this machine (curate never downloads them).

    ``missing`` lists the file names that were looked for, ``searched`` the places. ``headline``
    is the short first line; ``details`` the lines under it (where curate looked, how to fix it),
    each on its own line of the message (the CLI prints the headline as its error line and the
    details below it).
    """

    def __init__(self, message: str, missing: Sequence[str] = (), searched: Sequence[str] = (),
                 details: Sequence[str] = ()) -> None:
        self.missing = list(missing)
        self.searched = list(searched)
        self.headline = message
        self.details = list(details)
        super().__init__("\n".join([message, *self.details]))


class QuickGELUWarning(UserWarning):
    """Weights trained with QuickGELU loaded into a GELU architecture, or the reverse.

    Nothing fails, but accuracy silently drops (about 3 points for the OpenAI / LAION-400M
    ViT-B/32 weights); use the ``-quickgelu`` architecture or a zoo name instead.
    """


def close_matches(word: str, candidates: Iterable[str], n: int = 5, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` candidates resembling ``word`` (case-insensitive ``difflib`` ratio >= cutoff)."""
    by_lower: dict[str, str] = {}
    for c in candidates:
        by_lower.setdefault(c.lower(), c)
    hits = difflib.get_close_matches(word.lower(), list(by_lower), n=n, cutoff=cutoff)
    # substring hits ("b-32" -> every "...B-32...") help when the ratio is low
    if len(hits) < n and len(word) >= 3:
        for low in by_lower:
            if word.lower() in low and low not in hits:
                hits.append(low)
            if len(hits) >= n:
                break
    return [by_lower[h] for h in hits]


def check_precision(precision: str) -> str:
    """Validate ``precision`` against :data:`PRECISIONS` and return it."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision


def resolve_device(device: Any) -> torch.device:
    """``"auto"`` -> cuda when available else cpu; anything else -> ``torch.device(device)``."""
    import torch

    if isinstance(device, torch.device):
        return device
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _as_hw(size: Any) -> tuple[int, int]:
    """An image size as ``(H, W)`` from an int, a pair, or a ``(C, H, W)`` triple."""
    if isinstance(size, int):
        return (size, size)
    size = tuple(int(s) for s in size)
    if len(size) == 3:
        size = size[1:]
    if len(size) != 2:
        raise ValueError(f"cannot read an image size from {size!r}")
    return (size[0], size[1])


class LoadedModel(abc.ABC):
    """A loaded model with its eval transform, a stable id and encode functions.

    Attributes:
        kind: ``"clip"`` or ``"classifier"``.
        module: the ``torch.nn.Module`` (in eval mode, on ``device``).
        model_id: stable across processes and precisions, e.g.
            ``"open_clip:ViT-B-32-quickgelu:laion400m_e31"``,
            ``"open_clip:curate-tiny-clip:file-0123456789ab"`` (sha256 prefix of the file),
            ``"timm:resnet50:a1_in1k"``, ``"open_clip:curate-tiny-vit:random-seed0"``.
            Random weights without a seed get ``...:random``; such an id names an architecture,
            not weights, so it is *not* safe as a cache key (see ``cache_safe``).
        cache_safe: whether ``model_id`` identifies the weights (False only for random weights
            loaded without a seed).
        preprocess: the model's own eval transform, ``PIL.Image -> Tensor[3, H, W]``.
        image_size: ``(H, W)`` the transform produces.
        tokenizer: the text tokenizer (``None`` for classifiers).
        device: the torch device the module lives on.
        precision: one of :data:`PRECISIONS`.
        info: provenance (backend, arch, pretrained tag or file, sha256, seed, quick_gelu, the
            ``curate`` metadata of a local weights file, ...), JSON-serialisable, for
            ``dataset.yaml`` provenance records.
    """

    kind: ClassVar[str] = ""

    def __init__(
        self,
        *,
        module: torch.nn.Module,
        model_id: str,
        preprocess: Callable[[Image.Image], torch.Tensor],
        image_size: Any,
        device: torch.device,
        precision: str = "fp32",
        tokenizer: Any = None,
        cache_safe: bool = True,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.module = module
        self.model_id = model_id
        self.preprocess = preprocess
        self.image_size = _as_hw(image_size)
        self.device = device
        self.precision = check_precision(precision)
        self.tokenizer = tokenizer
        self.cache_safe = cache_safe
        self.info: dict[str, Any] = dict(info or {})
        self.info.setdefault("model_id", model_id)

    # -- what subclasses provide ------------------------------------------------------------
    @property
    @abc.abstractmethod
    def embed_dim(self) -> int:
        """Width D of :meth:`encode_image` outputs."""

    @abc.abstractmethod
    def _image_features(self, batch: torch.Tensor) -> torch.Tensor:
        """Raw image features of a batch already on the device in the input dtype."""

    # -- shared machinery -------------------------------------------------------------------
    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype inputs are cast to: fp16/bf16 for cast weights, float32 otherwise."""
        import torch

        return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.precision, torch.float32)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast context for ``amp``/``amp_bf16`` (CPU autocast uses bf16); else a no-op."""
        import torch

        if self.precision not in ("amp", "amp_bf16"):
            return contextlib.nullcontext()
        if self.precision == "amp_bf16" or self.device.type == "cpu":
            dtype = torch.bfloat16
        else:
            dtype = torch.float16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _grad_context(self, grad: bool) -> contextlib.AbstractContextManager:
        import torch

        return contextlib.nullcontext() if grad else torch.no_grad()

    def to_input(self, batch: torch.Tensor) -> torch.Tensor:
        """Move a float image batch ``[N, 3, H, W]`` to the device and input dtype."""
        if batch.ndim != 4 or batch.shape[1] != 3:
            raise ValueError(f"expected an image batch of shape [N, 3, H, W], got {tuple(batch.shape)}")
        return batch.to(self.device, dtype=self.input_dtype, non_blocking=True)

    def preprocess_images(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """Apply :attr:`preprocess` to each PIL image and stack: ``Tensor[N, 3, H, W]`` (CPU)."""
        import torch

        return torch.stack([self.preprocess(im.convert("RGB")) for im in images])

    def encode_image(
        self, batch: torch.Tensor, normalize: bool = True, *, grad: bool = False
    ) -> torch.Tensor:
        """Image embeddings ``Tensor[N, D]`` (float32), L2-normalised when ``normalize``.

        For a CLIP this is the projected image embedding; for a classifier, the pooled
        pre-logits features. Runs under ``torch.no_grad`` unless ``grad=True`` (saliency).
        """
        import torch.nn.functional as F

        with self._grad_context(grad), self.autocast():
            feats = self._image_features(self.to_input(batch))
        feats = feats.float()
        return F.normalize(feats, dim=-1) if normalize else feats

    def encode_text(self, texts: Sequence[str], normalize: bool = True, **kwargs: Any) -> torch.Tensor:
        """Text embeddings; only CLIP models have a text tower."""
        raise TypeError(
            f"{self.model_id} is an ImageNet classifier ({self.kind}); it has no text tower. "
            "Score it with .logits(batch) instead of zero-shot text embeddings."
        )

    def logits(self, batch: torch.Tensor, *, grad: bool = False) -> torch.Tensor:
        """1000-way ImageNet-1K logits; only classifiers have them."""
        raise TypeError(
            f"{self.model_id} is a CLIP model ({self.kind}); it has no fixed classifier head. "
            "Build zero-shot logits from encode_image/encode_text (curate.zeroshot)."
        )

    def __repr__(self) -> str:
        fields = []
        for name in ("image_size", "embed_dim"):  # an LVLM has no embedding size: its property refuses
            try:
                fields.append(f"{name}={getattr(self, name)}")
            except (AttributeError, TypeError, NotImplementedError):
                continue
        return (f"{type(self).__name__}(model_id={self.model_id!r}, kind={self.kind!r}, {', '.join(fields)}"
                f"{', ' if fields else ''}device={str(getattr(self, 'device', ''))!r}, "
                f"precision={getattr(self, 'precision', '')!r})")
