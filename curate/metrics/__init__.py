"""Metrics, each a documented formula with its direction and undefined cases.

Names resolve lazily to their modules, so importing ``curate.metrics`` stays light:
- :mod:`curate.metrics.accuracy`: top-k accuracy, balanced (per-class mean) and unbalanced,
  drop, mean per-class recall (papers/003 App. C.3).
- :mod:`curate.metrics.bootstrap`: seeded bootstrap confidence intervals.
- :mod:`curate.metrics.robustness`: effective robustness (per family; logit or linear fit, Taori et al.).
- :mod:`curate.metrics.spuriousity`: SSS (papers/004 §3.1, App. C) and RMA (papers/000).
- :mod:`curate.metrics.fidelity`: Fid, R-Fid, F-Fid (papers/002) and the verdicts against a random map.
- :mod:`curate.metrics.split_rule`: the easy/hard split rule (papers/003 §2.1), its p-values and
  cross-fitted drops (also importable as :mod:`curate.split.discovery`).
- :mod:`curate.metrics.projection`: a direction projected out of embeddings (``curate discover``).
- :mod:`curate.metrics.info`: :class:`MetricInfo`, each metric's name, formula, direction and
  undefined cases; :func:`metric_infos` lists them all.

This package holds formulas only: it imports neither the saliency engine nor the stages.
"""
from __future__ import annotations

from curate.lazy import lazy_exports

_LAZY = {
    "topk_correct": "curate.metrics.accuracy",
    "balanced_accuracy": "curate.metrics.accuracy",
    "unbalanced_accuracy": "curate.metrics.accuracy",
    "mean_per_class_recall": "curate.metrics.accuracy",
    "class_accuracies": "curate.metrics.accuracy",
    "class_drops": "curate.metrics.accuracy",
    "mean_drop": "curate.metrics.accuracy",
    "bootstrap_groups": "curate.metrics.bootstrap",
    "bootstrap_mean": "curate.metrics.bootstrap",
    "fit_effective_robustness": "curate.metrics.robustness",
    "effective_robustness": "curate.metrics.robustness",
    "sss": "curate.metrics.spuriousity",
    "rma": "curate.metrics.spuriousity",
    "MetricInfo": "curate.metrics.info",
    "BALANCED_ACCURACY_INFO": "curate.metrics.accuracy",
    "UNBALANCED_ACCURACY_INFO": "curate.metrics.accuracy",
    "DROP_INFO": "curate.metrics.accuracy",
    "EFFECTIVE_ROBUSTNESS_INFO": "curate.metrics.robustness",
    "SSS_INFO": "curate.metrics.spuriousity",
    "RMA_INFO": "curate.metrics.spuriousity",
}


def metric_infos() -> list:
    """Every metric's :class:`MetricInfo` (accuracy, drop, effective robustness, SSS, RMA, fidelity)."""
    import importlib

    from curate.metrics.info import MetricInfo

    infos = []
    for module in ("accuracy", "robustness", "spuriousity", "fidelity"):
        values = vars(importlib.import_module(f"curate.metrics.{module}")).values()
        infos += [v for v in values if isinstance(v, MetricInfo)]
        infos += [i for v in values if isinstance(v, dict) for i in v.values() if isinstance(i, MetricInfo)]
    return list(dict.fromkeys(infos))


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
