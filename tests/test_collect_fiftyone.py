"""`curate collect fiftyone`: a FiftyOne dataset made by FiftyOne's own API (in the private MongoDB the
review suites start) -> the folder -> `review fiftyone` -> the same samples, classes and masks; a
group_by view, masks stored as files (mask_path) and instance masks; bad input (missing dataset,
field, media, labels outside the label space, masks of the wrong size) and a re-run that completes
the job; a SIGKILLed import resumed to the uninterrupted result."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from fake_inat import dataset_signature
from PIL import Image
from service_fixtures import connect_fiftyone
from test_collect_kill import journal_lines

from curate.cli import main
from curate.store import Dataset, check_dataset

pytestmark = [pytest.mark.fiftyone, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
H, W = 24, 32
LABELS = ("ostrich", "goldfish")  # ImageNet-1K names: the default label space resolves them
TARGETS = {1: "ostrich", 2: "goldfish"}  # the segmentation field's mask targets


def _name() -> str:
    return f"src-{uuid.uuid4().hex[:10]}"


def _label(i: int) -> str:
    return LABELS[i % 2]


def object_square(i: int) -> np.ndarray:
    """Sample ``i``'s object: a square that differs per sample (0/1)."""
    mask = np.zeros((H, W), np.uint8)
    mask[2 + i % 5: 12 + i % 5, 3 + i % 7: 15 + i % 7] = 1
    return mask


def segmentation(i: int) -> np.ndarray:
    """Sample ``i``'s semantic mask: its object's target value, plus a strip of the other class."""
    values = object_square(i) * next(v for v, n in TARGETS.items() if n == _label(i))
    values[20:23, :] = next(v for v, n in TARGETS.items() if n != _label(i))
    return values.astype(np.uint8)


def instance_union() -> np.ndarray:
    """What the instance masks of :func:`make_source` give for the sample's label (box [0.25, 0.25, 0.5, 0.5])."""
    mask = np.zeros((H, W), np.uint8)
    mask[6:18, 8:24] = 1
    return mask


def make_source(fo: Any, folder: Path, n: int = 6) -> Any:
    """A persistent FiftyOne dataset made with FiftyOne's API: images on disk, a Classification
    ``animal``, a Segmentation ``seg`` whose masks are PNG files (``mask_path``) with mask targets,
    instance masks ``dets`` (one of the label, one of another), tags, fields ``note`` and ``lic``,
    and two saved views: ``by class`` (a group_by view) and ``ostriches``."""
    folder.mkdir(parents=True, exist_ok=True)
    dataset = fo.Dataset(_name(), persistent=True)
    samples = []
    for i in range(n):
        rng = np.random.default_rng(i)
        path = folder / f"img{i:03d}.png"
        Image.fromarray(rng.integers(0, 255, (H, W, 3), dtype=np.uint8)).save(path)
        mask_path = folder / f"seg{i:03d}.png"
        Image.fromarray(segmentation(i)).save(mask_path)
        ones = np.ones((12, 16), bool)
        dets = [fo.Detection(label=_label(i), bounding_box=[0.25, 0.25, 0.5, 0.5], mask=ones),
                fo.Detection(label="other", bounding_box=[0.0, 0.0, 0.25, 0.25], mask=np.ones((6, 8), bool))]
        samples.append(fo.Sample(filepath=str(path), animal=fo.Classification(label=_label(i)),
                                 seg=fo.Segmentation(mask_path=str(mask_path)), dets=fo.Detections(detections=dets),
                                 tags=[f"batch{i % 3}"], note=f"note {i}", lic="CC-BY 4.0" if i % 2 else None))
    dataset.add_samples(samples, progress=False)
    dataset.mask_targets = {"seg": dict(TARGETS)}
    dataset.save()
    dataset.save_view("by class", dataset.group_by("animal.label"))
    dataset.save_view("ostriches", dataset.match(fo.ViewField("animal.label") == "ostrich"))
    return dataset


def _png(path: str | Path) -> np.ndarray:
    return np.asarray(Image.open(path))


@pytest.fixture(scope="module")
def source(mongo, tmp_path_factory):
    """One FiftyOne dataset for the tests that only read it (made once per module)."""
    connect_fiftyone(mongo.uri)
    from curate.review.fiftyone import import_fiftyone_module

    fo = import_fiftyone_module()
    return make_source(fo, tmp_path_factory.mktemp("fo-media"))


def _originals(dataset: Any) -> dict[str, dict[str, Any]]:
    return {s.id: {"label": s.animal.label, "filepath": s.filepath, "tags": list(s.tags),
                   "index": int(Path(s.filepath).stem[3:])} for s in dataset.iter_samples()}


def test_round_trip_group_view_mask_files_through_review(fo, source, tmp_path) -> None:
    """collect fiftyone (a group_by saved view, Segmentation masks stored as files) -> review fiftyone:
    the same samples, classes and masks; tags, named fields, licences and provenance kept."""
    from curate.review.fiftyone import push_fiftyone

    root = tmp_path / "ds"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, [
        "collect", "fiftyone", source.name, str(root), "--view", "by class", "--mask-field", "seg",
        "--field", "note", "--license-field", "lic", "--license", "cc0", "--attribution", "the zoo"])
    assert result.exit_code == 0, result.output
    assert "6 added" in result.output
    originals = _originals(source)
    ds = Dataset.open(root)
    rows = {r["source_id"]: r for r in ds.rows()}
    assert set(rows) == set(originals)  # every sample of every group, once
    for sid, row in rows.items():
        orig = originals[sid]
        i = orig["index"]
        assert row["source"] == "fiftyone" and row["class_name"] == orig["label"] and row["status"] == "candidate"
        assert row["tags"] == orig["tags"] and row["mask_status"] == "human"
        assert row["license"] == ("cc-by-4.0" if i % 2 else "cc0") and row["attribution"] == "the zoo"
        extra = json.loads(row["extra"])
        assert extra["fiftyone_dataset"] == source.name and extra["fiftyone_view"] == "by class"
        assert extra["fiftyone_sample_id"] == sid and extra["fiftyone_filepath"] == orig["filepath"]
        assert extra["fiftyone_label"] == orig["label"]
        assert extra["fiftyone_fields"] == {"note": f"note {i}"}
        # the object mask: the pixels of the sample's own label, not the other class's strip
        np.testing.assert_array_equal(_png(ds.mask_path(row)), object_square(i))
        assert _png(ds.image_path(row)).tobytes() == _png(orig["filepath"]).tobytes()
        assert not os.path.samefile(ds.image_path(row), orig["filepath"])  # copied unless --link
    assert not check_dataset(root)
    pushed_name = _name()
    push_fiftyone(root, name=pushed_name)
    pushed = fo.load_dataset(pushed_name)
    assert len(pushed) == len(originals)
    for sample in pushed.iter_samples():
        orig = originals[sample.source_id]
        assert sample.ground_truth.label == orig["label"]
        np.testing.assert_array_equal(_png(sample.mask.mask_path), object_square(orig["index"]))
        assert _png(sample.filepath).tobytes() == _png(orig["filepath"]).tobytes()


def test_instance_masks_saved_view_and_label_space_from_the_dataset(source, tmp_path) -> None:
    """Instance masks (Detections): the union of the instances of the sample's label, drawn at the
    image's size, with the mask source the user names; a saved view; the label space of the
    FiftyOne dataset's own classes."""
    from curate.collect import collect_fiftyone

    report = collect_fiftyone(source.name, tmp_path / "ds", view="ostriches", mask_field="dets", mask_source="exact",
                             label_space="fiftyone", link=True)
    assert (report.info["linked"], report.info["copied"]) == (3, 0)
    ds = Dataset.open(tmp_path / "ds")
    originals = _originals(source)
    assert all(os.path.samefile(ds.image_path(r), originals[r["source_id"]]["filepath"]) for r in ds.rows())
    assert not check_dataset(tmp_path / "ds", deep=True)
    assert ds.label_space.names == ("goldfish", "ostrich")  # the dataset's labels, sorted
    rows = ds.rows()
    assert len(rows) == 3 == len(report.added)
    for row in rows:
        assert row["class_name"] == "ostrich" and row["class_index"] == 1 and row["mask_status"] == "exact"
        np.testing.assert_array_equal(_png(ds.mask_path(row)), instance_union())
    # the same command again: nothing new, nothing lost
    again = collect_fiftyone(source.name, tmp_path / "ds", view="ostriches", mask_field="dets", mask_source="exact",
                            label_space="fiftyone")
    assert not again.added and len(Dataset.open(tmp_path / "ds")) == 3


def test_each_image_is_decoded_once(source, tmp_path, monkeypatch) -> None:
    """Pillow opens each sample's image once on its way in (the engine's verification), not again in the
    store (issue 42; the other collectors: tests/test_collect_decodes.py). Masks are other files."""
    from decode_helpers import count_opens, opens_per_stored_image

    from curate.collect import collect_fiftyone

    counts = count_opens(monkeypatch)
    report = collect_fiftyone(source.name, tmp_path / "ds", mask_field="seg", license="cc0")
    monkeypatch.undo()
    opened = opens_per_stored_image(counts, tmp_path / "ds")
    assert len(report.added) == len(opened) == 6 and set(opened.values()) == {1}


def test_bad_requests_are_one_line_errors_that_touch_nothing(source, tmp_path) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    root = tmp_path / "ds"
    cases = [
        (["collect", "fiftyone", "no-such-dataset", str(root)], "no FiftyOne dataset 'no-such-dataset'"),
        (["collect", "fiftyone", source.name, str(root), "--view", "nope"], "no saved view 'nope'"),
        (["collect", "fiftyone", source.name, str(root), "--label-field", "animals"], "no field 'animals'"),
        (["collect", "fiftyone", source.name, str(root), "--label-field", "note"], "is not a Classification"),
        (["collect", "fiftyone", source.name, str(root), "--mask-field", "nope"], "no mask field 'nope'"),
        (["collect", "fiftyone", source.name, str(root), "--field", "colour"], "no field 'colour'"),
        (["collect", "fiftyone", source.name, str(root), "--mask-source", "robot"], "mask source 'robot'"),
    ]
    for args, expected in cases:
        result = runner.invoke(main, args)
        assert result.exit_code == 1, (args, result.output)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], (args, result.output)
        assert not root.exists()  # nothing created


def test_unknown_labels_missing_media_and_wrong_masks_then_a_rerun_completes(fo, tmp_path) -> None:
    """Labels outside the label space: one error naming them (nothing written), or a counted skip;
    a missing media file: a counted skip; a mask of the wrong size: a counted failure, the sample
    not added. Once the data is fixed, the same command adds exactly what was left out."""
    from curate.collect import FiftyOneImportError, collect_fiftyone

    dataset = make_source(fo, tmp_path / "media", n=5)
    samples = list(dataset.iter_samples())
    samples[0].animal.label = "dragon"
    samples[0].save()
    root = tmp_path / "ds"
    with pytest.raises(FiftyOneImportError, match=r"1 label\(s\) of 'animal' are not in the label space.*'dragon'"):
        collect_fiftyone(dataset.name, root, mask_field="seg")
    assert not root.exists()
    moved = Path(samples[1].filepath).rename(tmp_path / "moved.png")
    wrong = tmp_path / "media" / "wrong.png"
    Image.fromarray(np.ones((H + 1, W), np.uint8)).save(wrong)
    good_mask = samples[2].seg.mask_path
    samples[2].seg.mask_path = str(wrong)
    samples[2].save()
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["collect", "fiftyone", dataset.name, str(root),
                                                             "--mask-field", "seg", "--skip-unknown"])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "2 added, 1 failed, 2 skipped" in output and "2 sample(s) left out" in output, output
    assert f"{samples[0].id}: label 'dragon' is not in the label space" in output
    assert f"{samples[1].id}: missing media file {samples[1].filepath}" in output
    assert f"{samples[2].id}|" in output and "wrong_size: the mask is 32x25 but the image is 32x24" in output
    assert {r["source_id"] for r in Dataset.open(root).rows()} == {samples[3].id, samples[4].id}
    assert not check_dataset(root)
    # fix the data: restore the file, give the right mask and a known label; the same command completes it
    moved.rename(samples[1].filepath)
    samples[2].seg.mask_path = good_mask
    samples[2].save()
    samples[0].animal.label = "goldfish"
    samples[0].save()
    again = collect_fiftyone(dataset.name, root, mask_field="seg", skip_unknown=True)
    assert again.totals()["added"] == 3 and not again.failures
    rows = {r["source_id"]: r for r in Dataset.open(root).rows()}
    assert set(rows) == {s.id for s in samples}
    assert rows[samples[0].id]["class_name"] == "goldfish"
    np.testing.assert_array_equal(_png(Dataset.open(root).mask_path(rows[samples[2].id])), object_square(2))
    assert not check_dataset(root)


def _command(name: str, root: Path) -> list[str]:
    return [sys.executable, "-m", "curate.cli", "collect", "fiftyone", name, str(root), "--mask-field", "seg",
            "--field", "note", "--concurrency", "2", "--batch-size", "2"]


def test_sigkill_then_resume_equals_uninterrupted(fo, tmp_path) -> None:
    """A `curate collect fiftyone` process SIGKILLed after some commits, run again: the
    folder equals an uninterrupted import's (rows, masks' paths, media), and it checks clean."""
    from curate.collect import collect_fiftyone

    dataset = make_source(fo, tmp_path / "media", n=24)
    collect_fiftyone(dataset.name, tmp_path / "reference", mask_field="seg", fields=["note"], batch_size=2)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    root = tmp_path / "killed"
    rng = random.Random(7)
    rows_at_kill = None
    for _ in range(3):  # until one kill lands mid-run
        before = journal_lines(root)
        proc = subprocess.Popen(_command(dataset.name, root), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        wanted = before + rng.randint(2, 6)  # after some commits...
        deadline = time.monotonic() + 60
        while proc.poll() is None and journal_lines(root) < wanted and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.05))  # ...plus a random delay (mid-read, mid-commit)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            rows_at_kill = pq.read_metadata(root / "samples.parquet").num_rows
            break
        proc.wait(timeout=30)
    assert rows_at_kill is not None and rows_at_kill < 24, rows_at_kill
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, _command(dataset.name, root)[3:])  # the same command
    assert result.exit_code == 0, result.output
    assert f"{24 - rows_at_kill} added" in result.output
    assert dataset_signature(root) == dataset_signature(tmp_path / "reference")
    assert not check_dataset(root)
    masks = sorted(p.relative_to(root).as_posix() for p in (root / "masks").rglob("*.png"))
    assert masks == sorted(p.relative_to(tmp_path / "reference").as_posix()
                           for p in (tmp_path / "reference" / "masks").rglob("*.png"))
