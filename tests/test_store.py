"""The dataset folder (curate.store): create/open, add, dedup, update + change log, select,
masks, provenance, crash safety (a writer SIGKILLed mid-write), the lock, validation of
hand-damaged folders, path safety, and a property test of add/update sequences."""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import (
    REPO_DIR,
    SIZE,
    TESTS_DIR,
    color_for,
    disk_state,
    make_dataset,
    rewrite_parquet,
    set_cell,
    solid_png,
    toy_space,
)

from curate.store import (
    DEFAULT_BACKGROUNDS,
    SCHEMA,
    SCHEMA_VERSION,
    Dataset,
    DatasetError,
    LockedError,
    NewSample,
    ValidationProblem,
    check_dataset,
    summarize,
)
from curate.store import atomic as atomic_mod


def errors(root: Path) -> list[ValidationProblem]:
    return [p for p in check_dataset(root) if p.severity == "error"]

def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_DIR), str(TESTS_DIR), env.get("PYTHONPATH", "")])
    return env

# --------------------------------------------------------------------------- create / open
def test_create_writes_a_portable_folder(tmp_path: Path) -> None:
    ds = Dataset.create(tmp_path / "ds", name="demo", recipe="counteranimal")
    assert ds.label_space.name == "imagenet1k" and len(ds.label_space) == 1000
    assert ds.backgrounds == list(DEFAULT_BACKGROUNDS)
    assert len(ds) == 0 and ds.root == tmp_path / "ds"
    config = yaml.safe_load((tmp_path / "ds" / "dataset.yaml").read_text())
    assert config["schema_version"] == SCHEMA_VERSION and config["name"] == "demo"
    assert config["recipe"] == "counteranimal" and config["label_space"] == {"name": "imagenet1k"}
    table = pq.read_table(tmp_path / "ds" / "samples.parquet")  # readable without curate
    assert table.schema.metadata[b"curate.schema_version"] == str(SCHEMA_VERSION).encode()
    assert table.schema.remove_metadata().equals(SCHEMA.remove_metadata())
    assert check_dataset(tmp_path / "ds") == []
    reopened = Dataset.open(tmp_path / "ds")
    assert reopened.config["name"] == "demo" and reopened.name == "demo"

def test_default_backgrounds_are_the_recipe_vocabulary() -> None:
    recipe = yaml.safe_load((REPO_DIR / "datasets" / "counteranimal.yaml").read_text())
    assert list(DEFAULT_BACKGROUNDS) == recipe["backgrounds"]

def test_custom_label_space_round_trips(tmp_path: Path) -> None:
    Dataset.create(tmp_path / "ds", name="toy", label_space=toy_space(), backgrounds=["a", "b"])
    ds = Dataset.open(tmp_path / "ds")
    assert ds.label_space.names == ("cat", "dog", "bird") and ds.backgrounds == ["a", "b"]

def test_create_refuses_existing_and_nonempty(tmp_path: Path) -> None:
    make_dataset(tmp_path / "ds", n=1)
    with pytest.raises(DatasetError, match="already holds a dataset"):
        Dataset.create(tmp_path / "ds", name="again")
    assert len(Dataset.create(tmp_path / "ds", name="again", exist_ok=True)) == 1
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file.txt").write_text("x")
    with pytest.raises(DatasetError, match="not an empty folder"):
        Dataset.create(tmp_path / "other", name="x")
    (tmp_path / "empty").mkdir()
    assert len(Dataset.create(tmp_path / "empty", name="x")) == 0
    with pytest.raises(DatasetError, match="repeat"):
        Dataset.create(tmp_path / "dup", name="x", backgrounds=["a", "a"])
    assert not (tmp_path / "dup").exists()

def test_open_a_non_dataset_says_so(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="dataset.yaml is missing"):
        Dataset.open(tmp_path)
    with pytest.raises(DatasetError, match="not a folder"):
        Dataset.open(tmp_path / "nope")

# --------------------------------------------------------------------------- adding, dedup
def test_add_content_addressed_and_dedup(tmp_path: Path) -> None:
    ds = Dataset.create(tmp_path / "ds", name="t", label_space=toy_space())
    image = solid_png((10, 20, 30))
    report = ds.add_samples([NewSample(image=image, class_name="dog", source="folder", source_id="a.png")])
    (sid,) = report.added
    row = ds.row(sid)

    sha = hashlib.sha256(image).hexdigest()
    assert row["sha256"] == sha and sid == sha[:16]
    assert row["filepath"] == f"media/{sha[:2]}/{sha}.png"
    assert ds.image_path(sid).read_bytes() == image  # an RGB PNG is stored verbatim
    assert (row["class_index"], row["class_name"], row["width"], row["height"]) == (1, "dog", 16, 16)
    assert row["status"] == "candidate" and row["tags"] == [] and json.loads(row["extra"]) == {}
    again = ds.add_samples([NewSample(image=image, class_index=2), NewSample(image=solid_png((1, 1, 1))),
                            NewSample(image=solid_png((1, 1, 1)))])
    assert again.duplicates[0] == (sid, "already in the dataset")
    assert len(again.added) == 1 and "same content as item 1" in again.duplicates[1][1]
    assert len(ds) == 2 and ds.row(sid)["class_index"] == 1  # a duplicate does not overwrite
    assert [c["op"] for c in ds.changes()] == ["add", "add"]
    assert errors(ds.root) == []

def test_add_resolves_classes_and_quarantines_bad_fields(tmp_path: Path) -> None:
    ds = Dataset.create(tmp_path / "ds", name="t")  # ImageNet-1K
    report = ds.add_samples([
        NewSample(image=solid_png((1, 0, 0)), class_name="Struthio camelus"),  # a lemma of class 9
        NewSample(image=solid_png((2, 0, 0)), class_index=np.int64(9), class_name="ostrich"),
        NewSample(image=solid_png((3, 0, 0)), class_name="no such animal"),
        NewSample(image=solid_png((4, 0, 0)), class_index=9, class_name="goldfish"),
        NewSample(image=solid_png((5, 0, 0)), class_index=1000),
        NewSample(image=solid_png((6, 0, 0)), status="maybe"),
        NewSample(image=solid_png((7, 0, 0)), group="medium"),
        NewSample(image=solid_png((8, 0, 0)), background_source="alien"),
        NewSample(image=solid_png((9, 0, 0)), extra={"x": object()}),
        NewSample(image=solid_png((10, 0, 0)), class_name="missile"),  # ambiguous in ImageNet
    ])
    assert len(report.added) == 2
    assert [ds.row(s)["class_name"] for s in report.added] == ["ostrich", "ostrich"]
    reasons = [reason.split(":")[0] for _, reason in report.quarantined]
    assert reasons == ["bad_class", "bad_class", "bad_class", "bad_value", "bad_value", "bad_value",
                       "bad_value", "bad_class"]
    assert "did you mean" in report.quarantined[0][1] or "unknown class" in report.quarantined[0][1]
    assert "several classes" in report.quarantined[-1][1]
    assert len(ds.quarantine()) == 8 and errors(ds.root) == []
    with pytest.raises(DatasetError, match="unknown class"):
        ds.add_samples([NewSample(image=solid_png((3, 0, 0)), class_name="no such animal")], strict=True)

def test_commit_every_keeps_earlier_batches(tmp_path: Path) -> None:
    ds = Dataset.create(tmp_path / "ds", name="t", label_space=toy_space())
    items = [NewSample(image=solid_png(color_for(i))) for i in range(5)]
    report = ds.add_samples(items, commit_every=2)
    assert len(report.added) == 5 and len(Dataset.open(ds.root)) == 5

def test_masks_round_trip_and_must_match_size(tmp_path: Path) -> None:
    ds = Dataset.create(tmp_path / "ds", name="t", label_space=toy_space())
    labels = np.zeros((16, 16), np.uint8)
    labels[2:5, 2:5], labels[8:12, 8:12] = 1, 2
    report = ds.add_samples([
        NewSample(image=solid_png((1, 2, 3)), mask=labels, mask_status="synthetic"),
        NewSample(image=solid_png((4, 5, 6)), mask=np.ones((8, 16), bool)),
    ])
    (sid,) = report.added
    assert ds.row(sid)["mask_path"] == f"masks/{sid}.png"
    assert np.array_equal(ds.load_mask(sid), labels) and ds.load_mask(sid).dtype == np.uint8
    assert "bad_mask" in report.quarantined[0][1] and "16x8" in report.quarantined[0][1]
    # replace, then remove, a mask: atomic, old files deleted after the commit
    ds.set_mask(sid, labels * 0 + 1, mask_status="reviewed", actor="alice")
    new_rel = ds.row(sid)["mask_path"]
    assert new_rel != f"masks/{sid}.png" and not (ds.root / f"masks/{sid}.png").exists()
    assert ds.load_mask(sid).sum() == 256 and ds.row(sid)["mask_status"] == "reviewed"
    ds.set_mask(sid, None, actor="alice")
    assert ds.mask_path(sid) is None and ds.load_mask(sid) is None and not (ds.root / new_rel).exists()
    assert errors(ds.root) == []
    with pytest.raises(DatasetError, match="mask"):
        ds.set_mask(sid, np.ones((3, 3)), actor="alice")

# --------------------------------------------------------------------------- update, changes.jsonl
def test_update_logs_only_changed_fields(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", n=3)
    ids = ds.sample_ids()
    n = ds.update(ids, {"status": "accepted", "background": "grass"}, actor="alice", reason="review")
    assert n == 3  # background was already grass: only status changes
    log = ds.changes()
    updates = [c for c in log if c["op"] == "update"]
    assert len(updates) == 3 and {c["field"] for c in updates} == {"status"}
    assert updates[0] | {"time": None} == {"time": None, "actor": "alice", "op": "update", "sample_id": ids[0],
                                             "field": "status", "old": "candidate", "new": "accepted",
                                             "reason": "review"}
    assert ds.update(ids, {"status": "accepted"}, actor="alice") == 0  # no-op: nothing logged
    assert len(ds.changes()) == len(log)
    n = ds.update([ids[0]], {"group": "easy"}, per_sample={ids[1]: {"group": "hard", "class_name": "bird"}},
                  actor="split")
    assert n == 2
    assert (ds.row(ids[0])["group"], ds.row(ids[1])["group"], ds.row(ids[2])["group"]) == ("easy", "hard", None)
    assert (ds.row(ids[1])["class_index"], ds.row(ids[1])["class_name"]) == (2, "bird")
    fields = [(c["sample_id"], c["field"]) for c in ds.changes()[len(log):]]
    assert sorted(fields) == sorted([(ids[0], "group"), (ids[1], "group"), (ids[1], "class_index"),
                                     (ids[1], "class_name")])
    ds.update(ids[2], {"extra": {"note": "blurry"}, "tags": ["x", "y"], "background_score": 0.25},
              actor="bot")
    row = Dataset.open(ds.root).row(ids[2])
    assert json.loads(row["extra"]) == {"note": "blurry"} and row["tags"] == ["x", "y"]
    assert row["background_score"] == pytest.approx(0.25)
    assert next(c for c in ds.changes(ids[2]) if c["field"] == "extra")["new"] == {"note": "blurry"}
    ds.update(ids[2], {"class_index": None}, actor="bot")
    assert ds.row(ids[2])["class_name"] is None

@pytest.mark.parametrize("values, message", [
    ({"background": "lava"}, "not in the vocabulary"),
    ({"status": "maybe"}, "status 'maybe' is not allowed"),
    ({"group": "medium"}, "group 'medium'"),
    ({"background_source": "alien"}, "background_source 'alien'"),
    ({"class_index": 7}, "outside the label space"),
    ({"class_index": 0, "class_name": "dog"}, "make them agree"),
    ({"sha256": "0" * 64}, "cannot be changed"),
    ({"mask_path": None}, "set_mask"),
    ({"colour": "red"}, "unknown column"),
    ({"tags": "notalist"}, "list of non-empty strings"),
    ({"extra": "[1, 2]"}, "expected an object"),
    ({"status": None}, "requires a value"),
])
def test_update_refuses_bad_values_and_changes_nothing(tmp_path: Path, values: dict, message: str) -> None:
    ds = make_dataset(tmp_path / "ds", n=2)
    before = ds.table()
    ids = ds.sample_ids()
    with pytest.raises(DatasetError, match=message):
        ds.update(ids, per_sample={ids[0]: {"status": "accepted"}, ids[1]: values}, actor="x")
    assert Dataset.open(ds.root).table().equals(before)

def test_update_unknown_id_and_actor(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", n=1)
    with pytest.raises(DatasetError, match="unknown sample id"):
        ds.update(["feedfacefeedface"], {"status": "accepted"}, actor="x")
    with pytest.raises(DatasetError, match="actor"):
        ds.update(ds.sample_ids(), {"status": "accepted"}, actor="")

def test_two_handles_see_each_others_commits(tmp_path: Path) -> None:
    first = make_dataset(tmp_path / "ds", n=2)
    second = Dataset.open(tmp_path / "ds")
    a, b = first.sample_ids()
    first.update([a], {"status": "accepted"}, actor="one")
    assert second.row(a)["status"] == "accepted"
    second.update([b], {"status": "rejected"}, actor="two")  # must not clobber the first's commit
    assert [first.row(s)["status"] for s in (a, b)] == ["accepted", "rejected"]
    second.record_provenance("x", {"k": 1})
    assert first.config["provenance"]["x"]["k"] == 1

# --------------------------------------------------------------------------- select, summary, provenance
def test_select_conditions(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", n=4)
    ids = ds.sample_ids()
    ds.update([ids[0]], {"group": "easy", "tags": ["blurry", "small"]}, actor="t")
    ds.update([ids[1]], {"group": "hard", "tags": ["small"]}, actor="t")
    assert ds.select().num_rows == 4
    assert ds.ids(group="easy") == [ids[0]]
    assert ds.ids(group=["easy", "hard"]) == ids[:2]
    assert ds.ids(group=None) == ids[2:]
    assert ds.ids(group=["easy", None]) == [ids[0]] + ids[2:]
    assert ds.ids(class_index=0) == [ids[0], ids[3]]
    assert ds.ids(class_name=lambda n: n.startswith("d")) == [ids[1]]
    assert ds.ids(tags="small") == ids[:2] and ds.ids(tags=["blurry"]) == [ids[0]]
    assert ds.ids(class_index=0, group="easy") == [ids[0]]
    assert ds.ids(status="rejected") == []
    assert ds.rows(group="hard")[0]["sample_id"] == ids[1]
    with pytest.raises(DatasetError, match="unknown column"):
        ds.select(colour="red")

def test_summarize_counts(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", n=4)
    ds.update(ds.sample_ids()[:1], {"group": "easy", "status": "accepted"}, actor="t")
    summary = summarize(ds)
    assert summary["class"] == {"cat": 2, "dog": 1, "bird": 1}
    assert summary["background"] == {"grass": 4}
    assert summary["group"] == {"easy": 1, None: 3}
    assert summary["status"] == {"accepted": 1, "candidate": 3}
    assert summary["license"] == {"cc0": 4}

def test_record_provenance(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", n=1)
    ds.record_provenance("collect", {"source": "inat", "path": tmp_path, "n": np.int64(3), "classes": (9, 10)})
    ds.record_provenance("split", {"min_drop": 5.0})
    provenance = yaml.safe_load((ds.root / "dataset.yaml").read_text())["provenance"]
    assert provenance["collect"]["path"] == str(tmp_path) and provenance["collect"]["n"] == 3
    assert provenance["collect"]["classes"] == [9, 10] and "recorded_at" in provenance["collect"]
    assert provenance["split"]["min_drop"] == 5.0
    with pytest.raises(DatasetError, match="cannot hold"):
        ds.record_provenance("bad", {"x": object()})
    assert Dataset.open(ds.root).provenance.keys() == {"collect", "split"}

# --------------------------------------------------------------------------- crash safety
def test_failed_commit_leaves_the_previous_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = make_dataset(tmp_path / "ds", n=2)
    before = ds.table()

    def broken_replace(src, dst):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(atomic_mod.os, "replace", broken_replace)
    with pytest.raises(OSError, match="simulated"):
        ds.update(ds.sample_ids(), {"status": "accepted"}, actor="x")
    with pytest.raises(OSError, match="simulated"):
        ds.add_samples([NewSample(image=solid_png((9, 9, 9)))])
    monkeypatch.undo()
    assert list((ds.root / ".tmp").iterdir()) == []
    reopened = Dataset.open(ds.root)
    assert reopened.table().equals(before) and errors(ds.root) == []
    assert [c["op"] for c in reopened.changes()] == ["add", "add"]

def test_leftover_temp_files_are_cleaned_by_the_next_writer(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", n=1)
    (ds.root / ".tmp" / "samples.parquet.999.dead.tmp").write_bytes(b"half a parquet")
    assert errors(ds.root) == []
    ds.update(ds.sample_ids(), {"status": "accepted"}, actor="x")
    assert list((ds.root / ".tmp").iterdir()) == []

def test_torn_change_log_line_is_skipped_and_terminated(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", n=1)
    with open(ds.root / "changes.jsonl", "a") as handle:
        handle.write('{"time": "2026-01-01", "actor": "kil')  # a writer died mid-append
    problems = check_dataset(ds.root)
    assert [p.severity for p in problems] == ["warning"] and "changes.jsonl line 2" in str(problems[0])
    Dataset.open(ds.root).update(ds.sample_ids(), {"status": "accepted"}, actor="x")
    assert [c["op"] for c in ds.changes()] == ["add", "update"]

def _read_journal(path: Path) -> list[dict]:
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pass  # the killed writer's torn line
    return records

def test_writer_killed_mid_write_leaves_a_committed_state(tmp_path: Path) -> None:
    """SIGKILL a subprocess that commits in a loop (adds with masks, updates of every row, mask
    replacements, provenance rewrites) at random moments; after each kill the folder opens,
    validates, and equals the state of its last completed commit or of the one in flight."""
    root = tmp_path / "ds"
    make_dataset(root, n=3)
    journal = tmp_path / "journal.jsonl"
    initial = json.loads(json.dumps(disk_state(Dataset.open(root))))
    journal.write_text(json.dumps({"c": 0, "expect": initial}) + "\n" + json.dumps({"c": 0, "done": True}) + "\n")
    rng = random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    commits_seen = 0
    for attempt in range(8):
        proc = subprocess.Popen([sys.executable, str(TESTS_DIR / "store_helpers.py"), str(root), str(journal)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
        try:
            line = proc.stdout.readline()
            assert line.strip() == "ready", f"writer failed to start: {line}{proc.stderr.read()}"
            time.sleep(rng.uniform(0.05, 0.4))
            assert proc.poll() is None, f"writer died on its own: {proc.stderr.read()}"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL
        records = _read_journal(journal)
        expected = {r["c"]: r["expect"] for r in records if "expect" in r}
        done = max(r["c"] for r in records if r.get("done"))
        allowed = [expected[c] for c in expected if c >= done]
        ds = Dataset.open(root)  # validates: raises on any problem
        assert errors(root) == [], f"seed {seed}, attempt {attempt}"
        state = json.loads(json.dumps(disk_state(ds)))
        assert state in allowed, f"seed {seed}, attempt {attempt}: state is not a committed one (done={done})"
        commits_seen = done
    assert commits_seen >= 6, "the writer committed too little to test anything"

def test_lock_contention_fails_fast_naming_the_holder(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root, n=1)
    holder = (
        "import sys, time\n"
        "from curate.store import Dataset\n"
        "ds = Dataset.open(sys.argv[1])\n"
        "with ds.locked('holding for the test'):\n"
        "    print('locked', flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder, str(root)], stdout=subprocess.PIPE, text=True,
                            env=subprocess_env())
    try:
        assert proc.stdout.readline().strip() == "locked"
        ds = Dataset.open(root, lock_timeout=0.3)  # reading needs no lock
        assert len(ds) == 1
        start = time.monotonic()
        with pytest.raises(LockedError) as info:
            ds.update(ds.sample_ids(), {"status": "accepted"}, actor="x")
        assert time.monotonic() - start < 3
        assert str(proc.pid) in str(info.value) and info.value.holder["pid"] == proc.pid
        assert "holding for the test" in str(info.value)
        with pytest.raises(LockedError):
            ds.record_provenance("x", {})
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert Dataset.open(root).update(ds.sample_ids(), {"status": "accepted"}, actor="x") == 1

def test_lock_is_reentrant_across_handles_in_one_thread(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", n=1)
    other = Dataset.open(ds.root, lock_timeout=0.2)
    with ds.locked():
        other.update(other.sample_ids(), {"status": "accepted"}, actor="x")
        ds.record_provenance("x", {"k": 1})
    assert ds.row(ds.sample_ids()[0])["status"] == "accepted"

# --------------------------------------------------------------------------- damaged folders
def _damage_missing_image(root: Path) -> None:
    row = pq.read_table(root / "samples.parquet").to_pylist()[1]
    (root / row["filepath"]).unlink()

def _damage_missing_mask(root: Path) -> None:
    row = pq.read_table(root / "samples.parquet").to_pylist()[2]
    (root / row["mask_path"]).unlink()

def _damage_mask_size(root: Path) -> None:
    from PIL import Image

    row = pq.read_table(root / "samples.parquet").to_pylist()[1]
    Image.new("L", (8, 8)).save(root / row["mask_path"])

def _damage_yaml(key: str, value) -> callable:
    def damage(root: Path) -> None:
        config = yaml.safe_load((root / "dataset.yaml").read_text())
        config[key] = value
        (root / "dataset.yaml").write_text(yaml.safe_dump(config))
    return damage

def _cell(column: str, row: int, value, type_=None) -> callable:
    return lambda root: rewrite_parquet(root, lambda t: set_cell(t, column, row, value, type_))

DAMAGES = {
    "missing image": (_damage_missing_image, 1, "filepath", "image file media/"),
    "missing mask": (_damage_missing_mask, 2, "mask_path", "is missing"),
    "mask size": (_damage_mask_size, 1, "mask_path", "is 8x8 but the image is 16x16"),
    "unknown background": (_cell("background", 2, "lava"), 2, "background",
                           "background 'lava' is not in the vocabulary"),
    "duplicate id": (lambda root: rewrite_parquet(root, lambda t: pa.concat_tables([t, t.slice(0, 1)])), 3,
                     "sample_id", "duplicate sample_id"),
    "class out of range": (_cell("class_index", 0, 5000), 0, "class_index", "outside the label space"),
    "class name mismatch": (_cell("class_name", 0, "dog"), 0, "class_name", "is not the name of class 0"),
    "bad status": (_cell("status", 1, "maybe"), 1, "status", "status 'maybe' is not allowed"),
    "bad group": (_cell("group", 1, "medium"), 1, "group", "group 'medium' is not allowed"),
    "bad background_source": (_cell("background_source", 0, "alien"), 0, "background_source", "'alien'"),
    "null status": (_cell("status", 2, None), 2, "status", "status is null"),
    "extra not json": (_cell("extra", 0, "{oops"), 0, "extra", "not valid JSON"),
    "path traversal": (_cell("filepath", 1, "../../etc/passwd"), 1, "filepath", "escapes the dataset folder"),
    "absolute path": (_cell("filepath", 1, "/etc/passwd"), 1, "filepath", "not a relative POSIX path"),
    "mask outside masks/": (_cell("mask_path", 0, "media/x.png"), 0, "mask_path", "not under masks/"),
    "renamed image": (_cell("filepath", 0, "media/aa/other.png"), 0, "filepath", "does not match its sha256"),
    "id not from hash": (_cell("sample_id", 0, "0123456789abcdef"), 0, "sample_id", "not the start of its sha256"),
    "wrong column type": (lambda root: rewrite_parquet(root, lambda t: t.set_column(
        t.schema.get_field_index("class_index"), "class_index", pc.cast(t.column("class_index"), pa.string()))),
        None, "class_index", "column 'class_index' has type string, expected int32"),
    "int64 width": (lambda root: rewrite_parquet(root, lambda t: t.set_column(
        t.schema.get_field_index("width"), "width", pc.cast(t.column("width"), pa.int64()))),
        None, "width", "column 'width' has type int64, expected int32"),
    "missing column": (lambda root: rewrite_parquet(root, lambda t: t.drop_columns(["status"])), None, "status",
                       "column 'status' (string) is missing"),
    "unknown column": (lambda root: rewrite_parquet(root, lambda t: t.append_column("colour", pa.array(["r"] * 3))),
                       None, "colour", "unknown column 'colour'"),
    "not parquet": (lambda root: (root / "samples.parquet").write_bytes(b"PAR1 garbage"), None, None,
                    "cannot be read as parquet"),
    "no samples file": (lambda root: (root / "samples.parquet").unlink(), None, None, "samples.parquet is missing"),
    "newer schema": (_damage_yaml("schema_version", 99), None, None, "newer than this curate understands"),
    "bad vocabulary": (_damage_yaml("backgrounds", "grass"), None, None, "backgrounds must be a list"),
    "bad label space": (_damage_yaml("label_space", {"name": "x"}), None, None, "label_space is invalid"),
    "yaml not a mapping": (lambda root: (root / "dataset.yaml").write_text("- a\n- b\n"), None, None,
                           "not a mapping"),
}

@pytest.mark.parametrize("kind", list(DAMAGES))
def test_damaged_folder_fails_open_naming_row_and_problem(tmp_path: Path, kind: str) -> None:
    damage, row, column, message = DAMAGES[kind]
    root = tmp_path / "ds"
    make_dataset(root, n=3)
    damage(root)
    problems = errors(root)
    assert any(message in p.message and p.row == row and (column is None or p.column == column)
               for p in problems), [str(p) for p in problems]
    with pytest.raises(DatasetError) as info:
        Dataset.open(root)
    text = str(info.value)
    assert message in text
    if row is not None:
        sid = next(p.sample_id for p in problems if p.row == row and message in p.message)
        assert f"row {row} (sample {sid}): " in text
    assert info.value.problems and all(isinstance(p, ValidationProblem) for p in info.value.problems)

def test_check_dataset_lists_all_problems(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root, n=3)
    _damage_missing_image(root)
    rewrite_parquet(root, lambda t: set_cell(set_cell(t, "background", 2, "lava"), "status", 0, "maybe"))
    problems = check_dataset(root)
    texts = [str(p) for p in problems]
    assert len(problems) == 3, texts
    assert {p.row for p in problems} == {0, 1, 2}
    lava = next(p for p in problems if p.column == "background")
    assert str(lava).startswith(f"row 2 (sample {lava.sample_id}): background 'lava' is not in the vocabulary")

def test_deep_check_notices_modified_image_bytes(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", n=2)
    path = ds.image_path(ds.sample_ids()[0])
    path.write_bytes(solid_png((200, 0, 0), size=(8, 8)))
    assert errors(ds.root) == []
    deep = [str(p) for p in check_dataset(ds.root, deep=True)]
    assert any("does not hash to its sha256" in t for t in deep) and any("8x8" in t for t in deep)
    with pytest.raises(DatasetError):
        Dataset.open(ds.root, deep=True)

def test_deep_check_decodes_every_mask(tmp_path: Path) -> None:
    """A mask PNG cut after an intact header passes the header checks of every open, but no stage can
    read it (intervene and discover skip it as mask_unreadable): ``--deep`` decodes every mask."""
    from click.testing import CliRunner

    from curate.cli import main

    ds = make_dataset(tmp_path / "ds", n=2)
    sid = ds.sample_ids()[1]
    path = ds.mask_path(sid)
    data = path.read_bytes()
    path.write_bytes(data[:data.index(b"IDAT") + 6])  # signature and IHDR intact, the pixels cut
    with pytest.raises(OSError):
        ds.load_mask(sid)  # what the stages read
    assert errors(ds.root) == []  # the cheap check reads headers only
    deep = [p for p in check_dataset(ds.root, deep=True) if p.severity == "error"]
    assert [(p.row, p.column) for p in deep] == [(1, "mask_path")], [str(p) for p in deep]
    assert "does not decode" in deep[0].message and "truncated" in deep[0].message
    result = CliRunner().invoke(main, ["check", str(ds.root), "--deep"])
    assert result.exit_code == 1 and "row 1" in result.output and "does not decode" in result.output, result.output

def test_paths_escaping_the_folder_are_refused(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", n=2)
    outside = tmp_path / "secret.png"
    outside.write_bytes(solid_png((0, 0, 0)))
    rewrite_parquet(ds.root, lambda t: set_cell(t, "filepath", 0, "../secret.png"))
    damaged = Dataset.open(ds.root, validate=False)
    sid = damaged.sample_ids()[0]
    with pytest.raises(DatasetError, match="escapes the dataset folder"):
        damaged.image_path(sid)
    with pytest.raises(DatasetError, match="escapes"):
        damaged.image_path({"filepath": "media/../../secret.png"})
    # a symlink inside media/ that points outside is refused too
    ds2 = make_dataset(tmp_path / "ds2", n=1)
    sid2 = ds2.sample_ids()[0]
    real = ds2.image_path(sid2)
    real.unlink()
    real.symlink_to(outside)
    with pytest.raises(DatasetError, match="resolves outside"):
        ds2.load_image(sid2)

def test_image_and_mask_access(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", n=2)
    sid = ds.sample_ids()[1]
    row = ds.row(sid)
    assert ds.image_path(sid) == ds.image_path(row) == ds.image_path(1) == ds.root / row["filepath"]
    assert ds.mask_path({"sample_id": sid}) == ds.root / row["mask_path"]
    img = ds.load_image(sid)
    assert img.mode == "RGB" and img.size == SIZE and img.getpixel((0, 0)) == color_for(1001)
    assert sid in ds and "nope" not in ds
    with pytest.raises(DatasetError, match="no sample"):
        ds.load_image("nope")

# --------------------------------------------------------------------------- property test
_BGS = ["grass", "water", "sand"]
_update_values = st.fixed_dictionaries({}, optional={
    "status": st.sampled_from(["candidate", "accepted", "rejected"]),
    "background": st.one_of(st.none(), st.sampled_from(_BGS)),
    "group": st.one_of(st.none(), st.sampled_from(["easy", "hard"])),
    "class_index": st.integers(0, 2),
    "tags": st.lists(st.text("abc", min_size=1, max_size=2), max_size=2),
    "extra": st.dictionaries(st.text("xy", min_size=1, max_size=2), st.integers(-3, 3), max_size=2),
    "background_score": st.sampled_from([0.0, 0.5, 1.0]),
})
_ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 5), st.sampled_from(["candidate", "accepted"]),
              st.one_of(st.none(), st.sampled_from(_BGS))),
    st.tuples(st.just("update"), st.integers(0, 50), _update_values),
), min_size=1, max_size=7)

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_add_update_sequences_round_trip(ops: list) -> None:
    names = ["cat", "dog", "bird"]
    with tempfile.TemporaryDirectory() as tmp:
        ds = Dataset.create(Path(tmp) / "ds", name="p", label_space=toy_space(), backgrounds=_BGS)
        model: dict[str, dict] = {}
        expected_changes = 0
        for op in ops:
            if op[0] == "add":
                _, seed, status, background = op
                image = solid_png(color_for(seed))
                report = ds.add_samples([NewSample(image=image, status=status, background=background)])

                sid = hashlib.sha256(image).hexdigest()[:16]
                if sid in model:
                    assert report.duplicates == [(sid, "already in the dataset")]
                else:
                    assert report.added == [sid]
                    model[sid] = {"status": status, "background": background, "group": None,
                                  "class_index": None, "class_name": None, "tags": [], "extra": {},
                                  "background_score": None}
            elif model:
                _, pick, values = op
                sid = sorted(model)[pick % len(model)]
                new = dict(values)
                if "class_index" in new:
                    new["class_name"] = names[new["class_index"]]
                diff = {k: v for k, v in new.items() if model[sid][k] != v}
                changed = ds.update([sid], values, actor="prop")
                assert changed == (1 if diff else 0)
                expected_changes += len(diff)
                model[sid].update(new)
        reopened = Dataset.open(ds.root)
        assert check_dataset(ds.root) == []
        rows = {r["sample_id"]: r for r in reopened.table().to_pylist()}
        assert rows.keys() == model.keys()
        for sid, fields in model.items():
            for key, value in fields.items():
                stored = json.loads(rows[sid][key]) if key == "extra" else rows[sid][key]
                assert stored == value, (sid, key)
        assert sum(1 for c in reopened.changes() if c["op"] == "update") == expected_changes
        assert sum(1 for c in reopened.changes() if c["op"] == "add") == len(model)


def test_dataset_pickles_for_worker_processes(tmp_path: Path) -> None:
    import pickle

    ds = make_dataset(tmp_path / "ds", n=2)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.sample_ids() == ds.sample_ids() and clone.label_space == ds.label_space
    clone.update(clone.sample_ids()[:1], {"status": "accepted"}, actor="worker")
    assert ds.row(ds.sample_ids()[0])["status"] == "accepted"


#: Adds two samples to the dataset at argv[1] with os.replace wrapped to SIGKILL the process just
#: before or just after samples.parquet is replaced (argv[2]: "before" or "after").
_KILL_AROUND_COMMIT = (
    "import os, signal, sys\n"
    "from store_helpers import solid_png\n"
    "from curate.store import Dataset, NewSample\n"
    "real = os.replace\n"
    "def replace(src, dst, *args, **kwargs):\n"
    "    hit = os.path.basename(os.fspath(dst)) == 'samples.parquet'\n"
    "    if hit and sys.argv[2] == 'before':\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n"
    "    real(src, dst, *args, **kwargs)\n"
    "    if hit:\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n"
    "os.replace = replace\n"
    "ds = Dataset.open(sys.argv[1])\n"
    "ds.add_samples([NewSample(image=solid_png((200, i, 1)), class_index=0) for i in range(2)], actor='killed')\n"
)


@pytest.mark.parametrize("moment", ["after", "before"])
def test_change_log_matches_the_rows_after_a_kill_at_the_commit(tmp_path: Path, moment: str) -> None:
    """Issue 45: a kill right after the commit lost the commit's "add" lines for good; now they are
    written as part of the commit (a kill just before it leaves no line for rows that never came)."""
    ds = make_dataset(tmp_path / "ds", n=2)
    proc = subprocess.run([sys.executable, "-c", _KILL_AROUND_COMMIT, str(ds.root), moment], env=subprocess_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    reopened = Dataset.open(ds.root)
    added = [c["sample_id"] for c in reopened.changes() if c["op"] == "add"]
    assert sorted(added) == sorted(reopened.sample_ids())
    assert len(reopened) == (4 if moment == "after" else 2)
    assert not (ds.root / ".curate.changes.pending.json").exists() and errors(ds.root) == []
    reopened.update(reopened.sample_ids()[:1], {"status": "accepted"}, actor="x")
    assert [c["op"] for c in reopened.changes()][-1] == "update"


def test_a_commit_in_flight_is_settled_by_the_next_writer(tmp_path: Path) -> None:
    """When the open could not take the lock, the next writer settles the killed commit first."""
    ds = make_dataset(tmp_path / "ds", n=1)
    subprocess.run([sys.executable, "-c", _KILL_AROUND_COMMIT, str(ds.root), "after"], env=subprocess_env(),
                   capture_output=True, timeout=60, check=False)
    assert (ds.root / ".curate.changes.pending.json").exists()  # as the kill left it
    ds.update(ds.sample_ids()[:1], {"status": "accepted"}, actor="x")  # ds was opened before the kill
    assert [c["op"] for c in ds.changes()] == ["add", "add", "add", "update"]
    assert not (ds.root / ".curate.changes.pending.json").exists()


def test_temporary_files_of_dead_processes_are_removed_on_open(tmp_path: Path) -> None:
    """Issue 45: a kill left ``..curate.filecheck.json.<pid>.<rand>.tmp`` in the folder for good."""
    ds = make_dataset(tmp_path / "ds", n=1)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    pid = int(dead.stdout)
    stale = [ds.root / f"..curate.filecheck.json.{pid}.0badf00d.tmp", ds.root / ".tmp" / f"samples.parquet.{pid}.12345678.tmp"]
    live = ds.root / f"..curate.extracheck.json.{os.getpid()}.abcdef01.tmp"  # a writer still at work
    for path in (*stale, live):
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"{}")
    Dataset.open(ds.root)
    assert not stale[0].exists() and stale[1].exists() and live.exists()  # .tmp/ is the next writer's to clean
    ds.update(ds.sample_ids(), {"status": "accepted"}, actor="x")
    assert not stale[1].exists()
    # the checks' own records go through .tmp/, so a kill mid-write leaves nothing beside the files
    live.unlink()
    (ds.root / ".curate.filecheck.json").unlink(missing_ok=True)
    check_dataset(ds.root)
    assert sorted(p.name for p in ds.root.iterdir() if p.name.endswith(".tmp") and p.is_file()) == []
