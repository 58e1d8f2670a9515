"""What an audit is worth: precision and recall of each check's ranking (docs/design.md#audit).

For a check with scores ``s`` over the reviewed samples and a set ``P`` of positives (the
samples people rejected for the reason the check targets, or, on the synthetic world, the
samples with the planted problem), and the top ``k = ceil(f x n)`` samples by score:

    precision@f = |top_k ∩ P| / k          recall@f = |top_k ∩ P| / |P|

Random order has expected precision ``|P| / n`` (the base rate) and recall ``f``: that is the
bar every figure is printed beside. Samples a check could not score rank last.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

FRACTIONS: tuple[float, ...] = (0.05, 0.10, 0.20)


@dataclass
class CheckMeasure:
    """One check's precision / recall at the top fractions, against one truth."""

    check: str
    truth: str  # what the positives are ("reviewers' reject:label_noise", "planted wrong_label", ...)
    n: int
    positives: int
    precision: dict[float, float] = field(default_factory=dict)
    recall: dict[float, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def base_rate(self) -> float:
        """Random order's expected precision."""
        return self.positives / self.n if self.n else float("nan")

    def lift(self, fraction: float) -> float:
        """precision@f / base rate (1 = no better than random)."""
        return self.precision[fraction] / self.base_rate if self.base_rate else float("nan")

    def to_dict(self) -> dict:
        return {"check": self.check, "truth": self.truth, "n": self.n, "positives": self.positives,
                "base_rate": self.base_rate, "precision": {str(k): v for k, v in self.precision.items()},
                "recall": {str(k): v for k, v in self.recall.items()}, "notes": list(self.notes)}


def precision_recall_at(scores: np.ndarray, positive: np.ndarray, fractions: Sequence[float] = FRACTIONS
                        ) -> tuple[dict[float, float], dict[float, float]]:
    """``precision@f`` and ``recall@f`` (see the module docstring); NaN scores rank last."""
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    n = len(scores)
    key = np.where(np.isfinite(scores), scores, -np.inf)
    order = np.argsort(-key, kind="stable")
    total = int(positive.sum())
    precision, recall = {}, {}
    for f in fractions:
        k = max(1, math.ceil(f * n)) if n else 0
        hits = int(positive[order[:k]].sum()) if k else 0
        precision[f] = hits / k if k else float("nan")
        recall[f] = hits / total if total else float("nan")
    return precision, recall


def measure_check(check: str, scores: np.ndarray, positive: np.ndarray, truth: str,
                  fractions: Sequence[float] = FRACTIONS) -> CheckMeasure:
    precision, recall = precision_recall_at(scores, positive, fractions)
    out = CheckMeasure(check, truth, len(scores), int(np.asarray(positive).sum()), precision, recall)
    if out.positives == 0:
        out.notes.append("no positives: precision is 0 and recall undefined; nothing to measure against")
    return out


def positives_by_check(labels: Mapping[str, str], table: Mapping[str, str], any_checks: Sequence[str] = ()
                       ) -> dict[str, set[str]]:
    """``{check: sample ids}`` from ``{sample id: reason or planted kind}`` through ``table``;
    ``any_checks`` count every labelled sample as a positive."""
    out: dict[str, set[str]] = {}
    for sid, label in labels.items():
        check = table.get(label)
        if check:
            out.setdefault(check, set()).add(sid)
        for extra in any_checks:
            out.setdefault(extra, set()).add(sid)
    return out
