"""``clipseg:PATH``: CLIPSeg (Lüddecke & Ecker, CVPR 2022), prompted with the class text.

Classes: ``CLIPSegForImageSegmentation`` (a CLIP with a light transformer decoder that reads
CLIP's intermediate activations, conditioned on the prompt's CLIP text embedding by FiLM) and
``CLIPSegProcessor`` (its image processor and CLIP tokenizer). It is the only backend that maps
text straight to a per-pixel probability, which is what a referring "segment the <class>" query
asks; one forward per batch of images, no boxes, no instances.

For an image of size ``(H, W)`` and prompt ``t``::

    p      = sigmoid(logits(image, t))                 # at the processor's square size (352 for CIDAS)
    P      = bilinear_resize(p, (H, W))                # back to the image's own size (undoes the squash;
                                                       # antialiased when shrinking, as PIL does)
    mask   = P >= threshold
    score  = mean(P[mask])                             # the mean probability inside the mask, in [0, 1]

When no pixel reaches the threshold there is no mask: ``Proposal(None, max(P), "nothing above
threshold T")``. The prompt is used as given (the stage formats it, e.g. ``"a photo of a {}."``);
each distinct prompt of a batch is embedded once (``conditional_embeddings``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from curate.masks.backends.base import MaskModelSpec, Proposal
from curate.masks.backends.common import (
    FolderKind,
    HFProposer,
    load_single_folder,
    nothing_above,
    single_folder_identity,
    to_device,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image

__all__ = ["CLIPSEG", "ClipSegProposer", "load", "identity", "probability_maps", "proposal_of"]

CLIPSEG = FolderKind("clipseg", "CLIPSeg", {"clipseg": ("CLIPSegForImageSegmentation", "CLIPSegProcessor")})


def identity(spec: MaskModelSpec, *, precision: str = "fp32") -> tuple[str, dict[str, Any]]:
    """``("clipseg:<name>@<fingerprint>", info)`` without loading weights."""
    return single_folder_identity(spec, CLIPSEG, precision)


def load(spec: MaskModelSpec, *, device: Any = "auto", precision: str = "fp32", batch_size: int = 8) -> ClipSegProposer:
    """Load the folder of ``spec`` (offline) into a :class:`ClipSegProposer`."""
    return load_single_folder(spec, CLIPSEG, ClipSegProposer, device=device, precision=precision,  # type: ignore[return-value]
                              batch_size=batch_size)


def probability_maps(logits: torch.Tensor, sizes: list[tuple[int, int]]) -> list[np.ndarray]:
    """``sigmoid(logits)`` of a batch ``[B, h, w]`` (or ``[h, w]``), each resized bilinearly to its
    ``(H, W)`` in ``sizes``: float32 arrays in [0, 1].

    Our own code: transformers has no post-processing for CLIPSeg (its model card resizes the
    sigmoid by hand), so we do the same, per image, since images in a batch differ in size.
    ``antialias`` makes shrinking (352 px maps onto small photos) average like PIL's bilinear
    resize instead of sampling; enlarging is plain bilinear either way.
    """
    import torch.nn.functional as F

    if logits.ndim == 2:
        logits = logits[None]
    probs = logits.float().sigmoid()
    maps = []
    for prob, size in zip(probs, sizes):
        resized = F.interpolate(prob[None, None], size=size, mode="bilinear", align_corners=False, antialias=True)[0, 0]
        maps.append(resized.clamp_(0.0, 1.0).cpu().numpy())
    return maps


class ClipSegProposer(HFProposer):
    """A loaded CLIPSeg (the module docstring defines mask and score)."""

    backend = "clipseg"

    def __init__(self, *, module: Any, processor: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.module = module.to(self.device)
        self.processor = processor

    def _propose_batch(self, images: list[Image.Image], prompts: list[str], threshold: float) -> list[Proposal]:
        # each distinct prompt's CLIP text embedding once per batch (a batch holds a few classes),
        # handed to the model as conditional_embeddings: the same numbers as text input_ids give
        unique = list(dict.fromkeys(prompts))
        text = self.processor.tokenizer(unique, padding=True, truncation=True, return_tensors="pt")
        text = to_device(text, self.device, self.dtype)
        embeddings = self.module.get_conditional_embeddings(batch_size=len(unique), input_ids=text["input_ids"],
                                                            attention_mask=text["attention_mask"])
        condition = embeddings[[unique.index(p) for p in prompts]]
        pixels = self.processor.image_processor(images, return_tensors="pt")["pixel_values"]
        logits = self.module(pixel_values=pixels.to(self.device, dtype=self.dtype),
                             conditional_embeddings=condition).logits
        maps = probability_maps(logits, [(im.height, im.width) for im in images])
        return [proposal_of(prob, threshold) for prob in maps]


def proposal_of(prob: np.ndarray, threshold: float) -> Proposal:
    """``mask = prob >= threshold``, ``score = mean(prob[mask])``; no mask: ``max(prob)`` and the reason."""
    mask = prob >= threshold
    if not mask.any():
        return Proposal(None, float(prob.max()) if prob.size else 0.0, nothing_above(threshold))
    return Proposal(mask, float(np.clip(prob[mask].mean(), 0.0, 1.0)))
