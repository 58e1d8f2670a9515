"""What a saliency map explains: the target objects and the logits they are read from.

Targets (``--target``), small objects as in pytorch-grad-cam, parsed once at the edge by
:func:`parse_target`:

- :class:`TrueClass` (``true``): the image's own class (the dataset's ``class_index``);
- :class:`Predicted` (``predicted``): the top-1 logit;
- :class:`TopK` (``topk:K``): the K highest logits, one map each (K maps per image from one
  forward pass).

Each has ``kind``, ``k`` (maps per image), ``needs_labels``, ``select(logits, labels)`` (the
``(N, K)`` logit columns to explain) and ``str()`` (its ``--target`` spelling, recorded in runs).

Logits (the target *score*, the quantity whose gradient/ablation/... the CAM reads):

- a CLIP: the zero-shot logit of class c, ``100 * normalize(f(x)) @ w_c`` with ``w_c`` the
  cached text embedding of c in the chosen label space and prompts (docs/design.md "Definitions";
  :func:`curate.zeroshot.cached_text_classifier`; the scale is
  :data:`curate.zeroshot.classifier.LOGIT_SCALE`). Not a softmax over a handful of labels: the
  raw scaled cosine, so the target of class c does not depend on which other labels are scored.
- a timm classifier: its own class logit (pre-softmax), ImageNet-1K index order.

``columns`` restricts the candidate classes (the "present" label space of a dataset, or a
1-vs-20 space); targets are column indices into it.
"""
from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F

from curate.saliency.base import SaliencyError
from curate.zeroshot.classifier import LOGIT_SCALE

if TYPE_CHECKING:  # pragma: no cover
    from curate.models.base import LoadedModel

__all__ = ["Predicted", "ScoreHead", "Target", "TopK", "TrueClass", "clip_classifier", "parse_target"]


class Target(abc.ABC):
    """What a map explains: which logit columns of each image (see the module docstring)."""

    #: ``true``, ``predicted`` or ``topk``.
    kind: ClassVar[str] = ""
    #: Whether :meth:`select` needs the images' labels.
    needs_labels: ClassVar[bool] = False
    #: Maps per image.
    k: int = 1

    @abc.abstractmethod
    def select(self, logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        """``(N, K)`` target columns from ``(N, C)`` logits and ``(N,)`` label columns."""

    def __str__(self) -> str:
        return self.kind


@dataclass(frozen=True)
class TrueClass(Target):
    """The image's own class (``--target true``)."""

    kind: ClassVar[str] = "true"
    needs_labels: ClassVar[bool] = True

    def select(self, logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        if labels is None:
            raise SaliencyError("target 'true' needs the images' labels")
        labels = labels.to(logits.device).long().view(-1, 1)
        if bool((labels < 0).any()) or bool((labels >= logits.shape[1]).any()):
            raise SaliencyError("a label is outside the scored classes; every true class must be a column")
        return labels

    def __str__(self) -> str:
        return self.kind


@dataclass(frozen=True)
class Predicted(Target):
    """The top-1 logit (``--target predicted``)."""

    kind: ClassVar[str] = "predicted"

    def select(self, logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        return logits.argmax(dim=1, keepdim=True)

    def __str__(self) -> str:
        return self.kind


@dataclass(frozen=True)
class TopK(Target):
    """The ``k`` highest logits, one map each (``--target topk:K``)."""

    k: int = 1
    kind: ClassVar[str] = "topk"

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise SaliencyError(f"topk needs K >= 1, got {self.k!r}")

    def select(self, logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        if self.k > logits.shape[1]:
            raise SaliencyError(f"target topk:{self.k} asks for more classes than the {logits.shape[1]} scored")
        return logits.topk(self.k, dim=1).indices

    def __str__(self) -> str:
        return f"topk:{self.k}"


def parse_target(spec: str | Target) -> Target:
    """``"true"``, ``"predicted"`` or ``"topk:K"`` (K >= 1) as a :class:`Target`; a target is returned as is."""
    if isinstance(spec, Target):
        return spec
    text = str(spec).strip().lower()
    if text in ("true", "label", "gt"):
        return TrueClass()
    if text in ("predicted", "pred", "top1"):
        return Predicted()
    if text.startswith(("topk:", "top:")):
        value = text.split(":", 1)[1]
        if value.isdigit() and int(value) >= 1:
            return TopK(int(value))
    raise SaliencyError(f"target {spec!r} is not 'true', 'predicted' or 'topk:K' (K >= 1)")


class ScoreHead:
    """Turns an input batch into ``(N, C)`` logits over ``columns`` (with autograd left to the caller)."""

    def __init__(self, model: LoadedModel, *, classifier: torch.Tensor | None = None,
                 columns: Sequence[int] | None = None) -> None:
        self.model = model
        if model.kind == "clip":
            if classifier is None:
                raise SaliencyError(
                    "a CLIP's targets are zero-shot logits: pass classifier= (the (C, D) text classifier from "
                    "curate.zeroshot.cached_text_classifier, or curate.saliency.clip_classifier)"
                )
            if classifier.ndim != 2 or classifier.shape[1] != model.embed_dim:
                raise SaliencyError(
                    f"classifier must be (C, {model.embed_dim}) for {model.model_id}, got {tuple(classifier.shape)}"
                )
            self.weights = F.normalize(classifier.float(), dim=-1).to(model.device)
            n_classes = classifier.shape[0]
            self.columns = list(range(n_classes)) if columns is None else [int(c) for c in columns]
            if len(self.columns) != n_classes:
                raise SaliencyError(f"{len(self.columns)} columns for a classifier of {n_classes} classes")
            self._index = None
        else:
            if classifier is not None:
                raise SaliencyError(f"{model.model_id} is a classifier: it is scored on its own logits (no classifier=)")
            total = int(getattr(model, "num_classes", 1000))
            self.columns = list(range(total)) if columns is None else [int(c) for c in columns]
            if any(not 0 <= c < total for c in self.columns):
                raise SaliencyError(f"columns must be class indices in 0..{total - 1}")
            self._index = None if columns is None else torch.as_tensor(self.columns, device=model.device)
            self.weights = None

    @property
    def num_columns(self) -> int:
        return len(self.columns)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(N, C)`` float32 for an input already on the device (grad mode is the caller's)."""
        if self.weights is not None:
            feats = self.model.encode_image(x, normalize=True, grad=True)
            return LOGIT_SCALE * feats @ self.weights.t()
        logits = self.model.logits(x, grad=True)
        return logits if self._index is None else logits.index_select(1, self._index)

    def column_of(self, class_indices: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Label-space class indices -> column indices (-1 where the class is not a column)."""
        lookup = {c: i for i, c in enumerate(self.columns)}
        values = class_indices.tolist() if isinstance(class_indices, torch.Tensor) else list(class_indices)
        return torch.tensor([lookup.get(int(c), -1) if c is not None else -1 for c in values], dtype=torch.long)


def clip_classifier(
    model: LoadedModel,
    class_names: Sequence[str],
    prompts: str | object = "simple",
    cache_dir: str | None = None,
) -> torch.Tensor:
    """The zero-shot text classifier ``W (C, D)`` for ``class_names`` (docs/design.md "Definitions").

    ``prompts``: ``"simple"``, ``"openai"``, a template file, or a
    :class:`curate.zeroshot.PromptSet`. Cached under ``cache_dir`` when given.
    """
    from pathlib import Path

    from curate.zeroshot import PromptSet, cached_text_classifier, load_prompts

    prompt_set = prompts if isinstance(prompts, PromptSet) else load_prompts(str(prompts))
    return cached_text_classifier(model, list(class_names), prompt_set, Path(cache_dir) if cache_dir else None)
