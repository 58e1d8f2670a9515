"""Numbers as text, one way for tables, reports and cards.

Every figure curate prints goes through these: a missing or non-finite value is an em dash
(never "nan"), fractions become percentages only through :func:`pct`, and intervals are
``[low, high]`` in the same unit as the value they belong to.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["MISSING", "num", "pct", "ci", "pct_ci", "is_finite", "md_table"]

#: What a missing or undefined number prints as.
MISSING = "—"


def is_finite(x: Any) -> bool:
    """True when ``x`` converts to a finite float."""
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def num(x: Any, digits: int = 3, scale: float = 1.0, *, signed: bool = False) -> str:
    """``scale * x`` with ``digits`` decimals (:data:`MISSING` when missing or not finite)."""
    if not is_finite(x):
        return MISSING
    return f"{scale * float(x):{'+' if signed else ''}.{digits}f}"


def pct(x: Any, digits: int = 1, *, signed: bool = False) -> str:
    """A fraction as a percentage without the sign: ``pct(0.8412) == "84.1"``."""
    return num(x, digits, scale=100.0, signed=signed)


def ci(interval: Sequence[Any] | None, digits: int = 3, scale: float = 1.0) -> str:
    """``" [low, high]"`` (leading space) or ``""`` when the interval is missing or not finite."""
    if not interval or len(interval) != 2 or not all(is_finite(v) for v in interval):
        return ""
    return f" [{num(interval[0], digits, scale)}, {num(interval[1], digits, scale)}]"


def pct_ci(interval: Sequence[Any] | None, digits: int = 1) -> str:
    """:func:`ci` of fractions, printed as percentages."""
    return ci(interval, digits, scale=100.0)


def _cell(value: Any) -> str:
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (``|`` in a cell escaped, newlines flattened)."""
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
