"""Label Studio for real: a server started by this suite in its own virtual environment
(.services/labelstudio-venv, provisioned on the first run), on 127.0.0.1. The tests create the
project, import tasks, post annotations through the REST API exactly as the reviewer's
browser does (a background choice, a reject reason, a brush mask as RLE of the RGBA canvas),
pull, and check backgrounds, statuses and mask pixels. Nothing is skipped: a provisioning
failure fails the suite with its reason.
"""
from __future__ import annotations

import hashlib
import json
import logging
import secrets
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from review_helpers import changed_fields, review_world, square_mask, table_of
from service_fixtures import EMAIL

from curate.cli import main
from curate.review import rle

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow, pytest.mark.timeout(900)]



@pytest.fixture()
def world(ls):
    return review_world(ls.docroot / f"world-{uuid.uuid4().hex[:8]}")


def _media(ls):
    from curate.review.labelstudio import MediaSource

    return MediaSource("local-files", document_root=ls.docroot)


def _push(ls, world, **kwargs: Any):
    from curate.review.labelstudio import push_labelstudio

    return push_labelstudio(world.root, url=ls.url, token=ls.token, media=_media(ls), **kwargs)


def _tasks(ls, project_id: int) -> list[dict[str, Any]]:
    """The project's tasks with their predictions and annotations (what the Data Manager loads)."""
    response = ls.http.get("/api/tasks", params={"project": project_id, "fields": "all", "page_size": 1000})
    response.raise_for_status()
    data = response.json()
    return data["tasks"] if isinstance(data, dict) else data


def _annotate(ls, project_id: int, task: dict[str, Any], result: list[dict[str, Any]], *, cancelled: bool = False) -> None:
    """POST an annotation the way the Label Studio frontend submits one."""
    body = {"result": result, "lead_time": 7.5, "project": project_id, "draft_id": 0, "was_cancelled": cancelled,
            "parent_prediction": (task.get("predictions") or [{}])[0].get("id")}
    response = ls.http.post(f"/api/tasks/{task['id']}/annotations/", params={"project": project_id}, json=body)
    assert response.status_code == 201, response.text


def _choice(name: str, value: str) -> dict[str, Any]:
    return {"id": secrets.token_hex(5), "from_name": name, "to_name": "image", "type": "choices", "origin": "manual",
            "value": {"choices": [value]}}


def _stroke(mask: np.ndarray) -> dict[str, Any]:
    """A brush region as the browser stores it: RLE of the RGBA canvas (label colour, alpha 255)."""
    height, width = mask.shape
    return {"id": secrets.token_hex(5), "from_name": "mask", "to_name": "image", "type": "brushlabels", "origin": "manual",
            "original_width": width, "original_height": height, "image_rotation": 0,
            "value": {"format": "rle", "rle": rle.encode_rgba(mask), "brushlabels": ["animal"]}}


def test_push_creates_project_imports_review_tasks_and_serves_images(ls, world) -> None:
    from curate.review.labelstudio import select_samples

    result = _push(ls, world)
    assert result.created and result.imported > 0
    project = ls.http.get(f"/api/projects/{result.project_id}").json()
    assert project["title"] == f"curate: {world.name}"
    for value in (*world.backgrounds, "reject:label_noise", "reject:clarity", "mask:bad", "BrushLabels"):
        assert value in project["label_config"]
    tasks = {t["data"]["sample_id"]: t for t in _tasks(ls, result.project_id)}
    expected = {r["sample_id"] for r in select_samples(world)}
    assert set(tasks) == expected and len(expected) == result.imported
    rows = {r["sample_id"]: r for r in world.rows()}
    needing = {sid for sid, r in rows.items() if r["status"] == "candidate" or r["background"] is None
               or r["background_source"] == "model"}
    assert needing <= expected
    for sid, task in tasks.items():
        row = rows[sid]
        results = {r["from_name"]: r for r in task["predictions"][0]["result"]} if task["predictions"] else {}
        if row["background"]:
            assert results["background"]["value"]["choices"] == [row["background"]]
        else:
            assert "background" not in results
        if row["mask_path"]:
            brush = results["mask"]
            decoded = rle.decode_mask(brush["value"]["rle"], brush["original_width"], brush["original_height"])
            assert np.array_equal(decoded, (world.load_mask(sid) > 0).astype(np.uint8))
        image = ls.http.get(task["data"]["image"])  # Label Studio serves the folder's image itself
        assert image.status_code == 200 and image.content == world.image_path(row).read_bytes()
    again = _push(ls, world)  # reuses the project, imports nothing twice
    assert (again.project_id, again.created, again.imported) == (result.project_id, False, 0)
    assert len(_tasks(ls, result.project_id)) == len(expected)


def test_round_trip_without_annotations_changes_nothing(ls, world) -> None:
    from curate.review.labelstudio import pull_labelstudio

    digest = hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest()
    changes = len(world.changes())
    _push(ls, world)
    report = pull_labelstudio(world.root, url=ls.url, token=ls.token)
    assert not report.applied and not report.conflicts and not report.problems
    assert hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest() == digest
    assert len(world.changes()) == changes


def test_annotations_come_back_backgrounds_statuses_masks(ls, world) -> None:
    from curate.review.labelstudio import pull_labelstudio

    result = _push(ls, world)
    tasks = {t["data"]["sample_id"]: t for t in _tasks(ls, result.project_id)}
    rows = {r["sample_id"]: r for r in world.rows()}
    candidate = next(s for s in tasks if rows[s]["status"] == "candidate" and rows[s]["background"])
    no_bg = next(s for s in tasks if rows[s]["background"] is None)
    model_bg = next(s for s in tasks if rows[s]["background_source"] == "model")
    other = next(s for s in tasks if s not in (candidate, no_bg, model_bg))
    new_background = next(b for b in world.backgrounds if b != rows[candidate]["background"])
    painted = square_mask(32, 32, 6, 9, 14)
    painted[20:26, 2:5] = 1
    _annotate(ls, result.project_id, tasks[candidate], [
        _choice("background", new_background), _choice("curation", "reject:obscurity"), _stroke(painted)])
    _annotate(ls, result.project_id, tasks[no_bg], [_choice("background", "sky"), _choice("curation", "accept")])
    # the reviewer only confirms the model's pre-label (the prediction was copied into the annotation)
    _annotate(ls, result.project_id, tasks[model_bg], tasks[model_bg]["predictions"][0]["result"])
    _annotate(ls, result.project_id, tasks[other], [_choice("curation", "accept")], cancelled=True)  # skipped
    before = table_of(world.root)
    log_before = len(world.changes())
    report = pull_labelstudio(world.root, url=ls.url, token=ls.token)
    assert not report.conflicts and not report.problems, [str(p) for p in report.problems]
    changed = changed_fields(before, table_of(world.root))
    assert set(changed) == {candidate, no_bg, model_bg}
    assert changed[candidate] == {"status", "reject_reason", "background", "background_source", "background_score",
                                  "mask_path", "mask_status"}
    a, b, c = world.row(candidate), world.row(no_bg), world.row(model_bg)
    assert (a["status"], a["reject_reason"], a["background"], a["background_source"]) == \
        ("rejected", "obscurity", new_background, "human")
    assert np.array_equal(world.load_mask(candidate), painted) and a["mask_status"] == "human"
    assert world.load_mask(candidate).shape == (a["height"], a["width"])
    assert (b["background"], b["background_source"]) == ("sky", "human")
    assert b["status"] == "accepted" and changed[no_bg] == {"background", "background_source"}
    assert c["background"] == rows[model_bg]["background"] and c["background_source"] == "human"
    assert changed[model_bg] == {"background_source", "background_score"}  # confirmed, mask untouched
    records = world.changes()[log_before:]
    assert records and {r["actor"] for r in records} == {f"review.labelstudio:{EMAIL}"}
    digest = hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest()
    assert not pull_labelstudio(world.root, url=ls.url, token=ls.token).applied  # idempotent
    assert hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest() == digest


def test_audit_suspicions_are_preselected_reasons_the_reviewer_confirms_or_clears(ls, world) -> None:
    from curate.review.labelstudio import pull_labelstudio

    confirm, clear = [r for r in world.rows() if r["status"] == "candidate"][:2]
    world.update([confirm["sample_id"], clear["sample_id"]], per_sample={
        r["sample_id"]: {"tags": [*(r["tags"] or []), "suspect:label"]} for r in (confirm, clear)},
        actor="audit:test", reason="suspect pre-tags")
    result = _push(ls, world)
    tasks = {t["data"]["sample_id"]: t for t in _tasks(ls, result.project_id)}
    for row in (confirm, clear):
        task = tasks[row["sample_id"]]
        shown = {r["from_name"]: r["value"]["choices"] for r in task["predictions"][0]["result"] if r["type"] == "choices"}
        assert shown["curation"] == ["reject:label_noise"] and "suspects: label" in task["data"]["suspects"]
    # the reviewer submits the pre-annotation as is (confirms) on one, and clears the reason on the other
    _annotate(ls, result.project_id, tasks[confirm["sample_id"]], tasks[confirm["sample_id"]]["predictions"][0]["result"])
    _annotate(ls, result.project_id, tasks[clear["sample_id"]], [_choice("background", clear["background"])])
    report = pull_labelstudio(world.root, url=ls.url, token=ls.token)
    assert not report.conflicts and not report.problems, [str(p) for p in report.problems]
    a, b = world.row(confirm["sample_id"]), world.row(clear["sample_id"])
    assert (a["status"], a["reject_reason"]) == ("rejected", "label_noise") and "suspect:label" in a["tags"]
    assert b["status"] == "candidate" and b["tags"] == list(clear["tags"] or [])


def test_conflicts_via_the_cli_and_the_token_stays_secret(ls, world, monkeypatch, caplog) -> None:
    monkeypatch.setenv("CURATE_LS_TOKEN", ls.token)
    runner = CliRunner(env={"COLUMNS": "200"})
    common = ["--url", ls.url, "--token-env", "CURATE_LS_TOKEN", "--document-root", str(ls.docroot)]
    with caplog.at_level(logging.DEBUG):
        result = runner.invoke(main, ["review", "labelstudio", str(world.root), *common, "--project", "cli test"])
        assert result.exit_code == 0, result.output
        assert "created project" in result.output
        snapshot = json.loads(next((world.root / ".review").glob("labelstudio-*.json")).read_text())
        project_id = snapshot["target"]["project_id"]
        tasks = {t["data"]["sample_id"]: t for t in _tasks(ls, project_id)}
        sid = next(s for s in tasks if world.row(s)["status"] == "candidate")
        _annotate(ls, project_id, tasks[sid], [_choice("curation", "reject:label_noise")])
        world.update(sid, {"status": "accepted"}, actor="carol", reason="decided in the folder meanwhile")
        pull = ["review", "labelstudio", "pull", str(world.root), "--url", ls.url, "--token-env", "CURATE_LS_TOKEN",
                "--project", "cli test"]
        result = runner.invoke(main, pull)
        assert result.exit_code == 2, result.output
        assert "conflict" in result.output and "reject" in result.output and world.row(sid)["status"] == "accepted"
        result = runner.invoke(main, [*pull, "--on-conflict", "view"])
        assert result.exit_code == 0, result.output
        assert (world.row(sid)["status"], world.row(sid)["reject_reason"]) == ("rejected", "label_noise")
        outputs = result.output
    assert ls.token not in outputs and ls.token not in caplog.text
    for path in world.root.rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            assert ls.token.encode() not in path.read_bytes(), path
    bad = runner.invoke(main, ["review", "labelstudio", str(world.root), "--url", ls.url, "--token-env", "NOPE_TOKEN"])
    assert bad.exit_code == 1 and "NOPE_TOKEN is not set" in bad.output


def test_a_wrong_token_is_a_clear_error_without_the_token(ls, world) -> None:
    from curate.review.labelstudio import push_labelstudio
    from curate.review.sync import ReviewError

    wrong = secrets.token_hex(20)
    with pytest.raises(ReviewError) as info:
        push_labelstudio(world.root, url=ls.url, token=wrong, media=_media(ls))
    assert "401" in str(info.value) or "403" in str(info.value)
    assert wrong not in str(info.value)


def test_inline_media_and_views_selection(ls, world) -> None:
    from curate.review.labelstudio import MediaSource, push_labelstudio

    result = push_labelstudio(world.root, url=ls.url, token=ls.token, project="inline", views=["needs background"],
                              media=MediaSource("inline"))
    tasks = _tasks(ls, result.project_id)
    assert len(tasks) == sum(r["background"] is None for r in world.rows())
    assert all(t["data"]["image"].startswith("data:image/png;base64,") for t in tasks)


def test_repush_refreshes_unannotated_tasks_and_keeps_annotated_ones(ls, world) -> None:
    result = _push(ls, world, project="refresh")
    tasks = {t["data"]["sample_id"]: t for t in _tasks(ls, result.project_id)}
    rows = {r["sample_id"]: r for r in world.rows()}
    plain, annotated = [s for s in tasks if rows[s]["background"]][:2]
    _annotate(ls, result.project_id, tasks[annotated], [_choice("curation", "accept")])
    target = next(b for b in world.backgrounds if b != rows[plain]["background"])
    world.update(plain, {"background": target, "background_source": "human"}, actor="carol")
    again = _push(ls, world, project="refresh")
    assert (again.project_id, again.imported, again.refreshed, again.kept) == (result.project_id, 0, 1, 1)
    task = next(t for t in _tasks(ls, result.project_id) if t["data"]["sample_id"] == plain)
    assert len(task["predictions"]) == 1
    choices = {r["from_name"]: r["value"].get("choices") for r in task["predictions"][0]["result"]}
    assert choices["background"] == [target]


def test_server_is_ours(ls) -> None:
    assert Path(ls.server.data_dir).is_dir() and ls.server.process.poll() is None
