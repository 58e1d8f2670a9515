"""Counts over a dataset: how many images per class, background, group, status, license, source;
and which stage has not finished writing the folder (:func:`unfinished`)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from curate.store.dataset import Dataset

#: The key of a ``dataset.yaml`` provenance entry that marks the folder unfinished: a stage that
#: writes a whole folder (``curate intervene``) records, before its first image, the command that
#: finishes it, and drops the key when it is done (docs/design.md#dataset-folder).
UNFINISHED_KEY = "unfinished"

#: summary key -> column counted. Null values are counted under the key ``None``.
SUMMARY_COLUMNS: dict[str, str] = {
    "class": "class_name",
    "background": "background",
    "group": "group",
    "status": "status",
    "license": "license",
    "source": "source",
}


def summarize(ds: Dataset) -> dict[str, Counter]:
    """``{"class": Counter(class name -> n), "background": ..., "group": ..., "status": ...,
    "license": ..., "source": ...}`` over all rows of ``ds`` (nulls counted under ``None``)."""
    table = ds.table(sorted(set(SUMMARY_COLUMNS.values())))  # never reads extra (Dataset.table)
    return {key: _counts(table.column(column)) for key, column in SUMMARY_COLUMNS.items()}


def _counts(column: pa.ChunkedArray) -> Counter:
    """value -> rows, counted by arrow (``value_counts``; nulls under ``None``), not row by row."""
    counts = pc.value_counts(column)
    return Counter(dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist())))


def unfinished(config: Mapping[str, Any] | None) -> list[str]:
    """One line per stage whose provenance in ``config`` (a ``dataset.yaml``) says it has not
    finished writing the folder (:data:`UNFINISHED_KEY`), with the command that finishes it."""
    provenance = (config or {}).get("provenance")
    if not isinstance(provenance, Mapping):
        return []
    return [f"unfinished: `{stage}` has not finished writing this folder (it was interrupted, or is still running); "
            f"to finish it, run the same command again: {entry[UNFINISHED_KEY]}"
            for stage, entry in provenance.items() if isinstance(entry, Mapping) and entry.get(UNFINISHED_KEY)]
