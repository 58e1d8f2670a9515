"""The dataset folder: ``Dataset`` (create, open, add, update, select, read) and ``NewSample``.

Why it is long (one job): every read and write of the folder goes through this one class, under one
lock and one cached table; what stands alone already lives apart (schema, atomic, images, validate, rowscan).

Layout (DESIGN.md, "The dataset on disk")::

    dataset.yaml        name, schema_version, label_space, backgrounds, recipe, provenance
    samples.parquet     one row per image, schema in curate.store.schema
    media/ab/<sha256>.<jpg|png>   images, content-addressed by the sha256 of the stored bytes
    masks/<sample_id>.png         object masks (a replaced mask: masks/<sample_id>.<hash8>.png)
    changes.jsonl       append-only log: time, actor, op, sample_id, field, old, new, reason
    quarantine.jsonl    inputs that were not added: time, actor, source, reason, detail, sha256, copy
    quarantine/<sha256>.bin       a copy of a quarantined input's bytes (up to 64 MiB)

Write ordering (each step atomic, see curate.store.atomic; all under the folder's lock):
1. new media and mask files (content-addressed or new names, so no committed row changes),
   made durable by one barrier (``syncfs``, else an fsync each) before step 2;
2. ``samples.parquet`` replaced whole: this is THE commit point;
3. ``changes.jsonl``: its records are appended just before the rename of step 2, behind a
   write-ahead record that the next writer (or open) settles, so the log holds a commit's lines
   exactly when the commit happened, even after a kill (:mod:`curate.store.changelog`); then
   ``quarantine.jsonl``;
4. replaced mask files no longer referenced are deleted last.
A writer killed at any instant leaves the last committed state (plus unreferenced files, which
are harmless and which validation ignores).

At a million rows (docs/design.md#dataset-folder): opening validates whole columns with arrow
(see :mod:`curate.store.validate`), the sample_id -> row index is built only when a lookup needs
it, an update reads and rewrites only the touched cells in memory (then one atomic rewrite of
samples.parquet, about a second at a million rows), and an add appends chunks instead of
copying the table. Each ``extra`` is parsed when written and on the first open of a file
curate has no record for, not on every open, and the column (most of a collector's table) is
read only when a caller needs it (issue 29; :mod:`curate.store.rowscan`, :meth:`Dataset.table`).
``benchmarks/store.py`` measures it with collector-shaped rows.
"""
from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import logging
import math
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml
from PIL import Image

from curate import __version__
from curate.labels import LabelSpace, imagenet1k
from curate.store import changelog, rowscan
from curate.store import schema as S
from curate.store.atomic import (
    DatasetError,
    DatasetLock,
    LockedError,
    append_jsonl,
    atomic_write,
    atomic_write_bytes,
    clean_dead_temps,
    durability_barrier,
    fsync_dir,
    read_jsonl,
)
from curate.store.images import (
    QUARANTINE_REASONS,
    ImageRejected,
    MaskInput,
    PreparedImage,
    prepare_image,
    prepare_mask,
)
from curate.store.records import AddReport, NewSample, iso_time, now_utc, to_plain, yaml_ready
from curate.store.validate import (
    CHANGES_FILE,
    CONFIG_FILE,
    MASKS_DIR,
    MEDIA_DIR,
    QUARANTINE_FILE,
    SAMPLES_FILE,
    ValidationProblem,
    background_problem,
    inspect_dataset,
    read_samples_file,
    safe_relpath,
)

log = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"
#: Inputs larger than this are recorded in quarantine.jsonl without a copy of their bytes.
QUARANTINE_COPY_LIMIT = 64 * 1024 * 1024
#: How many problems a DatasetError message lists before "... and N more".
_MAX_LISTED = 20


def _format_problems(root: Path, problems: list[ValidationProblem]) -> str:
    lines = [f"dataset at {root} is invalid ({len(problems)} problem{'s' if len(problems) != 1 else ''}):"]
    lines += [f"  {p}" for p in problems[:_MAX_LISTED]]
    if len(problems) > _MAX_LISTED:
        lines.append(f"  ... and {len(problems) - _MAX_LISTED} more")
    lines.append("Fix these (or restore the folder from a copy); "
                 "curate.store.check_dataset(root) lists every problem.")
    return "\n".join(lines)


def _tidy_after_kill(root: Path) -> None:
    """What a killed writer can leave, tidied when a folder is opened: temporary files of dead
    processes, and a commit in flight (settled when the lock is free now; else its holder, or the
    next writer, settles it). A read-only folder is left as it is."""
    clean_dead_temps(root)
    if not (root / changelog.PENDING_FILE).exists():
        return
    try:
        with DatasetLock(root, timeout=0).hold("settling the change log"):
            changelog.settle(root)
    except (LockedError, OSError):
        pass


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class Dataset:
    """A dataset folder on disk, the single source of truth (see the module docstring).

    Make one with :meth:`create`, open one with :meth:`open` (which validates). Reads see the
    latest committed state (the table is re-read when another process committed). Writes
    (:meth:`add_samples`, :meth:`update`, :meth:`set_mask`, :meth:`record_provenance`) take the
    folder's lock for ``lock_timeout`` seconds at most, then raise :class:`LockedError`.
    """

    def __init__(self, root: Path, config: dict[str, Any], table: pa.Table, *, lock_timeout: float = 10.0,
                 stamp: tuple[int, int, int] | None = None) -> None:
        """``table``: the rows of samples.parquet as read at ``stamp`` (default: the file now); it
        may lack ``extra``, which is then read from that file when first needed (:meth:`table`)."""
        self._root = Path(root).absolute()
        self._lock = DatasetLock(self._root, timeout=lock_timeout)
        self._carry_files = False
        self._set_config(config)
        self._set_table(table, stamp if stamp is not None else _stamp(self._root / SAMPLES_FILE))

    # ------------------------------------------------------------------ create / open
    @classmethod
    def create(
        cls,
        root: str | Path,
        name: str = "dataset",
        label_space: LabelSpace | None = None,
        backgrounds: Sequence[str] | None = None,
        recipe: str | None = None,
        exist_ok: bool = False,
        *,
        lock_timeout: float = 10.0,
    ) -> Dataset:
        """Make a new, empty dataset folder at ``root`` and return it.

        ``label_space`` defaults to ImageNet-1K, ``backgrounds`` to the CounterAnimal vocabulary
        (:data:`~curate.store.schema.DEFAULT_BACKGROUNDS`). The folder is built beside ``root``
        and renamed into place, so it appears whole or not at all. ``root`` may be missing or an
        empty folder. With ``exist_ok=True`` an existing dataset there is opened instead.
        """
        root = Path(root)
        if (root / CONFIG_FILE).exists():
            if exist_ok:
                ds = cls.open(root, lock_timeout=lock_timeout)
                wanted_space = (label_space if label_space is not None else imagenet1k()).to_config()
                if ds.name != name or ds.config.get("label_space") != wanted_space:
                    log.warning("%s already holds dataset %r (label space %s); opened it as it is",
                                root, ds.name, ds.label_space.name)
                return ds
            raise DatasetError(f"{root} already holds a dataset; open it with Dataset.open(root) "
                               "or pass exist_ok=True")
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise DatasetError(f"{root} exists and is not an empty folder nor a dataset; "
                               "choose a new path or empty it")
        if not isinstance(name, str) or not name.strip():
            raise DatasetError("a dataset needs a non-empty name")
        space = label_space if label_space is not None else imagenet1k()
        vocabulary = list(backgrounds) if backgrounds is not None else list(S.DEFAULT_BACKGROUNDS)
        problem = background_problem(vocabulary)
        if problem:
            raise DatasetError(problem)
        config: dict[str, Any] = {
            "name": name,
            "schema_version": S.SCHEMA_VERSION,
            "created_at": iso_time(),
            "curate_version": __version__,
            "label_space": space.to_config(),
            "backgrounds": vocabulary,
            "recipe": recipe,
            "provenance": {},
        }
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = root.parent / f".{root.name}.creating-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            table = S.empty_table()
            cls._write_table_file(staging, table)
            cls._write_config_file(staging, config)
            for sub in (MEDIA_DIR, MASKS_DIR):
                (staging / sub).mkdir()
            fsync_dir(staging)
            try:
                os.replace(staging, root)  # an empty existing folder is replaced atomically
            except OSError as exc:
                raise DatasetError(f"cannot create {root}: {exc} (was it created meanwhile?)") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        fsync_dir(root.parent)
        rowscan.remember_extras_valid(root, rowscan.samples_identity(root))  # no rows: nothing to parse
        log.info("created dataset %r at %s (%s, %d backgrounds)", name, root, space.name, len(vocabulary))
        return cls(root, config, table, lock_timeout=lock_timeout)

    @classmethod
    def open(
        cls, root: str | Path, *, validate: bool = True, deep: bool = False, lock_timeout: float = 10.0
    ) -> Dataset:
        """Open the dataset at ``root``, validating it (see :mod:`curate.store.validate`).

        Raises :class:`DatasetError` listing each problem as "row N (sample ID): what is wrong"
        (``.problems`` holds them all). ``validate=False`` skips the row checks (for repair
        tools); ``deep=True`` also re-hashes every image.

        Each ``extra`` is parsed (streamed, not kept) only when this samples.parquet is new to
        curate (no record in ``.curate.extracheck.json`` names it); otherwise the column is not
        read until a caller needs it (:meth:`table`). A hand-corrupted ``extra`` is still
        reported here: a write that is not curate's makes a file the record does not name (see
        docs/design.md#dataset-folder).
        """
        root = Path(root)
        _tidy_after_kill(root)
        stamp = _stamp(root / SAMPLES_FILE)  # before the read: a file replaced since is read again
        inspection = inspect_dataset(root, deep=deep)
        errors = inspection.errors
        if errors and (validate or inspection.config is None or inspection.table is None):
            raise DatasetError(_format_problems(root, errors), errors)
        for warning in inspection.problems:
            if warning.severity == "warning":
                log.warning("%s: %s", root, warning)
        if inspection.label_space is None or inspection.backgrounds is None:
            raise DatasetError(_format_problems(root, errors), errors)
        assert inspection.config is not None and inspection.table is not None
        return cls(root, inspection.config, inspection.table, lock_timeout=lock_timeout, stamp=stamp)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle as (root, config, lock timeout); unpickling (e.g. in a DataLoader worker)
        re-reads samples.parquet instead of copying the table through the pipe."""
        return {"root": self._root, "config": self._config, "lock_timeout": self._lock.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._root = Path(state["root"]).absolute()
        self._lock = DatasetLock(self._root, timeout=state["lock_timeout"])
        self._carry_files = False
        self._set_config(state["config"])
        self._reload_table()

    # ------------------------------------------------------------------ properties
    @property
    def root(self) -> Path:
        return self._root

    @property
    def name(self) -> str:
        return str(self._config.get("name"))

    @property
    def config(self) -> dict[str, Any]:
        """A copy of ``dataset.yaml``'s content (edit the folder through the methods)."""
        self._refresh_config()
        return copy.deepcopy(self._config)

    @property
    def label_space(self) -> LabelSpace:
        return self._label_space

    @property
    def backgrounds(self) -> list[str]:
        return list(self._config["backgrounds"])

    @property
    def provenance(self) -> dict[str, Any]:
        return self.config.get("provenance") or {}

    def __len__(self) -> int:
        return self._current().num_rows

    def __contains__(self, sample_id: object) -> bool:
        self._current()
        return isinstance(sample_id, str) and sample_id in self._index

    def __repr__(self) -> str:
        return f"Dataset({str(self._root)!r}, name={self.name!r}, samples={len(self)})"

    # ------------------------------------------------------------------ reading
    def table(self, columns: Sequence[str] | None = None) -> pa.Table:
        """All rows (the latest committed ``samples.parquet``), with :data:`SCHEMA`; ``columns``:
        only those, in that order. Asking for no ``extra`` never reads it: the column is read
        from the file when first needed (docs/design.md#dataset-folder)."""
        if columns is None:
            self._current()
            return self._table
        columns = list(columns)
        unknown = [c for c in columns if c not in S.COLUMN_BY_NAME]
        if unknown:
            raise DatasetError(f"no column {', '.join(map(repr, unknown))} in samples.parquet")
        table = self._current()
        if "extra" in columns and "extra" not in table.column_names:
            table = self._table
        return table.select(columns)

    def sample_ids(self) -> list[str]:
        return list(self._current().column("sample_id").to_pylist())

    def row(self, sample_id: str) -> dict[str, Any]:
        """One row as a dict (raises :class:`DatasetError` for an unknown id)."""
        table = self.table()
        return table.slice(self._row_index(sample_id), 1).to_pylist()[0]

    def rows(self, **conditions: Any) -> list[dict[str, Any]]:
        """:meth:`select` as a list of dicts."""
        return self.select(**conditions).to_pylist()

    def select(self, **conditions: Any) -> pa.Table:
        """Rows matching every condition (AND), in file order.

        ``column=value`` (equal), ``column=[v1, v2]`` / tuple / set (any of; include ``None`` to
        also match null), ``column=None`` (is null), ``column=callable`` (``callable(value)`` is
        true). For ``tags``: a string matches rows having that tag, a list rows having any of them.
        """
        mask = self._condition_mask(conditions)
        table = self.table()
        return table if mask is None else table.filter(mask)

    def ids(self, **conditions: Any) -> list[str]:
        """The sample ids of :meth:`select` (``extra`` is read only to match a condition on it)."""
        mask = self._condition_mask(conditions)
        ids = self._current().column("sample_id")
        return (ids if mask is None else ids.filter(mask)).to_pylist()

    def _condition_mask(self, conditions: Mapping[str, Any]) -> pa.ChunkedArray | pa.Array | None:
        """Per row, whether every condition of :meth:`select` holds (None: no condition)."""
        table = self._table if "extra" in conditions else self._current()
        mask: pa.ChunkedArray | pa.Array | None = None
        for column, condition in conditions.items():
            if column not in S.COLUMN_BY_NAME:
                raise DatasetError(f"select: unknown column {column!r} (columns: {', '.join(S.COLUMN_NAMES)})")
            try:
                matched = _match(table.column(column), column, condition)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as exc:
                raise DatasetError(f"select: cannot compare column {column!r} "
                                   f"({table.schema.field(column).type}) with {condition!r}: {exc}") from None
            mask = matched if mask is None else pc.and_(mask, matched)
        return mask

    def image_path(self, sample_id_or_row: str | int | Mapping[str, Any]) -> Path:
        """Absolute path of a sample's image; refuses a ``filepath`` that escapes the folder."""
        rel = self._field_of(sample_id_or_row, "filepath")
        return self._safe_path(rel, MEDIA_DIR, "filepath")

    def image_paths(self, sample_ids_or_rows: Iterable[str | int | Mapping[str, Any]]) -> list[Path]:
        """:meth:`image_path` of many samples at once (the encode path calls this once per run).

        The same paths and the same refusals as :meth:`image_path`, at a fraction of the cost
        (0.37 ms per image there: pathlib and a ``stat`` per path component per row):

        - ids are looked up in the cached id index and their ``filepath`` taken in one
          ``take`` on the column (rows that carry ``filepath`` use it);
        - each path is checked with string operations; one a quick check doubts gets
          :func:`safe_relpath`'s verdict and message;
        - symlinks: each distinct folder (``media/ab``) is resolved once and must lie inside
          the dataset folder, and listed once (``os.scandir``: no ``stat`` per file); only the
          entries that are symlinks are resolved one by one and must lie inside it too. A path
          with no entry (a missing file) is returned, as :meth:`image_path` returns it (opening
          it fails, per sample). So no path from the data escapes the folder.

        Raises :class:`DatasetError` on the first refused path or unknown id.
        """
        keys = list(sample_ids_or_rows)
        rels: list[Any] = [None] * len(keys)
        lookup: list[int] = []
        positions: list[int] = []
        index = None
        for i, key in enumerate(keys):
            if isinstance(key, Mapping):
                if "filepath" in key:
                    rels[i] = key["filepath"]
                    continue
                if "sample_id" not in key:
                    raise DatasetError(f"a row needs 'filepath' or 'sample_id', got keys {sorted(key)}")
                key = key["sample_id"]
            if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
                row = int(key)
                if not 0 <= row < self._current().num_rows:
                    raise DatasetError(f"row {key} is outside 0..{self._current().num_rows - 1}")
            else:
                if index is None:
                    self._current()
                    index = self._index
                try:
                    row = index[key]
                except (KeyError, TypeError):
                    raise DatasetError(f"no sample {key!r} in {self._root}") from None
            lookup.append(row)
            positions.append(i)
        if lookup:
            taken = self._current().column("filepath").take(pa.array(lookup, pa.int64())).to_pylist()
            for i, rel in zip(positions, taken):
                rels[i] = rel
        prefix = MEDIA_DIR + "/"
        root = self._root
        real_root = root.resolve()
        folders: dict[str, set[str]] = {}  # folder -> names in it that are symlinks
        out: list[Path] = []
        for rel in rels:
            if not (isinstance(rel, str) and rel.startswith(prefix) and "\\" not in rel and "//" not in rel
                    and "/./" not in rel and "/../" not in rel and not rel.endswith(("/.", "/..", "/"))):
                self._safe_path(rel, MEDIA_DIR, "filepath")  # refuses with image_path's message, or passes
            folder, _, name = rel.rpartition("/")
            links = folders.get(folder)
            if links is None:
                real = (root / folder).resolve()
                if not real.is_relative_to(real_root):
                    raise DatasetError(f"filepath {rel!r} resolves outside the dataset folder (a symlink?)")
                try:
                    with os.scandir(root / folder) as entries:
                        links = {entry.name for entry in entries if entry.is_symlink()}
                except OSError:  # no such folder: nothing in it to follow
                    links = set()
                folders[folder] = links
            if name in links and not (root / rel).resolve().is_relative_to(real_root):
                raise DatasetError(f"filepath {rel!r} resolves outside the dataset folder (a symlink?)")
            out.append(root / rel)
        return out

    def mask_path(self, sample_id_or_row: str | int | Mapping[str, Any]) -> Path | None:
        """Absolute path of a sample's mask, or None when it has none."""
        rel = self._field_of(sample_id_or_row, "mask_path")
        return None if rel is None else self._safe_path(rel, MASKS_DIR, "mask_path")

    def load_image(self, sample_id: str | int | Mapping[str, Any]) -> Image.Image:
        """The stored image as an 8-bit RGB PIL image (fully loaded, file closed)."""
        path = self.image_path(sample_id)
        with Image.open(path) as img:
            return img.convert("RGB")

    def load_mask(self, sample_id: str | int | Mapping[str, Any]) -> np.ndarray | None:
        """The sample's mask as an H x W uint8 array (0/1 or instance ids), or None."""
        path = self.mask_path(sample_id)
        if path is None:
            return None
        with Image.open(path) as img:
            return np.array(img, dtype=np.uint8)

    def samples_files(self) -> list[Path]:
        """The parquet files that hold the current rows (today one, ``samples.parquet``), for
        engines that read the table themselves (Ray Data, DuckDB, Spark). Read them as they are:
        a file is replaced whole on every commit, never changed in place, so a reader that opened
        it sees one committed state; write only through this class."""
        return [self._root / SAMPLES_FILE]

    def changes(self, sample_id: str | None = None) -> list[dict[str, Any]]:
        """The records of ``changes.jsonl`` (optionally for one sample), oldest first."""
        records, _ = read_jsonl(self._root / CHANGES_FILE)
        return records if sample_id is None else [r for r in records if r.get("sample_id") == sample_id]

    def quarantine(self) -> list[dict[str, Any]]:
        """The records of ``quarantine.jsonl``, oldest first."""
        return read_jsonl(self._root / QUARANTINE_FILE)[0]

    # ------------------------------------------------------------------ writing
    @contextmanager
    def locked(self, purpose: str = "write") -> Iterator[Dataset]:
        """Hold the folder's writer lock across several writes (re-entrant in this thread)."""
        with self._lock.hold(purpose):
            yield self

    def add_samples(
        self,
        items: Iterable[NewSample],
        actor: str = "curate",
        *,
        strict: bool = False,
        commit_every: int = 1000,
    ) -> AddReport:
        """Verify, store and append new samples; returns an :class:`AddReport`.

        Each image is fully decoded and converted as :func:`curate.store.images.prepare_image`
        describes (a verified :class:`~curate.store.images.PreparedImage`, which a collector's
        engine hands over, was decoded once already and is stored as it is); its ``sample_id`` is
        the first 16 hex digits of the stored bytes' sha256.
        Content already in the dataset (or earlier in ``items``) is reported as a duplicate and
        not added again, so re-running a collection is idempotent. An input that fails (bad
        image, mask, class or field value) is quarantined: listed in the report and recorded in
        ``quarantine.jsonl`` (with a copy of its bytes under ``quarantine/``), never half-added;
        with ``strict=True`` it raises :class:`DatasetError` instead (nothing from the
        uncommitted part of the batch is added). Rows are committed every ``commit_every``
        samples, so an interrupted long ingestion keeps what it committed.
        """
        report = AddReport()
        quarantine_records: list[dict[str, Any]] = []
        with self._lock.hold("add_samples"):
            self._refresh_all()
            self._carry_files = rowscan.files_unchanged(self._root, None)
            known_sha = dict(zip(self._table.column("sha256").to_pylist(), self._table.column("sample_id").to_pylist()))
            batch_sha: dict[str, int] = {}
            pending: list[dict[str, Any]] = []
            pending_ids: set[str] = set()
            new_files: list[Path] = []
            new_dirs: set[Path] = set()
            for position, item in enumerate(items):
                if not isinstance(item, NewSample):
                    raise DatasetError(f"add_samples expects NewSample items, item {position} is "
                                       f"{type(item).__name__}")
                try:
                    row, prepared = self._prepare(item)
                    sid = row["sample_id"]
                    if prepared.sha256 in known_sha:
                        report.duplicates.append((known_sha[prepared.sha256], "already in the dataset"))
                        continue
                    if prepared.sha256 in batch_sha:
                        report.duplicates.append(
                            (sid, f"same content as item {batch_sha[prepared.sha256]} of this call"))
                        continue
                    if sid in self._index or sid in pending_ids:
                        raise ImageRejected("id_collision", f"sample_id {sid} is taken by a different image")
                    mask_bytes = (
                        prepare_mask(item.mask, (prepared.width, prepared.height)) if item.mask is not None else None
                    )
                except ImageRejected as exc:
                    if strict:
                        raise DatasetError(f"cannot add {item.describe(position)}: {exc}") from None
                    report.quarantined.append((item.describe(position), str(exc)))
                    quarantine_records.append(self._quarantine_record(item, position, exc, actor))
                    continue
                self._store_media(row["filepath"], prepared.data, new_files, new_dirs)
                if mask_bytes is not None:
                    row["mask_path"] = S.mask_relpath(sid)
                    target = self._root / row["mask_path"]
                    atomic_write_bytes(self._root, target, mask_bytes, fsync=False, sync_dir=False)
                    new_files.append(target)
                    new_dirs.add(target.parent)
                if prepared.conversions:
                    log.debug("%s stored as %s after %s", item.describe(position), sid, ", ".join(prepared.conversions))
                batch_sha[prepared.sha256] = position
                pending.append(row)
                pending_ids.add(sid)
                if len(pending) >= max(1, commit_every):
                    self._commit_new_rows(pending, new_files, new_dirs, actor, report)
                    pending, pending_ids, new_files, new_dirs = [], set(), [], set()
            if pending:
                self._commit_new_rows(pending, new_files, new_dirs, actor, report)
            if quarantine_records:
                self._append_quarantine(quarantine_records)
        if report.quarantined:
            log.warning("%s: %d input(s) quarantined (see %s)", self._root, len(report.quarantined), QUARANTINE_FILE)
        log.info("%s: %s", self._root, report)
        return report

    def quarantine_input(self, item: NewSample, code: str, detail: str, actor: str = "curate") -> None:
        """Record an input that a collector refused before it reached :meth:`add_samples` (e.g. an
        archive member whose metadata does not parse) in ``quarantine.jsonl``, with a copy of its
        bytes, exactly as :meth:`add_samples` records the inputs it refuses. ``code`` is a key of
        :data:`~curate.store.images.QUARANTINE_REASONS`."""
        if code not in QUARANTINE_REASONS:
            raise DatasetError(f"unknown quarantine reason {code!r} (known: {', '.join(QUARANTINE_REASONS)})")
        with self._lock.hold("quarantine"):
            self._append_quarantine([self._quarantine_record(item, 0, ImageRejected(code, detail), actor)])

    def update(
        self,
        sample_ids: Sequence[str] | str,
        values: Mapping[str, Any] | None = None,
        *,
        per_sample: Mapping[str, Mapping[str, Any]] | None = None,
        actor: str,
        reason: str = "",
    ) -> int:
        """Set fields of existing samples; returns how many samples actually changed.

        ``values`` applies to every id in ``sample_ids``; ``per_sample[id]`` applies to that id
        (and overrides ``values`` for it; its ids need not be in ``sample_ids``). Every value is
        checked against the schema and the dataset's vocabularies before anything is written;
        any problem raises :class:`DatasetError` and changes nothing. Setting ``class_index``
        sets ``class_name`` (and vice versa). ``extra`` takes a mapping (or JSON text) and
        replaces the stored object. Identity columns (sample_id, filepath, sha256, width,
        height, mask_path, added_at) cannot be set; masks change through :meth:`set_mask`.
        Only fields whose value changes are written and logged to ``changes.jsonl``.
        """
        if isinstance(sample_ids, str):
            sample_ids = [sample_ids]
        if not isinstance(actor, str) or not actor:
            raise DatasetError("update needs an actor (who or what makes the change)")
        plan: dict[str, dict[str, Any]] = {sid: dict(values or {}) for sid in sample_ids}
        for sid, fields in (per_sample or {}).items():
            plan.setdefault(sid, {}).update(fields)
        plan = {sid: fields for sid, fields in plan.items() if fields}
        if not plan:
            return 0
        with self._lock.hold("update"):
            self._refresh_all()
            missing = [sid for sid in plan if sid not in self._index]
            if missing:
                shown = ", ".join(map(str, missing[:5])) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                raise DatasetError(f"update: unknown sample id(s) {shown} in {self._root}; nothing was changed")
            normalized: dict[str, dict[str, Any]] = {}
            errors: list[str] = []
            for sid, fields in plan.items():
                try:
                    normalized[sid] = self._normalize_update(fields)
                except S.ValueProblem as exc:
                    errors.append(f"sample {sid}: {exc}")
            if errors:
                raise DatasetError("update refused, nothing was changed:\n  " + "\n  ".join(errors[:_MAX_LISTED]))
            table, records, changed = self._apply(normalized, actor=actor, reason=reason)
            if records:
                carry = rowscan.files_unchanged(self._root, None)
                self._commit_table(table, self._index, records)  # same rows in the same order
                if carry:  # no image was added or removed: the last presence check still holds
                    rowscan.carry_forward(self._root)
        if changed:
            log.info("%s: %s changed %d sample(s), %d field value(s)%s", self._root, actor, changed, len(records),
                     f" ({reason})" if reason else "")
        return changed

    def set_mask(
        self,
        sample_id: str,
        mask: MaskInput | None,
        *,
        mask_status: str | None = None,
        actor: str,
        reason: str = "",
    ) -> None:
        """Give a sample a mask (or remove it with ``mask=None``), atomically.

        A first mask goes to ``masks/<sample_id>.png``; a replacement to
        ``masks/<sample_id>.<hash8>.png`` so the committed row never points at a half-new
        mask; the old file is deleted after the commit. Logged like :meth:`update`.
        One sample of :meth:`set_masks`.
        """
        self.set_masks({sample_id: mask}, mask_status=None if mask_status is None else {sample_id: mask_status},
                       clear_status=mask is None and mask_status is None, actor=actor, reason=reason)

    def set_masks(
        self,
        masks: Mapping[str, MaskInput | None],
        *,
        mask_status: Mapping[str, str | None] | str | None = None,
        extra_updates: Mapping[str, Mapping[str, Any]] | None = None,
        clear_status: bool = False,
        actor: str,
        reason: str = "",
    ) -> int:
        """Give many samples a mask (or remove it: ``None``) in ONE commit of the table.

        Every mask is checked against its image's size before anything is written (a wrong
        size refuses the whole call, nothing changed); then the mask files are written
        (atomically, a replacement under a new name as in :meth:`set_mask`), the table is
        committed once and the changes logged; replaced files are deleted after the commit.
        ``mask_status``: one status for all, or per sample (absent ids keep theirs; a removed
        mask keeps its status unless ``clear_status``). ``extra_updates[id]`` merges keys into
        that row's ``extra`` object under the same lock (a value of None deletes the key).
        Returns how many samples changed. (10,000 masks cost one table commit, not 10,000:
        benchmarks/masks.py.)
        """
        if not isinstance(actor, str) or not actor:
            raise DatasetError("set_masks needs an actor (who or what makes the change)")
        statuses: dict[str, str | None] = (
            dict(mask_status) if isinstance(mask_status, Mapping)
            else ({} if mask_status is None else {sid: mask_status for sid in masks}))
        if not masks and not extra_updates and not statuses:
            return 0
        with self._lock.hold("set_masks"):
            self._refresh_all()
            ids = list(dict.fromkeys([*masks, *statuses, *(extra_updates or {})]))
            missing = [sid for sid in ids if sid not in self._index]
            if missing:
                raise DatasetError(f"set_masks: unknown sample id(s) {', '.join(map(str, missing[:5]))} in "
                                   f"{self._root}; nothing was changed")
            positions = pa.array([self._index[sid] for sid in ids], type=pa.int64())
            current = self._table.select(["sample_id", "width", "height", "mask_path", "extra"]).take(positions)
            rows = {r["sample_id"]: r for r in current.to_pylist()}
            plan: dict[str, dict[str, Any]] = {}
            data_of: dict[str, bytes] = {}
            errors: list[str] = []
            for sid, mask in masks.items():
                row = rows[sid]
                if mask is None:
                    plan[sid] = {"mask_path": None}
                    if sid not in statuses and clear_status:
                        plan[sid]["mask_status"] = None
                    continue
                try:
                    data_of[sid] = prepare_mask(mask, (row["width"], row["height"]))
                except ImageRejected as exc:
                    errors.append(f"{sid}: {exc}")
            if errors:
                raise DatasetError("set_masks refused, nothing was changed:\n  " + "\n  ".join(errors[:_MAX_LISTED]))
            for sid, status in statuses.items():
                message = S.check_value("mask_status", status, S.Vocabulary(None, None))
                if message:
                    raise DatasetError(f"set_masks({sid}): {message}")
            for sid, keys in (extra_updates or {}).items():
                merged = json.loads(rows[sid]["extra"] or "{}")
                for key, value in keys.items():
                    if value is None:
                        merged.pop(key, None)
                    else:
                        merged[key] = value
                try:
                    plan.setdefault(sid, {}).update(self._normalize_update({"extra": merged}))
                except S.ValueProblem as exc:
                    raise DatasetError(f"set_masks({sid}): {exc}") from None
            written: list[Path] = []
            old_files: list[str] = []
            for sid, data in data_of.items():
                old_rel = rows[sid]["mask_path"]
                if old_rel is not None and (self._root / old_rel).is_file() and \
                        (self._root / old_rel).read_bytes() == data:
                    new_rel = old_rel
                else:
                    version = None if old_rel is None else hashlib.sha256(data).hexdigest()[:8]
                    new_rel = S.mask_relpath(sid, version)
                    if new_rel == old_rel:
                        new_rel = S.mask_relpath(sid, uuid.uuid4().hex[:8])
                    # one durability barrier for all of them below, as add_samples does for media
                    atomic_write_bytes(self._root, self._root / new_rel, data, fsync=False, sync_dir=False)
                    written.append(self._root / new_rel)
                plan.setdefault(sid, {})["mask_path"] = new_rel
            if written:
                durability_barrier(self._root, written, {self._root / "masks"})  # files durable before rows
            for sid, status in statuses.items():
                plan.setdefault(sid, {})["mask_status"] = status
            for sid, fields in plan.items():
                old_rel = rows[sid]["mask_path"]
                if "mask_path" in fields and old_rel is not None and old_rel != fields["mask_path"]:
                    old_files.append(old_rel)
            table, records, changed = self._apply(plan, actor=actor, reason=reason)
            if records:
                carry = rowscan.files_unchanged(self._root, None)
                self._commit_table(table, self._index, records)
                if carry:
                    rowscan.carry_forward(self._root)
                for rel in old_files:
                    try:
                        (self._root / rel).unlink()
                    except OSError:
                        pass
            else:
                for path in written:  # nothing changed: no row points at them
                    try:
                        path.unlink()
                    except OSError:
                        pass
        return changed

    def add_backgrounds(self, names: Sequence[str]) -> list[str]:
        """Append background labels to the vocabulary (``dataset.yaml``'s ``backgrounds``);
        returns the names that were new (already present ones are left as they are). Names must
        be non-empty strings without surrounding spaces. The file is rewritten atomically under
        the lock; rows are not touched (label them with :meth:`update`)."""
        clean = [str(n) for n in names]
        bad = [n for n in clean if not n.strip() or n != n.strip()]
        if bad:
            raise DatasetError(f"background names must be non-empty without surrounding spaces, got {bad!r}")
        with self._lock.hold("add_backgrounds"):
            self._refresh_config(force=True)
            config = copy.deepcopy(self._config)
            present = list(config["backgrounds"])
            new = [n for n in dict.fromkeys(clean) if n not in present]
            if new:
                config["backgrounds"] = present + new
                self._write_config_file(self._root, config)
                self._set_config(config)
        return new

    def remove_backgrounds(self, names: Sequence[str]) -> list[str]:
        """Take background labels out of the vocabulary (the undo of :meth:`add_backgrounds`); returns
        the names that were in it. A name some sample still carries is refused (:class:`DatasetError`,
        nothing changed): relabel those samples first. Rewritten atomically under the lock."""
        clean = list(dict.fromkeys(str(n) for n in names))
        with self._lock.hold("remove_backgrounds"):
            self._refresh_config(force=True)
            used = [n for n in clean if self.ids(background=n)]
            if used:
                raise DatasetError(f"background(s) {', '.join(map(repr, used))} still label samples of {self._root}; "
                                   "relabel them before taking the name out of the vocabulary")
            config = copy.deepcopy(self._config)
            gone = [n for n in clean if n in config["backgrounds"]]
            if gone:
                config["backgrounds"] = [n for n in config["backgrounds"] if n not in gone]
                self._write_config_file(self._root, config)
                self._set_config(config)
        return gone

    def record_provenance(self, stage: str, info: Mapping[str, Any]) -> None:
        """Record a stage's settings in ``dataset.yaml`` under ``provenance[stage]`` (replacing it).

        ``recorded_at`` and ``curate_version`` are added unless ``info`` has them. Values must be
        YAML-plain (strings, numbers, booleans, lists, mappings; paths and numpy scalars are
        converted). The file is rewritten atomically under the lock.
        """
        if not isinstance(stage, str) or not stage:
            raise DatasetError("record_provenance needs a stage name")
        try:
            entry = yaml_ready(dict(info), f"provenance.{stage}")
        except TypeError as exc:
            raise DatasetError(f"record_provenance({stage!r}): {exc}") from None
        entry.setdefault("recorded_at", iso_time())
        entry.setdefault("curate_version", __version__)
        with self._lock.hold("record_provenance"):
            self._refresh_config(force=True)
            config = copy.deepcopy(self._config)
            provenance = config.get("provenance") or {}
            provenance[stage] = entry
            config["provenance"] = provenance
            self._write_config_file(self._root, config)
            self._set_config(config)

    # ------------------------------------------------------------------ internals: state
    def _set_config(self, config: dict[str, Any]) -> None:
        self._config = config
        self._config_stamp = _stamp(self._root / CONFIG_FILE)
        self._label_space = LabelSpace.from_config(config.get("label_space"))
        self._vocab = S.Vocabulary(self._label_space, list(config["backgrounds"]))

    def _refresh_config(self, force: bool = False) -> None:
        stamp = _stamp(self._root / CONFIG_FILE)
        if force or stamp != self._config_stamp:
            try:
                config = yaml.safe_load((self._root / CONFIG_FILE).read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError) as exc:
                raise DatasetError(f"{self._root / CONFIG_FILE} cannot be read any more: {exc}") from None
            if not isinstance(config, dict) or background_problem(config.get("backgrounds")):
                raise DatasetError(f"{self._root / CONFIG_FILE} was damaged; check_dataset() says what is wrong")
            self._set_config(config)

    def _set_table(self, table: pa.Table, stamp: tuple[int, int, int] | None,
                   index: dict[str, int] | None = None) -> None:
        """Cache ``table`` (read at ``stamp``; it may lack ``extra``); ``index`` is its sample_id
        -> row dict when the caller has it already, else it is built on first use (0.4 s at a
        million rows, which opening and selecting need not pay)."""
        self._cached = table
        self._table_stamp = stamp
        self._index_cache = index

    @property
    def _table(self) -> pa.Table:
        """The cached table with every column: ``extra`` is read now if it was left out (every
        writer starts from this, so no commit can lose the column)."""
        if "extra" not in self._cached.column_names:
            self._read_extra()
        return self._cached

    def _current(self) -> pa.Table:
        """The cached table (``extra`` perhaps not read), re-read first when another process
        committed since."""
        if _stamp(self._root / SAMPLES_FILE) != self._table_stamp:
            self._reload_table()
        return self._cached

    def _read_extra(self) -> None:
        """Add ``extra`` to the cached table from the very file it was read from (checked on the
        open handle: inode, mtime, size); when that file was replaced since, read the new one
        whole instead. At a million collector-shaped rows the column is ~600 MB of the ~1 GB
        table, which opening, selecting and counting never need."""
        path = self._root / SAMPLES_FILE
        try:
            with open(path, "rb") as raw:
                st = os.fstat(raw.fileno())
                if (st.st_ino, st.st_mtime_ns, st.st_size) != self._table_stamp:
                    self._set_table(self._read_whole(path), (st.st_ino, st.st_mtime_ns, st.st_size))
                    return
                with pq.ParquetFile(raw) as handle:
                    column = handle.read(columns=["extra"], use_threads=False).column(0).cast(pa.string())
        except Exception as exc:  # noqa: BLE001 - arrow raises several types for bad files
            raise DatasetError(f"{path} cannot be read any more ({exc}); run check_dataset({str(self._root)!r})") from None
        if len(column) != self._cached.num_rows:
            raise DatasetError(f"{path} changed under this process (extra has {len(column)} values for "
                               f"{self._cached.num_rows} rows); open the folder again")
        self._cached = self._cached.add_column(S.COLUMN_NAMES.index("extra"), S.SCHEMA.field("extra"), column)

    @staticmethod
    def _read_whole(path: Path) -> pa.Table:
        return read_samples_file(path).select(list(S.COLUMN_NAMES)).cast(S.SCHEMA)

    @property
    def _index(self) -> dict[str, int]:
        """sample_id -> row of the cached table, built lazily."""
        if self._index_cache is None:
            self._index_cache = {sid: i for i, sid in enumerate(self._cached.column("sample_id").to_pylist())}
        return self._index_cache

    def _reload_table(self) -> None:
        """Read samples.parquet again (another process committed), leaving ``extra`` for later."""
        path = self._root / SAMPLES_FILE
        stamp = _stamp(path)
        names = [n for n in S.COLUMN_NAMES if n != "extra"]
        try:
            table = read_samples_file(path, names).select(names).cast(
                pa.schema([S.SCHEMA.field(n) for n in names], metadata=S.SCHEMA.metadata))
        except Exception as exc:  # noqa: BLE001
            raise DatasetError(f"{path} cannot be read any more ({exc}); run check_dataset({str(self._root)!r})") from None
        self._set_table(table, stamp)

    def _refresh_all(self) -> None:
        changelog.settle(self._root)  # under the lock: a commit a killed writer left in flight
        self._refresh_config()
        self._current()

    def _row_index(self, sample_id: str) -> int:
        self._current()
        try:
            return self._index[sample_id]
        except (KeyError, TypeError):
            raise DatasetError(f"no sample {sample_id!r} in {self._root}") from None

    def _field_of(self, key: str | int | Mapping[str, Any], column: str) -> Any:
        if isinstance(key, Mapping):
            if column in key:
                return key[column]
            if "sample_id" in key:
                key = key["sample_id"]
            else:
                raise DatasetError(f"a row needs '{column}' or 'sample_id', got keys {sorted(key)}")
        table = self._table if column == "extra" else self._current()
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not 0 <= int(key) < table.num_rows:
                raise DatasetError(f"row {key} is outside 0..{table.num_rows - 1}")
            return table.column(column)[int(key)].as_py()
        return table.column(column)[self._row_index(key)].as_py()

    def _safe_path(self, rel: Any, folder: str, column: str) -> Path:
        why = safe_relpath(rel, folder)
        if why:
            raise DatasetError(f"{column} {why}; refusing to read outside {self._root / folder}")
        path = self._root / rel
        root = self._root.resolve()
        if not path.resolve().is_relative_to(root):
            raise DatasetError(f"{column} {rel!r} resolves outside the dataset folder (a symlink?)")
        return path

    # ------------------------------------------------------------------ internals: writing
    @staticmethod
    def _write_table_file(root: Path, table: pa.Table, changes: list[dict[str, Any]] | None = None) -> None:
        """samples.parquet, atomically, with :data:`~curate.store.schema.PARQUET_OPTIONS` (zstd,
        dictionaries only for the low-cardinality columns: at a million rows this writes in about
        1 s and reads in about 0.3 s; see benchmarks/store.py). ``changes``: the commit's
        ``changes.jsonl`` records, logged ahead of the rename (:mod:`curate.store.changelog`)."""
        table = table.replace_schema_metadata(S.SCHEMA.metadata)
        ahead = (lambda tmp: changelog.log_ahead(root, tmp, changes)) if changes else None
        try:
            atomic_write(root, root / SAMPLES_FILE, lambda handle: pq.write_table(table, handle, **S.PARQUET_OPTIONS),
                         before_replace=ahead)
        except BaseException:
            if changes:
                changelog.roll_back(root)
            raise
        if changes:
            changelog.done(root)

    @staticmethod
    def _write_config_file(root: Path, config: dict[str, Any]) -> None:
        text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True, default_flow_style=None, width=100)
        atomic_write_bytes(root, root / CONFIG_FILE, text.encode("utf-8"))

    def _commit_table(self, table: pa.Table, index: dict[str, int] | None = None,
                      changes: list[dict[str, Any]] | None = None) -> None:
        """The commit point: replace samples.parquet atomically, then refresh the cache
        (``index``: the new table's sample_id -> row, when the caller kept it up to date;
        ``changes``: its ``changes.jsonl`` records, written as part of the commit).

        ``extra`` is validated once, when written: every caller builds ``table`` from the cached
        one (the file on disk: writers refresh it under the lock) plus values that
        :meth:`_prepare` / :meth:`_normalize_update` produced with ``json.dumps`` of a mapping and
        checked. So when the file being replaced had all its ``extra`` values parsed (the record
        of :func:`curate.store.rowscan.extras_unchanged`), so has the new one, and the record is
        carried forward after the commit; the next open then does not parse a million of them."""
        carry = (_stamp(self._root / SAMPLES_FILE) == self._table_stamp
                 and rowscan.extras_unchanged(self._root, rowscan.samples_identity(self._root)))
        self._write_table_file(self._root, table, changes)
        self._set_table(table, _stamp(self._root / SAMPLES_FILE), index)
        if carry:
            rowscan.remember_extras_valid(self._root, rowscan.samples_identity(self._root))

    def _store_media(self, rel: str, data: bytes, new_files: list[Path], new_dirs: set[Path]) -> None:
        target = self._root / rel
        if target.is_file() and target.stat().st_size == len(data):
            new_files.append(target)  # content-addressed: same bytes already there (an interrupted run)
            return
        atomic_write_bytes(self._root, target, data, fsync=False, sync_dir=False)
        new_files.append(target)
        new_dirs.add(target.parent)
        new_dirs.add(target.parent.parent)

    def _commit_new_rows(self, rows: list[dict[str, Any]], new_files: list[Path], new_dirs: set[Path],
                         actor: str, report: AddReport) -> None:
        durability_barrier(self._root, new_files, new_dirs)  # files durable before rows point at them
        new = pa.Table.from_pylist(rows, schema=S.SCHEMA)
        combined = pa.concat_tables([self._table, new])
        if combined.column(0).num_chunks > 64:  # appending keeps chunks; merge them now and then
            combined = combined.combine_chunks()
        index = None
        if self._index_cache is not None:
            index = dict(self._index_cache)
            start = self._table.num_rows
            index.update((r["sample_id"], start + i) for i, r in enumerate(rows))
        now = iso_time()
        self._commit_table(combined, index, [
            {"time": now, "actor": actor, "op": "add", "sample_id": r["sample_id"], "field": None,
             "old": None, "new": r["filepath"], "reason": f"added from {r['source']}"}
            for r in rows])
        if self._carry_files:  # the presence record held when this add began
            rowscan.carry_forward(self._root, {r["filepath"].rsplit("/", 1)[0] for r in rows})
        report.added.extend(r["sample_id"] for r in rows)
        log.info("%s: committed %d new sample(s) (%d in this call, %d in the dataset)",
                 self._root, len(rows), len(report.added), self._table.num_rows)

    def _prepare(self, item: NewSample) -> tuple[dict[str, Any], Any]:
        """Check the fields, then decode the image: the row to store and the prepared image."""
        try:
            class_index, class_name = S.resolve_class(self._label_space, to_plain(item.class_index), item.class_name)
        except S.ValueProblem as exc:
            raise ImageRejected("bad_class", str(exc)) from None
        extra = item.extra if item.extra is not None else {}
        if not isinstance(extra, Mapping):
            raise ImageRejected("bad_value", f"extra must be a mapping, got {type(extra).__name__}")
        try:
            extra_text = json.dumps(to_plain(extra), sort_keys=True, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ImageRejected("bad_value", f"extra is not JSON-serialisable: {exc}") from None
        if item.added_at is not None and (not isinstance(item.added_at, dt.datetime) or item.added_at.tzinfo is None):
            raise ImageRejected("bad_value", f"added_at must be a timezone-aware datetime, got {item.added_at!r}")
        tags = to_plain(list(item.tags or []))
        score = to_plain(item.background_score)
        if isinstance(score, (int, float)) and not isinstance(score, bool):
            score = float(np.float32(score))
        row: dict[str, Any] = {
            "source": item.source, "source_id": _str_or_none(item.source_id),
            "source_url": item.source_url, "license": item.license, "attribution": item.attribution,
            "class_index": class_index, "class_name": class_name, "status": item.status,
            "reject_reason": item.reject_reason, "background": item.background,
            "background_source": item.background_source, "background_score": score,
            "mask_path": None, "mask_status": item.mask_status, "group": item.group,
            "tags": tags, "extra": extra_text,
        }
        for column, value in row.items():
            if column in ("class_index", "class_name", "mask_path"):
                continue
            message = S.check_value(column, value, self._vocab)
            if message:
                raise ImageRejected("bad_value", message)
        prepared = prepare_image(item.image)
        row.update(
            sample_id=S.sample_id_for(prepared.sha256),
            filepath=S.media_relpath(prepared.sha256, prepared.ext),
            sha256=prepared.sha256, width=prepared.width, height=prepared.height,
            added_at=item.added_at or now_utc(),
        )
        return row, prepared

    def _quarantine_record(self, item: NewSample, position: int, exc: ImageRejected, actor: str) -> dict[str, Any]:
        """The quarantine.jsonl record of a refused input; its bytes are copied right away
        (content-addressed under quarantine/, at most QUARANTINE_COPY_LIMIT) so that a big
        batch holds no refused bytes in memory."""
        data: bytes | None = None
        if isinstance(item.image, PreparedImage):  # verified, then refused for its class, mask, fields, id
            data = item.image.data
        elif isinstance(item.image, (bytes, bytearray, memoryview)):
            data = bytes(item.image)
        elif isinstance(item.image, (str, Path)):
            try:
                path = Path(item.image)
                if path.is_file() and path.stat().st_size <= QUARANTINE_COPY_LIMIT:
                    data = path.read_bytes()
            except OSError:
                data = None
        sha = hashlib.sha256(data).hexdigest() if data is not None else None
        copy_rel: str | None = None
        if data is not None and sha is not None and len(data) <= QUARANTINE_COPY_LIMIT:
            copy_rel = f"{QUARANTINE_DIR}/{sha}.bin"
            if not (self._root / copy_rel).exists():
                atomic_write_bytes(self._root, self._root / copy_rel, data)
        return {
            "time": iso_time(), "actor": actor, "source": item.describe(position), "origin": item.source,
            "source_id": _str_or_none(item.source_id), "source_url": item.source_url,
            "reason": exc.code, "detail": exc.detail, "sha256": sha, "copy": copy_rel,
        }

    def _append_quarantine(self, records: list[dict[str, Any]]) -> None:
        """Append records, skipping inputs that failed the same way before (idempotent re-runs)."""
        existing, _ = read_jsonl(self._root / QUARANTINE_FILE)
        seen = {(r.get("sha256") or r.get("source"), r.get("reason")) for r in existing}
        fresh: list[dict[str, Any]] = []
        for record in records:
            key = (record["sha256"] or record["source"], record["reason"])
            if key not in seen:
                seen.add(key)
                fresh.append(record)
        append_jsonl(self._root / QUARANTINE_FILE, fresh)

    def _normalize_update(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for column, value in fields.items():
            if column not in S.COLUMN_BY_NAME:
                raise S.ValueProblem(f"unknown column {column!r}")
            if column in S.IMMUTABLE_COLUMNS:
                hint = "; use set_mask()" if column == "mask_path" else ""
                raise S.ValueProblem(f"column {column!r} cannot be changed{hint}")
            value = to_plain(value)
            if column == "extra":
                if isinstance(value, str):
                    message = S.check_value("extra", value, self._vocab)
                    if message:
                        raise S.ValueProblem(message)
                    value = json.loads(value)
                if not isinstance(value, dict):
                    raise S.ValueProblem(f"extra must be a mapping, got {type(value).__name__}")
                try:
                    value = json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
                except (TypeError, ValueError) as exc:
                    raise S.ValueProblem(f"extra is not JSON-serialisable: {exc}") from None
            elif column == "tags" and value is not None:
                value = list(value) if isinstance(value, list) else value
            elif column == "background_score" and isinstance(value, (int, float)) and not isinstance(value, bool):
                if math.isfinite(value):
                    value = float(np.float32(value))
            out[column] = value
        if "class_index" in out or "class_name" in out:
            if "class_index" in out and out["class_index"] is None:
                if out.get("class_name") is not None:
                    raise S.ValueProblem("class_index is set to null but class_name is given")
                out["class_name"] = None
            else:
                index, name = S.resolve_class(self._label_space, out.get("class_index"), out.get("class_name"))
                out["class_index"], out["class_name"] = index, name
        for column, value in out.items():
            if column == "class_name":
                continue
            message = S.check_value(column, value, self._vocab)
            if message:
                raise S.ValueProblem(message)
        return out

    def _apply(self, plan: dict[str, dict[str, Any]], *, actor: str, reason: str
               ) -> tuple[pa.Table, list[dict[str, Any]], int]:
        """The updated table, the change records and the number of changed samples."""
        table = self._table
        columns = sorted({c for fields in plan.values() for c in fields}, key=S.COLUMN_NAMES.index)
        now = iso_time()
        records: list[dict[str, Any]] = []
        changed_ids: set[str] = set()
        for column in columns:
            targets = [(self._index[sid], sid, fields[column]) for sid, fields in plan.items() if column in fields]
            targets.sort(key=lambda t: t[0])
            positions = [t[0] for t in targets]
            # only the touched cells are read into Python (a whole column of a million rows is not)
            olds = table.column(column).take(pa.array(positions, type=pa.int64())).to_pylist()
            changed_at: list[int] = []
            new_values: list[Any] = []
            for (index, sid, new), old in zip(targets, olds):
                if old == new:
                    continue
                changed_at.append(index)
                new_values.append(new)
                changed_ids.add(sid)
                records.append({
                    "time": now, "actor": actor, "op": "update", "sample_id": sid, "field": column,
                    "old": json.loads(old) if column == "extra" and old else old,
                    "new": json.loads(new) if column == "extra" and new else new,
                    "reason": reason,
                })
            if changed_at:
                field = S.SCHEMA.field(column)
                position = table.schema.get_field_index(column)
                table = table.set_column(position, field, _scatter(table.column(column), changed_at, new_values, field.type))
        return table, records, len(changed_ids)


def _scatter(column: pa.ChunkedArray, positions: list[int], values: list[Any], type_: pa.DataType) -> pa.Array:
    """``column`` with ``values`` written at the (sorted) row ``positions``: the replacements are
    appended and one ``take`` picks, per row, the old value or its replacement (works for every
    arrow type, lists included, unlike ``pc.replace_with_mask``)."""
    n = len(column)
    pick = np.arange(n, dtype=np.int64)
    pick[np.asarray(positions, dtype=np.int64)] = np.arange(n, n + len(positions), dtype=np.int64)
    merged = pa.chunked_array(list(column.chunks) + [pa.array(values, type=type_)], type=type_)
    return merged.take(pa.array(pick)).combine_chunks()


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _match(column: pa.ChunkedArray, name: str, condition: Any) -> pa.ChunkedArray | pa.Array:
    """Boolean mask of rows of ``column`` matching ``condition`` (see Dataset.select)."""
    if condition is None:
        return pc.is_null(column)
    if callable(condition):
        return pa.array([bool(condition(v)) for v in column.to_pylist()], type=pa.bool_())
    if name == "tags":
        wanted = {condition} if isinstance(condition, str) else set(condition)
        return pa.array([bool(wanted.intersection(tags or ())) for tags in column.to_pylist()], type=pa.bool_())
    if isinstance(condition, (list, tuple, set, frozenset)):
        options = [to_plain(v) for v in condition]
        with_null = any(v is None for v in options)
        options = [v for v in options if v is not None]
        matched = pc.fill_null(pc.is_in(column, value_set=pa.array(options, type=column.type)), False)
        return pc.or_(matched, pc.is_null(column)) if with_null else matched
    return pc.fill_null(pc.equal(column, pa.scalar(to_plain(condition), type=column.type)), False)
