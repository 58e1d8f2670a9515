"""Seeded bootstrap intervals for balanced group accuracies and the drop.

The resampling is stratified by (class, group) cell, as the estimators are means over
classes of within-cell means. Resampling n 0/1 outcomes with replacement from a cell with
k successes gives a mean distributed exactly as Binomial(n, k/n)/n, so each bootstrap
replicate draws one binomial per cell instead of n indices: the same distribution as the
index bootstrap, at a cost independent of the number of images.

Percentile intervals (2.5 and 97.5 percentiles of B replicates). A cell with one image has a
degenerate interval (its outcome never varies); the interval then reflects only the other
cells. Deterministic for a seed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def to_list(self) -> list[float]:
        return [self.low, self.high]


def _cell_replicates(correct: np.ndarray, classes: np.ndarray, mask: np.ndarray, rng: np.random.Generator,
                     n_boot: int) -> dict[int, np.ndarray]:
    """Per class within ``mask``: (n_boot,) bootstrap replicates of the class's accuracy."""
    out = {}
    for c in np.unique(classes[mask]):
        sel = mask & (classes == c)
        n = int(sel.sum())
        k = int(correct[sel].sum())
        out[int(c)] = rng.binomial(n, k / n, size=n_boot) / n
    return out


def _interval(values: np.ndarray, level: float) -> Interval:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Interval(float("nan"), float("nan"))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return Interval(float(low), float(high))


def bootstrap_groups(
    correct: np.ndarray, classes: np.ndarray, groups: np.ndarray, *, n_boot: int = 1000, seed: int = 0,
    level: float = 0.95,
) -> dict[str, Interval]:
    """Intervals for the balanced easy accuracy, the balanced hard accuracy and the mean drop.

    Returns ``{"easy": Interval, "hard": Interval, "drop": Interval}`` (fractions, not %).
    The drop replicate is the mean over classes with both groups of (easy - hard) replicates.
    """
    correct = np.asarray(correct, dtype=np.float64)
    classes = np.asarray(classes)
    groups = np.asarray(groups, dtype=object)
    rng = np.random.default_rng(seed)
    easy = _cell_replicates(correct, classes, groups == "easy", rng, n_boot)
    hard = _cell_replicates(correct, classes, groups == "hard", rng, n_boot)
    result = {}
    for name, cells in (("easy", easy), ("hard", hard)):
        result[name] = _interval(np.mean(list(cells.values()), axis=0), level) if cells else Interval(float("nan"), float("nan"))
    both = sorted(set(easy) & set(hard))
    if both:
        drops = np.mean([easy[c] - hard[c] for c in both], axis=0)
        result["drop"] = _interval(drops, level)
    else:
        result["drop"] = Interval(float("nan"), float("nan"))
    return result


def bootstrap_mean(correct: np.ndarray, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> Interval:
    """Interval for the accuracy of one cell (e.g. one class on one background)."""
    correct = np.asarray(correct, dtype=np.float64)
    if correct.size == 0:
        return Interval(float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    return _interval(rng.binomial(correct.size, correct.mean(), size=n_boot) / correct.size, level)


def bootstrap_paired_mean(values: np.ndarray, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> Interval:
    """Percentile interval for the mean of per-item values (e.g. paired differences), resampling items."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Interval(float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(n_boot, values.size))
    return _interval(values[idx].mean(axis=1), level)
