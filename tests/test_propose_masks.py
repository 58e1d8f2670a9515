"""The propose-masks stage with scripted proposers: what is written, what is never overwritten,
bad proposals, an interrupted run, a live run's lock, and the batched mask writes of the store."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.masks.backends.base import Proposal
from curate.masks.sources import mask_counts, mask_source
from curate.runs import MaskRun
from curate.runs.base import RunError
from curate.runs.lock import RunLockedError, lock_path, run_lock
from curate.stages.propose_masks import ProposeMasksSettings, propose_masks
from curate.store import Dataset, DatasetError

SPEC = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=6, image_size=32, seed=5)


class Scripted:
    """A proposer that returns the exact mask of the photo (read from a copy of the world), shifted
    by one pixel, nothing for photos whose id starts with ``nothing``, a wrong-sized array for
    ``wrong``; ``stop_after`` batches then raises KeyboardInterrupt (a user's Ctrl-C)."""

    info = {"backend": "clipseg", "spec": ""}

    def __init__(self, truth: dict[str, np.ndarray], *, nothing=(), wrong=(), stop_after=None, model_id="scripted@1"):
        self.truth, self.nothing, self.wrong = truth, set(nothing), set(wrong)
        self.stop_after, self.batches, self.model_id = stop_after, 0, model_id
        self.seen: list[str] = []

    def propose(self, images, prompts, threshold):
        if self.stop_after is not None and self.batches >= self.stop_after:
            raise KeyboardInterrupt
        self.batches += 1
        out = []
        for image in images:
            sid = image.info["sid"]
            self.seen.append(sid)
            if sid in self.nothing:
                out.append(Proposal(None, 0.1, "nothing above threshold 0.50"))
            elif sid in self.wrong:
                out.append(Proposal(np.ones((5, 7), bool), 0.9))
            else:
                out.append(Proposal(np.roll(self.truth[sid] != 0, 1, axis=1), 0.8))
        return out


@pytest.fixture()
def world(tmp_path):
    root = tmp_path / "world"
    ds = collect_synthetic(root, SPEC)
    truth = {sid: ds.load_mask(sid) for sid in ds.sample_ids()}
    # half the photos lose their exact mask: they are the "unmasked photos" to propose for
    unmasked = ds.sample_ids()[::2]
    ds.set_masks({sid: None for sid in unmasked}, clear_status=True, actor="test")
    return ds, truth, unmasked


def _tag_images(monkeypatch, ds):
    """Let the scripted proposer know which sample an image is (``image.info['sid']``)."""
    original = Dataset.load_image

    def load_image(self, sample_id):
        image = original(self, sample_id)
        image.info["sid"] = sample_id if isinstance(sample_id, str) else self.row(sample_id)["sample_id"]
        return image

    monkeypatch.setattr(Dataset, "load_image", load_image)


def test_proposals_fill_unmasked_photos_and_never_overwrite_exact(world, monkeypatch):
    ds, truth, unmasked = world
    _tag_images(monkeypatch, ds)
    nothing, wrong = unmasked[0], unmasked[1]
    proposer = Scripted(truth, nothing=[nothing], wrong=[wrong])
    record = propose_masks(ds, proposer, ProposeMasksSettings(batch_size=4), run_name="m1")
    ds = Dataset.open(ds.root)
    c = record.counts
    assert c["in_scope"] == len(ds) == 18
    assert c["found"] == 16 and c["nothing_found"] == 1 and c["wrong_size"] == 1
    assert c["applied"] == len(unmasked) - 2 and c["kept_trusted"] == len(ds) - len(unmasked)
    for sid in ds.sample_ids():
        row = ds.row(sid)
        if sid in (nothing, wrong):
            assert row["mask_path"] is None and mask_source(row) is None  # never an empty mask stored
        elif sid in unmasked:
            assert row["mask_status"] == "model:scripted@1" and mask_source(row) == "model"
            extra = json.loads(row["extra"])
            assert extra["mask_score"] == pytest.approx(0.8) and extra["mask_run"] == "m1"
            assert np.array_equal(ds.load_mask(sid) != 0, np.roll(truth[sid] != 0, 1, axis=1))
        else:  # the exact masks are untouched; the proposal is only in the run
            assert row["mask_status"] == "synthetic" and np.array_equal(ds.load_mask(sid), truth[sid])
            assert record.proposal(sid) is not None
    reasons = {r["sample_id"]: r["reason"] for r in record.rows()}
    assert reasons[wrong].startswith("wrong_size") and reasons[nothing].startswith("nothing_found")
    counts = mask_counts(ds.rows())
    assert counts.used == {"human": 0, "exact": 9, "model": 0} and counts.skipped_model == 7
    loaded = MaskRun.load(ds.root / "runs" / "m1")
    assert loaded.model_id == "scripted@1" and loaded.prompt == "a photo of a {}."
    assert not (ds.root / "runs" / "m1" / "parts").exists()
    # a second run only-missing: the two photos still without a mask
    record2 = propose_masks(ds, Scripted(truth, model_id="scripted@2"), ProposeMasksSettings(only_missing=True),
                            run_name="m2")
    assert record2.counts["in_scope"] == 2 and record2.counts["applied"] == 2


def test_rejected_proposals_are_left_alone_unless_retried(world, monkeypatch):
    ds, truth, unmasked = world
    _tag_images(monkeypatch, ds)
    ds.set_mask(unmasked[0], None, mask_status="bad", actor="reviewer")
    record = propose_masks(ds, Scripted(truth), ProposeMasksSettings(), run_name="m")
    assert record.counts["skipped_rejected_proposal"] == 1
    assert Dataset.open(ds.root).row(unmasked[0])["mask_status"] == "bad"
    record = propose_masks(ds, Scripted(truth), ProposeMasksSettings(retry_rejected=True, only_missing=True),
                           run_name="m-retry")
    assert record.counts["applied"] == 1


def test_interrupted_run_keeps_finished_masks_and_resumes(world, monkeypatch):
    ds, truth, unmasked = world
    _tag_images(monkeypatch, ds)
    settings = ProposeMasksSettings(batch_size=4, only_missing=True)
    with pytest.raises(KeyboardInterrupt):
        propose_masks(ds, Scripted(truth, stop_after=1), settings, run_name="r")
    ds = Dataset.open(ds.root)  # the folder is valid and holds the first batch's masks
    first = [sid for sid in unmasked if ds.row(sid)["mask_path"] is not None]
    assert len(first) == 4
    assert not (ds.root / "runs" / "r" / "config.json").exists()
    proposer = Scripted(truth)
    record = propose_masks(ds, proposer, settings, run_name="r")
    assert record.counts["resumed"] == 4 and len(proposer.seen) == len(unmasked) - 4
    assert set(proposer.seen).isdisjoint(first)
    assert record.counts["applied"] == len(unmasked)
    assert sorted(r["sample_id"] for r in record.rows()) == sorted(unmasked)
    # another model under the same unfinished name is refused, not mixed in
    every = ProposeMasksSettings(batch_size=4)
    with pytest.raises(KeyboardInterrupt):
        propose_masks(ds, Scripted(truth, stop_after=1), every, run_name="r2")
    with pytest.raises(FileExistsError, match="another model"):
        propose_masks(ds, Scripted(truth, model_id="other@9"), every, run_name="r2")


def test_a_live_run_is_locked_and_a_second_writer_is_refused_naming_it(world, monkeypatch, tmp_path):
    """Two writers of one --run-name: the second is refused at once, naming the live process (here
    this one, holding the run's lock as a live run does), and touches nothing of the live run; once
    the lock is released the same call resumes the run."""
    from click.testing import CliRunner

    from curate.cli import main

    ds, truth, unmasked = world
    _tag_images(monkeypatch, ds)
    settings = ProposeMasksSettings(batch_size=4, only_missing=True)
    with pytest.raises(KeyboardInterrupt):
        propose_masks(ds, Scripted(truth, stop_after=1), settings, run_name="same")
    run = ds.root / "runs" / "same"
    files = {str(p): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    second = Scripted(truth)
    with run_lock(ds.root, "same", purpose="propose-masks"):
        with pytest.raises(RunLockedError, match=f"being written by process {os.getpid()} "):
            propose_masks(ds, second, settings, run_name="same")
        monkeypatch.chdir(tmp_path)
        result = CliRunner().invoke(main, ["propose-masks", "world", "--model", "clipseg:./no-model-here",
                                           "--only-missing", "--run-name", "same"])
        assert result.exit_code == 1 and f"process {os.getpid()} (propose-masks" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert second.seen == [] and {str(p): p.read_bytes() for p in run.rglob("*") if p.is_file()} == files
    record = propose_masks(ds, Scripted(truth), settings, run_name="same")
    assert record.counts["resumed"] == 4 and record.counts["applied"] == len(unmasked)
    assert not lock_path(ds.root, "same").exists()


def test_a_torn_pending_record_is_called_damaged_and_overwrite_restarts_the_run(world, monkeypatch):
    ds, truth, unmasked = world
    _tag_images(monkeypatch, ds)
    settings = ProposeMasksSettings(batch_size=4, only_missing=True)
    with pytest.raises(KeyboardInterrupt):
        propose_masks(ds, Scripted(truth, stop_after=1), settings, run_name="torn")
    pending = ds.root / "runs" / "torn" / "pending.json"
    pending.write_bytes(pending.read_bytes()[:25])  # a kill while it was written, a full disk
    with pytest.raises(RunError, match="damaged") as refused:
        propose_masks(ds, Scripted(truth), settings, run_name="torn")
    assert "--overwrite" in str(refused.value) and "another model" not in str(refused.value)
    record = propose_masks(ds, Scripted(truth), settings, run_name="torn", overwrite=True)
    assert record.counts["in_scope"] == len(unmasked) - 4 and record.counts["resumed"] == 0
    assert all(Dataset.open(ds.root).row(sid)["mask_status"] == "model:scripted@1" for sid in unmasked)


def test_unreadable_photo_is_counted_not_fatal(world, monkeypatch):
    ds, truth, unmasked = world
    _tag_images(monkeypatch, ds)
    victim = unmasked[2]
    path = ds.image_path(victim)
    path.chmod(0o644)
    path.write_bytes(b"not an image")
    record = propose_masks(ds, Scripted(truth), ProposeMasksSettings(only_missing=True), run_name="m")
    reasons = {r["sample_id"]: r["reason"] for r in record.rows()}
    assert reasons[victim].startswith("image_unreadable") and record.counts["failed"] == 1
    assert record.counts["applied"] == len(unmasked) - 1


def test_bad_settings_are_refused_before_any_work(world):
    ds, truth, _ = world
    with pytest.raises(ValueError, match="threshold"):
        propose_masks(ds, Scripted(truth), ProposeMasksSettings(threshold=1.5))
    with pytest.raises(ValueError, match="no '\\{\\}'"):
        propose_masks(ds, Scripted(truth), ProposeMasksSettings(prompt="a dog"))
    from curate.masks.backends.base import MaskSpecError

    with pytest.raises(MaskSpecError, match="unknown backend"):
        propose_masks(ds, "segformer:/x", ProposeMasksSettings())
    with pytest.raises(MaskSpecError, match="box detector"):
        propose_masks(ds, "sam:/x", ProposeMasksSettings())
    assert not (ds.root / "runs").exists()


def test_set_masks_is_one_commit_and_all_or_nothing(tmp_path):
    ds = collect_synthetic(tmp_path / "w", SPEC)
    ids = ds.sample_ids()[:3]
    before = ds.root.joinpath("samples.parquet").stat().st_mtime_ns
    good = {sid: np.ones((32, 32), np.uint8) for sid in ids}
    with pytest.raises(DatasetError, match="nothing was changed"):
        ds.set_masks({**good, ids[2]: np.ones((31, 32), np.uint8)}, mask_status="model:x", actor="t")
    assert ds.root.joinpath("samples.parquet").stat().st_mtime_ns == before
    assert [ds.row(s)["mask_status"] for s in ids] == ["synthetic"] * 3
    changed = ds.set_masks(good, mask_status="model:x", extra_updates={ids[0]: {"mask_score": 0.5}}, actor="t")
    assert changed == 3
    ds = Dataset.open(ds.root)
    assert all(ds.load_mask(s).all() for s in ids) and json.loads(ds.row(ids[0])["extra"])["mask_score"] == 0.5
    assert len([c for c in ds.changes() if c["actor"] == "t" and c["field"] == "mask_status"]) == 3
    # the replaced files are gone; each row points at a file that exists
    for sid in ids:
        assert (ds.root / ds.row(sid)["mask_path"]).is_file()
    assert len(list((ds.root / "masks").glob(f"{ids[0]}*"))) == 1
    with pytest.raises(DatasetError, match="unknown sample"):
        ds.set_masks({"0" * 16: None}, actor="t")
    shutil.rmtree(ds.root / "runs", ignore_errors=True)


def test_cli_proposes_with_a_real_tiny_clipseg_and_measures(tmp_path, monkeypatch):
    """As a user types it: relative paths and ``~`` in a fresh working directory, a CLIPSeg folder
    loaded through the real transformers path, then ``--measure`` (and ``--json``)."""
    from click.testing import CliRunner

    from curate.cli import main
    from curate.masks.tiny import build_tiny_clipseg

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    collect_synthetic(tmp_path / "world", SPEC)
    build_tiny_clipseg(tmp_path / "models" / "cs", seed=1)
    runner = CliRunner()
    result = runner.invoke(main, ["propose-masks", "world", "--model", "clipseg:~/models/cs", "--threshold", "0.5",
                                  "--run-name", "cs", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "photos got a proposal" in result.output and "propose-masks world --measure --run cs" in result.output
    assert "review fiftyone" not in result.output  # nothing was written for people to verify
    record = MaskRun.load(tmp_path / "world" / "runs" / "cs")
    assert record.model_id.startswith("clipseg:cs@") and record.counts["in_scope"] == 18
    assert record.counts["applied"] == 0  # every photo of this world has an exact mask
    assert record.counts["found"] + record.counts["nothing_found"] == 18
    # nothing in scope (every photo has a mask): no run is written, so the newest run stays the real one
    nothing = runner.invoke(main, ["propose-masks", "world", "--model", "clipseg:~/models/cs", "--only-missing"])
    assert nothing.exit_code == 1 and "nothing to propose" in nothing.output, nothing.output
    assert "18 has mask" in nothing.output and "no run was written" in nothing.output
    assert sorted(p.name for p in (tmp_path / "world" / "runs").iterdir()) == ["cs"]
    measured = runner.invoke(main, ["propose-masks", "world", "--measure", "--json"])
    assert measured.exit_code == 0, measured.output
    data = json.loads(measured.output)
    assert data["measurement"]["truth"]["exact"] == 18 and data["review"]["applied"] == 0
    table = runner.invoke(main, ["propose-masks", "world", "--measure", "--run", "cs"])
    assert table.exit_code == 0 and "centre box" in table.output and "mean IoU" in table.output, table.output
    missing = runner.invoke(main, ["propose-masks", "world", "--model", "clipseg:./models/nothing-here"])
    assert missing.exit_code == 1 and "no model folder" in missing.output.lower(), missing.output
    uncached = runner.invoke(main, ["propose-masks", "world", "--model", "clipseg:CIDAS/clipseg-rd64-refined"])
    assert uncached.exit_code == 1 and "never downloads" in uncached.output, uncached.output
    assert not (tmp_path / "world" / "runs" / "cs-2").exists()


def test_set_masks_status_only_ids_and_unknown_ids_change_nothing_first(tmp_path):
    ds = collect_synthetic(tmp_path / "w", SPEC)
    a, b = ds.sample_ids()[:2]
    # a status for a sample whose mask is not in the call: the status changes, the mask stays
    assert ds.set_masks({a: None}, mask_status={a: "bad", b: "ok"}, actor="t") == 2
    assert ds.row(a)["mask_path"] is None and ds.row(b)["mask_status"] == "ok" and ds.load_mask(b) is not None
    assert ds.set_masks({}, mask_status={b: "reviewed"}, actor="t") == 1
    files = sorted(p.name for p in (ds.root / "masks").iterdir())
    with pytest.raises(DatasetError, match="unknown sample"):
        ds.set_masks({b: np.ones((32, 32), np.uint8)}, mask_status={"f" * 16: "ok"}, actor="t")
    assert sorted(p.name for p in (ds.root / "masks").iterdir()) == files  # no orphan file written


def test_resume_keeps_the_scope_it_started_with_and_overwrite_drops_the_marker_first(world, monkeypatch):
    ds, truth, unmasked = world
    _tag_images(monkeypatch, ds)
    settings = ProposeMasksSettings(batch_size=2, only_missing=True, limit=6)
    with pytest.raises(KeyboardInterrupt):
        propose_masks(ds, Scripted(truth, stop_after=2), settings, run_name="lim")
    proposer = Scripted(truth)
    record = propose_masks(ds, proposer, settings, run_name="lim")
    # the first attempt gave 4 photos masks; the resume proposes the other 2 of the SAME 6
    assert record.counts["in_scope"] == 6 and record.counts["resumed"] == 4 and len(proposer.seen) == 2
    assert record.counts["found"] == 6 and sorted(r["sample_id"] for r in record.rows()) == sorted(unmasked[:6])
    with pytest.raises(ValueError, match="--limit"):
        propose_masks(ds, proposer, ProposeMasksSettings(limit=-1))
    # an interrupted --overwrite of a finished run leaves an unfinished run, not the old record
    with pytest.raises(KeyboardInterrupt):
        propose_masks(ds, Scripted(truth, stop_after=0), ProposeMasksSettings(batch_size=2), run_name="lim",
                      overwrite=True)
    from curate.runs.base import RunError

    with pytest.raises(RunError, match="not a finished run"):
        MaskRun.load(ds.root / "runs" / "lim")


def test_a_reviewers_mask_committed_while_the_model_runs_is_not_overwritten(world, monkeypatch):
    ds, truth, unmasked = world
    _tag_images(monkeypatch, ds)
    victim, moved = unmasked[0], unmasked[1]

    class Meanwhile(Scripted):
        def propose(self, images, prompts, threshold):
            out = super().propose(images, prompts, threshold)
            if self.batches == 1:  # a review pull and a relabel land while the model runs
                other = Dataset.open(ds.root)
                other.set_mask(victim, np.ones((32, 32), np.uint8), mask_status="human", actor="reviewer")
                other.update(moved, {"class_index": other.row(unmasked[2])["class_index"]
                                     if other.row(unmasked[2])["class_index"] != other.row(moved)["class_index"]
                                     else other.row(unmasked[3])["class_index"]}, actor="reviewer")
            return out

    record = propose_masks(ds, Meanwhile(truth), ProposeMasksSettings(batch_size=4, only_missing=True), run_name="m")
    ds = Dataset.open(ds.root)
    assert ds.row(victim)["mask_status"] == "human" and ds.load_mask(victim).all()
    rows = {r["sample_id"]: r for r in record.rows()}
    assert not rows[victim]["applied"] and not rows[moved]["applied"]
    assert rows[moved]["reason"].startswith("changed_since: class")
    assert ds.row(moved)["mask_path"] is None and record.counts["not_applied_changed"] == 1


def test_a_mask_marked_bad_is_replaced_by_a_proposal(world, monkeypatch):
    ds, truth, unmasked = world
    _tag_images(monkeypatch, ds)
    exact = [sid for sid in ds.sample_ids() if sid not in unmasked][0]
    ds.set_mask(exact, truth[exact], mask_status="bad", actor="reviewer")
    record = propose_masks(ds, Scripted(truth), ProposeMasksSettings(), run_name="m")
    assert {r["sample_id"]: r for r in record.rows()}[exact]["applied"]
    assert Dataset.open(ds.root).row(exact)["mask_status"] == "model:scripted@1"


def test_a_run_killed_between_its_part_file_and_the_commit_applies_on_resume(world, monkeypatch):
    """The part file (with the decision) is written before the dataset commit; a run stopped in
    between lists proposals as applied that the folder lacks, and the resume applies them."""
    import curate.stages.propose_masks as stage

    ds, truth, unmasked = world
    _tag_images(monkeypatch, ds)
    real_apply = stage._apply

    def dies(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(stage, "_apply", dies)
    settings = ProposeMasksSettings(batch_size=4, only_missing=True)
    with pytest.raises(KeyboardInterrupt):
        propose_masks(ds, Scripted(truth, stop_after=1), settings, run_name="k")
    assert all(Dataset.open(ds.root).row(sid)["mask_path"] is None for sid in unmasked)
    monkeypatch.setattr(stage, "_apply", real_apply)
    record = propose_masks(ds, Scripted(truth), settings, run_name="k")
    ds = Dataset.open(ds.root)
    assert record.counts["applied"] == len(unmasked) and record.counts["resumed"] == 4
    assert all(ds.row(sid)["mask_status"] == "model:scripted@1" for sid in unmasked)


@pytest.mark.parametrize("run_name", ["x", None])
def test_a_model_that_fails_to_load_leaves_no_runs_folder(world, tmp_path, run_name):
    """Issue 45: ``propose-masks DS --model salient:truncated.onnx#isnet --run-name x`` left an empty
    ``runs/`` in a folder that had none (the run lock made it before the model was loaded)."""
    ds, _, _ = world
    shutil.rmtree(ds.root / "runs", ignore_errors=True)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(b"\x08\x07\x12\x04onnx" + bytes(40))  # the start of an ONNX file, cut short
    with pytest.raises(Exception) as info:
        propose_masks(ds, f"salient:{truncated}#isnet", run_name=run_name)
    assert not isinstance(info.value, (AssertionError, RunLockedError))
    assert not (ds.root / "runs").exists()
    # the lock still works in a folder that has runs/ (it is kept then) and without one
    with run_lock(ds.root, "x"):
        assert lock_path(ds.root, "x").exists()
    assert not (ds.root / "runs").exists()
    (ds.root / "runs").mkdir()
    with run_lock(ds.root, "x"):
        pass
    assert (ds.root / "runs").is_dir()
