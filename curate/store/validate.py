"""Validation of a dataset folder: every problem, named by row, sample and column.

Why it is long (one job): every rule a folder must meet, in one file so the list below is the whole
list; each rule runs on the streamed batches of a million-row table and on the rows rowscan flags.

:func:`check_dataset` reads ``dataset.yaml`` and ``samples.parquet`` and lists ALL problems it
finds (it never stops at the first); :meth:`Dataset.open <curate.store.Dataset.open>` runs the
same checks and refuses a folder with any problem of severity "error".

Checks (severity error unless noted):
- ``dataset.yaml``: present, a mapping, ``schema_version`` = :data:`SCHEMA_VERSION`, a name, a
  label space :meth:`LabelSpace.from_config` accepts, a background vocabulary of unique
  non-empty strings.
- ``samples.parquet``: present and readable; every schema column present with its type (see
  :func:`~curate.store.schema.types_compatible`), no unknown column; schema version in the
  parquet metadata equal to the yaml's (missing: warning).
- per row: required values not null; ``sample_id`` = sha256[:16+] and unique; ``sha256`` 64 hex
  and unique; ``filepath`` relative, inside the folder, ``media/<sha[:2]>/<sha>.<ext>``, and the
  file exists; width/height positive; ``class_index`` inside the label space and ``class_name``
  its name; status / group / background_source / background in their vocabularies;
  ``mask_path`` inside ``masks/``, present, and the mask's size equal to the image's;
  tags a list of strings; ``extra`` a JSON object.
- ``deep=True`` also hashes every image (sha256 must match) and reads its header (size must
  match width/height), and decodes every mask (a PNG cut after its header passes the header
  check, but no stage can read it).
- ``annotations.parquet`` and ``label_status.parquet`` (issue 44), when present:
  :func:`curate.store.annotation_schema.annotation_problems` and ``label_status_problems``.
- ``changes.jsonl`` / ``quarantine.jsonl``: lines that do not parse (a torn last line after a
  crash) are warnings.
- :func:`check_dataset` only: a provenance entry marked unfinished (a derived folder whose
  stage was interrupted, e.g. ``curate intervene``), with the command that finishes it.
Rows are numbered from 0, in file order (as ``pyarrow.Table`` indexes them).

How (docs/design.md#dataset-folder, "At a million rows"): the value checks run first over whole
columns (:func:`curate.store.rowscan.suspect_rows`), and only the rows they flag go through the
row-by-row checks that word each problem, so the problems found are the same as checking every
row by hand (tests/test_store_scale.py compares the two). Image presence for the other rows is
answered by directory listings, skipped when neither samples.parquet nor any media folder
changed since the last complete check (:func:`curate.store.rowscan.files_unchanged`). Mask
presence and mask sizes are checked on every open (a PNG header read per mask).

``extra`` (issue 29): the column is never held by a validation that does not hash images. It is
the bulk of a collector's table (~650 bytes a row, 600 MB at a million rows) and no check but
its own reads it, so :func:`inspect_dataset` reads the other columns and either streams
``extra`` in batches of :data:`STREAM_ROWS` rows through the whole
parse (:func:`curate.store.rowscan.extra_not_objects`, exact as ``json.loads``), keeping only
the values of the rows it faults, or, in an open, skips it when a record says that this very
samples.parquet was parsed before (:func:`curate.store.rowscan.extras_unchanged`; curate's
writers, which check what they write, carry the record to the files they commit).
:func:`check_dataset` always parses. A hand-corrupted ``extra`` is therefore reported by the
next open as well as by ``curate check``: any write that is not curate's gives a file the record
does not name. :class:`~curate.store.Dataset` reads the column from the same file when a caller
first needs it (docs/design.md#dataset-folder). ``deep=True`` reads the whole table as before.

:func:`check_dataset` holds no table at all: it streams every column in batches
(:func:`_scan_samples`), looks each batch's images up in a listing made before, and keeps only
what the checks across rows need; the problems are those of the whole-table path of an open, in
the same order (tests/test_store_scale.py compares the two).
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from curate.labels import LabelSpace
from curate.store import rowscan
from curate.store import schema as S
from curate.store.annotation_schema import (
    ANNOTATIONS_FILE,
    LABEL_STATUS_FILE,
    annotation_problems,
    label_status_problems,
)
from curate.store.atomic import read_jsonl
from curate.store.images import ImageRejected, decode, image_size
from curate.store.provenance import unfinished

log = logging.getLogger(__name__)

CONFIG_FILE = "dataset.yaml"
SAMPLES_FILE = "samples.parquet"
CHANGES_FILE = "changes.jsonl"
QUARANTINE_FILE = "quarantine.jsonl"
MEDIA_DIR = "media"
MASKS_DIR = "masks"


@dataclass(frozen=True)
class ValidationProblem:
    """One thing wrong with a dataset folder.

    ``row`` is the 0-based row of ``samples.parquet`` (None for file-level problems),
    ``sample_id`` that row's id when readable, ``column`` the column concerned (or None),
    ``severity`` "error" (``Dataset.open`` refuses the folder) or "warning".
    """

    row: int | None
    sample_id: str | None
    column: str | None
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        prefix = "warning: " if self.severity == "warning" else ""
        if self.row is None:
            return f"{prefix}{self.message}"
        sample = f" (sample {self.sample_id})" if self.sample_id else ""
        return f"{prefix}row {self.row}{sample}: {self.message}"


@dataclass
class Inspection:
    """What :func:`inspect_dataset` read, with the problems found."""

    root: Path
    problems: list[ValidationProblem] = field(default_factory=list)
    config: dict[str, Any] | None = None
    label_space: LabelSpace | None = None
    backgrounds: list[str] | None = None
    table: pa.Table | None = None  # cast to SCHEMA when the columns are all there and typed right
    #: True when ``table`` lacks ``extra`` (read from the file when needed; module docstring)
    extra_deferred: bool = False

    @property
    def errors(self) -> list[ValidationProblem]:
        return [p for p in self.problems if p.severity == "error"]


def check_dataset(root: str | Path, *, deep: bool = False) -> list[ValidationProblem]:
    """Every problem of the dataset folder at ``root`` (empty list = valid). See module docstring.
    Unlike :meth:`Dataset.open` it always lists the media folders (no cached presence check), and
    a folder a stage has not finished writing (:func:`curate.store.provenance.unfinished`) is an
    error here, with the command that finishes it, though :meth:`Dataset.open` opens it (the
    stage reopens it to finish it)."""
    inspection = inspect_dataset(root, deep=deep, cached_files=False, keep_table=False)
    return inspection.problems + [ValidationProblem(None, None, None, line) for line in unfinished(inspection.config)]


def licence_warning(root: str | Path, sample_ids: Iterable[str] | None = None) -> str | None:
    """What ``curate check`` and the collectors say when photos of the folder (``sample_ids`` only,
    when given; rejected ones left out) will not be published for their licence, or None.

    Not a problem of the folder (:func:`check_dataset` does not list it): ``curate publish``
    leaves out photos with no licence, or one that forbids redistribution or derivatives, or one
    curate does not recognise (:func:`curate.licenses.classify_licence`), so a folder imported
    without a licence is valid and still publishes nothing of it. Reads three columns only.
    """
    from curate.licenses import EXCLUSION_REASONS, classify_licence

    table = pq.read_table(Path(root) / SAMPLES_FILE, columns=["sample_id", "license", "status"])
    keep = pc.fill_null(pc.not_equal(table.column("status"), "rejected"), True)
    if sample_ids is not None:
        keep = pc.and_(keep, pc.is_in(table.column("sample_id"), value_set=pa.array(list(sample_ids), pa.string())))
    licences = table.column("license").filter(keep)
    reasons: dict[str, int] = {}
    counts = [(None, licences.null_count)] + [(e["values"], e["counts"]) for e in
                                              pc.value_counts(licences.drop_null()).to_pylist()]
    for licence, count in counts:  # each distinct licence classified once (a million rows hold a few)
        verdict = classify_licence(licence)
        if count and not verdict.publishable:
            reasons[str(verdict.reason)] = reasons.get(str(verdict.reason), 0) + int(count)
    if not reasons:
        return None
    why = "; ".join(f"{EXCLUSION_REASONS.get(r, r)}: {n}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
    return (f"{sum(reasons.values())} photo(s) will not be published for their licence ({why}): `curate publish` "
            "leaves them out; give a licence when collecting (--license, or a licence column or field) or set each "
            "photo's `license` in the folder")


def safe_relpath(value: Any, folder: str) -> str | None:
    """Why ``value`` is not a safe path under ``folder/`` of the dataset, or None when it is.

    Safe = a relative POSIX path, no ``..``, no backslash, no empty parts, first part ``folder``.
    A path escaping the dataset folder is never followed.
    """
    if not isinstance(value, str) or not value:
        return "is empty"
    if "\\" in value or value.startswith("/") or (len(value) > 1 and value[1] == ":"):
        return f"{value!r} is not a relative POSIX path inside the dataset folder"
    parts = PurePosixPath(value).parts
    if any(part in ("..", ".", "") for part in parts) or "//" in value:
        return f"{value!r} escapes the dataset folder (contains '..' or '.')"
    if len(parts) < 2 or parts[0] != folder:
        return f"{value!r} is not under {folder}/"
    return None


def _load_config(root: Path, out: Inspection) -> None:
    path = root / CONFIG_FILE
    problems = out.problems
    if not path.is_file():
        problems.append(ValidationProblem(
            None, None, None,
            f"{CONFIG_FILE} is missing: {root} is not a curate dataset (make one with Dataset.create)"))
        return
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        problems.append(ValidationProblem(None, None, None, f"{CONFIG_FILE} does not parse as YAML: {exc}"))
        return
    if not isinstance(config, dict):
        problems.append(ValidationProblem(None, None, None, f"{CONFIG_FILE} is not a mapping"))
        return
    out.config = config
    version = config.get("schema_version")
    if version != S.SCHEMA_VERSION:
        if isinstance(version, int) and version > S.SCHEMA_VERSION:
            message = (f"{CONFIG_FILE}: schema_version {version} is newer than this curate understands "
                       f"({S.SCHEMA_VERSION}); upgrade curate")
        else:
            message = f"{CONFIG_FILE}: schema_version is {version!r}, expected {S.SCHEMA_VERSION}"
        problems.append(ValidationProblem(None, None, None, message))
    if not isinstance(config.get("name"), str) or not config.get("name"):
        problems.append(ValidationProblem(None, None, None, f"{CONFIG_FILE}: 'name' must be a non-empty string"))
    try:
        out.label_space = LabelSpace.from_config(config.get("label_space"))
    except (ValueError, TypeError, OSError) as exc:
        problems.append(ValidationProblem(None, None, None, f"{CONFIG_FILE}: label_space is invalid: {exc}"))
    backgrounds = config.get("backgrounds")
    message = background_problem(backgrounds)
    if message:
        problems.append(ValidationProblem(None, None, None, f"{CONFIG_FILE}: {message}"))
    else:
        out.backgrounds = list(backgrounds)
    provenance = config.get("provenance", {})
    if provenance is not None and not isinstance(provenance, dict):
        problems.append(ValidationProblem(None, None, None, f"{CONFIG_FILE}: provenance must be a mapping"))


def background_problem(backgrounds: Any) -> str | None:
    """Why a background vocabulary is invalid, or None."""
    if not isinstance(backgrounds, (list, tuple)) or not all(isinstance(b, str) and b.strip() for b in backgrounds):
        return f"backgrounds must be a list of non-empty strings, got {backgrounds!r}"
    duplicates = sorted({b for b in backgrounds if list(backgrounds).count(b) > 1})
    if duplicates:
        return f"backgrounds repeat {', '.join(duplicates)}"
    return None


def read_samples_file(path: Path, columns: list[str] | None = None) -> pa.Table:
    """samples.parquet as a table (``columns``: only those), read on one thread.

    Measured on the project's 2-core VM at a million collector-shaped rows (a ~1 GB table):
    pyarrow's threaded read spends 1.3-3.7 s of *system* time (the threads fault in fresh pages
    at once and contend in the kernel) against 0.2-0.6 s single-threaded, for the same ~0.7 s of
    user time, and is not faster in wall time on a loaded machine. Like
    :func:`curate.parquetio.read_parquet_file` it goes through ``ParquetFile`` (no
    ``pyarrow.dataset``, no pandas import). Raises what pyarrow raises."""
    with pq.ParquetFile(path) as handle:
        return handle.read(columns=columns, use_threads=False)


#: Rows per batch when samples.parquet is streamed (``extra`` in an open, :func:`_stream_extra`;
#: every column in :func:`check_dataset`, :func:`_scan_samples`). Measured on the 1M folder of
#: ``benchmarks/store.py`` (fresh processes, three runs each): 65,536-row batches 1.61-1.62 s user,
#: 0.14-0.78 s system, 380-400 MB peak; 16,384 rows 1.62-1.63 s user, 0.05-0.10 s system, 213 MB
#: (the allocator reuses a batch's pages instead of faulting in fresh ones for each batch).
STREAM_ROWS = 16_384


def _unreadable(exc: BaseException) -> ValidationProblem:
    """The problem of a samples.parquet that does not read (the one wording for every path)."""
    return ValidationProblem(None, None, None, f"{SAMPLES_FILE} cannot be read as parquet: {exc}")


def _require_text(table: pa.Table, first_row: int = 0) -> None:
    """Raise ``ValueError`` naming the first value of ``table`` (whose rows are numbered from
    ``first_row`` in the file) that is not UTF-8 text (:func:`curate.store.rowscan.first_invalid_text`):
    such a file cannot be used, so validation reports it as one that does not read."""
    found = rowscan.first_invalid_text(table)
    if found is not None:
        raise ValueError(f"column '{found[0]}' row {first_row + found[1]} holds bytes that are not UTF-8 text")


@dataclass
class ExtraCheck:
    """What streaming ``extra`` found (:func:`_stream_extra`): per row, whether the value fails
    the per-row check (not a JSON object, or null), and those rows' values (for the messages)."""

    bad: np.ndarray
    values: dict[int, str | None]


def _stream_extra(handle: pq.ParquetFile, rows: int) -> ExtraCheck:
    """``extra`` of an open samples.parquet, batch by batch, through the exact parse
    (:func:`curate.store.rowscan.extra_not_objects`; null counts as bad: the column is required),
    holding one batch at a time. Raises what pyarrow raises for an unreadable file."""
    bad = np.zeros(rows, dtype=bool)
    values: dict[int, str | None] = {}
    start = 0
    for batch in handle.iter_batches(batch_size=STREAM_ROWS, columns=["extra"], use_threads=False):
        _require_text(pa.Table.from_batches([batch]), start)
        column = pa.chunked_array([batch.column(0)])
        faulted = rowscan.extra_not_objects(column) | rowscan.numpy_mask(pc.is_null(column))
        for offset in np.flatnonzero(faulted).tolist():
            values[start + offset] = column[offset].as_py()
        bad[start: start + batch.num_rows] = faulted
        start += batch.num_rows
    if start != rows:
        raise ValueError(f"its extra column holds {start} values for {rows} rows")
    return ExtraCheck(bad, values)


def _schema_checks(schema: pa.Schema, problems: list[ValidationProblem]) -> set[str]:
    """The file-level problems of samples.parquet's schema (its version metadata, missing,
    mistyped, unknown and repeated columns), appended to ``problems``; the columns present with
    a usable type (none when a name repeats)."""
    metadata = schema.metadata or {}
    stored = metadata.get(S.PARQUET_VERSION_KEY)
    if stored is None:
        problems.append(ValidationProblem(
            None, None, None,
            f"{SAMPLES_FILE} carries no {S.PARQUET_VERSION_KEY.decode()} metadata (rewritten by another tool?)",
            severity="warning"))
    elif stored != str(S.SCHEMA_VERSION).encode():
        problems.append(ValidationProblem(
            None, None, None,
            f"{SAMPLES_FILE}: schema version {stored.decode(errors='replace')} in its metadata, "
            f"expected {S.SCHEMA_VERSION}"))
    usable: set[str] = set()
    names = schema.names
    for column in S.COLUMNS:
        if column.name not in names:
            problems.append(ValidationProblem(
                None, None, column.name, f"{SAMPLES_FILE}: column '{column.name}' ({column.type}) is missing"))
        elif names.count(column.name) > 1:
            continue  # reported below (a column name repeats)
        elif not S.types_compatible(schema.field(column.name).type, column.type):
            actual = schema.field(column.name).type
            problems.append(ValidationProblem(
                None, None, column.name,
                f"{SAMPLES_FILE}: column '{column.name}' has type {actual}, expected {column.type}"))
        else:
            usable.add(column.name)
    for name in names:
        if name not in S.COLUMN_BY_NAME:
            problems.append(ValidationProblem(
                None, None, name,
                f"{SAMPLES_FILE}: unknown column '{name}'; per-sample extras belong in the JSON column 'extra'"))
    if names.count("sample_id") > 1 or len(set(names)) != len(names):
        problems.append(ValidationProblem(None, None, None, f"{SAMPLES_FILE}: a column name repeats"))
        usable.clear()
    return usable


def _load_table(root: Path, out: Inspection, *, extra: str = "read"
                ) -> tuple[pa.Table | None, set[str], ExtraCheck | None]:
    """The raw table, the set of columns present with a usable type (``extra`` counts when the
    file has it, read or not), and what streaming ``extra`` found.

    ``extra``: "read" = in the table (``deep``), "stream" = left out of the table and parsed
    batch by batch from the same open file, "skip" = left out and not read (its values are known
    to parse). The column checks read the file's schema, so they do not depend on the choice."""
    path = root / SAMPLES_FILE
    problems = out.problems
    if not path.is_file():
        problems.append(ValidationProblem(None, None, None, f"{SAMPLES_FILE} is missing from {root}"))
        return None, set(), None
    check: ExtraCheck | None = None
    try:
        with pq.ParquetFile(path) as handle:
            schema = handle.schema_arrow
            leave_out = extra != "read" and schema.names.count("extra") == 1
            columns = [n for n in schema.names if n != "extra"] if leave_out else None
            # one thread: see read_samples_file
            table = rowscan.plain_strings(handle.read(columns=columns, use_threads=False))
            _require_text(table)
            if leave_out and extra == "stream" and S.types_compatible(schema.field("extra").type, pa.string()):
                check = _stream_extra(handle, table.num_rows)
    except Exception as exc:  # noqa: BLE001 - arrow raises several types for bad files
        problems.append(_unreadable(exc))
        return None, set(), None
    usable = _schema_checks(schema, problems)
    return table, usable, check


#: The columns :func:`_scan_samples` keeps for every row while it streams the rest: what the
#: checks across rows read (repeated ids; masks, which few rows have). ``sha256`` and
#: ``filepath`` (130 MB at a million rows) are read again only when some row is suspect (of a
#: check of its own or of a repeated id) or the ids cannot be counted.
_KEPT_COLUMNS = ("sample_id", "mask_path", "width", "height")


class _Unreadable(Exception):
    """samples.parquet does not read (or holds text that is not UTF-8) while it is streamed."""


@dataclass
class _Scan:
    """What one streaming pass over samples.parquet found (:func:`_scan_batches`)."""

    local: np.ndarray  # per row: a check of that row alone might fail (rowscan.local_suspects)
    kept: pa.Table  # the _KEPT_COLUMNS that are usable, every row
    picked: pa.Table  # every usable column of the rows where ``local``
    picked_rows: np.ndarray
    missing: list[tuple[int, str, str | None]] = field(default_factory=list)  # (row, filepath, sample_id)
    cast_error: str | None = None  # why the table would not cast to the schema (as an open casts it)


class _CastCheck:
    """Whether the streamed table would cast to the schema as :func:`inspect_dataset` casts the
    whole table (``Table.cast``: column by column in schema order, a null in a required column
    or a failed cast stops it), batch by batch: the problem is that of the first column, in
    schema order, that fails in any batch (its first failing batch's message)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.failed: dict[str, str] = {}

    def add(self, table: pa.Table) -> None:
        for name in self.names:
            if name in self.failed:
                continue
            field_ = S.SCHEMA.field(name)
            try:
                pa.table({name: table.column(name)}).cast(pa.schema([field_]))
            except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
                self.failed[name] = str(exc)

    def problem(self) -> str | None:
        return next((self.failed[name] for name in self.names if name in self.failed), None)


def _stream_columns(schema: pa.Schema) -> list[str] | None:
    """The columns :func:`_load_table` reads in an open (every column but ``extra``, and
    ``extra`` when it is text), so that the streamed check decodes exactly those; None = all."""
    if schema.names.count("extra") != 1:
        return None
    text = S.types_compatible(schema.field("extra").type, pa.string())
    return [n for n in schema.names if n != "extra"] + (["extra"] if text else [])


def _scan_batches(handle: pq.ParquetFile, usable: set[str], vocab: S.Vocabulary,
                  listing: rowscan.MediaListing | None = None) -> _Scan:
    """Stream an open samples.parquet in batches of :data:`STREAM_ROWS` rows through
    :func:`curate.store.rowscan.local_suspects` (``extra`` parsed whole, as ``json.loads``
    decides), keeping only :data:`_KEPT_COLUMNS` and the suspect rows, and look the other rows'
    images up in ``listing``. It decodes the columns an open decodes (:func:`_stream_columns`),
    so a file that an open cannot read fails here too (``_Unreadable``, with text that is not
    UTF-8 named as an open names it: the first such value outside ``extra``, else in it); the
    table's cast to the schema is checked as an open checks it (:class:`_CastCheck`)."""
    names = sorted(usable)
    keep = [name for name in _KEPT_COLUMNS if name in usable]
    schema = handle.schema_arrow
    casts = _CastCheck([n for n in S.COLUMN_NAMES if n != "extra"]) \
        if usable == set(S.COLUMN_NAMES) and len(schema.names) == len(S.COLUMN_NAMES) else None
    scan = _Scan(local=np.zeros(0, dtype=bool), kept=pa.table({}),
                 picked=pa.Table.from_batches([], schema=pa.schema([schema.field(name) for name in names])),
                 picked_rows=np.zeros(0, dtype=np.int64))
    local: list[np.ndarray] = []
    kept: dict[str, list[pa.Array]] = {name: [] for name in keep}
    picked: list[pa.Table] = []
    picked_rows: list[np.ndarray] = []
    bad_extra: str | None = None
    start = 0
    batches = handle.iter_batches(batch_size=STREAM_ROWS, columns=_stream_columns(schema), use_threads=False)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 - arrow raises several types for bad files
            raise _Unreadable(str(exc)) from exc
        table = rowscan.plain_strings(pa.Table.from_batches([batch]))
        columns = table.column_names
        try:
            _require_text(table.select([i for i, n in enumerate(columns) if n != "extra"]), start)
        except ValueError as exc:
            raise _Unreadable(str(exc)) from exc
        if bad_extra is None and "extra" in columns:
            try:
                _require_text(table.select([columns.index("extra")]), start)
            except ValueError as exc:  # reported after the other columns, as an open reports it
                bad_extra = str(exc)
        start += batch.num_rows
        if bad_extra is not None:  # the check ends there: only the decoding goes on
            continue
        table = table.select(names)
        suspect = rowscan.local_suspects(table, usable, vocab)
        if suspect.any():
            rows = np.flatnonzero(suspect)
            picked.append(table.take(pa.array(rows)))
            picked_rows.append(rows + start - batch.num_rows)
        if listing is not None and "filepath" in usable and not suspect.all():
            plain = np.flatnonzero(~suspect)
            paths = table.column("filepath")
            paths = paths if len(plain) == len(suspect) else paths.take(pa.array(plain))
            for position in np.flatnonzero(listing.missing(paths)).tolist():
                row = int(plain[position])
                sid = table.column("sample_id")[row].as_py() if "sample_id" in usable else None
                scan.missing.append((start - batch.num_rows + row, paths[position].as_py(), sid))
        for name in keep:
            kept[name].extend(table.column(name).chunks)
        if casts is not None:
            casts.add(table)
        local.append(suspect)
    if bad_extra is not None:
        raise _Unreadable(bad_extra)
    if local:
        scan.local = np.concatenate(local)
        scan.kept = pa.table({name: pa.chunked_array(kept[name], type=schema.field(name).type) for name in keep}) \
            if keep else pa.table({})
    if picked:
        scan.picked, scan.picked_rows = pa.concat_tables(picked), np.concatenate(picked_rows)
    scan.cast_error = casts.problem() if casts is not None else None
    return scan


def _scan_samples(root: Path, out: Inspection, identity: dict[str, Any] | None) -> set[str] | None:
    """:func:`check_dataset`'s check of samples.parquet, streamed (issue 29): the problems it
    finds are those of the whole-table path (:func:`_load_table` + :func:`_check_rows`), in the
    same order (tests compare the two), but no more than one batch of the wide columns
    (``extra``, ``source_url``, ``attribution``, the paths and digests: ~1 GB at a million
    collector-shaped rows) is held at a time. Every ``media/<xx>`` folder is listed before the
    pass and each batch's images are looked up as it goes; the checks across rows (repeated ids
    and hashes, :func:`curate.store.rowscan.duplicate_suspects`; masks) then run on the kept
    columns. ``identity``: samples.parquet's (:func:`curate.store.rowscan.samples_identity`)
    before it was opened; the presence record is written only if the file is still that one.
    Returns the usable columns, or None when the file is missing or does not read."""
    path = root / SAMPLES_FILE
    if not path.is_file():
        out.problems.append(ValidationProblem(None, None, None, f"{SAMPLES_FILE} is missing from {root}"))
        return None
    vocab = S.Vocabulary(out.label_space, out.backgrounds)
    schema_problems: list[ValidationProblem] = []
    try:
        handle = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - arrow raises several types for bad files
        out.problems.append(_unreadable(exc))
        return None
    with handle:
        usable = _schema_checks(handle.schema_arrow, schema_problems)
        listing, state = None, None
        if "filepath" in usable:
            folders = rowscan.media_folders(root)
            state = rowscan.folder_stamps_before_listing(root, folders, identity["samples"] if identity else None)
            listing = rowscan.MediaListing(root, folders)
        try:
            scan = _scan_batches(handle, usable, vocab, listing)
        except _Unreadable as exc:
            out.problems.append(_unreadable(exc))
            return None
        kept, local = scan.kept, scan.local
        in_kept = usable & set(kept.column_names)
        sid = kept.column("sample_id") if "sample_id" in in_kept else None
        # when every row passed its own checks and the ids can be counted, they alone tell
        # whether any row repeats (a canonical id is its sha256's start); otherwise, or when some
        # row is suspect, its digest and path are needed: read those two columns again
        repeats = rowscan.duplicate_suspects(sid, None, ~local) if sid is not None and not local.any() else None
        wanted = [name for name in ("sha256", "filepath") if name in usable]
        if wanted and len(local) and (repeats is None or repeats.any()):
            try:
                reread = rowscan.plain_strings(handle.read(columns=wanted, use_threads=False))
            except Exception as exc:  # noqa: BLE001 - arrow raises several types for bad files
                out.problems.append(_unreadable(exc))
                return None
            for name in wanted:
                kept = kept.append_column(name, reread.column(name)) if kept.num_columns else reread.select([name])
            in_kept = usable & set(kept.column_names)
    out.problems.extend(schema_problems)
    if len(local) == 0:
        return usable
    if repeats is None:  # some row is suspect, or no ids: count digests too (read again above)
        repeats = rowscan.duplicate_suspects(sid, kept.column("sha256") if "sha256" in in_kept else None, ~local)
    suspect = local | repeats
    found: list[ValidationProblem] = []
    if suspect.any():
        first_id, first_sha = _duplicate_firsts(kept, in_kept)
        _word_row_problems(root, scan.picked, scan.picked_rows, usable, out, found, first_id, first_sha, deep=False)
        # rows whose only fault is a repeated id or hash: every check of the row alone passed, so
        # the kept columns (with sha256 and filepath read again) hold all that can be said of them
        repeated = np.flatnonzero(suspect & ~local)
        if len(repeated):
            _word_row_problems(root, kept.take(pa.array(repeated)), repeated, in_kept, out, found,
                               first_id, first_sha, deep=False)
    if listing is not None:
        _plain_presence(root, scan, suspect, listing, state, identity, found)
        plain = np.flatnonzero(~suspect)
        if len(plain):
            _check_plain_masks(root, kept if len(plain) == kept.num_rows else kept.take(pa.array(plain)), in_kept,
                               plain, found)
    found.sort(key=lambda p: p.row if p.row is not None else -1)
    out.problems.extend(found)
    if scan.cast_error is not None:
        out.problems.append(ValidationProblem(None, None, None, f"{SAMPLES_FILE} does not cast to the schema: "
                                                                f"{scan.cast_error}"))
    return usable


def _plain_presence(root: Path, scan: _Scan, suspect: np.ndarray, listing: rowscan.MediaListing,
                    state: dict[str, Any] | None, identity: dict[str, Any] | None,
                    found: list[ValidationProblem]) -> None:
    """The images of the rows that are not suspect, looked up while streaming: each missing one
    is a problem (a suspect row's image is checked with its row); when none is missing, every row
    is plain and samples.parquet is still the file that was read, the presence is recorded for
    the next open (:func:`curate.store.rowscan.remember_files_present`, the same record an
    open's own listing leaves)."""
    missing = [(row, rel, sid) for row, rel, sid in scan.missing if not suspect[row]]
    found.extend(ValidationProblem(row, sid, "filepath", f"image file {rel} is missing") for row, rel, sid in missing)
    if missing or suspect.any() or state is None or rowscan.samples_identity(root) != identity:
        return
    seen = sorted(f"media/{code:02x}" for code in listing.folders_seen)
    rowscan.remember_files_present(root, {"samples": state["samples"],
                                          "folders": {folder: state["folders"].get(folder) for folder in seen}})


def inspect_dataset(root: str | Path, *, deep: bool = False, cached_files: bool = True,
                    keep_table: bool = True) -> Inspection:
    """Read and check a dataset folder; the problems and, where readable, config and table.
    ``cached_files=False`` lists the media folders even when the last complete check still holds
    and reads the logs whole; with True (what :meth:`Dataset.open` uses) only the logs' last
    lines are read (a torn write can only leave its line last; millions of log lines would
    otherwise cost seconds on every open). ``keep_table=False`` (what :func:`check_dataset`
    uses; not with ``deep``): the problems only, found by streaming samples.parquet
    (:func:`_scan_samples`), and ``table`` stays None."""
    root = Path(root)
    out = Inspection(root=root)
    if not root.is_dir():
        out.problems.append(ValidationProblem(None, None, None, f"{root} is not a folder"))
        return out
    _load_config(root, out)
    identity = rowscan.samples_identity(root)  # before the read: the record must name what was read
    known = cached_files and not deep and rowscan.extras_unchanged(root, identity)
    if keep_table or deep:
        table, usable, extra_check = _load_table(root, out, extra="read" if deep else "skip" if known else "stream")
    else:
        table, usable, extra_check, known = None, _scan_samples(root, out, identity), None, False
    if identity is not None and rowscan.samples_identity(root) != identity:
        identity = None  # replaced while it was read: which file was read is not known
    if table is None and usable is not None:  # streamed: every extra was parsed
        if "extra" in usable and not any(p.column == "extra" for p in out.problems):
            rowscan.remember_extras_valid(root, identity)
    if table is not None:
        _check_rows(root, table, usable, out, deep=deep, cached_files=cached_files, parse_extra=not known,
                    read_stamp=identity["samples"] if identity is not None else None,
                    extra_check=extra_check)
        if not known and "extra" in usable and not any(p.column == "extra" for p in out.problems):
            rowscan.remember_extras_valid(root, identity)
        deferred = "extra" in usable and "extra" not in table.column_names
        names = [n for n in S.COLUMN_NAMES if not (deferred and n == "extra")]
        if usable == set(S.COLUMN_NAMES) and len(table.column_names) == len(names):
            try:
                out.table = table.select(names).cast(pa.schema([S.SCHEMA.field(n) for n in names],
                                                               metadata=S.SCHEMA.metadata))
                out.extra_deferred = deferred
            except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
                out.problems.append(ValidationProblem(
                    None, None, None, f"{SAMPLES_FILE} does not cast to the schema: {exc}"))
    for name in (CHANGES_FILE, QUARANTINE_FILE):
        if cached_files:
            torn = _torn_tail(root / name)
            if torn:
                out.problems.append(ValidationProblem(
                    None, None, None, f"{name}: the last line is {torn} (a torn write?); it is skipped",
                    severity="warning"))
            continue
        _, bad = read_jsonl(root / name)
        for number, error in bad:
            out.problems.append(ValidationProblem(
                None, None, None, f"{name} line {number} is {error} (a torn write?); it is skipped",
                severity="warning"))
    _check_annotations(root, out, table, deep=deep)
    return out


def _check_annotations(root: Path, out: Inspection, table: pa.Table | None, *, deep: bool) -> None:
    """The problems of the annotation table and the derived label status
    (:func:`curate.store.annotation_schema.annotation_problems`, ``label_status_problems``), when
    the folder has them (issue 44)."""
    if not (root / ANNOTATIONS_FILE).is_file() and not (root / LABEL_STATUS_FILE).is_file():
        return
    if table is None or "background" not in table.column_names:
        try:
            table = read_samples_file(root / SAMPLES_FILE, ["sample_id", "background"])
        except Exception:  # noqa: BLE001 - samples.parquet's own problem is reported already
            table = None
    ids = table.column("sample_id").to_pylist() if table is not None else []
    folder = dict(zip(ids, table.column("background").to_pylist())) if table is not None else {}
    found = annotation_problems(root, out.backgrounds, ids, deep=deep) + label_status_problems(
        root, out.backgrounds, folder)
    for severity, message in found:
        out.problems.append(ValidationProblem(None, None, None, message, severity=severity))


def _torn_tail(path: Path) -> str | None:
    """What is wrong with a log's last line (not newline-terminated and not JSON), or None."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            tail = handle.read()
    except OSError:
        return None
    if not tail or tail.endswith(b"\n"):
        return None
    last = tail.rsplit(b"\n", 1)[-1]
    try:
        json.loads(last.decode("utf-8", "replace"))
    except ValueError as exc:
        return f"not JSON ({exc})"
    return None


def _check_rows(root: Path, table: pa.Table, usable: set[str], out: Inspection, *, deep: bool,
                cached_files: bool = True, parse_extra: bool = True, extra_check: ExtraCheck | None = None,
                read_stamp: list[int] | None = None) -> None:
    """Every per-row problem, in row order: :func:`~curate.store.rowscan.suspect_rows` picks the
    rows that need the exact checks (all rows when ``deep``); the others only need their files
    to be present, which directory listings answer (see :mod:`curate.store.rowscan`).
    ``parse_extra=False``: this file's ``extra`` values are known to parse. When ``table`` lacks
    ``extra`` (left out: module docstring), ``extra_check`` says which rows fault it (None: the
    values are known to parse). ``read_stamp``: samples.parquet's stamp before it was read (for
    the presence record; None records nothing)."""
    vocab = S.Vocabulary(out.label_space, out.backgrounds)
    n = table.num_rows
    if n == 0:
        return
    in_table = usable if "extra" in table.column_names else usable - {"extra"}
    if deep:
        suspect = np.ones(n, dtype=bool)
    else:
        suspect = rowscan.suspect_rows(table, in_table, vocab, parse_extra=parse_extra)
        if extra_check is not None:
            suspect |= extra_check.bad
    found: list[ValidationProblem] = []
    _check_suspect_rows(root, table, in_table, out, np.flatnonzero(suspect), found, deep=deep,
                        extra=None if in_table == usable else extra_check)
    if not deep:
        _check_plain_files(root, table, in_table, ~suspect, found, cached_files=cached_files, read_stamp=read_stamp)
    found.sort(key=lambda p: p.row if p.row is not None else -1)
    out.problems.extend(found)


def _first_rows(column: pa.ChunkedArray, values: set[str]) -> dict[str, int]:
    """value -> the first row holding it, for the given (duplicated) values."""
    if not values:
        return {}
    hits = np.flatnonzero(rowscan.numpy_mask(pc.is_in(column, value_set=pa.array(sorted(values), type=pa.string()))))
    first: dict[str, int] = {}
    for row, value in zip(hits.tolist(), column.take(pa.array(hits)).to_pylist()):
        first.setdefault(value, row)
    return first


def _duplicate_firsts(table: pa.Table, usable: set[str]) -> tuple[dict[str, int], dict[str, int]]:
    """For each ``sample_id`` and each ``sha256`` that repeats in ``table``, its first row."""
    first_id: dict[str, int] = {}
    first_sha: dict[str, int] = {}
    if "sample_id" in usable:
        sids = table.column("sample_id")
        nonempty = rowscan.numpy_mask(pc.greater(pc.utf8_length(sids), 0))
        first_id = _first_rows(sids, rowscan.duplicated_values(sids, nonempty))
    if "sha256" in usable:
        shas = table.column("sha256")
        good = rowscan.numpy_mask(pc.match_substring_regex(shas, rowscan.SHA_PATTERN))
        first_sha = _first_rows(shas, rowscan.duplicated_values(shas, good))
    return first_id, first_sha


def _check_suspect_rows(root: Path, table: pa.Table, usable: set[str], out: Inspection, rows: np.ndarray,
                        found: list[ValidationProblem], *, deep: bool, extra: ExtraCheck | None = None) -> None:
    """The exact per-row checks (the wording of every row problem) on ``rows`` of ``table``
    only. ``extra``: what streaming the column found when the table lacks it (a row it did not
    fault has a JSON object there, which the check passes like ``{}``)."""
    if len(rows) == 0:
        return
    first_id, first_sha = _duplicate_firsts(table, usable)
    subset = table.select(sorted(usable)).take(pa.array(rows))
    _word_row_problems(root, subset, rows, usable, out, found, first_id, first_sha, deep=deep, extra=extra)


def _word_row_problems(root: Path, subset: pa.Table, rows: np.ndarray, usable: set[str], out: Inspection,
                       found: list[ValidationProblem], first_id: dict[str, int], first_sha: dict[str, int], *,
                       deep: bool, extra: ExtraCheck | None = None) -> None:
    """Every problem of the rows numbered ``rows`` (in file order), whose values are the rows of
    ``subset`` (its ``usable`` columns); ``first_id`` / ``first_sha``: the first row of each
    repeated ``sample_id`` / ``sha256`` of the whole file (:func:`_duplicate_firsts`)."""
    vocab = S.Vocabulary(out.label_space, out.backgrounds)
    sub = {name: subset.column(name).to_pylist() for name in usable}
    cols: dict[str, _RowView] = {name: _RowView(rows, values) for name, values in sub.items()}
    if extra is not None:
        usable = usable | {"extra"}
        cols["extra"] = _RowView(rows, [extra.values.get(row, "{}") for row in rows.tolist()])
    ids = sub.get("sample_id")

    def add(row: int, column: str | None, message: str) -> None:
        sid = cols["sample_id"][row] if ids is not None else None
        found.append(ValidationProblem(row, sid if isinstance(sid, str) else None, column, message))

    ordered = [name for name in S.COLUMN_NAMES if name in usable]
    for row in rows.tolist():
        for name in ordered:
            message = S.check_value(name, cols[name][row], vocab)
            if message:
                add(row, name, message)
        sid = cols["sample_id"][row] if "sample_id" in cols else None
        sha = cols["sha256"][row] if "sha256" in cols else None
        if isinstance(sid, str) and sid:
            if not (S.is_hex(sid) and S.SAMPLE_ID_LENGTH <= len(sid) <= 64):
                add(row, "sample_id", f"sample_id {sid!r} is not 16-64 lowercase hex digits")
            elif isinstance(sha, str) and not sha.startswith(sid):
                add(row, "sample_id", f"sample_id {sid} is not the start of its sha256 {sha[:16]}…")
            if first_id.get(sid, row) != row:
                add(row, "sample_id", f"duplicate sample_id {sid} (first at row {first_id[sid]})")
        if isinstance(sha, str) and sha:
            if not S.is_hex(sha, 64):
                add(row, "sha256", f"sha256 {sha!r} is not 64 lowercase hex digits")
            elif first_sha.get(sha, row) != row:
                if not (isinstance(sid, str) and first_id.get(sid, row) != row):  # not already reported
                    add(row, "sha256", f"same image content (sha256) as row {first_sha[sha]}")
        _check_files(root, row, cols, add, deep)
        if "class_index" in cols and "class_name" in cols and out.label_space is not None:
            index, name = cols["class_index"][row], cols["class_name"][row]
            if index is None and name is not None:
                add(row, "class_index", f"class_name {name!r} is set but class_index is null")
            elif isinstance(index, int) and 0 <= index < len(out.label_space):
                expected = out.label_space.names[index]
                if name != expected:
                    add(row, "class_name", f"class_name {name!r} is not the name of class {index} ({expected!r})")


class _RowView:
    """A column's values for some rows, indexed by the global row number."""

    def __init__(self, rows: np.ndarray, values: list) -> None:
        self._at = dict(zip(rows.tolist(), values))

    def __getitem__(self, row: int):
        return self._at[row]


def _check_plain_files(root: Path, table: pa.Table, usable: set[str], keep: np.ndarray,
                       found: list[ValidationProblem], *, cached_files: bool = True,
                       read_stamp: list[int] | None = None) -> None:
    """Files of the rows whose paths are in canonical form (not suspect): every image present
    (:class:`curate.store.rowscan.MediaListing`), every mask present and of its image's size
    (:func:`_check_plain_masks`)."""
    if not keep.any() or "filepath" not in usable:
        return
    rows = np.flatnonzero(keep)
    picked = table if len(rows) == table.num_rows else table.take(pa.array(rows))
    ids = picked.column("sample_id") if "sample_id" in usable else None

    def add(position: int, column: str, message: str) -> None:
        sid = ids[position].as_py() if ids is not None else None
        found.append(ValidationProblem(int(rows[position]), sid, column, message))

    paths = picked.column("filepath")
    folders = sorted(set(pc.unique(pc.utf8_slice_codeunits(paths, 0, 8)).to_pylist()))
    if not (cached_files and rowscan.files_unchanged(root, folders)):
        state = rowscan.folder_stamps_before_listing(root, folders, read_stamp)
        missing = np.flatnonzero(rowscan.MediaListing(root, folders).missing(paths))
        for position in missing.tolist():
            add(position, "filepath", f"image file {paths[position].as_py()} is missing")
        if len(missing) == 0 and keep.all():
            rowscan.remember_files_present(root, state)
    _check_plain_masks(root, picked, usable, rows, found)


def _check_plain_masks(root: Path, picked: pa.Table, usable: set[str], rows: np.ndarray,
                       found: list[ValidationProblem]) -> None:
    """Masks of the rows numbered ``rows`` (canonical paths; their values are ``picked``'s
    rows): each present and of its image's size (a mask's PNG header is read; ~10 µs a mask)."""
    if "mask_path" not in usable:
        return
    masks = picked.column("mask_path")
    with_mask = np.flatnonzero(rowscan.numpy_mask(pc.is_valid(masks)))
    if len(with_mask) == 0:
        return
    ids = picked.column("sample_id") if "sample_id" in usable else None

    def add(position: int, message: str) -> None:
        sid = ids[position].as_py() if ids is not None else None
        found.append(ValidationProblem(int(rows[position]), sid, "mask_path", message))

    mask_files = rowscan.listed_files(root, [MASKS_DIR])
    widths = picked.column("width").to_pylist() if "width" in usable else None
    heights = picked.column("height").to_pylist() if "height" in usable else None
    for position in with_mask.tolist():
        rel = masks[position].as_py()
        if rel not in mask_files:
            add(position, f"mask file {rel} is missing")
            continue
        try:
            actual = rowscan.png_size(root / rel) or image_size(root / rel)
        except Exception as exc:  # noqa: BLE001
            add(position, f"mask file {rel} does not read as an image: {exc}")
            continue
        if widths is not None and heights is not None:
            size = (widths[position], heights[position])
            if isinstance(size[0], int) and isinstance(size[1], int) and actual != size:
                add(position, f"mask {rel} is {actual[0]}x{actual[1]} but the image is {size[0]}x{size[1]}")


def _check_files(root: Path, row: int, cols: Mapping[str, Any], add, deep: bool) -> None:
    """Image and mask files of one row: safe paths, present, sizes (and hashes when deep)."""

    def cell(name: str) -> Any:
        return cols[name][row] if name in cols else None

    width, height = cell("width"), cell("height")
    size = (width, height) if isinstance(width, int) and isinstance(height, int) else None
    if "filepath" in cols:
        rel = cols["filepath"][row]
        why = safe_relpath(rel, MEDIA_DIR)
        if why:
            add(row, "filepath", f"filepath {why}")
        else:
            sha = cell("sha256")
            if isinstance(sha, str) and S.is_hex(sha, 64):
                suffix = PurePosixPath(rel).suffix
                if rel != S.media_relpath(sha, suffix.lstrip(".")):
                    add(row, "filepath", f"filepath {rel!r} does not match its sha256 "
                                         f"(expected media/{sha[:2]}/{sha}{suffix})")
            path = root / rel
            if not path.is_file():
                add(row, "filepath", f"image file {rel} is missing")
            elif deep:
                try:
                    data = path.read_bytes()
                    if isinstance(sha, str) and hashlib.sha256(data).hexdigest() != sha:
                        add(row, "sha256", f"image file {rel} does not hash to its sha256 (modified?)")
                    actual = image_size(path)
                    if size and actual != size:
                        add(row, "width", f"image file {rel} is {actual[0]}x{actual[1]}, "
                                          f"the row says {size[0]}x{size[1]}")
                except Exception as exc:  # noqa: BLE001
                    add(row, "filepath", f"image file {rel} does not read: {exc}")
    if "mask_path" in cols and cols["mask_path"][row] is not None:
        rel = cols["mask_path"][row]
        why = safe_relpath(rel, MASKS_DIR)
        if why:
            add(row, "mask_path", f"mask_path {why}")
        else:
            path = root / rel
            if not path.is_file():
                add(row, "mask_path", f"mask file {rel} is missing")
            else:
                try:
                    actual = image_size(path)
                except Exception as exc:  # noqa: BLE001
                    add(row, "mask_path", f"mask file {rel} does not read as an image: {exc}")
                else:
                    if size and actual != size:
                        add(row, "mask_path", f"mask {rel} is {actual[0]}x{actual[1]} but the image is "
                                              f"{size[0]}x{size[1]}")
                    if deep:  # the pixels too, as the stages read them (a file cut after its header)
                        try:
                            decode(path.read_bytes())
                        except (OSError, ImageRejected) as exc:
                            add(row, "mask_path", f"mask file {rel} does not decode: {exc}")
