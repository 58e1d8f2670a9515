"""Whole-column checks of ``samples.parquet`` with pyarrow compute: which rows need a closer look.

Why it is long (one job): deciding which rows and files validate's slow per-row checks must see; each
column rule needs its own arrow-kernel superset, plus the stamps that let a re-open skip unchanged files.

:func:`curate.store.validate.inspect_dataset` used to run every check cell by cell in Python
(about 23 million calls at a million rows, tens of seconds). Almost every row of a folder that
curate wrote is fine, so validation now runs in two passes (docs/design.md#dataset-folder):

1. :func:`suspect_rows` evaluates, per column and with arrow kernels, a condition that is true
   for every row the per-row checks of :mod:`curate.store.validate` would fault (a superset:
   anything not in curate's own canonical form, e.g. a ``sample_id`` longer than 16 digits,
   is suspect too). It costs a few hundred milliseconds at a million rows. It is the union of
   :func:`local_suspects` (each row alone, so a file can be checked batch by batch) and
   :func:`duplicate_suspects` (ids and digests repeated across rows).
2. Only the suspect rows go through the exact per-row checks, which word the problems; a row
   that is not suspect provably has none of the value problems, so the messages and the rows
   named are the same as checking everything by hand.

``extra`` is the one column whose check means parsing text (JSON), a few µs a value: at a
million collector-shaped rows every value is distinct. :func:`suspect_rows` parses them all
(:func:`extra_not_objects`) or, when :func:`extras_unchanged` says that this very file was
parsed before (or committed by curate's writers on top of such a file), checks only their
shape (:func:`extra_shape_suspects`); see docs/design.md#dataset-folder for the guarantee.

File presence for the rows that are not suspect is checked against directory listings
(:class:`MediaListing`, ``os.scandir``: one ``getdents`` per folder instead of a ``stat`` per
file, and names looked up as numbers, not strings). We write these kernels ourselves because
no library validates a parquet table against vocabularies that live in ``dataset.yaml``; the
JSON parse is simdjson's (:func:`extra_not_objects`).
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
import simdjson

from curate.store import schema as S

#: The canonical forms curate writes; anything else is left to the exact per-row checks.
SHA_PATTERN = r"^[0-9a-f]{64}$"
SAMPLE_ID_PATTERN = r"^[0-9a-f]{16}$"
FILEPATH_PATTERN = r"^media/[0-9a-f]{2}/[0-9a-f]{64}\.[A-Za-z0-9]+$"
MASK_PATTERN = r"^masks/[0-9a-f]{16,64}(\.[0-9a-f]{8})?\.png$"


def _np(mask: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A boolean arrow mask (nulls = False) as a numpy bool array."""
    # fill_null converts its Python fill value on every call (~0.1 ms): a mask with no nulls,
    # the usual case, skips it (0.2 CPU-s over the ~1,600 masks of a million-row check)
    filled = pc.fill_null(mask, False) if mask.null_count else mask
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


def _holds_text(t: pa.DataType) -> bool:
    if pa.types.is_string(t) or pa.types.is_large_string(t) or S.types_compatible(t, pa.string()):
        return True
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and _holds_text(t.value_type)


def _is_view(t: pa.DataType) -> bool:
    check = getattr(pa.types, "is_string_view", None)
    if check is not None and check(t):
        return True
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_view(t.value_type)


def plain_strings(table: pa.Table) -> pa.Table:
    """``table`` with its ``string_view`` columns (and lists of them) cast to ``large_string``:
    a file written with views reads back with them, and arrow has no ``is_in`` kernel for views,
    so the checks would fail on a valid file."""
    for index, field in enumerate(table.schema):
        if _is_view(field.type):
            target = pa.large_string() if not (pa.types.is_list(field.type) or pa.types.is_large_list(field.type)) \
                else pa.list_(pa.large_string())
            table = table.set_column(index, pa.field(field.name, target, field.nullable), table.column(index).cast(target))
    return table


def first_invalid_text(table: pa.Table) -> tuple[str, int] | None:
    """The column and row of the first value that is not UTF-8 in a text column of ``table``
    (the lowest row; the earlier column on a tie), or None.

    Arrow does not check UTF-8 when it reads parquet, so a file written by another tool can hold
    text columns whose bytes no reader can decode; every later ``to_pylist`` would fail. Arrow's
    full validation checks a million collector-shaped rows in ~0.15 CPU-s; only a chunk it
    refuses is read value by value to find the row. Raises ``pa.ArrowInvalid`` when a chunk
    fails validation for another reason (then the file does not read)."""
    first: tuple[str, int] | None = None
    for name, column in zip(table.column_names, table.columns):
        if not _holds_text(column.type):
            continue
        start = 0
        for chunk in column.chunks:
            try:
                chunk.validate(full=True)
            except pa.ArrowInvalid:
                row = _first_undecodable(chunk)
                if row is None:
                    raise
                if first is None or start + row < first[1]:
                    first = (name, start + row)
                break
            start += len(chunk)
    return first


def _first_undecodable(chunk: pa.Array) -> int | None:
    """The first value of a text (or list of text) array that does not decode as UTF-8."""
    for row in range(len(chunk)):
        try:
            chunk[row].as_py()
        except UnicodeDecodeError:
            return row
    return None


def _as_utf8(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column
    return column.cast(pa.large_string())  # string_view and the like


def _simdjson_bad(values: pa.Array) -> np.ndarray:
    """Per value of ``values`` (no nulls, every value shaped ``{...}``): whether it is not a JSON
    object, as ``json.loads`` decides.

    Each value is read by simdjson (pysimdjson: ~0.3 µs a value of ~650 bytes with the call,
    against ~5 µs for ``json.loads`` and ~1.2 µs a value for arrow's JSON reader over the column
    joined by newlines, which this replaced). Only a value simdjson refuses goes to
    ``json.loads``, which then decides: simdjson is the stricter of the two (RFC 8259 exactly:
    it refuses ``NaN``, ``Infinity``, lone surrogate escapes, numbers beyond a double and
    integers beyond 64 bits, all of which ``json.loads`` accepts), so a value never passes here
    that Python would refuse, except nesting deeper than Python's recursion limit, which
    :func:`extra_not_objects` sends to ``json.loads`` beforehand (:func:`_deep_suspects`).
    tests/test_store_million.py compares the two on awkward values."""
    binary = pa.large_binary() if pa.types.is_large_string(values.type) else pa.binary()
    parse = simdjson.Parser().parse
    bad = np.zeros(len(values), dtype=bool)
    for i, data in enumerate(values.cast(binary).to_pylist()):
        try:
            # one expression: the document is released before the next parse (the parser
            # refuses to parse again while a document it returned is alive)
            good = isinstance(parse(data), simdjson.Object)
        except Exception:  # noqa: BLE001 - simdjson raises ValueError or RuntimeError by error kind
            good = False
        if not good:
            try:
                bad[i] = _python_bad_text(data.decode("utf-8"))
            except UnicodeDecodeError:  # not text at all (validation refuses such files before)
                bad[i] = True
    return bad


#: Values at least this long are counted for brackets (:func:`_deep_suspects`); a shorter one
#: cannot nest deeper than half of it.
_DEEP_LENGTH = 800
#: Values with this many ``{`` and ``[`` go to ``json.loads``, which refuses nesting deeper than
#: the interpreter's recursion limit (1,000 by default) where simdjson does not (it allows 1,024).
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


def _python_bad_text(text: str) -> bool:
    """``json.loads`` refuses the text or it is not an object (the definition)."""
    try:
        return not isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return True


def _python_bad(values: pa.Array) -> np.ndarray:
    """Per row: :func:`_python_bad_text` (nulls are not bad here; bytes that are not UTF-8 are)."""
    bad = np.zeros(len(values), dtype=bool)
    for row in range(len(values)):
        try:
            text = values[row].as_py()
        except UnicodeDecodeError:
            bad[row] = True
            continue
        bad[row] = text is not None and _python_bad_text(text)
    return bad


def extra_not_objects(column: pa.ChunkedArray) -> np.ndarray:
    """Rows whose non-null ``extra`` is not a JSON object, exactly as ``json.loads`` decides
    (what :func:`curate.store.schema.check_value` says), parsing every value.

    Values not shaped ``{...}`` (:func:`extra_shape_suspects`: rare) or nested deep enough to
    exceed Python's recursion limit (:func:`_deep_suspects`) go to ``json.loads``; the rest are
    read by simdjson (:func:`_simdjson_bad`), and only a value it refuses goes to ``json.loads``.
    About 0.5 CPU-s at a million collector-shaped rows (~650 bytes each) against 4-7 s for
    ``json.loads`` on every value.
    """
    column = _as_utf8(column)
    shape = extra_shape_suspects(column) | _deep_suspects(column)
    bad = np.zeros(len(column), dtype=bool)
    odd = np.flatnonzero(shape)
    if len(odd):  # rare (" {}" is still an object; deep nesting): json.loads decides
        bad[odd] = _python_bad(column.take(pa.array(odd)).combine_chunks())
    start = 0
    for chunk in column.chunks:
        plain = np.flatnonzero(~(shape[start: start + len(chunk)] | _np(pc.is_null(chunk))))
        if len(plain):
            values = chunk if len(plain) == len(chunk) else chunk.take(pa.array(plain))
            bad[start + plain] = _simdjson_bad(values)
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
    if len(arr) == 0 or arr.null_count or not pa.types.is_string(arr.type):
        return None
    offsets, data = _string_parts(arr)
    lengths = np.diff(offsets)
    width = int(lengths[0])
    if width == 0 or not (lengths == width).all():
        return None
    return _strided_rows(data, offsets[:-1], width)


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
    """Boolean per row: true where any per-row value check might fail (see the module docstring):
    :func:`local_suspects` (each row on its own) or :func:`duplicate_suspects` (across rows).

    ``parse_extra=False`` checks only the shape of ``extra`` (:func:`extra_shape_suspects`)
    instead of parsing every value (:func:`extra_not_objects`); the caller passes it only when
    :func:`extras_unchanged` says that this very file's ``extra`` values were parsed before.
    """
    suspect = local_suspects(table, usable, vocab, parse_extra=parse_extra)
    if table.num_rows == 0:
        return suspect
    sid = table.column("sample_id") if "sample_id" in usable else None
    sha = table.column("sha256") if "sha256" in usable else None
    return suspect | duplicate_suspects(sid, sha, ~suspect)


def local_suspects(table: pa.Table, usable: set[str], vocab: S.Vocabulary, *, parse_extra: bool = True) -> np.ndarray:
    """Boolean per row: true where a check that looks at that row alone might fail, so a table
    can be scanned batch by batch (:func:`curate.store.validate.check_dataset`).

    Covers: required values null, the choice columns outside their vocabularies, class index
    range and class name, finite background score, positive sizes, tags, ``extra`` JSON, empty
    identity strings, and the canonical ``sample_id`` / ``sha256`` / ``filepath`` /
    ``mask_path`` forms and their agreement. ``parse_extra``: as in :func:`suspect_rows`.
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
    if (mask := col("mask_path")) is not None:
        suspect |= _not_matching(mask, MASK_PATTERN)
    return suspect


def duplicate_suspects(sid: pa.ChunkedArray | None, sha: pa.ChunkedArray | None, canonical: np.ndarray) -> np.ndarray:
    """Boolean per row: its ``sample_id`` or ``sha256`` occurs in another row too. ``canonical``:
    the rows :func:`local_suspects` passed, whose ``sample_id`` is their ``sha256``'s first 16
    digits, so when every row is canonical unique ids imply unique hashes and ``sha256`` is not
    counted; ``sha`` may then be None."""
    suspect = np.zeros(len(canonical), dtype=bool)
    for column in (sid, sha):
        if column is None or (column is sha and sid is not None and canonical.all()):
            continue
        if (column is sid and _hex16_unique(column)) or pc.count_distinct(column, mode="all").as_py() == len(column):
            continue
        dups = duplicated_values(column)
        if dups:
            suspect |= _np(pc.is_in(column, value_set=pa.array(sorted(dups), type=pa.string())))
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


def folder_stamps_before_listing(root: Path, folders: list[str], samples: list[int] | None) -> dict[str, Any]:
    """The state to record if the listing that follows finds every file (taken *before* it, so a
    change during the listing invalidates the record). ``samples``: the stamp of the
    samples.parquet whose rows were checked (``samples_identity(root)["samples"]`` taken before
    it was read; None when it is not known, and then nothing is recorded), so a file replaced
    while it was read is never named by the record."""
    return {"samples": samples, "folders": _folder_stamps(root, folders)}


def remember_files_present(root: Path, state: dict[str, Any]) -> None:
    """Record ``state`` (from :func:`folder_stamps_before_listing`) after a listing found every
    file; a folder that cannot be written (read-only media) just keeps no record."""
    from curate.store.atomic import atomic_write_bytes

    if state.get("samples") is None:
        return

    try:  # the temporary file goes to the folder's .tmp/: a kill leaves nothing beside the folder's files
        atomic_write_bytes(root, root / FILE_CHECK_CACHE, json.dumps(state).encode("utf-8"), sync_dir=False)
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
    from curate.store.atomic import atomic_write_bytes

    try:
        atomic_write_bytes(root, root / EXTRA_CHECK_CACHE, json.dumps({"version": 1, **identity}).encode("utf-8"),
                           fsync=False, sync_dir=False)  # the file it names is durable; a lost record costs one parse
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


def _string_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string or large_string array's value offsets (n + 1, as int64) and its data bytes, no
    copy of the data."""
    offsets_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=offsets_type)[arr.offset: arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    return offsets.astype(np.int64), (np.frombuffer(data, dtype=np.uint8) if data is not None
                                      else np.zeros(0, dtype=np.uint8))


#: Values per slice when names of mixed lengths are gathered (keeps the index arrays a few MB).
_NAME_SLICE = 65_536


def _strided_rows(data: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray | None:
    """The ``width`` bytes at each of ``starts`` as an (n, width) view of ``data`` (no copy) when
    the starts are evenly spaced at least ``width`` apart (values of one length, laid out one
    after another: what an arrow column or a joined listing of same-length names is), else
    None."""
    n = len(starts)
    if n == 0 or width <= 0:
        return None
    step = int(starts[1] - starts[0]) if n > 1 else width
    if step < width or (n > 1 and not (np.diff(starts) == step).all()):
        return None
    first = int(starts[0])
    if first + (n - 1) * step + width > len(data):
        return None
    return np.lib.stride_tricks.as_strided(data[first:], shape=(n, width), strides=(step, 1), writeable=False)


def _words_of(chars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_media_words` of an (n, length) byte matrix of names of one length."""
    length = chars.shape[1]
    nibbles = _HEX_LUT[chars[:, :64]]
    extension = chars[:, 65:]
    lower = extension | 0x20
    ok = (nibbles != 255).all(axis=1) & (chars[:, 64] == ord(".")) & \
        (((extension - 48) < 10) | ((lower - 97) < 26)).all(axis=1)
    words = np.empty((len(chars), 5), dtype=np.uint64)
    words[:, :4] = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).view(">u8")
    padded = np.zeros((len(chars), 8), dtype=np.uint8)
    padded[:, : length - 65] = extension
    words[:, 4] = padded.view(">u8").ravel()
    words[~ok] = 0
    return words, ok


def _media_words(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each value ``data[start: start + length]`` of the form ``<64 lowercase hex>.<1-8
    letters or digits>`` (the name of an image curate stored): five 64-bit words that identify it
    exactly (the digest's 32 bytes as four big-endian words, then the extension's bytes padded
    with zeros), and whether the value has that form (the words of the others are 0). Values of
    one length laid out evenly (the usual case) are read through a strided view; others are
    gathered by length."""
    n = len(starts)
    if n and 66 <= int(lengths[0]) <= 73 and (lengths == lengths[0]).all():
        view = _strided_rows(data, starts, int(lengths[0]))
        if view is not None:
            return _words_of(view)
    words = np.zeros((n, 5), dtype=np.uint64)
    ok = (lengths >= 66) & (lengths <= 73)
    for first in range(0, n, _NAME_SLICE):
        part = slice(first, min(n, first + _NAME_SLICE))
        part_ok, part_len, part_start = ok[part], lengths[part], starts[part]
        for length in np.unique(part_len[part_ok]).tolist():
            rows = np.flatnonzero(part_ok & (part_len == length))
            at = first + rows
            words[at], ok[at] = _words_of(data[part_start[rows, None] + np.arange(length)])
    return words, ok


def _folder_code(folder: str) -> int:
    """``media/<2 hex>`` as the integer of its two digits (-1 for any other folder)."""
    tail = folder[len("media/"):]
    if folder.startswith("media/") and len(tail) == 2 and all(c in "0123456789abcdef" for c in tail):
        return int(tail, 16)
    return -1


_MEDIA_PREFIX = np.frombuffer(b"media/", dtype=np.uint8)


def _media_folder_codes(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each value that starts ``media/<2 hex>/``: the integer of those two digits, and
    whether it does (a strided view when the values are evenly laid out, else 9 gathers)."""
    n = len(starts)
    view = _strided_rows(data, starts, 9) if n and (lengths >= 9).all() else None
    if view is None:
        if not len(data):
            return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
        index = np.minimum(np.where(lengths >= 9, starts, 0)[:, None] + np.arange(9), len(data) - 1)
        view = data[index]
        valid = lengths >= 9
    else:
        valid = np.ones(n, dtype=bool)
    high, low = _HEX_LUT[view[:, 6]], _HEX_LUT[view[:, 7]]
    valid &= (view[:, :6] == _MEDIA_PREFIX).all(axis=1) & (view[:, 8] == ord("/")) & (high != 255) & (low != 255)
    return (high.astype(np.int64) << 4) | low, valid


def media_folders(root: Path) -> list[str]:
    """The ``media/<2 hex>`` folders under ``root`` (where curate stores images): directories,
    symlinks to one, and entries whose type cannot be told (a symlink loop), which
    :class:`MediaListing` then checks path by path. A ``media`` that cannot be listed gives no
    folder (its images are then checked one by one: :class:`MediaListing`)."""
    def folder(entry: os.DirEntry) -> bool:
        try:
            return entry.is_dir()
        except OSError:
            return True

    try:
        with os.scandir(root / "media") as entries:
            return sorted(f"media/{e.name}" for e in entries if _folder_code(f"media/{e.name}") >= 0 and folder(e))
    except OSError:
        return []


class MediaListing:
    """The images of some ``media/<2 hex>`` folders, listed once, for presence checks of many
    paths in curate's canonical form ``media/<2 hex>/<64 hex>.<ext>`` (:data:`FILEPATH_PATTERN`:
    the rows that :func:`local_suspects` passes).

    A folder is listed with ``os.scandir`` (one ``getdents`` per folder instead of a ``stat``
    per file); an entry counts when ``is_file`` says so (a regular file or a symlink to one, as
    ``Path.is_file``). Each listed name of canonical form becomes six numbers (folder, four
    words of the digest, the extension: :func:`_media_words`), the listing is sorted by the first
    digest word, and :meth:`missing` finds each path's first word through a bucket index on its
    top bits (digests spread evenly: about one entry a bucket; a binary search when the buckets
    are deep, as with made-up digests) and compares the rest, so no Python string is made per
    path and no string is hashed. Measured on the 1M folder of benchmarks/store.py: ~0.4 CPU-s
    for a million paths and ~0.55 s to list and index them (plus the kernel's ~0.5 s of
    ``getdents``) against ~1.2 s and ~200 MB of strings for ``pc.is_in`` against the listing
    joined into paths. Names of another form are not kept: no canonical path can name them. A
    path not of canonical form, or in a folder that was not listed (missing, no permission to
    read it, a symlink loop), is checked with ``Path.is_file``; first words shared by several listed
    names (made-up digests, one image under two extensions) are settled by a set of all six
    numbers of those names."""

    #: Buckets deeper than this make :meth:`missing` search the sorted words instead.
    MAX_BUCKET_DEPTH = 16

    def __init__(self, root: Path, folders: Iterable[str]) -> None:
        self.root = root
        words: list[np.ndarray] = []
        codes: list[np.ndarray] = []
        #: per folder code: listed (the others' paths are checked one by one)
        self._listed = np.zeros(256, dtype=bool)
        for folder in folders:
            code = _folder_code(folder)
            if code < 0:
                continue
            try:
                with os.scandir(root / folder) as entries:
                    names = [entry.name for entry in entries if entry.is_file()]
            except OSError:  # missing, not a folder, no permission, a symlink loop: by hand
                continue
            self._listed[code] = True
            found, ok = _listed_words(names)
            words.append(found[ok])
            codes.append(np.full(int(ok.sum()), code, dtype=np.int64))
        all_words = np.concatenate(words) if words else np.zeros((0, 5), dtype=np.uint64)
        order = np.argsort(all_words[:, 0], kind="stable")
        self._words = all_words[order]
        self._codes = (np.concatenate(codes) if codes else np.zeros(0, dtype=np.int64))[order]
        first = self._words[:, 0]
        same_as_next = first[1:] == first[:-1]
        #: per listed entry: another entry has the same first word
        self._shared = np.zeros(len(first), dtype=bool)
        self._shared[:-1] |= same_as_next
        self._shared[1:] |= same_as_next
        self._shared_keys: set[tuple[int, ...]] | None = None
        self._shift = np.uint64(64 - max(1, int(len(first)).bit_length()))
        counts = np.bincount((first >> self._shift).astype(np.int64), minlength=1 << (64 - int(self._shift)))
        self._bucket = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        #: the most entries in one bucket of the index (above MAX_BUCKET_DEPTH: searched instead)
        self.bucket_depth = int(counts.max()) if len(counts) else 0
        #: the folder codes of the paths :meth:`missing` was asked about
        self.folders_seen: set[int] = set()

    def __len__(self) -> int:
        return len(self._codes)

    def missing(self, paths: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Per path: not listed (see the class docstring)."""
        parts: list[np.ndarray] = []
        for chunk in paths.chunks if isinstance(paths, pa.ChunkedArray) else [paths]:
            if not (pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type)):
                chunk = chunk.cast(pa.large_string())
            # slices keep numpy's temporaries a few MB, reused by the allocator, instead of
            # hundreds of MB of fresh pages for a million paths (system time on a VM)
            parts.extend(self._missing_in(chunk.slice(first, _NAME_SLICE)) for first in range(0, len(chunk), _NAME_SLICE))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)

    def _first_at(self, query: np.ndarray) -> np.ndarray:
        """For each first word: the index of the first listed entry not below it."""
        listed = self._words[:, 0]
        if self.bucket_depth > self.MAX_BUCKET_DEPTH:
            return np.searchsorted(listed, query)
        # the bucket's few entries instead of a binary search's ~20 scattered reads (0.06 s
        # against 0.25 s for a million paths)
        bucket = (query >> self._shift).astype(np.int64)
        low, high = self._bucket[bucket], self._bucket[bucket + 1]
        at = low.copy()
        moving = np.flatnonzero(high > low)
        while len(moving):  # each pass moves the queries whose entry is still below them
            probe = at[moving]
            moving = moving[(probe < high[moving]) & (listed[np.minimum(probe, len(listed) - 1)] < query[moving])]
            at[moving] += 1
        return at

    def _missing_in(self, chunk: pa.Array) -> np.ndarray:
        offsets, data = _string_parts(chunk)
        starts, lengths = offsets[:-1], np.diff(offsets)
        codes, in_media = _media_folder_codes(data, starts, lengths)
        words, named = _media_words(data, starts + 9, lengths - 9)
        valid = _np(pc.is_valid(chunk)) if chunk.null_count else np.ones(len(chunk), dtype=bool)
        self.folders_seen.update(np.flatnonzero(np.bincount(codes[valid & in_media], minlength=256)).tolist())
        canonical = in_media & named & valid & self._listed[np.where(in_media, codes, 0)]
        present = np.zeros(len(chunk), dtype=bool)
        rows = np.flatnonzero(canonical)
        listed = self._words[:, 0]
        if len(listed) and len(rows):
            query = words[rows, 0]
            at = np.minimum(self._first_at(query), len(listed) - 1)
            hit = listed[at] == query
            same = hit & (self._codes[at] == codes[rows]) & (self._words[at, 1:] == words[rows, 1:]).all(axis=1)
            present[rows] = same
            unsure = np.flatnonzero(hit & ~same & self._shared[at])  # the first word is shared: settle exactly
            if len(unsure):
                if self._shared_keys is None:
                    shared = np.flatnonzero(self._shared)
                    self._shared_keys = set(zip(self._codes[shared].tolist(), *self._words[shared].T.tolist()))
                for position in unsure.tolist():
                    row = rows[position]
                    present[row] = (int(codes[row]), *words[row].tolist()) in self._shared_keys
        for row in np.flatnonzero(~canonical).tolist():  # not of canonical form, or its folder not listed
            value = chunk[row].as_py()
            present[row] = isinstance(value, str) and (self.root / value).is_file()
        return ~present


def _listed_words(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_media_words` of file names (one folder's listing), parsed from one joined text
    (no arrow array of the names: ~10x less CPU than ``pa.array`` on them). A name holding a
    newline, or not UTF-8 (``os.scandir`` gives such bytes as surrogates), is of no canonical
    form and is left out first."""
    joined = "\n".join(names).encode("utf-8", "surrogateescape")
    if names and joined.count(b"\n") != len(names) - 1:
        return _listed_words([name for name in names if "\n" not in name])
    if not names:
        return np.zeros((0, 5), dtype=np.uint64), np.zeros(0, dtype=bool)
    data = np.frombuffer(joined, dtype=np.uint8)
    breaks = np.flatnonzero(data == ord("\n"))
    starts = np.concatenate([[0], breaks + 1]).astype(np.int64)
    ends = np.append(breaks, len(data)).astype(np.int64)
    return _media_words(data, starts, ends - starts)


def png_size(path: Path) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR (24 bytes read), or None when it is not a PNG."""
    with open(path, "rb") as handle:
        head = handle.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
