"""Metrics, each a documented formula with its direction and undefined cases.

Names resolve lazily to their modules, so importing ``curate.metrics`` stays light:
- :mod:`curate.metrics.accuracy`: top-k accuracy, balanced (per-class mean) and unbalanced,
  drop, mean per-class recall (papers/003 App. C.3).
- :mod:`curate.metrics.bootstrap`: seeded bootstrap confidence intervals.
- :mod:`curate.metrics.robustness`: effective robustness (logit-linear fit, Taori et al.).
- :mod:`curate.metrics.spuriousity`: SSS (papers/004 §3.1, App. C) and RMA (papers/000).
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
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
