"""Parquet in, one way for the whole package: one file read whole or by columns.

``pyarrow.parquet.read_table`` goes through ``pyarrow.dataset`` (built for directories,
partitions and filters), and importing that module imports pandas: about 0.3 s of a 1.3 s
``curate evaluate`` re-score on a quiet 2-core machine. Every file curate reads is one plain
parquet file, so :func:`read_parquet_file` reads it with ``pyarrow.parquet.ParquetFile``,
which gives the same table (schema metadata included) without that import.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["read_parquet_file"]


def read_parquet_file(path: Path | str, columns: Sequence[str] | None = None) -> Any:
    """The ``pyarrow.Table`` in the parquet file ``path`` (only ``columns`` when given).

    Raises what pyarrow raises: ``FileNotFoundError`` for a missing file, ``ArrowInvalid`` and
    friends for a damaged one; callers turn those into their own errors."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as file:
        return file.read(columns=list(columns) if columns is not None else None)
