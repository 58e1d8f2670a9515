"""The annotation table of a dataset folder (curate.store.annotations, issue 44): versions,
idempotent re-pulls, deletions, masks, refusals of bad input, validation and kill-safety."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from store_helpers import SIZE, TESTS_DIR, make_dataset

from curate.store import Dataset, check_dataset
from curate.store.annotations import (
    ANNOTATIONS_FILE,
    Annotation,
    AnnotationError,
    current_annotations,
    gold_answers,
    load_annotations,
    safe_name,
    upsert_annotations,
    write_gold,
)


def ann(aid: str, sid: str, who: str, *bgs: str, role: str = "annotator", gold: bool = False) -> Annotation:
    return Annotation(annotation_id=aid, sample_id=sid, annotator=who, backend="simulated", backgrounds=tuple(bgs),
                      role=role, is_gold=gold)


@pytest.fixture()
def ds(tmp_path: Path) -> Dataset:
    return make_dataset(tmp_path / "d", n=3, masks=False)


def test_versions_changes_deletions_and_idempotent_repull(ds):
    a, b, c = ds.sample_ids()
    first = [ann("x:1", a, "alice", "grass"), ann("x:2", b, "alice", "tree", "grass"), ann("x:3", c, "bob")]
    assert upsert_annotations(ds, first, source="x", actor="t").counts == {
        "added": 3, "changed": 0, "deleted": 0, "unchanged": 0}
    size = (ds.root / ANNOTATIONS_FILE).stat().st_size
    log_lines = len(ds.changes())
    again = upsert_annotations(ds, first, source="x", actor="t", present_ids={"x:1", "x:2", "x:3"})
    assert again.counts == {"added": 0, "changed": 0, "deleted": 0, "unchanged": 3}
    assert len(ds.changes()) == log_lines and (ds.root / ANNOTATIONS_FILE).stat().st_size == size
    second = upsert_annotations(ds, [ann("x:1", a, "alice", "snow")], source="x", actor="t", present_ids={"x:1", "x:3"})
    assert second.changed == ["x:1"] and second.deleted == ["x:2"] and second.unchanged == []
    rows = load_annotations(ds)
    assert [(r.annotation_id, r.version, r.state) for r in rows] == [
        ("x:1", 1, "changed"), ("x:2", 1, "deleted"), ("x:3", 1, "current"), ("x:1", 2, "current")]
    current = {r.annotation_id: r for r in current_annotations(ds)}
    assert set(current) == {"x:1", "x:3"} and current["x:1"].backgrounds == ("snow",)
    assert current["x:3"].skipped and current_annotations(ds, include_skipped=False)[0].annotation_id == "x:1"
    outcomes = [r["outcome"] for r in ds.changes() if r.get("op") == "annotation"]
    assert outcomes == ["added", "added", "added", "changed", "deleted"]
    # a deleted annotation that comes back is a new current version
    back = upsert_annotations(ds, [ann("x:2", b, "alice", "tree")], source="x", actor="t")
    assert back.added == ["x:2"] and [r.version for r in load_annotations(ds) if r.annotation_id == "x:2"] == [1, 2]
    assert check_dataset(ds.root) == []


def test_deletions_are_scoped_to_their_source(ds):
    a, b, _ = ds.sample_ids()
    upsert_annotations(ds, [ann("ls:1", a, "alice", "grass")], source="ls", actor="t")
    upsert_annotations(ds, [ann("fo:1", b, "bob", "tree")], source="fo", actor="t")
    assert upsert_annotations(ds, [], source="fo", actor="t", present_ids=set()).deleted == ["fo:1"]
    assert [r.annotation_id for r in current_annotations(ds)] == ["ls:1"]


@pytest.mark.parametrize("bad, expected", [
    (ann("x:9", "", "alice", "lava"), "not in the vocabulary"),
    (ann("x:9", "0" * 16, "alice", "grass"), "unknown sample id"),
    (Annotation("x:9", "SID", "alice", "paper", ("grass",)), "backend 'paper'"),
    (ann("x:9", "SID", "alice", "grass", role="boss"), "role 'boss'"),
    (ann("x:9", "SID", "alice", "grass", "tree", "snow"), "0 to 2 distinct"),
])
def test_bad_input_is_refused_with_the_row_and_nothing_written(ds, bad, expected):
    sid = ds.sample_ids()[0]
    if bad.sample_id in ("", "SID"):
        bad = Annotation(**{**bad.__dict__, "sample_id": sid})
    good = ann("x:1", sid, "bob", "grass")
    with pytest.raises(AnnotationError, match=expected) as info:
        upsert_annotations(ds, [good, bad], source="x", actor="t")
    assert isinstance(info.value, ValueError) and "row 1" in str(info.value) and "nothing was written" in str(info.value)
    assert not (ds.root / ANNOTATIONS_FILE).exists() and ds.changes()[-1].get("op") != "annotation"


def test_same_annotator_twice_on_one_photo_is_refused(ds):
    sid = ds.sample_ids()[0]
    with pytest.raises(AnnotationError, match=r"row 1 .*the same annotator twice on one photo \(also row 0\)"):
        upsert_annotations(ds, [ann("x:1", sid, "alice", "grass"), ann("x:2", sid, "alice", "tree")],
                           source="x", actor="t")
    # an annotator and an adjudicator of the same name are two roles, not a repeat
    upsert_annotations(ds, [ann("x:1", sid, "alice", "grass"), ann("x:2", sid, "alice", "tree", role="adjudicator")],
                       source="x", actor="t")
    with pytest.raises(AnnotationError, match="the same annotation id as row 0"):
        upsert_annotations(ds, [ann("x:3", sid, "carol", "grass"), ann("x:3", sid, "dan", "grass")],
                           source="x", actor="t")


def test_masks_are_stored_per_version_under_a_safe_name(ds):
    sid = ds.sample_ids()[0]
    evil = "labelstudio:../../etc/passwd:7"
    mask = np.zeros((SIZE[1], SIZE[0]), np.uint8)
    mask[2:6, 2:6] = 1
    upsert_annotations(ds, [ann(evil, sid, "alice", "grass")], source="ls", actor="t", masks={evil: mask})
    row = current_annotations(ds)[0]
    assert row.mask == f"annotations/masks/{safe_name(evil)}.v1.png" and "/" not in safe_name(evil)
    assert ".." not in row.mask and (ds.root / row.mask).is_file()
    # the same drawing again: unchanged; a new drawing: a new version with its own file, the old kept
    assert upsert_annotations(ds, [ann(evil, sid, "alice", "grass")], source="ls", actor="t",
                              masks={evil: mask.copy()}).unchanged == [evil]
    mask[8:10, 8:10] = 1
    assert upsert_annotations(ds, [ann(evil, sid, "alice", "grass")], source="ls", actor="t",
                              masks={evil: mask}).changed == [evil]
    files = sorted(p.name for p in (ds.root / "annotations/masks").iterdir())
    assert files == [f"{safe_name(evil)}.v1.png", f"{safe_name(evil)}.v2.png"]
    with pytest.raises(AnnotationError, match="mask is 3x3 but"):
        upsert_annotations(ds, [ann(evil, sid, "alice", "tree")], source="ls", actor="t",
                           masks={evil: np.ones((3, 3), np.uint8)})
    assert check_dataset(ds.root) == []
    (ds.root / current_annotations(ds)[0].mask).unlink()
    assert any("is missing" in p.message for p in check_dataset(ds.root))


def test_gold_answers_are_adjudicator_rows(ds):
    a, b, _ = ds.sample_ids()
    write_gold(ds, {a: "grass", b: ("tree", "grass")}, actor="lead")
    rows = current_annotations(ds)
    assert {r.role for r in rows} == {"adjudicator"} and all(r.is_gold for r in rows)
    assert gold_answers(rows) == {a: ("grass",), b: ("tree", "grass")}
    assert write_gold(ds, {a: "snow"}, actor="lead").changed == [f"gold:{a}"]


def test_validation_names_hand_damage(ds):
    sid = ds.sample_ids()[0]
    upsert_annotations(ds, [ann("x:1", sid, "alice", "grass")], source="x", actor="t")
    path = ds.root / ANNOTATIONS_FILE
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows.append({**rows[0], "state": "current", "backgrounds": ["lava"], "sample_id": "f" * 16, "role": "boss"})
    pq.write_table(table.from_pylist(rows, schema=table.schema), path)
    messages = [p.message for p in check_dataset(ds.root)]
    for text in ("version 1 repeats", "a second 'current' version", "'lava' not in the vocabulary",
                 "unknown sample id", "role 'boss'"):
        assert any(text in m for m in messages), (text, messages)
    pq.write_table(table.drop_columns(["state"]), path)
    assert any("column 'state'" in p.message for p in check_dataset(ds.root))
    path.write_bytes(b"not parquet")
    assert any("cannot be read as parquet" in p.message for p in check_dataset(ds.root))


WRITER = """
import sys, itertools
sys.path.insert(0, {tests!r})
from curate.store import Dataset
from curate.store.annotations import Annotation, upsert_annotations
ds = Dataset.open({root!r})
ids = ds.sample_ids()
print("ready", flush=True)
for n in itertools.count():
    rows = [Annotation(f"k:{{i}}", sid, f"a{{i}}", "simulated", (("grass", "tree", "snow")[(n + i) % 3],))
            for i, sid in enumerate(ids)]
    upsert_annotations(ds, rows, source="k", actor="kill")
"""


def test_a_kill_mid_write_leaves_the_folder_valid_and_the_log_matching(tmp_path):
    ds = make_dataset(tmp_path / "d", n=3, masks=False)
    root = str(ds.root)
    rng = np.random.default_rng(0)
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", WRITER.format(tests=str(TESTS_DIR), root=root)],
                                stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(TESTS_DIR.parent)})
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(float(rng.uniform(0.05, 0.4)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        reopened = Dataset.open(root)  # settles a commit left in flight
        assert [p for p in check_dataset(root) if p.severity == "error"] == []
        rows = load_annotations(reopened)
        logged = [r for r in reopened.changes() if r.get("op") == "annotation"]
        assert len(logged) == len(rows)  # one record per version, no deletions in this writer
        assert [(r["annotation_id"], r["version"]) for r in logged] == sorted(
            ((r.annotation_id, r.version) for r in rows), key=lambda t: (t[1], t[0]))
    assert len(rows) > 3, "the writer never committed twice"
    assert json.loads((Path(root) / "changes.jsonl").read_text().splitlines()[-1])
