"""Helpers for the store tests: tiny images in every awkward format, small datasets, and the
writer that tests/test_store.py kills mid-write (run in a subprocess via ``writer_main``)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from curate.labels import LabelSpace
from curate.store import Dataset, NewSample

TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parent
SIZE = (16, 16)


def toy_space() -> LabelSpace:
    return LabelSpace.from_names("toy", ["cat", "dog", "bird"])


def encode(img: Image.Image, fmt: str = "PNG", **kwargs: Any) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def solid_png(color: tuple[int, int, int], size: tuple[int, int] = SIZE) -> bytes:
    """A solid RGB PNG; stored verbatim by the store, so sha256(bytes) is its content hash."""
    return encode(Image.new("RGB", size, color), "PNG")


def color_for(n: int) -> tuple[int, int, int]:
    """A distinct colour for each n < 2**16."""
    return (n % 256, (n // 256) % 256, 77)


def noise_rgb(seed: int, size: tuple[int, int] = SIZE) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)


def rgb_jpeg(seed: int = 0, size: tuple[int, int] = (32, 32), **kwargs: Any) -> bytes:
    return encode(Image.fromarray(noise_rgb(seed, size)), "JPEG", quality=90, **kwargs)


def png16(array: np.ndarray) -> bytes:
    """A 16-bit PNG (gray for H x W, RGB for H x W x 3) written by hand (Pillow cannot write 48-bit)."""
    array = np.asarray(array, dtype=np.uint16)
    height, width = array.shape[:2]
    color_type = 0 if array.ndim == 2 else 2
    raw = b"".join(b"\x00" + array[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def exif_jpeg(orientation: int, size: tuple[int, int] = (24, 12)) -> bytes:
    """A JPEG whose raw pixels are ``size`` with a red block at the top-left, tagged with an
    EXIF orientation."""
    img = Image.new("RGB", size, (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 6, 6))
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(img, "JPEG", quality=95, exif=exif)


def make_dataset(root: Path, n: int = 3, *, masks: bool = True, label_space: LabelSpace | None = None,
                 **create: Any) -> Dataset:
    """A dataset with ``n`` solid-colour samples (classes cycling cat/dog/bird), optionally masked."""
    ds = Dataset.create(root, name="test", label_space=label_space or toy_space(), **create)
    items = []
    for i in range(n):
        mask = np.zeros((SIZE[1], SIZE[0]), np.uint8)
        mask[4:12, 4:12] = 1
        items.append(NewSample(image=solid_png(color_for(1000 + i)), class_index=i % 3, source="synthetic",
                               source_id=f"s{i}", background="grass", background_source="synthetic",
                               mask=mask if masks else None, license="cc0"))
    report = ds.add_samples(items, actor="test")
    assert len(report.added) == n, report
    return ds


def rewrite_parquet(root: Path, transform) -> None:
    """Damage samples.parquet by hand: write ``transform(table)`` in place (not through curate)."""
    path = Path(root) / "samples.parquet"
    table = pq.read_table(path)
    pq.write_table(transform(table), path)


def set_cell(table: pa.Table, column: str, row: int, value: Any, type_: pa.DataType | None = None) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = value
    field_type = type_ or table.schema.field(column).type
    index = table.schema.get_field_index(column)
    return table.set_column(index, pa.field(column, field_type), pa.array(values, type=field_type))


# --------------------------------------------------------------------------- kill-mid-write
def mask_hash(mask: np.ndarray | None) -> str | None:
    return None if mask is None else hashlib.sha256(np.ascontiguousarray(mask, dtype=np.uint8).tobytes()).hexdigest()


def disk_state(ds: Dataset) -> list:
    """What the writer's commits change, read back: rows (sorted) and provenance['writer']['c']."""
    rows = []
    for row in ds.table().to_pylist():
        rows.append([row["sample_id"], row["tags"], row["extra"], row["background_score"], row["status"],
                     mask_hash(ds.load_mask(row["sample_id"]))])
    rows.sort()
    provenance = (ds.config.get("provenance") or {}).get("writer") or {}
    return [rows, provenance.get("c")]


def writer_mask(c: int) -> np.ndarray:
    pattern = (np.arange(SIZE[0] * SIZE[1]) % (c % 5 + 2) == 0).astype(np.uint8)
    return pattern.reshape(SIZE[1], SIZE[0])


def writer_main(root: str, journal: str) -> None:
    """Loop forever committing writes of four kinds; before each commit append to ``journal``
    the full state expected after it ({"c", "expect"}), after it {"c", "done": true}."""
    ds = Dataset.open(root, lock_timeout=30)
    records = []
    if os.path.exists(journal):
        with open(journal, encoding="utf-8") as handle:
            for line in handle:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
    c = max((r["c"] for r in records), default=0)
    rows, prov = disk_state(ds)
    model = {r[0]: r for r in rows}
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(record: dict) -> None:  # no fsync needed: a SIGKILL does not lose written pages
        os.write(fd, ("\n" + json.dumps(record) + "\n").encode())

    print("ready", flush=True)
    while True:
        c += 1
        kind = c % 4
        if kind == 0:
            image = solid_png(color_for(c))
            sid = hashlib.sha256(image).hexdigest()[:16]
            mask = writer_mask(c + 1)
            model[sid] = [sid, [f"c{c}"], json.dumps({"c": c}), float(c), "candidate", mask_hash(mask)]
            log({"c": c, "expect": [sorted(model.values()), prov]})
            ds.add_samples([NewSample(image=image, tags=[f"c{c}"], extra={"c": c}, background_score=c,
                                      mask=mask, source="synthetic")], actor="writer")
        elif kind == 1:
            status = ("candidate", "accepted", "rejected")[c % 3]
            for r in model.values():
                r[1], r[2], r[3], r[4] = [f"c{c}"], json.dumps({"c": c}), float(c), status
            log({"c": c, "expect": [sorted(model.values()), prov]})
            ds.update(list(model), {"tags": [f"c{c}"], "extra": {"c": c}, "background_score": c, "status": status},
                      actor="writer", reason=f"commit {c}")
        elif kind == 2:
            ids = sorted(model)
            sid = ids[c % len(ids)]
            mask = writer_mask(c)
            model[sid][5] = mask_hash(mask)
            log({"c": c, "expect": [sorted(model.values()), prov]})
            ds.set_mask(sid, mask, mask_status="reviewed", actor="writer")
        else:
            prov = c
            log({"c": c, "expect": [sorted(model.values()), prov]})
            ds.record_provenance("writer", {"c": c})
        log({"c": c, "done": True})


if __name__ == "__main__":  # python tests/store_helpers.py ROOT JOURNAL
    sys.path.insert(0, str(REPO_DIR))
    writer_main(sys.argv[1], sys.argv[2])
