"""Spurious discovery: split each class into an easy and a hard background (papers/003 §2.1).

The rule (the paper's, exactly): for each class, for each labelled background with at least
``min_per_background`` accepted samples, the reference model's 1-vs-1000 accuracy with the
prompt "A photo of {}."; easy = the background with the highest accuracy, hard = the lowest;
keep the class when ``ACC(easy) - ACC(hard)`` exceeds ``min_drop`` points (default 5).

Ties (not covered by the paper, decided here; :data:`TIE_RULE`): accuracies are compared to 9
decimals (a cell's accuracy is a mean of means, so two equal accuracies can differ in the last
bit of a float); among eligible backgrounds of equal accuracy the one with **more images** wins
(its accuracy is the better-measured one), then the **first in name order** (arbitrary: the data
do not separate them). The tie is never hidden: ``ClassSplit.easy_ties`` / ``hard_ties`` list the
tied backgrounds (the chosen one first, then the others in the rule's order; empty when there was
no tie), and the split's tables name them. Easy and hard are always different backgrounds, so a
class whose backgrounds all score the same gets a drop of 0 and is dropped. A pinned class has no
ties (a person chose).

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
  (papers/003 App. F finds the curation mainly overfits the adopted prompt rather than the
  checkpoint, with a few classes overfitting the reference CLIP itself);
- pins: a person can fix a class's easy/hard backgrounds; a pinned class is kept with them,
  whatever the numbers say, and pins survive re-runs.

``min_per_background`` is itself a curate addition (the paper states no minimum): it keeps the
rule from crowning a background seen in one or two photos. The default 10 is a choice, not the
paper's.

Selection bias, and what is reported for it (every split, whatever ``require_significant``):

- the **permutation p-value** above, for every class with at least two eligible backgrounds;
- the **cross-fitted drop** (:func:`crossfit_drop`), a selection-corrected drop: the class's
  samples are cut into ``crossfit_folds`` (K, default 2) folds *stratified by background* (each
  background's samples shuffled and dealt round-robin from a random start, so every fold holds
  about 1/K of every background); on the K-1 training folds the rule picks easy and hard
  exactly as above (same tie-breaking), with eligibility decided on the training part against
  the scaled minimum ``floor(min_per_background * (K-1) / K)`` (so every background eligible on
  all the samples is eligible in every training part; one just below the minimum may be too);
  the picked pair's ``ACC(easy) - ACC(hard)`` is measured on the held-out fold. This is done for each fold and
  ``crossfit_repeats`` (R, default 10) seeded shuffles; the cross-fitted drop is the mean of the
  K x R held-out drops that could be scored (a fold whose training part has fewer than two
  eligible backgrounds, or whose held-out part has no sample of the picked easy or hard
  background, is skipped; when none could be scored the drop is NaN with the reason).
  Choosing on (K-1)/K of the samples is noisier than choosing on all of them, so the figure is
  slightly pessimistic for a real effect; it is unbiased for the pair it picks, and on null
  data it is centred on 0 where the in-sample drop is not (measured in ``tests/test_split_discovery_noise.py``).
  A pinned class's pair is not chosen from the data: its cross-fitted drop is its drop;
- :func:`noise_summary`: "k of n kept classes are not distinguishable from noise (p >= alpha)".

Inputs are plain arrays (sample ids, classes, backgrounds, per-model correctness), so the
rule is testable by hand; :mod:`curate.stages.split` connects it to dataset folders and runs.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["TIE_RULE", "TIE_DECIMALS", "SplitRule", "CellStats", "ClassSplit", "permutation_p_value", "crossfit_drop",
           "NoiseSummary", "noise_summary", "tied_backgrounds", "discover", "group_assignments"]

#: The tie-break, as tables state it (the module docstring gives the reasons).
TIE_RULE = ("equal accuracies, compared to 9 decimals, go to the background with more images, then to the first in name "
            "order; every tie is listed")

#: Decimals to which accuracies are compared (equal to this precision = a tie).
TIE_DECIMALS = 9


@dataclass(frozen=True)
class SplitRule:
    """The settings of the rule (recorded in ``dataset.yaml`` with every split).

    Easy = the eligible background with the highest accuracy, hard = the lowest (another
    background); ties (equal accuracy to 9 decimals) go to more images, then name order, and are
    recorded (:data:`TIE_RULE`, module docstring)."""

    min_per_background: int = 10
    min_drop: float = 5.0  # percentage points
    require_significant: bool = False
    n_boot: int = 1000
    level: float = 0.95
    n_perm: int = 2000
    alpha: float = 0.05
    seed: int = 0
    crossfit_folds: int = 2  # K (0 = not computed: split runs written before cross-fitting)
    crossfit_repeats: int = 10  # R

    def __post_init__(self) -> None:
        if self.min_per_background < 1:
            raise ValueError(f"min_per_background must be >= 1, got {self.min_per_background}")
        if self.crossfit_folds == 1 or self.crossfit_folds < 0:
            raise ValueError(f"crossfit_folds must be >= 2 (or 0 = off), got {self.crossfit_folds}")
        if self.crossfit_folds and self.crossfit_repeats < 1:
            raise ValueError(f"crossfit_repeats must be >= 1, got {self.crossfit_repeats}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")

    @property
    def crossfit_min_per_background(self) -> int:
        """The eligibility minimum on a cross-fitting training part: ``floor(m * (K-1) / K)`` (at least 1).

        A background with ``n >= m`` samples keeps at least ``n - ceil(n / K) >= floor(m (K-1) / K)``
        of them in every training part (the folds are stratified), so it stays eligible."""
        k = self.crossfit_folds
        return max(1, (self.min_per_background * (k - 1)) // k) if k else self.min_per_background

    @property
    def crossfit_scheme(self) -> str:
        """The cross-fitting scheme in one sentence (tables and reports state it)."""
        if not self.crossfit_folds:
            return "no cross-fitted drop (this split predates it)"
        k, r = self.crossfit_folds, self.crossfit_repeats
        return (f"{k}-fold cross-fitting stratified by background, {r} seeded repeats: easy and hard chosen by the "
                f"rule on {k - 1} of {k} folds (backgrounds with >= {self.crossfit_min_per_background} images there "
                f"compete), their drop measured on the held-out fold, averaged over the {k * r} folds")


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
    crossfit_drop: float = float("nan")  # selection-corrected drop (fraction), see crossfit_drop()
    crossfit_note: str = ""  # why it is NaN, or how many of the K x R folds were scored
    n_easy: int = 0
    n_hard: int = 0
    pinned: bool = False
    cells: list[CellStats] = field(default_factory=list)
    # backgrounds tied with the chosen easy / hard (the chosen one first; empty: no tie), see TIE_RULE
    easy_ties: tuple[str, ...] = ()
    hard_ties: tuple[str, ...] = ()


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


def crossfit_drop(values: np.ndarray, backgrounds: Sequence[str], rule: SplitRule,
                  rng: np.random.Generator) -> tuple[float, str]:
    """The selection-corrected drop of one class (fraction) and a note (module docstring).

    Args:
        values: (n,) the class's per-sample correctness (mean over reference models).
        backgrounds: (n,) their background labels (every labelled sample of the class; the
            eligibility minimum is applied on each training part).
        rule: the settings (``crossfit_folds``, ``crossfit_repeats``, ``min_per_background``).
        rng: the generator of the fold shuffles.
    Returns:
        ``(drop, note)``: the mean held-out ``ACC(easy) - ACC(hard)`` over the K x R folds that
        could be scored, and "" (all scored), "j of K x R folds scored", or, when none could be
        (drop NaN), the reason.
    """
    n_folds, repeats = rule.crossfit_folds, rule.crossfit_repeats
    if not n_folds:
        return float("nan"), "not computed"
    values = np.asarray(values, dtype=np.float64)
    labels = np.asarray(backgrounds, dtype=object)
    names = sorted(set(labels.tolist()))
    n_bg = len(names)
    codes = np.searchsorted(np.array(names, dtype=object), labels).astype(np.int64)
    members = [np.flatnonzero(codes == b) for b in range(n_bg)]
    counts = np.array([len(m) for m in members])
    minimum = rule.crossfit_min_per_background
    estimates: list[float] = []
    failures: dict[str, int] = {}
    fold = np.empty(len(values), dtype=np.int64)
    for _ in range(repeats):
        for idx in members:  # stratified: each background dealt round-robin over the folds from a random start
            fold[rng.permutation(idx)] = (rng.integers(n_folds) + np.arange(len(idx))) % n_folds
        key = fold * n_bg + codes
        sums = np.bincount(key, weights=values, minlength=n_folds * n_bg).reshape(n_folds, n_bg)
        held = np.bincount(key, minlength=n_folds * n_bg).reshape(n_folds, n_bg)
        total = sums.sum(axis=0)
        for k in range(n_folds):
            train_n = counts - held[k]
            eligible = [b for b in range(n_bg) if train_n[b] >= minimum]
            if len(eligible) < 2:
                why = f"fewer than 2 backgrounds with >= {minimum} samples in a training part"
                failures[why] = failures.get(why, 0) + 1
                continue
            acc = np.round((total - sums[k]) / np.maximum(train_n, 1), TIE_DECIMALS)  # the rule's tie precision
            easy = min(eligible, key=lambda b: (-acc[b], -train_n[b], names[b]))
            hard = min((b for b in eligible if b != easy), key=lambda b: (acc[b], -train_n[b], names[b]))
            if held[k, easy] == 0 or held[k, hard] == 0:
                why = "a held-out fold without a sample of the chosen easy or hard background"
                failures[why] = failures.get(why, 0) + 1
                continue
            estimates.append(sums[k, easy] / held[k, easy] - sums[k, hard] / held[k, hard])
    planned = n_folds * repeats
    if not estimates:
        reason = max(failures, key=lambda w: failures[w]) if failures else "no fold could be scored"
        return float("nan"), f"no cross-fitted drop: {reason}"
    note = "" if len(estimates) == planned else f"{len(estimates)} of {planned} folds scored"
    return float(np.mean(estimates)), note


@dataclass(frozen=True)
class NoiseSummary:
    """How many kept classes a permutation test cannot tell from noise."""

    k: int  # kept classes with permutation p >= alpha
    n: int  # kept classes
    alpha: float
    untested: int = 0  # kept classes without a p-value (pinned with < 2 eligible backgrounds)

    @property
    def text(self) -> str:
        if not self.n:
            return "no class kept"
        text = (f"{self.k} of {self.n} kept classes are not distinguishable from noise "
                f"(permutation p >= {self.alpha:g})")
        if self.untested:
            text += f"; {self.untested} kept class(es) could not be tested (fewer than 2 eligible backgrounds)"
        return text


def noise_summary(splits: Sequence, alpha: float = 0.05) -> NoiseSummary:
    """:class:`NoiseSummary` of ``splits`` (anything with ``kept`` and ``p_value``)."""
    kept = [s for s in splits if s.kept]
    finite = [s for s in kept if s.p_value is not None and math.isfinite(s.p_value)]
    return NoiseSummary(k=sum(1 for s in finite if s.p_value >= alpha), n=len(kept), alpha=alpha,
                        untested=len(kept) - len(finite))


def _rule_key(cell: Any, highest: bool) -> tuple[float, int, str]:
    """The rule's order: accuracy (to :data:`TIE_DECIMALS`), then more images, then name."""
    accuracy = round(float(cell.accuracy), TIE_DECIMALS)
    return (-accuracy if highest else accuracy, -int(cell.n), str(cell.background))


def _pick(cells: list[CellStats], highest: bool, exclude: str | None = None) -> CellStats:
    """Highest (or lowest) accuracy; ties -> more samples, then alphabetical."""
    return min((c for c in cells if c.background != exclude), key=lambda c: _rule_key(c, highest))


def tied_backgrounds(cells: Sequence[Any], chosen: str, highest: bool, exclude: str | None = None) -> tuple[str, ...]:
    """The eligible backgrounds whose accuracy equals the chosen one's (to :data:`TIE_DECIMALS`), in
    the rule's order (the chosen first); ``()`` when it has no tie.

    ``cells``: anything with ``background``, ``n``, ``accuracy``, ``eligible`` (a class's cells);
    ``exclude``: the background chosen for the other side (hard is never the easy one)."""
    pool = [c for c in cells if c.eligible and c.background != exclude]
    by_name = {c.background: c for c in pool}
    if chosen not in by_name:
        return ()
    level = round(float(by_name[chosen].accuracy), TIE_DECIMALS)
    tied = sorted((c for c in pool if round(float(c.accuracy), TIE_DECIMALS) == level),
                  key=lambda c: _rule_key(c, highest))
    return tuple(c.background for c in tied) if len(tied) > 1 else ()


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
    has_background = np.array([x is not None for x in backgrounds], dtype=bool)
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
            split.easy_ties = tied_backgrounds(eligible, easy.background, highest=True)
            split.hard_ties = tied_backgrounds(eligible, hard.background, highest=False, exclude=easy.background)
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
            split.crossfit_drop, split.crossfit_note = split.drop, "pinned: the pair is not chosen from the data"
        else:
            labelled = in_class & has_background
            split.crossfit_drop, split.crossfit_note = crossfit_drop(
                score[labelled], backgrounds[labelled], rule, np.random.default_rng([rule.seed, 1, int(c)]))
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
