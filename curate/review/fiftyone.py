"""The dataset folder as a persistent FiftyOne dataset: push, saved views, the App, pull.

Why it is long (one job): the FiftyOne side of the two-way review; push (fields, runs, audit scores,
saved views), observe and pull share the one field mapping below, so they stay beside it.

``push_fiftyone(DIR)`` makes (or updates in place) a persistent FiftyOne dataset named from
``dataset.yaml`` with one sample per row:

==========================  =================================================================
FiftyOne field              from the folder
==========================  =================================================================
``filepath``, ``metadata``  the image (absolute path), width/height
``sample_id``               ``sample_id`` (the key between the two)
``ground_truth``            ``Classification(label=class_name, class_index=...)``
``background``              ``Classification(label=background, confidence=background_score)``
``background_source``       human | model | synthetic
``status``, ``reject_reason``, ``group``, ``mask_status``, ``source``, ``source_id``,
``source_url``, ``license``, ``attribution``: strings
``mask``                    ``Segmentation(mask_path=<the folder's masks/ PNG>)``, whatever its
                            source: a model proposal is this field too (the one mask a
                            sample has; the App draws it, a reviewer repaints it here)
``mask_source``             human | exact | model | rejected (:mod:`curate.masks.sources`)
``mask_score``              a model proposal's confidence in [0, 1] (``extra.mask_score``);
                            null for other masks
``mask_run``                the propose-masks run that wrote the proposal (``extra.mask_run``)
``pred_<run>``              per evaluation run: ``Classification(label=top-1 name, confidence,
                            class_index, correct=top-1 right, top5=[names])``
``audit_<check>``           per audit check: the sample's score (float, higher = more suspect,
                            null = not scored) in the newest audit run that ran the check
                            (the run whose ``suspect:<check>`` tags the folder holds)
``tags``                    the reviewer's vocabulary (``accept``, ``reject:<reason>``,
                            ``bg:<background>``, ``mask:ok|bad``, ``tag:<free>``), see
                            :mod:`curate.review.vocabulary`
==========================  =================================================================

and saves the views of ``annotation/views.yaml`` (one per run for per-run views; "masks to
verify" holds the unverified model proposals, lowest ``mask_score`` first). The push is
recorded in ``DIR/.review/fiftyone-<name>.json``; ``pull_fiftyone(DIR)`` reads the sample tags
and label edits back through :func:`curate.review.sync.apply_pull` (only edited fields change,
conflicts reported). A re-push refuses to overwrite edits that were not pulled yet (``force``
discards them).

On a model proposal, ``mask:ok`` verifies it (``mask_status = ok``), a new mask in ``mask`` (an
in-database mask or another PNG) replaces it (``human``), and ``mask:bad`` (or removing the
``mask`` field, or an all-zero mask) drops it: the sample is left without a mask,
``mask_status = bad`` (:func:`curate.review.sync.decide_mask_review`, shared with Label Studio).
Clearing its ``mask_status`` field is reported, not applied (a null status would make the
proposal count as a person's mask); so is an all-zero mask on any other mask.

FiftyOne is imported only inside these functions, after
:func:`curate.review.database.ensure_fiftyone_database` made sure it has a database.
"""
from __future__ import annotations

import getpass
import logging
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from curate import __version__
from curate.labels import UnknownClassError
from curate.review.annotation import GUIDELINE_FILE, annotation_file
from curate.review.sync import (
    Edit,
    Observation,
    OnConflict,
    Problem,
    PullReport,
    ReviewError,
    Snapshot,
    apply_pull,
    folder_units,
    jsonable,
    now_iso,
    snapshot_path,
)
from curate.review.views import (
    AUDIT_PREFIX,
    CORRECT_PREFIX,
    DERIVED_COLUMNS,
    Condition,
    ViewSpec,
    column_value,
    expand_views,
    load_views,
)
from curate.review.vocabulary import SUSPECT_PREFIX, TagVocabulary
from curate.runs import iter_runs
from curate.shell import suggest
from curate.store import Dataset
from curate.store.mask_sources import proposal_of

log = logging.getLogger(__name__)

BACKEND = "fiftyone"
#: Sync units whose tags the vocabulary reads, and the vocabulary's name for them.
TAG_UNITS: dict[str, str] = {"background": "background", "curation": "curation", "mask_status": "mask", "tags": "free"}
STRING_FIELDS: tuple[str, ...] = ("sample_id", "source", "source_id", "source_url", "license", "attribution", "status",
                                  "reject_reason", "background_source", "mask_status", "group")
#: Folder columns that live inside a label in FiftyOne (for compiling view conditions).
FIELD_PATHS: dict[str, str] = {
    "background": "background.label",
    "background_score": "background.confidence",
    "class_name": "ground_truth.label",
    "class_index": "ground_truth.class_index",
    "mask_path": "mask",
}
#: Read-only fields about the sample's mask (derived from the folder at push; never read back).
MASK_INFO_FIELDS: tuple[str, ...] = ("mask_source", "mask_score", "mask_run")
DEFAULT_PORT = 5151


# ---------------------------------------------------------------------------------------------
# FiftyOne, lazily
# ---------------------------------------------------------------------------------------------


class _MissingKeysAreNone:
    """A package-metadata Message whose missing keys read as None (the stdlib's documented behaviour)."""

    def __init__(self, message: Any) -> None:
        self._message = message

    def __getitem__(self, key: str) -> Any:
        try:
            return self._message[key]
        except KeyError:
            return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)


def import_fiftyone_module() -> Any:
    """``import fiftyone``, safe against the importlib_metadata backport (no database check).

    FiftyOne imports ``eta``, whose ``eta.constants`` reads ``metadata("voxel51-eta")["author"]``
    through the stdlib ``importlib.metadata``, where a missing key is None. Once another package
    has imported the ``importlib_metadata`` backport (pyinaturalist does), the lookup returns the
    backport's Message, which raises KeyError for the missing "author", and ``import fiftyone``
    fails (measured: ``python -c "import pyinaturalist; import fiftyone"``). So while FiftyOne
    imports, ``importlib.metadata.metadata`` answers with a Message whose missing keys are None.
    """
    import importlib.metadata as metadata
    import sys

    if "fiftyone" in sys.modules:
        return sys.modules["fiftyone"]
    real = metadata.metadata
    metadata.metadata = lambda name: _MissingKeysAreNone(real(name))  # type: ignore[assignment]
    try:
        import fiftyone
    finally:
        metadata.metadata = real
    return fiftyone


def import_fiftyone() -> Any:
    """``fiftyone``, imported after making sure it has a database (see curate.review.database)."""
    from curate.review.database import ensure_fiftyone_database

    os.environ.setdefault("FIFTYONE_DO_NOT_TRACK", "true")  # offline-first: no usage pings
    ensure_fiftyone_database()
    try:
        fo = import_fiftyone_module()
    except ImportError as exc:
        raise ReviewError(f"FiftyOne is not importable ({exc}); install curate's extra: pip install 'curate[fiftyone]' "
                          "(and graphql-core<3.3, which FiftyOne 1.22's strawberry needs)") from None
    return fo


def run_field(run: str) -> str:
    """The FiftyOne field of a run's predictions: ``pred_<run>`` with non-identifier characters as ``_``."""
    return "pred_" + re.sub(r"[^0-9A-Za-z_]", "_", run)


def audit_field(check: str) -> str:
    """The FiftyOne field of an audit check's scores: ``audit_<check>``."""
    return "audit_" + re.sub(r"[^0-9A-Za-z_]", "_", check)


def dataset_name(ds: Dataset, name: str | None = None) -> str:
    """The FiftyOne dataset name: ``name`` or dataset.yaml's name."""
    return name or ds.name


# ---------------------------------------------------------------------------------------------
# folder rows -> FiftyOne values
# ---------------------------------------------------------------------------------------------


@dataclass
class RunPredictions:
    """An evaluation run's top-1 per sample, as FiftyOne shows it."""

    name: str
    field: str
    by_sample: dict[str, dict[str, Any]]


def read_runs(ds: Dataset) -> list[RunPredictions]:
    """The evaluation runs of ``DIR/runs/`` (oldest first), read through their typed record
    (:class:`curate.runs.EvaluationRun`); a run that cannot be read is logged and skipped."""
    out: list[RunPredictions] = []
    names: dict[int, str] = {}  # index -> class name, looked up once per push (not per label)

    def name_of(index: int) -> str:
        try:
            return names[index]
        except KeyError:
            names[index] = _class_name(ds, index)
            return names[index]

    for run_dir, record in iter_runs(ds.root, "evaluate"):
        try:
            if isinstance(record, Exception):
                raise record
            table = record.predictions(["sample_id", "topk_labels", "topk_scores", "correct1"]).to_pydict()
        except Exception as exc:  # noqa: BLE001 - a damaged run is reported, not fatal
            log.warning("skipping run %s: its predictions cannot be read (%s)", run_dir.name, exc)
            continue
        scores = table.get("topk_scores") or [None] * len(table["sample_id"])
        by_sample: dict[str, dict[str, Any]] = {}
        for sid, labels, score, correct in zip(table["sample_id"], table["topk_labels"], scores, table["correct1"]):
            if not labels:
                continue
            top = [name_of(i) for i in labels[:5]]
            by_sample[sid] = {"label": top[0], "class_index": int(labels[0]), "top5": top,
                              "correct": bool(correct), "confidence": float(score[0]) if score else None}
        out.append(RunPredictions(run_dir.name, run_field(run_dir.name), by_sample))
    return out


@dataclass
class AuditScores:
    """One audit check's per-sample scores, from the newest audit run that ran the check."""

    check: str
    run: str
    field: str
    by_sample: dict[str, float | None]


def read_audit_scores(ds: Dataset) -> list[AuditScores]:
    """Per check, the scores of the newest audit run that ran it, read through
    :class:`curate.runs.AuditRun` (``suspect:<check>`` tags come from that run too, since an
    audit replaces only the tags of the checks it ran). A damaged run is logged and skipped."""
    from curate.runs import RunError, iter_runs

    out: dict[str, AuditScores] = {}
    for run_dir, record in reversed(list(iter_runs(ds.root, "audit"))):
        if isinstance(record, RunError):
            log.warning("skipping audit run %s: %s", run_dir.name, record)
            continue
        try:
            ids = record.sample_ids
            for check in record.checks:
                if check in out:
                    continue
                scores = record.scores(check)
                out[check] = AuditScores(check, run_dir.name, audit_field(check),
                                         {sid: (None if np.isnan(v) else float(v)) for sid, v in zip(ids, scores)})
        except (RunError, OSError, KeyError, ValueError) as exc:
            log.warning("skipping audit run %s: its scores cannot be read (%s)", run_dir.name, exc)
    from curate.audit.base import CHECKS

    return [out[c] for c in CHECKS if c in out]


def _class_name(ds: Dataset, index: int) -> str:
    try:
        return ds.label_space.name_of(int(index))
    except UnknownClassError:
        return str(index)


def prediction_document(pred: Mapping[str, Any], object_id: Callable[[], Any] | None = None) -> dict[str, Any]:
    """The MongoDB document FiftyOne stores for ``fo.Classification(**pred)`` (a run's prediction
    of one sample), built as a plain dict: ``_id`` (a new label id, ``object_id()``, default
    ``bson.ObjectId``), ``_cls``, ``tags``, the declared fields ``label`` and ``confidence``
    (left out when None, as FiftyOne leaves it), then the dynamic attributes ``class_index``,
    ``top5``, ``correct``. A push writes these with ``set_values(..., validate=False)`` instead
    of building hundreds of thousands of ``Classification`` objects; :func:`prediction_writer`
    checks the layout against FiftyOne's own first."""
    if object_id is None:
        from bson import ObjectId as object_id
    doc: dict[str, Any] = {"_id": object_id(), "_cls": "Classification", "tags": [], "label": pred["label"]}
    if pred.get("confidence") is not None:
        doc["confidence"] = pred["confidence"]
    doc["class_index"] = pred["class_index"]
    doc["top5"] = list(pred["top5"])
    doc["correct"] = pred["correct"]
    return doc


def prediction_writer(fo: Any, runs: Sequence[RunPredictions]) -> tuple[Callable[[Mapping[str, Any]], Any], bool]:
    """How a push turns a run's prediction into the value it writes: ``(make, validate)``.

    :func:`prediction_document`, not validated, when on a prediction of these runs (with its
    confidence and without) it equals what this FiftyOne stores for ``fo.Classification(**pred)``,
    keys in the same order, ``_id`` aside; otherwise (a FiftyOne that stores labels otherwise)
    ``fo.Classification`` objects, validated, as pushes made them before."""
    from functools import partial

    from bson import ObjectId

    pred = next((p for run in runs for p in run.by_sample.values()), None)
    for probe in ([pred, {**pred, "confidence": None}] if pred is not None else []):
        theirs = dict(fo.Classification(**probe).to_mongo())
        ours = prediction_document(probe)
        theirs.pop("_id", None), ours.pop("_id", None)
        if list(theirs.items()) != list(ours.items()):
            log.warning("this FiftyOne stores a Classification as %r, not %r: building Classification objects",
                        theirs, ours)
            return (lambda p: fo.Classification(**p)), True
    return partial(prediction_document, object_id=ObjectId), False


def view_units(row: Mapping[str, Any], tags: Sequence[str], vocab: TagVocabulary, mask_abspath: str | None) -> dict[str, Any]:
    """The per-unit FiftyOne representation of a row (what a push writes and the snapshot keeps)."""
    by_unit: dict[str, list[str]] = {u: [] for u in TAG_UNITS}
    reverse = {v: k for k, v in TAG_UNITS.items()}
    for tag in tags:
        unit = reverse.get(vocab.unit_of(tag))
        if unit is not None:
            by_unit[unit].append(tag)
    score = row.get("background_score")
    return {
        "class": {"field": row.get("class_name"), "index": row.get("class_index")},
        "background": {"tags": sorted(by_unit["background"]),
                       "field": [row.get("background"), row.get("background_source"),
                                 None if score is None else float(score)]},
        "curation": {"tags": sorted(by_unit["curation"]), "field": [row.get("status"), row.get("reject_reason")]},
        "mask": {"field": mask_abspath},
        "mask_status": {"tags": sorted(by_unit["mask_status"]), "field": row.get("mask_status")},
        "group": {"field": row.get("group")},
        "license": {"field": row.get("license")},
        "attribution": {"field": row.get("attribution")},
        "tags": {"tags": list(by_unit["tags"])},
    }


def _sample_values(fo: Any, ds: Dataset, row: Mapping[str, Any], vocab: TagVocabulary,
                   runs: Sequence[RunPredictions], audits: Sequence[AuditScores] = ()) -> dict[str, Any]:
    """Field -> value of one row in FiftyOne."""
    mask_path = ds.mask_path(row)
    values: dict[str, Any] = {name: row.get(name) for name in STRING_FIELDS}
    values["ground_truth"] = (fo.Classification(label=row["class_name"], class_index=int(row["class_index"]))
                              if row.get("class_name") is not None else None)
    score = row.get("background_score")
    values["background"] = (fo.Classification(label=row["background"], confidence=None if score is None else float(score))
                            if row.get("background") else None)
    values["mask"] = fo.Segmentation(mask_path=str(mask_path)) if mask_path is not None else None
    for column in DERIVED_COLUMNS:  # mask_source, mask_score: the very values the views match in Python
        values[column] = column_value(row, column)
    proposal = proposal_of(row)
    values["mask_run"] = proposal.run if proposal is not None else None
    values["tags"] = vocab.tags_for(row)
    for run in runs:
        pred = run.by_sample.get(row["sample_id"])
        values[run.field] = fo.Classification(**pred) if pred else None
    for audit in audits:
        values[audit.field] = audit.by_sample.get(row["sample_id"])
    return values


# ---------------------------------------------------------------------------------------------
# views
# ---------------------------------------------------------------------------------------------


def _field_path(column: str, runs: Sequence[RunPredictions]) -> str:
    if column.startswith(CORRECT_PREFIX):
        run = column[len(CORRECT_PREFIX):]
        return f"{run_field(run)}.correct"
    if column.startswith(AUDIT_PREFIX):
        return audit_field(column[len(AUDIT_PREFIX):])
    return FIELD_PATHS.get(column, column)


def _expression(fo: Any, condition: Condition, path: str, vocab: TagVocabulary | None = None) -> Any:
    F = fo.ViewField
    value, op = condition.value, condition.op
    if op == "has":  # the folder's free tag t is the sample tag tag:t in FiftyOne
        prefix = (vocab or TagVocabulary.load()).free_prefix
        tag = value if str(value).startswith(SUSPECT_PREFIX) else f"{prefix}{value}"  # suspect:<check> shows as is
        return F(path).exists() & F(path).contains(tag)
    present = F(path).exists()
    if op == "exists" or (op == "eq" and value is None) or (op == "ne" and value is None):
        want = bool(value) if op == "exists" else (op == "ne")
        return present if want else ~present
    if op == "eq":
        return present & (F(path) == value)
    if op == "ne":
        return ~present | (F(path) != value)
    if op == "in":
        with_null = None in value
        options = [v for v in value if v is not None]
        expr = present & F(path).is_in(options)
        return (expr | ~present) if with_null else expr
    if op == "nin":
        without_null = None in value
        options = [v for v in value if v is not None]
        expr = ~present | ~F(path).is_in(options)
        return (present & ~F(path).is_in(options)) if without_null else expr
    comparison = {"lt": F(path) < value, "le": F(path) <= value, "gt": F(path) > value, "ge": F(path) >= value}[op]
    return present & comparison  # Mongo orders null below numbers: never let a missing value match


def build_view(fo: Any, dataset: Any, spec: ViewSpec, runs: Sequence[RunPredictions]) -> Any:
    """The FiftyOne view of a (run-instantiated) :class:`ViewSpec`."""
    view = dataset.view()
    for condition in spec.conditions:
        view = view.match(_expression(fo, condition, _field_path(condition.column, runs)))
    if spec.any_of:
        groups = []
        for group in spec.any_of:
            parts = [_expression(fo, c, _field_path(c.column, runs)) for c in group]
            expr = parts[0]
            for part in parts[1:]:
                expr = expr & part
            groups.append(expr)
        either = groups[0]
        for expr in groups[1:]:
            either = either | expr
        view = view.match(either)
    key = spec.sort_key()
    if key:
        path = _field_path(key[0], runs)
        if key[0].startswith(AUDIT_PREFIX) and path not in dataset.get_field_schema():
            return view  # no audit ran that check: nothing to sort by (the view is filtered only)
        view = view.sort_by(path, reverse=key[1])
    return view


# ---------------------------------------------------------------------------------------------
# push
# ---------------------------------------------------------------------------------------------


@dataclass
class PushResult:
    """What a push did."""

    name: str
    samples: int
    added: int
    updated: int
    deleted: int
    views: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    snapshot: Path | None = None
    proposals: int = 0  # samples whose mask is an unverified model proposal (view "masks to verify")


def _guideline_summary() -> str:
    try:
        path = annotation_file(GUIDELINE_FILE)
    except FileNotFoundError:
        return ""
    return f"Review guideline: {path}"


def push_fiftyone(
    root: str | Path,
    *,
    name: str | None = None,
    force: bool = False,
    views_file: str | Path | None = None,
    vocabulary: TagVocabulary | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PushResult:
    """Push the folder at ``root`` into a persistent FiftyOne dataset (see the module docstring).

    Re-pushing updates the dataset in place: fields of existing samples are overwritten with
    the folder's values, new rows are added, rows gone from the folder are deleted, and the
    saved views are remade. Edits made in FiftyOne since the last push that were not pulled yet
    (or unreadable tags) make the push refuse, naming them; ``force=True`` discards them. A
    FiftyOne dataset of that name made from another folder is refused unless ``force``.
    """
    ds = Dataset.open(root)
    vocab = vocabulary or TagVocabulary.load()
    specs = load_views(views_file)
    fo = import_fiftyone()
    fo_name = dataset_name(ds, name)
    snap_path = snapshot_path(ds.root, BACKEND, fo_name)
    previous = Snapshot.load(snap_path)
    runs = read_runs(ds)
    audits = read_audit_scores(ds)
    exists = fo_name in fo.list_datasets()
    if exists:
        dataset = fo.load_dataset(fo_name)
        declare_fields(fo, dataset, runs, audits)
        owner = (dataset.info or {}).get("curate_root")
        if owner and owner != str(ds.root) and not force:
            raise ReviewError(f"FiftyOne dataset {fo_name!r} was pushed from {owner}, not {ds.root}; "
                              "pass --name to use another FiftyOne dataset, or --force to take it over")
        if previous is not None and not force:
            pending = observe(fo, dataset, ds, previous, vocab)
            edits = sum(len(o.edits) for o in pending)
            problems = [p for o in pending for p in o.problems]
            if edits or problems:
                raise ReviewError(
                    f"FiftyOne dataset {fo_name!r} holds {edits} edit(s) and {len(problems)} unreadable tag(s) that were "
                    f"not pulled; run `{suggest('curate review pull {dir}', dir=root)}` first, or push with --force to "
                    "discard them")
    else:
        dataset = fo.Dataset(fo_name)
    dataset.persistent = True
    declare_fields(fo, dataset, runs, audits)
    rows = ds.rows()
    total = len(rows)
    known = dict(zip(dataset.values("sample_id"), dataset.values("id"))) if exists else {}
    folder_ids = {r["sample_id"] for r in rows}
    stale = [fid for sid, fid in known.items() if sid not in folder_ids]
    if stale:
        dataset.delete_samples(stale)
    new_values: list[dict[str, Any]] = []
    updates: dict[str, dict[str, Any]] = {}
    snapshot = Snapshot(backend=BACKEND, target={"dataset": fo_name, "root": str(ds.root)}, pushed_at=now_iso(),
                        path=snap_path)
    for done, row in enumerate(rows, 1):
        values = _sample_values(fo, ds, row, vocab, (), audits)  # the run fields are written per run below
        mask = values["mask"].mask_path if values["mask"] is not None else None
        snapshot.samples[row["sample_id"]] = {"folder": folder_units(ds, row),
                                              "view": view_units(row, values["tags"], vocab, mask)}
        if row["sample_id"] in known:
            updates[row["sample_id"]] = values
        else:
            values["filepath"] = str(ds.image_path(row))
            values["metadata"] = fo.ImageMetadata(width=int(row["width"]), height=int(row["height"]))
            new_values.append(values)
        if progress is not None:
            progress(done, total)
    fo_ids = dict(known)  # sample_id -> FiftyOne id, of every row of the folder
    if new_values:
        # a generator: no Sample outlives its batch (FiftyOne reloads in-memory samples on set_values)
        added = dataset.add_samples(_new_samples(fo, new_values), progress=False, num_samples=len(new_values))
        fo_ids.update(zip((v["sample_id"] for v in new_values), added))
    if updates:
        # every field of every row, keyed by FiftyOne id
        for key in next(iter(updates.values())):
            if key == "sample_id":
                continue
            dataset.set_values(key, {fo_ids[sid]: v[key] for sid, v in updates.items()}, key_field="id", progress=False)
    make, validate = prediction_writer(fo, runs)
    for run in runs:
        # one bulk write per run: every prediction, and null for a sample pushed before that the
        # run did not predict (a new sample's field stays unset, as FiftyOne stores a Sample's None)
        preds = run.by_sample
        values = {}
        for row in rows:
            sid = row["sample_id"]
            if sid in preds:
                values[fo_ids[sid]] = make(preds[sid])
            elif sid in known:
                values[fo_ids[sid]] = None
        if values:
            dataset.set_values(run.field, values, key_field="id", validate=validate, progress=False)
    for old in (previous_run_fields(dataset) - {r.field for r in runs}):
        dataset.delete_sample_field(old)
    for old in (previous_audit_fields(dataset) - {a.field for a in audits}):
        dataset.delete_sample_field(old)
    dataset.add_dynamic_sample_fields()
    configure_app(fo, dataset)
    made = save_views(fo, dataset, specs, runs)
    dataset.info = {**(dataset.info or {}), "curate_root": str(ds.root), "curate_version": __version__,
                    "pushed_at": snapshot.pushed_at, "curate_views": made, "curate_runs": [r.name for r in runs],
                    "curate_audits": {a.check: a.run for a in audits}}
    dataset.description = f"curate dataset folder {ds.root}. {_guideline_summary()}".strip()
    dataset.save()
    snapshot.save(ds)
    result = PushResult(fo_name, total, len(new_values), len(updates), len(stale), made, [r.name for r in runs],
                        snap_path, proposals=sum(proposal_of(r) is not None for r in rows))
    log.info("pushed %s to FiftyOne dataset %r: %d added, %d updated, %d deleted, %d views", ds.root, fo_name,
             result.added, result.updated, result.deleted, len(made))
    return result


def _new_samples(fo: Any, new_values: Sequence[Mapping[str, Any]]) -> Any:
    """A ``fo.Sample`` per row's values (``filepath`` and ``metadata`` included), one at a time."""
    for values in new_values:
        sample = fo.Sample(filepath=values["filepath"], metadata=values["metadata"])
        for key, value in values.items():
            if key not in ("filepath", "metadata"):
                sample[key] = value
        yield sample


def declare_fields(fo: Any, dataset: Any, runs: Sequence[RunPredictions], audits: Sequence[AuditScores] = ()) -> None:
    """Declare every field up front, so that a field whose values are all null still exists
    (views and reads of it work, and the App lists it)."""
    schema = dataset.get_field_schema()
    for name in STRING_FIELDS + ("mask_source", "mask_run"):
        if name not in schema:
            dataset.add_sample_field(name, fo.StringField)
    if "mask_score" not in schema:
        dataset.add_sample_field("mask_score", fo.FloatField)
    labels = [("ground_truth", fo.Classification), ("background", fo.Classification), ("mask", fo.Segmentation)]
    labels += [(run.field, fo.Classification) for run in runs]
    for name, kind in labels:
        if name not in schema:
            dataset.add_sample_field(name, fo.EmbeddedDocumentField, embedded_doc_type=kind)
    for audit in audits:
        if audit.field not in schema:
            dataset.add_sample_field(audit.field, fo.FloatField)


#: The App sidebar's "review" group (shown second, after the tags).
REVIEW_SIDEBAR: tuple[str, ...] = ("status", "reject_reason", "background_source", "mask_status", "mask_source",
                                   "mask_score", "mask_run", "group", "sample_id")


def configure_app(fo: Any, dataset: Any) -> None:
    """App defaults: sample tags, class, background and mask drawn on the tiles, and a sidebar
    group "review" with the fields a reviewer filters on. Cosmetic: a failure is only logged."""
    try:
        groups = fo.DatasetAppConfig.default_sidebar_groups(dataset)
        for group in groups:
            group.paths = [p for p in group.paths if p not in REVIEW_SIDEBAR]
        position = next((i + 1 for i, g in enumerate(groups) if g.name == "tags"), 0)
        groups.insert(position, fo.SidebarGroupDocument(name="review", paths=list(REVIEW_SIDEBAR)))
        dataset.app_config.sidebar_groups = groups
        dataset.app_config.active_fields = fo.ActiveFields(paths=["tags", "ground_truth", "background", "mask"])
    except Exception as exc:  # noqa: BLE001 - App layout only
        log.warning("could not set the App layout of %r: %s", dataset.name, exc)


def previous_run_fields(dataset: Any) -> set[str]:
    return {name for name in dataset.get_field_schema() if name.startswith("pred_")}


def previous_audit_fields(dataset: Any) -> set[str]:
    return {name for name in dataset.get_field_schema() if name.startswith("audit_")}


def save_views(fo: Any, dataset: Any, specs: Sequence[ViewSpec], runs: Sequence[RunPredictions]) -> list[str]:
    """(Re)make the saved views; views curate saved before that no longer exist are deleted."""
    made: list[str] = []
    for spec in expand_views(specs, [r.name for r in runs]):
        view = build_view(fo, dataset, spec, runs)
        dataset.save_view(spec.name, view, description=spec.description or None, overwrite=True)
        made.append(spec.name)
    for old in (dataset.info or {}).get("curate_views", []):
        if old not in made and dataset.has_saved_view(old):
            dataset.delete_saved_view(old)
    return made


# ---------------------------------------------------------------------------------------------
# pull
# ---------------------------------------------------------------------------------------------


_READ_FIELDS = ("sample_id", "tags", "ground_truth.label", "ground_truth.class_index", "background.label",
                "background.confidence", "background_source", "status", "reject_reason", "mask.mask_path",
                "mask_status", "group", "license", "attribution")


def observe(fo: Any, dataset: Any, ds: Dataset, snapshot: Snapshot, vocab: TagVocabulary) -> list[Observation]:
    """Read every sample of the FiftyOne dataset and compare it with the push snapshot."""
    columns = dataset.values(list(_READ_FIELDS))
    in_db_masks: dict[str, np.ndarray] = {}
    schema = dataset.get_field_schema()
    if "mask" in schema:
        edited = dataset.exists("mask.mask")
        if len(edited):
            for sid, mask in zip(*edited.values(["sample_id", "mask.mask"])):
                in_db_masks[sid] = mask
    observations: list[Observation] = []
    for values in zip(*columns):
        record = dict(zip(_READ_FIELDS, values))
        sid = record["sample_id"]
        entry = snapshot.samples.get(sid)
        if entry is None:
            obs = Observation(sid or "?")
            obs.problems.append(Problem(sid, None, "sample is not in the push snapshot (added in FiftyOne?); ignored"))
            observations.append(obs)
            continue
        observations.append(_observe_one(ds, record, entry.get("view", {}), in_db_masks.get(sid), vocab))
    return observations


def _observe_one(ds: Dataset, record: Mapping[str, Any], pushed: Mapping[str, Any], db_mask: np.ndarray | None,
                 vocab: TagVocabulary) -> Observation:
    sid = record["sample_id"]
    tags = [t for t in (record.get("tags") or []) if isinstance(t, str)]
    reading = vocab.read(tags, ds.backgrounds)
    score = record.get("background.confidence")
    current = view_units({
        "class_name": record.get("ground_truth.label"), "class_index": record.get("ground_truth.class_index"),
        "background": record.get("background.label"), "background_source": record.get("background_source"),
        "background_score": score, "status": record.get("status"), "reject_reason": record.get("reject_reason"),
        "mask_status": record.get("mask_status"), "group": record.get("group"), "license": record.get("license"),
        "attribution": record.get("attribution"),
    }, tags, vocab, record.get("mask.mask_path"))
    if db_mask is not None:
        current["mask"] = {"field": "in-database mask"}
    obs = Observation(sid, view=current)
    for tag_problem in reading.problems["unknown"]:
        obs.problems.append(Problem(sid, "tags", f"tag {tag_problem}"))

    def changed(unit: str, part: str) -> bool:
        return jsonable(current[unit].get(part)) != jsonable((pushed.get(unit) or {}).get(part))

    for unit, vocab_unit in TAG_UNITS.items():
        if unit == "tags":
            if set(current[unit]["tags"]) != set((pushed.get(unit) or {}).get("tags") or []):
                ok, value, problems = reading.decide(vocab_unit)
                if ok:
                    obs.edits[unit] = Edit(unit, value, f"tags {current[unit]['tags']}")
                else:
                    obs.problems.extend(Problem(sid, unit, f"tag {p}; not applied") for p in problems)
            continue
        if changed(unit, "tags"):
            # tags added since the push win over the pushed ones (reject:<reason> added to accept)
            ok, value, problems = reading.decide(vocab_unit, pushed=(pushed.get(unit) or {}).get("tags") or [])
            if ok:
                obs.edits[unit] = Edit(unit, value, f"tags {current[unit]['tags'] or '(removed)'}")
            else:
                obs.problems.extend(Problem(sid, unit, f"tag {p}; not applied") for p in problems)
        elif changed(unit, "field"):
            value = current[unit]["field"]
            if unit == "background":
                label = value[0]
                old_label = ((pushed.get(unit) or {}).get("field") or [None])[0]
                if label != old_label:
                    value = [label, "human", None] if label else [None, None, None]
                    source_text = f"field background.label = {label!r}"
                else:
                    source_text = "fields background / background_source"
                obs.edits[unit] = Edit(unit, value, source_text)
            else:
                obs.edits[unit] = Edit(unit, value, f"field {unit}")
    # class: the label (or its class_index attribute) edited
    if changed("class", "field") or changed("class", "index"):
        label, index = current["class"]["field"], current["class"]["index"]
        try:
            if changed("class", "index") and index is not None:
                new_index = int(index)
                ds.label_space.name_of(new_index)
            elif label is None:
                new_index = None
            else:
                new_index = ds.label_space.resolve(label)
            obs.edits["class"] = Edit("class", new_index, f"field ground_truth = {label!r}")
        except (UnknownClassError, ValueError) as exc:
            obs.problems.append(Problem(sid, "class", f"ground_truth label {label!r}: {exc}; not applied"))
    # mask: replaced in the database, pointed at another PNG, or removed
    if db_mask is not None or changed("mask", "field"):
        try:
            if db_mask is not None:
                new_mask: np.ndarray | None = _as_mask(db_mask)
                source_text = "field mask (in-database mask)"
            elif current["mask"]["field"] is None:
                new_mask, source_text = None, "field mask removed"
            else:
                from curate.store.images import mask_array

                new_mask = mask_array(Path(current["mask"]["field"]))
                source_text = f"field mask.mask_path = {current['mask']['field']}"
            # its status (the verdict's, human, or a proposal's outcome) is decided by sync.decide_mask_review
            obs.edits["mask"] = Edit("mask", new_mask, source_text)
        except Exception as exc:  # noqa: BLE001 - an unreadable mask is reported, not fatal
            obs.problems.append(Problem(sid, "mask", f"the edited mask cannot be read ({exc}); not applied"))
    return obs


def _as_mask(array: Any) -> np.ndarray:
    mask = np.asarray(array)
    if mask.ndim == 3:
        mask = mask[..., 0]
    if mask.dtype == bool:
        mask = mask.astype(np.uint8)
    return mask.astype(np.uint8)


def pull_fiftyone(
    root: str | Path,
    *,
    name: str | None = None,
    on_conflict: OnConflict = "report",
    actor: str | None = None,
    dry_run: bool = False,
    vocabulary: TagVocabulary | None = None,
) -> PullReport:
    """Read the reviewer's tags and label edits from FiftyOne back into the folder.

    Only units edited since the push change (see :mod:`curate.review.sync`); every change is
    logged to ``changes.jsonl`` with actor ``review.fiftyone:<actor>`` (default: the login
    name). Tags outside the vocabulary, contradicting tags and values the folder refuses are
    in ``report.problems``; conflicts in ``report.conflicts``.
    """
    ds = Dataset.open(root)
    vocab = vocabulary or TagVocabulary.load()
    fo = import_fiftyone()
    fo_name = dataset_name(ds, name)
    snapshot = Snapshot.load(snapshot_path(ds.root, BACKEND, fo_name))
    if snapshot is None:
        raise ReviewError(f"{ds.root} was never pushed to FiftyOne dataset {fo_name!r} (no snapshot in "
                          f"{ds.root / '.review'}); run `{suggest('curate review fiftyone {dir}', dir=root)}` first")
    if fo_name not in fo.list_datasets():
        raise ReviewError(f"FiftyOne dataset {fo_name!r} does not exist in the database FiftyOne uses "
                          f"({fo.config.database_uri or 'its own'}); was it deleted, or is another database running?")
    dataset = fo.load_dataset(fo_name)
    declare_fields(fo, dataset, [])
    observations = observe(fo, dataset, ds, snapshot, vocab)
    who = f"review.fiftyone:{actor or _login()}"
    report = apply_pull(ds, snapshot, observations, backend=BACKEND, target=repr(fo_name), actor=who,
                        on_conflict=on_conflict, dry_run=dry_run)
    if report.applied and not dry_run:
        refresh_samples(fo, dataset, ds, snapshot, vocab, report.applied)
    return report


#: The FiftyOne fields that show each sync unit (what a refresh after a pull rewrites).
UNIT_FIELDS: dict[str, tuple[str, ...]] = {
    "class": ("ground_truth",), "background": ("background", "background_source"),
    "curation": ("status", "reject_reason"), "mask": ("mask", "mask_status", *MASK_INFO_FIELDS),
    "mask_status": ("mask_status", *MASK_INFO_FIELDS),
    "group": ("group",), "license": ("license",), "attribution": ("attribution",), "tags": (),
}


def refresh_samples(fo: Any, dataset: Any, ds: Dataset, snapshot: Snapshot, vocab: TagVocabulary,
                    applied: Sequence[Any]) -> None:
    """After a pull, show the folder's new values in the fields of the units that changed (so
    the App and the saved views agree with the folder); the reviewer's tags stay as they are."""
    units_by_sample: dict[str, set[str]] = {}
    for change in applied:
        units_by_sample.setdefault(change.sample_id, set()).add(change.unit)
        if change.unit == "mask":
            units_by_sample[change.sample_id].add("mask_status")
    runs: list[RunPredictions] = []
    per_field: dict[str, dict[str, Any]] = {}
    fo_tags = dict(zip(*dataset.select_by("sample_id", list(units_by_sample)).values(["sample_id", "tags"])))
    for sid, units in units_by_sample.items():
        if sid not in ds:
            continue
        row = ds.row(sid)
        values = _sample_values(fo, ds, row, vocab, runs)
        mask = values["mask"].mask_path if values["mask"] is not None else None
        view = view_units(row, fo_tags.get(sid) or [], vocab, mask)
        for unit in units:
            for name in UNIT_FIELDS[unit]:
                per_field.setdefault(name, {})[sid] = values[name]
            snapshot.samples[sid].setdefault("view", {})[unit] = view[unit]
    for name, mapping in per_field.items():
        dataset.set_values(name, mapping, key_field="sample_id", progress=False)
    snapshot.save(ds)


def _login() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001
        return "unknown"


# ---------------------------------------------------------------------------------------------
# the App
# ---------------------------------------------------------------------------------------------


def app_url(address: str, port: int, fo_name: str) -> str:
    """The App's URL of a dataset."""
    from urllib.parse import quote

    return f"http://{address}:{port}/datasets/{quote(fo_name, safe='')}"


def tunnel_hint(port: int) -> str:
    """The ssh line that forwards the App's port from this machine to a laptop."""
    return f"ssh -N -L {port}:127.0.0.1:{port} {_login()}@{socket.getfqdn()}"


def launch_app(fo_name: str, *, port: int = DEFAULT_PORT, address: str = "127.0.0.1") -> Any:
    """Serve the App for a pushed dataset on ``address:port`` (remote mode: no browser) and
    return the FiftyOne session; ``session.wait()`` blocks until interrupted."""
    from curate.review.database import port_is_free

    fo = import_fiftyone()
    if fo_name not in fo.list_datasets():
        raise ReviewError(f"FiftyOne dataset {fo_name!r} does not exist; push it first")
    if not port_is_free(port, address):
        raise ReviewError(f"port {port} on {address} is taken (another App?); choose one with --port")
    dataset = fo.load_dataset(fo_name)
    return fo.launch_app(dataset, port=port, address=address, remote=True)
