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

``extra`` is the one column whose check means parsing text (JSON), a few µs a value: at a
million collector-shaped rows every value is distinct. :func:`suspect_rows` parses them all
(:func:`extra_not_objects`) or, when :func:`extras_unchanged` says that this very file was
parsed before (or committed by curate's writers on top of such a file), checks only their
shape (:func:`extra_shape_suspects`); see docs/design.md#dataset-folder for the guarantee.

File presence for the rows that are not suspect is checked against directory listings
(:func:`listed_files`, ``os.scandir``: one ``getdents`` per folder instead of a ``stat`` per
file). We write these kernels ourselves because no library validates a parquet table against
vocabularies that live in ``dataset.yaml``.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

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


#: The public name of :func:`_np`, for the other store modules.
numpy_mask = _np


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


#: Rows per call of arrow's JSON reader when ``extra`` is parsed whole: large enough that the
#: per-call cost vanishes, small enough that a segment arrow refuses costs little in Python.
EXTRA_SEGMENT_ROWS = 65_536
_EXTRA_PARSE = pa_json.ParseOptions(explicit_schema=pa.schema([]), unexpected_field_behavior="ignore",
                                    newlines_in_values=False)


def extra_shape_suspects(column: pa.ChunkedArray) -> np.ndarray:
    """Rows whose non-null ``extra`` does not start with ``{`` and end with ``}`` (read from the
    raw buffers: ~0.03 s at a million rows). Every JSON object curate writes has that shape, and
    so do nearly all others (only surrounding whitespace, which ``json.loads`` allows, escapes
    it), so the rows flagged go through the exact per-row check, which words the problem. It
    catches the usual hand damage (empty, plain text, a list, a cut-off text) without parsing."""
    parts: list[np.ndarray] = []
    for chunk in column.chunks:
        fast = _shape_bad_bytes(chunk)
        if fast is None:
            shaped = pc.and_(pc.starts_with(chunk, "{"), pc.ends_with(chunk, "}"))
            fast = _np(pc.and_(pc.is_valid(chunk), pc.invert(shaped)))
        parts.append(fast)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def _shape_bad_bytes(arr: pa.Array) -> np.ndarray | None:
    """:func:`extra_shape_suspects` of one null-free string array from its raw buffers: the first
    and last byte of each value (a gather of 2n bytes instead of two string kernels); None when
    the array has nulls or another type."""
    if arr.null_count or not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return None
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=bool)
    offsets_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=offsets_type)[arr.offset: arr.offset + n + 1]
    data_buf = arr.buffers()[2]
    if data_buf is None or data_buf.size == 0:  # every value empty
        return np.ones(n, dtype=bool)
    data = np.frombuffer(data_buf, dtype=np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    empty = ends <= starts
    first = data[np.where(empty, 0, starts)]
    last = data[np.where(empty, 0, ends - 1)]
    return empty | (first != ord("{")) | (last != ord("}"))


def _as_utf8(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column
    return column.cast(pa.large_string())  # string_view and the like


def _segment_bad(values: pa.Array) -> np.ndarray | None:
    """Per row of ``values`` (no nulls, every value shaped ``{...}``): whether it is not a JSON
    object, told by arrow's JSON reader (C++, ~1 µs a row against ~5 µs for ``json.loads``);
    None when the reader cannot tell (the caller then parses the segment in Python).

    The values are joined by newlines and read as newline-delimited JSON. The answer "no row is
    bad" is only trusted when the reader raised nothing *and* returned exactly one row per value:
    every value starts with ``{``, so each yields at least one document or an error, hence the
    count forces exactly one document per value; a newline can neither sit inside a JSON string
    nor join ``}`` to ``{`` within one document, so no document spans two values. Everything the
    reader accepts, ``json.loads`` accepts too (standard JSON; the reader is the stricter one:
    no NaN, no lone surrogate escapes), except nesting deeper than Python's recursion limit,
    which :func:`extra_not_objects` sends to ``json.loads`` beforehand (:func:`_deep_suspects`);
    so a row never passes here that Python would refuse (tests/test_store_million.py compares
    the two on awkward values).
    """
    joined = pc.binary_join_element_wise(values, pa.scalar("", values.type), pa.scalar("\n", values.type))
    offsets_type = np.int64 if pa.types.is_large_string(joined.type) else np.int32
    offsets = np.frombuffer(joined.buffers()[1], dtype=offsets_type)[joined.offset: joined.offset + len(joined) + 1]
    data = joined.buffers()[2]
    size = int(offsets[-1] - offsets[0])
    if size == 0:
        return None
    text = data.slice(int(offsets[0]), size)
    options = pa_json.ReadOptions(block_size=max(1 << 20, size + 1), use_threads=False)
    try:
        parsed = pa_json.read_json(pa.BufferReader(text), read_options=options, parse_options=_EXTRA_PARSE)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if parsed.num_rows != len(values):
        return None
    return np.zeros(len(values), dtype=bool)


#: Values at least this long are counted for brackets (:func:`_deep_suspects`); a shorter one
#: cannot nest deeper than half of it.
_DEEP_LENGTH = 800
#: Values with this many ``{`` and ``[`` go to ``json.loads``, which refuses nesting deeper than
#: the interpreter's recursion limit (1,000 by default) where arrow's reader does not.
_DEEP_BRACKETS = 400


def _deep_suspects(column: pa.ChunkedArray) -> np.ndarray:
    """Rows whose ``extra`` might nest deeper than ``json.loads`` can follow: at least
    :data:`_DEEP_BRACKETS` opening brackets (counted only in values of :data:`_DEEP_LENGTH`
    bytes or more, so a column of ordinary provenance costs one length kernel)."""
    long = _np(pc.greater_equal(pc.binary_length(column), _DEEP_LENGTH))
    deep = np.zeros(len(column), dtype=bool)
    rows = np.flatnonzero(long)
    if len(rows):
        values = column.take(pa.array(rows))
        brackets = pc.add(pc.count_substring(values, "{"), pc.count_substring(values, "["))
        deep[rows] = _np(pc.greater_equal(brackets, _DEEP_BRACKETS))
    return deep


def _python_bad(values: pa.Array) -> np.ndarray:
    """Per row: ``json.loads`` refuses the value or it is not an object (the definition)."""
    bad = np.zeros(len(values), dtype=bool)
    for i, text in enumerate(values.to_pylist()):
        if text is None:
            continue
        try:
            bad[i] = not isinstance(json.loads(text), dict)
        except (ValueError, RecursionError):
            bad[i] = True
    return bad


def extra_not_objects(column: pa.ChunkedArray) -> np.ndarray:
    """Rows whose non-null ``extra`` is not a JSON object, exactly as ``json.loads`` decides
    (what :func:`curate.store.schema.check_value` says), parsing every value.

    Values not shaped ``{...}`` (:func:`extra_shape_suspects`: rare) go to ``json.loads``; the rest are read
    by arrow's JSON reader in segments of :data:`EXTRA_SEGMENT_ROWS` rows (:func:`_segment_bad`),
    and only a segment that the reader refuses goes through ``json.loads`` row by row, which then
    names the bad rows. About 1 CPU-s at a million collector-shaped rows (~650 bytes each)
    against 4-7 s for ``json.loads`` on every value.
    """
    column = _as_utf8(column)
    shape = extra_shape_suspects(column) | _deep_suspects(column)
    bad = np.zeros(len(column), dtype=bool)
    odd = np.flatnonzero(shape)
    if len(odd):  # rare (" {}" is still an object; deep nesting): json.loads decides
        bad[odd] = _python_bad(column.take(pa.array(odd)).combine_chunks())
    start = 0
    for chunk in column.chunks:
        for first in range(0, len(chunk), EXTRA_SEGMENT_ROWS):
            piece = chunk.slice(first, EXTRA_SEGMENT_ROWS)
            rows = slice(start + first, start + first + len(piece))
            unusable = shape[rows] | _np(pc.is_null(piece))
            if unusable.all():
                continue
            plain = pc.if_else(pa.array(unusable), pa.scalar("{}", piece.type), piece) if unusable.any() else piece
            verdict = _segment_bad(plain)
            if verdict is None:
                verdict = _python_bad(plain)
            bad[rows] |= verdict & ~unusable
        start += len(chunk)
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
    # slices of 65,536 rows keep numpy's temporaries a few MB (reused by the allocator) instead
    # of hundreds of MB of fresh pages per call, which cost more system than user time on a VM
    for batch in table.select(["sample_id", "sha256", "filepath"]).to_batches(max_chunksize=65_536):
        if batch.num_rows == 0:
            continue
        bad = _identity_batch(batch.column(0), batch.column(1), batch.column(2))
        if bad is None:
            return None
        parts.append(bad)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def suspect_rows(table: pa.Table, usable: set[str], vocab: S.Vocabulary, *, parse_extra: bool = True) -> np.ndarray:
    """Boolean per row: true where any per-row value check might fail (see the module docstring).

    Covers: required values null, the choice columns outside their vocabularies, class index
    range and class name, finite background score, positive sizes, tags, ``extra`` JSON, empty
    identity strings, the canonical ``sample_id`` / ``sha256`` / ``filepath`` / ``mask_path``
    forms and their agreement, and duplicated ``sample_id`` or ``sha256``.

    ``parse_extra=False`` checks only the shape of ``extra`` (:func:`extra_shape_suspects`)
    instead of parsing every value (:func:`extra_not_objects`); the caller passes it only when
    :func:`extras_unchanged` says that this very file's ``extra`` values were parsed before.
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
        suspect |= extra_not_objects(extra) if parse_extra else extra_shape_suspects(extra)
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


#: Where :func:`remember_extras_valid` records that every ``extra`` of one samples.parquet parsed.
EXTRA_CHECK_CACHE = ".curate.extracheck.json"
#: How much of samples.parquet's end is hashed into its identity (the footer and the last pages).
_TAIL_BYTES = 65_536


def samples_identity(root: Path) -> dict[str, Any] | None:
    """Which samples.parquet is at ``root`` now: its (inode, mtime_ns, size) and the sha256 of its
    last 64 KiB (the parquet footer: row-group offsets and sizes, column statistics), or None
    when it is missing or was replaced while this was read.

    Any rewrite changes the inode (curate's atomic replace, most editors) or the mtime, almost
    always the size, and the footer; hashing the footer covers a same-size rewrite in place
    within one mtime tick. ~0.1 ms."""
    path = root / "samples.parquet"
    before = _samples_stamp(root)
    if before is None:
        return None
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, before[2] - _TAIL_BYTES))
            tail = handle.read(_TAIL_BYTES)
    except OSError:
        return None
    if _samples_stamp(root) != before:
        return None
    return {"samples": before, "tail": hashlib.sha256(tail).hexdigest()}


def extras_unchanged(root: Path, identity: dict[str, Any] | None) -> bool:
    """Whether every ``extra`` of the samples.parquet with this ``identity`` (from
    :func:`samples_identity`) is known to be a JSON object: it was parsed whole by an earlier
    validation (:func:`extra_not_objects`), or it was committed by curate's writers on top of
    such a file (they write ``extra`` only as ``json.dumps`` of a mapping, checked before the
    commit, and carry this record forward after it). Any other write of samples.parquet gives a
    new identity, so a hand-edited ``extra`` is always parsed again."""
    if identity is None:
        return False
    try:
        cached = json.loads((root / EXTRA_CHECK_CACHE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cached, dict) and cached.get("version") == 1 and \
        cached.get("samples") == identity["samples"] and cached.get("tail") == identity["tail"]


def remember_extras_valid(root: Path, identity: dict[str, Any] | None) -> None:
    """Record that the samples.parquet with ``identity`` holds only JSON objects in ``extra``
    (written atomically after the fact: a writer killed before this leaves an older record, which
    matches no file, so the next open parses again). A read-only folder keeps no record."""
    if identity is None:
        return
    from curate.store.atomic import atomic_write_beside

    try:
        atomic_write_beside(root / EXTRA_CHECK_CACHE, json.dumps({"version": 1, **identity}).encode("utf-8"),
                            fsync=False)  # the file it names is durable already; a lost record costs one parse
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


def listed_paths(root: Path, folders: Iterable[str]) -> pa.Array:
    """:func:`listed_files` as an arrow string array (for ``pc.is_in`` against a path column):
    the names come from ``os.scandir`` (a regular file, or a symlink to one, as ``is_file``
    says) and the ``folder/`` prefix is joined by arrow, so no Python string is built per path
    (~0.5 s less at a million files than a set of joined strings)."""
    parts: list[pa.Array] = []
    for folder in folders:
        prefix = folder.rstrip("/") + "/"
        try:
            with os.scandir(root / folder) as entries:
                names = [entry.name for entry in entries if entry.is_file()]
        except (FileNotFoundError, NotADirectoryError):
            continue
        if names:
            parts.append(pc.binary_join_element_wise(prefix, pa.array(names, type=pa.string()), ""))
    return pa.concat_arrays(parts) if parts else pa.array([], type=pa.string())


def png_size(path: Path) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR (24 bytes read), or None when it is not a PNG."""
    with open(path, "rb") as handle:
        head = handle.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
