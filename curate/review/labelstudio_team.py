"""Several annotators in Label Studio: one queue per person, every answer pulled, disputes to an adjudicator.

Issue 44 (docs/recipes.md#several-annotators; the table: docs/design.md#dataset-folder).
``push_team(DIR, annotators=[...], overlap=k)`` plans who labels
what with :func:`curate.review.overlap.assign_overlap` (k of the n annotators per photo, loads
within one, gold photos mixed in unannounced) and gives each annotator a **project of their
own** (``<title> · <annotator>``) holding exactly their queue. Label Studio's open-source edition
has no per-user task assignment (the ``/api/projects/<id>/tasks/assignees`` endpoints and the
"Manual" distribution mode are Enterprise-only; ``maximum_annotations`` caps how many people
annotate a task but not *who*), so the queue is the project. The community edition also shows
every project to every member of the organization: the pull records who actually submitted
each annotation (``completed_by``) and reports an annotation made in someone else's queue.

Tasks carry no prediction (no pre-label, no pre-painted mask): each person labels
independently, which is what agreement measures (a shown pre-label anchors the answers), and a
gold task looks like every other. The labelling config (:func:`team_config`) asks for the
background (one, or two where the photo shows two; the first is the primary) and a brush
mask of the animal.

``pull_team`` exports every project of the team (and the adjudication project, if any) first,
then stores every annotation in the folder's annotation table in one
:func:`curate.store.annotations.upsert_annotations` (backend ``labelstudio``, id
``labelstudio:<project id>:<annotation id>``, source ``labelstudio-team:<title>`` with every
id the server still has as ``present_ids``): a re-pull is a no-op, an annotation changed in the
tool gets a new version, one deleted there is marked deleted. A skipped task (``was_cancelled``)
is a row with no background. The folder's ``background`` is not written here: it is derived
from the table by :mod:`curate.agreement`, never by one person.

Bad input is reported and loses nothing: a background outside the dataset's vocabulary (or
more than two), or an author the server's user list does not name (a removed user: curate
never stores a person under a bare server id), leaves that annotation out (its previous version,
if any, stays current; fix it in the tool and pull again); the same person twice on one photo keeps the latest and names the
others; an annotator who skipped every task, photos nobody labelled, and gold photos answered
wrongly (per annotator) are reported. A server that stops mid-pull raises a
:class:`~curate.review.sync.ReviewError` before anything is written (the exports all come
first), so the folder stays as it was and the next pull completes.

``push_adjudication`` puts the disputed photos (from :mod:`curate.agreement`, or given) into a
project ``<title> · adjudication`` whose tasks show each annotator's answer; the adjudicator's
answers come back with role ``adjudicator`` and ``is_gold`` (an adjudicated photo is a gold
photo for later queues).
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

import numpy as np

from curate.review import rle
from curate.review.labelstudio import (
    BACKGROUND,
    IMAGE,
    MASK,
    MASK_LABEL,
    MediaSource,
    api_error,
    connect,
    ensure_local_storage,
    export_tasks,
    find_project,
    list_users,
    project_title,
    select_samples,
)
from curate.review.overlap import OverlapPlan, assign_overlap, parse_annotators
from curate.review.sync import ReviewError, now_iso, snapshot_path
from curate.review.team_report import TeamPullReport, judge
from curate.shell import suggest
from curate.store import Dataset
from curate.store.annotation_schema import MAX_BACKGROUNDS
from curate.store.annotations import (
    Annotation,
    AnnotationUpsert,
    current_annotations,
    gold_answers,
    upsert_annotations,
)
from curate.store.atomic import atomic_write_bytes

BACKEND = "labelstudio"
TEAM_BACKEND = "labelstudio-team"
ADJUDICATION = "adjudication"
SEPARATOR = " · "


# ---------------------------------------------------------------------------------------------
# config and the team file
# ---------------------------------------------------------------------------------------------


def team_config(ds: Dataset) -> str:
    """The labelling config of a team queue: the image, a brush for the animal's mask, the
    background (one or two; the first chosen is the primary) and, for the adjudicator, the
    annotators' answers (task field ``answers``, empty in annotators' queues)."""
    choices = "\n".join(f"    <Choice value={quoteattr(b)}/>" for b in ds.backgrounds)
    return (f'<View>\n  <Header value="$class_name"/>\n  <Text name="answers" value="$answers"/>\n'
            f'  <Image name="{IMAGE}" value="$image" zoom="true" zoomControl="true"/>\n'
            f'  <BrushLabels name="{MASK}" toName="{IMAGE}">\n    <Label value="{MASK_LABEL}" background="#e4572e"/>\n'
            '  </BrushLabels>\n  <Header value="Background behind the animal (a second one only if the photo shows two)" '
            f'size="5"/>\n  <Choices name="{BACKGROUND}" toName="{IMAGE}" choice="multiple" showInline="true">\n'
            f"{choices}\n  </Choices>\n</View>\n")


def team_path(root: Path, title: str) -> Path:
    """``DIR/.review/labelstudio-team-<title slug>.json``: the plan and the projects of a team push."""
    return snapshot_path(root, TEAM_BACKEND, title)


@dataclass
class Team:
    """What a team push set up: the plan, ``projects[annotator] = id``, the adjudication project."""

    url: str
    title: str
    plan: OverlapPlan
    projects: dict[str, int]
    adjudication: dict[str, Any] = field(default_factory=dict)  # {"project_id", "adjudicator", "samples"}
    pushed_at: str = ""

    def save(self, ds: Dataset) -> Path:
        path = team_path(ds.root, self.title)
        data = {"version": 1, "backend": TEAM_BACKEND, "url": self.url, "title": self.title,
                "plan": self.plan.to_json(), "projects": self.projects, "adjudication": self.adjudication,
                "pushed_at": self.pushed_at}
        with ds.locked("review team"):
            atomic_write_bytes(ds.root, path, json.dumps(data, indent=1, sort_keys=True).encode("utf-8"))
        return path

    @classmethod
    def load(cls, root: Path, title: str) -> Team | None:
        path = team_path(root, title)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(str(data["url"]), str(data["title"]), OverlapPlan.from_json(data["plan"]),
                       {str(k): int(v) for k, v in data["projects"].items()}, dict(data.get("adjudication") or {}),
                       str(data.get("pushed_at") or ""))
        except (ValueError, KeyError, TypeError) as exc:
            raise ReviewError(f"{path} is not a team file curate wrote ({exc}); push the team again") from None


def pushed_modes(root: str | Path, project: str | None = None) -> tuple[bool, bool]:
    """(a team push exists, a single-reviewer push exists) for the folder and project title."""
    ds = Dataset.open(root)
    title = project_title(ds, project)
    return team_path(ds.root, title).is_file(), snapshot_path(ds.root, BACKEND, title).is_file()


def disputed_photos(root: str | Path, rule: str = "dawid-skene", threshold: float | None = None) -> list[str]:
    """The photos the team's answers leave disputed under ``rule`` (:func:`curate.agreement.aggregate_labels`)."""
    from curate.agreement import aggregate_labels, answers_of

    decisions = aggregate_labels(answers_of(Dataset.open(root)), rule, threshold)
    return sorted(sid for sid, d in decisions.items() if d.status == "disputed")


# ---------------------------------------------------------------------------------------------
# push
# ---------------------------------------------------------------------------------------------


@dataclass
class TeamPushResult:
    """What a team push did: per annotator, the project id and the tasks imported (gold among them)."""

    url: str
    title: str
    projects: dict[str, int]
    imported: dict[str, int]
    gold: dict[str, int]
    loads: dict[str, int]
    team_file: Path


def server_users(client: Any, url: str) -> dict[int, str]:
    """User id -> e-mail on the server; an error when the token may not list them."""
    users = list_users(client)
    if not users:
        raise ReviewError(f"Label Studio at {url}: the token cannot list the organization's users; an "
                          "administrator's token is needed to check the annotators")
    return users


def check_annotators(names: Sequence[str], users: Mapping[int, str], url: str) -> None:
    """Refuse annotators who are not users of the server (by e-mail)."""
    known = set(users.values())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ReviewError(f"unknown annotator(s) on {url}: {', '.join(unknown)} (users there: "
                          f"{', '.join(sorted(known))}); invite them first (Organization -> Add People) and name "
                          "them by the e-mail they signed up with")


def _ensure_project(client: Any, url: str, title: str, config: str, ds: Dataset, media: MediaSource) -> int:
    try:
        existing = find_project(client, title)
        if existing is None:
            project = client.projects.create(title=title, label_config=config, maximum_annotations=1,
                                             show_collab_predictions=False, show_skip_button=True,
                                             description=f"curate dataset {ds.name}: one annotator's queue")
            project_id = int(project.id)
        else:
            project_id = int(existing.id)
            if (getattr(existing, "label_config", None) or "").strip() != config.strip():
                client.projects.update(id=project_id, label_config=config)
        if media.mode == "local-files":
            ensure_local_storage(client, project_id, ds.root / "media")
        return project_id
    except ReviewError:
        raise
    except Exception as exc:  # noqa: BLE001 - the SDK raises many kinds
        raise api_error(f"preparing project {title!r}", url, exc) from None


def _import(client: Any, url: str, ds: Dataset, project_id: int, sample_ids: Sequence[str], media: MediaSource,
            answers: Mapping[str, str] | None = None) -> int:
    """Import the samples that have no task in the project yet (none is deleted or refreshed)."""
    have = {str((t.get("data") or {}).get("sample_id")) for t in export_tasks(client, url, project_id)}
    rows = {r["sample_id"]: r for r in ds.rows()}
    new = [{"data": {"image": media.url_of(ds, rows[sid]), "sample_id": sid,
                     "class_name": rows[sid].get("class_name") or "", "answers": (answers or {}).get(sid, "")}}
           for sid in sample_ids if sid not in have]
    try:
        for start in range(0, len(new), 500):
            client.projects.import_tasks(id=project_id, request=new[start:start + 500])
    except Exception as exc:  # noqa: BLE001
        raise api_error(f"importing tasks into project {project_id}", url, exc) from None
    return len(new)


def push_team(
    root: str | Path,
    *,
    url: str,
    token: str,
    annotators: str | Sequence[str],
    overlap: int,
    seed: int = 0,
    gold_share: float = 0.0,
    project: str | None = None,
    views: Sequence[str] | None = None,
    all_samples: bool = False,
    media: MediaSource | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> TeamPushResult:
    """Plan the overlap and give each annotator a project with their queue (module docstring).

    Re-pushing reuses the projects (same titles) and imports only tasks they lack; a task is never
    deleted (its annotations stay), so a re-push after the scope grew adds the new photos' tasks."""
    ds = Dataset.open(root)
    names = parse_annotators(annotators)
    media = media or MediaSource()
    media.check(ds)
    title = project_title(ds, project)
    client = connect(url, token)
    check_annotators(names, server_users(client, url), url)
    gold = sorted(gold_answers(current_annotations(ds)))
    scope = [r["sample_id"] for r in select_samples(ds, views, all_samples)]
    if not scope:
        raise ReviewError("no photos in scope: name views with --view, or pass --all")
    plan = assign_overlap(scope, names, overlap, seed=seed, gold=gold, gold_share=gold_share)
    config = team_config(ds)
    previous = Team.load(ds.root, title)
    projects: dict[str, int] = {}
    imported: dict[str, int] = {}
    for done, name in enumerate(names, 1):
        projects[name] = _ensure_project(client, url, f"{title}{SEPARATOR}{name}", config, ds, media)
        imported[name] = _import(client, url, ds, projects[name], plan.queues[name], media)
        if progress is not None:
            progress(done, len(names))
    team = Team(url.rstrip("/"), title, plan, projects, previous.adjudication if previous else {}, now_iso())
    path = team.save(ds)
    return TeamPushResult(url.rstrip("/"), title, projects, imported, {a: len(g) for a, g in plan.gold.items()},
                          {a: plan.load(a) for a in names}, path)


def push_adjudication(
    root: str | Path,
    *,
    url: str,
    token: str,
    adjudicator: str,
    disputed: Sequence[str],
    project: str | None = None,
    media: MediaSource | None = None,
) -> tuple[int, int]:
    """Put ``disputed`` photos in the adjudicator's project ``<title> · adjudication``; each task
    shows the annotators' current answers. Returns (project id, tasks imported)."""
    ds = Dataset.open(root)
    media = media or MediaSource()
    media.check(ds)
    title = project_title(ds, project)
    team = Team.load(ds.root, title)
    if team is None:
        raise ReviewError(f"{ds.root} has no team push for {title!r}; push with --annotators first")
    if not disputed:
        raise ReviewError("no disputed photos to adjudicate")
    client = connect(url, token)
    check_annotators([adjudicator], server_users(client, url), url)
    answers: dict[str, list[str]] = defaultdict(list)
    for a in current_annotations(ds):
        if a.role == "annotator" and a.sample_id in set(disputed):
            answers[a.sample_id].append(f"{a.annotator}: {' + '.join(a.backgrounds) or 'skipped'}")
    text = {sid: "answers so far: " + "; ".join(sorted(v)) for sid, v in answers.items()}
    project_id = _ensure_project(client, url, f"{title}{SEPARATOR}{ADJUDICATION}", team_config(ds), ds, media)
    count = _import(client, url, ds, project_id, list(disputed), media, text)
    samples = sorted(set(team.adjudication.get("samples") or []) | set(disputed))
    team.adjudication = {"project_id": project_id, "adjudicator": adjudicator, "samples": samples}
    team.save(ds)
    return project_id, count


# ---------------------------------------------------------------------------------------------
# pull
# ---------------------------------------------------------------------------------------------


def _brush(result: Mapping[str, Any], size: tuple[int, int]) -> np.ndarray:
    width, height = int(result.get("original_width") or 0), int(result.get("original_height") or 0)
    if (width, height) != size:
        raise rle.RLEError(f"brush on a {width}x{height} image but the stored image is {size[0]}x{size[1]}")
    value = result.get("value") or {}
    if value.get("format", "rle") != "rle" or "rle" not in value:
        raise rle.RLEError(f"brush format {value.get('format')!r} is not rle")
    return rle.decode_mask(value["rle"], width, height)


def read_annotation(ds: Dataset, project_id: int, task: Mapping[str, Any], annotation: Mapping[str, Any],
                    users: Mapping[int, str], *, role: str, is_gold: bool,
                    problems: list[str]) -> tuple[Annotation | None, np.ndarray | None]:
    """One Label Studio annotation as an :class:`Annotation` (+ its mask), or None with a problem."""
    sid = str((task.get("data") or {}).get("sample_id"))
    who = annotation.get("completed_by")
    if isinstance(who, Mapping):
        who = who.get("email") or who.get("id")
    # an author is the server's e-mail for the user: never a bare id, "None" or an empty name (they would
    # split one person in two across pulls, or merge strangers)
    annotator = users.get(who) if isinstance(who, int) else (str(who).strip() if who is not None else "")
    aid = f"{BACKEND}:{project_id}:{annotation.get('id')}"
    if not annotator:
        problems.append(f"annotation {aid} on {sid}: " + (f"its author (user id {who}) is not among the server's "
                                                           "users" if isinstance(who, int) else "no author")
                        + "; left out")
        return None, None
    where = f"annotation {aid} by {annotator} on {sid}"
    if sid not in ds:
        problems.append(f"{where}: not a sample of the folder; left out")
        return None, None
    chosen: list[str] = []
    masks: list[np.ndarray] = []
    row = ds.row(sid)
    cancelled = bool(annotation.get("was_cancelled"))
    for result in annotation.get("result") or [] if not cancelled else []:
        kind = str(result.get("type", "")).lower()
        if kind == "choices" and result.get("from_name") == BACKGROUND:
            chosen.extend(str(c) for c in (result.get("value") or {}).get("choices") or [])
        elif kind == "brushlabels" and result.get("from_name") == MASK:
            try:
                masks.append(_brush(result, (row["width"], row["height"])))
            except rle.RLEError as exc:
                problems.append(f"{where}: mask not stored ({exc})")
    chosen = list(dict.fromkeys(chosen))
    outside = [c for c in chosen if c not in ds.backgrounds]
    if outside:
        problems.append(f"{where}: background(s) {', '.join(map(repr, outside))} not in the dataset's vocabulary "
                        f"({', '.join(ds.backgrounds)}); left out: fix it in Label Studio and pull again")
        return None, None
    if len(chosen) > MAX_BACKGROUNDS:
        problems.append(f"{where}: {len(chosen)} backgrounds chosen (at most {MAX_BACKGROUNDS}); left out: fix it "
                        "in Label Studio and pull again")
        return None, None
    mask = None
    if masks:
        mask = np.zeros_like(masks[0])
        for m in masks:
            mask |= m
        if not mask.any():
            mask = None
    created = str(annotation.get("created_at") or "")
    return Annotation(annotation_id=aid, sample_id=sid, annotator=annotator, backend=BACKEND,
                      backgrounds=tuple(chosen), created_at=created,
                      updated_at=str(annotation.get("updated_at") or created), role=role, is_gold=is_gold), mask


def pull_team(root: str | Path, *, url: str, token: str, project: str | None = None,
              dry_run: bool = False) -> TeamPullReport:
    """Store every annotation of the team's projects in the annotation table (module docstring)."""
    ds = Dataset.open(root)
    title = project_title(ds, project)
    team = Team.load(ds.root, title)
    if team is None:
        raise ReviewError(f"{ds.root} has no team push for {title!r} (no {team_path(ds.root, title).name}); run "
                          f"`{suggest('curate review labelstudio {dir} --url ... --annotators A,B --overlap 2', dir=root)}` "
                          "first")
    client = connect(url, token)
    queues = [(name, pid, "annotator") for name, pid in team.projects.items()]
    if team.adjudication.get("project_id"):
        queues.append((str(team.adjudication.get("adjudicator")), int(team.adjudication["project_id"]), "adjudicator"))
    exported: list[tuple[str, int, str, list[dict[str, Any]]]] = []
    try:
        users = server_users(client, url)  # never {}: an annotator is named by e-mail, not by a server's id
        for name, pid, role in queues:  # every export first: a server that stops here leaves nothing written
            exported.append((name, pid, role, export_tasks(client, url, pid)))
    except ReviewError as exc:
        raise ReviewError(f"{exc}; nothing was written: pull again when the server answers") from None
    problems: list[str] = []
    found: dict[tuple[str, str, str], list[tuple[Annotation, np.ndarray | None]]] = defaultdict(list)
    present: set[str] = set()
    for name, pid, role, tasks in exported:
        gold = set(team.plan.gold.get(name, ())) if role == "annotator" else set()
        for task in tasks:
            for raw in task.get("annotations") or []:
                row, mask = read_annotation(ds, pid, task, raw, users, role=role,
                                            is_gold=role == "adjudicator" or str((task.get("data") or {}).get(
                                                "sample_id")) in gold, problems=problems)
                aid = f"{BACKEND}:{pid}:{raw.get('id')}"
                present.add(aid)  # left out for bad input: its previous version stays current
                if row is None:
                    continue
                if role == "annotator" and row.annotator != name:
                    problems.append(f"annotation {aid}: {row.annotator} answered {row.sample_id} in {name}'s queue; "
                                    f"stored as {row.annotator}'s")
                found[(row.sample_id, row.annotator, role)].append((row, mask))
    rows: list[Annotation] = []
    masks: dict[str, np.ndarray] = {}
    for (sid, who, _role), items in found.items():
        items.sort(key=lambda item: (item[0].updated_at, item[0].annotation_id))
        row, mask = items[-1]
        if len(items) > 1:
            others = [i[0].annotation_id for i in items[:-1]]
            problems.append(f"{who} answered {sid} {len(items)} times: the latest ({row.annotation_id}) is kept, "
                            f"{', '.join(others)} left out (delete them in Label Studio)")
            present.difference_update(others)
        rows.append(row)
        if mask is not None:
            masks[row.annotation_id] = mask
    report = TeamPullReport(AnnotationUpsert())
    if not dry_run:
        report.upsert = upsert_annotations(ds, rows, source=f"{TEAM_BACKEND}:{title}", actor="review.labelstudio",
                                           present_ids=present, masks=masks)
    judge(ds, team.plan, rows, report)
    report.problems = problems + report.problems
    return report
