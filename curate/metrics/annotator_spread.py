"""How much each class's drop depends on who labelled the backgrounds (issue 44).

The easy/hard split rests on one background label per photo. With several annotators there are
several labellings of the same photos: the agreed one (aggregated, disputes left out), each
annotator's own, and any other a caller has (the truth, on a simulated world). For each
labelling ``L`` this module re-derives every class's easy and hard backgrounds with the split
rule itself (:func:`curate.metrics.split_rule.discover`, the split's reference correctness, rule
and pins), then measures every model's drop on the photos that labelling puts in each group:

    drop_L(m, c) = ACC_m(c | label_L = easy_L(c)) - ACC_m(c | label_L = hard_L(c))

(plain per-class accuracies, as ``per_class`` of an evaluation; a photo ``L`` leaves unlabelled is
in neither group). Two more rows per model and class bound what the disputes can do: the agreed
pair kept, every disputed photo of the class put in the easy group where some annotator called it
the easy background (``disputed as easy``), or in the hard group where some annotator called it
the hard background (``disputed as hard``); a disputed photo nobody gave either background stays
out of both, since no answer puts it there.

A class is **flagged** when its assignment flips with the labelling: the kept decision or the
(easy, hard) pair under some re-derived labelling differs from the base's (by default the agreed
one). The spread of a class for a model is ``max_L drop_L - min_L drop_L`` over the labellings
where the class is kept.

What it cannot show (docs/science.md#annotator-spread): every drop here is in-sample (the
labelling that chose easy and hard is the one it is measured on, and for the reference model the
same photos chose them); it is per model; and it spans only the labellings there are: three
annotators who share a bias spread little and are all wrong.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from curate.metrics.split_rule import SplitRule, discover

__all__ = ["AGREED", "DISPUTED_EASY", "DISPUTED_HARD", "LabellingSplit", "SpreadCell", "Spread", "annotator_spread"]

#: The base labelling's name (aggregated labels, disputes left out).
AGREED = "agreed"
#: The rows that put disputed photos in one group (module docstring).
DISPUTED_EASY = "disputed as easy"
DISPUTED_HARD = "disputed as hard"


@dataclass(frozen=True)
class LabellingSplit:
    """One class's decision under one labelling."""

    labelling: str
    class_index: int
    kept: bool
    easy: str | None
    hard: str | None

    @property
    def assignment(self) -> tuple[bool, str | None, str | None]:
        """What a flip compares: (kept, easy, hard); (False, None, None) for a class not kept."""
        return (self.kept, self.easy, self.hard) if self.kept else (False, None, None)


@dataclass(frozen=True)
class SpreadCell:
    """One model's drop on one class under one labelling (fractions; NaN where a group is empty)."""

    model: str
    labelling: str
    class_index: int
    kept: bool
    easy: str | None
    hard: str | None
    easy_acc: float
    hard_acc: float
    drop: float
    n_easy: int
    n_hard: int


@dataclass
class Spread:
    """Every labelling's split and every (model, class, labelling) drop."""

    base: str
    labellings: list[str]  # re-derived labellings, the base first
    splits: dict[str, dict[int, LabellingSplit]]  # labelling -> class -> decision
    cells: list[SpreadCell] = field(default_factory=list)
    disputed: int = 0  # disputed photos among those considered

    def flips(self) -> dict[int, list[LabellingSplit]]:
        """class -> the decisions that differ from the base's (only flagged classes appear)."""
        out: dict[int, list[LabellingSplit]] = {}
        for c, base in self.splits[self.base].items():
            other = [self.splits[name][c] for name in self.labellings[1:] if c in self.splits[name]]
            differing = [s for s in other if s.assignment != base.assignment]
            if differing:
                out[c] = differing
        return out

    def spread(self, model: str, class_index: int) -> float:
        """``max - min`` of the model's drops on the class over the labellings that keep it (NaN when
        fewer than one finite drop)."""
        drops = [x.drop for x in self.cells if x.model == model and x.class_index == class_index and x.kept
                 and math.isfinite(x.drop)]
        return max(drops) - min(drops) if drops else float("nan")


def _labels(labelling: Mapping[str, str | None], sample_ids: Sequence[str]) -> np.ndarray:
    return np.array([labelling.get(s) for s in sample_ids], dtype=object)


def _cell(model: str, name: str, split: LabellingSplit, correct: np.ndarray, in_class: np.ndarray,
          easy: np.ndarray, hard: np.ndarray) -> SpreadCell:
    ok = np.isfinite(correct)
    e, h = in_class & easy & ok, in_class & hard & ok
    acc_e = float(correct[e].mean()) if e.any() else float("nan")
    acc_h = float(correct[h].mean()) if h.any() else float("nan")
    return SpreadCell(model, name, split.class_index, split.kept, split.easy, split.hard, acc_e, acc_h, acc_e - acc_h,
                      int(e.sum()), int(h.sum()))


def annotator_spread(
    sample_ids: Sequence[str],
    classes: Sequence[int],
    labellings: Mapping[str, Mapping[str, str | None]],
    reference_correct: np.ndarray,
    models: Mapping[str, np.ndarray],
    rule: SplitRule = SplitRule(),
    pins: Mapping[int, tuple[str, str]] | None = None,
    *,
    base: str = AGREED,
    disputed: Mapping[str, Sequence[str]] | None = None,
) -> Spread:
    """Each labelling's split and each model's per-class drop under it (module docstring).

    Args:
        sample_ids, classes: (N,) the photos the split may use and their classes.
        labellings: name -> {sample_id: background or None}; must hold ``base``. A photo missing
            from a labelling is unlabelled there.
        reference_correct: (N,) or (M, N) the split's reference correctness on ``sample_ids``.
        models: model name -> (N,) top-1 correctness (1/0; NaN where the model has no prediction).
        rule, pins: the split's rule and pins.
        base: the labelling flips are measured against and the disputed rows extend.
        disputed: sample_id -> the backgrounds annotators gave a disputed photo.
    """
    if base not in labellings:
        raise ValueError(f"the labellings have no {base!r} one (have: {', '.join(labellings)})")
    ids = list(sample_ids)
    cls = np.asarray(classes)
    if len(cls) != len(ids):
        raise ValueError(f"{len(ids)} sample ids but {len(cls)} classes")
    names = [base] + [n for n in labellings if n != base]
    label_arrays = {n: _labels(labellings[n], ids) for n in names}
    splits: dict[str, dict[int, LabellingSplit]] = {}
    for n in names:
        decisions = discover(cls, label_arrays[n], reference_correct, rule, pins)
        splits[n] = {d.class_index: LabellingSplit(n, d.class_index, d.kept, d.easy, d.hard) for d in decisions}
    correct = {m: np.asarray(v, dtype=np.float64) for m, v in models.items()}
    for m, v in correct.items():
        if v.shape != (len(ids),):
            raise ValueError(f"model {m!r}: {v.shape[0] if v.ndim else 0} correctness values for {len(ids)} photos")
    disputed = dict(disputed or {})
    candidates = [set(disputed.get(s, ())) for s in ids]
    is_disputed = np.array([s in disputed for s in ids], dtype=bool)
    spread = Spread(base, names, splits, disputed=int(is_disputed.sum()))
    for m, values in correct.items():
        for n in names:
            labels = label_arrays[n]
            for c, split in splits[n].items():
                in_class = cls == c
                spread.cells.append(_cell(m, n, split, values, in_class, labels == split.easy, labels == split.hard))
        if not disputed:
            continue
        labels = label_arrays[base]
        for c, split in splits[base].items():
            in_class = cls == c
            to_easy = np.array([split.easy in cand for cand in candidates], dtype=bool) & is_disputed
            to_hard = np.array([split.hard in cand for cand in candidates], dtype=bool) & is_disputed
            easy, hard = (labels == split.easy) & ~is_disputed, (labels == split.hard) & ~is_disputed
            spread.cells.append(_cell(m, DISPUTED_EASY, split, values, in_class, easy | to_easy, hard))
            spread.cells.append(_cell(m, DISPUTED_HARD, split, values, in_class, easy, hard | to_hard))
    return spread
