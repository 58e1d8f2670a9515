"""What every audit check shares: its inputs, its result, and the tables that tie checks to
reviewers' reasons and to the synthetic world's planted problems (docs/design.md#audit).

A check is a function ``check(inputs, settings) -> CheckResult``: a per-sample suspicion score
(higher = look at it first; NaN = not scored, with the reason in ``failed``) over
``inputs.ids``. Checks read pixels, masks, labels and the cached CLIP features; none reads a
sample's ``extra`` (where the synthetic world keeps its truth).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: The checks, in the order they run and print.
CHECKS: tuple[str, ...] = ("label", "duplicates", "outliers", "feature", "obscurity", "clarity")

#: Checks that need the CLIP's image features (the others read pixels and masks only).
NEEDS_FEATURES: frozenset[str] = frozenset({"label", "duplicates", "outliers", "obscurity", "clarity"})

#: Reviewer reason (``reject:<reason>``, papers/003 §2.1) -> the check that should find it.
#: ``duplicates`` and ``outliers`` have no reason of their own among the paper's four; outliers
#: are measured against any rejection (an outlier is a photo that should not be there).
REASON_TO_CHECK: dict[str, str] = {
    "label_noise": "label",
    "feature_noise": "feature",
    "obscurity": "obscurity",
    "clarity": "clarity",
}
ANY_REJECT_CHECKS: frozenset[str] = frozenset({"outliers"})
#: The same table read the other way: the ``reject:<reason>`` a reviewer confirms a
#: ``suspect:<check>`` with (Label Studio tasks pre-select it; curate.review.labelstudio).
CHECK_TO_REASON: dict[str, str] = {check: reason for reason, check in REASON_TO_CHECK.items()}

#: Planted problem of the synthetic world (curate.collect.planted) -> the check that should find it.
PLANTED_TO_CHECK: dict[str, str] = {
    "wrong_label": "label",
    "exact_duplicate": "duplicates",
    "near_duplicate": "duplicates",
    "duplicate_source": "duplicates",
    "feature_noise": "feature",
    "second_object": "obscurity",
    "small_object": "clarity",
}


def parse_checks(text: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """``"label,duplicates"`` -> ("label", "duplicates"); None/"all" -> every check; unknown -> error."""
    if text is None or text == "all" or (not isinstance(text, str) and list(text) == ["all"]):
        return CHECKS
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        raise ValueError(f"unknown audit check(s) {unknown or names}; choose from {', '.join(CHECKS)}")
    return tuple(c for c in CHECKS if c in names)


@dataclass
class AuditInputs:
    """The samples under audit and what the checks may read about them (rows aligned with ``ids``).

    ``embeddings`` has NaN rows for samples that failed to decode or encode (``failed``);
    ``probs`` are the zero-shot probabilities over ``label_columns`` (label-space indices),
    ``label_col[i]`` the column of sample i's class.
    """

    ids: list[str]
    classes: np.ndarray
    image_paths: list[Path]
    mask_paths: list[Path | None]
    embeddings: np.ndarray | None = None
    probs: np.ndarray | None = None
    label_columns: np.ndarray | None = None
    label_col: np.ndarray | None = None
    failed: dict[str, str] = field(default_factory=dict)
    model: Any = None  # the loaded CLIP (the clarity proxy runs saliency with it)
    classifier: Any = None  # (C, D) text classifier over label_columns

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def encoded(self) -> np.ndarray:
        """Which rows have a finite embedding."""
        if self.embeddings is None:
            return np.zeros(len(self.ids), bool)
        return np.isfinite(self.embeddings).all(axis=1)


@dataclass
class CheckResult:
    """One check's output: ``scores`` (higher = more suspect, NaN = not scored) over the audit's ids.

    ``method`` says in one line what the score is; ``flagged`` is the library's own verdict
    when it has one (cleanlab's ``find_label_issues``, CleanVision's ``is_<issue>_issue``,
    membership of a duplicate group); ``notes`` are what a reader must know (a fallback, a
    proxy); ``detail`` is check-specific (duplicate groups, counts per issue type).
    """

    name: str
    scores: np.ndarray
    method: str
    flagged: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scores = np.asarray(self.scores, dtype=np.float64)


def nan_scores(n: int) -> np.ndarray:
    return np.full(n, np.nan, dtype=np.float64)
