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

For a target half-width ``h`` the photos to add are the cheapest ``(m_e, m_h)`` with
``z sqrt(a / (n_e + m_e) + b / (n_h + m_h)) <= h`` (``a = p_e q_e``, ``b = p_h q_h``): the
unconstrained optimum puts ``n ~ sqrt(variance term)`` (``n_e* = sqrt(a)(sqrt(a) + sqrt(b)) / T``,
``T = (h / z)^2``); when one group already has more than its share, only the other grows
(``m_h = b / (T - a / n_e) - n_h``). The stated error of a predicted half-width is its range when
each accuracy moves within its own 95% Wilson interval. The dataset's drop (the mean over the
kept classes) has half-width ``z / K sqrt(sum_c V_c)``.

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

__all__ = ["Z95", "ClassPlan", "CollectionPlan", "drop_half_width", "group_variance", "make_plan", "photos_needed",
           "plan_dataset", "plan_figure", "review_cost", "wilson", "write_plan"]

#: The normal quantile of a two-sided 95% interval.
Z95 = 1.959963984540054
ASSUMPTION = ("assumes new photos have the accuracy of those already there, so each group's bootstrap variance "
              "p(1-p)/n shrinks as 1/n")


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

    @property
    def overall_now(self) -> float:
        """Half-width of the dataset's drop (mean over the kept classes) now, by the formula."""
        return self._overall(lambda c: (c.half_width_now / Z95) ** 2)

    @property
    def overall_after(self) -> float:
        return self._overall(lambda c: (c.half_width_after / Z95) ** 2)

    def _overall(self, variance: Any) -> float:
        k = len(self.classes)
        return Z95 / k * math.sqrt(sum(variance(c) for c in self.classes)) if k else float("nan")

    @property
    def need_easy(self) -> int:
        return sum(c.need_easy for c in self.classes)

    @property
    def need_hard(self) -> int:
        return sum(c.need_hard for c in self.classes)

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


def make_plan(split: SplitRun, statuses: Sequence[str | None], *, half_width: float = 0.05,
              classes: Sequence[int] | None = None) -> CollectionPlan:
    """The plan of a split run for a target ``half_width`` (a fraction; 0.05 = 5 points).

    ``statuses``: the folder's sample statuses (the review history). Raises ``ValueError`` for a
    split with no kept class that has both groups.
    """
    if not half_width > 0:
        raise ValueError(f"--half-width must be > 0 points, got {100 * half_width:g}")
    rows = [c for c in split.kept if c.n_easy > 0 and c.n_hard > 0 and (classes is None or c.class_index in classes)]
    if not rows:
        raise ValueError(f"split run {split.name} has no kept class with photos in both easy and hard groups"
                         + (" among the classes asked for" if classes is not None else "")
                         + "; nothing to plan (run `curate split` with a reference model first)")
    cost, accepted, rejected = review_cost(statuses)
    return CollectionPlan(split.name, half_width, cost, accepted, rejected,
                          [plan_class(r, half_width, cost) for r in rows])


def plan_figure(plan: CollectionPlan) -> bytes:
    """Half-width per class: measured now (bootstrap), predicted after the plan (with its range), target."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = plan.classes
    fig, ax = plt.subplots(figsize=(max(6, 0.4 * len(rows) + 2), 4), dpi=110)
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [100 * c.half_width_bootstrap for c in rows], 0.4, label="now (bootstrap)")
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
                 classes: Sequence[int] | None = None) -> CollectionPlan:
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
