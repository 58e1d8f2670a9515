"""The agreed label of each photo, by a stated rule, and the agreed mask (issue 44).

Statuses (:data:`curate.store.annotation_schema.LABEL_STATUSES`), decided per photo in this order:

1. ``adjudicated``: an adjudicator answered (role "adjudicator", gold or not): their answer is
   the label, whatever the team said.
2. ``unlabelled``: every annotator skipped it (no label).
3. ``single``: one annotator answered: their answer is the label (agreement cannot be measured
   on one answer; the status says so).
4. ``agreed`` / ``disputed`` by the rule, on two answers or more (primaries, answers.py):

   - ``majority``: the most frequent primary; a tie for the top is disputed; its confidence is
     its share of the answers, and a photo below ``threshold`` is disputed too (default 0: only
     ties are disputed).
   - ``dawid-skene``: crowd-kit's ``DawidSkene`` (Dawid & Skene 1979: EM over one confusion
     matrix per annotator and the class priors) fitted on every answer of the team; the label is
     the photo's most probable background and its confidence that posterior; below ``threshold``
     (default :data:`DEFAULT_THRESHOLDS` = 0.9) the photo is disputed. Why 0.9: a photo the model
     gives at most 9 to 1 is one where, if the model is right, one such photo in ten carries the
     wrong label, as many as the errors of the careful annotator it is meant to beat; below it
     an adjudicator's minute is worth more than the rule. Two reliable annotators who agree
     give posteriors near 1, a 2-vs-1 split among reliable annotators near 0.99; what falls
     below is mostly two answers that differ.

Where this departs from crowd-kit, and why: photos with one answer are fitted (they inform each
annotator's confusion matrix) but are ``single``, not agreed, whatever their posterior; an
adjudicated photo takes the adjudicator's answer instead of the posterior; crowd-kit's
``MajorityVote`` breaks ties by label order, which would hide the disputes, so majority is
counted here (a ``Counter``; ties are disputed). Skipped answers are not answers: crowd-kit
never sees them.

Masks (:func:`aggregate_masks`): crowd-kit's ``SegmentationMajorityVote`` (a pixel is the object
when more than half of the masks say so), ``SegmentationEM`` or ``SegmentationRASA`` on the masks
of each photo; ``mask_method`` names which (default :data:`DEFAULT_MASK_METHOD`, chosen by the
measurement in docs/results.md#masks-from-several-annotators: majority was nearest the true mask on
every seed, above the best annotator alone; RASA close behind; EM below the careful annotator).
"""
from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from curate.agreement.answers import Answers

__all__ = ["DEFAULT_MASK_METHOD", "DEFAULT_THRESHOLDS", "MASK_METHODS", "RULES", "STATUSES", "Decision",
           "aggregate_labels", "aggregate_masks", "default_threshold"]

RULES: tuple[str, ...] = ("majority", "dawid-skene")
#: The threshold each rule uses when none is given (module docstring says why).
DEFAULT_THRESHOLDS: dict[str, float] = {"majority": 0.0, "dawid-skene": 0.9}
MASK_METHODS: tuple[str, ...] = ("majority", "em", "rasa")
#: A photo's status (:attr:`Decision.status`), in the order tables print them.
STATUSES: tuple[str, ...] = ("agreed", "adjudicated", "single", "disputed", "unlabelled")
DEFAULT_MASK_METHOD = "majority"


@dataclass(frozen=True)
class Decision:
    """The label of one photo and where it came from."""

    sample_id: str
    status: str  # agreed | adjudicated | disputed | single | unlabelled
    background: str | None  # the primary of the label; None when disputed or unlabelled
    backgrounds: tuple[str, ...]  # the full answer that set it (adjudicated / single); (background,) when agreed
    confidence: float  # vote share (majority) or posterior (dawid-skene); 1 for adjudicated / single; NaN else
    n_answers: int
    candidate: str | None = None  # the rule's best guess on a disputed photo (None on a tie)


def default_threshold(rule: str, threshold: float | None) -> float:
    """``threshold`` checked, or the rule's default; ValueError for an unknown rule or a value outside [0, 1]."""
    if rule not in RULES:
        raise ValueError(f"unknown aggregation rule {rule!r}; use one of {', '.join(RULES)}")
    value = DEFAULT_THRESHOLDS[rule] if threshold is None else float(threshold)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"threshold {value} is outside [0, 1]")
    return value


def _majority(labels: list[str]) -> tuple[str | None, float]:
    top = Counter(labels).most_common()
    if len(top) > 1 and top[0][1] == top[1][1]:
        return None, top[0][1] / len(labels)
    return top[0][0], top[0][1] / len(labels)


def _dawid_skene(answers: Answers) -> dict[str, tuple[str, float]]:
    """photo -> (most probable background, its posterior) from crowd-kit's DawidSkene."""
    import pandas as pd
    from crowdkit.aggregation import DawidSkene

    records = [(sid, who, b[0]) for sid, by in answers.labels.items() for who, b in by.items()]
    if not records:
        return {}
    frame = pd.DataFrame(records, columns=["task", "worker", "label"])
    with warnings.catch_warnings():  # crowd-kit 1.4 uses pandas keywords pandas 3 deprecates
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        model = DawidSkene(n_iter=100).fit(frame)
    probas = model.probas_
    best = probas.idxmax(axis=1)
    return {str(sid): (str(best[sid]), float(probas.loc[sid].max())) for sid in probas.index}


def aggregate_labels(answers: Answers, rule: str = "dawid-skene", threshold: float | None = None
                     ) -> dict[str, Decision]:
    """sample_id -> :class:`Decision` for every photo of ``answers`` (module docstring)."""
    threshold = default_threshold(rule, threshold)
    posterior = _dawid_skene(answers) if rule == "dawid-skene" else {}
    out: dict[str, Decision] = {}
    for sid in answers.photos:
        by = answers.labels.get(sid, {})
        n = len(by)
        if sid in answers.adjudicated:
            chosen = answers.adjudicated[sid]
            out[sid] = Decision(sid, "adjudicated", chosen[0], chosen, 1.0, n)
        elif n == 0:
            out[sid] = Decision(sid, "unlabelled", None, (), float("nan"), 0)
        elif n == 1:
            chosen = next(iter(by.values()))
            out[sid] = Decision(sid, "single", chosen[0], chosen, 1.0, 1)
        else:
            if rule == "majority":
                label, confidence = _majority([b[0] for b in by.values()])
            else:
                label, confidence = posterior[sid]
            if label is not None and confidence >= threshold:
                out[sid] = Decision(sid, "agreed", label, (label,), confidence, n)
            else:
                out[sid] = Decision(sid, "disputed", None, (), confidence, n, candidate=label)
    return out


def aggregate_masks(masks: Mapping[str, Mapping[str, np.ndarray]], method: str = DEFAULT_MASK_METHOD
                    ) -> dict[str, np.ndarray]:
    """sample_id -> the aggregated boolean mask of the annotators' masks of that photo, by crowd-kit's
    segmentation aggregator ``method`` (majority | em | rasa; module docstring). Photos whose masks
    differ in size are left out."""
    import pandas as pd
    from crowdkit.aggregation import SegmentationEM, SegmentationMajorityVote, SegmentationRASA

    if method not in MASK_METHODS:
        raise ValueError(f"unknown mask method {method!r}; use one of {', '.join(MASK_METHODS)}")
    records = []
    for sid, by in masks.items():
        arrays = {who: np.asarray(m) > 0 for who, m in by.items()}
        if arrays and len({a.shape for a in arrays.values()}) == 1:
            records += [(sid, who, arrays[who]) for who in sorted(arrays)]
    if not records:
        return {}
    frame = pd.DataFrame(records, columns=["task", "worker", "segmentation"])
    model = {"majority": SegmentationMajorityVote, "em": SegmentationEM, "rasa": SegmentationRASA}[method]()
    result = model.fit_predict(frame)
    return {str(sid): np.asarray(result[sid], dtype=bool) for sid in result.index}
