"""Lazy package attributes: one helper instead of a ``__getattr__`` copy per package.

A package keeps its import cheap (no torch, FiftyOne or pyarrow until used) by naming its
public attributes and the modules that define them::

    __getattr__, __dir__ = lazy_exports(__name__, {"Dataset": "curate.store", ...})

A target ``"module:attr"`` exports ``attr`` under another name (e.g. a stage function whose
name is also a subpackage's). The attribute is imported on first access (PEP 562) and cached
in the package's namespace.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` resolving each name of ``exports`` from its module."""
    table = dict(exports)

    def __getattr__(name: str) -> Any:
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = target.partition(":")
        value = getattr(importlib.import_module(module), attr or name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
