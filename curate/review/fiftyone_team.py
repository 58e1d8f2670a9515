"""Several annotators in FiftyOne: a field per annotator, a saved view per queue, a view of disputes.

Issue 44 (docs/recipes.md#several-annotators; the table: docs/design.md#dataset-folder).
What FiftyOne (open source, 1.x) can do here, and what not:

- It **can** hold every annotator's answer side by side: ``push_fiftyone_team`` adds one
  ``Classifications`` field per annotator (``annotator_<name>``; one label, or two where the photo
  shows two, the first the primary; an empty list = skipped), saves a view per queue
  (``queue: <annotator>``, the photos :func:`curate.review.overlap.assign_overlap` gave them,
  gold mixed in) and a view ``disputed`` of the photos the team's answers leave disputed
  (:func:`curate.review.labelstudio_team.disputed_photos`, i.e. curate.agreement's rule), for an
  adjudicator to open in the App. Each sample's ``last_modified_at`` (FiftyOne 1.x) is the
  answer's time.
- It **cannot** tell who made an edit (the App has no user accounts; anyone who opens it may
  edit any field), so an answer is attributed to the field's annotator, not to a login; it has
  no per-user queues (a saved view is a filter, not an assignment); and the open-source App does
  not edit classification labels itself: answers reach the fields through the SDK or an
  annotation backend run (``dataset.annotate(..., label_field="annotator_<name>")``, e.g. CVAT or
  Label Studio). Per-annotator masks are not carried here: use the Label Studio team
  (:mod:`curate.review.labelstudio_team`), which records who drew what.

``pull_fiftyone_team`` stores the answers in the annotation table (backend ``fiftyone``, id
``fiftyone:<dataset>:<annotator>:<sample>``, source ``fiftyone-team:<dataset>``) through
:func:`curate.store.annotations.upsert_annotations`: idempotent; a changed label makes a new
version; a cleared field (None) is marked deleted. Labels outside the vocabulary, or more than
two, are reported and left out (the previous version stays current), as in the Label Studio pull.
The folder's ``background`` is not written here (curate.agreement derives it).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curate.review.fiftyone import dataset_name, import_fiftyone
from curate.review.labelstudio_team import disputed_photos
from curate.review.overlap import OverlapPlan, assign_overlap, parse_annotators
from curate.review.sync import ReviewError
from curate.review.team_report import TeamPullReport, judge
from curate.shell import suggest
from curate.store import Dataset
from curate.store.annotation_schema import MAX_BACKGROUNDS
from curate.store.annotations import Annotation, AnnotationUpsert, current_annotations, gold_answers, upsert_annotations

BACKEND = "fiftyone"
INFO_KEY = "curate_team"
DISPUTED_VIEW = "disputed"


def annotator_field(name: str) -> str:
    """``annotator_<name>`` with non-identifier characters as ``_`` and 6 hex of the name's sha256
    (two names that differ only in punctuation get two fields)."""
    return f"annotator_{re.sub(r'[^0-9A-Za-z]+', '_', name).strip('_')[:40]}_{hashlib.sha256(name.encode()).hexdigest()[:6]}"


@dataclass
class FiftyOneTeamResult:
    """What a FiftyOne team push set up."""

    name: str
    fields: dict[str, str]  # annotator -> field
    views: list[str]
    loads: dict[str, int]
    gold: dict[str, int]
    disputed: int


def _load(fo: Any, ds: Dataset, name: str | None) -> Any:
    fo_name = dataset_name(ds, name)
    if not fo.dataset_exists(fo_name):
        raise ReviewError(f"no FiftyOne dataset {fo_name!r}: push the folder first "
                          f"({suggest('curate review fiftyone {dir}', dir=ds.root)})")
    return fo.load_dataset(fo_name)


def save_disputed_view(root: str | Path, *, name: str | None = None, rule: str = "dawid-skene") -> int:
    """Save (or replace) the view ``disputed`` of the photos the team's answers leave disputed; returns how many."""
    fo = import_fiftyone()
    ds = Dataset.open(root)
    dataset = _load(fo, ds, name)
    disputed = disputed_photos(ds.root, rule)
    dataset.save_view(DISPUTED_VIEW, dataset.select_by("sample_id", disputed), overwrite=True)
    return len(disputed)


def push_fiftyone_team(root: str | Path, *, annotators: str | Sequence[str], overlap: int, seed: int = 0,
                       gold_share: float = 0.0, name: str | None = None, rule: str = "dawid-skene") -> FiftyOneTeamResult:
    """Add a field per annotator and a saved view per queue to the pushed dataset (module docstring)."""
    fo = import_fiftyone()
    ds = Dataset.open(root)
    names = parse_annotators(annotators)
    dataset = _load(fo, ds, name)
    scope = [str(s) for s in dataset.values("sample_id")]
    plan = assign_overlap(scope, names, overlap, seed=seed, gold=sorted(gold_answers(current_annotations(ds))),
                          gold_share=gold_share)
    fields = {a: annotator_field(a) for a in names}
    views = []
    for annotator, path in fields.items():
        if not dataset.has_sample_field(path):
            dataset.add_sample_field(path, fo.EmbeddedDocumentField, embedded_doc_type=fo.Classifications)
        view = f"queue: {annotator}"
        dataset.save_view(view, dataset.select_by("sample_id", list(plan.queues[annotator])), overwrite=True)
        views.append(view)
    dataset.info[INFO_KEY] = {"fields": {path: a for a, path in fields.items()}, "plan": plan.to_json()}
    dataset.save()
    disputed = save_disputed_view(ds.root, name=name, rule=rule) if current_annotations(ds) else 0
    return FiftyOneTeamResult(dataset.name, fields, views + ([DISPUTED_VIEW] if disputed else []),
                              {a: plan.load(a) for a in names}, {a: len(g) for a, g in plan.gold.items()}, disputed)


def has_team(root: str | Path, name: str | None = None) -> bool:
    """Whether the FiftyOne dataset of the folder carries a team push."""
    fo = import_fiftyone()
    ds = Dataset.open(root)
    fo_name = dataset_name(ds, name)
    return bool(fo.dataset_exists(fo_name) and INFO_KEY in (fo.load_dataset(fo_name).info or {}))


def pull_fiftyone_team(root: str | Path, *, name: str | None = None, dry_run: bool = False) -> TeamPullReport:
    """Store every annotator field's answers in the annotation table (module docstring)."""
    fo = import_fiftyone()
    ds = Dataset.open(root)
    dataset = _load(fo, ds, name)
    info = (dataset.info or {}).get(INFO_KEY)
    if not info:
        raise ReviewError(f"FiftyOne dataset {dataset.name!r} has no team push: push with --annotators first")
    plan = OverlapPlan.from_json(info["plan"])
    gold = {a: set(g) for a, g in plan.gold.items()}
    ids = [str(s) for s in dataset.values("sample_id")]
    times = [t.isoformat() + "Z" if t is not None else "" for t in dataset.values("last_modified_at")]
    problems: list[str] = []
    rows: list[Annotation] = []
    present: set[str] = set()
    for path, annotator in info["fields"].items():
        for sid, when, value in zip(ids, times, dataset.values(path)):
            if value is None:
                continue  # not answered (a cleared field: the stored answer is marked deleted)
            aid = f"{BACKEND}:{dataset.name}:{annotator}:{sid}"
            present.add(aid)
            labels = list(dict.fromkeys(str(c.label) for c in (value.classifications or []) if c.label))
            outside = [b for b in labels if b not in ds.backgrounds]
            if outside or len(labels) > MAX_BACKGROUNDS:
                why = (f"background(s) {', '.join(map(repr, outside))} not in the dataset's vocabulary "
                       f"({', '.join(ds.backgrounds)})" if outside else f"{len(labels)} backgrounds (at most {MAX_BACKGROUNDS})")
                problems.append(f"{annotator} on {sid} (field {path}): {why}; left out: fix the field and pull again")
                continue
            rows.append(Annotation(annotation_id=aid, sample_id=sid, annotator=annotator, backend=BACKEND,
                                   backgrounds=tuple(labels), created_at=when, updated_at=when,
                                   is_gold=sid in gold.get(annotator, set())))
    report = TeamPullReport(AnnotationUpsert())
    if not dry_run:
        report.upsert = upsert_annotations(ds, rows, source=f"fiftyone-team:{dataset.name}", actor="review.fiftyone",
                                           present_ids=present)
    judge(ds, plan, rows, report)
    report.problems = problems + report.problems
    return report
