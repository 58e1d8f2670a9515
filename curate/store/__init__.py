"""The dataset folder: the single source of truth of every curate stage (DESIGN.md).

A dataset is a folder any tool can read: ``dataset.yaml`` (name, schema version, label space,
background vocabulary, recipe, provenance), ``samples.parquet`` (one row per image, explicit
schema in :mod:`curate.store.schema`), ``media/`` (content-addressed images), ``masks/``,
``changes.jsonl`` (append-only change log) and ``quarantine.jsonl`` (inputs refused, and why).
Writes are atomic under a lock (:mod:`curate.store.atomic`); opening validates
(:mod:`curate.store.validate`)::

    from curate.store import Dataset, NewSample
    ds = Dataset.create("zoo", name="zoo")
    report = ds.add_samples([NewSample(image=Path("ostrich.jpg"), class_index=9, source="folder")])
    ds.update(report.added, {"status": "accepted"}, actor="alice", reason="reviewed")
    easy = ds.select(group="easy", status="accepted")
"""
from __future__ import annotations

from curate.store.atomic import DatasetError, DatasetLock, LockedError
from curate.store.dataset import Dataset
from curate.store.images import QUARANTINE_REASONS, ImageRejected, PreparedImage, prepare_image, prepare_mask
from curate.store.records import AddReport, NewSample
from curate.store.schema import (
    BACKGROUND_SOURCES,
    COLUMNS,
    DEFAULT_BACKGROUNDS,
    GROUPS,
    SCHEMA,
    SCHEMA_VERSION,
    STATUSES,
)
from curate.store.summary import summarize
from curate.store.validate import ValidationProblem, check_dataset

__all__ = [
    "AddReport",
    "BACKGROUND_SOURCES",
    "COLUMNS",
    "DEFAULT_BACKGROUNDS",
    "Dataset",
    "DatasetError",
    "DatasetLock",
    "GROUPS",
    "ImageRejected",
    "LockedError",
    "NewSample",
    "PreparedImage",
    "QUARANTINE_REASONS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "STATUSES",
    "ValidationProblem",
    "check_dataset",
    "prepare_image",
    "prepare_mask",
    "summarize",
]
