"""Spurious discovery: split each class into an easy and a hard background (papers/003 §2.1).

The rule lives in :mod:`curate.metrics.split_rule`, on the formulas' floor below the run records
that store its results (:mod:`curate.runs.split`; docs/design.md#architecture). This name is kept
for the callers that know it.
"""
from __future__ import annotations

from curate.metrics.split_rule import (
    TIE_DECIMALS,
    TIE_RULE,
    CellStats,
    ClassSplit,
    NoiseSummary,
    SplitRule,
    crossfit_drop,
    discover,
    group_assignments,
    noise_summary,
    permutation_p_value,
    tied_backgrounds,
)

__all__ = ["TIE_RULE", "TIE_DECIMALS", "SplitRule", "CellStats", "ClassSplit", "permutation_p_value", "crossfit_drop",
           "NoiseSummary", "noise_summary", "tied_backgrounds", "discover", "group_assignments"]
