"""Large dataset folders built quickly, for tests/test_store_scale.py and benchmarks/store.py.

:func:`build_folder` writes ``n`` distinct 1x1 PNGs (a few dozen bytes each, made by hand: no
Pillow per image) into ``media/`` and the matching rows straight into ``samples.parquet`` with
arrow, skipping image preparation. The folder is a valid curate dataset, deep check included:
every row's ``sha256`` is the hash of its file.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from curate.store import Dataset
from curate.store import schema as S

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


_IHDR = _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
_IEND = _chunk(b"IEND", b"")


def tiny_png(n: int) -> bytes:
    """A 1x1 RGB PNG whose colour encodes ``n`` (distinct for n < 2**24)."""
    pixel = bytes((0, (n >> 16) & 255, (n >> 8) & 255, n & 255))
    return _SIGNATURE + _IHDR + _chunk(b"IDAT", zlib.compress(pixel)) + _IEND


def build_folder(root: Path, n: int, *, start: int = 0, classes: int = 1000) -> Dataset:
    """A dataset of ``n`` rows at ``root`` (ImageNet-1K label space, CounterAnimal backgrounds)."""
    ds = Dataset.create(root, name=f"scale-{n}")
    shas: list[str] = []
    made: set[str] = set()
    for i in range(start, start + n):
        data = tiny_png(i)
        sha = hashlib.sha256(data).hexdigest()
        folder = root / "media" / sha[:2]
        if sha[:2] not in made:
            folder.mkdir(exist_ok=True)
            made.add(sha[:2])
        fd = os.open(folder / f"{sha}.png", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        shas.append(sha)
    os.sync()  # the files are durable before the rows that point at them, as in add_samples
    table = rows_table(shas, start=start, classes=classes, names=ds.label_space.names, backgrounds=ds.backgrounds)
    pq.write_table(table.replace_schema_metadata(S.SCHEMA.metadata), root / "samples.parquet", **S.PARQUET_OPTIONS)
    return Dataset.open(root)


def rows_table(shas: list[str], *, start: int, classes: int, names: list[str], backgrounds: list[str]) -> pa.Table:
    """The rows of :func:`build_folder`: classes and backgrounds cycle, a tenth are accepted."""
    n = len(shas)
    sha = pa.array(shas, type=pa.string())
    ordinal = np.arange(start, start + n)
    class_index = (ordinal % classes).astype(np.int32)
    status = np.where(ordinal % 10 == 0, "accepted", "candidate")
    background = np.asarray(backgrounds, dtype=object)[ordinal % len(backgrounds)]
    added = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    columns = {
        "sample_id": pc.utf8_slice_codeunits(sha, 0, S.SAMPLE_ID_LENGTH),
        "filepath": pc.binary_join_element_wise("media/", pc.utf8_slice_codeunits(sha, 0, 2), "/", sha, ".png", ""),
        "sha256": sha,
        "width": pa.array(np.ones(n, np.int32)),
        "height": pa.array(np.ones(n, np.int32)),
        "source": pa.array(["synthetic"] * n),
        "source_id": pa.array([str(i) for i in ordinal.tolist()]),
        "source_url": pa.nulls(n, pa.string()),
        "license": pa.array(["cc0"] * n),
        "attribution": pa.nulls(n, pa.string()),
        "class_index": pa.array(class_index),
        "class_name": pa.array(np.asarray(names, dtype=object)[class_index].tolist(), type=pa.string()),
        "status": pa.array(status.tolist(), type=pa.string()),
        "reject_reason": pa.nulls(n, pa.string()),
        "background": pa.array(background.tolist(), type=pa.string()),
        "background_source": pa.array(["synthetic"] * n),
        "background_score": pa.nulls(n, pa.float32()),
        "mask_path": pa.nulls(n, pa.string()),
        "mask_status": pa.nulls(n, pa.string()),
        "group": pa.nulls(n, pa.string()),
        "tags": pa.array([[] for _ in range(n)], type=pa.list_(pa.string())),
        "extra": pa.array(["{}"] * n),
        "added_at": pa.array([added] * n, type=pa.timestamp("us", tz="UTC")),
    }
    return pa.table(columns).cast(S.SCHEMA)
