"""The audit's tables as rows of text, shared by ``curate audit`` and the demo (one wording).

Every figure says what it is: precision at the top fraction of the ranking, beside the base
rate (what random order gives) and the recall; figures on the synthetic world are against the
planted truth, figures on reviewed data against the reviewers' decisions (docs/design.md#audit).
"""
from __future__ import annotations

from collections.abc import Sequence

from curate.audit.measure import CheckMeasure

MEASURE_COLUMNS: tuple[str, ...] = ("check", "positives (truth)", "n", "random = base rate", "P@5%", "P@10%", "P@20%",
                                    "R@5%", "R@10%", "R@20%", "lift@5%")
SUMMARY_COLUMNS: tuple[str, ...] = ("check", "scored", "failed", "flagged by the library", "tagged suspect:<check>",
                                    "score")


def _pct(x: float) -> str:
    return "—" if x != x else f"{100 * x:.0f}%"


def measure_rows(measures: Sequence[CheckMeasure]) -> list[list[str]]:
    """One row per check (see :data:`MEASURE_COLUMNS`)."""
    rows = []
    for m in measures:
        fractions = sorted(m.precision)
        lift = m.lift(fractions[0]) if fractions else float("nan")
        rows.append([m.check, f"{m.positives} ({m.truth})", str(m.n), _pct(m.base_rate),
                     *[_pct(m.precision[f]) for f in fractions], *[_pct(m.recall[f]) for f in fractions],
                     "—" if lift != lift else f"{lift:.1f}x"])
    return rows


def summary_rows(run) -> list[list[str]]:
    """One row per check of an :class:`curate.runs.AuditRun` (see :data:`SUMMARY_COLUMNS`)."""
    rows = []
    for check in run.checks:
        s = run.summary(check)
        rows.append([check, str(s.scored), str(s.failed), str(s.flagged), str(s.tagged), s.method])
    return rows


def text_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A plain fixed-width table (for logs and the demo's stage messages)."""
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) if rows else len(str(c)) for i, c in enumerate(columns)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(columns), line("-" * w for w in widths), *(line(r) for r in rows)]
