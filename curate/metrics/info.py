"""What a metric is, declared once: name, formula, direction, paper, undefined cases.

As torchmetrics declares ``higher_is_better`` on each metric, every curate metric module
declares a :class:`MetricInfo` beside its formula; tables, reports and checks read the
direction from there instead of hard-coding it.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MetricInfo"]


@dataclass(frozen=True)
class MetricInfo:
    """A metric's identity card.

    Attributes:
        name: short name as printed ("acc1", "SSS", "F-Fid+").
        formula: the definition in one line of plain text.
        higher_is_better: the direction (``None`` where neither is "better", e.g. a drop
            that measures reliance rather than quality).
        paper: where the definition comes from ("papers/003 App. C.3").
        nan_reasons: the cases where the metric is undefined and reported as NaN (with a reason).
    """

    name: str
    formula: str
    higher_is_better: bool | None
    paper: str
    nan_reasons: tuple[str, ...] = ()
