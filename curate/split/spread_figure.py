"""The per-class figure of an annotator-spread run (issue 44): each class's drop under each labelling.

Written by ``curate report`` (:mod:`curate.report`) beside its tables; the run record
(:mod:`curate.runs.annotator_spread`) imports no figure code, as the split's figures live here
beside it (:mod:`curate.split.tables`).
"""
from __future__ import annotations

import io
from typing import Any

__all__ = ["spread_png"]


def spread_png(run: Any, model: str) -> bytes:
    """Per class (one row each), the model's drop (points) under each labelling: the agreed one a
    black diamond, each annotator a coloured dot, the disputed photos in either group a grey bar;
    a flagged class (its easy/hard flips with the labelling) is starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in run.rows() if r.model == model]
    flagged = run.flagged()
    fig, ax = plt.subplots(figsize=(6.4, 0.5 * len(rows) + 1.6), dpi=110)
    others = [n for n in run.spread.labellings if n != run.spread.base]
    colours = plt.get_cmap("tab10")
    for y, r in enumerate(rows):
        bounds = [r.drops.get(n, float("nan")) for n in run.columns if n not in run.spread.labellings]
        finite = [100 * b for b in bounds if b == b]
        if len(finite) == 2:
            ax.plot(finite, [y, y], color="0.7", lw=6, solid_capstyle="butt", zorder=1,
                    label="disputed in either group" if y == 0 else None)
        for k, name in enumerate(others):
            ax.scatter([100 * r.drops.get(name, float("nan"))], [y], color=colours(k % 10), s=30, zorder=2,
                       label=name if y == 0 else None)
        ax.scatter([100 * r.drops.get(run.spread.base, float("nan"))], [y], marker="D", color="black", s=36, zorder=3,
                   label=run.spread.base if y == 0 else None)
    ax.set_yticks(range(len(rows)), [f"{'* ' if r.class_index in flagged else ''}{r.class_name}" for r in rows])
    ax.axvline(0, color="0.5", lw=0.8)
    ax.set_xlabel("drop (easy - hard, points); * = easy/hard flips with the labelling")
    ax.set_title(f"{model}: drop by who labelled", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3, axis="x")
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
