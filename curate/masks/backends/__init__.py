"""Mask-proposal backends: segmentation models propose object masks, people verify them.

>>> from curate.masks.backends import load_mask_model, mask_model_identity
>>> proposer = load_mask_model("clipseg:~/models/clipseg-rd64-refined", device="auto")
>>> proposals = proposer.propose(images, ["a photo of a lion."] * len(images), threshold=0.5)
>>> proposals[0].mask, proposals[0].score, proposals[0].reason

Modules: :mod:`.base` (the contract: :class:`Proposal`, specs, the registry), :mod:`.common`
(model folders, identity, batching of the ``transformers`` backends), :mod:`.clipseg`,
:mod:`.sam3`, :mod:`.grounded` (OWLv2 or Grounding DINO boxes -> SAM masks), :mod:`.cam` (the
dataset's own CLIP's saliency, thresholded), :mod:`.salient` (U2-Net / IS-Net / BiRefNet salient-object
models in ONNX Runtime). Definitions of mask and score: each backend's docstring and
docs/masks.md. Importing this package does not import torch or transformers.
"""
from __future__ import annotations

from curate.masks.backends.base import (
    BACKENDS,
    DETECTORS,
    MaskModelSpec,
    MaskProposer,
    MaskSpecError,
    Proposal,
    load_mask_model,
    mask_model_identity,
    parse_mask_spec,
)

__all__ = ["BACKENDS", "DETECTORS", "MaskModelSpec", "MaskProposer", "MaskSpecError", "Proposal", "load_mask_model",
           "mask_model_identity", "parse_mask_spec"]
