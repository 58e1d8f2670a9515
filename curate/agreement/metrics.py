"""How far a team's answers agree (issue 44): Krippendorff's alpha with a bootstrap interval,
Cohen's kappa per pair, the confusion between annotators, each annotator's quality, mask IoU.

Formulas (Krippendorff, "Computing Krippendorff's Alpha-Reliability", 2011; Cohen 1960):

- **alpha** (nominal): alpha = 1 - D_o / D_e, with the coincidence matrix o_ck = sum over photos u
  of (number of ordered pairs of answers (c, k) on u by different annotators) / (m_u - 1), m_u the
  answers on u; n_c = sum_k o_ck, n = sum_c n_c; D_o = sum_{c != k} o_ck / n and
  D_e = sum_{c != k} n_c n_k / (n (n - 1)). Photos with fewer than two answers pair nothing and do
  not count. Computed by the ``krippendorff`` library from the photo x background value counts
  (its ``value_counts`` input). Undefined (NaN) when no photo has two answers, or when every answer
  is the same background (D_e = 0). One value per answer: the primary background (answers.py).
- **interval**: a percentile bootstrap over photos: ``replicates`` resamples of the photos with
  replacement (numpy ``default_rng(seed)``), alpha of each, the (1-level)/2 and (1+level)/2
  quantiles. Replicates where alpha is undefined are left out (``AlphaEstimate.undefined`` counts
  them). Photos, not answers, are resampled: answers on one photo are not independent.
- **per class**: the same on the photos of one class (the photo's ``class_name``).
- **kappa** for each pair of annotators: ``sklearn.metrics.cohen_kappa_score`` of their primaries
  on the photos both answered, kappa = (p_o - p_e) / (1 - p_e); NaN below two common photos or
  when p_e = 1. ``set_agreement``: the share of common photos where their sets intersect.
- **confusion**: over every photo and every unordered pair of annotators on it, the pair of
  primaries (sorted); counts of the pairs that differ say which backgrounds are confused.
- **annotator quality**: on gold photos, accuracy = share of the annotator's gold photos where
  the primary is in the gold answer (the wrong ones are listed: :class:`GoldMistake`);
  agreement with the rest = share of photos where the primary equals the leave-one-out majority
  (the unique most frequent primary of the OTHER annotators on that photo; photos where the
  others tie, or where nobody else answered, are left out and counted in ``loo_ties``);
  ``loo_set_agreement``: the share where the annotator's set meets the others' majority label.
- **mask IoU** between two annotators on a photo: |A and B| / |A or B| of their masks (pixels > 0);
  photos where both masks are empty give no value. Per class: the mean over pairs and photos.
"""
from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import numpy as np

from curate.agreement.answers import Answers, sets_agree

__all__ = [
    "ALL", "AlphaEstimate", "AnnotatorQuality", "ConfusedPair", "GoldMistake", "KappaPair", "MaskIoU",
    "alpha_estimate", "alpha_of_counts", "alpha_table", "annotator_quality", "confused_pairs", "mask_iou",
    "mask_ious", "pairwise_kappa", "read_mask", "value_counts",
]

#: The name of the overall row in per-class tables.
ALL = "(all)"


@dataclass(frozen=True)
class AlphaEstimate:
    """Alpha on a set of photos with its bootstrap interval (module docstring)."""

    group: str  # a class name or ALL
    alpha: float
    low: float
    high: float
    n_photos: int  # photos with at least one answer
    n_pairable: int  # photos with two answers or more (the ones alpha uses)
    n_annotators: int
    replicates: int
    seed: int
    level: float = 0.95
    undefined: int = 0  # replicates where alpha was undefined


@dataclass(frozen=True)
class KappaPair:
    a: str
    b: str
    n_common: int
    kappa: float
    set_agreement: float


@dataclass(frozen=True)
class ConfusedPair:
    first: str
    second: str
    count: int  # photo x annotator-pair occurrences


@dataclass(frozen=True)
class GoldMistake:
    annotator: str
    sample_id: str
    answered: tuple[str, ...]
    gold: tuple[str, ...]


@dataclass(frozen=True)
class AnnotatorQuality:
    annotator: str
    answered: int
    skipped: int
    gold_n: int
    gold_correct: int
    gold_accuracy: float  # NaN without gold photos
    loo_n: int
    loo_agree: int
    loo_agreement: float  # NaN when no photo had a unique majority of the others
    loo_set_agreement: float
    loo_ties: int
    mistakes: list[GoldMistake] = field(default_factory=list)


@dataclass(frozen=True)
class MaskIoU:
    sample_id: str
    group: str
    a: str
    b: str
    iou: float


def value_counts(answers: Answers, photos: Sequence[str]) -> np.ndarray:
    """photos x vocabulary counts of primary answers (the ``krippendorff`` library's input)."""
    index = {b: i for i, b in enumerate(answers.vocabulary)}
    counts = np.zeros((len(photos), len(index)), dtype=np.float64)
    for row, sid in enumerate(photos):
        for label in answers.primary(sid).values():
            counts[row, index[label]] += 1
    return counts


def alpha_of_counts(counts: np.ndarray) -> float:
    """Nominal alpha of a value-count matrix; NaN where undefined (module docstring)."""
    import krippendorff

    pairable = counts[counts.sum(axis=1) >= 2]
    if len(pairable) == 0 or np.count_nonzero(pairable.sum(axis=0)) < 2:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(krippendorff.alpha(value_counts=pairable, level_of_measurement="nominal"))


def alpha_estimate(answers: Answers, photos: Sequence[str], *, group: str = ALL, replicates: int = 1000,
                   seed: int = 0, level: float = 0.95) -> AlphaEstimate:
    """Alpha of ``photos`` with its percentile bootstrap interval over photos (module docstring)."""
    photos = [p for p in photos if answers.labels.get(p)]
    counts = value_counts(answers, photos)
    point = alpha_of_counts(counts)
    rng = np.random.default_rng(seed)
    draws: list[float] = []
    undefined = 0
    n = len(photos)
    for _ in range(replicates if n else 0):
        value = alpha_of_counts(counts[rng.integers(0, n, n)])
        if math.isnan(value):
            undefined += 1
        else:
            draws.append(value)
    low, high = ((float(np.quantile(draws, (1 - level) / 2)), float(np.quantile(draws, (1 + level) / 2)))
                 if draws else (float("nan"), float("nan")))
    annotators = {a for p in photos for a in answers.labels[p]}
    return AlphaEstimate(group, point, low, high, n, int((counts.sum(axis=1) >= 2).sum()), len(annotators),
                         replicates, seed, level, undefined)


def alpha_table(answers: Answers, classes: Mapping[str, str], *, replicates: int = 1000, seed: int = 0,
                level: float = 0.95) -> list[AlphaEstimate]:
    """One :class:`AlphaEstimate` per class (``classes``: sample_id -> class name; photos without a
    class count only overall), then the overall row (group :data:`ALL`)."""
    photos = [p for p in answers.photos if answers.labels.get(p)]
    by_class: dict[str, list[str]] = {}
    for p in photos:
        if classes.get(p) is not None:
            by_class.setdefault(str(classes[p]), []).append(p)
    rows = [alpha_estimate(answers, ps, group=c, replicates=replicates, seed=seed, level=level)
            for c, ps in sorted(by_class.items())]
    return rows + [alpha_estimate(answers, photos, group=ALL, replicates=replicates, seed=seed, level=level)]


def pairwise_kappa(answers: Answers) -> list[KappaPair]:
    """Cohen's kappa of each pair of annotators on their common photos (module docstring)."""
    from sklearn.metrics import cohen_kappa_score

    rows = []
    for a, b in combinations(answers.annotators, 2):
        common = [p for p, by in sorted(answers.labels.items()) if a in by and b in by]
        first = [answers.labels[p][a][0] for p in common]
        second = [answers.labels[p][b][0] for p in common]
        kappa = float("nan")
        if len(common) >= 2:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                kappa = float(cohen_kappa_score(first, second))
        sets = (sum(sets_agree(answers.labels[p][a], answers.labels[p][b]) for p in common) / len(common)
                if common else float("nan"))
        rows.append(KappaPair(a, b, len(common), kappa, sets))
    return rows


def confused_pairs(answers: Answers) -> list[ConfusedPair]:
    """Pairs of different primaries given to one photo by two annotators, most frequent first."""
    counts: Counter[tuple[str, str]] = Counter()
    for sid in answers.labels:
        for (_, x), (_, y) in combinations(sorted(answers.primary(sid).items()), 2):
            if x != y:
                counts[tuple(sorted((x, y)))] += 1
    return [ConfusedPair(x, y, n) for (x, y), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def annotator_quality(answers: Answers) -> list[AnnotatorQuality]:
    """Each annotator's gold accuracy and leave-one-out agreement (module docstring)."""
    rows = []
    for who in answers.annotators:
        mine = answers.of(who)
        mistakes = [GoldMistake(who, sid, mine[sid], answers.gold[sid]) for sid in sorted(mine)
                    if sid in answers.gold and mine[sid][0] not in answers.gold[sid]]
        gold_n = sum(1 for sid in mine if sid in answers.gold)
        agree = agree_sets = n = ties = 0
        for sid, labels in mine.items():
            others = [b[0] for a, b in answers.labels[sid].items() if a != who]
            if not others:
                continue
            top = Counter(others).most_common()
            if len(top) > 1 and top[0][1] == top[1][1]:
                ties += 1
                continue
            n += 1
            agree += labels[0] == top[0][0]
            agree_sets += top[0][0] in labels
        rows.append(AnnotatorQuality(
            who, len(mine), sum(1 for s in answers.skipped.values() if who in s), gold_n, gold_n - len(mistakes),
            (gold_n - len(mistakes)) / gold_n if gold_n else float("nan"), n, agree, agree / n if n else float("nan"),
            agree_sets / n if n else float("nan"), ties, mistakes))
    return rows


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """|A and B| / |A or B| of two masks (pixels > 0); NaN when both are empty or sizes differ."""
    a, b = np.asarray(a) > 0, np.asarray(b) > 0
    if a.shape != b.shape:
        return float("nan")
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else float("nan")


def read_mask(root: Path, rel: str) -> np.ndarray:
    """A stored annotation mask as a boolean array."""
    from PIL import Image

    with Image.open(Path(root) / rel) as img:
        return np.asarray(img) > 0


def mask_ious(root: Path, answers: Answers, classes: Mapping[str, str]) -> list[MaskIoU]:
    """IoU of every pair of annotators' masks on every photo where both drew one."""
    rows = []
    for sid, by in sorted(answers.masks.items()):
        arrays = {who: read_mask(root, rel) for who, rel in by.items()}
        for a, b in combinations(sorted(arrays), 2):
            value = mask_iou(arrays[a], arrays[b])
            if not math.isnan(value):
                rows.append(MaskIoU(sid, str(classes.get(sid, ALL)), a, b, value))
    return rows
