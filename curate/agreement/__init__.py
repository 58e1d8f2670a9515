"""Several annotators: how far they agree, the agreed label per photo, disputes (issue 44).

- :mod:`curate.agreement.answers`: the annotation table reduced to who answered what
  (:func:`answers_of`, :class:`Answers`; two-background photos: the primary and the set).
- :mod:`curate.agreement.metrics`: Krippendorff's alpha with a bootstrap interval over photos,
  per class and overall; Cohen's kappa per pair; the confusion between annotators; each
  annotator's gold accuracy and leave-one-out agreement; mask IoU between annotators.
- :mod:`curate.agreement.aggregate`: the agreed label by ``majority`` or ``dawid-skene``
  (crowd-kit) with a threshold; statuses agreed | adjudicated | disputed | single | unlabelled;
  masks by crowd-kit's segmentation aggregators.
- :mod:`curate.agreement.derive`: the folder's ``background`` derived from the decisions
  (never one person's), with the per-photo status in ``label_status.parquet``.

Names resolve on first use (:mod:`curate.lazy`): importing the package loads neither pandas,
crowd-kit, sklearn nor krippendorff.
"""
from __future__ import annotations

from curate.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "Answers": "curate.agreement.answers",
    "answers_of": "curate.agreement.answers",
    "collect_answers": "curate.agreement.answers",
    "sets_agree": "curate.agreement.answers",
    "ALL": "curate.agreement.metrics",
    "AlphaEstimate": "curate.agreement.metrics",
    "AnnotatorQuality": "curate.agreement.metrics",
    "ConfusedPair": "curate.agreement.metrics",
    "GoldMistake": "curate.agreement.metrics",
    "KappaPair": "curate.agreement.metrics",
    "MaskIoU": "curate.agreement.metrics",
    "alpha_estimate": "curate.agreement.metrics",
    "alpha_table": "curate.agreement.metrics",
    "annotator_quality": "curate.agreement.metrics",
    "confused_pairs": "curate.agreement.metrics",
    "mask_iou": "curate.agreement.metrics",
    "mask_ious": "curate.agreement.metrics",
    "pairwise_kappa": "curate.agreement.metrics",
    "DEFAULT_THRESHOLDS": "curate.agreement.aggregate",
    "RULES": "curate.agreement.aggregate",
    "Decision": "curate.agreement.aggregate",
    "aggregate_labels": "curate.agreement.aggregate",
    "aggregate_masks": "curate.agreement.aggregate",
})

__all__ = [
    "ALL", "AlphaEstimate", "AnnotatorQuality", "Answers", "ConfusedPair", "DEFAULT_THRESHOLDS", "Decision",
    "GoldMistake", "KappaPair", "MaskIoU", "RULES", "aggregate_labels", "aggregate_masks", "alpha_estimate",
    "alpha_table", "annotator_quality", "answers_of", "collect_answers", "confused_pairs", "mask_iou", "mask_ious",
    "pairwise_kappa", "sets_agree",
]
