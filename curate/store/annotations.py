"""The annotation table: every answer of every annotator, kept (docs/design.md#dataset-folder, issue 44).

A folder labelled by several people keeps each person's answer here; the folder's ``background``
is derived from these answers by :mod:`curate.agreement` (never written by one person). A folder
that never had several annotators has no table and nothing changes for it.

Files (beside ``samples.parquet``):

- ``annotations.parquet``: one row per annotation VERSION (:data:`ANNOTATION_SCHEMA`).
- ``annotations/masks/<safe id>.v<version>.png``: the mask an annotation drew (0 = not the object,
  other values = the object; the stored image's size), one file per version so an old version's
  row never points at a newer drawing. ``<safe id>`` = the annotation id with every character
  outside ``[A-Za-z0-9._-]`` (and every run of dots) replaced by ``_`` (at most 60 kept) plus ``-`` and the first 12 hex of
  the id's sha256: ids come from the network and are not trusted as file names.

What each field of an :class:`Annotation` means:

- ``annotation_id``: unique per source annotation, e.g. ``labelstudio:<project>:<annotation id>``,
  ``fiftyone:<dataset>:<annotator>:<sample>``, ``simulated:<annotator>:<sample>``, ``gold:<sample>``.
- ``sample_id``: the photo (a ``sample_id`` of samples.parquet).
- ``annotator``: who answered (a user name of the tool; one name per person across tools).
- ``backend``: where the answer was made: one of :data:`BACKENDS`.
- ``backgrounds``: the background(s) chosen, from the dataset's vocabulary: one, or two where a
  photo shows two (the first is the primary); empty = the annotator skipped the photo.
- ``mask``: the stored mask PNG's path relative to the folder, or None (set by the store from
  the ``masks=`` argument of :func:`upsert_annotations`; callers pass None).
- ``created_at`` / ``updated_at``: ISO 8601 UTC times the tool gives (text, as the tool wrote it).
- ``role``: ``"annotator"`` (a member of the team) or ``"adjudicator"`` (settles a disputed photo;
  an adjudicator's answer settles it, see :mod:`curate.agreement`).
- ``is_gold``: for role annotator: the photo was a gold photo in this annotator's queue (mixed in
  unannounced); for role adjudicator: this answer IS a gold answer (the truth annotators are
  scored against; :func:`write_gold` writes them).

A stored row (:class:`StoredAnnotation`) adds ``version`` (1, 2, ...), ``state`` (one of
:data:`STATES`), ``source`` (the upsert's ``source``: which pull wrote it, e.g.
``labelstudio:project 3``; deletions are scoped to it), ``recorded_at`` (when curate stored it),
``actor`` and ``mask_sha256`` (of the mask PNG's bytes; compares drawings across pulls).

Versions: an upsert that finds an annotation whose content (sample, annotator, backend,
backgrounds, mask bytes, role, is_gold) differs from its current row marks that row "changed" and
appends the new version as "current"; one the source no longer has (``present_ids``) is marked
"deleted" (an annotation that comes back later gets a new "current" version). The same content
again is "unchanged": a re-pull is a no-op, nothing is written.

Bad input (a background outside the vocabulary, an unknown sample id, the same annotation id or
the same annotator twice on one photo in one upsert, an unknown backend or role, a mask of the
wrong size) raises :class:`AnnotationError` (a ``ValueError``) naming each row; nothing is written.

Writes: under the folder's lock, masks first (atomic, fsync-ed), then the whole table replaced
atomically (:func:`curate.store.atomic.atomic_write`) with its ``changes.jsonl`` records logged
ahead of the rename (:mod:`curate.store.changelog`): a process killed at any instant leaves the
old table or the new one, with the log matching it; a mask written for a commit that did not
happen is an orphan that validation warns about. ``curate check`` (and every open) validates the
table: :func:`curate.store.annotation_schema.annotation_problems`, beside the layout it checks.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from curate.store import changelog
from curate.store.annotation_schema import (
    ANNOTATION_MASKS_DIR,
    ANNOTATION_SCHEMA,
    ANNOTATIONS_FILE,
    ANNOTATIONS_VERSION,
    BACKENDS,
    LABEL_STATUS_FILE,
    LABEL_STATUS_SCHEMA,
    LABEL_STATUSES,
    MAX_BACKGROUNDS,
    ROLES,
    STATES,
    annotation_problems,
)
from curate.store.atomic import DatasetError, atomic_write
from curate.store.images import ImageRejected, MaskInput, prepare_mask
from curate.store.records import iso_time

__all__ = [
    "ANNOTATIONS_FILE", "ANNOTATION_MASKS_DIR", "ANNOTATION_SCHEMA", "ANNOTATIONS_VERSION", "BACKENDS",
    "MAX_BACKGROUNDS", "ROLES", "STATES", "Annotation", "AnnotationError", "AnnotationUpsert", "StoredAnnotation",
    "LABEL_STATUSES", "LabelStatus", "annotation_problems", "current_annotations", "gold_answers", "load_annotations",
    "load_label_status", "mask_relpath", "safe_name", "upsert_annotations", "write_gold", "write_label_status",
]

#: The fields whose difference makes a new version (times and bookkeeping do not).
_CONTENT = ("sample_id", "annotator", "backend", "backgrounds", "mask_sha256", "role", "is_gold")


class AnnotationError(DatasetError, ValueError):
    """Annotations refused; ``problems`` lists one line per refused row. Nothing was written."""


@dataclass(frozen=True)
class Annotation:
    """One answer of one annotator on one photo (field meanings: module docstring)."""

    annotation_id: str
    sample_id: str
    annotator: str
    backend: str
    backgrounds: tuple[str, ...]
    mask: str | None = None
    created_at: str = ""
    updated_at: str = ""
    role: str = "annotator"
    is_gold: bool = False

    @property
    def primary(self) -> str | None:
        """The first background (what single-label metrics use), None when skipped."""
        return self.backgrounds[0] if self.backgrounds else None

    @property
    def skipped(self) -> bool:
        return not self.backgrounds


@dataclass(frozen=True)
class StoredAnnotation(Annotation):
    """A row of ``annotations.parquet``: an :class:`Annotation` version and its bookkeeping."""

    version: int = 1
    state: str = "current"
    source: str = ""
    recorded_at: str = ""
    actor: str = ""
    mask_sha256: str | None = None

    def annotation(self) -> Annotation:
        """The plain :class:`Annotation` of this row."""
        return Annotation(**{f.name: getattr(self, f.name) for f in fields(Annotation)})


@dataclass
class AnnotationUpsert:
    """What :func:`upsert_annotations` did: the annotation ids in each outcome."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return {"added": len(self.added), "changed": len(self.changed), "deleted": len(self.deleted),
                "unchanged": len(self.unchanged)}

    def __str__(self) -> str:
        c = self.counts
        return f"{c['added']} added, {c['changed']} changed, {c['deleted']} deleted, {c['unchanged']} unchanged"


def safe_name(annotation_id: str) -> str:
    """A file-name stem for ``annotation_id`` (module docstring): never a path, never empty."""
    cleaned = re.sub(r"\.{2,}", "_", re.sub(r"[^A-Za-z0-9._-]", "_", annotation_id))[:60].lstrip(".") or "annotation"
    return f"{cleaned}-{hashlib.sha256(annotation_id.encode('utf-8')).hexdigest()[:12]}"


def mask_relpath(annotation_id: str, version: int) -> str:
    """``annotations/masks/<safe id>.v<version>.png``."""
    return f"{ANNOTATION_MASKS_DIR}/{safe_name(annotation_id)}.v{version}.png"


def _root_of(ds: Any) -> Path:
    return Path(ds) if isinstance(ds, (str, Path)) else Path(ds.root)


def load_annotations(ds: Any) -> list[StoredAnnotation]:
    """Every row (every version) of the folder's table, in file order; [] when there is none.
    ``ds``: a :class:`~curate.store.Dataset` or a folder path."""
    path = _root_of(ds) / ANNOTATIONS_FILE
    if not path.is_file():
        return []
    table = pq.read_table(path)
    return [_from_row(row) for row in table.to_pylist()]


def current_annotations(ds: Any, *, include_skipped: bool = True) -> list[StoredAnnotation]:
    """The "current" version of every annotation not deleted (``include_skipped=False``: only
    those that name a background)."""
    return [a for a in load_annotations(ds) if a.state == "current" and (include_skipped or a.backgrounds)]


def _from_row(row: Mapping[str, Any]) -> StoredAnnotation:
    values = dict(row)
    values["backgrounds"] = tuple(values.get("backgrounds") or ())
    return StoredAnnotation(**values)


def _to_table(rows: Sequence[StoredAnnotation]) -> pa.Table:
    records = []
    for row in rows:
        record = asdict(row)
        record["backgrounds"] = list(row.backgrounds)
        records.append(record)
    return pa.Table.from_pylist(records, schema=ANNOTATION_SCHEMA)


def _problems_of(annotations: Sequence[Annotation], ds: Any, masks: Mapping[str, Any],
                 stored: Sequence[StoredAnnotation]) -> list[str]:
    """Every problem of an upsert's input (one line per row), before anything is written."""
    stored_masks = {(row.annotation_id, row.mask) for row in stored if row.state == "current" and row.mask}
    vocabulary = set(ds.backgrounds)
    known = set(ds.sample_ids())
    problems: list[str] = []
    seen_ids: dict[str, int] = {}
    seen_pairs: dict[tuple[str, str, str], int] = {}
    for index, a in enumerate(annotations):
        where = f"row {index} ({a.annotation_id!r}, annotator {a.annotator!r}, sample {a.sample_id})"
        if not isinstance(a.annotation_id, str) or not a.annotation_id:
            problems.append(f"{where}: annotation_id is empty")
        elif a.annotation_id in seen_ids:
            problems.append(f"{where}: the same annotation id as row {seen_ids[a.annotation_id]}")
        else:
            seen_ids[a.annotation_id] = index
        if a.sample_id not in known:
            problems.append(f"{where}: unknown sample id {a.sample_id!r}")
        if not isinstance(a.annotator, str) or not a.annotator.strip():
            problems.append(f"{where}: annotator is empty")
        if a.backend not in BACKENDS:
            problems.append(f"{where}: backend {a.backend!r} is not one of {', '.join(BACKENDS)}")
        if a.role not in ROLES:
            problems.append(f"{where}: role {a.role!r} is not one of {', '.join(ROLES)}")
        bad = [b for b in a.backgrounds if b not in vocabulary]
        if bad:
            problems.append(f"{where}: background(s) {', '.join(map(repr, bad))} not in the vocabulary "
                            f"({', '.join(ds.backgrounds)})")
        if len(set(a.backgrounds)) != len(a.backgrounds) or len(a.backgrounds) > MAX_BACKGROUNDS:
            problems.append(f"{where}: backgrounds {list(a.backgrounds)} must be 0 to {MAX_BACKGROUNDS} distinct labels")
        pair = (a.sample_id, a.annotator, a.role)
        if pair in seen_pairs:
            problems.append(f"{where}: the same annotator twice on one photo (also row {seen_pairs[pair]})")
        else:
            seen_pairs[pair] = index
        if a.mask is not None and a.annotation_id not in masks and (a.annotation_id, a.mask) not in stored_masks:
            problems.append(f"{where}: mask {a.mask!r} is not this annotation's stored mask; pass a new drawing "
                            "in masks={annotation_id: array} (mask=None)")
    return problems


def upsert_annotations(
    ds: Any,
    annotations: Iterable[Annotation],
    *,
    source: str,
    actor: str,
    present_ids: set[str] | None = None,
    masks: Mapping[str, MaskInput] | None = None,
) -> AnnotationUpsert:
    """Store ``annotations`` from ``source`` (module docstring: versions, bad input, writes).

    ``ds``: an open :class:`~curate.store.Dataset`. ``masks``: annotation_id -> the drawn mask
    (an H x W array or a PNG, the stored image's size). ``present_ids``: every id ``source`` still
    has (those in ``annotations`` count as present); the current rows from ``source`` not in it
    are marked "deleted". None: nothing is deleted. Returns the ids per outcome.
    """
    annotations = list(annotations)
    masks = dict(masks or {})
    if not isinstance(source, str) or not source:
        raise AnnotationError("upsert_annotations needs a source (which pull writes these rows)")
    if not isinstance(actor, str) or not actor:
        raise AnnotationError("upsert_annotations needs an actor (who or what writes these rows)")
    root = _root_of(ds)
    with ds.locked("annotations"):
        changelog.settle(root)
        stored = load_annotations(root)
        problems = _problems_of(annotations, ds, masks, stored)
        mask_bytes: dict[str, bytes] = {}
        for a in annotations:
            if a.annotation_id in masks and not problems:
                row = ds.row(a.sample_id)
                try:
                    mask_bytes[a.annotation_id] = prepare_mask(masks[a.annotation_id], (row["width"], row["height"]))
                except ImageRejected as exc:
                    problems.append(f"annotation {a.annotation_id!r} (sample {a.sample_id}): {exc.detail}")
        if problems:
            raise AnnotationError(
                f"{len(problems)} annotation problem(s); nothing was written:\n  " + "\n  ".join(problems[:20])
                + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""), problems)
        return _commit(root, stored, annotations, mask_bytes, source=source, actor=actor,
                       present_ids=present_ids)


def _commit(root: Path, rows: list[StoredAnnotation], annotations: list[Annotation], mask_bytes: dict[str, bytes], *,
            source: str, actor: str, present_ids: set[str] | None) -> AnnotationUpsert:
    """The new table from the old ``rows`` and the checked input, written when anything changed."""
    now = iso_time()
    outcome = AnnotationUpsert()
    rows = list(rows)
    latest: dict[str, int] = {}  # annotation_id -> index of its highest version
    for index, row in enumerate(rows):
        if row.annotation_id not in latest or row.version > rows[latest[row.annotation_id]].version:
            latest[row.annotation_id] = index
    new_masks: dict[str, bytes] = {}
    records: list[dict[str, Any]] = []
    for a in annotations:
        sha = hashlib.sha256(mask_bytes[a.annotation_id]).hexdigest() if a.annotation_id in mask_bytes else None
        old_index = latest.get(a.annotation_id)
        old = rows[old_index] if old_index is not None else None
        if sha is None and a.mask is not None and old is not None and old.mask == a.mask:
            sha = old.mask_sha256  # the stored mask passed back unchanged
        candidate = StoredAnnotation(**{**{f.name: getattr(a, f.name) for f in fields(Annotation)},
                                        "backgrounds": tuple(a.backgrounds), "mask_sha256": sha})
        if old is not None and old.state == "current" and all(
                getattr(old, name) == getattr(candidate, name) for name in _CONTENT):
            outcome.unchanged.append(a.annotation_id)
            continue
        version = old.version + 1 if old is not None else 1
        mask = None
        if a.annotation_id in mask_bytes:
            mask = mask_relpath(a.annotation_id, version)
            new_masks[mask] = mask_bytes[a.annotation_id]
        elif sha is not None and old is not None:
            mask = old.mask
        kind = "changed" if old is not None and old.state == "current" else "added"
        if kind == "changed":
            rows[old_index] = _with(old, state="changed")
        rows.append(_with(candidate, mask=mask, version=version, state="current", source=source, recorded_at=now,
                          actor=actor, created_at=a.created_at or now, updated_at=a.updated_at or now))
        latest[a.annotation_id] = len(rows) - 1
        (outcome.changed if kind == "changed" else outcome.added).append(a.annotation_id)
        records.append(_record(now, actor, kind, rows[-1]))
    if present_ids is not None:
        keep = set(present_ids) | {a.annotation_id for a in annotations}
        for index, row in enumerate(rows):
            if row.state == "current" and row.source == source and row.annotation_id not in keep:
                rows[index] = _with(row, state="deleted")
                outcome.deleted.append(row.annotation_id)
                records.append(_record(now, actor, "deleted", rows[index]))
    if records:
        for rel, data in new_masks.items():
            atomic_write(root, root / rel, lambda handle, data=data: handle.write(data))
        _write_table(root, rows, records)
    return outcome


def _with(row: StoredAnnotation, **changes: Any) -> StoredAnnotation:
    return StoredAnnotation(**{**{f.name: getattr(row, f.name) for f in fields(StoredAnnotation)}, **changes})


def _record(now: str, actor: str, kind: str, row: StoredAnnotation) -> dict[str, Any]:
    """The changes.jsonl record of one annotation outcome."""
    return {"time": now, "actor": actor, "op": "annotation", "outcome": kind, "sample_id": row.sample_id,
            "annotation_id": row.annotation_id, "version": row.version, "annotator": row.annotator,
            "role": row.role, "backgrounds": list(row.backgrounds), "mask": row.mask, "source": row.source}


def _write_table(root: Path, rows: Sequence[StoredAnnotation], records: list[dict[str, Any]]) -> None:
    """The commit point: the whole table replaced atomically, its records logged ahead."""
    table = _to_table(rows)
    try:
        atomic_write(root, root / ANNOTATIONS_FILE, lambda handle: pq.write_table(table, handle, compression="zstd"),
                     before_replace=lambda tmp: changelog.log_ahead(root, tmp, records, target=ANNOTATIONS_FILE))
    except BaseException:
        changelog.roll_back(root)
        raise
    changelog.done(root)


def write_gold(ds: Any, answers: Mapping[str, str | Sequence[str]], actor: str) -> AnnotationUpsert:
    """Fix gold photos' backgrounds: one row per photo, role "adjudicator", ``is_gold`` True,
    annotator = ``actor``, id ``gold:<sample_id>`` (a new answer for a photo makes a new version),
    source "gold" (never deleted by a pull). ``answers``: sample_id -> background(s)."""
    rows = [Annotation(annotation_id=f"gold:{sid}", sample_id=sid, annotator=actor, backend="import",
                       backgrounds=(value,) if isinstance(value, str) else tuple(value), role="adjudicator",
                       is_gold=True)
            for sid, value in answers.items()]
    return upsert_annotations(ds, rows, source="gold", actor=actor)


def gold_answers(annotations: Iterable[Annotation]) -> dict[str, tuple[str, ...]]:
    """sample_id -> the gold answer, from current adjudicator rows with ``is_gold`` (the latest
    ``updated_at`` wins where a photo has several)."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for a in annotations:
        if a.role == "adjudicator" and a.is_gold and a.backgrounds:
            if a.sample_id not in out or a.updated_at >= out[a.sample_id][0]:
                out[a.sample_id] = (a.updated_at, tuple(a.backgrounds))
    return {sid: value for sid, (_, value) in out.items()}


@dataclass(frozen=True)
class LabelStatus:
    """Where one photo's background came from (``label_status.parquet``; statuses:
    :data:`~curate.store.annotation_schema.LABEL_STATUSES`): ``background`` is the derived label
    (None when disputed or unlabelled), ``candidate`` the rule's best guess on a disputed photo,
    ``confidence`` the vote share or posterior, ``rule`` / ``threshold`` the rule that decided."""

    sample_id: str
    status: str
    background: str | None
    n_answers: int
    rule: str
    threshold: float
    confidence: float | None = None
    candidate: str | None = None
    derived_at: str = ""


def load_label_status(ds: Any) -> dict[str, LabelStatus]:
    """sample_id -> :class:`LabelStatus`; {} for a folder that never derived its labels (old folders)."""
    path = _root_of(ds) / LABEL_STATUS_FILE
    if not path.is_file():
        return {}
    return {row["sample_id"]: LabelStatus(**row) for row in pq.read_table(path).to_pylist()}


def write_label_status(ds: Any, rows: Sequence[LabelStatus]) -> None:
    """Replace ``label_status.parquet`` atomically (under the folder's lock) with ``rows``; a status
    outside the list or a background on an unlabelled photo raises :class:`AnnotationError`."""
    bad = [f"sample {r.sample_id}: status {r.status!r}" for r in rows if r.status not in LABEL_STATUSES]
    if bad:
        raise AnnotationError("label status refused, nothing was written:\n  " + "\n  ".join(bad[:20]), bad)
    now = iso_time()
    table = pa.Table.from_pylist([{**asdict(r), "derived_at": r.derived_at or now} for r in rows],
                                 schema=LABEL_STATUS_SCHEMA)
    root = _root_of(ds)
    with ds.locked("label status"):
        atomic_write(root, root / LABEL_STATUS_FILE, lambda handle: pq.write_table(table, handle, compression="zstd"))
