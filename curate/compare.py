"""Merge evaluation runs into one table (papers/003 Table 2) and the easy-vs-hard scatter (Fig. 2).

For every run under ``DIR/runs/`` that has groups: model, label space, prompts, easy and hard
balanced top-1 accuracy (%), drop (points) with their bootstrap intervals, and the model's
effective robustness (:mod:`curate.metrics.robustness`) against the fit over the runs that
share its label space and prompts (runs of different setups are never fitted together).
Writes ``compare.md``, ``compare.csv`` and ``compare.png`` (the scatter with the logit-linear
fit and y = x).
"""
from __future__ import annotations

import csv
import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from curate.metrics.robustness import effective_robustness, fit_effective_robustness
from curate.runs import list_runs, write_bytes

logger = logging.getLogger(__name__)


@dataclass
class RunRow:
    run: str
    model: str
    model_id: str
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
    effective_robustness: float = float("nan")

    @property
    def setup(self) -> tuple[str, str]:
        return (self.label_space, self.prompts)


def _nan(x) -> float:
    return float("nan") if x is None else float(x)


def _ci(x) -> tuple[float, float]:
    return (_nan(x[0]), _nan(x[1])) if x else (float("nan"), float("nan"))


def load_rows(dataset_root: Path, runs: Sequence[str] | None = None) -> list[RunRow]:
    """One row per evaluation run with groups (runs without groups are skipped, with a note)."""
    rows = []
    for run_dir in list_runs(dataset_root):
        if runs and run_dir.name not in runs:
            continue
        metrics_path = run_dir / "metrics.json"
        if not metrics_path.exists():
            continue
        config = json.loads((run_dir / "config.json").read_text())
        if config.get("kind") != "evaluate":
            continue
        metrics = json.loads(metrics_path.read_text())
        groups = metrics.get("groups") or {}
        if "easy" not in groups or "hard" not in groups:
            logger.info("run %s has no easy/hard groups; left out of the comparison", run_dir.name)
            continue
        model = config["model"]
        from curate.evaluate import ModelSpec

        label = ModelSpec(model["name"], model.get("pretrained")).label
        drop = metrics.get("drop") or {}
        rows.append(RunRow(
            run=run_dir.name, model=label, model_id=metrics.get("model_id", model.get("model_id", "")),
            label_space=metrics.get("label_space", ""), prompts=metrics.get("prompts", ""),
            easy=_nan(groups["easy"]["acc1_balanced"]), hard=_nan(groups["hard"]["acc1_balanced"]), drop=_nan(drop.get("acc1")),
            easy_ci=_ci(groups["easy"].get("acc1_balanced_ci95")), hard_ci=_ci(groups["hard"].get("acc1_balanced_ci95")),
            drop_ci=_ci(drop.get("acc1_ci95")), n_easy=int(groups["easy"]["n"]), n_hard=int(groups["hard"]["n"]),
        ))
    if runs:
        missing = sorted(set(runs) - {r.run for r in rows})
        if missing:
            raise ValueError(f"no evaluation run with groups named {', '.join(missing)} in {dataset_root}/runs")
    for setup in {r.setup for r in rows}:
        same = [r for r in rows if r.setup == setup]
        er = effective_robustness(np.array([r.easy for r in same]), np.array([r.hard for r in same]))
        for r, value in zip(same, er):
            r.effective_robustness = float(value)
    return rows


def _pct(x: float) -> str:
    return "—" if not np.isfinite(x) else f"{100 * x:.2f}"


def _pct_ci(ci: tuple[float, float]) -> str:
    return "" if not all(np.isfinite(ci)) else f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


COLUMNS = ("model", "label space", "prompts", "easy", "hard", "drop", "effective robustness", "n easy", "n hard", "run")


def to_markdown(rows: Sequence[RunRow]) -> str:
    """Table 2 style: accuracies in %, drop in points, 95% intervals in brackets."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in sorted(rows, key=lambda r: (r.setup, -r.easy)):
        lines.append("| " + " | ".join([
            r.model, r.label_space, r.prompts, _pct(r.easy) + _pct_ci(r.easy_ci), _pct(r.hard) + _pct_ci(r.hard_ci),
            _pct(r.drop) + _pct_ci(r.drop_ci), _pct(r.effective_robustness), str(r.n_easy), str(r.n_hard), r.run,
        ]) + " |")
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[RunRow]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["run", "model", "model_id", "label_space", "prompts", "easy_acc1", "easy_ci_low", "easy_ci_high",
                     "hard_acc1", "hard_ci_low", "hard_ci_high", "drop", "drop_ci_low", "drop_ci_high",
                     "effective_robustness", "n_easy", "n_hard"])
    for r in rows:
        writer.writerow([r.run, r.model, r.model_id, r.label_space, r.prompts, r.easy, *r.easy_ci, r.hard, *r.hard_ci,
                         r.drop, *r.drop_ci, r.effective_robustness, r.n_easy, r.n_hard])
    return buffer.getvalue()


def scatter_png(rows: Sequence[RunRow], title: str = "easy vs hard (balanced top-1, %)") -> bytes:
    """Fig. 2 style: one marker per model, the logit-linear fit per setup, and y = x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.6), dpi=120)
    ax.plot([0, 100], [0, 100], ls="--", color="grey", lw=1, label="y = x (no reliance on background)")
    for setup in sorted({r.setup for r in rows}):
        same = [r for r in rows if r.setup == setup]
        easy = np.array([r.easy for r in same])
        hard = np.array([r.hard for r in same])
        points = ax.scatter(100 * easy, 100 * hard, s=36, zorder=3, label=f"{setup[0]} / {setup[1]}")
        fit = fit_effective_robustness(easy, hard)
        if fit.defined:
            xs = np.linspace(0.005, 0.995, 200)
            ax.plot(100 * xs, 100 * fit.predict(xs), color=points.get_facecolor()[0], lw=1.2,
                    label=f"fit (logit-linear, {fit.n_models} models)")
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


def compare_runs(dataset_root: Path, out_dir: Path | None = None, runs: Sequence[str] | None = None) -> tuple[list[RunRow], Path]:
    """Write compare.md / .csv / .png to ``out_dir`` (default ``DIR/runs/compare``)."""
    rows = load_rows(dataset_root, runs)
    if not rows:
        raise ValueError(f"{dataset_root} has no evaluation runs with easy/hard groups to compare "
                         "(run `curate evaluate` after the split)")
    out_dir = Path(out_dir) if out_dir else Path(dataset_root) / "runs" / "compare"
    write_bytes(out_dir / "compare.md", to_markdown(rows).encode())
    write_bytes(out_dir / "compare.csv", to_csv(rows).encode())
    write_bytes(out_dir / "compare.png", scatter_png(rows))
    return rows, out_dir
