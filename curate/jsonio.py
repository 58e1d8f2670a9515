"""JSON in and out, one way for the whole package.

:func:`json_safe` is curate's one sanitiser: numpy scalars and arrays, paths, tuples, sets and
dates become plain Python (via :func:`curate.store.records.to_plain`), and non-finite floats
(NaN, +/-inf) become ``null`` because JSON has no spelling for them (``allow_nan=False``
everywhere, so a file curate writes is strict JSON any tool reads). A reader that needs NaN
back maps ``None`` to NaN where the field is a number (the run records do).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["json_safe", "dumps", "read_json", "write_json"]


def json_safe(value: Any) -> Any:
    """``value`` as strict-JSON-ready Python: plain containers, non-finite floats as ``None``."""
    from curate.store.records import to_plain

    value = to_plain(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def dumps(value: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """Strict JSON text of :func:`json_safe` ``(value)``."""
    return json.dumps(json_safe(value), indent=indent, sort_keys=sort_keys, allow_nan=False, ensure_ascii=False)


def write_json(path: Path, value: Any) -> None:
    """Write :func:`dumps` ``(value)`` atomically (hidden temp file beside it, fsync, rename)."""
    from curate.store.atomic import atomic_write_beside

    atomic_write_beside(Path(path), (dumps(value) + "\n").encode("utf-8"))


def read_json(path: Path) -> Any:
    """Parse a JSON file; a missing or malformed file raises ``ValueError`` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not readable JSON ({error})") from None
