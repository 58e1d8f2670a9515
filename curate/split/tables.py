"""The split's tables and figures (papers/003 Tables 1 and 5, Figs. 3 and 4).

Rows are anything shaped like :class:`curate.runs.split.SplitClass` (``class_index``,
``class_name``, ``easy``, ``drop``, ``crossfit_drop``, ``p_value``, ...); the figures need only
``class_index`` / ``class_name`` and the counts or drops, so the report can pass its own rows.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from curate.formatting import num, pct, pct_ci

if TYPE_CHECKING:  # pragma: no cover
    from curate.runs.split import SplitRun
    from curate.split.discovery import SplitRule

__all__ = ["cells_csv", "counts_figure", "drops_figure", "rule_text", "significance_advice", "to_csv", "to_markdown"]


def significance_advice(rule: SplitRule) -> str:
    """When to use ``--require-significant`` (stated with every rule)."""
    if rule.require_significant:
        return (f"`--require-significant` is on: a class is kept only when its drop's 95% bootstrap interval is above "
                f"0 and the permutation p-value of the max-min gap is below {rule.alpha:g}; this is stricter than "
                "the paper.")
    return ("This is the paper's rule, which keeps noise too (see the p-values); pass `--require-significant` "
            "when the kept classes will be reported as having a background effect, or when backgrounds have few "
            "images.")


def rule_text(rule: SplitRule) -> str:
    """The rule in words, with curate's departures from the paper stated."""
    return (f"Rule (papers/003 §2.1): for each class, the reference model's accuracy on each background with at least "
            f"{rule.min_per_background} accepted images (`--min-per-background` is a curate addition: the paper "
            f"states no minimum); easy = the background with the highest accuracy, hard = the lowest; keep the class "
            f"when the drop exceeds {rule.min_drop:g} points. " + significance_advice(rule))


def _label(s: Any) -> str:
    return f"{s.class_index} {s.class_name}" + (" (pinned)" if s.pinned else "")


def to_markdown(run: SplitRun) -> str:
    """``split.md``: the rule, the noise summary, the label sources, kept and dropped classes."""
    kept = sorted(run.kept, key=lambda s: -s.drop if np.isfinite(s.drop) else np.inf)
    dropped = run.dropped
    drop = run.reference_drop()
    lines = [f"# Spurious discovery: {len(kept)} classes kept, {len(dropped)} dropped", "",
             rule_text(run.rule), "",
             (f"**{run.noise_summary.text}.** Selection-corrected drop: {run.rule.crossfit_scheme}. The in-sample drop "
             "is measured on the images that chose easy and hard, as in the paper; choosing the best and the worst of "
             "several noisy backgrounds inflates it."), ""]
    if run.label_sources is not None:
        text = run.label_sources.text
        lines.append(f"{text[0].upper()}{text[1:]}.")
    if run.references:
        text = ("Reference model(s): " + ", ".join(f"`{label}`" for label in run.reference_labels)
                + (" (the accuracy of a cell is the mean over them)" if len(run.references) > 1 else ""))
        if np.isfinite(drop.in_sample):
            text += f"; mean drop over the kept classes: {run.reference_drop_text()}"
        lines.append(text + ".")
    lines += ["", ("| class | easy bkg | easy acc | hard bkg | hard acc | drop [95% CI] | cross-fitted drop "
                  "| p (permutation) | n easy | n hard |"),
              "|---|---|---|---|---|---|---|---|---|---|"]
    for s in kept:
        lines.append(f"| {_label(s)} | {s.easy} | {pct(s.easy_acc, 2)} | {s.hard} | {pct(s.hard_acc, 2)} | "
                     f"{pct(s.drop, 2)}{pct_ci(s.drop_ci, 2)} | {pct(s.crossfit_drop, 2)} | {num(s.p_value, 3)} | "
                     f"{s.n_easy} | {s.n_hard} |")
    if dropped:
        lines += ["", "## Dropped classes", "", "| class | reason | drop | cross-fitted drop | p (permutation) |",
                  "|---|---|---|---|---|"]
        for s in dropped:
            lines.append(f"| {_label(s)} | {s.reason} | {pct(s.drop, 2)} | {pct(s.crossfit_drop, 2)} | "
                         f"{num(s.p_value, 3)} |")
    notes = [s for s in run.classes if s.crossfit_note and not s.pinned]
    if notes:
        lines += ["", "Cross-fitting notes: " + "; ".join(f"{_label(s)}: {s.crossfit_note}" for s in notes) + "."]
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[Any]) -> str:
    """``split.csv``: one row per class, fractions as numbers."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["class_index", "class_name", "kept", "reason", "pinned", "easy_background", "easy_acc",
                     "hard_background", "hard_acc", "drop", "drop_ci_low", "drop_ci_high", "p_value", "crossfit_drop",
                     "crossfit_note", "n_easy", "n_hard"])
    for s in rows:
        writer.writerow([s.class_index, s.class_name, s.kept, s.reason, s.pinned, s.easy, s.easy_acc, s.hard,
                         s.hard_acc, s.drop, *s.drop_ci, s.p_value, s.crossfit_drop, s.crossfit_note, s.n_easy, s.n_hard])
    return buffer.getvalue()


def cells_csv(rows: Sequence[Any]) -> str:
    """``cells.csv``: every (class, background) accuracy."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["class_index", "class_name", "background", "n", "accuracy", "ci_low", "ci_high", "eligible"])
    for s in rows:
        for cell in s.cells:
            writer.writerow([s.class_index, s.class_name, cell.background, cell.n, cell.accuracy, *cell.ci, cell.eligible])
    return buffer.getvalue()


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _name(s: Any, names: Sequence[str] | None) -> str:
    return names[s.class_index] if names is not None else str(getattr(s, "class_name", s.class_index))


def counts_figure(kept: Sequence[Any], names: Sequence[str] | None = None) -> bytes:
    """papers/003 Fig. 3: easy and hard sample counts per kept class (rows with ``n_easy``, ``n_hard``;
    class names from ``names[class_index]`` or the rows' ``class_name``)."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(kept) + 2), 4), dpi=110)
    x = np.arange(len(kept))
    ax.bar(x - 0.2, [s.n_easy for s in kept], 0.4, label="easy")
    ax.bar(x + 0.2, [s.n_hard for s in kept], 0.4, label="hard")
    ax.set_xticks(x, [_name(s, names) for s in kept], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("photos")
    ax.set_title("easy and hard photos per class")
    ax.legend()
    return _save(plt, fig)


def drops_figure(kept: Sequence[Any], names: Sequence[str] | None = None) -> bytes:
    """papers/003 Fig. 4: the in-sample accuracy drop (points) per kept class with its interval, and the
    cross-fitted drop as a marker when the rows have one."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(kept) + 2), 4), dpi=110)
    order = sorted(kept, key=lambda s: -s.drop)
    x = np.arange(len(order))
    drops = np.array([100 * s.drop for s in order])
    low = np.array([100 * s.drop_ci[0] for s in order])
    high = np.array([100 * s.drop_ci[1] for s in order])
    ax.bar(x, drops, color="tab:red", alpha=0.8, label="in-sample drop")
    if len(order):
        ax.errorbar(x, drops, yerr=np.vstack([drops - low, high - drops]), fmt="none", ecolor="black", lw=0.8, capsize=2)
    corrected = np.array([100 * float(getattr(s, "crossfit_drop", np.nan)) for s in order])
    if np.isfinite(corrected).any():
        ax.scatter(x, corrected, marker="D", s=14, color="black", zorder=3, label="cross-fitted drop")
        ax.legend(fontsize=7)
    ax.set_xticks(x, [_name(s, names) for s in order], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("easy - hard accuracy (points)")
    ax.set_title("accuracy drop per class (95% bootstrap interval)")
    ax.axhline(0, color="grey", lw=0.8)
    return _save(plt, fig)


def _save(plt, fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
