"""Import an existing FiftyOne dataset (or a saved view of it) into a dataset folder.

Each FiftyOne sample of the view becomes one sample (``source="fiftyone"``, ``source_id`` = the
FiftyOne sample id):

- **class**: the ``label`` of a ``Classification`` field (``label_field``; by default the
  dataset's only one), resolved as ``collect folder`` resolves class folders
  (:func:`curate.collect.folder.resolve_class_folder`: label-space names and lemmas, WordNet ids,
  indices). Every distinct label is resolved before anything is written; labels outside the
  label space are one error naming them all, or, with ``skip_unknown``, skipped and counted.
  ``label_space="fiftyone"`` makes the label space of a new folder from the FiftyOne dataset's
  classes for that field (its ``classes``, else ``default_classes``, else its sorted labels).
- **object mask** (with ``mask_field``): a ``Segmentation`` (``mask`` in the database or
  ``mask_path`` on disk) gives the pixels whose value the dataset's mask targets name as the
  chosen label (``mask_label``, by default the sample's class label), or every non-zero pixel
  when the field has no mask targets; ``Detections`` with instance masks give the union of the
  instances with that label, drawn at the stored image's size by FiftyOne's own
  ``Detection.to_segmentation``. ``mask_status`` is ``mask_source`` (``human`` unless told;
  docs/design.md#masks). A sample whose mask has no pixel of the label gets no mask (counted in
  ``report.info["no_mask"]``); a mask of another size than the image, or one that cannot be read,
  fails the sample (counted and reported, never added without it).
- **tags** become the row's free ``tags``; the fields named in ``fields`` go to
  ``extra.fiftyone_fields`` (labels as their dict, ids as text); provenance goes to
  ``extra.fiftyone_dataset``, ``fiftyone_view``, ``fiftyone_sample_id``, ``fiftyone_filepath``
  and ``fiftyone_label`` (the label as FiftyOne wrote it).
- **licence / attribution**: from the fields ``license_field`` / ``attribution_field`` when the
  sample has a value, else ``license`` / ``attribution`` (as ``collect folder``).

The media file is read, verified, hashed and copied into ``media/`` like every collector's,
through the resumable engine (:mod:`curate.collect.engine`): the journal key of a sample is its id, its
``last_modified_at`` and the size and mtime of its media file, so a re-run (after a Ctrl-C or a
SIGKILL) completes the job and a sample edited in FiftyOne, or whose missing file was restored, is
tried again. A sample whose media file is missing or remote is skipped and counted
(``report.info["skipped"]``). A dynamic group view (``group_by``) is imported group by group,
every sample of each group. With ``link`` the copies are then replaced by hard links to the
FiftyOne files where the stored bytes are the file's (:func:`link_media`): no second copy, but an
edit of such a file in place changes the folder, which ``curate check --deep`` reports.

FiftyOne is imported only inside :func:`collect_fiftyone`, after
:func:`curate.review.fiftyone.import_fiftyone` made sure it has a database.
"""
from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from curate.collect.engine import Candidate, CandidateError, CollectReport, Engine, ProgressFn, Skip, StreamItem
from curate.collect.folder import existing_dataset, resolve_class_folder
from curate.collect.journal import Journal
from curate.labels import LabelSpace, UnknownClassError, imagenet1k, unknown_labels_message
from curate.licenses import stored_license
from curate.store import DEFAULT_BACKGROUNDS, Dataset, PreparedImage
from curate.store.atomic import TMP_DIR
from curate.store.records import to_plain

log = logging.getLogger(__name__)

SOURCE = "fiftyone"
#: ``label_space`` value: the label space of a new folder is the FiftyOne dataset's classes.
FROM_DATASET = "fiftyone"
#: The quota group of samples that are skipped before reading (no label, unknown label, missing media).
SKIPPED_GROUP = "skipped"


class FiftyOneImportError(ValueError):
    """The FiftyOne dataset, view or a named field cannot be imported as asked (one line)."""


@dataclass
class FiftyOneItem:
    """One FiftyOne sample as read from the view (the label objects are FiftyOne's)."""

    sample_id: str
    filepath: str
    label: str | None
    tags: list[str]
    modified: str
    mask_label: Any = None
    fields: dict[str, Any] | None = None
    license: str | None = None
    attribution: str | None = None


def check_mask_source(value: str) -> str:
    """``value`` when it is a mask source a dataset row may carry (human, exact or model:<id>);
    else :class:`FiftyOneImportError`."""
    if value in ("human", "exact") or (value.startswith("model:") and len(value) > len("model:")):
        return value
    raise FiftyOneImportError(f"mask source {value!r} is not human, exact or model:<model id> "
                              "(docs/design.md#masks)")


def _schema_error(kind: str, name: str, schema: Iterable[str], dataset: str) -> FiftyOneImportError:
    known = sorted(schema)
    return FiftyOneImportError(f"FiftyOne dataset {dataset!r} has no {kind} {name!r}; "
                               f"its fields: {', '.join(known) if known else 'none'}")


def open_view(fo: Any, name: str, view: str | None = None) -> tuple[Any, Any]:
    """(dataset, view) of FiftyOne dataset ``name`` and its saved view ``view`` (the whole
    dataset when None); a missing dataset or view is a :class:`FiftyOneImportError` naming what exists."""
    if name not in fo.list_datasets():
        known = fo.list_datasets()
        raise FiftyOneImportError(f"there is no FiftyOne dataset {name!r} in the database "
                                  f"({os.environ.get('FIFTYONE_DATABASE_URI') or 'FiftyOne default'}); "
                                  f"it has: {', '.join(known[:20]) if known else 'no datasets'}")
    dataset = fo.load_dataset(name)
    if dataset.media_type not in ("image", None):  # None: an empty dataset
        raise FiftyOneImportError(f"FiftyOne dataset {name!r} holds {dataset.media_type} samples; "
                                  "only image datasets can be imported")
    if view is None:
        return dataset, dataset.view()
    saved = dataset.list_saved_views()
    if view not in saved:
        raise FiftyOneImportError(f"FiftyOne dataset {name!r} has no saved view {view!r}; "
                                  f"its saved views: {', '.join(saved) if saved else 'none'}")
    return dataset, dataset.load_saved_view(view)


def flat_views(view: Any) -> list[Any]:
    """``view`` as a list of plain views: each group of a dynamic group view (``group_by``), in order."""
    if getattr(view, "_is_dynamic_groups", False):
        return list(view.iter_dynamic_groups())
    return [view]


def _field_type(fo: Any, dataset: Any, path: str) -> Any:
    """The FiftyOne document type of label field ``path`` (None when it is not a label field)."""
    field = dataset.get_field(path)
    return getattr(field, "document_type", None)


def classification_field(fo: Any, dataset: Any, name: str | None) -> str:
    """The ``Classification`` field to take the class from: ``name`` (checked), else the only one."""
    schema = dataset.get_field_schema()
    classes = sorted(f for f in schema if _field_type(fo, dataset, f) is fo.Classification)
    if name is None:
        if len(classes) != 1:
            raise FiftyOneImportError(
                f"FiftyOne dataset {dataset.name!r} has {len(classes)} Classification fields"
                f"{' (' + ', '.join(classes) + ')' if classes else ''}; name the one that holds the class "
                "with --label-field")
        return classes[0]
    if name not in schema:
        raise _schema_error("field", name, schema, dataset.name)
    if name not in classes:
        raise FiftyOneImportError(f"field {name!r} of FiftyOne dataset {dataset.name!r} is not a Classification; "
                                  f"its Classification fields: {', '.join(classes) if classes else 'none'}")
    return name


def mask_kind(fo: Any, dataset: Any, name: str) -> str:
    """``segmentation`` or ``detections`` for mask field ``name`` (else a :class:`FiftyOneImportError`)."""
    schema = dataset.get_field_schema()
    if name not in schema:
        raise _schema_error("mask field", name, schema, dataset.name)
    kind = _field_type(fo, dataset, name)
    if kind is fo.Segmentation:
        return "segmentation"
    if kind in (fo.Detections, fo.Detection):
        return "detections"
    raise FiftyOneImportError(f"field {name!r} of FiftyOne dataset {dataset.name!r} holds neither Segmentation "
                              "nor Detections (instance masks); give another --mask-field")


def dataset_label_space(dataset: Any, field: str) -> LabelSpace:
    """The label space of the FiftyOne dataset's classes for ``field`` (see the module docstring)."""
    names = list(dataset.classes.get(field) or dataset.default_classes or dataset.distinct(f"{field}.label"))
    if not names:
        raise FiftyOneImportError(f"FiftyOne dataset {dataset.name!r} has no classes for {field!r}")
    return LabelSpace.from_names(dataset.name, [str(n) for n in names])


def _plain(value: Any) -> Any:
    """A FiftyOne field value as JSON: labels and documents as their dict, ids as text."""
    if hasattr(value, "to_dict") and callable(value.to_dict):
        value = value.to_dict()
    if isinstance(value, dict):
        return {str(k).lstrip("_") if str(k) in ("_id", "_cls") else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return {"array_shape": list(value.shape)}
    value = to_plain(value)
    if value is None or isinstance(value, (str, int, float, bool, list, dict)):
        return value
    return str(value)  # ObjectId and other scalars


def read_items(views: Sequence[Any], label_field: str, mask_field: str | None, fields: Sequence[str],
               license_field: str | None, attribution_field: str | None) -> list[FiftyOneItem]:
    """Every sample of ``views`` (in order, each once) with what the import needs."""
    items: list[FiftyOneItem] = []
    seen: set[str] = set()
    for view in views:
        for sample in view.iter_samples():
            if sample.id in seen:
                continue
            seen.add(sample.id)
            label = sample[label_field]
            values = {name: _plain(sample[name]) for name in fields}
            lic = sample[license_field] if license_field else None
            att = sample[attribution_field] if attribution_field else None
            modified = getattr(sample, "last_modified_at", None)
            items.append(FiftyOneItem(
                sample_id=sample.id, filepath=str(sample.filepath), label=getattr(label, "label", None),
                tags=[str(t) for t in sample.tags or []], modified=modified.isoformat() if modified else "",
                mask_label=sample[mask_field] if mask_field else None, fields=values,
                license=str(lic) if lic not in (None, "") else None,
                attribution=str(att) if att not in (None, "") else None))
    return items


def object_mask(fo: Any, label: Any, kind: str, wanted: str, targets: dict[Any, str] | None,
                width: int, height: int) -> np.ndarray | None:
    """The 0/1 object mask of label ``wanted`` in ``label`` (a Segmentation or Detections) at
    ``width`` x ``height`` (None when no pixel is the label's); raises :class:`CandidateError`
    for a mask that cannot be read or has another size."""
    if label is None:
        return None
    if kind == "segmentation":
        try:
            values = label.get_mask()
        except Exception as exc:  # noqa: BLE001 - a file FiftyOne cannot read, whatever the reason
            raise CandidateError("mask_unreadable", f"{label.mask_path}: {exc}") from None
        if values is None:
            return None
        values = np.asarray(values)
        if values.ndim == 3:
            values = values[..., 0]
        if values.shape != (height, width):
            raise CandidateError("wrong_size", f"the mask is {values.shape[1]}x{values.shape[0]} but the image is "
                                 f"{width}x{height}")
        if targets:
            chosen = [int(v) for v, name in targets.items() if str(name) == wanted and str(v).isdigit()]
            mask = np.isin(values, chosen)
        else:
            mask = values != 0
    else:
        detections = label.detections if hasattr(label, "detections") else [label]
        mask = np.zeros((height, width), bool)
        for det in detections:
            if det.label != wanted or not det.has_mask:
                continue
            try:
                drawn = det.to_segmentation(frame_size=(width, height), target=1).mask
            except Exception as exc:  # noqa: BLE001 - as above
                raise CandidateError("mask_unreadable", f"instance {det.id}: {exc}") from None
            mask |= np.asarray(drawn) != 0
    return mask.astype(np.uint8) if mask.any() else None


def _stat_key(path: str) -> str:
    try:
        stat = Path(path).stat()
    except OSError:
        return "missing"
    return f"{stat.st_size}|{stat.st_mtime_ns}"


def link_media(ds: Dataset, sources: Mapping[str, str]) -> tuple[int, int]:
    """Make the media file of each FiftyOne sample in ``sources`` (FiftyOne id -> its file) a hard
    link to that file where the stored bytes are the file's (a JPEG or PNG stored verbatim);
    returns (linked, copied). An image the store converted, another file system or a file system
    without hard links leaves the copy. The swap is atomic (a link made under ``.tmp/``, then
    ``os.replace``): the file under the stored name always has the stored bytes."""
    linked = copied = 0
    for row in ds.rows():
        source = sources.get(str(row["source_id"])) if row["source"] == SOURCE else None
        if source is None:
            continue
        media, src = ds.root / row["filepath"], Path(source)
        try:
            if os.path.samefile(src, media):
                linked += 1
                continue
            if src.stat().st_size != media.stat().st_size or \
                    hashlib.sha256(src.read_bytes()).hexdigest() != row["sha256"]:
                copied += 1
                continue
            tmp = ds.root / TMP_DIR / f"{media.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
            tmp.parent.mkdir(exist_ok=True)
            os.link(src, tmp)
            try:
                os.replace(tmp, media)
            finally:
                tmp.unlink(missing_ok=True)
            linked += 1
        except OSError as exc:  # another device, no hard links, a file gone meanwhile: the copy stays
            log.debug("%s: keeping the copy of %s (%s)", media, src, exc)
            copied += 1
    return linked, copied


def collect_fiftyone(
    name: str,
    dataset_root: str | Path,
    *,
    view: str | None = None,
    label_field: str | None = None,
    mask_field: str | None = None,
    mask_label: str | None = None,
    mask_source: str = "human",
    fields: Sequence[str] = (),
    license: str | None = None,
    attribution: str | None = None,
    license_field: str | None = None,
    attribution_field: str | None = None,
    status: str = "candidate",
    skip_unknown: bool = False,
    link: bool = False,
    label_space: LabelSpace | str | None = None,
    backgrounds: Sequence[str] | None = None,
    dataset_name: str | None = None,
    concurrency: int = 4,
    batch_size: int = 256,
    progress: ProgressFn | None = None,
) -> CollectReport:
    """Import FiftyOne dataset ``name`` (or its saved ``view``) into ``dataset_root`` (module docstring).

    Creates the folder when missing (``label_space`` default ImageNet-1K, or a :class:`LabelSpace`,
    or ``"fiftyone"``; ``backgrounds`` default the CounterAnimal vocabulary; ``dataset_name``
    default the folder's name); an existing folder keeps its own. Every problem of the request (a
    missing dataset, view or field, labels outside the label space) is raised as a
    :class:`FiftyOneImportError` before the folder is created or touched. Returns the run's
    :class:`CollectReport`; ``report.info`` has ``samples`` (read from the view), ``skipped``
    ((FiftyOne id, reason) pairs) and ``no_mask`` (samples whose mask had no pixel of the label);
    with ``link``, ``linked`` and ``copied`` (:func:`link_media`, run on every sample of the view
    in the folder, so a resumed run links what a killed one copied).
    """
    from curate.review.fiftyone import import_fiftyone as load_fiftyone

    mask_source = check_mask_source(mask_source)
    fo = load_fiftyone()
    fo_dataset, fo_view = open_view(fo, name, view)
    label_field = classification_field(fo, fo_dataset, label_field)
    kind = mask_kind(fo, fo_dataset, mask_field) if mask_field else None
    schema = fo_dataset.get_field_schema()
    for field_name in [*fields, *(f for f in (license_field, attribution_field) if f)]:
        if field_name not in schema:
            raise _schema_error("field", field_name, schema, name)
    root = Path(dataset_root)
    if isinstance(label_space, str) and label_space != FROM_DATASET:
        raise FiftyOneImportError(f"label_space {label_space!r} is neither a LabelSpace nor {FROM_DATASET!r}")
    wanted_space = dataset_label_space(fo_dataset, label_field) if isinstance(label_space, str) else label_space
    existing = existing_dataset(root, wanted_space, backgrounds)
    space = existing.label_space if existing is not None else (wanted_space or imagenet1k())
    vocabulary = existing.backgrounds if existing is not None else list(backgrounds or DEFAULT_BACKGROUNDS)
    items = read_items(flat_views(fo_view), label_field, mask_field, fields, license_field, attribution_field)
    classes: dict[str, int] = {}
    unknown: dict[str, str] = {}
    for label in sorted({i.label for i in items if i.label is not None}):
        try:
            classes[label] = resolve_class_folder(label, space)
        except UnknownClassError as exc:
            unknown[label] = str(exc)
    if unknown and not skip_unknown:
        raise FiftyOneImportError(unknown_labels_message(unknown, label_field, space.name, "samples",
                                                         "--label-space fiftyone"))
    targets = None
    if kind == "segmentation":
        targets = fo_dataset.mask_targets.get(mask_field) or fo_dataset.default_mask_targets or None
    ds = existing if existing is not None else Dataset.create(
        root, name=dataset_name or root.absolute().name, label_space=space, backgrounds=vocabulary,
        recipe=f"fiftyone:{name}")
    identity = {"dataset": name, "view": view, "label_field": label_field, "mask_field": mask_field,
                "mask_label": mask_label, "mask_source": mask_source, "fields": list(fields), "license": license,
                "attribution": attribution, "license_field": license_field, "attribution_field": attribution_field,
                "status": status, "skip_unknown": skip_unknown}
    skipped: list[tuple[str, str]] = []
    no_mask: list[str] = []
    streams: dict[str, list[StreamItem]] = {}
    for item in items:
        key = f"{item.sample_id}|{item.modified}|{_stat_key(item.filepath)}"
        reason = None
        if item.label is None:
            reason = f"no {label_field} label"
        elif item.label in unknown:
            reason = f"label {item.label!r} is not in the label space"
        elif "://" in item.filepath:
            reason = f"remote media {item.filepath} (only local files are imported)"
        elif not Path(item.filepath).is_file():
            reason = f"missing media file {item.filepath}"
        if reason is not None:
            skipped.append((item.sample_id, reason))
            streams.setdefault(SKIPPED_GROUP, []).append(Skip(key=key, group=SKIPPED_GROUP, reason=reason))
            continue
        assert item.label is not None
        index = classes[item.label]
        code = item.license or license
        extra: dict[str, Any] = {"fiftyone_dataset": name, "fiftyone_view": view, "fiftyone_sample_id": item.sample_id,
                                 "fiftyone_filepath": item.filepath, "fiftyone_label": item.label}
        if fields:
            extra["fiftyone_fields"] = item.fields
        sample = {
            "class_index": index, "source": SOURCE, "source_id": item.sample_id, "source_url": None,
            "license": stored_license(code), "attribution": item.attribution or attribution,
            "status": status, "tags": item.tags, "extra": extra,
        }
        mask_fn = None
        if kind is not None:
            sample["mask_status"] = mask_source

            def mask_fn(prepared: PreparedImage, item: FiftyOneItem = item, sample: dict[str, Any] = sample,
                        kind: str = kind) -> np.ndarray | None:
                mask = object_mask(fo, item.mask_label, kind, mask_label or str(item.label), targets,
                                   prepared.width, prepared.height)
                if mask is None:
                    sample["mask_status"] = None
                    no_mask.append(item.sample_id)
                return mask
        group = str(index)
        streams.setdefault(group, []).append(Candidate(key=key, group=group, sample=sample, path=item.filepath,
                                                       mask=mask_fn))
    total = len(items)
    with Journal(ds.root, SOURCE, identity) as journal:
        engine_ref: list[Engine] = []

        def tick(label: str, done: int, target: int | None) -> None:
            if progress is not None and engine_ref:
                walked = sum(sum(g.outcomes.values()) for g in engine_ref[0].report.groups.values())
                progress("importing", walked, total)

        with Engine(ds, journal, actor="collect.fiftyone", concurrency=concurrency, batch_size=batch_size,
                    progress=tick) as engine:
            engine_ref.append(engine)
            for group in sorted(streams, key=lambda g: (g == SKIPPED_GROUP, int(g) if g.isdigit() else 0)):
                label = "(not imported)" if group == SKIPPED_GROUP else f"{group} {ds.label_space.name_of(int(group))}"
                engine.fill(group, label, streams[group], None)
            report = engine.finish()
    report.info.update(samples=total, skipped=skipped, no_mask=no_mask)
    if link:
        linked, copied = link_media(ds, {i.sample_id: i.filepath for i in items})
        report.info.update(linked=linked, copied=copied)
    entry = dict(ds.provenance.get("collect.fiftyone") or {})
    jobs = dict(entry.get("jobs") or {})
    jobs[journal.job_id] = {**identity, "samples": total, "journal": str(journal.path.relative_to(ds.root))}
    entry["jobs"] = jobs
    ds.record_provenance("collect.fiftyone", entry)
    return report
