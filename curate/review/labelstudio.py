"""The dataset folder as a Label Studio project: config, tasks with pre-labels, pull.

Why it is long (one job): the Label Studio side of the two-way review; the config, the tasks with
pre-labels and their pull share one mapping of choices and brushes, and the SDK calls sit behind it.

``push_labelstudio(DIR, url=..., token=...)`` creates (or reuses, by title) a project whose
labelling config is ``annotation/labelstudio.xml`` filled with the dataset's backgrounds and
the vocabulary of ``annotation/tags.yaml`` (:func:`labelstudio_config`): a brush for the animal
mask, a background choice, a curation choice (accept or one of the four reject reasons) and a
mask verdict. It imports one task per sample that needs review (the views marked ``review`` in
``annotation/views.yaml``, or the views named, or all samples) with the folder's current
values as a *prediction* (model version ``curate``): the background, a decided status, a
mask verdict and the mask as brush RLE (:mod:`curate.review.rle`).

Model mask proposals (``mask_status = model:<id>``, from ``curate propose-masks``; the view
"masks to verify") travel the same way: the proposal is the prediction's brush region, with
the model's confidence as the region's ``score`` and no verdict pre-selected. The prediction's
``score`` (a Data Manager column to sort by) is the lowest confidence among its model-made
parts (a proposal's score, a model background's score). A prediction, not a pre-filled
annotation, because Label Studio copies the project's predictions (``model_version``
``curate``) into the editor when the reviewer opens the task, where the brush is editable
(paint, erase) before submitting; an annotation made by curate would instead look like a
person's submitted work, and the pull could no longer tell a reviewer's ``mask:ok`` from
curate's own pre-fill. So a proposal stays unverified until a person submits a verdict.

Images reach the server in one of three ways (``media``):

- ``local-files`` (default): Label Studio's local-files serving. The server must run on this
  machine with ``LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED=true`` and
  ``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT`` an ancestor of the dataset folder; curate adds a
  local storage for the folder's ``media/`` to the project (never synced: tasks come from curate);
- ``url``: ``<media_url>/<filepath>``, e.g. from ``curate review serve-media DIR``;
- ``inline``: the image itself as a ``data:`` URL (small datasets, any server).

Suspicions of ``curate audit`` (``suspect:<check>`` tags, docs/design.md#audit) travel as a
pre-selected reason: on a sample nobody decided yet, the prediction pre-selects the curation
choice ``reject:<reason>`` of the check (:data:`curate.audit.base.CHECK_TO_REASON`, the table
``curate audit --measure`` reads the other way; with several suspicions, the first check in
audit order), and the task's ``suspects`` text says which checks flagged it. The reviewer
confirms by submitting the reason (it becomes the decision, like any chosen reason) or clears
it (another choice, or none): each suspicion whose reason the annotation does not hold is
dropped from the folder's ``tags``; status never changes by itself. Duplicates and outliers
have no reason of their own among the paper's four: they are only named in the text.

``pull_labelstudio`` exports the project's annotations and applies, per task, the latest
submitted (not cancelled) annotation through :func:`curate.review.sync.apply_pull`:
background choice -> background (source human; choosing the pre-label confirms it), curation
choice -> status / reject_reason, brush -> the mask (decoded to the image's size; an unchanged
brush changes nothing), mask verdict -> mask_status. An annotation with a mask verdict but no
brush region where the push showed one says the mask was removed (an annotation without a
verdict and without a brush says nothing about the mask). On a model proposal
(:func:`curate.review.sync.decide_mask_review`, shared with FiftyOne): ``mask:ok`` with the brush
as proposed -> kept, ``mask_status = ok``; a repainted brush -> the new mask, ``human``;
``mask:bad`` (or a brush erased to nothing, or deleted) -> the mask dropped (no mask,
``mask_status = bad``); ``mask:bad`` with a repainted brush, and ``mask:ok`` with the brush
deleted or erased, are reported, not applied. A brush erased to nothing on any other mask is
reported too (an empty mask is never stored). Actor in ``changes.jsonl``: ``review.labelstudio:<annotator>``.

The token comes from an environment variable and is handed to the SDK only; it never appears
in a log line, an error message or a file (the snapshot records the URL and project only).
"""
from __future__ import annotations

import base64
import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote
from xml.sax.saxutils import quoteattr

import numpy as np

from curate.review import rle
from curate.review.annotation import (
    LABELSTUDIO_TEMPLATE,
    annotation_file,
    guideline_text,
)
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
    mask_digest,
    now_iso,
    snapshot_path,
)
from curate.review.views import ViewSpec, expand_views, find_view, load_views
from curate.review.vocabulary import SUSPECT_PREFIX, TagVocabulary
from curate.runs import RUNS_DIR, EvaluationRun, RunError, list_runs
from curate.shell import suggest
from curate.store import Dataset
from curate.store.mask_sources import proposal_of

log = logging.getLogger(__name__)

BACKEND = "labelstudio"
DEFAULT_TOKEN_ENV = "LABEL_STUDIO_API_KEY"
MODEL_VERSION = "curate"
#: Control names of the labelling config (the template must keep them).
IMAGE, MASK, BACKGROUND, CURATION, MASK_REVIEW = "image", "mask", "background", "curation", "mask_review"
MASK_LABEL = "animal"
MEDIA_MODES: tuple[str, ...] = ("local-files", "url", "inline")


# ---------------------------------------------------------------------------------------------
# token and client
# ---------------------------------------------------------------------------------------------


def token_from_env(variable: str = DEFAULT_TOKEN_ENV) -> str:
    """The Label Studio token from environment variable ``variable`` (never from a file or argv)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable or ""):
        raise ReviewError(f"--token-env takes the *name* of an environment variable, e.g. {DEFAULT_TOKEN_ENV}")
    token = os.environ.get(variable, "").strip()
    if not token:
        raise ReviewError(f"environment variable {variable} is not set: export it with your Label Studio token "
                          "(Account & Settings -> Access Token) and run again")
    return token


def connect(url: str, token: str) -> Any:
    """A ``label_studio_sdk.LabelStudio`` client (imported here, not at module import)."""
    try:
        from label_studio_sdk import LabelStudio
    except ImportError as exc:
        raise ReviewError(f"label-studio-sdk is not importable ({exc}); pip install 'curate[labelstudio]'") from None
    return LabelStudio(base_url=url.rstrip("/"), api_key=token, timeout=120)


def _api_error(action: str, url: str, exc: Exception) -> ReviewError:
    """A ReviewError for a failed call, without anything that could carry the token."""
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    detail = f"HTTP {status}" if status else type(exc).__name__
    if isinstance(body, (dict, list, str)):
        text = json.dumps(body) if not isinstance(body, str) else body
        detail += f": {text[:300]}"
    elif not status:
        detail += f": {str(exc)[:200]}"
    hint = " (check the token and that the server runs with LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true for legacy tokens)" \
        if status in (401, 403) else ""
    return ReviewError(f"Label Studio at {url}: {action} failed ({detail}){hint}")


# ---------------------------------------------------------------------------------------------
# the labelling config
# ---------------------------------------------------------------------------------------------


def _choice(value: str, hint: str | None = None) -> str:
    attrs = f"value={quoteattr(value)}" + (f" hint={quoteattr(hint)}" if hint else "")
    return f"    <Choice {attrs}/>"


def labelstudio_config(ds: Dataset, vocabulary: TagVocabulary | None = None, template: str | Path | None = None) -> str:
    """The labelling config XML for a dataset: ``annotation/labelstudio.xml`` with its
    placeholders filled (backgrounds of dataset.yaml; accept and reject:<reason>; mask verdicts)."""
    vocab = vocabulary or TagVocabulary.load()
    text = Path(template).read_text(encoding="utf-8") if template else annotation_file(LABELSTUDIO_TEMPLATE).read_text(encoding="utf-8")
    text = re.sub(r"<!--.*?-->\s*", "", text, count=1, flags=re.DOTALL)  # the file's leading comment
    filled = {
        "background_choices": "\n".join(_choice(b) for b in ds.backgrounds),
        "curation_choices": "\n".join([_choice(vocab.accept, "keep the photo")] + [
            _choice(f"{vocab.reject_prefix}{reason}", why) for reason, why in vocab.reasons.items()]),
        "mask_choices": "\n".join(_choice(tag, f"mask_status = {status}") for tag, status in vocab.mask_tags.items()),
    }
    for key, value in filled.items():
        if "{{" + key + "}}" not in text:
            raise ReviewError(f"the Label Studio template lacks the placeholder {{{{{key}}}}}")
        text = text.replace("{{" + key + "}}", value)
    for name in (IMAGE, MASK, BACKGROUND, CURATION, MASK_REVIEW):
        if f'name="{name}"' not in text:
            raise ReviewError(f"the Label Studio template lacks the control name=\"{name}\" that pull reads")
    return text.strip() + "\n"


# ---------------------------------------------------------------------------------------------
# tasks
# ---------------------------------------------------------------------------------------------


def select_samples(ds: Dataset, views: Sequence[str] | None = None, all_samples: bool = False) -> list[dict[str, Any]]:
    """The rows to import: all, those of the named views, or of the views marked ``review``."""
    rows = ds.rows()
    if all_samples:
        return rows
    runs = [p.name for p in list_runs(ds.root)]
    specs = expand_views(load_views(), runs)
    chosen: list[ViewSpec] = [find_view(specs, v) for v in views] if views else [s for s in specs if s.review]
    correct = _run_correctness(ds, chosen)
    return [row for row in rows if any(spec.matches(row, correct) for spec in chosen)]


def _run_correctness(ds: Dataset, specs: Sequence[ViewSpec]) -> dict[str, dict[str, bool]]:
    """``{run: {sample_id: top-1 correct}}`` for the evaluation runs the views name (their typed
    records; a run that is missing or not an evaluation is left out, so its views match nothing)."""
    out: dict[str, dict[str, bool]] = {}
    for run in {str(s.run) for s in specs if s.run}:
        try:
            out[run] = EvaluationRun.load(ds.root / RUNS_DIR / run).correct1_by_sample()
        except RunError:
            continue
    return out


@dataclass
class MediaSource:
    """How task images are addressed (see the module docstring)."""

    mode: str = "local-files"
    document_root: Path | None = None
    media_url: str | None = None

    def check(self, ds: Dataset) -> None:
        if self.mode not in MEDIA_MODES:
            raise ReviewError(f"media must be one of {', '.join(MEDIA_MODES)}, not {self.mode!r}")
        if self.mode == "local-files":
            root = self.document_root or (Path(os.environ["LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT"])
                                          if os.environ.get("LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT") else None)
            if root is None:
                raise ReviewError("media 'local-files' needs the server's LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT: pass "
                                  "--document-root (or export that variable), or use --media url/inline")
            self.document_root = Path(root).absolute()
            if not ds.root.resolve().is_relative_to(self.document_root.resolve()):
                raise ReviewError(f"the dataset {ds.root} is not under the document root {self.document_root}; start "
                                  "Label Studio with LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT set to an ancestor of it")
        if self.mode == "url" and not self.media_url:
            raise ReviewError("media 'url' needs --media-url (where DIR's files are served, e.g. by "
                              "`curate review serve-media DIR`)")

    def url_of(self, ds: Dataset, row: Mapping[str, Any]) -> str:
        path = ds.image_path(row)
        if self.mode == "local-files":
            assert self.document_root is not None
            rel = path.resolve().relative_to(self.document_root.resolve()).as_posix()
            return f"/data/local-files/?d={quote(rel)}"
        if self.mode == "url":
            return f"{str(self.media_url).rstrip('/')}/{quote(str(row['filepath']))}"
        mime = "image/png" if path.suffix.lower() == ".png" else "image/jpeg"
        return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def _choices_result(name: str, value: str) -> dict[str, Any]:
    return {"from_name": name, "to_name": IMAGE, "type": "choices", "value": {"choices": [value]}}


def brush_result(mask: np.ndarray, score: float | None = None) -> dict[str, Any]:
    """The brush region of a mask, as Label Studio stores it (``score``: a model's confidence in it)."""
    height, width = mask.shape
    result = {"from_name": MASK, "to_name": IMAGE, "type": "brushlabels", "original_width": int(width),
              "original_height": int(height), "image_rotation": 0,
              "value": {"format": "rle", "rle": rle.encode_mask(mask), "brushlabels": [MASK_LABEL]}}
    if score is not None:
        result["score"] = float(score)
    return result


def suspicions(row: Mapping[str, Any], vocab: TagVocabulary) -> dict[str, str]:
    """``{check: "reject:<reason>"}`` of the row's ``suspect:<check>`` tags whose check has a reason
    among the vocabulary's (:data:`curate.audit.base.CHECK_TO_REASON`), in audit order."""
    from curate.audit.base import CHECK_TO_REASON, CHECKS

    tagged = {t[len(SUSPECT_PREFIX):] for t in (row.get("tags") or []) if str(t).startswith(SUSPECT_PREFIX)}
    return {check: f"{vocab.reject_prefix}{CHECK_TO_REASON[check]}" for check in CHECKS
            if check in tagged and CHECK_TO_REASON.get(check) in vocab.reasons}


def suspects_text(row: Mapping[str, Any], vocab: TagVocabulary) -> str:
    """The task's ``suspects`` line: which audit checks flagged the photo and what to do."""
    checks = [str(t)[len(SUSPECT_PREFIX):] for t in (row.get("tags") or []) if str(t).startswith(SUSPECT_PREFIX)]
    if not checks:
        return ""
    mapped = suspicions(row, vocab)
    text = f"curate audit suspects: {', '.join(checks)}."
    if mapped and vocab.curation_tag(row.get("status"), row.get("reject_reason")) is None:
        text += (f" {next(iter(mapped.values()))} is pre-selected: submit it to confirm, or clear it (choose another "
                 "or none) to drop the suspicion.")
    return text


def pushed_values(ds: Dataset, row: Mapping[str, Any], vocab: TagVocabulary) -> tuple[dict[str, Any], list[dict[str, Any]], float | None]:
    """(per-unit view values, prediction results, score) that a push shows for a row.

    ``view["suspicion"]``: the ``{check: reject:<reason>}`` suspicions shown as a pre-selected
    curation choice (only on undecided rows; see the module docstring). ``score``: the lowest
    confidence of the model-made parts (a model background, a mask proposal), or None."""
    results: list[dict[str, Any]] = []
    view: dict[str, Any] = {"background": None, "curation": None, "mask_status": None, "mask": None}
    if row.get("background") in ds.backgrounds:
        view["background"] = row["background"]
        results.append(_choices_result(BACKGROUND, row["background"]))
    curation = vocab.curation_tag(row.get("status"), row.get("reject_reason"))
    if curation and (curation == vocab.accept or curation[len(vocab.reject_prefix):] in vocab.reasons):
        view["curation"] = curation
        results.append(_choices_result(CURATION, curation))
    elif curation is None and (suspected := suspicions(row, vocab)):
        view["suspicion"] = suspected  # the folder has no decision: view["curation"] stays None
        results.append(_choices_result(CURATION, next(iter(suspected.values()))))
    verdict = next((tag for tag, status in vocab.mask_tags.items() if status == row.get("mask_status")), None)
    if verdict:
        view["mask_status"] = verdict
        results.append(_choices_result(MASK_REVIEW, verdict))
    proposal = proposal_of(row)
    if row.get("mask_path"):
        mask = (ds.load_mask(row) > 0).astype(np.uint8)
        view["mask"] = mask_digest(mask)
        results.append(brush_result(mask, proposal.score if proposal is not None else None))
    scores: list[float] = []
    if row.get("background_source") == "model" and row.get("background_score") is not None:
        scores.append(float(row["background_score"]))
    if proposal is not None and proposal.score is not None:
        scores.append(proposal.score)
    return view, results, (min(scores) if scores else None)


# ---------------------------------------------------------------------------------------------
# push
# ---------------------------------------------------------------------------------------------


@dataclass
class LabelStudioPushResult:
    """What a push did."""

    url: str
    project_id: int
    project_title: str
    created: bool
    imported: int
    refreshed: int
    kept: int
    snapshot: Path | None = None
    task_ids: dict[str, int] = field(default_factory=dict)
    proposals: int = 0  # pushed samples whose mask is an unverified model proposal


def project_title(ds: Dataset, project: str | None) -> str:
    return project or f"curate: {ds.name}"


def _find_project(client: Any, title: str) -> Any | None:
    for project in client.projects.list(page_size=100):
        if getattr(project, "title", None) == title:
            return project
    return None


def push_labelstudio(
    root: str | Path,
    *,
    url: str,
    token: str,
    project: str | None = None,
    views: Sequence[str] | None = None,
    all_samples: bool = False,
    media: MediaSource | None = None,
    vocabulary: TagVocabulary | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> LabelStudioPushResult:
    """Create or reuse the project and import the samples that need review (module docstring).

    Re-pushing reuses the project (same title): samples without a task get one; tasks nobody
    annotated yet get the folder's current values as their prediction; annotated tasks are left
    as they are (pull them). The push is recorded in ``DIR/.review/labelstudio-<title>.json``.
    """
    ds = Dataset.open(root)
    vocab = vocabulary or TagVocabulary.load()
    media = media or MediaSource()
    media.check(ds)
    title = project_title(ds, project)
    config = labelstudio_config(ds, vocab)
    client = connect(url, token)
    try:
        existing = _find_project(client, title)
    except Exception as exc:  # noqa: BLE001 - the SDK raises many kinds
        raise _api_error("listing projects", url, exc) from None
    created = existing is None
    try:
        if created:
            instructions = guideline_text()
            proj = client.projects.create(title=title, label_config=config, expert_instruction=instructions,
                                          show_instruction=True, model_version=MODEL_VERSION,
                                          show_collab_predictions=True,
                                          description=f"curate dataset {ds.name} ({ds.root})")
            project_id = int(proj.id)
            log.info("created Label Studio project %r (id %d)", title, project_id)
        else:
            project_id = int(existing.id)
            if (getattr(existing, "label_config", None) or "").strip() != config.strip():
                client.projects.update(id=project_id, label_config=config)
                log.info("updated the labelling config of project %r", title)
        if media.mode == "local-files":
            _ensure_local_storage(client, project_id, ds.root / "media")
    except ReviewError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _api_error(f"preparing project {title!r}", url, exc) from None

    snap_path = snapshot_path(ds.root, BACKEND, title)
    previous = Snapshot.load(snap_path)
    snapshot = previous if previous is not None and previous.target.get("project_id") == project_id else None
    if snapshot is None:
        snapshot = Snapshot(backend=BACKEND, target={}, path=snap_path)
    snapshot.target = {"url": url.rstrip("/"), "project_id": project_id, "project": title, "root": str(ds.root)}
    snapshot.pushed_at = now_iso()

    tasks = _export(client, url, project_id)
    by_sample = {str((t.get("data") or {}).get("sample_id")): t for t in tasks}
    rows = select_samples(ds, views, all_samples)
    new_tasks: list[dict[str, Any]] = []
    new_entries: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    refreshed = kept = 0
    for done, row in enumerate(rows, 1):
        sid = row["sample_id"]
        view, results, score = pushed_values(ds, row, vocab)
        entry = {"folder": folder_units(ds, row), "view": view}
        task = by_sample.get(sid)
        if task is None:
            prediction = {"model_version": MODEL_VERSION, "result": results}
            if score is not None:
                prediction["score"] = score
            new_tasks.append({"data": {"image": media.url_of(ds, row), "sample_id": sid,
                                       "class_name": row.get("class_name") or "",
                                       "suspects": suspects_text(row, vocab)},
                              "predictions": [prediction] if results else []})
            new_entries.append((sid, entry, row))
        elif _annotations(task):
            kept += 1
        else:
            old = (snapshot.samples.get(sid) or {}).get("folder")
            if old != entry["folder"]:
                _replace_prediction(client, url, task, results, score)
                refreshed += 1
            snapshot.samples[sid] = {**entry, "task": int(task["id"])}
        if progress is not None:
            progress(done, len(rows))
    if new_tasks:
        try:
            for start in range(0, len(new_tasks), 500):
                client.projects.import_tasks(id=project_id, request=new_tasks[start:start + 500])
        except Exception as exc:  # noqa: BLE001
            raise _api_error("importing tasks", url, exc) from None
        tasks = _export(client, url, project_id)
        by_sample = {str((t.get("data") or {}).get("sample_id")): t for t in tasks}
    for sid, entry, _row in new_entries:
        task = by_sample.get(sid)
        if task is None:
            raise ReviewError(f"Label Studio did not create a task for sample {sid}; see the server's log")
        snapshot.samples[sid] = {**entry, "task": int(task["id"])}
    snapshot.save(ds)
    result = LabelStudioPushResult(url.rstrip("/"), project_id, title, created, len(new_tasks), refreshed, kept, snap_path,
                                   {sid: int(e["task"]) for sid, e in snapshot.samples.items() if "task" in e},
                                   proposals=sum(proposal_of(r) is not None for r in rows))
    log.info("Label Studio project %r: %d task(s) imported, %d refreshed, %d annotated kept", title, len(new_tasks),
             refreshed, kept)
    return result


def _ensure_local_storage(client: Any, project_id: int, path: Path) -> None:
    path = path.absolute()
    try:
        storages = client.import_storage.local.list(project=project_id)
    except Exception:  # noqa: BLE001 - listing is best effort; create reports real problems
        storages = []
    if any(os.path.normpath(getattr(s, "path", "") or "") == os.path.normpath(str(path)) for s in storages):
        return
    client.import_storage.local.create(project=project_id, path=str(path), title="curate media",
                                       description="images of the curate dataset folder (served, never synced)",
                                       use_blob_urls=True)


def _export(client: Any, url: str, project_id: int) -> list[dict[str, Any]]:
    """Every task of the project with its annotations (the JSON export)."""
    try:
        data = b"".join(client.projects.exports.download_sync(project_id, export_type="JSON", download_all_tasks=True))
    except Exception as exc:  # noqa: BLE001
        raise _api_error("exporting tasks", url, exc) from None
    try:
        tasks = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise ReviewError(f"Label Studio at {url} returned an export that is not JSON ({exc})") from None
    if not isinstance(tasks, list):
        raise ReviewError(f"Label Studio at {url} returned an unexpected export ({type(tasks).__name__})")
    return tasks


def _annotations(task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The task's submitted annotations (not cancelled/skipped), oldest first."""
    found = [a for a in task.get("annotations") or [] if not a.get("was_cancelled")]
    return sorted(found, key=lambda a: (str(a.get("updated_at") or a.get("created_at") or ""), int(a.get("id") or 0)))


def _replace_prediction(client: Any, url: str, task: Mapping[str, Any], results: list[dict[str, Any]],
                        score: float | None) -> None:
    try:
        for old in client.predictions.list(task=int(task["id"])):
            if getattr(old, "model_version", None) == MODEL_VERSION and getattr(old, "id", None):
                client.predictions.delete(id=int(old.id))
        if results:
            kwargs: dict[str, Any] = {"task": int(task["id"]), "result": results, "model_version": MODEL_VERSION}
            if score is not None:
                kwargs["score"] = score
            client.predictions.create(**kwargs)
    except Exception as exc:  # noqa: BLE001
        raise _api_error(f"refreshing the prediction of task {task.get('id')}", url, exc) from None


# ---------------------------------------------------------------------------------------------
# pull
# ---------------------------------------------------------------------------------------------


def _annotator(annotation: Mapping[str, Any], users: Mapping[int, str] | None = None) -> str:
    who = annotation.get("completed_by")
    if isinstance(who, Mapping):
        who = who.get("email") or who.get("username") or who.get("id")
    elif isinstance(who, int) and users and who in users:
        who = users[who]
    return f"review.labelstudio:{who if who is not None else 'unknown'}"


def _users(client: Any) -> dict[int, str]:
    """User id -> email (best effort: an older server or a restricted token gives {})."""
    try:
        return {int(u.id): str(u.email or u.username or u.id) for u in client.users.list()}
    except Exception:  # noqa: BLE001
        return {}


def observe_task(ds: Dataset, task: Mapping[str, Any], entry: Mapping[str, Any], vocab: TagVocabulary,
                 users: Mapping[int, str] | None = None) -> Observation | None:
    """The edits of a task's latest annotation against what the push showed (None: no annotation)."""
    annotations = _annotations(task)
    if not annotations:
        return None
    sid = str((task.get("data") or {}).get("sample_id"))
    annotation = annotations[-1]
    actor = _annotator(annotation, users)
    pushed = entry.get("view") or {}
    folder_at_push = entry.get("folder") or {}
    obs = Observation(sid, view=dict(pushed))
    if len(annotations) > 1:
        log.info("task %s has %d annotations; the latest (id %s) is pulled", task.get("id"), len(annotations),
                 annotation.get("id"))
    choices: dict[str, list[str]] = {}
    brushes: list[np.ndarray] = []
    brush_regions = 0  # brush regions in the annotation, readable or not
    row = ds.row(sid) if sid in ds else None
    for result in annotation.get("result") or []:
        kind = str(result.get("type", "")).lower()
        value = result.get("value") or {}
        if kind == "choices":
            choices.setdefault(str(result.get("from_name")), []).extend(map(str, value.get("choices") or []))
        elif kind == "brushlabels" and result.get("from_name") == MASK:
            brush_regions += 1
            width, height = int(result.get("original_width") or 0), int(result.get("original_height") or 0)
            if row is not None and (width, height) != (row["width"], row["height"]):
                obs.problems.append(Problem(sid, "mask", f"brush on a {width}x{height} image but the stored image is "
                                                         f"{row['width']}x{row['height']}; not applied"))
                continue
            try:
                if value.get("format", "rle") != "rle" or "rle" not in value:
                    raise rle.RLEError(f"brush format {value.get('format')!r} is not rle")
                brushes.append(rle.decode_mask(value["rle"], width, height))
            except rle.RLEError as exc:
                obs.problems.append(Problem(sid, "mask", f"brush region cannot be decoded ({exc}); not applied"))
    tags = [f"{vocab.background_prefix}{v}" for v in choices.get(BACKGROUND, [])]
    tags += choices.get(CURATION, []) + choices.get(MASK_REVIEW, [])
    reading = vocab.read(tags, ds.backgrounds)
    for problem in reading.problems["unknown"]:
        obs.problems.append(Problem(sid, None, f"choice {problem}"))

    # background: a choice different from the pre-label, or the pre-label confirmed by a person
    # the pre-selected choice is what the push showed: a choice added beside it wins (vocabulary.decide)
    shown = {unit: [tag] if tag else [] for unit, tag in (
        ("background", f"{vocab.background_prefix}{pushed['background']}" if pushed.get("background") else None),
        ("curation", pushed.get("curation")), ("mask", pushed.get("mask_status")))}
    if choices.get(BACKGROUND):
        ok, value, problems = reading.decide("background", pushed=shown["background"])
        if ok:
            chosen = value[0]
            obs.view["background"] = chosen
            if chosen != pushed.get("background") or (folder_at_push.get("background") or [None, None])[1] != "human":
                obs.edits["background"] = Edit("background", list(value), f"choice background = {chosen}", actor)
        else:
            obs.problems.extend(Problem(sid, "background", f"{p}; not applied") for p in problems)
    verdict: Edit | None = None  # the mask verdict the annotation holds (changed or as pre-selected)
    for control, unit, vocab_unit in ((CURATION, "curation", "curation"), (MASK_REVIEW, "mask_status", "mask")):
        if not choices.get(control):
            continue
        ok, value, problems = reading.decide(vocab_unit, pushed=shown[vocab_unit])
        if not ok:
            obs.problems.extend(Problem(sid, unit, f"{p}; not applied") for p in problems)
            continue
        chosen = reading.tag_of(vocab_unit, value) or choices[control][-1]
        obs.view[unit] = chosen
        edit = Edit(unit, list(value) if isinstance(value, tuple) else value, f"choice {control} = {chosen}", actor)
        if unit == "mask_status":
            verdict = edit
        if chosen != pushed.get(unit):
            obs.edits[unit] = edit
    _clear_suspicions(obs, pushed, folder_at_push, choices.get(CURATION, []), annotation, actor)
    if brushes:
        mask = np.zeros_like(brushes[0])
        for brush in brushes:
            mask |= brush
        digest = mask_digest(mask)
        obs.view["mask"] = digest
        if digest != pushed.get("mask"):
            # its status (the verdict's, human, or a proposal's outcome) is decided by sync.decide_mask_review
            obs.edits["mask"] = Edit("mask", mask, f"brush of annotation {annotation.get('id')}", actor)
    elif not brush_regions and pushed.get("mask") is not None and verdict is not None:
        # the push showed a brush, the reviewer judged the mask and deleted the brush region: the mask
        # removed, decided with the verdict by sync.decide_mask_review as FiftyOne's removed mask field is
        # (mask:bad drops it; mask:ok contradicts it: a problem). Without a verdict an annotation that has
        # no brush says nothing about the mask (it may simply not carry one).
        obs.view["mask"] = None
        obs.edits["mask"] = Edit("mask", None, f"brush region deleted in annotation {annotation.get('id')}", actor)
    return obs


def _clear_suspicions(obs: Observation, pushed: Mapping[str, Any], folder_at_push: Mapping[str, Any],
                      chosen: Sequence[str], annotation: Mapping[str, Any], actor: str) -> None:
    """Drop from the folder's tags each ``suspect:<check>`` the task pre-selected a reason for
    that the annotation does not hold (the reviewer cleared it); a held reason is a decision
    (made by the curation choice itself) and its suspicion stays as the audit's record."""
    suspected = pushed.get("suspicion") or {}
    cleared = [check for check, reason in suspected.items() if reason not in chosen]
    drop = {f"{SUSPECT_PREFIX}{check}" for check in cleared}
    tags = list(folder_at_push.get("tags") or [])
    if drop & set(tags):
        obs.edits["tags"] = Edit("tags", [t for t in tags if t not in drop],
                                 f"suspicion {', '.join(cleared)} cleared in annotation {annotation.get('id')}", actor)


def pull_labelstudio(
    root: str | Path,
    *,
    url: str,
    token: str,
    project: str | None = None,
    on_conflict: OnConflict = "report",
    dry_run: bool = False,
    vocabulary: TagVocabulary | None = None,
) -> PullReport:
    """Export the project's annotations and write them back into the folder (module docstring)."""
    ds = Dataset.open(root)
    vocab = vocabulary or TagVocabulary.load()
    title = project_title(ds, project)
    snapshot = Snapshot.load(snapshot_path(ds.root, BACKEND, title))
    if snapshot is None:
        raise ReviewError(f"{ds.root} was never pushed to Label Studio project {title!r} (no snapshot in "
                          f"{ds.root / '.review'}); run `{suggest('curate review labelstudio {dir} --url ...', dir=root)}` "
                          "first")
    client = connect(url, token)
    project_id = int(snapshot.target.get("project_id", -1))
    tasks = _export(client, url, project_id)
    users = _users(client)
    observations: list[Observation] = []
    for task in tasks:
        sid = str((task.get("data") or {}).get("sample_id"))
        entry = snapshot.samples.get(sid)
        if entry is None:
            if _annotations(task):
                observations.append(Observation(sid, problems=[Problem(sid, None, f"task {task.get('id')} is not in the "
                                                                       "push snapshot (imported by hand?); ignored")]))
            continue
        obs = observe_task(ds, task, entry, vocab, users)
        if obs is not None:
            observations.append(obs)
    return apply_pull(ds, snapshot, observations, backend=BACKEND, target=f"{url.rstrip('/')} project {title!r}",
                      actor="review.labelstudio", on_conflict=on_conflict, dry_run=dry_run)


# ---------------------------------------------------------------------------------------------
# a loopback file server for media="url"
# ---------------------------------------------------------------------------------------------


def media_server(root: str | Path, *, port: int = 0, address: str = "127.0.0.1") -> Any:
    """A read-only HTTP server of the folder's ``media/`` and ``masks/`` (for ``media="url"``).

    Only those two folders are served (no listing, nothing else of the folder), with
    ``Access-Control-Allow-Origin: *`` so the Label Studio page can load the images. Call
    ``serve_forever()`` on the result (``server_address`` says where it listens).
    """
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    ds = Dataset.open(root)
    base = ds.root

    class Handler(SimpleHTTPRequestHandler):
        def list_directory(self, path: Any) -> None:  # type: ignore[override]
            self.send_error(403, "no listings")

        def translate_path(self, path: str) -> str:
            clean = path.split("?", 1)[0].split("#", 1)[0]
            parts = [p for p in clean.split("/") if p]
            if not parts or parts[0] not in ("media", "masks") or any(p in ("..", ".") for p in parts):
                return str(base / ".forbidden")
            return str(base.joinpath(*parts))

        def end_headers(self) -> None:
            self.send_header("Access-Control-Allow-Origin", "*")
            super().end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("media server: " + format, *args)

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            """A browser that closes a tab or moves on resets its connections: a line in the debug log,
            not socketserver's traceback on the user's terminal; any other error keeps its traceback."""
            import sys

            error = sys.exc_info()[1]
            if isinstance(error, (ConnectionError, TimeoutError)):
                log.debug("media server: %s dropped the connection (%s)", client_address[0], error)
                return
            super().handle_error(request, client_address)

    return Server((address, port), functools.partial(Handler, directory=str(base)))


# ---------------------------------------------------------------------------------------------
# public helpers for other Label Studio front ends (curate.discover.review)
# ---------------------------------------------------------------------------------------------


def api_error(action: str, url: str, exc: Exception) -> ReviewError:
    """A :class:`ReviewError` for a failed Label Studio call, with nothing that could carry the token."""
    return _api_error(action, url, exc)


def export_tasks(client: Any, url: str, project_id: int) -> list[dict[str, Any]]:
    """Every task of a project with its annotations (Label Studio's JSON export)."""
    return _export(client, url, project_id)


def submitted_annotations(task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A task's submitted annotations (not cancelled or skipped), oldest first."""
    return _annotations(task)


def ensure_local_storage(client: Any, project_id: int, path: Path) -> None:
    """Give a project a local-files storage of ``path`` (once; never synced) so ``/data/local-files`` serves it."""
    _ensure_local_storage(client, project_id, path)


def list_users(client: Any) -> dict[int, str]:
    """User id -> email on the server (best effort: {} when the token may not list users)."""
    return _users(client)


def find_project(client: Any, title: str) -> Any | None:
    """The project titled ``title`` on the server, or None."""
    return _find_project(client, title)


def annotator_name(annotation: Mapping[str, Any], users: Mapping[int, str] | None = None) -> str:
    """Who submitted an annotation (email, username or id), as the actor ``review.labelstudio:<who>``."""
    return _annotator(annotation, users)
