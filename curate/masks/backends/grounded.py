"""``sam:PATH+owlv2:PATH`` / ``sam:PATH+grounding-dino:PATH``: text -> boxes -> SAM masks (GroundedSAM).

An open-vocabulary detector finds boxes for the prompt; SAM, prompted with each box, draws the
mask inside it. SAM cannot read text, and a detector draws no masks: together they give
instance masks for any class name, with two models that are each strong at their half.

Classes:

- detector ``owlv2``: ``Owlv2ForObjectDetection`` + ``Owlv2Processor`` (one text query per image;
  a box and a score per image patch); ``grounding-dino``: ``GroundingDinoForObjectDetection`` +
  ``GroundingDinoProcessor`` (the text is lower-cased and ends with ``.``, Grounding DINO's own
  convention; a box per query, scored against every text token);
- segmenter ``sam``: ``SamModel`` + ``SamProcessor`` (SAM ViT-B/L/H), or ``Sam2Model`` +
  ``Sam2Processor`` when the folder's ``config.json`` says ``sam2``.

For an image of size ``(H, W)`` and prompt ``t``::

    (b_j, s_j) = detector(image, t)                # boxes in image pixels, s_j = sigmoid(best logit of box j)
    keep       = the MAX_BOXES best j with s_j >= threshold, clipped to the image (empty boxes dropped)
    mask       = OR_{j in keep} SAM(image, box = b_j)     # one mask per box (multimask_output=False)
    score      = max_{j in keep} s_j

Scores and boxes come from the processors' ``post_process_grounded_object_detection`` (OWLv2's
boxes are relative to the image padded to a square; its processor scales them by ``max(H, W)``),
masks from SAM's ``post_process_masks`` (logit > 0, resized to ``(H, W)``). SAM's own
predicted IoU is **not** used: it rates how well a mask fits its box, not whether the object is
there, which is the detector's job. No box at the threshold: ``Proposal(None, max_j s_j,
"nothing above threshold T")``; kept boxes whose masks are all empty: no mask, with that reason.

The detector and SAM's image encoder run once per batch of images; SAM's mask decoder runs on
the batch's boxes, each image's list padded to the longest by repeating its best box (a repeated
box adds the same mask to the union, so the padding changes nothing).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from curate.masks.backends.base import DETECTORS, MaskModelSpec, MaskSpecError, Proposal
from curate.masks.backends.common import (
    FolderKind,
    HFProposer,
    ModelFolder,
    identity_of,
    load_pretrained,
    resolve_folder,
    spec_part,
    to_device,
    union_proposal,
)

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["SAM", "OWLV2", "GROUNDING_DINO", "MAX_BOXES", "GroundedProposer", "load", "identity", "grounding_text"]

SAM = FolderKind("sam", "SAM", {"sam": ("SamModel", "SamProcessor"), "sam2": ("Sam2Model", "Sam2Processor")},
                 needs_tokenizer=False)
OWLV2 = FolderKind("owlv2", "OWLv2", {"owlv2": ("Owlv2ForObjectDetection", "Owlv2Processor")})
GROUNDING_DINO = FolderKind("grounding-dino", "Grounding DINO",
                            {"grounding-dino": ("GroundingDinoForObjectDetection", "GroundingDinoProcessor")})
_KINDS = {"owlv2": OWLV2, "grounding-dino": GROUNDING_DINO}
#: At most this many boxes (the best-scoring) go to SAM per image: bounds SAM's work and memory
#: when a low threshold passes hundreds of near-duplicate boxes (OWLv2 scores every patch).
MAX_BOXES = 16


def grounding_text(prompt: str) -> str:
    """Grounding DINO's text form: lower case, ending with ``.`` (its phrases are ``.``-separated)."""
    text = prompt.strip().lower()
    return text if text.endswith(".") else text + "."


def _folders(spec: MaskModelSpec) -> tuple[ModelFolder, ModelFolder]:
    roles = [role for role in DETECTORS if role in spec.parts]
    if len(roles) != 1:
        raise MaskSpecError(f"mask model {spec.text!r}: SAM needs exactly one box detector "
                            f"({' or '.join(DETECTORS)}), as sam:PATH+owlv2:PATH")
    return resolve_folder(SAM, spec_part(spec, "sam")), resolve_folder(_KINDS[roles[0]], spec_part(spec, roles[0]))


def identity(spec: MaskModelSpec, *, precision: str = "fp32") -> tuple[str, dict[str, Any]]:
    """``("sam:<name>@<fp>+<detector>:<name>@<fp>", info)`` without loading weights."""
    return identity_of(spec, list(_folders(spec)), precision)


def load(spec: MaskModelSpec, *, device: Any = "auto", precision: str = "fp32", batch_size: int = 8) -> GroundedProposer:
    """Load the SAM and detector folders of ``spec`` (offline) into a :class:`GroundedProposer`."""
    sam, detector = _folders(spec)
    model_id, info = identity_of(spec, [sam, detector], precision)
    sam_module, sam_processor = load_pretrained(sam, precision)
    det_module, det_processor = load_pretrained(detector, precision)
    return GroundedProposer(sam=sam_module, sam_processor=sam_processor, detector=det_module,
                            detector_processor=det_processor, detector_role=detector.kind.role, model_id=model_id,
                            info=info, device=device, precision=precision, batch_size=batch_size)


class GroundedProposer(HFProposer):
    """A loaded detector + SAM pair (the module docstring defines mask and score)."""

    backend = "grounded"

    def __init__(self, *, sam: Any, sam_processor: Any, detector: Any, detector_processor: Any, detector_role: str,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sam = sam.to(self.device)
        self.sam_processor = sam_processor
        self.detector = detector.to(self.device)
        self.detector_processor = detector_processor
        self.detector_role = detector_role
        self.max_boxes = MAX_BOXES

    # -- text -> boxes
    def detect(self, images: list[Image.Image], prompts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every candidate box of each image: ``(boxes [n, 4] xyxy in image pixels, scores [n])``."""
        proc = self.detector_processor
        sizes = [(im.height, im.width) for im in images]
        if self.detector_role == "owlv2":
            inputs = to_device(proc(text=[[p] for p in prompts], images=images, truncation=True, return_tensors="pt"),
                               self.device, self.dtype)
            out = self.detector(**inputs)
            # boxes are relative to the image padded to a square: the processor scales them by max(H, W)
            results = proc.post_process_grounded_object_detection(out, threshold=-1.0, target_sizes=sizes)
        else:
            inputs = to_device(proc(images=images, text=[grounding_text(p) for p in prompts], padding=True,
                                    truncation=True, return_tensors="pt"), self.device, self.dtype)
            out = self.detector(**inputs)
            results = proc.post_process_grounded_object_detection(out, inputs["input_ids"], threshold=-1.0,
                                                                  target_sizes=sizes)
        return [(r["boxes"].float().cpu().numpy().reshape(-1, 4), r["scores"].float().cpu().numpy().reshape(-1))
                for r in results]

    # -- boxes -> masks
    def segment(self, images: list[Image.Image], boxes: list[np.ndarray]) -> list[np.ndarray]:
        """SAM's mask of every box: per image ``[k, H, W]`` bool (``boxes[i]``: ``[k, 4]``, ``k >= 1``)."""
        longest = max(len(b) for b in boxes)
        padded = [[[float(v) for v in box] for box in b] + [[float(v) for v in b[0]]] * (longest - len(b))
                  for b in boxes]
        inputs = self.sam_processor(images=images, input_boxes=padded, return_tensors="pt")
        sizes = {k: inputs[k] for k in ("original_sizes", "reshaped_input_sizes") if k in inputs}
        out = self.sam(**to_device(inputs, self.device, self.dtype, keep=tuple(sizes)), multimask_output=False)
        masks = self.sam_processor.post_process_masks(out.pred_masks.float().cpu(), sizes.pop("original_sizes"),
                                                      **sizes)
        return [m[:len(b), 0].bool().numpy() for m, b in zip(masks, boxes)]

    def _propose_batch(self, images: list[Image.Image], prompts: list[str], threshold: float) -> list[Proposal]:
        kept: list[tuple[np.ndarray, np.ndarray]] = []
        best: list[float] = []
        for image, (boxes, scores) in zip(images, self.detect(images, prompts)):
            best.append(float(scores.max()) if len(scores) else 0.0)
            order = np.argsort(-scores, kind="stable")
            order = order[scores[order] >= threshold][:self.max_boxes]
            clipped = np.clip(boxes[order], 0, [image.width, image.height, image.width, image.height])
            kept.append((clipped, scores[order]))
        with_boxes = [i for i, (b, _) in enumerate(kept) if len(b) and _has_area(b).any()]
        masks: dict[int, np.ndarray] = {}
        if with_boxes:
            drawn = self.segment([images[i] for i in with_boxes], [kept[i][0][_has_area(kept[i][0])] for i in with_boxes])
            masks = dict(zip(with_boxes, drawn))
        proposals = []
        for i, image in enumerate(images):
            empty = np.zeros((0, image.height, image.width), bool)
            proposals.append(union_proposal(masks.get(i, empty), kept[i][1].tolist(), threshold, best[i]))
        return proposals


def _has_area(boxes: np.ndarray) -> np.ndarray:
    """Which ``xyxy`` boxes are at least a pixel wide and high (after clipping to the image)."""
    return (boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1)
