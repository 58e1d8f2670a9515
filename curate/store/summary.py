"""Counts over a dataset: how many images per class, background, group, status, license, source;
and which stage has not finished writing the folder (:func:`unfinished`, kept here from
:mod:`curate.store.provenance`, where :mod:`curate.store.validate` reads it too)."""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from curate.store.provenance import UNFINISHED_KEY, unfinished

if TYPE_CHECKING:
    from curate.store.dataset import Dataset

__all__ = ["UNFINISHED_KEY", "SUMMARY_COLUMNS", "summarize", "unfinished"]

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

