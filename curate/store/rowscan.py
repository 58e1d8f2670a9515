"""Whole-column checks of ``samples.parquet`` with pyarrow compute: which rows need a closer look.

:func:`curate.store.validate.inspect_dataset` used to run every check cell by cell in Python
(about 23 million calls at a million rows, tens of seconds). Almost every row of a folder that
curate wrote is fine, so validation now runs in two passes (docs/design.md#dataset-folder):

1. :func:`suspect_rows` evaluates, per column and with arrow kernels, a condition that is true
   for every row the per-row checks of :mod:`curate.store.validate` would fault (a superset:
   anything not in curate's own canonical form, e.g. a ``sample_id`` longer than 16 digits,
   is suspect too). It costs a few hundred milliseconds at a million rows.
2. Only the suspect rows go through the exact per-row checks, which word the problems; a row
   that is not suspect provably has none of the value problems, so the messages and the rows
   named are the same as checking everything by hand.

File presence for the rows that are not suspect is checked against directory listings
(:func:`listed_files`, ``os.scandir``: one ``getdents`` per folder instead of a ``stat`` per
file). We write these kernels ourselves because no library validates a parquet table against
vocabularies that live in ``dataset.yaml``.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curate.store import schema as S

#: The canonical forms curate writes; anything else is left to the exact per-row checks.
SHA_PATTERN = r"^[0-9a-f]{64}$"
SAMPLE_ID_PATTERN = r"^[0-9a-f]{16}$"
FILEPATH_PATTERN = r"^media/[0-9a-f]{2}/[0-9a-f]{64}\.[A-Za-z0-9]+$"
MASK_PATTERN = r"^masks/[0-9a-f]{16,64}(\.[0-9a-f]{8})?\.png$"


def _np(mask: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A boolean arrow mask (nulls = False) as a numpy bool array."""
    filled = pc.fill_null(mask, False)
    if isinstance(filled, pa.ChunkedArray):
        filled = filled.combine_chunks() if filled.num_chunks != 1 else filled.chunk(0)
    return filled.to_numpy(zero_copy_only=False).astype(bool, copy=False)


def _not_in(column: pa.ChunkedArray, allowed: Iterable[str]) -> np.ndarray:
    """Rows whose non-null value is not among ``allowed``."""
    allowed = list(allowed)
    inside = pc.is_in(column, value_set=pa.array(allowed, type=pa.string()))
    return _np(pc.and_(pc.is_valid(column), pc.invert(inside)))


def _not_matching(column: pa.ChunkedArray, pattern: str) -> np.ndarray:
    """Rows whose non-null value does not match the regular expression."""
    return _np(pc.and_(pc.is_valid(column), pc.invert(pc.match_substring_regex(column, pattern))))


def duplicated_values(column: pa.ChunkedArray, valid: np.ndarray | None = None) -> set[str]:
    """The values occurring more than once (among the rows where ``valid``, when given)."""
    values = column if valid is None else column.filter(pa.array(valid))
    counts = pc.value_counts(values)
    if len(counts) == 0:
        return set()
    several = counts.filter(pc.greater(counts.field("counts"), 1))
    return {v for v in several.field("values").to_pylist() if v is not None}


def _bad_extras(column: pa.ChunkedArray) -> set[str]:
    """Distinct ``extra`` texts that are not a JSON object (parsed once per distinct value)."""
    bad: set[str] = set()
    for text in pc.unique(column).to_pylist():
        if text is None:
            continue
        try:
            if not isinstance(json.loads(text), dict):
                bad.add(text)
        except ValueError:
            bad.add(text)
    return bad


_HEX_LUT = np.full(256, 255, dtype=np.uint8)
_HEX_LUT[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10, dtype=np.uint8)
_HEX_LUT[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16, dtype=np.uint8)


def _hex16_unique(column: pa.ChunkedArray) -> bool:
    """True when every value is 16 lowercase hex digits and no two are equal; False when that is
    not so *or* cannot be told this way (the caller then hashes the strings).

    Sixteen hex digits are a 64-bit integer: parsing them with numpy and sorting the integers
    takes ~0.1 s at a million rows, hashing the strings (``count_distinct``) ~0.7 s.
    """
    arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    n = len(arr)
    if n == 0 or arr.null_count or not pa.types.is_string(arr.type):
        return False
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[arr.offset: arr.offset + n + 1]
    if offsets[-1] - offsets[0] != 16 * n or not (np.diff(offsets) == 16).all():
        return False
    nibbles = _HEX_LUT[np.frombuffer(data_buf, dtype=np.uint8)[offsets[0]: offsets[-1]]].reshape(n, 16)
    if (nibbles == 255).any():
        return False
    packed = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    values = np.sort(np.ascontiguousarray(packed).view(">u8").ravel())
    return not bool((values[1:] == values[:-1]).any())


def _fixed_width(arr: pa.Array) -> np.ndarray | None:
    """A string array's values as an (n, width) uint8 matrix (no copy) when all are non-null and
    of one byte length, else None."""
    n = len(arr)
    if n == 0 or arr.null_count or not pa.types.is_string(arr.type):
        return None
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[arr.offset: arr.offset + n + 1]
    width = int(offsets[1] - offsets[0])
    if width == 0 or offsets[-1] - offsets[0] != width * n or not (np.diff(offsets) == width).all():
        return None
    return np.frombuffer(data_buf, dtype=np.uint8)[offsets[0]: offsets[-1]].reshape(n, width)


_MEDIA = np.frombuffer(b"media/", dtype=np.uint8)


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, whether two (n, w) byte matrices are equal (one memcmp per row)."""
    void = np.dtype((np.void, a.shape[1]))
    return np.ascontiguousarray(a).view(void).ravel() == np.ascontiguousarray(b).view(void).ravel()


def _not_hex(m: np.ndarray) -> np.ndarray:
    """Per row of a byte matrix: any byte that is not 0-9 or a-f (uint8 arithmetic wraps, so one
    comparison per range)."""
    return ~(((m - 48) < 10) | ((m - 97) < 6)).all(axis=1)


def _not_alnum(m: np.ndarray) -> np.ndarray:
    lower = m | 0x20
    return ~(((m - 48) < 10) | ((lower - 97) < 26)).all(axis=1)


def _identity_batch(sid: pa.Array, sha: pa.Array, path: pa.Array) -> np.ndarray | None:
    sha_m, sid_m, path_m = _fixed_width(sha), _fixed_width(sid), _fixed_width(path)
    if sha_m is None or sid_m is None or path_m is None or sha_m.shape[1] != 64:
        return None
    if sid_m.shape[1] != S.SAMPLE_ID_LENGTH or path_m.shape[1] < 76:
        return None
    n = sha_m.shape[0]
    bad = _not_hex(sha_m)
    bad |= ~_rows_equal(sid_m, sha_m[:, : S.SAMPLE_ID_LENGTH])
    bad |= ~_rows_equal(path_m[:, :6], np.broadcast_to(_MEDIA, (n, 6)))
    bad |= ~_rows_equal(path_m[:, 6:8], sha_m[:, :2])
    bad |= path_m[:, 8] != ord("/")
    bad |= ~_rows_equal(path_m[:, 9:73], sha_m)
    bad |= path_m[:, 73] != ord(".")
    bad |= _not_alnum(path_m[:, 74:])
    return bad


def _identity_suspects(table: pa.Table) -> np.ndarray | None:
    """Rows whose ``sample_id`` / ``sha256`` / ``filepath`` are not in canonical form
    (``sha256`` 64 lowercase hex, ``sample_id`` its first 16, ``filepath``
    ``media/<sha[:2]>/<sha>.<alnum ext>``), computed batch by batch on the raw bytes with numpy
    when each column has one byte length per batch (what curate writes; ~0.2 s at a million rows
    against ~1 s for a regular expression and substring kernels); None when that does not hold
    (the caller then uses arrow kernels)."""
    parts: list[np.ndarray] = []
    for batch in table.select(["sample_id", "sha256", "filepath"]).to_batches():
        if batch.num_rows == 0:
            continue
        bad = _identity_batch(batch.column(0), batch.column(1), batch.column(2))
        if bad is None:
            return None
        parts.append(bad)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def suspect_rows(table: pa.Table, usable: set[str], vocab: S.Vocabulary) -> np.ndarray:
    """Boolean per row: true where any per-row value check might fail (see the module docstring).

    Covers: required values null, the choice columns outside their vocabularies, class index
    range and class name, finite background score, positive sizes, tags, ``extra`` JSON, empty
    identity strings, the canonical ``sample_id`` / ``sha256`` / ``filepath`` / ``mask_path``
    forms and their agreement, and duplicated ``sample_id`` or ``sha256``.
    """
    n = table.num_rows
    suspect = np.zeros(n, dtype=bool)
    if n == 0:
        return suspect

    def col(name: str) -> pa.ChunkedArray | None:
        return table.column(name) if name in usable else None

    for name in usable:
        if name in S.REQUIRED_COLUMNS:
            suspect |= _np(pc.is_null(table.column(name)))
    choices = {"status": S.STATUSES, "group": S.GROUPS, "background_source": S.BACKGROUND_SOURCES}
    if vocab.backgrounds is not None:
        choices["background"] = tuple(vocab.backgrounds)
    for name, allowed in choices.items():
        if (column := col(name)) is not None:
            suspect |= _not_in(column, allowed)
    index = col("class_index")
    if index is not None and vocab.label_space is not None:
        size = len(vocab.label_space)
        suspect |= _np(pc.or_(pc.less(index, 0), pc.greater_equal(index, size)))
        names = col("class_name")
        if names is not None:
            suspect |= _np(pc.and_(pc.is_null(index), pc.is_valid(names)))
            in_range = pc.and_(pc.greater_equal(index, 0), pc.less(index, size))
            safe_index = pc.if_else(in_range, index, 0)
            expected = pc.take(pa.array(list(vocab.label_space.names), type=pa.string()), safe_index)
            differs = pc.or_kleene(pc.not_equal(names, expected), pc.is_null(names))
            suspect |= _np(pc.and_(in_range, differs))
    if (score := col("background_score")) is not None:
        suspect |= _np(pc.and_(pc.is_valid(score), pc.invert(pc.is_finite(score))))
    for name in ("width", "height"):
        if (column := col(name)) is not None:
            suspect |= _np(pc.less_equal(column, 0))
    if (tags := col("tags")) is not None:
        flat = pc.list_flatten(tags)
        bad_tag = _np(pc.or_(pc.is_null(flat), pc.equal(pc.utf8_length(pc.fill_null(flat, "")), 0)))
        if bad_tag.any():
            parents = pc.list_parent_indices(tags).to_numpy(zero_copy_only=False)
            suspect[np.unique(parents[bad_tag])] = True
    if (extra := col("extra")) is not None:
        bad = _bad_extras(extra)
        if bad:
            suspect |= _np(pc.is_in(extra, value_set=pa.array(sorted(bad), type=pa.string())))
    for name in ("source", "sample_id", "filepath", "sha256"):
        if (column := col(name)) is not None:
            suspect |= _np(pc.equal(pc.utf8_length(column), 0))
    sid, sha, path = col("sample_id"), col("sha256"), col("filepath")
    fast = _identity_suspects(table) if sid is not None and sha is not None and path is not None else None
    if fast is not None:
        suspect |= fast
    elif sid is not None and sha is not None and path is not None:
        # One regular expression: a filepath in canonical form that holds the sha256 (and whose
        # sample_id is the sha256's first 16 digits) makes both of those canonical as well.
        suspect |= _not_matching(path, FILEPATH_PATTERN)
        suspect |= _np(pc.not_equal(pc.utf8_slice_codeunits(path, 6, 8), pc.utf8_slice_codeunits(sha, 0, 2)))
        suspect |= _np(pc.not_equal(pc.utf8_slice_codeunits(path, 9, 73), sha))
        suspect |= _np(pc.not_equal(sid, pc.utf8_slice_codeunits(sha, 0, S.SAMPLE_ID_LENGTH)))
        suspect |= _np(pc.not_equal(pc.utf8_length(sha), 64))
    else:
        for column, pattern in ((sid, SAMPLE_ID_PATTERN), (sha, SHA_PATTERN), (path, FILEPATH_PATTERN)):
            if column is not None:
                suspect |= _not_matching(column, pattern)
    canonical = ~suspect
    for column in (sid, sha):
        # rows still canonical have sample_id = sha256[:16], so unique ids there imply unique hashes
        if column is None or (column is sha and sid is not None and canonical.all()):
            continue
        if (column is sid and _hex16_unique(column)) or pc.count_distinct(column, mode="all").as_py() == len(column):
            continue
        dups = duplicated_values(column)
        if dups:
            suspect |= _np(pc.is_in(column, value_set=pa.array(sorted(dups), type=pa.string())))
    if (mask := col("mask_path")) is not None:
        suspect |= _not_matching(mask, MASK_PATTERN)
    return suspect


#: Where :func:`files_unchanged` keeps what the last complete file check saw.
FILE_CHECK_CACHE = ".curate.filecheck.json"


def _folder_stamps(root: Path, folders: Iterable[str]) -> dict[str, int | None]:
    stamps: dict[str, int | None] = {}
    for folder in folders:
        try:
            stamps[folder] = os.stat(root / folder).st_mtime_ns
        except OSError:
            stamps[folder] = None
    return stamps


def _samples_stamp(root: Path) -> list[int] | None:
    try:
        st = os.stat(root / "samples.parquet")
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns, st.st_size]


def files_unchanged(root: Path, folders: list[str] | None) -> bool:
    """Whether the last complete presence check (:func:`remember_files_present`) still holds:
    samples.parquet is the same file and no folder holding its images had an entry created,
    removed or renamed since (a folder's mtime changes with each). Listing a million directory
    entries costs 1-3 s, a few hundred ``stat`` calls nothing. A file rewritten in place keeps
    its folder's mtime; its bytes are ``curate check --deep``'s business."""
    try:
        cached = json.loads((root / FILE_CHECK_CACHE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(cached, dict) or cached.get("samples") != _samples_stamp(root):
        return False
    recorded = cached.get("folders")
    if not isinstance(recorded, dict):
        return False
    return recorded == _folder_stamps(root, recorded if folders is None else folders)


def carry_forward(root: Path, added_folders: Iterable[str] = ()) -> None:
    """After a commit by a writer that found the record valid (``files_unchanged(root, None)``)
    under the lock before writing: record the new samples.parquet and the folders it wrote into.
    The writer knows every file it added is there; what it cannot see is a file deleted by hand
    in one of those folders *during* its own write, which the next ``curate check`` (which
    never uses the record) reports."""
    try:
        cached = json.loads((root / FILE_CHECK_CACHE).read_text(encoding="utf-8"))
        folders = set(cached["folders"]) | set(added_folders)
    except (OSError, ValueError, KeyError, TypeError):
        return
    remember_files_present(root, {"samples": _samples_stamp(root), "folders": _folder_stamps(root, sorted(folders))})


def folder_stamps_before_listing(root: Path, folders: list[str]) -> dict[str, Any]:
    """The state to record if the listing that follows finds every file (taken *before* it, so a
    change during the listing invalidates the record)."""
    return {"samples": _samples_stamp(root), "folders": _folder_stamps(root, folders)}


def remember_files_present(root: Path, state: dict[str, Any]) -> None:
    """Record ``state`` (from :func:`folder_stamps_before_listing`) after a listing found every
    file; a folder that cannot be written (read-only media) just keeps no record."""
    from curate.store.atomic import atomic_write_beside

    try:
        atomic_write_beside(root / FILE_CHECK_CACHE, json.dumps(state).encode("utf-8"))
    except OSError:
        pass


def listed_files(root: Path, folders: Iterable[str]) -> set[str]:
    """Paths ``folder/name`` (relative to ``root``) of the regular files in each folder.

    A symlink counts when it points at a regular file (as ``Path.is_file`` does); a folder that
    is missing lists nothing.
    """
    found: set[str] = set()
    for folder in folders:
        prefix = folder.rstrip("/") + "/"
        try:
            with os.scandir(root / folder) as entries:
                found.update(prefix + entry.name for entry in entries if entry.is_file())
        except (FileNotFoundError, NotADirectoryError):
            continue
    return found


def png_size(path: Path) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR (24 bytes read), or None when it is not a PNG."""
    with open(path, "rb") as handle:
        head = handle.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
