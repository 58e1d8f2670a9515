"""Which record class reads which run kind (docs/design.md#run-folders).

Each record kind registers itself here (:func:`register_run_kind`, a class decorator) when its
module is imported; this module imports none of them. A reader that meets a kind by name (a run
folder's ``config.json``) finds its module in :data:`BUILTIN_KINDS`, a table of module paths that
:func:`registered` imports by name (``importlib``) on first use, so loading a run of one kind
imports that kind's module only, and :func:`curate.runs.base.load_run` needs no import from its caller.
"""
from __future__ import annotations

import importlib
from typing import TypeVar

__all__ = ["BUILTIN_KINDS", "register_run_kind", "registered", "run_kinds"]

C = TypeVar("C", bound=type)

#: kind (``config.json``'s ``kind``) -> the module whose record class registers it.
BUILTIN_KINDS: dict[str, str] = {
    "agreement": "curate.runs.agreement",
    "annotator-spread": "curate.runs.annotator_spread",
    "attribution": "curate.runs.attribution",
    "audit": "curate.runs.audit",
    "discover": "curate.runs.discovery",
    "evaluate": "curate.runs.evaluation",
    "explain": "curate.runs.explain",
    "fidelity": "curate.runs.fidelity",
    "intervene": "curate.runs.interventions",
    "masks": "curate.runs.masks",
    "split": "curate.runs.split",
    "vlm-explain": "curate.runs.vlm_explain",
    "vlm-quality": "curate.runs.vlm_quality",
}

_KINDS: dict[str, type] = {}


def register_run_kind(cls: C) -> C:
    """Class decorator: make ``cls`` (a :class:`curate.runs.base.RunRecord`) the record of ``cls.KIND``."""
    kind = getattr(cls, "KIND", "")
    if not kind:
        raise TypeError(f"{cls.__name__} has no KIND")
    _KINDS[kind] = cls
    return cls


def registered(kind: str) -> type | None:
    """The record class of ``kind``, importing its built-in module when it has not registered yet;
    ``None`` for a kind nobody registers."""
    if kind not in _KINDS and kind in BUILTIN_KINDS:
        importlib.import_module(BUILTIN_KINDS[kind])
    return _KINDS.get(kind)


def run_kinds() -> dict[str, type]:
    """``{kind: record class}`` of every registered run kind, every built-in one imported first."""
    for module in BUILTIN_KINDS.values():
        importlib.import_module(module)
    return dict(_KINDS)
