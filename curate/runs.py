"""Run folders: ``DIR/runs/<run-name>/`` hold what one evaluation, split or explanation produced.

Every stage that writes results goes through :func:`create_run` so runs look alike: a
``config.json`` (what was asked, with the tool version), result files written atomically, and
a name that is either the user's ``--run-name`` or ``<kind>-<model slug>-<UTC timestamp>``.
"""
from __future__ import annotations

import datetime as _dt
import json
import re
from pathlib import Path
from typing import Any

from curate import __version__

RUNS_DIR = "runs"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def slug(text: str, limit: int = 60) -> str:
    """A file-name-safe version of ``text`` ("open_clip:ViT-B/32" -> "open_clip-ViT-B-32")."""
    return _SAFE.sub("-", text).strip("-.")[:limit] or "run"


def run_name(kind: str, label: str) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{kind}-{slug(label)}-{stamp}"


def unique_run_name(dataset_root: Path, name: str) -> str:
    """``name``, or ``name-2``, ``name-3``... when a run of that name exists."""
    folder = Path(dataset_root) / RUNS_DIR
    candidate, n = name, 1
    while (folder / candidate).exists():
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def create_run(dataset_root: Path, name: str, config: dict[str, Any], *, overwrite: bool = False) -> Path:
    """Make ``dataset_root/runs/<name>/`` and write ``config.json`` there.

    ``name`` must be a plain folder name (no separators, no ``..``). An existing run of that
    name is refused unless ``overwrite`` (then its files are replaced one by one, atomically).
    """
    if not name or name != slug(name, limit=200) or name in (".", ".."):
        raise ValueError(f"run name {name!r} must be a plain folder name of letters, digits, '.', '_' or '-'")
    path = Path(dataset_root) / RUNS_DIR / name
    if path.exists() and not overwrite:
        raise FileExistsError(f"run {path} exists; choose another --run-name or pass --overwrite")
    path.mkdir(parents=True, exist_ok=True)
    write_json(path / "config.json", {**config, "curate_version": __version__})
    return path


def list_runs(dataset_root: Path) -> list[Path]:
    """Run folders that hold a ``config.json``, oldest first."""
    folder = Path(dataset_root) / RUNS_DIR
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if (p / "config.json").is_file()), key=lambda p: p.stat().st_mtime)


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file in the same folder, fsync, rename). NaN becomes null."""
    text = json.dumps(_nan_to_none(data), indent=2, sort_keys=False, allow_nan=False) + "\n"
    write_bytes(Path(path), text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    """Write bytes atomically (the store's hidden-sibling temp file, fsync, rename)."""
    from curate.store.atomic import atomic_write_beside

    atomic_write_beside(Path(path), data)


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value
