"""Seeded bootstrap intervals for balanced group accuracies and the drop.

The resampling is stratified by (class, group) cell, as the estimators are means over
classes of within-cell means. Resampling n 0/1 outcomes with replacement from a cell with
k successes gives a mean distributed exactly as Binomial(n, k/n)/n, so each bootstrap
replicate draws one binomial per cell instead of n indices: the same distribution as the
index bootstrap, at a cost independent of the number of images.

Percentile intervals (2.5 and 97.5 percentiles of B replicates). Deterministic for a seed.

**The rule for every printed interval** (:func:`interval_allowed`; evaluate, compare, the
report's Table 2, attribution, plan): an interval is given only when every (class, group) cell
it resamples holds at least :data:`MIN_CELL` photos; otherwise it is NaN (printed "—"). A cell of
one photo never moves under resampling, so an interval resting on it would be narrower than the
data allow (issue 45: one photo per cell printed ``19.23 [19.23, 19.23]``).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MIN_CELL", "Interval", "interval_allowed", "allowed_or_nan", "bootstrap_groups", "bootstrap_mean",
           "bootstrap_paired_mean", "resample_counts", "level_counts"]

#: The fewest photos a (class, group) cell needs for an interval that resamples it (the rule above).
MIN_CELL = 2


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def to_list(self) -> list[float]:
        return [self.low, self.high]


NAN_INTERVAL = Interval(float("nan"), float("nan"))


def interval_allowed(cell_sizes: Iterable[int], minimum: int = MIN_CELL) -> bool:
    """Whether an interval resampling cells of these sizes may be given: every cell ``>= minimum``
    photos (and at least one cell)."""
    sizes = [int(n) for n in cell_sizes]
    return bool(sizes) and all(n >= minimum for n in sizes)


def allowed_or_nan(interval: Sequence[float], cell_sizes: Iterable[int],
                   minimum: int = MIN_CELL) -> tuple[float, float]:
    """``interval`` as ``(low, high)`` when :func:`interval_allowed`, else ``(nan, nan)``."""
    if not interval_allowed(cell_sizes, minimum):
        return float("nan"), float("nan")
    low, high = interval
    return float(low), float(high)


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
    An interval whose cells break :func:`interval_allowed` is NaN.
    """
    correct = np.asarray(correct, dtype=np.float64)
    classes = np.asarray(classes)
    groups = np.asarray(groups, dtype=object)
    rng = np.random.default_rng(seed)
    easy = _cell_replicates(correct, classes, groups == "easy", rng, n_boot)
    hard = _cell_replicates(correct, classes, groups == "hard", rng, n_boot)
    sizes = {(int(c), g): int(n) for (c, g), n in Counter(zip(classes.tolist(), groups.tolist())).items()}
    result = {}
    for name, cells in (("easy", easy), ("hard", hard)):
        allowed = interval_allowed(sizes[c, name] for c in cells)
        result[name] = _interval(np.mean(list(cells.values()), axis=0), level) if allowed else NAN_INTERVAL
    both = sorted(set(easy) & set(hard))
    if both and interval_allowed(sizes[c, g] for c in both for g in ("easy", "hard")):
        drops = np.mean([easy[c] - hard[c] for c in both], axis=0)
        result["drop"] = _interval(drops, level)
    else:
        result["drop"] = NAN_INTERVAL
    return result


def bootstrap_mean(correct: np.ndarray, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> Interval:
    """Interval for the accuracy of one cell (e.g. one class on one background)."""
    correct = np.asarray(correct, dtype=np.float64)
    if not interval_allowed([correct.size]):
        return NAN_INTERVAL
    rng = np.random.default_rng(seed)
    return _interval(rng.binomial(correct.size, correct.mean(), size=n_boot) / correct.size, level)


def bootstrap_paired_mean(values: np.ndarray, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> Interval:
    """Percentile interval for the mean of per-item values (e.g. paired differences), resampling items."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if not interval_allowed([values.size]):
        return NAN_INTERVAL
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(n_boot, values.size))
    return _interval(values[idx].mean(axis=1), level)


def resample_counts(idx: np.ndarray, n: int) -> np.ndarray:
    """How often each of ``n`` items is drawn in each replicate: ``idx`` (B, k) indices in [0, n) -> (B, n) counts
    (a replicate's mean over drawn items is the count-weighted mean over items)."""
    idx = np.asarray(idx, dtype=np.int64)
    rows = idx.shape[0]
    flat = (idx + n * np.arange(rows, dtype=np.int64)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(float)


def level_counts(rng: np.random.Generator, levels: Sequence[int] | Sequence[str], size: int) -> np.ndarray:
    """One factor of a crossed bootstrap (Owen 2007, "The pigeonhole bootstrap", Ann. Appl. Stat. 1(2)):
    ``levels[j]`` is the stratum of level j; per replicate the m levels of each stratum are drawn m times with
    replacement, independently of every other factor. Returns (size, len(levels)) counts; each stratum's counts
    sum to its m (the counts are Multinomial(m, 1/m each))."""
    levels = np.asarray(levels)
    counts = np.zeros((size, levels.size))
    for stratum in np.unique(levels):
        members = np.flatnonzero(levels == stratum)
        counts[:, members] = rng.multinomial(members.size, np.full(members.size, 1 / members.size), size=size)
    return counts
