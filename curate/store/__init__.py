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

Names resolve on first use (:mod:`curate.lazy`), so importing one module of the store (say
:mod:`curate.store.mask_sources`, which every mask consumer reads) does not import pyarrow.
"""
from __future__ import annotations

from curate.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "DatasetError": "curate.store.atomic",
    "DatasetLock": "curate.store.atomic",
    "LockedError": "curate.store.atomic",
    "Dataset": "curate.store.dataset",
    "QUARANTINE_REASONS": "curate.store.images",
    "ImageRejected": "curate.store.images",
    "PreparedImage": "curate.store.images",
    "prepare_image": "curate.store.images",
    "prepare_mask": "curate.store.images",
    "AddReport": "curate.store.records",
    "NewSample": "curate.store.records",
    "BACKGROUND_SOURCES": "curate.store.schema",
    "COLUMNS": "curate.store.schema",
    "DEFAULT_BACKGROUNDS": "curate.store.schema",
    "GROUPS": "curate.store.schema",
    "SCHEMA": "curate.store.schema",
    "SCHEMA_VERSION": "curate.store.schema",
    "STATUSES": "curate.store.schema",
    "summarize": "curate.store.summary",
    "ValidationProblem": "curate.store.validate",
    "check_dataset": "curate.store.validate",
})

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
