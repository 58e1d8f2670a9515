"""The decomposition figure: per class, the observed drop beside its background part and the rest.

Written by :mod:`curate.stages.attribution` into the run folder and by ``curate report``; the
run record never imports it (docs/design.md#style: records hold data, figures live above them).
"""
from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["decomposition_png"]

#: (statistic, legend label, colour) in the order bars are drawn within a class.
BARS: tuple[tuple[str, str, str], ...] = (("drop", "observed drop D", "tab:red"),
                                          ("background_part", "background part B", "tab:blue"),
                                          ("rest", "rest D - B", "tab:grey"))
MAX_PANELS = 6


def decomposition_png(models: Sequence[Any]) -> bytes:
    """One panel per model (at most :data:`MAX_PANELS`): per class, D, B and the rest in points
    with their 95% paired-bootstrap intervals; the last row is the mean over classes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = list(models)[:MAX_PANELS]
    rows = max((len(m.classes) + 1 for m in shown), default=1)
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(4.2 * max(1, len(shown)), 0.42 * rows + 1.6),
                             dpi=110, squeeze=False, sharey=True)
    for ax, model in zip(axes[0], shown):
        labels = [c.label for c in model.classes] + ["all classes"]
        y = np.arange(len(labels))[::-1].astype(float)
        for offset, (key, label, colour) in zip((0.25, 0.0, -0.25), BARS):  # D on top of its class
            values = [c.values.get(key, math.nan) for c in model.classes] + [model.value(key)]
            cis = [c.intervals.get(key, (math.nan, math.nan)) for c in model.classes] + [model.interval(key)]
            points = 100 * np.array(values, dtype=float)
            low = 100 * np.array([c[0] for c in cis], dtype=float)
            high = 100 * np.array([c[1] for c in cis], dtype=float)
            ax.barh(y + offset, np.nan_to_num(points), height=0.24, color=colour, label=label)
            err = np.vstack([np.nan_to_num(points - low), np.nan_to_num(high - points)])
            ax.errorbar(np.nan_to_num(points), y + offset, xerr=np.clip(err, 0, None), fmt="none", ecolor="black",
                        lw=0.7, capsize=1.5)
        ax.axvline(0, color="black", lw=0.6)
        ax.set_yticks(y, labels, fontsize=7)
        ax.set_title(f"{model.model} ({model.label_space})", fontsize=8)
        ax.set_xlabel("points (95% paired bootstrap)", fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
