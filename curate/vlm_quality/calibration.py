"""Combining the two scores and judging a score as a warning signal (papers/001 §2.3, §3).

- :func:`combine`: ``avg = (VF + Contr) / 2``, ``prod = VF * Contr``, ``min = min(VF, Contr)``
  (§2.3); NaN when either is NaN.
- :func:`discriminability`: ``Disc = mean(S | correct) - mean(S | wrong)`` with an unpaired
  two-sample t-test (§3; Student's, equal variances, as ``scipy.stats.ttest_ind`` computes it;
  ``equal_var=False`` gives Welch's). Samples whose score is NaN are left out and counted.
- :func:`expected_calibration_error`: the score read as a confidence that the prediction is
  correct (§3, after Guo et al. 2017). ``M`` equal-width bins over [0, 1]: bin 1 is
  ``[0, 1/M]``, bin ``m > 1`` is ``((m-1)/M, m/M]``; ``ECE = sum_m (|B_m| / n) * |acc(B_m) -
  conf(B_m)|`` with ``acc`` the fraction correct and ``conf`` the mean score in the bin; empty bins
  add nothing. Default ``M = 10``.
- :func:`reliability_png`: the reliability diagram (accuracy and mean score per bin, the
  diagonal, and the bin counts).

See ``docs/design.md#explanation-quality``.
"""
from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from curate.metrics.info import MetricInfo

__all__ = ["COMBINATIONS", "combine", "Discriminability", "discriminability", "CalibrationBins",
           "expected_calibration_error", "reliability_png", "DISC_INFO", "ECE_INFO", "DEFAULT_BINS"]

COMBINATIONS = ("avg", "prod", "min")
DEFAULT_BINS = 10

DISC_INFO = MetricInfo(
    name="Disc",
    formula="Disc = mean(score | correct) - mean(score | wrong); unpaired t-test",
    higher_is_better=True,
    paper="papers/001 §3",
    nan_reasons=("no_correct", "no_wrong"),
)
ECE_INFO = MetricInfo(
    name="ECE",
    formula="ECE = sum_m |B_m|/n |acc(B_m) - mean score(B_m)|, M equal-width bins, bin 1 = [0, 1/M], then (a, b]",
    higher_is_better=False,
    paper="papers/001 §3 (Guo et al. 2017)",
    nan_reasons=("no_scores",),
)


def combine(vf: float, contr: float, how: str) -> float:
    """``avg``, ``prod`` or ``min`` of the two scores (papers/001 §2.3); NaN if either is NaN."""
    if how not in COMBINATIONS:
        raise ValueError(f"unknown combination {how!r}; use one of {', '.join(COMBINATIONS)}")
    a, b = float(vf), float(contr)
    if math.isnan(a) or math.isnan(b):
        return float("nan")
    if how == "avg":
        return (a + b) / 2.0
    if how == "prod":
        return a * b
    return min(a, b)


@dataclass
class Discriminability:
    """Mean score on correct predictions minus mean on wrong ones, with the t-test."""

    disc: float
    mean_correct: float
    mean_wrong: float
    n_correct: int
    n_wrong: int
    n_nan: int
    t: float
    p: float
    test: str
    nan_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def stars(self) -> str:
        """``***`` p < 0.001, ``**`` p < 0.01, ``*`` p < 0.05 (papers/001 Table 1)."""
        if not math.isfinite(self.p):
            return ""
        return "***" if self.p < 0.001 else "**" if self.p < 0.01 else "*" if self.p < 0.05 else ""


def _clean(scores: Sequence[float], correct: Sequence[bool]) -> tuple[np.ndarray, np.ndarray, int]:
    s = np.asarray(scores, dtype=np.float64)
    c = np.asarray(correct, dtype=bool)
    if s.shape != c.shape or s.ndim != 1:
        raise ValueError(f"scores and correct must be 1-D of the same length, got {s.shape} and {c.shape}")
    keep = np.isfinite(s)
    return s[keep], c[keep], int((~keep).sum())


def discriminability(scores: Sequence[float], correct: Sequence[bool], *, equal_var: bool = True) -> Discriminability:
    """``Disc`` and the unpaired t-test of scores on correct against wrong predictions (papers/001 §3).

    NaN scores are left out (``n_nan``). With no correct or no wrong prediction ``Disc`` is NaN
    (reason ``no_correct`` / ``no_wrong``); with fewer than two on a side the t-test is NaN.
    """
    from scipy import stats

    s, c, n_nan = _clean(scores, correct)
    on, off = s[c], s[~c]
    test = "Student t (equal variances)" if equal_var else "Welch t"
    nan = float("nan")
    reason = "no_correct" if len(on) == 0 else "no_wrong" if len(off) == 0 else None
    mean_on = float(on.mean()) if len(on) else nan
    mean_off = float(off.mean()) if len(off) else nan
    t = p = nan
    if len(on) >= 2 and len(off) >= 2:
        result = stats.ttest_ind(on, off, equal_var=equal_var)
        t, p = float(result.statistic), float(result.pvalue)
    return Discriminability(mean_on - mean_off if reason is None else nan, mean_on, mean_off, len(on), len(off),
                            n_nan, t, p, test, reason)


@dataclass
class CalibrationBins:
    """ECE and its bins (``edges`` has ``M + 1`` entries; per bin: count, mean score, accuracy)."""

    ece: float
    edges: list[float]
    counts: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    n: int = 0
    n_nan: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bin_index(scores: np.ndarray, bins: int) -> np.ndarray:
    """Bin of each score in [0, 1]: ``ceil(s * M) - 1`` clipped to ``0 .. M-1`` (0 falls in bin 1)."""
    return np.clip(np.ceil(scores * bins).astype(np.int64) - 1, 0, bins - 1)


def expected_calibration_error(scores: Sequence[float], correct: Sequence[bool], *,
                               bins: int = DEFAULT_BINS) -> CalibrationBins:
    """ECE of ``scores`` read as the confidence that each prediction is correct (see the module docstring)."""
    if bins < 1:
        raise ValueError("bins must be >= 1")
    s, c, n_nan = _clean(scores, correct)
    if ((s < 0) | (s > 1)).any():
        raise ValueError("ECE needs scores in [0, 1]")
    edges = [m / bins for m in range(bins + 1)]
    nan = float("nan")
    if len(s) == 0:
        return CalibrationBins(nan, edges, [0] * bins, [nan] * bins, [nan] * bins, 0, n_nan)
    index = bin_index(s, bins)
    counts, conf, acc = [], [], []
    ece = 0.0
    for m in range(bins):
        sel = index == m
        k = int(sel.sum())
        counts.append(k)
        if k:
            conf.append(float(s[sel].mean()))
            acc.append(float(c[sel].mean()))
            ece += k / len(s) * abs(acc[-1] - conf[-1])
        else:
            conf.append(nan)
            acc.append(nan)
    return CalibrationBins(float(ece), edges, counts, conf, acc, int(len(s)), n_nan)


def reliability_png(curves: dict[str, CalibrationBins], title: str = "") -> bytes:
    """A reliability diagram: per score, accuracy against mean score per non-empty bin, the diagonal
    (perfect calibration) and, below, how many samples fall in each bin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bar) = plt.subplots(2, 1, figsize=(5.2, 6.0), gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
    ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfect calibration")
    width = 1.0 / max(len(curves), 1)
    for k, (name, cal) in enumerate(curves.items()):
        xs = [x for x, n in zip(cal.confidence, cal.counts) if n]
        ys = [y for y, n in zip(cal.accuracy, cal.counts) if n]
        ax.plot(xs, ys, marker="o", linewidth=1.2, label=f"{name} (ECE {cal.ece:.3f}, n={cal.n})")
        step = cal.edges[1] - cal.edges[0] if len(cal.edges) > 1 else 1.0
        lefts = [cal.edges[m] + step * width * k for m in range(len(cal.counts))]
        bar.bar(lefts, cal.counts, width=step * width, align="edge", label=name)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("fraction correct in bin")
    ax.set_title(title or "Reliability: score read as confidence that the answer is correct", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    bar.set_xlabel("score (bin mean)")
    bar.set_ylabel("samples")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
