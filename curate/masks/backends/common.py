"""What the ``transformers`` mask backends share: model folders, identity, batching, proposals.

A backend's spec names one model folder per role (``clipseg``, ``sam3``, ``sam``, ``owlv2``,
``grounding-dino``). Each folder is found exactly as the ``lvlm:`` backend finds its model
(:func:`curate.models.hf_folders.resolve_hf_source`: a local folder, or a repo id already in the
local Hugging Face cache; nothing is downloaded), then checked before anything loads:

- ``config.json`` and a weights file (``*.safetensors`` / ``*.bin``), else
  :class:`~curate.models.base.WeightsNotFoundError`;
- the processor's config (``preprocessor_config.json`` or ``processor_config.json``) and, for
  models that read text, the tokenizer (``tokenizer.json``, ``vocab.json``, ``vocab.txt``, ...),
  else :class:`~curate.models.base.WeightsNotFoundError` naming each missing file;
- the ``model_type`` in ``config.json`` is one the role loads, else
  :class:`~curate.models.base.ModelError` naming what the folder holds instead.

The model id of a folder is ``<role>:<name>@<fingerprint>`` (``name``: the folder's name or the
repo id; ``fingerprint``: :func:`curate.models.hf_folders.weights_fingerprint`, 12 hex digits of
its config and weights files), and a backend's ``model_id`` joins its folders' ids with ``+``.
"""
from __future__ import annotations

import abc
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from curate.masks.backends.base import MaskModelSpec, MaskSpecError, Proposal, checked_request
from curate.models.base import ModelError, check_precision, resolve_device
from curate.models.hf_folders import (
    precision_dtype,
    quiet_transformers,
    read_config,
    require_files,
    resolve_hf_source,
    weights_fingerprint,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image

__all__ = ["PROCESSOR_FILES", "TOKENIZER_FILES", "FolderKind", "ModelFolder", "resolve_folder", "spec_part",
           "identity_of", "load_pretrained", "HFProposer", "format_threshold", "nothing_above", "union_proposal",
           "to_device"]

#: A folder's processor config: either file (transformers 4 wrote the first, 5 writes the second).
PROCESSOR_FILES: tuple[str, ...] = ("preprocessor_config.json", "processor_config.json")
#: A folder's tokenizer: a fast tokenizer file, or a BPE / WordPiece / SentencePiece vocabulary.
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model", "spiece.model")


@dataclass(frozen=True)
class FolderKind:
    """A role in a spec: its name, how people write it, the ``model_type`` s it loads (each with
    its transformers model and processor class names), and whether it reads text."""

    role: str
    title: str
    classes: Mapping[str, tuple[str, str]]
    needs_tokenizer: bool = True

    @property
    def flag(self) -> str:
        return f"--model {self.role}:PATH"


@dataclass(frozen=True)
class ModelFolder:
    """One checked model folder: where it is, what it holds, and its fingerprint."""

    kind: FolderKind
    source: str
    folder: Path
    name: str
    revision: str | None
    fingerprint: str
    model_type: str
    model_class: str
    processor_class: str

    @property
    def part_id(self) -> str:
        """``<role>:<name>@<fingerprint>``."""
        return f"{self.kind.role}:{self.name}@{self.fingerprint}"

    def info(self) -> dict[str, Any]:
        """JSON-ready provenance of the folder."""
        return {"source": self.source, "folder": str(self.folder), "name": self.name, "revision": self.revision,
                "fingerprint": self.fingerprint, "model_type": self.model_type, "model_class": self.model_class,
                "processor_class": self.processor_class}


def resolve_folder(kind: FolderKind, source: str) -> ModelFolder:
    """Find and check the folder ``source`` names for ``kind`` (see the module docstring); no
    weights are read beyond the fingerprint's first and last MiB.

    Raises:
        WeightsNotFoundError: no such folder / not cached, or config, weights, processor or
            tokenizer files missing (all missing ones named).
        ModelError: the folder holds another kind of model.
    """
    folder, name, revision = resolve_hf_source(source, flag=kind.flag)
    fingerprint = weights_fingerprint(folder)
    groups = [PROCESSOR_FILES] + ([TOKENIZER_FILES] if kind.needs_tokenizer else [])
    what = f"the {kind.title} processor" + (" and tokenizer files" if kind.needs_tokenizer else " config")
    require_files(folder, groups, what=what, flag=kind.flag)
    model_type = str(read_config(folder).get("model_type") or "")
    if model_type not in kind.classes:
        raise ModelError(f"{folder} holds a {model_type or 'model without a model_type'!r} model (config.json), not "
                         f"{kind.title} ({' / '.join(kind.classes)}); {kind.flag} needs a {kind.title} folder")
    model_class, processor_class = kind.classes[model_type]
    return ModelFolder(kind, str(source), folder, name, revision, fingerprint, model_type, model_class,
                       processor_class)


def spec_part(spec: MaskModelSpec, role: str) -> str:
    """The folder a spec gives for ``role`` (a :class:`MaskSpecError` when it gives none)."""
    source = spec.parts.get(role)
    if not source:
        raise MaskSpecError(f"mask model {spec.text!r} names no {role} folder")
    return source


def identity_of(spec: MaskModelSpec, folders: Sequence[ModelFolder], precision: str) -> tuple[str, dict[str, Any]]:
    """``(model_id, info)``: the folders' ids joined by ``+``; info is JSON-ready: backend, spec,
    precision, the weights' dtype, ``folders`` (role -> folder path; the stage reads each
    folder's ``tuned_on`` from it) and ``parts`` (role -> :meth:`ModelFolder.info`)."""
    check_precision(precision)
    model_id = "+".join(f.part_id for f in folders)
    dtype = {"fp16": "float16", "bf16": "bfloat16"}.get(precision, "float32")
    info = {"backend": spec.backend, "spec": spec.text, "model_id": model_id, "precision": precision, "dtype": dtype,
            "folders": {f.kind.role: str(f.folder) for f in folders},
            "parts": {f.kind.role: f.info() for f in folders}}
    return model_id, info


def load_pretrained(folder: ModelFolder, precision: str) -> tuple[Any, Any]:
    """``(module, processor)`` of a checked folder, offline (``local_files_only``), weights in the
    precision's dtype, module in eval mode on the CPU.

    Raises:
        ModelError: transformers cannot load the folder (the message has its reason).
    """
    import transformers

    model_cls = getattr(transformers, folder.model_class)
    processor_cls = getattr(transformers, folder.processor_class)
    try:
        with quiet_transformers():
            processor = processor_cls.from_pretrained(folder.folder, local_files_only=True)
            module = model_cls.from_pretrained(folder.folder, local_files_only=True, dtype=precision_dtype(precision))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ModelError(f"{folder.folder} does not load as {folder.model_class} with {folder.processor_class}: "
                         f"{error}") from None
    return module.eval(), processor


def to_device(inputs: Mapping[str, Any], device: torch.device, dtype: torch.dtype,
              keep: Sequence[str] = ()) -> dict[str, Any]:
    """A processor's tensors on ``device``, floating ones in ``dtype``; keys in ``keep`` dropped."""
    import torch

    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if key in keep:
            continue
        if isinstance(value, torch.Tensor):
            value = value.to(device, dtype=dtype) if value.is_floating_point() else value.to(device)
        out[key] = value
    return out


def format_threshold(threshold: float) -> str:
    """``0.50`` for two-decimal thresholds, else as many digits as it has (``0.125``)."""
    return f"{threshold:.2f}" if round(threshold, 2) == threshold else f"{threshold:g}"


def nothing_above(threshold: float) -> str:
    """The reason of a proposal without a mask because no score reached the threshold."""
    return f"nothing above threshold {format_threshold(threshold)}"


def union_proposal(masks: np.ndarray, scores: Sequence[float], threshold: float, best: float) -> Proposal:
    """The proposal of the instances that passed the threshold.

    Args:
        masks: ``(k, H, W)`` bool, the kept instances' masks at the image's size.
        scores: their ``k`` scores (each ``>= threshold``).
        threshold: the threshold they passed.
        best: the best score of all candidates (the score reported when none passed).

    Returns:
        ``mask = OR of the masks``, ``score = max(scores)``; no mask (with the reason) when no
        instance passed or the kept instances' masks are all empty.
    """
    if not len(scores):
        return Proposal(None, float(np.clip(best, 0.0, 1.0)), nothing_above(threshold))
    score = float(np.clip(max(scores), 0.0, 1.0))
    union = np.asarray(masks, dtype=bool).any(axis=0)
    if not union.any():
        return Proposal(None, score, f"{len(scores)} instance(s) scored >= {format_threshold(threshold)} but "
                                     "their masks are empty")
    return Proposal(union, score)


class HFProposer(abc.ABC):
    """The shared part of the ``transformers`` proposers: request checks, batching (the whole list
    in chunks of ``batch_size``; out of memory halves the chunk and goes on), no-grad inference
    under the precision's autocast. Subclasses implement :meth:`_propose_batch`.

    Attributes: ``model_id``, ``info`` (as :func:`identity_of`), ``device``, ``precision``,
    ``dtype`` (of the weights), ``batch_size`` (images per forward; shrinks on out of memory).
    """

    backend: ClassVar[str] = ""

    def __init__(self, *, model_id: str, info: dict[str, Any], device: Any, precision: str, batch_size: int) -> None:
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model_id = model_id
        self.info = info
        self.device = resolve_device(device)
        self.precision = check_precision(precision)
        self.dtype = precision_dtype(precision)
        self.batch_size = int(batch_size)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast for ``amp`` (fp16 on CUDA, bf16 on CPU) and ``amp_bf16``; else a no-op."""
        import torch

        if self.precision not in ("amp", "amp_bf16"):
            return contextlib.nullcontext()
        half = torch.float16 if self.precision == "amp" and self.device.type == "cuda" else torch.bfloat16
        return torch.autocast(device_type=self.device.type, dtype=half)

    def propose(self, images: Sequence[Image.Image], prompts: Sequence[str], threshold: float) -> list[Proposal]:
        """One :class:`Proposal` per image, in order (the backend's docstring defines mask and score)."""
        from curate.engine.base import halving

        threshold = checked_request(images, prompts, threshold)
        empty = [i for i, p in enumerate(prompts) if not str(p).strip()]
        if empty:
            raise ValueError(f"empty prompt for image(s) {empty[:5]}: every image needs its class text")
        rgb = [im.convert("RGB") for im in images]
        texts = [str(p).strip() for p in prompts]
        results: list[Proposal | None] = [None] * len(rgb)

        def run(chunk: Sequence[int]) -> None:
            import torch

            with torch.inference_mode(), self.autocast():
                out = self._propose_batch([rgb[i] for i in chunk], [texts[i] for i in chunk], threshold)
            for i, proposal in zip(chunk, out):
                results[i] = proposal

        self.batch_size = halving(list(range(len(rgb))), self.batch_size, run, what=f"{self.backend} batch")
        done = [r for r in results if r is not None]
        if len(done) != len(rgb):  # pragma: no cover - a backend that returned too few proposals
            raise RuntimeError(f"{self.model_id}: {len(rgb) - len(done)} images got no proposal")
        return done

    @abc.abstractmethod
    def _propose_batch(self, images: list[Image.Image], prompts: list[str], threshold: float) -> list[Proposal]:
        """The proposals of one chunk of images (under no-grad and the precision's autocast)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_id={self.model_id!r}, device={str(self.device)!r}, precision={self.precision!r})"


def single_folder_identity(spec: MaskModelSpec, kind: FolderKind, precision: str) -> tuple[str, dict[str, Any]]:
    """``identity`` of a backend with one model folder (its role is ``kind.role``), no weights read."""
    return identity_of(spec, [resolve_folder(kind, spec_part(spec, kind.role))], precision)


def load_single_folder(spec: MaskModelSpec, kind: FolderKind, proposer: type[HFProposer], *, device: Any,
                       precision: str, batch_size: int) -> HFProposer:
    """``load`` of a backend with one model folder: check it, name it, load model and processor
    (offline) and wrap them in ``proposer``."""
    folder = resolve_folder(kind, spec_part(spec, kind.role))
    model_id, info = identity_of(spec, [folder], precision)
    module, processor = load_pretrained(folder, precision)
    return proposer(module=module, processor=processor, model_id=model_id, info=info, device=device,
                    precision=precision, batch_size=batch_size)
