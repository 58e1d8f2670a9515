"""Metrics, each a documented formula with its direction and undefined cases.

Names resolve lazily to their modules, so importing ``curate.metrics`` stays light:
- :mod:`curate.metrics.accuracy`: top-k accuracy, balanced (per-class mean) and unbalanced,
  drop, mean per-class recall (papers/003 App. C.3).
- :mod:`curate.metrics.bootstrap`: seeded bootstrap confidence intervals.
- :mod:`curate.metrics.robustness`: effective robustness (logit-linear fit, Taori et al.).
- :mod:`curate.metrics.spuriousity`: SSS (papers/004 §3.1, App. C) and RMA (papers/000).
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "sss": "curate.metrics.spuriousity",
    "rma": "curate.metrics.spuriousity",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'curate.metrics' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
