"""The review loop without services: annotation/ files, the tag vocabulary, views, the Label
Studio config, brush RLE, the three-way pull engine, lazy imports and the CLI's help."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from click.testing import CliRunner
from review_helpers import RUN, changed_fields, review_world, table_of

from curate.cli import main
from curate.review import rle
from curate.review.sync import (
    Edit,
    Observation,
    Snapshot,
    apply_pull,
    folder_units,
    snapshot_path,
)
from curate.review.views import ViewError, expand_views, find_view, load_views
from curate.review.vocabulary import TagVocabulary, VocabularyError, newest_values
from curate.store import Dataset

BACKGROUNDS = ("snow", "water", "sky")


@pytest.fixture(scope="module")
def vocab() -> TagVocabulary:
    return TagVocabulary.load()


@pytest.fixture()
def world(tmp_path) -> Dataset:
    return review_world(tmp_path / "world")


# ------------------------------------------------------------------------------ vocabulary


def test_vocabulary_has_the_papers_four_reasons_and_documented_prefixes(vocab) -> None:
    assert list(vocab.reasons) == ["label_noise", "feature_noise", "obscurity", "clarity"]
    assert (vocab.accept, vocab.reject_prefix, vocab.background_prefix, vocab.free_prefix) == ("accept", "reject:", "bg:", "tag:")
    assert dict(vocab.mask_tags) == {"mask:ok": "ok", "mask:bad": "bad"}


def test_tags_for_a_row_show_only_human_decisions(vocab) -> None:
    row = {"status": "rejected", "reject_reason": "clarity", "background": "water", "background_source": "human",
           "mask_status": "ok", "tags": ["juvenile"]}
    assert vocab.tags_for(row) == ["reject:clarity", "bg:water", "mask:ok", "tag:juvenile"]
    model = {"status": "candidate", "background": "water", "background_source": "model", "mask_status": "model", "tags": []}
    assert vocab.tags_for(model) == []  # a model's background is a field to confirm, not a decision
    assert vocab.tags_for({"status": "accepted", "tags": []}) == ["accept"]


def test_reading_tags_decides_each_unit_or_reports(vocab) -> None:
    reading = vocab.read(["accept", "bg:water", "mask:bad", "tag:juvenile", "oops"], BACKGROUNDS)
    assert reading.decide("curation") == (True, ("accepted", None), [])
    assert reading.decide("background") == (True, ("water", "human", None), [])
    assert reading.decide("mask") == (True, "bad", [])
    assert reading.decide("free") == (True, ["juvenile"], [])
    assert [p.tag for p in reading.problems["unknown"]] == ["oops"]

    bad = vocab.read(["bg:lava", "reject:blurry", "mask:maybe", "bg:sky", "bg:snow"], BACKGROUNDS)
    ok, _, problems = bad.decide("background")
    assert not ok and any("lava" in str(p) for p in problems) and any("contradicting" in str(p) for p in problems)
    ok, _, problems = bad.decide("curation")
    assert not ok and "blurry" in str(problems[0]) and "label_noise" in str(problems[0])
    assert not bad.decide("mask")[0]
    empty = vocab.read([], BACKGROUNDS)
    assert empty.decide("background") == (True, (None, None, None), [])
    assert empty.decide("curation") == (True, ("candidate", None), [])


def test_tags_added_since_the_push_win_over_the_pushed_ones(vocab) -> None:
    # the formula: a reviewer adds reject:<reason> to a sample pushed with accept -> rejected
    assert newest_values(["accept", "reject:clarity"], [("accepted", None), ("rejected", "clarity")],
                         pushed=["accept"]) == [("rejected", "clarity")]
    assert newest_values(["accept"], [("accepted", None)], pushed=["accept"]) == [("accepted", None)]
    assert newest_values(["accept", "reject:clarity"], ["a", "r"], pushed=["accept", "reject:clarity"]) == ["a", "r"]
    reading = vocab.read(["accept", "reject:label_noise", "bg:water", "bg:sky", "mask:ok", "mask:bad"], BACKGROUNDS)
    assert reading.decide("curation", pushed=["accept"]) == (True, ("rejected", "label_noise"), [])
    assert reading.decide("curation", pushed=["reject:label_noise"]) == (True, ("accepted", None), [])
    assert reading.decide("background", pushed=["bg:water"]) == (True, ("sky", "human", None), [])
    assert reading.decide("mask", pushed=["mask:ok"]) == (True, "bad", [])
    assert reading.tag_of("curation", ("rejected", "label_noise")) == "reject:label_noise"
    # a genuine ambiguity: both decisions added since the push (or nothing pushed to tell them apart)
    for pushed in ([], None):
        ok, value, problems = reading.decide("curation", pushed=pushed)
        assert not ok and value is None and "contradicting curation tags" in str(problems[0])
    both = vocab.read(["accept", "reject:clarity", "reject:obscurity"], BACKGROUNDS)
    ok, _, problems = both.decide("curation", pushed=["accept"])
    assert not ok and len(problems) == 1 and "added since the push" in problems[0].why
    assert problems[0].tag == "reject:clarity, reject:obscurity"
    # an unreadable new tag is still reported, never guessed around
    typo = vocab.read(["accept", "reject:blurry"], BACKGROUNDS)
    ok, _, problems = typo.decide("curation", pushed=["accept"])
    assert not ok and "blurry" in str(problems[0])


def test_fiftyone_observation_lets_the_added_reject_tag_win(world, vocab) -> None:
    # the FiftyOne reader's formula without MongoDB: one record as the App stores it vs the push
    from curate.review.fiftyone import _observe_one, view_units

    row = world.rows()[1]  # accepted, pushed with the tag accept
    assert row["status"] == "accepted"
    pushed = view_units(row, vocab.tags_for(row), vocab, None)
    record = {"sample_id": row["sample_id"], "ground_truth.label": row["class_name"],
              "ground_truth.class_index": row["class_index"], "background.label": row["background"],
              "background.confidence": row["background_score"], "background_source": row["background_source"],
              "status": row["status"], "reject_reason": row["reject_reason"], "mask.mask_path": None,
              "mask_status": row["mask_status"], "group": row["group"], "license": row["license"],
              "attribution": row["attribution"]}
    obs = _observe_one(world, {**record, "tags": ["accept", "reject:label_noise"]}, pushed, None, vocab)
    assert not obs.problems and obs.edits["curation"].value == ("rejected", "label_noise")
    obs = _observe_one(world, {**record, "tags": ["accept", "reject:label_noise", "reject:clarity"]}, pushed, None, vocab)
    assert "curation" not in obs.edits and "contradicting curation tags, all added since the push" in str(obs.problems[0])
    snap = _snapshot(world)
    obs = _observe_one(world, {**record, "tags": ["accept", "reject:label_noise"]}, pushed, None, vocab)
    report = apply_pull(world, snap, [obs], backend="test", target="t", actor="bob")
    assert not report.problems and [c.unit for c in report.applied] == ["curation"]
    assert (world.row(row["sample_id"])["status"], world.row(row["sample_id"])["reject_reason"]) == ("rejected", "label_noise")


def test_labelstudio_observation_uses_the_same_rule(world, vocab) -> None:
    from curate.review.labelstudio import observe_task, pushed_values

    row = world.rows()[1]
    view, _, _ = pushed_values(world, row, vocab)
    assert view["curation"] == "accept"
    entry = {"folder": folder_units(world, row), "view": view}

    def task(*choices: str) -> dict:
        result = [{"type": "choices", "from_name": "curation", "value": {"choices": list(choices)}}]
        return {"id": 1, "data": {"sample_id": row["sample_id"]}, "annotations": [{"id": 7, "result": result}]}

    obs = observe_task(world, task("accept", "reject:obscurity"), entry, vocab)
    assert not obs.problems and obs.edits["curation"].value == ["rejected", "obscurity"]
    assert obs.view["curation"] == "reject:obscurity"
    obs = observe_task(world, task("reject:clarity", "reject:obscurity"), entry, vocab)
    assert "curation" not in obs.edits and "added since the push" in str(obs.problems[0])


def test_a_malformed_vocabulary_file_says_which_key(tmp_path) -> None:
    path = tmp_path / "tags.yaml"
    path.write_text("curation: {accept: accept}\n")
    with pytest.raises(VocabularyError, match="missing or malformed key"):
        TagVocabulary.load(path)


# ------------------------------------------------------------------------------ views


def test_views_are_the_review_tasks_and_match_rows(world) -> None:
    views = load_views()
    names = [v.name for v in views]
    for name in ("needs background", "low-confidence background pre-labels", "masks to review", "curation: candidates",
                 "rejected", "easy", "hard", "wrong on hard ({run})"):
        assert name in names
    expanded = expand_views(views, [RUN])
    wrong = find_view(expanded, f"wrong on hard ({RUN})")
    assert wrong.run == RUN and wrong.conditions[-1].column == f"correct@{RUN}"
    rows = world.rows()
    count = lambda name: sum(find_view(expanded, name).matches(r) for r in rows)
    assert count("needs background") == 3
    assert count("low-confidence background pre-labels") == 4  # 3 below 0.5 + 1 tagged review:background
    assert count("masks to review") == 0  # mask_status model is a proposal: it is in "masks to verify"
    assert count("masks to verify") == 3
    assert count("curation: candidates") == 3
    assert count("rejected") == 0
    assert count("easy") + count("hard") == len(rows)
    with pytest.raises(ViewError, match="no view"):
        find_view(expanded, "nope")


def test_a_bad_view_definition_is_refused_with_its_name(tmp_path) -> None:
    path = tmp_path / "views.yaml"
    path.write_text("views:\n  - name: broken\n    match: {colour: red}\n")
    with pytest.raises(ViewError, match="broken.*colour"):
        load_views(path)
    path.write_text("views:\n  - name: broken\n    match: {status: {like: x}}\n")
    with pytest.raises(ViewError, match="unknown operator"):
        load_views(path)


# ------------------------------------------------------------------------------ Label Studio config


def test_labelstudio_config_lists_backgrounds_reasons_and_brush(world, vocab) -> None:
    from curate.review.labelstudio import labelstudio_config

    xml = labelstudio_config(world, vocab)
    root = ET.fromstring(xml)
    choices = {c.get("name"): [x.get("value") for x in c.iter("Choice")] for c in root.iter("Choices")}
    assert choices["background"] == world.backgrounds
    assert choices["curation"] == ["accept", "reject:label_noise", "reject:feature_noise", "reject:obscurity", "reject:clarity"]
    assert choices["mask_review"] == ["mask:ok", "mask:bad"]
    brush = next(root.iter("BrushLabels"))
    assert brush.get("name") == "mask" and brush.get("toName") == "image"
    assert [label.get("value") for label in brush.iter("Label")] == ["animal"]


# ------------------------------------------------------------------------------ RLE


def test_rle_matches_label_studio_sdk_both_ways() -> None:
    from label_studio_sdk.converter import (
        brush,  # the SDK is part of curate[labelstudio]
    )
    rng = np.random.default_rng(0)
    mask = np.zeros((37, 53), np.uint8)
    mask[5:30, 10:45] = 1
    mask[rng.random(mask.shape) < 0.05] = 1
    ours = rle.encode_mask(mask)
    assert ours == brush.mask2rle(mask * 255)  # byte-identical to the SDK's encoder
    assert np.array_equal(rle.decode_mask(brush.mask2rle(mask * 255), 53, 37), mask)
    browser = rle.encode_rgba(mask)  # coloured strokes, literal-heavy
    assert np.array_equal(brush.decode_rle(browser), rle.decode(browser))
    assert np.array_equal(rle.decode_mask(browser, 53, 37), mask)
    values = rng.integers(0, 256, 70_000).astype(np.uint8)
    values[100:70_000] = 7  # a run longer than 2**16
    assert np.array_equal(rle.decode(rle.encode(values)), values)
    with pytest.raises(rle.RLEError, match="needs"):
        rle.decode_mask(ours, 10, 10)
    with pytest.raises(rle.RLEError):
        rle.decode(ours[: len(ours) // 2])


# ------------------------------------------------------------------------------ the pull engine


def _snapshot(ds: Dataset) -> Snapshot:
    snap = Snapshot(backend="test", target={"name": "t"}, path=snapshot_path(ds.root, "test", "t"))
    for row in ds.rows():
        snap.samples[row["sample_id"]] = {"folder": folder_units(ds, row), "view": {}}
    snap.save(ds)
    return snap


def test_pull_applies_only_edited_units_and_logs_them(world) -> None:
    snap = _snapshot(world)
    ids = world.sample_ids()
    before = table_of(world.root)
    log_before = len(world.changes())
    mask = np.zeros((32, 32), np.uint8)
    mask[4:12, 4:12] = 1
    observations = [
        Observation(ids[0], edits={"curation": Edit("curation", ["rejected", "clarity"], "tag"),
                                   "background": Edit("background", ["water", "human", None], "tag")}),
        Observation(ids[1], edits={"mask": Edit("mask", mask, "brush", actor="alice", mask_status="human")}),
        Observation(ids[2]),
    ]
    report = apply_pull(world, snap, observations, backend="test", target="t", actor="bob")
    assert len(report.applied) == 3 and not report.conflicts and not report.problems
    changed = changed_fields(before, table_of(world.root))
    assert changed[ids[0]] == {"status", "reject_reason", "background", "background_source", "background_score"}
    assert changed[ids[1]] == {"mask_path", "mask_status"}
    assert set(changed) == {ids[0], ids[1]}
    assert np.array_equal(world.load_mask(ids[1]), mask)
    records = world.changes()[log_before:]
    assert {r["actor"] for r in records} == {"bob", "alice"}
    assert all(r["reason"].startswith("review pull from test") for r in records)
    again = apply_pull(world, Snapshot.load(snap.path), observations, backend="test", target="t", actor="bob")
    assert not again.applied and len(world.changes()) == len(records) + log_before  # idempotent


def test_pull_reports_a_conflict_and_resolves_it_on_request(world) -> None:
    snap = _snapshot(world)
    sid = world.sample_ids()[0]
    world.update(sid, {"background": "sky", "background_source": "human"}, actor="carol")  # after the push
    edit = lambda: [Observation(sid, edits={"background": Edit("background", ["water", "human", None], "tag")})]
    report = apply_pull(world, snap, edit(), backend="test", target="t", actor="bob")
    assert len(report.unresolved) == 1 and not report.applied
    conflict = report.unresolved[0]
    assert conflict.folder[0] == "sky" and conflict.view == ["water", "human", None]
    assert world.row(sid)["background"] == "sky"
    report = apply_pull(world, Snapshot.load(snap.path), edit(), backend="test", target="t", actor="bob",
                        on_conflict="folder")
    assert report.conflicts[0].resolution == "folder" and world.row(sid)["background"] == "sky"
    assert not apply_pull(world, Snapshot.load(snap.path), edit(), backend="test", target="t", actor="bob").conflicts
    world.update(sid, {"background": "snow"}, actor="carol")
    report = apply_pull(world, Snapshot.load(snap.path), edit(), backend="test", target="t", actor="bob", on_conflict="view")
    assert report.conflicts[0].resolution == "view" and world.row(sid)["background"] == "water"


def test_pull_refuses_values_outside_the_vocabulary_without_writing(world) -> None:
    snap = _snapshot(world)
    sid = world.sample_ids()[0]
    before = table_of(world.root)
    report = apply_pull(world, snap, [Observation(sid, edits={"background": Edit("background", ["lava", "human", None], "f")})],
                        backend="test", target="t", actor="bob")
    assert not report.applied and "lava" in str(report.problems[0])
    assert table_of(world.root) == before


# ------------------------------------------------------------------------------ imports, CLI, services


def test_importing_review_loads_neither_fiftyone_nor_the_sdk() -> None:
    code = ("import sys, curate.cli, curate.review, curate.review.fiftyone, curate.review.labelstudio, "
            "curate.review.database, curate.review.provision, curate.review.browser, curate.review.sync; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('fiftyone', 'label_studio_sdk', 'pymongo')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cli_review_help_and_tags(world) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["review", "--help"])
    assert result.exit_code == 0
    for verb in ("fiftyone", "pull", "labelstudio", "tags", "db", "serve-media"):
        assert verb in result.output
    result = runner.invoke(main, ["review", "tags", str(world.root)])
    assert result.exit_code == 0, result.output
    for tag in ("reject:obscurity", "bg:snow", "mask:bad", "tag:<word>", "guideline.md"):
        assert tag in result.output


def test_labelstudio_token_comes_only_from_the_environment(world, monkeypatch) -> None:
    from curate.review.labelstudio import token_from_env

    monkeypatch.delenv("CURATE_TEST_TOKEN", raising=False)
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["review", "labelstudio", str(world.root), "--url", "http://127.0.0.1:9",
                                  "--token-env", "CURATE_TEST_TOKEN"])
    assert result.exit_code == 1 and "CURATE_TEST_TOKEN is not set" in result.output
    with pytest.raises(Exception, match="name"):
        token_from_env("not a variable name!")
    monkeypatch.setenv("CURATE_TEST_TOKEN", "  sekret  ")
    assert token_from_env("CURATE_TEST_TOKEN") == "sekret"


def test_a_missing_browser_names_the_packages(monkeypatch) -> None:
    from curate.review import provision

    monkeypatch.setenv("CURATE_CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(provision.ServiceError, match="apt-get install -y --no-install-recommends chromium fonts-liberation"):
        provision.ensure_chromium(install=False)


def test_media_server_serves_only_media_and_masks(world) -> None:
    import threading
    import urllib.error
    import urllib.request

    from curate.review.labelstudio import media_server

    server = media_server(world.root, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        row = world.rows()[0]
        with urllib.request.urlopen(f"{base}/{row['filepath']}") as response:
            assert response.read() == world.image_path(row).read_bytes()
            assert response.headers["Access-Control-Allow-Origin"] == "*"
        for forbidden in ("/samples.parquet", "/dataset.yaml", "/media/", "/media/../dataset.yaml"):
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(base + forbidden)
    finally:
        server.shutdown()
        server.server_close()


def test_media_server_logs_a_dropped_connection_without_a_traceback(world, capfd, caplog) -> None:
    """A browser that closes its tab resets its connections mid-request: socketserver's default printed
    a ConnectionResetError traceback on the user's terminal (seen in a CI log from a stand-in server)."""
    import logging
    import socket
    import struct
    import threading
    import time

    from curate.review.labelstudio import media_server

    server = media_server(world.root, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    caplog.set_level(logging.DEBUG, logger="curate.review.labelstudio")
    try:
        client = socket.create_connection(("127.0.0.1", server.server_address[1]))
        client.sendall(b"GET /media/")  # half a request line, then a reset (RST, not FIN)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        deadline = time.monotonic() + 10
        while "dropped the connection" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.shutdown()
        server.server_close()
    assert "dropped the connection (" in caplog.text and "Connection reset" in caplog.text
    assert "Traceback" not in capfd.readouterr().err


def test_snapshot_is_plain_json_without_secrets(world) -> None:
    snap = _snapshot(world)
    data = json.loads(snap.path.read_text())
    assert data["version"] == 1 and set(data["samples"]) == set(world.sample_ids())
    assert snap.path.parent.name == ".review" and snap.path.parent.parent == world.root
    assert os.path.getsize(snap.path) > 0
