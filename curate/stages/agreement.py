"""The agreement stage: measure a team's agreement, decide each photo's label, derive the folder's
backgrounds (``curate agreement``; issue 44, docs/design.md#dataset-folder).

``agreement(dataset, None, settings)`` reads the annotation table
(:func:`curate.agreement.answers.answers_of`), measures (:mod:`curate.agreement.metrics`: alpha per
class and overall with its bootstrap interval, kappa per pair, the confused backgrounds, each
annotator's gold accuracy and agreement with the rest, mask IoU), decides each photo
(:func:`curate.agreement.aggregate.aggregate_labels`: ``settings.rule`` and ``threshold``), and,
with ``settings.derive`` (the default), writes the folder's ``background`` from the decisions
(:func:`curate.agreement.derive.derive_backgrounds`). The run (:class:`curate.runs.agreement.AgreementRun`)
is written last; ``provenance.agreement`` in ``dataset.yaml`` names it with the rule and the counts.

``model`` must be None: no model takes part. A folder without annotations is refused with the
commands that make them.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from curate.agreement.aggregate import (
    DEFAULT_MASK_METHOD,
    MASK_METHODS,
    aggregate_labels,
    aggregate_masks,
    default_threshold,
)
from curate.agreement.answers import answers_of, photo_classes
from curate.agreement.derive import derive_backgrounds
from curate.agreement.metrics import (
    alpha_table,
    annotator_quality,
    confused_pairs,
    mask_iou,
    mask_ious,
    pairwise_kappa,
    read_mask,
)
from curate.jsonio import json_safe
from curate.progress import Progress, report
from curate.runs.agreement import AgreementRun
from curate.runs.base import discard_if_empty
from curate.shell import suggest
from curate.stages.common import claim_run_dir, open_dataset, run_stage

__all__ = ["AgreementSettings", "agreement"]

logger = logging.getLogger(__name__)


@dataclass
class AgreementSettings:
    """How to measure and aggregate (``curate agreement`` options map one to one)."""

    rule: str = "dawid-skene"  # majority | dawid-skene (curate.agreement.aggregate)
    threshold: float | None = None  # None: the rule's default (0 for majority, 0.9 for dawid-skene)
    replicates: int = 1000  # bootstrap replicates of alpha's interval
    seed: int = 0
    level: float = 0.95
    mask_method: str = DEFAULT_MASK_METHOD  # majority | em | rasa (crowd-kit's segmentation aggregators)
    derive: bool = True  # write the folder's backgrounds and label_status.parquet

    def checked(self) -> AgreementSettings:
        """A copy with the threshold resolved; ValueError for a bad rule, threshold, method or level."""
        if self.mask_method not in MASK_METHODS:
            raise ValueError(f"unknown mask method {self.mask_method!r}; use one of {', '.join(MASK_METHODS)}")
        if not 0 < self.level < 1:
            raise ValueError(f"level {self.level} is outside (0, 1)")
        if self.replicates < 0:
            raise ValueError(f"replicates must be 0 or more, got {self.replicates}")
        return AgreementSettings(self.rule, default_threshold(self.rule, self.threshold), self.replicates, self.seed,
                                 self.level, self.mask_method, self.derive)


def _aggregated_mask_iou(root: Any, answers: Any, method: str) -> dict[str, float]:
    """annotator -> mean IoU of their masks with the aggregated mask of the same photo (photos with
    two masks or more)."""
    arrays = {sid: {who: read_mask(root, rel) for who, rel in by.items()} for sid, by in answers.masks.items()
              if len(by) >= 2}
    if not arrays:
        return {}
    agreed = aggregate_masks(arrays, method)
    sums: dict[str, list[float]] = {}
    for sid, by in arrays.items():
        for who, mask in by.items():
            if sid in agreed:
                value = mask_iou(mask, agreed[sid])
                if not math.isnan(value):
                    sums.setdefault(who, []).append(value)
    return {who: float(np.mean(v)) for who, v in sorted(sums.items())}


@run_stage("agreement")
def agreement(dataset: Any, model: None = None, settings: AgreementSettings | None = None, *,
              run_name: str | None = None, overwrite: bool = False, progress: Progress | None = None) -> AgreementRun:
    """Measure, decide, derive and write the :class:`AgreementRun` (module docstring).

    Raises:
        ValueError: a model was passed, a bad setting, or the folder has no annotations.
        FileExistsError: ``run_name`` is a finished run and ``overwrite`` is not set.
    """
    if model is not None:
        raise ValueError("agreement takes no model (pass None): it measures the annotators")
    settings = (settings or AgreementSettings()).checked()
    ds = open_dataset(dataset)
    answers = answers_of(ds)
    if not answers.photos:
        raise ValueError(
            f"{ds.root} has no annotations to measure: give photos to several annotators "
            f"(`{suggest('curate review labelstudio {dir} --annotators a,b,c --overlap 2', dir=ds.root)}`) and pull "
            f"their answers, or simulate a team (`{suggest('curate simulate-annotators {dir}', dir=ds.root)}`, on a "
            "synthetic world)")
    classes = photo_classes(ds)
    report(progress, 0, 4, "agreement")
    alpha = alpha_table(answers, classes, replicates=settings.replicates, seed=settings.seed, level=settings.level)
    report(progress, 1, 4, "agreement")
    decisions = aggregate_labels(answers, settings.rule, settings.threshold)
    report(progress, 2, 4, "agreement")
    masks = mask_ious(ds.root, answers, classes)
    aggregated = _aggregated_mask_iou(ds.root, answers, settings.mask_method)
    run_dir = claim_run_dir(ds.root, run_name, "agreement", settings.rule, overwrite=overwrite)
    try:
        record = AgreementRun(rule=settings.rule, threshold=float(settings.threshold), replicates=settings.replicates,
                              seed=settings.seed, level=settings.level, alpha=alpha, kappa=pairwise_kappa(answers),
                              confused=confused_pairs(answers), annotators=annotator_quality(answers),
                              decisions=[decisions[sid] for sid in sorted(decisions)], mask_iou=masks,
                              aggregated_mask_iou=aggregated, mask_method=settings.mask_method,
                              derived=settings.derive, replaced=answers.replaced)
        if settings.derive:
            record.changed = derive_backgrounds(ds, decisions, rule=settings.rule,
                                                threshold=float(settings.threshold)).changed
        report(progress, 3, 4, "agreement")
        record.write(run_dir)
    except BaseException:
        discard_if_empty(run_dir)
        raise
    ds.record_provenance("agreement", json_safe({**record.config_dict(), "run": run_dir.name}))
    report(progress, 4, 4, "agreement")
    logger.info("agreement: %d photos, %s; %d backgrounds changed -> %s", len(decisions), record.status_counts,
                record.changed, run_dir)
    return record
