"""The explicit schema of ``samples.parquet`` and the vocabularies its columns draw from.

One row per image (DESIGN.md, "The dataset on disk"). The schema is declared here, column by
column, with a docstring each (like Hugging Face ``Features``), so that any tool can read the
folder without curate and curate can tell a damaged file from a good one.

``SCHEMA_VERSION`` is written both in ``dataset.yaml`` (``schema_version``) and in the parquet
file's key/value metadata (``curate.schema_version``). Bump it, and add a migration, whenever a
column is added, removed, renamed or changes type.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from curate.labels import LabelSpace, UnknownClassError

SCHEMA_VERSION = 1
#: Key of the schema version in the parquet file's key/value metadata.
PARQUET_VERSION_KEY = b"curate.schema_version"

#: ``status`` values: a new image is a candidate until a reviewer accepts or rejects it.
STATUSES: tuple[str, ...] = ("candidate", "accepted", "rejected")
#: ``group`` values (null = not in the split): the background where the reference model does
#: well ("easy") or badly ("hard") for the image's class (papers/003 §2.1).
GROUPS: tuple[str, ...] = ("easy", "hard")
#: ``background_source`` values: who labelled the background.
BACKGROUND_SOURCES: tuple[str, ...] = ("human", "model", "synthetic")
#: ``source`` values curate's own collectors write; other non-empty strings are accepted.
KNOWN_SOURCES: tuple[str, ...] = ("inat", "coco", "folder", "synthetic")
#: The CounterAnimal background vocabulary (papers/003 §2.1, Table 5; datasets/counteranimal.yaml).
DEFAULT_BACKGROUNDS: tuple[str, ...] = (
    "ground", "water", "earth", "sand", "snow", "grass", "human",
    "sky", "road", "rock", "shrub", "indoor", "tree", "outdoor",
)

#: Length of ``sample_id``: the first 16 hex digits (64 bits) of the stored bytes' sha256.
SAMPLE_ID_LENGTH = 16


@dataclass(frozen=True)
class Column:
    """One column of ``samples.parquet``: name, arrow type, whether null is allowed, meaning."""

    name: str
    type: pa.DataType
    nullable: bool
    doc: str
    #: False for the columns that identify the stored image; :meth:`Dataset.update` refuses them.
    mutable: bool = True


COLUMNS: tuple[Column, ...] = (
    Column("sample_id", pa.string(), False,
           "First 16 hex digits of `sha256`; the row's stable identity.", mutable=False),
    Column("filepath", pa.string(), False,
           "Image path relative to the dataset folder: media/<sha256[:2]>/<sha256>.<jpg|png>.",
           mutable=False),
    Column("sha256", pa.string(), False,
           "sha256 (64 lowercase hex) of the stored image bytes; duplicates share it.", mutable=False),
    Column("width", pa.int32(), False, "Stored (upright) image width in pixels.", mutable=False),
    Column("height", pa.int32(), False, "Stored (upright) image height in pixels.", mutable=False),
    Column("source", pa.string(), False, "Where the image came from: inat|coco|folder|synthetic|..."),
    Column("source_id", pa.string(), True, "The id of the image at its source (observation/photo id, path)."),
    Column("source_url", pa.string(), True, "URL of the original image, when there is one."),
    Column("license", pa.string(), True, "License of the image (e.g. 'cc-by-nc'), as the source states it."),
    Column("attribution", pa.string(), True, "Who to credit, as the source states it."),
    Column("class_index", pa.int32(), True, "Index into the dataset's label space (dataset.yaml)."),
    Column("class_name", pa.string(), True, "The label space's name for `class_index` (derived)."),
    Column("status", pa.string(), False, "candidate|accepted|rejected."),
    Column("reject_reason", pa.string(), True,
           "Why a reviewer rejected it (label_noise|feature_noise|obscurity|clarity|free text)."),
    Column("background", pa.string(), True, "Background label from the dataset's vocabulary, or null."),
    Column("background_source", pa.string(), True, "Who set `background`: human|model|synthetic."),
    Column("background_score", pa.float32(), True, "Model confidence of a model-set background."),
    Column("mask_path", pa.string(), True,
           "Object mask (PNG, 0/1 or instance ids, image size) relative to the folder: masks/<sample_id>.png.",
           mutable=False),
    Column("mask_status", pa.string(), True, "Free text state of the mask (e.g. synthetic, model, reviewed)."),
    Column("group", pa.string(), True, "easy|hard (the split), or null."),
    Column("tags", pa.list_(pa.string()), False, "Free tags (never null; empty list when none)."),
    Column("extra", pa.string(), False, "A JSON object (text) of further per-sample fields."),
    Column("added_at", pa.timestamp("us", tz="UTC"), False, "When the row was added (UTC)."),
)

COLUMN_BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
IMMUTABLE_COLUMNS: frozenset[str] = frozenset(c.name for c in COLUMNS if not c.mutable)
REQUIRED_COLUMNS: frozenset[str] = frozenset(c.name for c in COLUMNS if not c.nullable)

SCHEMA: pa.Schema = pa.schema(
    [pa.field(c.name, c.type, nullable=c.nullable, metadata={"doc": c.doc}) for c in COLUMNS],
    metadata={PARQUET_VERSION_KEY: str(SCHEMA_VERSION).encode()},
)

#: Columns with few distinct values: dictionary-encoded in samples.parquet. The unique columns
#: (ids, hashes, paths, urls) are not, since a dictionary of a million distinct strings only
#: costs time before the writer falls back to plain encoding. ``extra`` is not either: the
#: collectors write per-row provenance there (observation and photo ids, observer, place, the
#: original filename), so in real folders nearly every value is distinct (issue 29).
LOW_CARDINALITY_COLUMNS: tuple[str, ...] = (
    "source", "license", "attribution", "class_name", "status", "reject_reason", "background",
    "background_source", "mask_status", "group", "tags",
)
#: ``pyarrow.parquet.write_table`` options of samples.parquet. zstd is read by every current
#: parquet reader (pyarrow, DuckDB, Polars, Spark, pandas) and at a million rows halves the file
#: against snappy and reads faster (benchmarks/store.py).
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "use_dictionary": list(LOW_CARDINALITY_COLUMNS)}

_HEX = re.compile(r"^[0-9a-f]+$")
_STRING_TYPES = (pa.string(), pa.large_string())


def types_compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Whether a stored column type reads as the expected one.

    Exact types match; so do ``large_string``/``string_view`` for ``string`` and any list of a
    string type for ``list<string>`` (pandas and other writers choose those). Numbers, the
    timestamp and every other difference are a wrong type.
    """
    if actual.equals(expected):
        return True
    if pa.types.is_string(expected):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual) or _is_string_view(actual)
    if pa.types.is_list(expected):
        if pa.types.is_list(actual) or pa.types.is_large_list(actual):
            return types_compatible(actual.value_type, expected.value_type)
    return False


def _is_string_view(t: pa.DataType) -> bool:
    check = getattr(pa.types, "is_string_view", None)
    return bool(check and check(t))


def is_hex(text: str, length: int | None = None) -> bool:
    return bool(_HEX.match(text)) and (length is None or len(text) == length)


def sample_id_for(sha256: str) -> str:
    """``sample_id`` = the first :data:`SAMPLE_ID_LENGTH` hex digits of the content sha256."""
    return sha256[:SAMPLE_ID_LENGTH]


def media_relpath(sha256: str, ext: str) -> str:
    """Where an image with this content lives: ``media/<sha[:2]>/<sha>.<ext>`` (content-addressed)."""
    return f"media/{sha256[:2]}/{sha256}.{ext}"


def mask_relpath(sample_id: str, version: str | None = None) -> str:
    """``masks/<sample_id>.png``; a replaced mask gets ``masks/<sample_id>.<version>.png``."""
    return f"masks/{sample_id}.png" if version is None else f"masks/{sample_id}.{version}.png"


class ValueProblem(ValueError):
    """A value a column cannot hold; the message says what was wrong and what is allowed."""


@dataclass(frozen=True)
class Vocabulary:
    """What the value checks need from ``dataset.yaml``: the label space and the backgrounds."""

    label_space: LabelSpace | None
    backgrounds: Sequence[str] | None


def check_choice(column: str, value: Any, choices: Sequence[str], *, nullable: bool) -> str | None:
    """A problem message when ``value`` is not one of ``choices`` (or null when allowed)."""
    if value is None:
        return None if nullable else f"{column} is null; expected one of {', '.join(choices)}"
    if value not in choices:
        allowed = ", ".join(choices) + (" or null" if nullable else "")
        return f"{column} {value!r} is not allowed (expected {allowed})"
    return None


def check_value(column: str, value: Any, vocab: Vocabulary) -> str | None:
    """The problem with storing ``value`` in ``column`` of a dataset with ``vocab``, or None.

    This is the single place that knows each column's allowed values; :mod:`validate` uses it
    on stored rows, :class:`~curate.store.Dataset` on new samples and updates.
    """
    spec = COLUMN_BY_NAME.get(column)
    if spec is None:
        return f"unknown column {column!r} (known: {', '.join(COLUMN_NAMES)})"
    if value is None:
        return None if spec.nullable else f"{column} is null but the column requires a value"
    if column == "status":
        return check_choice(column, value, STATUSES, nullable=False)
    if column == "group":
        return check_choice(column, value, GROUPS, nullable=True)
    if column == "background_source":
        return check_choice(column, value, BACKGROUND_SOURCES, nullable=True)
    if column == "background":
        if not isinstance(value, str):
            return f"background {value!r} is not a string"
        if vocab.backgrounds is not None and value not in vocab.backgrounds:
            return f"background {value!r} is not in the vocabulary ({', '.join(vocab.backgrounds)})"
        return None
    if column == "class_index":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"class_index {value!r} is not an integer"
        if vocab.label_space is not None and not 0 <= value < len(vocab.label_space):
            return (f"class_index {value} is outside the label space "
                    f"'{vocab.label_space.name}' (0..{len(vocab.label_space) - 1})")
        return None
    if column == "background_score":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"background_score {value!r} is not a number"
        if not math.isfinite(float(value)):
            return f"background_score {value!r} is not finite"
        return None
    if column in ("width", "height"):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return f"{column} {value!r} is not a positive integer"
        return None
    if column == "tags":
        if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) and t for t in value):
            return f"tags {value!r} is not a list of non-empty strings"
        return None
    if column == "extra":
        if not isinstance(value, str):
            return f"extra {value!r} is not a JSON text"
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            return f"extra is not valid JSON ({exc})"
        except RecursionError:
            return "extra is JSON nested too deeply to read"
        if not isinstance(parsed, dict):
            return f"extra is JSON {type(parsed).__name__}, expected an object"
        return None
    if column == "added_at":
        return None
    if not isinstance(value, str):
        return f"{column} {value!r} is not a string"
    if column in ("source", "sample_id", "filepath", "sha256") and not value:
        return f"{column} is empty"
    return None


def resolve_class(
    label_space: LabelSpace, class_index: Any, class_name: Any
) -> tuple[int | None, str | None]:
    """(class_index, canonical class_name) from either or both; raises :class:`ValueProblem`.

    The stored ``class_name`` is always the label space's own name for the index; a given name
    may be any name the label space resolves (display name, WordNet id, lemma) but must agree
    with a given index.
    """
    if class_index is None and class_name is None:
        return None, None
    if class_index is not None:
        if isinstance(class_index, bool) or not isinstance(class_index, int):
            try:
                import numpy as np  # numpy integers are fine

                if isinstance(class_index, np.integer):
                    class_index = int(class_index)
                else:
                    raise TypeError
            except TypeError:
                raise ValueProblem(f"class_index {class_index!r} is not an integer") from None
        try:
            name = label_space.name_of(class_index)
        except UnknownClassError as exc:
            raise ValueProblem(str(exc)) from None
        if class_name is not None:
            try:
                named = label_space.resolve(class_name)
            except UnknownClassError as exc:
                raise ValueProblem(str(exc)) from None
            if named != class_index:
                raise ValueProblem(
                    f"class_name {class_name!r} is class {named} but class_index is {class_index}; "
                    "give one of them or make them agree"
                )
        return int(class_index), name
    try:
        index = label_space.resolve(class_name)
    except UnknownClassError as exc:
        raise ValueProblem(str(exc)) from None
    return index, label_space.name_of(index)


def empty_table() -> pa.Table:
    """A zero-row table with :data:`SCHEMA`."""
    return SCHEMA.empty_table()
