"""People decide on discovered groups, against the real services of the review suites (one
MongoDB for FiftyOne and one Label Studio server per test session, tests/service_fixtures.py).

A tiny synthetic world (2 classes x 12 photos) and a DiscoveryRun written by hand (no model,
tests/discover_helpers.py): three proposed groups (one to accept under a new name with one photo taken out, one to reject, one
with contradicting answers) and one group that is not significant (never shown). Each backend:
push, answer as a reviewer does (FiftyOne sample tags; Label Studio annotations posted as the
browser posts them), pull, check the folder, the vocabulary and decisions.json, pull again
(nothing changes).
"""
from __future__ import annotations

import hashlib
import logging
import secrets
import uuid
from pathlib import Path
from typing import Any

import pytest
from discover_helpers import ACC, CONF, PROPOSED, QUIET, REJ, discovery_world, hand_made_group
from review_helpers import changed_fields, table_of
from service_fixtures import EMAIL

from curate.runs.discovery import DiscoveryRun
from curate.store import Dataset

pytestmark = [pytest.mark.timeout(600)]

TOKEN_ENV = "CURATE_DISCOVER_TEST_TOKEN"


def _digest(root: Path) -> str:
    return hashlib.sha256((root / "samples.parquet").read_bytes()).hexdigest()


def _check_applied(ds: Dataset, run: DiscoveryRun, before: list[dict[str, Any]], out: str, actor: str, via: str) -> None:
    """The accepted group labelled (but ``out``), the rejected one untouched, decisions.json right."""
    folder = Dataset.open(ds.root)
    assert "bird feeder" in folder.backgrounds
    labelled = set(run.member_ids(ACC)) - {out}
    changed = changed_fields(before, table_of(ds.root))
    assert set(changed) == labelled  # the rejected and refused groups, and the photo taken out, wrote nothing
    for sid in labelled:
        row = folder.row(sid)
        assert (row["background"], row["background_source"]) == ("bird feeder", "human")
    assert folder.row(out)["background_source"] == "model"
    decisions = run.decisions()
    assert set(decisions) == {ACC, REJ}
    assert decisions[ACC]["decision"] == "accepted" and decisions[ACC]["background"] == "bird feeder"
    assert decisions[ACC]["excluded_ids"] == [out] and decisions[ACC]["via"] == via
    assert decisions[ACC]["actor"] == actor and decisions[ACC]["labelled"] == len(labelled)
    assert decisions[REJ]["decision"] == "rejected" and decisions[REJ]["via"] == via
    assert {c["actor"] for c in folder.changes()[-len(labelled):]} == {actor}


@pytest.mark.slow
@pytest.mark.fiftyone
def test_fiftyone_views_tags_and_pull(fo, tmp_path) -> None:
    from curate.discover.review import pull_groups_fiftyone, push_groups_fiftyone, view_name
    from curate.review.fiftyone import pull_fiftyone

    ds, run = discovery_world(tmp_path / "world")
    name = f"t-{uuid.uuid4().hex[:10]}"
    views = push_groups_fiftyone(ds, run, name=name)  # the folder was never pushed: pushed first
    assert views == [view_name(g) for g in PROPOSED]
    dataset = fo.load_dataset(name)
    assert len(dataset) == len(ds)
    info = {v["name"]: v for v in dataset.list_saved_views(info=True)}
    for gid in PROPOSED:
        view = dataset.load_saved_view(view_name(gid))
        assert view.values("sample_id") == run.member_ids(gid)  # most typical first
        description = info[view_name(gid)]["description"]
        group = run.group(gid)
        assert group.class_name in description and group.top_name in description
        assert "35%" in description and "+55.0 points" in description and "q = 0.01" in description
    assert view_name(QUIET) not in info
    shown = dict(zip(*dataset.values(["sample_id", "discover_group"])))
    assert {sid for sid, g in shown.items() if g} == {s for g in PROPOSED for s in run.member_ids(g)}
    names = dict(zip(*dataset.values(["sample_id", "discover_names"])))
    assert names[run.member_ids(ACC)[0]] == "a feeding station, a bird feeder"

    def tag(sid: str, *tags: str) -> None:
        dataset.select_by("sample_id", [sid]).tag_samples(list(tags))

    acc, rej, conf = (run.member_ids(g) for g in PROPOSED)
    tag(acc[0], "discover:accept")
    tag(acc[1], "discover:name=A Bird  Feeder")  # a rename: "bird feeder"
    tag(acc[2], "discover:out")
    tag(rej[3], "discover:reject")
    tag(conf[0], "discover:accept")
    tag(conf[1], "discover:reject")
    before = table_of(ds.root)
    result = pull_groups_fiftyone(ds.root, run, name=name, actor="alice")
    assert [(d.group_id, d.decision, d.background) for d in result] == [(ACC, "accepted", "bird feeder"),
                                                                         (REJ, "rejected", None)]
    assert result[0].labelled == 5 and result[0].excluded == 1 and result[0].new_vocabulary
    refused = [p for p in result.problems if p.startswith(CONF)]
    assert len(refused) == 1 and "contradicting" in refused[0] and "discover:reject" in refused[0]
    _check_applied(ds, run, before, acc[2], "review.fiftyone:alice", "fiftyone")
    # a second pull changes nothing
    digest, logged, recorded = _digest(ds.root), len(Dataset.open(ds.root).changes()), run.decisions()
    again = pull_groups_fiftyone(ds.root, run, name=name, actor="alice")
    assert list(again) == [] and set(again.skipped) == {ACC, REJ} and len(again.problems) == 1
    assert _digest(ds.root) == digest and len(Dataset.open(ds.root).changes()) == logged
    assert run.decisions() == recorded
    # the folder's own pull passes over discover: tags
    assert not pull_fiftyone(ds.root, name=name).problems
    # the conflict resolved: applied; a later reject of the accepted group is refused, not undone
    dataset.select_by("sample_id", [conf[1]]).untag_samples(["discover:reject"])
    dataset.select_by("sample_id", acc[:2]).untag_samples(["discover:accept", "discover:name=A Bird  Feeder"])
    tag(acc[0], "discover:reject")
    third = pull_groups_fiftyone(ds.root, run, name=name, actor="bob")
    assert [(d.group_id, d.decision, d.background) for d in third] == [(CONF, "accepted", "zoo enclosure")]
    assert any(p.startswith(ACC) and "does not undo an acceptance" in p for p in third.problems)
    assert run.decisions()[ACC]["decision"] == "accepted"


def _tasks(ls: Any, project_id: int) -> list[dict[str, Any]]:
    response = ls.http.get("/api/tasks", params={"project": project_id, "fields": "all", "page_size": 1000})
    response.raise_for_status()
    data = response.json()
    tasks = data["tasks"] if isinstance(data, dict) else data
    return sorted(tasks, key=lambda t: t["id"])


def _annotate(ls: Any, project_id: int, task: dict[str, Any], *, group: str | None = None, member: str | None = None,
              name: str | None = None) -> None:
    """POST an annotation the way the Label Studio frontend submits one."""
    result: list[dict[str, Any]] = []
    if member:
        result.append({"id": secrets.token_hex(5), "from_name": "member", "to_name": "image", "type": "choices",
                       "origin": "manual", "value": {"choices": [member]}})
    if group:
        result.append({"id": secrets.token_hex(5), "from_name": "group", "to_name": "image", "type": "choices",
                       "origin": "manual", "value": {"choices": [group]}})
    if name is not None:
        result.append({"id": secrets.token_hex(5), "from_name": "name", "to_name": "image", "type": "textarea",
                       "origin": "manual", "value": {"text": [name]}})
    body = {"result": result, "lead_time": 3.0, "project": project_id, "draft_id": 0, "was_cancelled": False,
            "parent_prediction": (task.get("predictions") or [{}])[0].get("id")}
    response = ls.http.post(f"/api/tasks/{task['id']}/annotations/", params={"project": project_id}, json=body)
    assert response.status_code == 201, response.text


@pytest.mark.slow
@pytest.mark.labelstudio
def test_labelstudio_projects_majority_and_pull(ls, monkeypatch, caplog) -> None:
    from curate.discover.review import pull_groups_labelstudio, push_groups_labelstudio
    from curate.review.labelstudio import MediaSource

    ds, run = discovery_world(ls.docroot / f"world-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv(TOKEN_ENV, ls.token)
    media = MediaSource("local-files", document_root=ls.docroot)
    with caplog.at_level(logging.DEBUG):
        projects = push_groups_labelstudio(ds, run, url=ls.url, token_env=TOKEN_ENV, media=media)
    assert list(projects) == list(PROPOSED)
    project = ls.http.get(f"/api/projects/{projects[ACC]}").json()
    assert project["title"] == "polar-bear-g1: a feeding station"
    for value in ("in group", "not this background", "accept", "reject", "TextArea", 'name="name"'):
        assert value in project["label_config"]
    tasks = {gid: _tasks(ls, pid) for gid, pid in projects.items()}
    for gid in PROPOSED:
        assert [t["data"]["sample_id"] for t in tasks[gid]] == run.member_ids(gid)  # most typical first
    first = tasks[ACC][0]
    assert "a feeding station (0.31)" in first["data"]["names"] and "q = 0.01" in first["data"]["summary"]
    prefill = {r["from_name"]: r["value"] for r in first["predictions"][0]["result"]}
    assert prefill["name"] == {"text": ["a feeding station"]} and prefill["member"] == {"choices": ["in group"]}
    image = ls.http.get(first["data"]["image"])
    assert image.status_code == 200 and image.content == ds.image_path(ds.row(first["data"]["sample_id"])).read_bytes()

    acc, rej, conf = tasks[ACC], tasks[REJ], tasks[CONF]
    _annotate(ls, projects[ACC], acc[0], group="accept", member="in group", name="Bird Feeder")
    _annotate(ls, projects[ACC], acc[1], group="accept", name="a bird feeder")
    _annotate(ls, projects[ACC], acc[2], group="reject", name="a feeding station")  # the pre-fill, untouched
    _annotate(ls, projects[ACC], acc[3], group="accept", member="not this background", name="a feeding station")
    _annotate(ls, projects[REJ], rej[0], group="reject")
    _annotate(ls, projects[REJ], rej[1], group="reject", member="in group")
    _annotate(ls, projects[REJ], rej[2], group="accept")
    _annotate(ls, projects[CONF], conf[0], group="accept")
    _annotate(ls, projects[CONF], conf[1], group="reject")
    out = acc[3]["data"]["sample_id"]
    before = table_of(ds.root)
    with caplog.at_level(logging.DEBUG):
        result = pull_groups_labelstudio(ds.root, run, url=ls.url, token_env=TOKEN_ENV)
    assert [(d.group_id, d.decision, d.background) for d in result] == [(ACC, "accepted", "bird feeder"),
                                                                         (REJ, "rejected", None)]
    assert list(result.undecided) == [CONF] and "tie: 1 accept, 1 reject" in result.undecided[CONF]
    assert not result.problems
    _check_applied(ds, run, before, out, f"review.labelstudio:{EMAIL}", "labelstudio")
    # a second pull and a re-push change nothing
    digest, logged, recorded = _digest(ds.root), len(Dataset.open(ds.root).changes()), run.decisions()
    again = pull_groups_labelstudio(ds.root, run, url=ls.url, token_env=TOKEN_ENV)
    assert list(again) == [] and set(again.skipped) == {ACC, REJ} and list(again.undecided) == [CONF]
    assert _digest(ds.root) == digest and len(Dataset.open(ds.root).changes()) == logged
    assert run.decisions() == recorded
    assert push_groups_labelstudio(ds, run, url=ls.url, token_env=TOKEN_ENV, media=media) == projects
    assert [len(_tasks(ls, pid)) for pid in projects.values()] == [len(t) for t in tasks.values()]
    assert ls.token not in caplog.text
    assert ls.token not in (ds.root / ".review" / "labelstudio-discover-discover-test.json").read_text()


def test_reading_answers_without_a_service() -> None:
    """Tags and annotations read into verdicts: typos and contradictions refused, a rename accepts,
    no answer or a cancelled one leaves a group undecided."""
    from curate.discover.review import read_fiftyone_verdicts, read_labelstudio_verdicts

    records = [("a", "g1", ["discover:name=Bird Feeder"]), ("b", "g1", ["discover:out", "tag:x"]),
               ("c", "g2", ["discover:acept"]), ("d", "g3", ["discover:name=feeder"]),
               ("e", "g3", ["discover:name=a bird"]), ("f", None, ["discover:accept"]), ("g", "g4", [])]
    verdicts = {v.group_id: v for v in read_fiftyone_verdicts(records, ["g1", "g2", "g3", "g4"], "x")}
    assert (verdicts["g1"].decision, verdicts["g1"].name, verdicts["g1"].exclude) == ("accepted", "Bird Feeder", ["b"])
    assert verdicts["g2"].problem and "discover:acept" in verdicts["g2"].problem
    assert verdicts["g3"].problem and "contradicting names" in verdicts["g3"].problem
    assert verdicts["g4"].decision is None and verdicts["g4"].problem is None and verdicts["g4"].why
    group = hand_made_group("g", 0, "polar bear", 2, [("a feeding station", 0.3)])
    cancelled = {"id": 1, "data": {"sample_id": "a", "rank": 1},
                 "annotations": [{"id": 5, "was_cancelled": True, "completed_by": 1,
                                  "result": [{"from_name": "group", "type": "choices", "value": {"choices": ["accept"]}}]}]}
    verdict = read_labelstudio_verdicts(group, [cancelled, {"id": 2, "data": {"sample_id": "b"}, "annotations": []}])
    assert verdict.decision is None and "no accept / reject answer (0 photo(s) answered)" in verdict.why
