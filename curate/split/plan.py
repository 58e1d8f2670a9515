"""How many more photos each class needs: the drop's interval now and after collecting more
(``curate plan``, docs/design.md#collection-plan).

The split's drop of class ``c`` is ``ACC_easy(c) - ACC_hard(c)`` and its interval is the stratified
bootstrap of docs/design.md#accuracy: one Binomial(n, p)/n draw per (class, group) cell. That
bootstrap's variance is therefore ``p_e q_e / n_e + p_h q_h / n_h`` (``q = 1 - p``), and a 95%
percentile interval is close to ``+- z sigma`` (``z = 1.96``). The plan rests on one assumption,
stated in every table: **the photos still to come have the accuracy of those already there**, so
each group's variance term shrinks as ``1 / n``. Accuracies are smoothed (``(k + 1) / (n + 2)``) so
that a group the reference gets all right or all wrong still has a variance to plan with (a
bootstrap on it would say 0 now, and not after new photos arrive).

For a target half-width ``h`` the photos to add are the fewest in total ``(m_e, m_h)`` with
``z sqrt(a / (n_e + m_e) + b / (n_h + m_h)) <= h`` (``a = p_e q_e``, ``b = p_h q_h``), found
exactly by :func:`curate.split.plan_alloc.fewest_photos` (the continuous optimum puts
``n ~ sqrt(variance term)``; rounding each group's share up on its own can cost a photo more).
The target is applied to that formula's half-width (shown beside the split's bootstrap one):
where the smoothing puts it over the target while the bootstrap is under, the output says so.
The stated error of a predicted half-width is its range when each accuracy moves within its own
95% Wilson interval; a bootstrap measured later also carries its Monte Carlo noise
(:func:`bootstrap_noise`, about 3 % of the half-width at 1,000 replicates), which is said, not
added. The dataset's drop (the mean over the kept classes) has half-width
``z / K sqrt(sum_c V_c)``, and its row is planned for the mean itself: the fewest photos over
all ``2K`` groups with ``sum_c V_c <= (h K / z)^2``.

The review cost is the folder's own history: photos reviewed (accepted + rejected) per accepted
photo; NaN when nobody reviewed yet.
"""
from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from curate.metrics.bootstrap import allowed_or_nan
from curate.runs.base import write_bytes
from curate.runs.split import SplitClass, SplitRun
from curate.split.plan_alloc import fewest_photos

__all__ = ["Z95", "ClassPlan", "CollectionPlan", "bootstrap_noise", "drop_half_width", "group_variance", "make_plan",
           "photos_needed", "plan_dataset", "plan_figure", "resolve_classes", "review_cost", "wilson", "write_plan"]

#: The normal quantile of a two-sided 95% interval.
Z95 = 1.959963984540054
ASSUMPTION = ("applies the target to the formula's half-width 1.96 sqrt(p_e(1-p_e)/n_e + p_h(1-p_h)/n_h) with each "
              "accuracy smoothed to p = (k+1)/(n+2), and assumes new photos have the accuracy of those already there, "
              "so each term shrinks as 1/n")


def bootstrap_noise(n_boot: int = 1000, level: float = 0.95) -> float:
    """Relative Monte Carlo error (one standard deviation) of a percentile bootstrap's half-width
    from ``n_boot`` replicates of a normal statistic: each end's quantile has standard error
    ``sqrt(q (1 - q) / B) / phi(z)`` (``q = (1 - level) / 2``), the half-width averages two ends,
    so ``sqrt(q (1 - q) / (2 B)) / (phi(z) z)``: 3.0 % at 1,000 replicates."""
    from statistics import NormalDist

    q = (1 - level) / 2
    z = NormalDist().inv_cdf(1 - q)
    return math.sqrt(q * (1 - q) / (2 * n_boot)) / (NormalDist().pdf(z) * z)


def smoothed(acc: float, n: int) -> float:
    """The Laplace-smoothed accuracy ``(k + 1) / (n + 2)`` of ``n`` photos with accuracy ``acc``."""
    k = acc * n if math.isfinite(acc) else 0.5 * n
    return (k + 1.0) / (n + 2.0)


def group_variance(acc: float, n: int) -> float:
    """``p (1 - p)`` of a group with the smoothed accuracy (the variance of one photo's outcome)."""
    p = smoothed(acc, n)
    return p * (1.0 - p)


def wilson(acc: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson interval of an accuracy measured on ``n`` photos ((0, 1) when ``n`` is 0)."""
    if n <= 0 or not math.isfinite(acc):
        return 0.0, 1.0
    centre = (acc + z * z / (2 * n)) / (1 + z * z / n)
    spread = z / (1 + z * z / n) * math.sqrt(acc * (1 - acc) / n + z * z / (4 * n * n))
    return max(0.0, centre - spread), min(1.0, centre + spread)


def drop_half_width(a: float, n_easy: float, b: float, n_hard: float, z: float = Z95) -> float:
    """``z sqrt(a / n_easy + b / n_hard)``: the half-width of one class's drop (``a``, ``b``: ``p q``)."""
    if n_easy <= 0 or n_hard <= 0:
        return float("inf")
    return z * math.sqrt(a / n_easy + b / n_hard)


def photos_needed(a: float, n_easy: int, b: float, n_hard: int, target: float, z: float = Z95) -> tuple[int, int]:
    """The fewest ``(easy, hard)`` photos to add, in total, so the drop's half-width is at most ``target``
    (the greedy minimum of :func:`curate.split.plan_alloc.fewest_photos`, not each group's optimum rounded up)."""
    if target <= 0:
        raise ValueError(f"the target half-width must be > 0, got {target}")
    need_e, need_h = fewest_photos([a, b], [n_easy, n_hard], (target / z) ** 2)
    return need_e, need_h


def _variance_range(acc: float, n: int) -> tuple[float, float]:
    """Lowest and highest ``p q`` for ``p`` within the Wilson interval of the accuracy."""
    low, high = wilson(acc, n)
    ends = [low * (1 - low), high * (1 - high)]
    top = 0.25 if low <= 0.5 <= high else max(ends)
    return min(ends), top


def review_cost(statuses: Iterable[str | None]) -> tuple[float, int, int]:
    """``(photos reviewed per accepted photo, accepted, rejected)`` from the samples' statuses."""
    counts = Counter(statuses)
    accepted, rejected = counts.get("accepted", 0), counts.get("rejected", 0)
    return ((accepted + rejected) / accepted if accepted else float("nan")), accepted, rejected


@dataclass(frozen=True)
class ClassPlan:
    """One kept class: its drop's half-width now and the photos it needs (fractions, not points)."""

    class_index: int
    class_name: str
    easy: str | None
    hard: str | None
    easy_acc: float
    hard_acc: float
    n_easy: int
    n_hard: int
    half_width_bootstrap: float  # measured now: half the split's bootstrap interval
    half_width_now: float  # the formula now
    need_easy: int
    need_hard: int
    half_width_after: float  # the formula after adding need_easy / need_hard
    half_width_after_range: tuple[float, float]  # its stated error (accuracies within their Wilson intervals)
    review_photos: float  # photos to review to accept need_easy + need_hard (NaN: no review history)

    @property
    def need(self) -> int:
        return self.need_easy + self.need_hard

    def why(self, target: float) -> str:
        """Why a class whose measured (bootstrap) half-width is already at most ``target`` still gets
        photos ("" when it does not): the plan's smoothed formula is over the target."""
        if not self.need:
            return ""
        if not math.isfinite(self.half_width_bootstrap):
            return (f"{self.class_name}: no bootstrap interval (a group under 2 photos); planned from the formula's "
                    f"{100 * self.half_width_now:.1f} points")
        if self.half_width_bootstrap > target:
            return ""
        extremes = [f"{g} {100 * acc:.0f} % of {n}" for g, acc, n in (("easy", self.easy_acc, self.n_easy),
                                                                      ("hard", self.hard_acc, self.n_hard))
                    if acc in (0.0, 1.0)]
        what = (f"{' and '.join(extremes)} right, so the bootstrap cannot vary there; " if extremes else "")
        return (f"{self.class_name}: {what}the plan's formula with smoothed accuracies (k+1)/(n+2) gives "
                f"{100 * self.half_width_now:.1f} points, over the target")

    def predict(self, n_easy: int, n_hard: int) -> tuple[float, float, float]:
        """Predicted half-width at other group sizes and its stated range (low, value, high)."""
        return _predict(self.easy_acc, self.n_easy, self.hard_acc, self.n_hard, n_easy, n_hard)


def _predict(easy_acc: float, n_e: int, hard_acc: float, n_h: int, to_e: int, to_h: int) -> tuple[float, float, float]:
    value = drop_half_width(group_variance(easy_acc, n_e), to_e, group_variance(hard_acc, n_h), to_h)
    (ae_lo, ae_hi), (ah_lo, ah_hi) = _variance_range(easy_acc, n_e), _variance_range(hard_acc, n_h)
    return drop_half_width(ae_lo, to_e, ah_lo, to_h), value, drop_half_width(ae_hi, to_e, ah_hi, to_h)


@dataclass
class CollectionPlan:
    """The plan of one split run (see the module docstring)."""

    split_run: str
    target: float
    review_cost: float
    accepted: int
    rejected: int
    classes: list[ClassPlan] = field(default_factory=list)
    assumption: str = ASSUMPTION
    #: the plan for the mean drop itself: the fewest photos per class (easy, hard) that bring the
    #: mean's half-width to the target (curate.split.plan_alloc), not the sum of the per-class plans
    mean_need: list[tuple[int, int]] = field(default_factory=list)
    n_boot: int = 1000  # the split's bootstrap replicates (its Monte Carlo noise: bootstrap_noise)

    @property
    def overall_now(self) -> float:
        """Half-width of the dataset's drop (mean over the kept classes) now, by the formula."""
        return self._overall(lambda c: (c.half_width_now / Z95) ** 2)

    @property
    def overall_after(self) -> float:
        """The mean drop's half-width after the mean's own plan (:attr:`mean_need`)."""
        k = len(self.classes)
        if not k:
            return float("nan")
        total = sum(drop_half_width(group_variance(c.easy_acc, c.n_easy), c.n_easy + me,
                                    group_variance(c.hard_acc, c.n_hard), c.n_hard + mh) ** 2
                    for c, (me, mh) in zip(self.classes, self.mean_need))
        return math.sqrt(total) / k

    def _overall(self, variance: Any) -> float:
        k = len(self.classes)
        return Z95 / k * math.sqrt(sum(variance(c) for c in self.classes)) if k else float("nan")

    @property
    def need_easy(self) -> int:
        """Easy photos the mean drop's plan adds (over all classes)."""
        return sum(me for me, _ in self.mean_need)

    @property
    def need_hard(self) -> int:
        return sum(mh for _, mh in self.mean_need)

    @property
    def noise(self) -> float:
        """Relative Monte Carlo noise of a measured bootstrap half-width (:func:`bootstrap_noise`)."""
        return bootstrap_noise(self.n_boot)

    @property
    def review_photos(self) -> float:
        return self.review_cost * (self.need_easy + self.need_hard)

    def to_csv(self) -> str:
        """One row per class and an ``all`` row; half-widths in points."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["class_index", "class_name", "easy", "hard", "n_easy", "n_hard", "half_width_bootstrap",
                         "half_width_now", "need_easy", "need_hard", "half_width_after", "half_width_after_low",
                         "half_width_after_high", "review_photos"])
        for c in self.classes:
            writer.writerow([c.class_index, c.class_name, c.easy, c.hard, c.n_easy, c.n_hard,
                             _pts(c.half_width_bootstrap), _pts(c.half_width_now), c.need_easy, c.need_hard,
                             _pts(c.half_width_after), _pts(c.half_width_after_range[0]),
                             _pts(c.half_width_after_range[1]), _round(c.review_photos)])
        writer.writerow(["all", "", "", "", sum(c.n_easy for c in self.classes), sum(c.n_hard for c in self.classes),
                         "", _pts(self.overall_now), self.need_easy, self.need_hard, _pts(self.overall_after), "", "",
                         _round(self.review_photos)])
        return buffer.getvalue()

    def to_dict(self) -> dict[str, Any]:
        return {"split_run": self.split_run, "target": self.target, "review_cost": self.review_cost,
                "accepted": self.accepted, "rejected": self.rejected, "assumption": self.assumption,
                "overall_now": self.overall_now, "overall_after": self.overall_after,
                "mean_need": [list(m) for m in self.mean_need], "bootstrap_noise": self.noise,
                "classes": [asdict(c) for c in self.classes]}


def _pts(x: float) -> str:
    return f"{100 * x:.2f}" if math.isfinite(x) else ""


def _round(x: float) -> str:
    return f"{x:.0f}" if math.isfinite(x) else ""


def plan_class(row: SplitClass, target: float, cost: float) -> ClassPlan:
    """The plan of one kept class of a split (``target``: half-width as a fraction)."""
    a, b = group_variance(row.easy_acc, row.n_easy), group_variance(row.hard_acc, row.n_hard)
    need_e, need_h = photos_needed(a, row.n_easy, b, row.n_hard, target)
    low, after, high = _predict(row.easy_acc, row.n_easy, row.hard_acc, row.n_hard, row.n_easy + need_e,
                                row.n_hard + need_h)
    lo, hi = allowed_or_nan(row.drop_ci, [row.n_easy, row.n_hard])  # the interval rule: no cell of one photo
    boot = (hi - lo) / 2 if math.isfinite(lo) and math.isfinite(hi) else float("nan")
    return ClassPlan(row.class_index, row.class_name, row.easy, row.hard, row.easy_acc, row.hard_acc, row.n_easy,
                     row.n_hard, boot, drop_half_width(a, row.n_easy, b, row.n_hard), need_e, need_h, after,
                     (low, high), cost * (need_e + need_h))


def resolve_classes(split: SplitRun, classes: Sequence[int | str]) -> list[int]:
    """Class indices from indices or names (case-insensitive), each a class the split kept.

    Raises ``ValueError`` saying what is true: no class of that name, a class the split has no
    photos of, or one it did not keep (with its reason and the kept classes)."""
    by_index = {c.class_index: c for c in split.classes}
    by_name = {c.class_name.lower(): c for c in split.classes}
    kept = ", ".join(f"{c.class_index} {c.class_name}" for c in split.kept) or "none"
    out = []
    for item in classes:
        text = str(item).strip()
        if text.lstrip("-").isdigit():
            row = by_index.get(int(text))
            if row is None:
                raise ValueError(f"class {text} is not among split run {split.name}'s classes (it has no accepted "
                                 f"photo with a background label there); the kept classes: {kept}")
        else:
            row = by_name.get(text.lower())
            if row is None:
                raise ValueError(f"no class named {text!r} in split run {split.name}; the kept classes: {kept}")
        if not row.kept:
            raise ValueError(f"class {row.class_index} ({row.class_name}) was not kept by split run {split.name}"
                             + (f" ({row.reason})" if row.reason else "") + f"; the kept classes: {kept}")
        out.append(row.class_index)
    return out


def make_plan(split: SplitRun, statuses: Sequence[str | None], *, half_width: float = 0.05,
              classes: Sequence[int | str] | None = None) -> CollectionPlan:
    """The plan of a split run for a target ``half_width`` (a fraction; 0.05 = 5 points).

    ``statuses``: the folder's sample statuses (the review history). Raises ``ValueError`` for a
    split with no kept class that has both groups.
    """
    if not half_width > 0:
        raise ValueError(f"--half-width must be > 0 points, got {100 * half_width:g}")
    wanted = None if classes is None else resolve_classes(split, classes)
    rows = [c for c in split.kept if c.n_easy > 0 and c.n_hard > 0 and (wanted is None or c.class_index in wanted)]
    if not rows:
        raise ValueError(f"split run {split.name} has no kept class with photos in both easy and hard groups"
                         + (" among the classes asked for; nothing to plan for them" if classes is not None else
                            "; nothing to plan (run `curate split` with a reference model first)"))
    cost, accepted, rejected = review_cost(statuses)
    variances = [v for r in rows for v in (group_variance(r.easy_acc, r.n_easy), group_variance(r.hard_acc, r.n_hard))]
    counts = [n for r in rows for n in (r.n_easy, r.n_hard)]
    # the mean over K classes: (z / K)^2 sum_c V_c <= h^2, i.e. sum of v / N <= (h K / z)^2
    added = fewest_photos(variances, counts, (half_width * len(rows) / Z95) ** 2)
    n_boot = int(split.rule.n_boot)
    return CollectionPlan(split.name, half_width, cost, accepted, rejected,
                          [plan_class(r, half_width, cost) for r in rows],
                          mean_need=list(zip(added[0::2], added[1::2])), n_boot=n_boot)


def plan_figure(plan: CollectionPlan) -> bytes:
    """Half-width per class: now (the formula the plan uses; the bootstrap as a dot), predicted after the plan
    (with its range), target."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = plan.classes
    fig, ax = plt.subplots(figsize=(max(6, 0.4 * len(rows) + 2), 4), dpi=110)
    x = np.arange(len(rows))
    # "now" is the value the target is applied to (the smoothed formula), so "after" is never above it;
    # the measured bootstrap half-width is the dot
    ax.bar(x - 0.2, [100 * c.half_width_now for c in rows], 0.4, label="now (the formula the plan uses)")
    ax.plot(x - 0.2, [100 * c.half_width_bootstrap for c in rows], "o", color="black", ms=3, label="now (bootstrap)")
    after = np.array([100 * c.half_width_after for c in rows])
    err = np.array([[100 * (c.half_width_after - c.half_width_after_range[0]) for c in rows],
                    [100 * (c.half_width_after_range[1] - c.half_width_after) for c in rows]])
    ax.bar(x + 0.2, after, 0.4, label="after the plan (predicted)")
    if len(rows):
        ax.errorbar(x + 0.2, after, yerr=err, fmt="none", ecolor="black", lw=0.8, capsize=2)
    ax.axhline(100 * plan.target, color="tab:red", ls="--", lw=1, label="target")
    ax.set_xticks(x, [f"{c.class_index} {c.class_name}" for c in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("drop interval half-width (points)")
    ax.set_title("photos to collect: drop half-width per class")
    ax.legend(fontsize=7)
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


#: The files :func:`write_plan` writes (default folder ``DIR/runs/plan``, beside the report's).
PLAN_CSV, PLAN_JSON, PLAN_PNG = "plan.csv", "plan.json", "plan.png"


def plan_dataset(root: str | Path, *, split: str | None = None, half_width: float = 0.05,
                 classes: Sequence[int | str] | None = None) -> CollectionPlan:
    """The plan of a dataset folder's split run (default: the split ``dataset.yaml`` records)."""
    from curate.runs import RunError
    from curate.runs.lookup import named_run
    from curate.store import Dataset

    if not half_width > 0:
        raise ValueError(f"--half-width must be > 0 points, got {100 * half_width:g}")
    ds = Dataset.open(root)
    name = split or (ds.provenance.get("split") or {}).get("run")
    if not name:
        raise ValueError(f"{ds.root} has no split yet; run `curate split DIR --reference MODEL` first, "
                         "or name one with --split RUN")
    try:
        run = named_run(ds.root, str(name), SplitRun)
    except RunError as exc:
        raise ValueError(f"cannot plan from split run {name}: {exc}") from None
    return make_plan(run, ds.table().column("status").to_pylist(), half_width=half_width, classes=classes)


def write_plan(plan: CollectionPlan, out_dir: str | Path) -> list[Path]:
    """Write ``plan.csv``, ``plan.json`` and ``plan.png`` (each atomically) into ``out_dir``."""
    from curate.jsonio import write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_bytes(out / PLAN_CSV, plan.to_csv().encode())
    write_json(out / PLAN_JSON, plan.to_dict())
    write_bytes(out / PLAN_PNG, plan_figure(plan))
    return [out / PLAN_CSV, out / PLAN_JSON, out / PLAN_PNG]
