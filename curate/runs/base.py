"""Run folders and the typed record every run kind derives from.

A run is ``DIR/runs/<name>/``: what one stage produced (an evaluation, a split, an explanation,
a fidelity study, ...). Runs are the bus between stages, so each kind is a typed, versioned
record (anchor: FiftyOne's ``BaseRunConfig`` / ``BaseRunResults``): a subclass of
:class:`RunRecord` names its ``KIND``, its ``VERSION``, its file names as class constants, and
implements ``_write_results`` / ``_read``. Readers (compare, report, split, publish, the CLI)
go through :meth:`RunRecord.load` and the record's attributes, never through another stage's
file by key path.

``config.json`` is written LAST: it is the commit marker. A folder without it is an
unfinished run and :func:`list_runs` does not list it. It always holds ``kind``,
``record_version`` and ``curate_version``; a folder written before records existed (no
``record_version``) is read as version 1, whose layout it has.

Naming a run (docs/design.md#run-folders), one rule for every stage: :func:`check_run_name`
refuses a finished run of that name unless ``overwrite``, before any work; an unfinished one (a
killed or interrupted run) is not refused: :func:`prepare_run_dir` replaces it, saying so, and a
stage that keeps partial state resumes it instead. A live writer of the run holds its lock
(:mod:`curate.runs.lock`), which refuses a second writer.
"""
from __future__ import annotations

import abc
import datetime as _dt
import io
import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from curate import __version__
from curate.jsonio import read_json, write_json
from curate.parquetio import read_parquet_file
from curate.runs.registry import register_run_kind, registered, run_kinds

logger = logging.getLogger(__name__)

__all__ = [
    "RUNS_DIR", "CONFIG_FILE", "RunError", "RunRecord", "register_run_kind", "run_kinds", "record_class",
    "list_runs", "load_run", "iter_runs", "read_result_json", "create_run", "check_run_name", "prepare_run_dir",
    "discard_if_empty", "slug", "run_name", "unique_run_name", "write_json", "write_bytes", "write_parquet", "read_parquet",
]

RUNS_DIR = "runs"
CONFIG_FILE = "config.json"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
R = TypeVar("R", bound="RunRecord")


class RunError(ValueError):
    """A run folder that is missing, unfinished, of another kind, or written by a newer curate."""


# ----------------------------------------------------------------------------- names and files
def slug(text: str, limit: int = 60) -> str:
    """A file-name-safe version of ``text`` ("open_clip:ViT-B/32" -> "open_clip-ViT-B-32")."""
    return _SAFE.sub("-", text).strip("-.")[:limit] or "run"


def run_name(kind: str, label: str) -> str:
    """``<kind>-<slug(label)>-<UTC timestamp>``."""
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


def _check_name(name: str) -> None:
    if not name or name != slug(name, limit=200) or name in (".", ".."):
        raise ValueError(f"run name {name!r} must be a plain folder name of letters, digits, '.', '_' or '-'")


def check_run_name(dataset_root: Path, name: str, *, overwrite: bool = False) -> Path:
    """The rule for naming a run, checked before any work; returns ``dataset_root/runs/<name>``.

    ``name`` must be a plain folder name (no separators, no ``..``: ``ValueError``). A finished
    run of that name (its ``config.json``) is refused unless ``overwrite`` (``FileExistsError``).
    A folder without ``config.json`` is an unfinished run (killed or interrupted) and is not
    refused: :func:`prepare_run_dir` replaces it. Writes nothing; a live writer of the run is
    refused by the run's lock (:func:`curate.runs.lock.run_lock`), taken before this check.
    """
    _check_name(name)
    path = Path(dataset_root) / RUNS_DIR / name
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} is a file, not a run folder; choose another --run-name")
    if (path / CONFIG_FILE).exists() and not overwrite:
        raise FileExistsError(f"run {path} exists; choose another --run-name or pass --overwrite")
    return path


def prepare_run_dir(dataset_root: Path, name: str, *, overwrite: bool = False) -> Path:
    """Make ``dataset_root/runs/<name>/`` for a run about to be written.

    The name is checked by :func:`check_run_name`: a finished run of that name is refused unless
    ``overwrite`` (its files are then replaced one by one, atomically); an unfinished one (no
    ``config.json``) is emptied and replaced, with a warning saying so.
    """
    path = check_run_name(dataset_root, name, overwrite=overwrite)
    if path.is_dir() and not (path / CONFIG_FILE).exists():
        logger.warning("run %s in %s is unfinished (no %s: it was interrupted); replacing it", name, path.parent,
                       CONFIG_FILE)
        for entry in path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def discard_if_empty(run_dir: Path) -> None:
    """Remove an unfinished run folder that holds no file (empty subfolders included): what a
    stage that failed or was interrupted before writing anything leaves. Anything else is kept."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or run_dir.is_symlink() or (run_dir / CONFIG_FILE).exists():
        return
    for folder in sorted((p for p in run_dir.rglob("*") if p.is_dir() and not p.is_symlink()),
                         key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    if not any(run_dir.iterdir()):
        run_dir.rmdir()


def create_run(dataset_root: Path, name: str, config: dict[str, Any], *, overwrite: bool = False) -> Path:
    """:func:`prepare_run_dir` and write ``config.json`` now (for runs that are not records)."""
    path = prepare_run_dir(dataset_root, name, overwrite=overwrite)
    write_json(path / CONFIG_FILE, {**config, "curate_version": __version__})
    return path


def write_bytes(path: Path, data: bytes) -> None:
    """Write bytes atomically (the store's hidden-sibling temp file, fsync, rename)."""
    from curate.store.atomic import atomic_write_beside

    atomic_write_beside(Path(path), data)


def write_parquet(path: Path, table: Any) -> None:
    """Write a pyarrow table atomically."""
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    write_bytes(path, buffer.getvalue())


def read_parquet(path: Path, columns: list[str] | None = None) -> Any:
    """Read a parquet file; missing or damaged raises :class:`RunError` naming it."""
    try:
        return read_parquet_file(path, columns)
    except FileNotFoundError:
        raise RunError(f"{path} does not exist (an unfinished run?)") from None
    except Exception as error:  # noqa: BLE001 - pyarrow raises several types for damaged files
        raise RunError(f"{path} is not a readable parquet file ({error})") from None


# ----------------------------------------------------------------------------- the record

class ModelBlock:
    """For records that keep their ``config.json`` as ``self.config``: the ``model`` block it
    records (name, pretrained, model_id, family, info) and its ``model_id``."""

    config: dict[str, Any]

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.config.get("model") or {})

    @property
    def model_id(self) -> str:
        return str(self.model.get("model_id") or "")

class RunRecord(abc.ABC):
    """Base of every run kind: config (what was asked) and results (what came out), versioned.

    Subclasses are dataclasses that set ``KIND``, ``VERSION`` and their file-name constants,
    and implement :meth:`config_dict`, :meth:`_write_results` and :meth:`_read`. ``run_dir``
    is set by :meth:`write` and :meth:`load`.
    """

    KIND: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    CONFIG: ClassVar[str] = CONFIG_FILE

    run_dir: Path | None

    # -- what a subclass provides (abstract: a record kind that lacks one cannot be instantiated)
    @abc.abstractmethod
    def config_dict(self) -> dict[str, Any]:
        """The JSON-ready config (without ``kind`` / versions, which :meth:`write` adds)."""

    @abc.abstractmethod
    def _write_results(self, run_dir: Path) -> None:
        """Write the result files (each atomically)."""

    @classmethod
    @abc.abstractmethod
    def _read(cls: type[R], run_dir: Path, config: dict[str, Any]) -> R:
        """Build the record from ``config`` (already checked and migrated) and the result files."""

    @classmethod
    def migrate(cls, config: dict[str, Any], version: int) -> dict[str, Any]:
        """Bring a ``config`` of an older ``version`` to :attr:`VERSION` (default: unchanged)."""
        return config

    # -- shared behaviour
    @property
    def name(self) -> str:
        """The run folder's name."""
        return self.run_dir.name if self.run_dir is not None else ""

    def write(self, run_dir: Path) -> Path:
        """Write the results, then ``config.json`` (the commit marker); returns ``run_dir``."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self._write_results(run_dir)
        write_json(run_dir / self.CONFIG, {"kind": self.KIND, "record_version": self.VERSION,
                                           "curate_version": __version__, **self.config_dict()})
        self.run_dir = run_dir
        return run_dir

    @classmethod
    def load(cls: type[R], run_dir: Path) -> R:
        """Read a run of this kind; :class:`RunError` when it is unfinished, of another kind or too new."""
        run_dir = Path(run_dir)
        config = read_config(run_dir)
        if config.get("kind") != cls.KIND:
            raise RunError(f"run {run_dir.name} is a {config.get('kind')!r} run, not {cls.KIND!r}")
        version = int(config.get("record_version", 1))
        if version > cls.VERSION:
            raise RunError(f"run {run_dir.name} was written by a newer curate ({cls.KIND} record version {version}, "
                           f"this curate reads up to {cls.VERSION}); upgrade curate")
        if version < cls.VERSION:
            config = cls.migrate(dict(config), version)
        try:
            record = cls._read(run_dir, config)
        except RunError:
            raise
        except (KeyError, TypeError, ValueError) as error:
            raise RunError(f"run {run_dir.name} ({cls.KIND}) is not in the expected shape: {error}") from None
        record.run_dir = run_dir
        return record


def read_result_json(run_dir: Path, name: str, *, required: bool = True, mapping: bool = True) -> Any:
    """A run's JSON result file; :class:`RunError` when it is missing (unfinished run), malformed,
    or (with ``mapping``) not a JSON object. A missing optional file gives ``None``."""
    path = Path(run_dir) / name
    if not path.is_file():
        if required:
            raise RunError(f"run {Path(run_dir).name} has no {name} (unfinished?)")
        return None
    try:
        value = read_json(path)
    except ValueError as error:
        raise RunError(str(error)) from None
    if mapping and not isinstance(value, dict):
        raise RunError(f"{path} does not hold a JSON object")
    return value


def read_config(run_dir: Path) -> dict[str, Any]:
    """A run's ``config.json`` as a dict (:class:`RunError` when missing or malformed)."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise RunError(f"{run_dir} is not a finished run (no {CONFIG_FILE})")
    try:
        config = read_json(path)
    except ValueError as error:
        raise RunError(str(error)) from None
    if not isinstance(config, dict):
        raise RunError(f"{path} does not hold a JSON object")
    return config


# ----------------------------------------------------------------------------- the registry
def record_class(kind: str) -> type[RunRecord]:
    """The record class of ``kind`` (:class:`RunError` for an unknown kind); only that kind's
    module is imported (:mod:`curate.runs.registry`)."""
    cls = registered(kind)
    if cls is None:
        raise RunError(f"unknown run kind {kind!r}; known: {', '.join(sorted(run_kinds()))}")
    return cls


# ----------------------------------------------------------------------------- listing and loading
def list_runs(dataset_root: Path, kind: str | None = None) -> list[Path]:
    """Finished run folders (with a ``config.json``), oldest first; only ``kind`` when given."""
    folder = Path(dataset_root) / RUNS_DIR
    if not folder.is_dir():
        return []
    runs = sorted((p for p in folder.iterdir() if (p / CONFIG_FILE).is_file()), key=lambda p: p.stat().st_mtime)
    if kind is None:
        return runs
    out = []
    for path in runs:
        try:
            if read_config(path).get("kind") == kind:
                out.append(path)
        except RunError as error:
            logger.warning("%s", error)
    return out


def load_run(run_dir: Path) -> RunRecord:
    """The record of any run folder, by the ``kind`` its ``config.json`` names."""
    return record_class(str(read_config(run_dir).get("kind"))).load(run_dir)


def iter_runs(dataset_root: Path, kind: str) -> Iterator[tuple[Path, RunRecord | RunError]]:
    """``(run_dir, record)`` for every run of ``kind``, oldest first; a run that cannot be read
    yields its :class:`RunError` instead, so a reader can list it as a note and go on."""
    cls = record_class(kind)
    for path in list_runs(dataset_root, kind):
        try:
            yield path, cls.load(path)
        except RunError as error:
            yield path, error
