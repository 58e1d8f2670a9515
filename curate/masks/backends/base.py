"""The contract every mask-proposal backend keeps (docs/design.md#masks).

A backend turns images and one text prompt per image into :class:`Proposal` s. Specs name the
backend and its model folders (local folders or repos in the local Hugging Face cache; nothing is
downloaded), exactly like the ``lvlm:`` backend's:

==============================================  ===========================================
spec                                            backend
==============================================  ===========================================
``clipseg:PATH``                                CLIPSeg, prompted with the class text
``sam3:PATH``                                   SAM 3, the class text as its concept prompt
``sam:PATH+owlv2:PATH``                         OWLv2 boxes -> SAM masks (GroundedSAM recipe)
``sam:PATH+grounding-dino:PATH``                Grounding DINO boxes -> SAM masks
``cam:<clip spec>``                             the dataset's own CLIP's saliency, thresholded
``salient:PATH.onnx[#preset]``                  a salient-object model (U2-Net, IS-Net, BiRefNet)
                                                in ONNX Runtime; no text
==============================================  ===========================================

:func:`parse_mask_spec` reads a spec; :func:`load_mask_model` loads its proposer (the module of
each backend is imported only when used); :func:`mask_model_identity` names the model without
loading weights (a Ray driver that loads nothing).
"""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["Proposal", "MaskProposer", "MaskModelSpec", "MaskSpecError", "BACKENDS", "parse_mask_spec",
           "load_mask_model", "mask_model_identity", "checked_request"]


class MaskSpecError(ValueError):
    """A mask model spec that names no known backend or is malformed; the message says the forms."""


@dataclass
class Proposal:
    """One image's proposal.

    ``mask``: ``(H, W)`` bool at the image's own size, or None when nothing was found (never an
    empty mask); ``score``: the backend's confidence in [0, 1] (its definition is in the backend's
    docstring); ``reason``: why there is no mask (e.g. ``"nothing above threshold 0.50"``).
    """

    mask: np.ndarray | None
    score: float | None
    reason: str | None = None


class MaskProposer(Protocol):
    """A loaded backend: ``model_id`` (stable: backend, folder names, weights fingerprints),
    ``info`` (JSON-ready: backend, folders, transformers classes), and :meth:`propose`."""

    model_id: str
    info: dict[str, Any]

    def propose(self, images: Sequence[Image.Image], prompts: Sequence[str], threshold: float) -> list[Proposal]:
        """One :class:`Proposal` per image, in order; ``prompts[i]`` is image ``i``'s text."""
        ...


def checked_request(images: Sequence[Any], prompts: Sequence[str], threshold: float) -> float:
    """The checks every :meth:`MaskProposer.propose` makes first: one prompt per image and a
    threshold in [0, 1] (returned as a float)."""
    if len(images) != len(prompts):
        raise ValueError(f"{len(images)} images but {len(prompts)} prompts")
    threshold = float(threshold)
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    return threshold


@dataclass(frozen=True)
class MaskModelSpec:
    """A parsed spec: ``backend`` (a key of :data:`BACKENDS`), ``parts`` (role -> folder or repo
    id, the CLIP spec for ``cam``, the file and options for ``salient``), and the ``text`` it was
    read from."""

    backend: str
    parts: dict[str, str] = field(default_factory=dict)
    text: str = ""


#: backend name -> "module:function" of its loader ``load(spec, *, device, precision, batch_size)``
#: and of its identity ``identity(spec, *, precision) -> (model_id, info)``.
BACKENDS: dict[str, tuple[str, str]] = {
    "clipseg": ("curate.masks.backends.clipseg:load", "curate.masks.backends.clipseg:identity"),
    "sam3": ("curate.masks.backends.sam3:load", "curate.masks.backends.sam3:identity"),
    "grounded": ("curate.masks.backends.grounded:load", "curate.masks.backends.grounded:identity"),
    "cam": ("curate.masks.backends.cam:load", "curate.masks.backends.cam:identity"),
    "salient": ("curate.masks.backends.salient:load", "curate.masks.backends.salient:identity"),
}
#: The box detectors the grounded backend pairs with SAM.
DETECTORS: tuple[str, ...] = ("owlv2", "grounding-dino")
_FORMS = ("clipseg:PATH", "sam3:PATH", "sam:PATH+owlv2:PATH", "sam:PATH+grounding-dino:PATH", "cam:<clip spec>",
          "salient:PATH.onnx")


def parse_mask_spec(text: str | MaskModelSpec) -> MaskModelSpec:
    """Read ``--model`` of ``propose-masks`` (the forms are in the module docstring)."""
    if isinstance(text, MaskModelSpec):
        return text
    text = str(text).strip()
    prefix, sep, rest = text.partition(":")
    if not sep or not rest:
        raise MaskSpecError(f"mask model {text!r}: expected one of {', '.join(_FORMS)}")
    if prefix in ("clipseg", "sam3") and "+" not in rest:
        return MaskModelSpec(prefix, {prefix: rest}, text)
    if prefix == "cam":
        return MaskModelSpec("cam", {"clip": rest}, text)
    if prefix == "salient":  # the file and its options: curate.masks.backends.salient.parse_salient_spec
        return MaskModelSpec("salient", {"salient": rest}, text)
    if prefix == "sam":
        sam, plus, detector = rest.partition("+")
        name, colon, folder = detector.partition(":")
        if not plus or not colon or not folder or name not in DETECTORS or not sam:
            raise MaskSpecError(f"mask model {text!r}: SAM needs a box detector, as sam:PATH+owlv2:PATH or "
                                "sam:PATH+grounding-dino:PATH (the GroundedSAM recipe: text -> box -> mask)")
        return MaskModelSpec("grounded", {"sam": sam, name: folder}, text)
    raise MaskSpecError(f"mask model {text!r}: unknown backend {prefix!r}; expected one of {', '.join(_FORMS)}")


def _entry(spec: MaskModelSpec, which: int) -> Any:
    module, _, function = BACKENDS[spec.backend][which].partition(":")
    return getattr(importlib.import_module(module), function)


def load_mask_model(spec: str | MaskModelSpec, *, device: str = "auto", precision: str = "fp32",
                    batch_size: int = 8) -> MaskProposer:
    """Load the proposer a spec names (offline: local folders or the local HF cache)."""
    spec = parse_mask_spec(spec)
    return _entry(spec, 0)(spec, device=device, precision=precision, batch_size=batch_size)


def mask_model_identity(spec: str | MaskModelSpec, *, precision: str = "fp32") -> tuple[str, dict[str, Any]]:
    """``(model_id, info)`` of the model a spec names, read from its folders' configs and weights
    fingerprints without loading it; equal to the loaded proposer's ``model_id`` / ``info``."""
    spec = parse_mask_spec(spec)
    return _entry(spec, 1)(spec, precision=precision)
