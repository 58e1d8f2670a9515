"""Merge evaluation runs into one table (papers/003 Table 2) and the easy-vs-hard scatter (Fig. 2).

For every evaluation run with groups (read through :class:`curate.runs.EvaluationRun`): model,
family, label space, prompts, easy and hard balanced top-1 accuracy (%), drop (points) with
their bootstrap intervals, and the model's effective robustness
(:mod:`curate.metrics.robustness`) against the fit over the runs of the SAME family and setup
(label space, and prompts for prompted families): CLIPs, ImageNet classifiers and LVLMs are
never fitted together (papers/003 Fig. 2 fits CLIPs and ImageNet models separately), and the
scale of the fit (logit by default, or linear) is stated beside every figure.

The split's reference model chose easy and hard to maximise its own drop, so its drop on that
split is in-sample (the paper reports it the same way): such rows are flagged, with the split's
selection-corrected (cross-fitted) drop beside them when the split run has one.

Re-runs: by default a model counts once per setup (model id, label space, prompts): its NEWEST
run (:func:`newest_runs`, the rule ``curate report`` uses too); the older runs are left out,
each named with the run that repeats it (:class:`Repeat`, :func:`repeats_note`), and the fits
are over the runs kept. Runs named explicitly are all shown.

Writes ``compare.md``, ``compare.csv`` and ``compare.png`` (the scatter with each family's fit
and y = x). Where the folder has an annotator-spread run (issue 44), ``compare.md`` ends with its
newest one's table: each class's drop under the agreed labels, each annotator's and the disputed
photos in either group, with the spread and the classes whose easy/hard assignment flips
(:func:`annotator_spread_run`).
"""
from __future__ import annotations

import csv
import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from curate.formatting import MISSING, pct, pct_ci
from curate.metrics.bootstrap import allowed_or_nan
from curate.metrics.robustness import SCALES, effective_robustness, fit_effective_robustness
from curate.runs import EvaluationRun, RunError, iter_runs, write_bytes

logger = logging.getLogger(__name__)

__all__ = ["RunRow", "Repeat", "cell_sizes", "load_rows", "newest_runs", "repeats_note", "fit_groups", "compare_runs", "drop_text",
           "to_markdown", "to_csv", "scatter_png", "split_reference", "flag_in_sample", "annotator_spread_run"]

NAN = float("nan")


@dataclass
class RunRow:
    run: str
    model: str
    model_id: str
    family: str
    label_space: str
    prompts: str
    easy: float  # fractions
    hard: float
    drop: float
    easy_ci: tuple[float, float]
    hard_ci: tuple[float, float]
    drop_ci: tuple[float, float]
    n_easy: int
    n_hard: int
    effective_robustness: float = NAN
    er_scale: str = "logit"
    in_sample: bool = False  # the split's reference model, on the split it chose
    corrected_drop: float = NAN  # the split's cross-fitted drop for that model (when in_sample)

    @property
    def setup(self) -> tuple[str, str, str]:
        """(family, label space, prompts): the runs one effective-robustness line is fitted over."""
        return (self.family, self.label_space, self.prompts)

    @property
    def setup_text(self) -> str:
        return f"{self.family} · {self.label_space} · {self.prompts}"

    @property
    def model_setup(self) -> tuple[str, str, str]:
        """(model id, label space, prompts): runs with the same key repeat one measurement."""
        return (self.model_id, self.label_space, self.prompts)


class Repeat(NamedTuple):
    """An older evaluation run left out because ``kept``, a newer run of the same model and setup, is shown."""

    run: str
    kept: str


def newest_runs(rows: Sequence[RunRow]) -> tuple[list[RunRow], list[Repeat]]:
    """One row per :attr:`RunRow.model_setup`: the newest run's; and the older runs left out.

    ``rows`` are oldest first (the order of :func:`curate.runs.list_runs`: by the run folder's
    modification time), as :func:`load_rows` reads them. The rows kept keep their order; the
    repeats come in the order of ``rows``.
    """
    newest: dict[tuple[str, str, str], RunRow] = {}
    for r in rows:
        newest[r.model_setup] = r
    kept = [r for r in rows if newest[r.model_setup] is r]
    repeats = [Repeat(r.run, newest[r.model_setup].run) for r in rows if newest[r.model_setup] is not r]
    return kept, repeats


def repeats_note(repeats: Sequence[Repeat], *, markdown: bool = True) -> str:
    """The sentence that counts and names the runs left out as repeats ("" when none):
    ``2 older runs of the same model and setup not shown (the newest run of each is): `a` (repeats `c`), ...``
    (``markdown`` False: run names without backticks)."""
    if not repeats:
        return ""
    q = "`" if markdown else ""
    n = len(repeats)
    return (f"{n} older run{'s' if n != 1 else ''} of the same model and setup not shown (the newest run of each is): "
            + ", ".join(f"{q}{r.run}{q} (repeats {q}{r.kept}{q})" for r in repeats) + ".")


def split_reference(dataset_root: Path):
    """The dataset's current :class:`curate.runs.SplitRun` (``None`` when there is none or it cannot be read)."""
    from curate.runs.split import SplitRun
    from curate.store import Dataset

    name = (Dataset.open(dataset_root).provenance.get("split") or {}).get("run")
    if not name:
        return None
    try:
        return SplitRun.load(Path(dataset_root) / "runs" / str(name))
    except RunError as error:
        logger.warning("the split run %s cannot be read (%s); reference rows are not flagged", name, error)
        return None


def flag_in_sample(rows: Sequence[RunRow], split: Any) -> None:
    """Mark the rows of the split's reference model(s) as in-sample; where the row's label space is
    the one the split used, put the split's cross-fitted (selection-corrected) drop beside it."""
    if split is None:
        return
    corrected = split.reference_drop().corrected
    spaces = {r.label_space for r in split.references}
    for r in rows:
        if split.is_reference(model_id=r.model_id, run=r.run):
            r.in_sample = True
            r.corrected_drop = corrected if r.label_space in spaces else NAN


def cell_sizes(run: EvaluationRun) -> list[int]:
    """The (class, group) cell sizes of a run's classes with both groups (``per_class`` n_easy / n_hard)."""
    return [int(c[k]) for c in run.per_class for k in ("n_easy", "n_hard") if c.get(k) is not None]


def _row(run: EvaluationRun, scale: str) -> RunRow:
    easy, hard, drop = run.group("easy"), run.group("hard"), run.drop
    prompted = run.family in ("clip", "lvlm")
    sizes = cell_sizes(run)  # the interval rule also for runs written before it (curate.metrics.bootstrap)

    def cells(interval: Any) -> tuple[float, float]:  # a run without per-class counts keeps what it stored
        return allowed_or_nan(interval, sizes) if sizes else (float(interval[0]), float(interval[1]))

    return RunRow(
        run=run.name, model=run.model_label, model_id=run.model_id, family=run.family,
        label_space=run.label_space_name, prompts=run.prompts_name if prompted else MISSING,
        easy=easy.acc1, hard=hard.acc1, drop=drop.acc1 if drop else NAN,
        easy_ci=cells(easy.acc1_ci), hard_ci=cells(hard.acc1_ci), drop_ci=cells(drop.acc1_ci) if drop else (NAN, NAN),
        n_easy=easy.n, n_hard=hard.n, er_scale=scale,
    )


def load_rows(dataset_root: Path, runs: Sequence[str] | None = None, *, er_scale: str = "logit",
              notes: list[str] | None = None, repeats: list[Repeat] | None = None,
              all_runs: bool = False) -> list[RunRow]:
    """Rows of the evaluation runs with groups; effective robustness fitted per :attr:`RunRow.setup`
    over the rows returned.

    With ``runs`` None, one row per model and setup: the newest run (:func:`newest_runs`); the
    older runs are appended to ``repeats`` when a list is given (``all_runs``: every run, no
    repeat left out). With ``runs``, exactly those runs. Runs without groups are left out
    (logged); unreadable runs are left out and described in ``notes`` when a list is given.
    """
    if er_scale not in SCALES:
        raise ValueError(f"--er-scale must be one of {', '.join(SCALES)}, got {er_scale!r}")
    rows = []
    for path, run in iter_runs(dataset_root, "evaluate"):
        if runs and path.name not in runs:
            continue
        if isinstance(run, RunError):
            logger.warning("%s", run)
            if notes is not None:
                notes.append(f"`{path.name}` cannot be read: {run}")
            continue
        if not run.has_groups:
            logger.info("run %s has no easy/hard groups; left out of the comparison", path.name)
            continue
        rows.append(_row(run, er_scale))
    if runs:
        missing = sorted(set(runs) - {r.run for r in rows})
        if missing:
            raise ValueError(f"no evaluation run with groups named {', '.join(missing)} in {dataset_root}/runs")
    elif not all_runs:
        rows, left_out = newest_runs(rows)
        if repeats is not None:
            repeats.extend(left_out)
    fit_groups(rows, er_scale)
    flag_in_sample(rows, split_reference(dataset_root))
    return rows


def fit_groups(rows: Sequence[RunRow], scale: str = "logit") -> dict[tuple[str, str, str], Any]:
    """Fit effective robustness per setup (family, label space, prompts); sets each row's ER."""
    fits = {}
    for setup in sorted({r.setup for r in rows}):
        same = [r for r in rows if r.setup == setup]
        easy, hard = np.array([r.easy for r in same]), np.array([r.hard for r in same])
        fit = fit_effective_robustness(easy, hard, scale)
        fits[setup] = fit
        for r, value in zip(same, effective_robustness(easy, hard, fit)):
            r.effective_robustness, r.er_scale = float(value), scale
    return fits


def drop_text(r: RunRow, digits: int = 2) -> str:
    text = pct(r.drop, digits)
    if r.in_sample:
        text += " (in-sample" + (f"; corrected {pct(r.corrected_drop, digits)}" if np.isfinite(r.corrected_drop) else "") + ")"
    return text


COLUMNS = ("model", "family", "label space", "prompts", "easy", "hard", "drop", "effective robustness", "n easy",
           "n hard", "run")


def to_markdown(rows: Sequence[RunRow], repeats: Sequence[Repeat] = ()) -> str:
    """Table 2 style: accuracies in %, drop in points, 95% intervals in brackets, ER with its scale;
    the runs left out as ``repeats`` counted and named below."""
    scale = rows[0].er_scale if rows else "logit"
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in sorted(rows, key=lambda r: (r.setup, -r.easy)):
        lines.append("| " + " | ".join([
            r.model, r.family, r.label_space, r.prompts, pct(r.easy, 2) + pct_ci(r.easy_ci),
            pct(r.hard, 2) + pct_ci(r.hard_ci), drop_text(r) + pct_ci(r.drop_ci),
            pct(r.effective_robustness, 2), str(r.n_easy), str(r.n_hard), r.run,
        ]) + " |")
    notes = [f"Effective robustness: points above the {scale}-scale least-squares fit of hard on easy accuracy over "
             "the models of the same family and setup (CLIPs, ImageNet classifiers and LVLMs are fitted separately, "
             "as papers/003 Fig. 2 does); — where a family has fewer than 3 models."]
    if any(r.in_sample for r in rows):
        notes.append("In-sample: the split's reference model chose easy and hard to maximise its own drop, so its drop "
                     "on this split is inflated by that selection (papers/003 reports it the same way); the corrected "
                     "figure chooses easy/hard on one fold of the images and measures on the other (`curate split`).")
    if repeats:
        notes.append(repeats_note(repeats))
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


def to_csv(rows: Sequence[RunRow]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["run", "model", "model_id", "family", "label_space", "prompts", "easy_acc1", "easy_ci_low",
                     "easy_ci_high", "hard_acc1", "hard_ci_low", "hard_ci_high", "drop", "drop_ci_low", "drop_ci_high",
                     "drop_in_sample", "drop_corrected", "effective_robustness", "er_scale", "n_easy", "n_hard"])
    for r in rows:
        writer.writerow([r.run, r.model, r.model_id, r.family, r.label_space, r.prompts, r.easy, *r.easy_ci, r.hard,
                         *r.hard_ci, r.drop, *r.drop_ci, r.in_sample, r.corrected_drop, r.effective_robustness,
                         r.er_scale, r.n_easy, r.n_hard])
    return buffer.getvalue()


def scatter_png(rows: Sequence[RunRow], title: str = "easy vs hard (balanced top-1, %)") -> bytes:
    """Fig. 2 style: one marker per model, one fit per family and setup (on the rows' scale), and y = x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.6), dpi=120)
    ax.plot([0, 100], [0, 100], ls="--", color="grey", lw=1, label="y = x (no reliance on background)")
    markers = {"clip": "o", "classifier": "s", "lvlm": "^"}
    for setup in sorted({r.setup for r in rows}):
        same = [r for r in rows if r.setup == setup]
        easy = np.array([r.easy for r in same])
        hard = np.array([r.hard for r in same])
        points = ax.scatter(100 * easy, 100 * hard, s=36, zorder=3, marker=markers.get(setup[0], "o"),
                            label=" / ".join(setup))
        fit = fit_effective_robustness(easy, hard, same[0].er_scale)
        if fit.defined:
            xs = np.linspace(0.005, 0.995, 200)
            ax.plot(100 * xs, 100 * fit.predict(xs), color=points.get_facecolor()[0], lw=1.2,
                    label=f"{setup[0]} fit ({fit.scale} scale, {fit.n_models} models)")
        for r in same:
            ax.annotate(r.model, (100 * r.easy, 100 * r.hard), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 100)
    ax.set_xlabel("easy group accuracy (%)")
    ax.set_ylabel("hard group accuracy (%)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def annotator_spread_run(dataset_root: Path) -> Any:
    """The folder's newest :class:`curate.runs.annotator_spread.AnnotatorSpreadRun` (None when it has none;
    an unreadable one is logged and skipped)."""
    from curate.runs.lookup import newest_run

    return newest_run(dataset_root, "annotator-spread")


def compare_runs(dataset_root: Path, out_dir: Path | None = None, runs: Sequence[str] | None = None, *,
                 er_scale: str = "logit", repeats: list[Repeat] | None = None) -> tuple[list[RunRow], Path]:
    """Write compare.md / .csv / .png to ``out_dir`` (default ``DIR/runs/compare``).

    The rows are :func:`load_rows`'s: without ``runs``, the newest run of each model and setup;
    the older runs left out are named in ``compare.md`` and appended to ``repeats`` when a list
    is given (:func:`repeats_note` words them)."""
    left_out: list[Repeat] = []
    rows = load_rows(dataset_root, runs, er_scale=er_scale, repeats=left_out)
    if repeats is not None:
        repeats.extend(left_out)
    if not rows:
        raise ValueError(f"{dataset_root} has no evaluation runs with easy/hard groups to compare "
                         "(run `curate evaluate` after the split)")
    out_dir = Path(out_dir) if out_dir else Path(dataset_root) / "runs" / "compare"
    markdown = to_markdown(rows, left_out)
    spread = annotator_spread_run(dataset_root)
    if spread is not None:
        markdown += f"\n## How much the drop depends on who labelled (`{spread.name}`)\n\n" + spread.to_markdown()
    write_bytes(out_dir / "compare.md", markdown.encode())
    write_bytes(out_dir / "compare.csv", to_csv(rows).encode())
    write_bytes(out_dir / "compare.png", scatter_png(rows))
    return rows, out_dir
