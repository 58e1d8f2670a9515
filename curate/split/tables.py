"""The split's figures (papers/003 Figs. 3 and 4), and its tables re-exported from :mod:`curate.runs.split_tables`.

Rows are anything shaped like :class:`curate.runs.split.SplitClass`; the figures need only
``class_index`` / ``class_name`` and the counts or drops, so the report can pass its own rows.
The split stage writes the figures into the run folder (:func:`write_figures`) before the run
record (which writes the text tables and ``config.json`` last); the record never imports this
module, so a run record imports no figure code.
"""
from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from curate.runs.split_tables import cells_csv, rule_text, significance_advice, tie_notes, to_csv, to_markdown

__all__ = ["FIG_COUNTS", "FIG_DROPS", "cells_csv", "counts_figure", "drops_figure", "rule_text", "significance_advice",
           "tie_notes", "to_csv", "to_markdown", "write_figures"]

#: The figure files of a split run folder.
FIG_COUNTS = "fig3_counts.png"
FIG_DROPS = "fig4_drops.png"


def write_figures(run_dir: Path, kept: Sequence[Any]) -> list[Path]:
    """Write Fig. 3 (``fig3_counts.png``) and Fig. 4 (``fig4_drops.png``) of the kept classes into ``run_dir``."""
    from curate.runs.base import write_bytes

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = [run_dir / FIG_COUNTS, run_dir / FIG_DROPS]
    write_bytes(paths[0], counts_figure(kept))
    write_bytes(paths[1], drops_figure(kept))
    return paths


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
