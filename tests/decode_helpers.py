"""Counting image decodes on the way in (issue 42): every ``PIL.Image.open`` is counted by the sha256 of
the bytes it opens, so a test can say "each stored image was opened exactly once" for any collector."""
from __future__ import annotations

import hashlib
import io
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from curate.store import Dataset


def count_opens(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Patch ``PIL.Image.open`` (every caller looks it up on the module) to count its calls per sha256 of
    the content opened (a path, bytes in a BytesIO, or any seekable file object); returns the live counter."""
    counts: Counter[str] = Counter()
    real_open = Image.open

    def content(fp: Any) -> bytes | None:
        if isinstance(fp, (str, Path)):
            try:
                return Path(fp).read_bytes()
            except OSError:
                return None
        if isinstance(fp, io.BytesIO):
            return fp.getvalue()
        if hasattr(fp, "read") and hasattr(fp, "seek") and hasattr(fp, "tell"):
            where = fp.tell()
            fp.seek(0)
            data = fp.read()
            fp.seek(where)
            return data if isinstance(data, bytes) else None
        return None

    def counting_open(fp: Any, *args: Any, **kwargs: Any) -> Image.Image:
        data = content(fp)
        if data is not None:
            counts[hashlib.sha256(data).hexdigest()] += 1
        return real_open(fp, *args, **kwargs)

    monkeypatch.setattr(Image, "open", counting_open)
    return counts


def opens_per_stored_image(counts: Counter[str], root: Path) -> dict[str, int]:
    """``sample_id -> times its stored bytes were opened`` for every sample of the dataset at ``root``
    (stored verbatim, as upright 8-bit RGB JPEGs are, the stored bytes are the source's)."""
    table = Dataset.open(root).table(["sample_id", "sha256"])
    return {sid: counts[sha] for sid, sha in zip(table.column("sample_id").to_pylist(),
                                                   table.column("sha256").to_pylist())}
