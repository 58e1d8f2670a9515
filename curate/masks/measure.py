"""How good are a model's mask proposals? IoU, boundary F and trivial baselines against trusted masks.

Two questions about one ``curate propose-masks`` run (:class:`curate.runs.MaskRun`):

- :func:`measure_run`: on the samples where a person or an exact source already gave a mask
  (:func:`curate.masks.sources.mask_source` ``human`` or ``exact``), how close is the proposal?
  Out of sample only: samples the model was tuned on (``run.tuned_on``) are left out, and so are
  samples where this run applied its proposal (their mask, even after review, started as the
  proposal, so it is not independent truth; :func:`review_verdicts` covers them). The same
  numbers for two masks that know nothing about the image, :func:`centre_box` and
  :func:`whole_image`, say what a model that learned nothing scores.
- :func:`review_verdicts`: of the proposals this run wrote into the dataset, how many did people
  accept as they were, repaint, or reject, and how many still wait?

Formulas (``P`` the proposal, ``T`` the truth, both binary ``H x W``):

- IoU (Jaccard index) ``|P ∩ T| / |P ∪ T|``; undefined (NaN) when both are empty.
- Boundary F (DAVIS, Perazzi et al., "A Benchmark Dataset and Evaluation Methodology for Video
  Object Segmentation", CVPR 2016, the ``db_eval_boundary`` of the DAVIS toolkit): with ``∂P``,
  ``∂T`` the one-pixel boundaries of DAVIS's ``seg2bmap`` and ``d`` the tolerance,
  precision ``Pb = |∂P ∩ dilate(∂T, disk(d))| / |∂P|``, recall
  ``Rb = |∂T ∩ dilate(∂P, disk(d))| / |∂T|``, ``F = 2 Pb Rb / (Pb + Rb)`` (0 when both are 0).
  ``d = ceil(0.008 x image diagonal)`` pixels by default, as in DAVIS. DAVIS's conventions for
  empty boundaries are kept: no ``∂P`` but some ``∂T`` gives ``Pb = 1, Rb = 0`` (F = 0); some
  ``∂P`` but no ``∂T`` gives ``Pb = 0, Rb = 1`` (F = 0); neither gives F = 1. A mask that covers
  the whole image has no boundary (the image's edge is not an object's edge).

These numbers compare masks; they cannot say whether a mask-based number downstream (SSS, RMA,
clarity) changes with the proposals, and on a handful of samples per class they are noisy
(the table prints each class's ``n``).
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from curate.formatting import MISSING, ci, num, pct, pct_ci
from curate.masks.sources import MODEL_PREFIX, REJECTED_STATUS, mask_source, model_id_of, proposal_run

__all__ = [
    "DAVIS_TOLERANCE", "LEFT_OUT_REASONS", "MEASUREMENT_COLUMNS", "NOT_FOUND_CODES", "VERDICTS", "MaskMeasurement", "MaskScores", "ReviewVerdicts",
    "SampleScore", "boundary_f", "boundary_map", "boundary_tolerance", "centre_box", "format_measurement",
    "format_verdicts", "iou", "measure_run", "review_verdicts", "whole_image", "wilson_interval",
]

#: DAVIS's boundary tolerance as a fraction of the image diagonal (``bound_th = 0.008``).
DAVIS_TOLERANCE = 0.008

#: Why a sample the run proposed on was not measured, in the order they are checked (each
#: sample counts under the first that applies).
LEFT_OUT_REASONS: dict[str, str] = {
    "not_in_dataset": "no longer in the dataset",
    "from_this_proposal": "the run applied its proposal there (the mask is the proposal or was reviewed from it)",
    "from_a_proposal": "the mask began as an earlier run's proposal that people verified or repainted (no independent truth)",
    "no_truth": "no human or exact mask (none, a model proposal, or rejected)",
    "empty_truth": "the human or exact mask is empty (IoU undefined)",
    "tuned_on": "the model was tuned on it",
    "excluded": "excluded by the caller",
    "failed": "the model did not run on it (e.g. the image was unreadable)",
    "missing_proposal": "found, but the run folder has no mask file",
    "size_mismatch": "the truth mask and the proposal differ in size",
}

#: What became of a proposal the run applied (see :func:`review_verdicts`).
VERDICTS: tuple[str, ...] = ("accepted", "repainted", "rejected", "pending", "replaced", "other")

#: Reason codes (the text before ``:`` in a proposals row's ``reason``) of a model that ran and
#: gave no usable mask: scored as "nothing found" (IoU 0). Any other code with ``found`` false
#: (``image_unreadable``, an error) is a failure, left out; a row without a reason counts as
#: nothing found.
NOT_FOUND_CODES: tuple[str, ...] = ("nothing_found", "wrong_size")


# ----------------------------------------------------------------------------- formulas
def _binary(mask: Any, name: str) -> np.ndarray:
    array = np.asarray(mask)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (H, W) mask, got shape {array.shape}")
    return array != 0


def _same_shape(pred: Any, truth: Any) -> tuple[np.ndarray, np.ndarray]:
    p, t = _binary(pred, "pred"), _binary(truth, "truth")
    if p.shape != t.shape:
        raise ValueError(f"pred {p.shape} and truth {t.shape} differ in size")
    return p, t


def iou(pred: Any, truth: Any) -> float:
    """Intersection over union of two binary masks: ``|P ∩ T| / |P ∪ T|`` (Jaccard index).

    Any non-zero pixel is foreground. In [0, 1], symmetric, 1 exactly when the masks are equal
    and not empty. Both empty: NaN (nothing to overlap; callers skip such pairs, as
    :func:`measure_run` skips empty truth masks). Raises ValueError when the sizes differ.
    """
    p, t = _same_shape(pred, truth)
    union = int(np.count_nonzero(p | t))
    if union == 0:
        return float("nan")
    return int(np.count_nonzero(p & t)) / union


def boundary_map(mask: Any) -> np.ndarray:
    """The one-pixel boundary of a binary mask, as DAVIS's ``seg2bmap`` draws it.

    A pixel is boundary when it differs from its right, lower or lower-right neighbour; on the
    last row only the right neighbour counts, on the last column only the lower one, and the
    bottom-right pixel never is. So a mask touching the image's edge has no boundary there, and
    a mask covering the whole image has none at all.
    """
    seg = _binary(mask, "mask")
    east = np.zeros_like(seg)
    south = np.zeros_like(seg)
    south_east = np.zeros_like(seg)
    east[:, :-1] = seg[:, 1:]
    south[:-1, :] = seg[1:, :]
    south_east[:-1, :-1] = seg[1:, 1:]
    bmap = (seg ^ east) | (seg ^ south) | (seg ^ south_east)
    bmap[-1, :] = seg[-1, :] ^ east[-1, :]
    bmap[:, -1] = seg[:, -1] ^ south[:, -1]
    bmap[-1, -1] = False
    return bmap


def boundary_tolerance(height: int, width: int) -> int:
    """DAVIS's default tolerance in pixels: ``ceil(0.008 * sqrt(height² + width²))``."""
    return int(math.ceil(DAVIS_TOLERANCE * math.hypot(height, width)))


def _matched(query: np.ndarray, target: np.ndarray, radius: int) -> int:
    """How many ``query`` pixels lie within Euclidean distance ``radius`` of a ``target`` pixel:
    ``|query ∩ dilate(target, disk(radius))|`` with the disk of ``skimage.morphology.disk`` (the
    offsets with ``dy² + dx² <= r²``). Row by row of the disk: offset ``dy`` is a horizontal run
    of half-width ``floor(sqrt(r² - dy²))``, looked up in the target's row-wise cumulative sums
    at the query pixels only (cost: the target's area plus query pixels x (2r + 1))."""
    ys, xs = np.nonzero(query)
    height, width = target.shape
    csum = np.zeros((height, width + 1), dtype=np.int64)
    np.cumsum(target, axis=1, out=csum[:, 1:])
    hit = np.zeros(ys.size, dtype=bool)
    for dy in range(-radius, radius + 1):
        half = math.isqrt(radius * radius - dy * dy)
        rows = ys + dy
        open_ = np.flatnonzero(~hit & (rows >= 0) & (rows < height))
        if open_.size == 0:
            continue
        r, x = rows[open_], xs[open_]
        found = csum[r, np.minimum(x + half + 1, width)] - csum[r, np.maximum(x - half, 0)] > 0
        hit[open_[found]] = True
    return int(np.count_nonzero(hit))


def boundary_f(pred: Any, truth: Any, tolerance: float | None = None) -> float:
    """The DAVIS boundary F-measure of a proposal against the truth (Perazzi et al. 2016).

    ``Pb = |∂P ∩ dilate(∂T, disk(d))| / |∂P|``, ``Rb = |∂T ∩ dilate(∂P, disk(d))| / |∂T|``,
    ``F = 2 Pb Rb / (Pb + Rb)`` (0 when ``Pb + Rb = 0``), with the boundaries of
    :func:`boundary_map` and ``d`` the ``tolerance`` in pixels (a boundary pixel within
    Euclidean distance ``d`` of the other boundary matches); None uses DAVIS's
    ``ceil(0.008 x image diagonal)`` (:func:`boundary_tolerance`); a fractional ``d`` is rounded
    down, since pixel offsets are integers. Empty boundaries follow DAVIS: only ``∂T`` empty or
    only ``∂P`` empty gives 0, both empty gives 1 (so two equal masks, even two empty ones,
    score 1, where :func:`iou` of two empty masks is NaN). In [0, 1] and symmetric.
    """
    p, t = _same_shape(pred, truth)
    radius = boundary_tolerance(*p.shape) if tolerance is None else int(math.floor(float(tolerance)))
    if radius < 0:
        raise ValueError(f"tolerance must be >= 0 pixels, got {tolerance}")
    bp, bt = boundary_map(p), boundary_map(t)
    n_p, n_t = int(np.count_nonzero(bp)), int(np.count_nonzero(bt))
    if n_p == 0 and n_t == 0:
        return 1.0
    if n_p == 0 or n_t == 0:
        return 0.0
    # only pixels near both boundaries matter: crop to their joint bounding box plus the radius
    rows = np.flatnonzero((bp | bt).any(axis=1))
    cols = np.flatnonzero((bp | bt).any(axis=0))
    r0, r1 = max(rows[0] - radius, 0), min(rows[-1] + radius + 1, p.shape[0])
    c0, c1 = max(cols[0] - radius, 0), min(cols[-1] + radius + 1, p.shape[1])
    bp, bt = bp[r0:r1, c0:c1], bt[r0:r1, c0:c1]
    precision = _matched(bp, bt, radius) / n_p
    recall = _matched(bt, bp, radius) / n_t
    if precision + recall == 0:
        return 0.0
    return float(2 * precision * recall / (precision + recall))


def centre_box(height: int, width: int) -> np.ndarray:
    """A baseline that looks at nothing: a centred box half the image's height and width.

    Rows ``[(H - h) // 2, (H - h) // 2 + h)`` with ``h = max(1, H // 2)``, columns likewise with
    ``w = max(1, W // 2)``: a quarter of the image's area, where photographers put the object.
    A model that learned nothing about the object can score this.
    """
    if height < 1 or width < 1:
        raise ValueError(f"an image needs height and width >= 1, got {height} x {width}")
    h, w = max(1, height // 2), max(1, width // 2)
    top, left = (height - h) // 2, (width - w) // 2
    box = np.zeros((height, width), dtype=bool)
    box[top:top + h, left:left + w] = True
    return box


def whole_image(height: int, width: int) -> np.ndarray:
    """A baseline that looks at nothing: every pixel is the object. Its IoU is the truth's share
    of the image; its boundary F is 0 (it has no boundary, :func:`boundary_map`)."""
    if height < 1 or width < 1:
        raise ValueError(f"an image needs height and width >= 1, got {height} x {width}")
    return np.ones((height, width), dtype=bool)


def wilson_interval(successes: int, trials: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927; 95% for the default ``z``).

    ``(p + z²/2n ± z sqrt(p(1 - p)/n + z²/4n²)) / (1 + z²/n)`` with ``p = k/n``. Unlike the
    normal approximation it stays inside [0, 1] and is not degenerate at ``k = 0`` or ``k = n``.
    ``n = 0``: ``(nan, nan)``.
    """
    if trials <= 0:
        return float("nan"), float("nan")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}], got {successes}")
    p = successes / trials
    z2 = z * z
    denominator = 1 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


# ----------------------------------------------------------------------------- measuring a run
def _json_float(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class SampleScore:
    """One measured sample: the proposal's and the two baselines' IoU and boundary F."""

    sample_id: str
    class_index: int
    class_name: str
    truth: str                # "human" | "exact"
    found: bool               # False: the model proposed nothing (IoU 0, boundary F 0)
    score: float | None       # the model's confidence (None when nothing was found)
    iou: float
    boundary_f: float
    centre_iou: float
    centre_f: float
    whole_iou: float
    whole_f: float

    def as_dict(self) -> dict[str, Any]:
        return {"sample_id": self.sample_id, "class_index": self.class_index, "class_name": self.class_name,
                "truth": self.truth, "found": self.found,
                "score": None if self.score is None else _json_float(self.score),
                **{k: _json_float(getattr(self, k)) for k in _METRICS}}


_METRICS = ("iou", "boundary_f", "centre_iou", "centre_f", "whole_iou", "whole_f")


@dataclass(frozen=True)
class MaskScores:
    """Means over a set of samples (one class, or all of them).

    ``iou`` mean IoU; ``iou_50`` / ``iou_75`` the share of samples with IoU >= 0.5 / >= 0.75;
    ``boundary_f`` mean boundary F; ``centre_*`` / ``whole_*`` the same means for the
    :func:`centre_box` and :func:`whole_image` baselines; ``n`` samples, ``found`` of them with a
    proposal. For the balanced row every figure is the mean of the per-class figures.
    """

    label: str
    class_index: int | None
    n: int
    found: int
    iou: float
    iou_50: float
    iou_75: float
    boundary_f: float
    centre_iou: float
    centre_f: float
    whole_iou: float
    whole_f: float

    @classmethod
    def of(cls, label: str, class_index: int | None, samples: Sequence[SampleScore]) -> MaskScores:
        ious = np.array([s.iou for s in samples], dtype=np.float64)
        mean = lambda name: float(np.mean([getattr(s, name) for s in samples]))
        return cls(label=label, class_index=class_index, n=len(samples), found=sum(s.found for s in samples),
                   iou=float(ious.mean()), iou_50=float((ious >= 0.5).mean()), iou_75=float((ious >= 0.75).mean()),
                   boundary_f=mean("boundary_f"), centre_iou=mean("centre_iou"), centre_f=mean("centre_f"),
                   whole_iou=mean("whole_iou"), whole_f=mean("whole_f"))

    @classmethod
    def balanced(cls, per_class: Sequence[MaskScores]) -> MaskScores:
        mean = lambda name: float(np.mean([getattr(c, name) for c in per_class]))
        return cls(label="all (mean over classes)", class_index=None, n=sum(c.n for c in per_class),
                   found=sum(c.found for c in per_class),
                   **{k: mean(k) for k in ("iou", "iou_50", "iou_75", "boundary_f", "centre_iou", "centre_f",
                                           "whole_iou", "whole_f")})

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "class_index": self.class_index, "n": self.n, "found": self.found,
                **{k: _json_float(getattr(self, k)) for k in ("iou", "iou_50", "iou_75", "boundary_f", "centre_iou",
                                                              "centre_f", "whole_iou", "whole_f")}}


@dataclass
class MaskMeasurement:
    """What :func:`measure_run` found: per class, over samples, balanced over classes.

    ``truth`` counts the measured samples' masks by source (``human``, ``exact``);
    ``left_out`` the samples the run proposed on that were not measured, by reason
    (:data:`LEFT_OUT_REASONS`); ``nothing_found_reasons`` the reason codes (:data:`NOT_FOUND_CODES`)
    on the measured samples where the model proposed nothing; ``iou_interval`` a normal-approximation 95% interval of
    the mean IoU over samples (the sampling noise of these samples; it says nothing about other
    images or classes).
    """

    run_name: str
    model_id: str
    proposed: int
    tolerance: float | None
    per_class: list[MaskScores]
    overall: MaskScores
    balanced: MaskScores
    samples: list[SampleScore]
    truth: dict[str, int]
    left_out: dict[str, int]
    tuned_on_total: int
    nothing_found_reasons: dict[str, int] = field(default_factory=dict)
    iou_interval: tuple[float, float] = (float("nan"), float("nan"))

    @property
    def n(self) -> int:
        return self.overall.n

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run_name, "model_id": self.model_id, "proposed": self.proposed,
            "boundary_tolerance": ("ceil(0.008 x image diagonal) px" if self.tolerance is None
                                   else f"{self.tolerance:g} px"),
            "n": self.n, "truth": dict(self.truth), "left_out": dict(self.left_out),
            "tuned_on_total": self.tuned_on_total, "nothing_found": self.overall.n - self.overall.found,
            "nothing_found_reasons": dict(self.nothing_found_reasons),
            "overall": self.overall.as_dict(), "balanced": self.balanced.as_dict(),
            "iou_interval": [_json_float(v) for v in self.iou_interval],
            "per_class": [c.as_dict() for c in self.per_class],
            "samples": [s.as_dict() for s in self.samples],
        }


def _mean_interval(values: np.ndarray, z: float = 1.959963984540054) -> tuple[float, float]:
    """Normal-approximation 95% interval of a mean: ``mean ± z * sd / sqrt(n)`` (sd with ``n - 1``),
    clipped to [0, 1]; NaN for fewer than two values. Cheap at any ``n``; a rough guide at small n."""
    if values.size < 2:
        return float("nan"), float("nan")
    half = z * float(values.std(ddof=1)) / math.sqrt(values.size)
    mean = float(values.mean())
    return max(0.0, mean - half), min(1.0, mean + half)


def _class_name(ds: Any, row: Mapping[str, Any]) -> str:
    name = row.get("class_name")
    if name:
        return str(name)
    names = ds.label_space.names
    index = row.get("class_index")
    return str(names[index]) if index is not None and 0 <= int(index) < len(names) else str(index)


def _dataset_rows(ds: Any, sample_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The dataset rows of ``sample_ids`` (those still there), read column-wise once."""
    import pyarrow as pa
    import pyarrow.compute as pc

    wanted = list(dict.fromkeys(str(s) for s in sample_ids))
    columns = ["sample_id", "class_index", "class_name", "mask_path", "mask_status", "extra"]
    table = ds.table()
    table = table.select([c for c in columns if c in table.column_names])
    table = table.filter(pc.is_in(table.column("sample_id"), value_set=pa.array(wanted, pa.string())))
    return {row["sample_id"]: row for row in table.to_pylist()}


def measure_run(ds: Any, run: Any, *, exclude: Iterable[str] | None = None,
                tolerance: float | None = None) -> MaskMeasurement:
    """Measure a mask run's proposals against the dataset's human and exact masks, out of sample.

    For every sample in ``run.rows()`` still in ``ds`` whose dataset mask is trusted truth
    (:func:`mask_source` ``human`` or ``exact``; never a model proposal), where the run did not
    apply its proposal (so the mask did not start as the proposal), which is not empty, and
    which is neither in ``run.tuned_on`` nor in ``exclude``: :func:`iou` and :func:`boundary_f`
    of the proposal (a sample where the model found nothing, or gave a mask of the wrong size,
    scores 0 on both; one where it failed to run is left out, :data:`NOT_FOUND_CODES`), and of
    :func:`centre_box` and :func:`whole_image`. A truth mask of another size than the proposal
    is left out and counted. ``tolerance``: the boundary tolerance in pixels (None: DAVIS's,
    per image).

    Raises ValueError when no sample can be measured, saying why.
    """
    excluded = {str(s) for s in (exclude or ())}
    tuned_on = run.tuned_on
    proposals = run.rows()
    rows = _dataset_rows(ds, (p["sample_id"] for p in proposals))
    left_out: Counter[str] = Counter()
    truth_counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    samples: list[SampleScore] = []
    for proposal_row in proposals:
        sid = str(proposal_row["sample_id"])
        row = rows.get(sid)
        source = None if row is None else mask_source(row)
        reason = None
        truth = None
        if row is None:
            reason = "not_in_dataset"
        elif proposal_row.get("applied"):
            reason = "from_this_proposal"
        elif source == "human" and proposal_run(row) is not None:
            reason = "from_a_proposal"
        elif source not in ("human", "exact"):
            reason = "no_truth"
        else:
            loaded = ds.load_mask(row)
            truth = None if loaded is None else loaded != 0
            if truth is None:
                reason = "no_truth"
            elif not truth.any():
                reason = "empty_truth"
            elif sid in tuned_on:
                reason = "tuned_on"
            elif sid in excluded:
                reason = "excluded"
        pred = None
        found = bool(proposal_row.get("found"))
        code = str(proposal_row.get("reason") or "nothing_found").split(":")[0].strip()
        if reason is None and not found and code not in NOT_FOUND_CODES:
            reason = "failed"
        if reason is None and found:
            pred = run.proposal(sid)
            if pred is None:
                reason = "missing_proposal"
            elif pred.shape != truth.shape:
                reason = "size_mismatch"
        if reason is not None:
            left_out[reason] += 1
            continue
        height, width = truth.shape
        centre, whole = centre_box(height, width), whole_image(height, width)
        if pred is None:
            reasons[code] += 1
        samples.append(SampleScore(
            sample_id=sid, class_index=int(row["class_index"]), class_name=_class_name(ds, row), truth=source,
            found=pred is not None,
            score=None if pred is None or proposal_row.get("score") is None else float(proposal_row["score"]),
            iou=0.0 if pred is None else iou(pred, truth),
            boundary_f=0.0 if pred is None else boundary_f(pred, truth, tolerance),
            centre_iou=iou(centre, truth), centre_f=boundary_f(centre, truth, tolerance),
            whole_iou=iou(whole, truth), whole_f=boundary_f(whole, truth, tolerance)))
        truth_counts[source] += 1
    if not samples:
        why = ", ".join(f"{n} {LEFT_OUT_REASONS[k]}" for k, n in left_out.items()) or "the run proposed on no sample"
        raise ValueError(f"nothing to measure in run {run.name or '(unnamed)'}: no sample the run proposed on has "
                         f"a human or exact mask that the model was not tuned on and that the run did not "
                         f"overwrite ({len(proposals)} proposed: {why})")
    by_class: dict[int, list[SampleScore]] = defaultdict(list)
    for s in samples:
        by_class[s.class_index].append(s)
    per_class = [MaskScores.of(group[0].class_name, index, group) for index, group in sorted(by_class.items())]
    interval = _mean_interval(np.array([s.iou for s in samples], dtype=np.float64))
    return MaskMeasurement(
        run_name=run.name, model_id=run.model_id, proposed=len(proposals), tolerance=tolerance,
        per_class=per_class, overall=MaskScores.of("all (mean over samples)", None, samples),
        balanced=MaskScores.balanced(per_class), samples=samples,
        truth={"human": truth_counts["human"], "exact": truth_counts["exact"]},
        left_out={k: left_out[k] for k in LEFT_OUT_REASONS if left_out[k]},
        tuned_on_total=len(tuned_on), nothing_found_reasons=dict(reasons),
        iou_interval=interval)


# ----------------------------------------------------------------------------- review verdicts
@dataclass
class ReviewVerdicts:
    """What became of the proposals a run applied (:func:`review_verdicts`).

    ``counts`` per verdict (:data:`VERDICTS`): ``accepted`` (verified as it was), ``repainted``
    (status ``human``, or verified with a changed mask), ``rejected`` (status ``bad``),
    ``pending`` (still this run's proposal), ``replaced`` (a later proposal, by another model or
    run, took its place), ``other`` (e.g. the mask was removed without a verdict; see
    ``other_reasons``). ``acceptance_rate = accepted / (accepted + repainted + rejected)`` with
    its Wilson 95% interval: among the proposals people looked at, not among all of them
    (pending ones may be the harder or the easier ones).
    """

    run_name: str
    model_id: str
    counts: dict[str, int]
    per_class: dict[str, dict[str, int]]
    by_sample: dict[str, str]
    other_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def applied(self) -> int:
        return sum(self.counts.values())

    @property
    def reviewed(self) -> int:
        return self.counts["accepted"] + self.counts["repainted"] + self.counts["rejected"]

    @property
    def acceptance_rate(self) -> float:
        return self.counts["accepted"] / self.reviewed if self.reviewed else float("nan")

    @property
    def acceptance_interval(self) -> tuple[float, float]:
        return wilson_interval(self.counts["accepted"], self.reviewed)

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run_name, "model_id": self.model_id, "applied": self.applied,
                "reviewed": self.reviewed, **{k: self.counts[k] for k in VERDICTS},
                "acceptance_rate": _json_float(self.acceptance_rate),
                "acceptance_interval": [_json_float(v) for v in self.acceptance_interval],
                "interval_method": "Wilson score, 95%",
                "other_reasons": dict(self.other_reasons),
                "per_class": {k: dict(v) for k, v in self.per_class.items()},
                "by_sample": dict(self.by_sample)}


def _status_history(ds: Any, sample_ids: set[str]) -> dict[str, list[str | None]]:
    """Per sample, the ``mask_status`` values it was given, oldest first (from ``changes.jsonl``)."""
    history: dict[str, list[str | None]] = defaultdict(list)
    for record in ds.changes():
        if record.get("field") == "mask_status" and record.get("sample_id") in sample_ids:
            history[record["sample_id"]].append(record.get("new"))
    return history


def review_verdicts(ds: Any, run: Any) -> ReviewVerdicts:
    """Count what people did with the proposals ``run`` applied (``applied`` true in its table).

    Per sample, in this order: the log (``ds.changes``) shows a later ``model:<other>`` status
    after this run's -> ``replaced``; ``mask_status`` ``bad`` -> ``rejected``; ``model:<this
    run's model id>`` with the run's mask (and, where the row records the run that wrote it,
    this run) -> ``pending``, any other ``model:`` status or mask -> ``replaced``; ``human`` ->
    ``repainted``; another person's status (``ok``, ``reviewed``, ...) -> ``accepted`` when the
    mask equals the proposal pixel for pixel (or the run folder has no mask file to compare
    with), else ``repainted``; an exact mask, no mask without ``bad``, or a sample no longer in
    the dataset -> ``other``. Reads ``changes.jsonl`` once.
    """
    own = f"{MODEL_PREFIX}{run.model_id}"
    applied = [r for r in run.rows() if r.get("applied")]
    ids = {str(r["sample_id"]) for r in applied}
    rows = _dataset_rows(ds, ids)
    history = _status_history(ds, ids)
    counts: Counter[str] = Counter()
    other: Counter[str] = Counter()
    per_class: dict[str, Counter[str]] = defaultdict(Counter)
    by_sample: dict[str, str] = {}

    def same_mask(sid: str, row: Mapping[str, Any]) -> bool | None:
        proposal = run.proposal(sid)
        if proposal is None:
            return None
        current = ds.load_mask(row)
        return current is not None and current.shape == proposal.shape and bool(np.array_equal(current != 0, proposal))

    for proposal_row in applied:
        sid = str(proposal_row["sample_id"])
        row = rows.get(sid)
        if row is None:
            verdict, note = "other", "no longer in the dataset"
            class_name = str(proposal_row.get("class_index"))
        else:
            class_name = _class_name(ds, row)
            status = row.get("mask_status")
            source = mask_source(row)
            statuses = history.get(sid, [])
            last_own = max((i for i, s in enumerate(statuses) if s == own), default=None)
            note = ""
            if last_own is not None and any(model_id_of(s) is not None and s != own for s in statuses[last_own + 1:]):
                verdict = "replaced"
            elif status == REJECTED_STATUS:
                verdict = "rejected"
            elif source == "model":
                writer = proposal_run(row)
                mine = status == own and (writer is None or not run.name or writer == run.name)
                verdict = "pending" if mine and same_mask(sid, row) is not False else "replaced"
            elif source == "human":
                verdict = "repainted" if status == "human" or same_mask(sid, row) is False else "accepted"
            elif source == "exact":
                verdict, note = "other", "replaced by an exact mask"
            else:
                verdict, note = "other", "mask removed without a verdict"
        counts[verdict] += 1
        per_class[class_name][verdict] += 1
        if note:
            other[note] += 1
        by_sample[sid] = verdict
    return ReviewVerdicts(run_name=run.name, model_id=run.model_id, counts={k: counts[k] for k in VERDICTS},
                          per_class={name: {k: c[k] for k in VERDICTS} for name, c in sorted(per_class.items())},
                          by_sample=by_sample, other_reasons=dict(other))


# ----------------------------------------------------------------------------- tables
def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int = 1) -> list[str]:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < numeric_from else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(columns), line(["-" * w for w in widths]), *(line(r) for r in rows)]


MEASUREMENT_COLUMNS: tuple[str, ...] = ("class", "n", "mean IoU", "IoU>=0.5 %", "IoU>=0.75 %", "boundary F",
                                        "centre box IoU", "centre box F", "whole image IoU", "whole image F")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _score_cells(s: MaskScores) -> list[str]:
    return [s.label, str(s.n), num(s.iou), pct(s.iou_50), pct(s.iou_75), num(s.boundary_f),
            num(s.centre_iou), num(s.centre_f), num(s.whole_iou), num(s.whole_f)]


def format_measurement(m: MaskMeasurement) -> str:
    """The plain-text table of a :class:`MaskMeasurement` (one row per class, then the mean over
    samples and the mean over classes) with a caption saying what the numbers can show."""
    tol = "ceil(0.008 x image diagonal) px, as DAVIS" if m.tolerance is None else f"{m.tolerance:g} px"
    nothing = m.overall.n - m.overall.found
    lines = [
        f"Mask proposals of run {m.run_name or '(unnamed)'} (model {m.model_id or MISSING}) against trusted masks",
        f"truth: {m.truth['human']} human and {m.truth['exact']} exact masks (synthetic / COCO); model proposals "
        "are never truth",
        f"out of sample: {_count(m.left_out.get('tuned_on', 0), 'sample')} with a trusted mask left out because "
        f"the model was tuned on them ({m.tuned_on_total} tuned on in all), and "
        f"{_count(m.left_out.get('from_this_proposal', 0), 'sample')} where this run applied its proposal (the mask "
        "there started as the proposal, so it is no independent truth; see the review verdicts)",
        f"measured {m.n} of {m.proposed} samples proposed on; {nothing} where the model found nothing "
        "(scored IoU 0, boundary F 0)",
        "",
        *_table(MEASUREMENT_COLUMNS, [*(_score_cells(c) for c in m.per_class), _score_cells(m.overall),
                                      _score_cells(m.balanced)]),
        "",
        f"IoU>=0.5 % / IoU>=0.75 %: share of samples, in %. Mean IoU over samples{ci(m.iou_interval)} (95%, normal approximation over "
        "these samples; it does not cover other images or classes).",
        f"Boundary F: DAVIS (Perazzi et al. 2016), tolerance {tol}.",
        "Baselines (what a model that learned nothing gets): centre box = a centred box half the image's width "
        "and height; whole image = every pixel (its IoU is the object's share of the image, its boundary F 0).",
    ]
    left = {k: v for k, v in m.left_out.items() if k not in ("tuned_on", "from_this_proposal")}
    if left:
        lines.append("Also left out: " + "; ".join(f"{v} {LEFT_OUT_REASONS[k]}" for k, v in left.items()) + ".")
    if m.nothing_found_reasons:
        lines.append("Nothing found: " + "; ".join(f"{v} {k}" for k, v in sorted(m.nothing_found_reasons.items())) + ".")
    small = [c.label for c in m.per_class if c.n < 10]
    if small:
        lines.append(f"{len(small)} of {len(m.per_class)} classes have fewer than 10 samples; their rows are noisy.")
    return "\n".join(lines)


def format_verdicts(v: ReviewVerdicts) -> str:
    """The plain-text table of a :class:`ReviewVerdicts` (per class and in all) with a caption."""
    columns = ("class", "applied", *VERDICTS)
    rows = [[name, str(sum(c.values())), *(str(c[k]) for k in VERDICTS)] for name, c in v.per_class.items()]
    rows.append(["all", str(v.applied), *(str(v.counts[k]) for k in VERDICTS)])
    if v.applied == 0:
        summary = ("this run applied no proposal (where it proposed, a human or exact mask was already there, "
                   "or it found nothing), so there is nothing to review")
    elif v.reviewed == 0:
        summary = f"accepted as is: {MISSING} (nothing reviewed yet; {v.counts['pending']} pending)"
    else:
        summary = (f"accepted as is: {pct(v.acceptance_rate)}%{pct_ci(v.acceptance_interval)} (Wilson 95%) of the "
                   f"{v.reviewed} reviewed (accepted + repainted + rejected); {v.counts['pending']} still pending, "
                   "not counted.")
    lines = [
        f"Review of the proposals run {v.run_name or '(unnamed)'} (model {v.model_id or MISSING}) wrote into "
        "the dataset",
        "",
        *_table(columns, rows),
        "",
        summary,
        "accepted = verified unchanged; repainted = a person changed or painted it (status human); "
        "rejected = marked bad; replaced = a later proposal took its place.",
        "The rate is among proposals people looked at; if they reviewed the easy (or hard) ones first it does "
        "not carry over to the pending ones.",
    ]
    if v.other_reasons:
        lines.append("Other: " + "; ".join(f"{n} {k}" for k, n in sorted(v.other_reasons.items())) + ".")
    return "\n".join(lines)
