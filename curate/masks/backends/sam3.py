"""``sam3:PATH``: SAM 3 (Meta, "Segment Anything with Concepts", 2025), the class text as its concept prompt.

Classes: ``Sam3Model`` (a detector conditioned on a short noun phrase: a perception encoder,
a DETR-style decoder whose queries each predict a box, an instance mask and a score, and a
presence head saying whether the concept is in the image at all) and ``Sam3Processor``. It is the
one backend that turns text into *instance* masks in a single model. It is the heaviest backend:
a ViT-L-sized encoder at 1008 px (CLIPSeg: ViT-B/16 at 352 px) and about 0.85 B parameters.

For an image of size ``(H, W)`` and prompt ``t`` (the concept, used as given)::

    s_q   = sigmoid(logit_q) * sigmoid(presence)       # per query q, the processor's own score
    keep  = {q : s_q >= threshold}
    mask  = OR_{q in keep} (resize(sigmoid(mask_q), (H, W)) > 0.5)
    score = max_{q in keep} s_q

Scores and masks come from ``Sam3Processor.post_process_object_detection`` and
``post_process_instance_segmentation`` (mask threshold 0.5, bilinear resize to the image's size);
only the kept queries are resized. No query at the threshold: ``Proposal(None, max_q s_q,
"nothing above threshold T")``; kept queries whose masks are all empty: no mask either, with
that reason.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from curate.masks.backends.base import MaskModelSpec, Proposal
from curate.masks.backends.common import (
    FolderKind,
    HFProposer,
    load_single_folder,
    single_folder_identity,
    to_device,
    union_proposal,
)

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["SAM3", "Sam3Proposer", "load", "identity", "MASK_THRESHOLD"]

#: ``facebook/sam3`` ships a ``sam3_video`` config whose ``detector_config`` Sam3Model reads.
SAM3 = FolderKind("sam3", "SAM 3", {"sam3": ("Sam3Model", "Sam3Processor"),
                                    "sam3_video": ("Sam3Model", "Sam3Processor")})
#: Probability above which a pixel belongs to an instance's mask (the processor's default).
MASK_THRESHOLD = 0.5


def identity(spec: MaskModelSpec, *, precision: str = "fp32") -> tuple[str, dict[str, Any]]:
    """``("sam3:<name>@<fingerprint>", info)`` without loading weights."""
    return single_folder_identity(spec, SAM3, precision)


def load(spec: MaskModelSpec, *, device: Any = "auto", precision: str = "fp32", batch_size: int = 8) -> Sam3Proposer:
    """Load the folder of ``spec`` (offline) into a :class:`Sam3Proposer`."""
    return load_single_folder(spec, SAM3, Sam3Proposer, device=device, precision=precision,  # type: ignore[return-value]
                              batch_size=batch_size)


class Sam3Proposer(HFProposer):
    """A loaded SAM 3 (the module docstring defines mask and score)."""

    backend = "sam3"

    def __init__(self, *, module: Any, processor: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.module = module.to(self.device)
        self.processor = processor

    def _propose_batch(self, images: list[Image.Image], prompts: list[str], threshold: float) -> list[Proposal]:
        from transformers.models.sam3.modeling_sam3 import Sam3ImageSegmentationOutput

        inputs = self.processor(images=images, text=prompts, return_tensors="pt")
        out = self.module(**to_device(inputs, self.device, self.dtype, keep=("original_sizes",)))
        scores = self.processor.post_process_object_detection(out, threshold=-1.0)  # every query's score
        proposals = []
        for i, image in enumerate(images):
            s = scores[i]["scores"].float()
            keep = (s >= threshold).nonzero().flatten()
            best = float(s.max()) if len(s) else 0.0
            if not len(keep):
                proposals.append(union_proposal(np.zeros((0, image.height, image.width), bool), [], threshold, best))
                continue
            # the kept queries of image i only, so that only they are resized to the image's size
            kept = Sam3ImageSegmentationOutput(
                pred_logits=out.pred_logits[i:i + 1, keep], pred_boxes=out.pred_boxes[i:i + 1, keep],
                pred_masks=out.pred_masks[i:i + 1, keep],
                presence_logits=None if out.presence_logits is None else out.presence_logits[i:i + 1])
            result = self.processor.post_process_instance_segmentation(
                kept, threshold=-1.0, mask_threshold=MASK_THRESHOLD, target_sizes=[(image.height, image.width)])[0]
            masks = result["masks"].bool().cpu().numpy()
            proposals.append(union_proposal(masks, s[keep].tolist(), threshold, best))
        return proposals
