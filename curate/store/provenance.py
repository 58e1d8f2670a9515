"""The ``provenance`` block of ``dataset.yaml``: which stage has not finished writing the folder.

Below both :mod:`curate.store.validate` (``check_dataset`` reports an unfinished folder as an
error) and :mod:`curate.store.summary` (``curate info`` prints it), so neither imports the other.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["UNFINISHED_KEY", "unfinished"]

#: The key of a ``dataset.yaml`` provenance entry that marks the folder unfinished: a stage that
#: writes a whole folder (``curate intervene``) records, before its first image, the command that
#: finishes it, and drops the key when it is done (docs/design.md#dataset-folder).
UNFINISHED_KEY = "unfinished"


def unfinished(config: Mapping[str, Any] | None) -> list[str]:
    """One line per stage whose provenance in ``config`` (a ``dataset.yaml``) says it has not
    finished writing the folder (:data:`UNFINISHED_KEY`), with the command that finishes it."""
    provenance = (config or {}).get("provenance")
    if not isinstance(provenance, Mapping):
        return []
    return [f"unfinished: `{stage}` has not finished writing this folder (it was interrupted, or is still running); "
            f"to finish it, run the same command again: {entry[UNFINISHED_KEY]}"
            for stage, entry in provenance.items() if isinstance(entry, Mapping) and entry.get(UNFINISHED_KEY)]
