"""Spurious discovery: split each class into an easy and a hard background (papers/003 §2.1).

The rule (the paper's, exactly): for each class, for each labelled background with at least
``min_per_background`` accepted samples, the reference model's 1-vs-1000 accuracy with the
prompt "A photo of {}."; easy = the background with the highest accuracy, hard = the lowest;
keep the class when ``ACC(easy) - ACC(hard)`` exceeds ``min_drop`` points (default 5).

Ties (not covered by the paper, decided here): among backgrounds of equal accuracy, the one
with more samples wins, then the alphabetically first; easy and hard are always different
backgrounds, so a class whose backgrounds all score the same gets a drop of 0 and is dropped.

Beyond the paper:
- a bootstrap interval for every (class, background) accuracy and for each class's drop
  (independent resampling of the two cells' samples);
- ``require_significant`` keeps a class only when its drop is significant *given that the
  rule picked the best and the worst of several backgrounds*: a permutation test of the
  statistic ``T = max_b ACC(b) - min_b ACC(b)`` over the eligible backgrounds (background
  labels shuffled within the class, ``n_perm`` times; p = (1 + #{T_perm >= T}) / (1 + n_perm)),
  and the drop's bootstrap interval must also lie above 0. The interval alone is not enough:
  choosing the extremes of ~6 noisy cells inflates the drop (winner's curse), and on a world
  with no correlation the interval rule alone kept 4 of 6 classes (measured);
- several reference models: the cell accuracy is the mean over models of their accuracies
  (App. F notes a split tuned to one checkpoint and prompt overfits them);
- pins: a person can fix a class's easy/hard backgrounds; a pinned class is kept with them,
  whatever the numbers say, and pins survive re-runs.

Inputs are plain arrays (sample ids, classes, backgrounds, per-model correctness), so the
rule is testable by hand; :mod:`curate.split.apply` connects it to dataset folders and runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class SplitRule:
    """The settings of the rule (recorded in ``dataset.yaml`` with every split)."""

    min_per_background: int = 10
    min_drop: float = 5.0  # percentage points
    require_significant: bool = False
    n_boot: int = 1000
    level: float = 0.95
    n_perm: int = 2000
    alpha: float = 0.05
    seed: int = 0


@dataclass
class CellStats:
    """One (class, background) cell: accuracy (fraction), n, bootstrap interval."""

    background: str
    n: int
    accuracy: float
    ci: tuple[float, float]
    eligible: bool


@dataclass
class ClassSplit:
    """The decision for one class."""

    class_index: int
    kept: bool
    reason: str
    easy: str | None = None
    hard: str | None = None
    easy_acc: float = float("nan")
    hard_acc: float = float("nan")
    drop: float = float("nan")  # fraction (multiply by 100 for points)
    drop_ci: tuple[float, float] = (float("nan"), float("nan"))
    p_value: float = float("nan")  # permutation test of max - min over the eligible backgrounds
    n_easy: int = 0
    n_hard: int = 0
    pinned: bool = False
    cells: list[CellStats] = field(default_factory=list)


def _boot_replicates(values: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """(n_boot,) bootstrap means of ``values`` (resampling indices with replacement)."""
    n = len(values)
    return values[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)


def _interval(replicates: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(low), float(high)


def permutation_p_value(values: np.ndarray, labels: np.ndarray, rng: np.random.Generator, n_perm: int) -> float:
    """p-value of ``T = max_k mean(values | k) - min_k mean(values | k)`` under exchangeable labels.

    Labels are integer codes 0..K-1; each permutation shuffles them over the samples. One
    vectorised pass: cell sums by ``bincount`` over (permutation, label) codes.
    """
    k = int(labels.max()) + 1
    counts = np.bincount(labels, minlength=k).astype(np.float64)

    def spread(cell_sums: np.ndarray) -> np.ndarray:
        means = cell_sums / counts
        return means.max(axis=-1) - means.min(axis=-1)

    observed = spread(np.bincount(labels, weights=values, minlength=k))
    perms = rng.permuted(np.tile(labels, (n_perm, 1)), axis=1)
    codes = (np.arange(n_perm)[:, None] * k + perms).ravel()
    sums = np.bincount(codes, weights=np.tile(values, n_perm), minlength=n_perm * k).reshape(n_perm, k)
    exceed = np.count_nonzero(spread(sums) >= observed - 1e-12)
    return float((1 + exceed) / (1 + n_perm))


def _pick(cells: list[CellStats], highest: bool, exclude: str | None = None) -> CellStats:
    """Highest (or lowest) accuracy; ties -> more samples, then alphabetical."""
    pool = [c for c in cells if c.background != exclude]
    sign = -1.0 if highest else 1.0
    return sorted(pool, key=lambda c: (sign * c.accuracy, -c.n, c.background))[0]


def discover(
    classes: Sequence[int],
    backgrounds: Sequence[str | None],
    correct: np.ndarray,
    rule: SplitRule = SplitRule(),
    pins: Mapping[int, tuple[str, str]] | None = None,
) -> list[ClassSplit]:
    """Apply the rule to per-sample correctness.

    Args:
        classes: (N,) class index of each accepted sample.
        backgrounds: (N,) its background label (None = unlabelled, ignored).
        correct: (N,) or (M, N): 1{reference model m predicted the sample right}; with M models
            the per-sample value is their mean, so a cell's accuracy is the mean of the models'.
        rule: the settings.
        pins: class index -> (easy background, hard background) fixed by a person.
    Returns:
        One :class:`ClassSplit` per class present, sorted by class index.
    """
    classes = np.asarray(classes)
    backgrounds = np.asarray(backgrounds, dtype=object)
    correct = np.asarray(correct, dtype=np.float64)
    score = correct.mean(axis=0) if correct.ndim == 2 else correct
    if score.shape != classes.shape:
        raise ValueError(f"correctness has {score.shape[0]} samples, classes {classes.shape[0]}")
    pins = dict(pins or {})
    rng = np.random.default_rng(rule.seed)
    results = []
    for c in sorted(set(classes.tolist())):
        in_class = classes == c
        cells: list[CellStats] = []
        replicates: dict[str, np.ndarray] = {}
        for b in sorted({x for x in backgrounds[in_class] if x is not None}):
            values = score[in_class & (backgrounds == b)]
            reps = _boot_replicates(values, rng, rule.n_boot)
            replicates[b] = reps
            cells.append(CellStats(b, len(values), float(values.mean()), _interval(reps, rule.level),
                                   len(values) >= rule.min_per_background))
        eligible = [cell for cell in cells if cell.eligible]
        split = ClassSplit(int(c), False, "", cells=cells)
        if int(c) in pins:
            easy_bg, hard_bg = pins[int(c)]
            by_name = {cell.background: cell for cell in cells}
            missing = [b for b in (easy_bg, hard_bg) if b not in by_name]
            if missing:
                split.reason = f"pinned backgrounds {missing} have no samples"
                results.append(split)
                continue
            easy, hard = by_name[easy_bg], by_name[hard_bg]
            split.pinned = True
        else:
            if not cells:
                split.reason = "no sample has a background label"
                results.append(split)
                continue
            if len(eligible) < 2:
                split.reason = (f"{len(eligible)} background(s) with >= {rule.min_per_background} samples "
                                f"(counts: {', '.join(f'{cell.background} {cell.n}' for cell in cells)})")
                results.append(split)
                continue
            easy = _pick(eligible, highest=True)
            hard = _pick(eligible, highest=False, exclude=easy.background)
        drop_reps = replicates[easy.background] - replicates[hard.background]
        split.easy, split.hard = easy.background, hard.background
        split.easy_acc, split.hard_acc = easy.accuracy, hard.accuracy
        split.drop = easy.accuracy - hard.accuracy
        split.drop_ci = _interval(drop_reps, rule.level)
        split.n_easy, split.n_hard = easy.n, hard.n
        eligible_names = [cell.background for cell in eligible]
        if len(eligible_names) >= 2:
            sel = in_class & np.isin(backgrounds, eligible_names)
            codes = np.searchsorted(np.array(sorted(eligible_names), dtype=object), backgrounds[sel])
            split.p_value = permutation_p_value(score[sel], codes.astype(np.int64), rng, rule.n_perm)
        if split.pinned:
            split.kept, split.reason = True, "pinned by a person"
        elif round(100 * split.drop, 9) <= rule.min_drop:  # exact decimals: 1.0 - 0.95 is not 0.05
            split.reason = f"drop {100 * split.drop:.1f} points <= min_drop {rule.min_drop:g}"
        elif rule.require_significant and not split.drop_ci[0] > 0:
            split.reason = f"drop interval [{100 * split.drop_ci[0]:.1f}, {100 * split.drop_ci[1]:.1f}] includes 0"
        elif rule.require_significant and not split.p_value < rule.alpha:
            split.reason = (f"not significant once the choice of the best and worst background is accounted for "
                            f"(permutation p = {split.p_value:.3f} >= {rule.alpha:g})")
        else:
            split.kept, split.reason = True, "kept"
        results.append(split)
    return results


def group_assignments(
    sample_ids: Sequence[str], classes: Sequence[int], backgrounds: Sequence[str | None], splits: Sequence[ClassSplit]
) -> dict[str, str | None]:
    """``{sample_id: "easy" | "hard" | None}`` for the given samples under ``splits``."""
    decided = {s.class_index: s for s in splits if s.kept}
    out: dict[str, str | None] = {}
    for sid, c, b in zip(sample_ids, classes, backgrounds):
        split = decided.get(int(c))
        if split is not None and b == split.easy:
            out[sid] = "easy"
        elif split is not None and b == split.hard:
            out[sid] = "hard"
        else:
            out[sid] = None
    return out
