"""The drop decomposed: formulas and paired bootstrap intervals (docs/design.md#interventions).

Inputs are per *photo* (a source photo of ``curate intervene``, its class c and group g, easy or
hard) and per variant: v(p) is the top-1 correctness of photo p's image of that variant, averaged
over its images when it has several (swap with ``--swaps`` > 1). ``adversarial`` is 1 when the
object is right on every background of the set, else 0. Within a class c:

- ``easy`` = mean over c's easy photos of original(p); ``hard`` likewise (papers/003 App. C.3);
- ``drop`` D = easy - hard, the observed drop on the masked photos;
- ``hard_on_easy`` = mean over c's hard photos of swap(p): hard objects on easy backgrounds;
- ``background_part`` B = hard_on_easy - hard: what the background costs the hard objects;
- ``rest`` = D - B = easy - hard_on_easy: what stays when hard objects get easy backgrounds
  (object scale, pose, occlusion, light... and paste artefacts, see ``paste_cost``);
- ``easy_on_hard`` (easy objects on hard backgrounds) and ``background_part_reverse`` =
  easy - easy_on_hard: the same question asked the other way (a check on B, not part of D);
- ``paste_cost`` = mean over c's photos of original(p) - paste(p): what cutting the object out
  and pasting it back on its own filled background costs;
- the ghost control, over c's hard photos, on the donors of their swaps (docs/interventions.md):
  ``ghost`` = mean of ghost(p), the donor's filled background alone as it enters the swap;
  ``ghost_neutral`` = mean of ghost-neutral(p), the same with the object's mask in the
  background's mean colour (how often the model names the class from everything the swap shows
  but the object; compare with chance); ``hard_on_easy_unghosted`` = mean of swap-unghosted(p),
  the hard objects on the same donors with the hole's bounding box filled, so no outline of the
  donor's object is left; ``background_part_unghosted`` = hard_on_easy_unghosted - hard, the B
  that remains without the ghost; ``ghost_bias`` = B - background_part_unghosted, what the
  filled hole's outline adds to B (paired: the same photos and donors);
- the fill control, over c's hard photos, on the donors of their swaps (docs/interventions.md#the-fill-control):
  a swap of hard photo h on donor d shows R = F_d & ~mask_h of the donor's fill (F_d its filled
  hole, or the hole's box for a ``box-`` fill); ``refill`` is h itself with R filled the same way
  from h's own background, so refill and original differ only by R being filled rather than real.
  ``hard_refilled`` = mean of refill(p) (p's refills, one per scored swap, averaged);
  ``fill_bias`` = mean over the photos with a refill of refill(p) - original(p), what filling the
  region the swap shows of the donor's hole adds to a hard photo's accuracy (paired: the same photo
  on both sides); ``background_part_fill_corrected`` = B - fill_bias, B with that part taken out.
  ``n_refills`` counts the class's scored refills. It needs no truth and no covered donors, only
  the fill itself; NaN where no refill was made (an intervention without swaps, exact counterfactuals);
- the fill control that needs no fill, over c's hard photos, where the intervention was given photos of
  backgrounds alone (``--background-photos``, docs/design.md#interventions): ``swap-bgonly`` is the hard
  object on a photo of its swap donor's easy background with no object in it, so no hole and nothing filled.
  ``hard_on_easy_bgonly`` = mean of swap-bgonly(p); ``background_part_bgonly`` = hard_on_easy_bgonly - hard,
  B with no fill; ``fill_effect`` = mean over the photos with both of swap(p) - swap-bgonly(p), what the
  donors' filled backgrounds add to B against unfilled photos of the same backgrounds (paired: the same
  photos on both sides; where every photo with a swap has both, fill_effect = B - background_part_bgonly
  exactly). ``n_bgonly`` counts the class's scored swap-bgonly images. NaN where none was made;
- ``only_fg``, ``no_fg``, ``only_bg``, ``mixed_same``, ``mixed_rand``, ``mixed_next``: mean over
  c's photos (both groups pooled); ``bg_gap`` = mixed_same - mixed_rand (Xiao et al. 2020, §3);
- ``noisy_fg`` / ``noisy_bg``: accuracy with Gaussian noise on the object / on the rest, and
  ``rfs`` = (noisy_bg - noisy_fg) / (2 min(a, 1 - a)), a = (noisy_bg + noisy_fg) / 2 (Moayeri et
  al. 2022's relative foreground sensitivity; NaN when a is 0 or 1: no room to move);
- ``adversarial``: share of c's objects that no background of the set flips to a wrong answer
  (Xiao et al.'s adversarial backgrounds, over a bounded set: it can only fall as the set grows).

Overall values are the mean over classes where the value is defined (the paper's balanced
accuracy, App. C.3); ``drop``, ``background_part`` and ``rest`` overall use the same classes
(those where all three are defined) so that overall D = B + rest exactly.

Intervals: paired percentile bootstrap. One replicate resamples the photos of every (class,
group) cell with replacement, keeping each photo's variants together, and recomputes every
value, so D, B and the rest of one replicate come from the same photos (their intervals are
those of paired differences, not of independent groups). Deterministic for a seed. An interval
resting on a cell of fewer than ``curate.metrics.bootstrap.MIN_CELL`` photos is NaN (the one
interval rule, :func:`curate.metrics.bootstrap.interval_allowed`).

The statistics that rest on swap-bgonly images (:data:`BGONLY_STATISTICS`) take a crossed bootstrap, as the
background-alone photos are a sample too (Owen 2007, "The pigeonhole bootstrap", Ann. Appl. Stat. 1(2); McCullagh
2000 on crossed designs): a replicate draws the hard photos as above (counts w_p, the same draw the other
statistics use) and, independently, the background-alone photos, per background label, with replacement (counts
u_b, one draw shared by every class of the replicate). Swap-bgonly image i of photo p on background photo b(i)
with outcome y_i then weighs w_p u_b(i): swap-bgonly*(p) = sum_i u_b(i) y_i / sum_i u_b(i) over p's images,
undefined (p drops out of that replicate's bgonly means) when every u_b(i) is 0; hard_on_easy_bgonly* =
sum_p w_p swap-bgonly*(p) / sum_p w_p and fill_effect* = sum_p w_p (swap(p) - swap-bgonly*(p)) / sum_p w_p over
the photos where defined; background_part_bgonly* = hard_on_easy_bgonly* - hard*. With every count 1 they are
the point values. Without the images' background photos (a table made by hand) they resample the photos alone.
Their interval also needs each background label the class's images use to hold ``MIN_CELL`` photos.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from curate.metrics.bootstrap import allowed_or_nan, level_counts, resample_counts
from curate.runs.attribution import STATISTICS

__all__ = ["COLUMNS", "STATISTICS", "DECOMPOSITION", "FILL_STATISTICS", "BGONLY_STATISTICS", "BackgroundAloneImages",
           "PhotoTable", "ClassAttribution", "photo_table", "attribute", "rfs"]

#: Per-photo value columns (variants), in order.
COLUMNS: tuple[str, ...] = ("original", "swap", "paste", "only-fg", "no-fg", "only-bg", "mixed-same", "mixed-rand",
                            "mixed-next", "noise-fg", "noise-bg", "adversarial", "ghost", "ghost-neutral",
                            "swap-unghosted", "refill", "swap-bgonly")
#: Statistics of the fill control: their intervals rest on the photos with a refill alone.
FILL_STATISTICS: tuple[str, ...] = ("hard_refilled", "fill_bias", "background_part_fill_corrected")
#: Statistics of the fill control that needs no fill: their intervals are the crossed bootstrap's (module docstring).
BGONLY_STATISTICS: tuple[str, ...] = ("hard_on_easy_bgonly", "background_part_bgonly", "fill_effect")
#: Statistics whose overall value is taken over the classes where all three are defined.
DECOMPOSITION: tuple[str, ...] = ("drop", "background_part", "rest")
_COL = {name: i for i, name in enumerate(COLUMNS)}
_POOLED = {"only_fg": "only-fg", "no_fg": "no-fg", "only_bg": "only-bg", "mixed_same": "mixed-same",
           "mixed_rand": "mixed-rand", "mixed_next": "mixed-next", "noisy_fg": "noise-fg", "noisy_bg": "noise-bg",
           "adversarial": "adversarial"}


@dataclass
class BackgroundAloneImages:
    """The scored swap-bgonly images one by one, for the crossed bootstrap (module docstring): image i belongs to
    photo ``photo[i]`` (a row of the :class:`PhotoTable`), was answered right (``correct[i]``: 1.0 or 0.0) and
    shows background photo ``background_photo[i]``, an index into ``background_photo_ids`` (the rows'
    ``donor_sample_id``), whose background label is ``background_labels`` at that index."""

    photo: np.ndarray  # (m,) int
    correct: np.ndarray  # (m,) float
    background_photo: np.ndarray  # (m,) int
    background_photo_ids: list[str]
    background_labels: list[str]

    def photos_per_label(self) -> dict[str, int]:
        """How many background photos each label has among the images (the levels the bootstrap resamples)."""
        out: dict[str, int] = {}
        for label in self.background_labels:
            out[label] = out.get(label, 0) + 1
        return out


@dataclass
class PhotoTable:
    """Per photo: id, class, group, one value per :data:`COLUMNS` (NaN: no such image scored) and
    the number of its scored refills (the fill control; None: zero for every photo) and of its scored
    swap-bgonly images (the fill control that needs no fill; None: zero for every photo)."""

    photo_ids: list[str]
    classes: np.ndarray  # (n,) int
    groups: np.ndarray  # (n,) object: "easy" | "hard"
    values: np.ndarray  # (n, len(COLUMNS)) float
    refills: np.ndarray | None = None  # (n,) int
    bgonly: np.ndarray | None = None  # (n,) int
    bgonly_images: BackgroundAloneImages | None = None  # None: the bgonly statistics resample the photos alone

    def refills_of(self, class_index: int, group: str = "hard") -> int:
        """How many scored refills one (class, group) cell has."""
        if self.refills is None:
            return 0
        return int(self.refills[(self.classes == class_index) & (self.groups == group)].sum())

    def bgonly_of(self, class_index: int, group: str = "hard") -> int:
        """How many scored swap-bgonly images one (class, group) cell has."""
        if self.bgonly is None:
            return 0
        return int(self.bgonly[(self.classes == class_index) & (self.groups == group)].sum())

    def cell(self, class_index: int, group: str) -> np.ndarray:
        """The value rows of one (class, group) cell."""
        return self.values[(self.classes == class_index) & (self.groups == group)]


def photo_table(variant_rows: Sequence[Mapping[str, Any]], correct: Mapping[str, bool]) -> PhotoTable:
    """Join an intervention's variants table with one evaluation's top-1 correctness.

    Images the evaluation did not score (a decode failure, a variant made later) are left out;
    a photo whose original was not scored is left out entirely (every difference is taken
    against it)."""
    per_photo: dict[str, dict[str, list[bool]]] = {}
    meta: dict[str, tuple[int, str]] = {}
    alone: list[tuple[str, bool, Any, Any]] = []  # swap-bgonly: (photo, correct, background photo, its label)
    for row in variant_rows:
        sid = row["sample_id"]
        if sid not in correct or row["variant"] not in _COL:
            continue
        photo = str(row["source_sample_id"])
        per_photo.setdefault(photo, {}).setdefault(str(row["variant"]), []).append(bool(correct[sid]))
        meta[photo] = (int(row["class_index"]), str(row["group"]))
        if row["variant"] == "swap-bgonly":
            alone.append((photo, bool(correct[sid]), row.get("donor_sample_id"), row.get("background")))
    ids = sorted(p for p, variants in per_photo.items() if "original" in variants)
    values = np.full((len(ids), len(COLUMNS)), np.nan)
    for i, photo in enumerate(ids):
        for variant, outcomes in per_photo[photo].items():
            values[i, _COL[variant]] = float(all(outcomes)) if variant == "adversarial" else float(np.mean(outcomes))
    return PhotoTable(ids, np.array([meta[p][0] for p in ids], dtype=np.int64),
                      np.array([meta[p][1] for p in ids], dtype=object), values,
                      np.array([len(per_photo[p].get("refill", ())) for p in ids], dtype=np.int64),
                      np.array([len(per_photo[p].get("swap-bgonly", ())) for p in ids], dtype=np.int64),
                      _background_alone_images(ids, alone))


def _background_alone_images(ids: list[str], alone: list[tuple[str, bool, Any, Any]]) -> BackgroundAloneImages | None:
    """The swap-bgonly images of the kept photos one by one; None when there are none or one lacks its background
    photo (``donor_sample_id``): then the bgonly statistics resample the photos alone."""
    row_of = {p: i for i, p in enumerate(ids)}
    kept = [a for a in alone if a[0] in row_of]
    if not kept or any(not a[2] for a in kept):
        return None
    labels: dict[str, str] = {}
    for _, _, photo_id, label in kept:
        labels.setdefault(str(photo_id), "" if label is None else str(label))
    order = sorted(labels)
    index = {b: j for j, b in enumerate(order)}
    return BackgroundAloneImages(np.array([row_of[a[0]] for a in kept], dtype=np.int64),
                                 np.array([float(a[1]) for a in kept]),
                                 np.array([index[str(a[2])] for a in kept], dtype=np.int64), order,
                                 [labels[b] for b in order])


def rfs(noisy_bg: float, noisy_fg: float) -> float:
    """Relative foreground sensitivity (Moayeri et al. 2022): (a_bg - a_fg) / (2 min(a, 1 - a)),
    a = (a_bg + a_fg) / 2; NaN when a is 0 or 1 or either input is NaN. In [-1, 1]: +1 means noise
    on the object always hurts and noise on the background never does."""
    if not (math.isfinite(noisy_bg) and math.isfinite(noisy_fg)):
        return float("nan")
    a = (noisy_bg + noisy_fg) / 2
    room = 2 * min(a, 1 - a)
    return float("nan") if room <= 0 else (noisy_bg - noisy_fg) / room


def _mean(rows: np.ndarray, column: str) -> np.ndarray:
    """Column means over the photo axis (axis -2) ignoring NaN; NaN where no photo has a value."""
    col = rows[..., _COL[column]]
    count = np.sum(np.isfinite(col), axis=-1)
    total = np.nansum(col, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _paired(rows: np.ndarray, first: str, second: str) -> np.ndarray:
    """Mean over the photo axis of first(p) - second(p), over the photos that have both; NaN where none has."""
    paired = rows[..., _COL[first]] - rows[..., _COL[second]]
    count = np.sum(np.isfinite(paired), axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, np.nansum(paired, axis=-1) / np.maximum(count, 1), np.nan)


def _class_stats(easy: np.ndarray, hard: np.ndarray) -> dict[str, np.ndarray]:
    """Every statistic of one class from its easy and hard value rows (shape (..., n, Q); the
    leading axes are bootstrap replicates)."""
    both = np.concatenate([easy, hard], axis=-2)
    s: dict[str, np.ndarray] = {}
    s["easy"], s["hard"] = _mean(easy, "original"), _mean(hard, "original")
    s["drop"] = s["easy"] - s["hard"]
    s["hard_on_easy"] = _mean(hard, "swap")
    s["background_part"] = s["hard_on_easy"] - s["hard"]
    s["rest"] = s["drop"] - s["background_part"]
    s["easy_on_hard"] = _mean(easy, "swap")
    s["background_part_reverse"] = s["easy"] - s["easy_on_hard"]
    s["paste_cost"] = _paired(both, "original", "paste")
    for name, column in _POOLED.items():
        s[name] = _mean(both, column)
    s["ghost"], s["ghost_neutral"] = _mean(hard, "ghost"), _mean(hard, "ghost-neutral")
    s["hard_on_easy_unghosted"] = _mean(hard, "swap-unghosted")
    s["background_part_unghosted"] = s["hard_on_easy_unghosted"] - s["hard"]
    s["ghost_bias"] = s["background_part"] - s["background_part_unghosted"]
    s["hard_refilled"] = _mean(hard, "refill")
    s["fill_bias"] = _paired(hard, "refill", "original")
    s["background_part_fill_corrected"] = s["background_part"] - s["fill_bias"]
    s["hard_on_easy_bgonly"] = _mean(hard, "swap-bgonly")
    s["background_part_bgonly"] = s["hard_on_easy_bgonly"] - s["hard"]
    s["fill_effect"] = _paired(hard, "swap", "swap-bgonly")
    s["bg_gap"] = s["mixed_same"] - s["mixed_rand"]
    a = (s["noisy_bg"] + s["noisy_fg"]) / 2
    room = 2 * np.minimum(a, 1 - a)
    with np.errstate(invalid="ignore", divide="ignore"):
        s["rfs"] = np.where(room > 0, (s["noisy_bg"] - s["noisy_fg"]) / np.where(room > 0, room, 1), np.nan)
    return s


@dataclass
class ClassAttribution:
    """One class's values (fractions), their intervals, photo counts and why a value is NaN."""

    class_index: int
    n_easy: int
    n_hard: int
    values: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    reason: str = ""
    n_refills: int = 0  # scored refills of its hard photos (the fill control)
    n_bgonly: int = 0  # scored swap-bgonly images of its hard photos (the fill control that needs no fill)


def _reason(n_easy: int, n_hard: int, values: Mapping[str, float]) -> str:
    if not n_easy:
        return "no easy photo with a usable mask"
    if not n_hard:
        return "no hard photo with a usable mask"
    if not math.isfinite(values["hard_on_easy"]):
        return "no hard object could be pasted on an easy background (no swap donor or no swap variant)"
    return ""


def attribute(table: PhotoTable, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95,
              chunk: int = 100, progress: Callable[[int, int], None] | None = None
              ) -> tuple[list[ClassAttribution], dict[str, float], dict[str, tuple[float, float]], int]:
    """Per-class and overall statistics with paired bootstrap intervals (module docstring).

    ``progress(done, n_boot)`` is called with the replicates drawn so far, once per ``chunk`` of them.
    Returns ``(classes, overall values, overall intervals, classes used for the decomposition)``.
    """
    classes = sorted({int(c) for c in table.classes})
    cells = {(c, g): table.cell(c, g) for c in classes for g in ("easy", "hard")}
    point = {c: {k: float(v) for k, v in _class_stats(cells[c, "easy"], cells[c, "hard"]).items()} for c in classes}
    rng = np.random.default_rng(seed)
    images = table.bgonly_images  # the crossed bootstrap's second factor, on its own stream (the rest as before)
    bg_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
    hard_rows = {c: np.flatnonzero((table.classes == c) & (table.groups == "hard")) for c in classes}
    labels = _labels_used(images, hard_rows)
    class_images = {c: _class_images(images, hard_rows[c]) for c in classes} if images is not None else {}
    replicates: dict[int, dict[str, list[np.ndarray]]] = {c: {k: [] for k in STATISTICS} for c in classes}
    done = 0
    while done < n_boot:
        size = min(chunk, n_boot - done)
        background_counts = None if images is None else level_counts(bg_rng, images.background_labels, size)
        for c in classes:
            drawn, hard_idx = {}, np.zeros((size, 0), int)
            for g in ("easy", "hard"):
                rows = cells[c, g]
                idx = rng.integers(0, len(rows), size=(size, len(rows))) if len(rows) else np.zeros((size, 0), int)
                drawn[g] = rows[idx] if len(rows) else np.full((size, 0, len(COLUMNS)), np.nan)
                hard_idx = idx if g == "hard" else hard_idx
            stats = _class_stats(drawn["easy"], drawn["hard"])
            if images is not None and background_counts is not None:
                stats.update(_crossed_bgonly(cells[c, "hard"], class_images[c],
                                             resample_counts(hard_idx, len(cells[c, "hard"])), background_counts,
                                             stats["hard"]))
            for k, v in stats.items():
                replicates[c][k].append(np.asarray(v, dtype=float))
        done += size
        if progress is not None:
            progress(done, n_boot)
    per_class: list[ClassAttribution] = []
    boot = {c: {k: np.concatenate(v) if v else np.full(0, np.nan) for k, v in replicates[c].items()} for c in classes}
    for c in classes:
        n_easy, n_hard = len(cells[c, "easy"]), len(cells[c, "hard"])
        sizes = {k: [n_easy, n_hard] + _control_sizes(k, cells[c, "hard"])
                 + (list(labels[c].values()) if k in BGONLY_STATISTICS else []) for k in STATISTICS}
        per_class.append(ClassAttribution(c, n_easy, n_hard, point[c],  # the interval rule: curate.metrics.bootstrap
                                          {k: allowed_or_nan(_interval(boot[c][k], level), sizes[k])
                                           for k in STATISTICS},
                                          _reason(n_easy, n_hard, point[c]), table.refills_of(c),
                                          table.bgonly_of(c)))
    decomposed = [c for c in classes if all(math.isfinite(point[c][k]) for k in DECOMPOSITION)]
    overall: dict[str, float] = {}
    overall_ci: dict[str, tuple[float, float]] = {}
    for k in STATISTICS:
        use = decomposed if k in DECOMPOSITION else [c for c in classes if math.isfinite(point[c][k])]
        if not use:
            overall[k], overall_ci[k] = float("nan"), (float("nan"), float("nan"))
            continue
        overall[k] = float(np.mean([point[c][k] for c in use]))
        stacked = np.stack([boot[c][k] for c in use])  # (classes, n_boot)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a replicate where no class has the value: NaN
            overall_ci[k] = allowed_or_nan(_interval(np.nanmean(np.where(np.isfinite(stacked), stacked, np.nan), axis=0)
                                                     if stacked.size else np.full(0, np.nan), level),
                                           [len(cells[c, g]) for c in use for g in ("easy", "hard")]
                                           + [sum(n) for n in zip(*(_control_sizes(k, cells[c, "hard"]) for c in use))]
                                           + ([n for c in use for n in labels[c].values()]
                                              if k in BGONLY_STATISTICS else []))
    return per_class, overall, overall_ci, len(decomposed)


def _labels_used(images: BackgroundAloneImages | None, hard_rows: Mapping[int, np.ndarray]) -> dict[int, dict[str, int]]:
    """Per class: the background labels its hard photos' swap-bgonly images show, each with its number of
    background photos (the levels the crossed bootstrap resamples; the interval rule counts them)."""
    if images is None:
        return {c: {} for c in hard_rows}
    per_label = images.photos_per_label()
    out = {}
    for c, rows in hard_rows.items():
        shown = images.background_photo[np.isin(images.photo, rows)]
        out[c] = {label: per_label[label] for label in sorted({images.background_labels[b] for b in shown})}
    return out


def _class_images(images: BackgroundAloneImages, hard_rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """The swap-bgonly images of one class's hard photos (rows ``hard_rows`` of the table), sorted by photo:
    (the photo's position in the class's hard cell, outcome, background photo, where each photo's images start)."""
    local = np.full(max(int(images.photo.max()), int(hard_rows.max(initial=0))) + 1, -1)
    local[hard_rows] = np.arange(hard_rows.size)
    mine = local[images.photo]
    keep = np.flatnonzero(mine >= 0)
    keep = keep[np.argsort(mine[keep], kind="stable")]
    photo = mine[keep]
    return photo, images.correct[keep], images.background_photo[keep], np.flatnonzero(np.r_[True, photo[1:] != photo[:-1]])


def _crossed_bgonly(hard: np.ndarray, mine: tuple[np.ndarray, ...], photo_counts: np.ndarray,
                    background_counts: np.ndarray, hard_replicates: np.ndarray) -> dict[str, np.ndarray]:
    """One class's :data:`BGONLY_STATISTICS` for a chunk of replicates under the crossed bootstrap (module
    docstring): ``hard`` the class's hard value rows, ``mine`` its images (:func:`_class_images`),
    ``photo_counts`` (B, n) the draws w_p of its hard photos, ``background_counts`` (B, n_b) the draws u_b of
    every background photo, ``hard_replicates`` (B,) the replicates' hard accuracy. A photo whose images all
    draw u = 0 drops out of that replicate."""
    size, n = photo_counts.shape
    photo, outcome, background, starts = mine
    if not photo.size:
        nan = np.full(size, np.nan)
        return {"hard_on_easy_bgonly": nan, "background_part_bgonly": nan, "fill_effect": nan}
    weight = background_counts[:, background]
    num, den = np.add.reduceat(weight * outcome, starts, axis=1), np.add.reduceat(weight, starts, axis=1)
    per_photo = np.full((size, n), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_photo[:, photo[starts]] = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
    swap = hard[:, _COL["swap"]]

    def weighted(value: np.ndarray) -> np.ndarray:
        w = np.where(np.isfinite(value), photo_counts, 0.0)
        total = w.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(total > 0, (w * np.nan_to_num(value)).sum(axis=1) / np.where(total > 0, total, 1), np.nan)

    on_easy = weighted(per_photo)
    return {"hard_on_easy_bgonly": on_easy, "background_part_bgonly": on_easy - hard_replicates,
            "fill_effect": weighted(swap[None, :] - per_photo)}


def _control_sizes(statistic: str, hard: np.ndarray) -> list[int]:
    """The photo counts a control's interval also rests on (beyond the class's easy and hard counts): the
    hard photos with a scored refill (the fill control) or with both a swap and a swap-bgonly (the fill
    control that needs no fill); none for the other statistics."""
    if statistic in FILL_STATISTICS:
        return [int(np.isfinite(hard[:, _COL["refill"]]).sum())]
    if statistic in BGONLY_STATISTICS:
        return [int((np.isfinite(hard[:, _COL["swap"]]) & np.isfinite(hard[:, _COL["swap-bgonly"]])).sum())]
    return []


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan"), float("nan")
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)
