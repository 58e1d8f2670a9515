"""What goes into a dataset and what comes back: ``NewSample``, ``AddReport``, and the
conversions of Python values to what parquet, JSON and YAML hold."""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from curate.store.images import ImageInput, MaskInput


@dataclass
class NewSample:
    """One image to add, with what is known about it (fields = the schema's columns).

    ``image``: a path, the encoded bytes, a PIL image, or a :class:`~curate.store.images.PreparedImage`
    (one ``prepare_image`` made is stored without a second decode). The class is ``class_index`` (into the
    dataset's label space) or ``class_name`` (any name/id the label space resolves), or both if
    they agree, or neither. ``mask``: H x W (the stored, upright image's size), 0/1 or instance
    ids 0..255, as an array, a path or PNG bytes. ``extra``: JSON-serialisable values, stored as
    the JSON text column ``extra``.
    """

    image: ImageInput
    class_index: int | None = None
    class_name: str | None = None
    source: str = "folder"
    source_id: str | None = None
    source_url: str | None = None
    license: str | None = None
    attribution: str | None = None
    status: str = "candidate"
    background: str | None = None
    background_source: str | None = None
    background_score: float | None = None
    mask: MaskInput | None = None
    mask_status: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    reject_reason: str | None = None
    #: How reports and ``quarantine.jsonl`` name this input when its image is not a path (e.g.
    #: ``shard-000003.tar:abc.jpg`` for a webdataset member); not stored in the row.
    origin: str | None = None
    #: When the sample was first added somewhere (a re-import keeps it, e.g. from a curate
    #: webdataset export); None = now. Must be timezone-aware.
    added_at: dt.datetime | None = None

    def describe(self, position: int) -> str:
        """How reports name this input: ``origin``, else its path, else source id / url, else
        its position."""
        if self.origin:
            return self.origin
        if isinstance(self.image, (str, Path)):
            return str(self.image)
        if self.source_id:
            return f"{self.source}:{self.source_id}"
        if self.source_url:
            return self.source_url
        return f"item {position} ({self.source})"


@dataclass
class AddReport:
    """What :meth:`Dataset.add_samples` did.

    ``added``: new sample ids, in input order. ``duplicates``: (sample_id, reason) for inputs
    whose stored content is already in the dataset or earlier in the same call.
    ``quarantined``: (source description, "code: detail") for inputs not added; the codes are
    :data:`curate.store.images.QUARANTINE_REASONS`.
    """

    added: list[str] = field(default_factory=list)
    duplicates: list[tuple[str, str]] = field(default_factory=list)
    quarantined: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return (f"{len(self.added)} added, {len(self.duplicates)} duplicate(s), "
                f"{len(self.quarantined)} quarantined")


def now_utc() -> dt.datetime:
    """The current time, timezone-aware UTC (the ``added_at`` column and log records)."""
    return dt.datetime.now(dt.timezone.utc)


def iso_time(moment: dt.datetime | None = None) -> str:
    """ISO 8601 text of ``moment`` (default now, UTC) with microseconds."""
    return (moment or now_utc()).isoformat(timespec="microseconds")


def to_plain(value: Any) -> Any:
    """numpy scalars/arrays, paths, tuples and sets to plain Python (for arrow, JSON and YAML)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [to_plain(v) for v in value.tolist()]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [to_plain(v) for v in items]
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return value


def yaml_ready(value: Any, where: str) -> Any:
    """``value`` as plain YAML data; raises TypeError naming the path (``where``) of anything else."""
    value = to_plain(value)
    if isinstance(value, dict):
        return {k: yaml_ready(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [yaml_ready(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"{where} is a {type(value).__name__}, which dataset.yaml cannot hold; "
                    "pass strings, numbers, booleans, lists and mappings")
