"""The explain stage (curate.stages.explain), its run record and ``curate explain``: run folders,
aggregates, saved maps, bad masks, old runs, the demo claim.

The fast tests use a 24-image synthetic world and a tiny CLIP with random seeded weights. The
slow test uses the demo's two trained reference CLIPs (p = 0.9 and uncorrelated; built by
``curate.demo.run_demo``, about 2 minutes, or reused from ``$CURATE_DEMO_WORKDIR``).
"""
from __future__ import annotations

import functools
import json
import logging
import math
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image

from curate.cli import main
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.metrics.spuriousity import spuriousity_scores
from curate.models import load_model
from curate.runs import RunError, list_runs, load_run
from curate.runs.explain import ExplainRun
from curate.saliency import SaliencyError, TopK
from curate.stages.common import load_spec
from curate.stages.explain import ExplainSettings, compute_explanations, explain
from curate.store import Dataset

logger = logging.getLogger(__name__)
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def world_template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("worlds") / "world"
    spec = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=8, image_size=48, seed=3, p=0.9)
    collect_synthetic(root, spec)
    return root


@pytest.fixture()
def world(world_template, tmp_path) -> Path:
    import shutil

    root = tmp_path / "world"
    shutil.copytree(world_template, root)
    return root


@pytest.fixture(scope="module")
def clip():
    return load_model("curate-tiny-rn", seed=0)


def _compute(dataset, model, **settings) -> ExplainRun:
    """In memory, nothing written (what the old ``write=False`` did)."""
    return compute_explanations(dataset, load_spec(model, device="cpu"), ExplainSettings(**settings))


def test_run_folder_tables_and_summary(world, clip) -> None:
    run = explain(world, clip, ExplainSettings(method="gradcam", target="topk:2", label_space="present",
                                               save_maps=True, batch_size=5), run_name="r1")
    folder = world / "runs" / "r1"
    assert run.run_dir == folder and run.name == "r1"
    for name in ("config.json", "predictions.parquet", "images.parquet", "classes.parquet", "summary.json"):
        assert (folder / name).is_file(), name
    predictions = pq.read_table(folder / "predictions.parquet").to_pylist()
    images = pq.read_table(folder / "images.parquet").to_pylist()
    assert len(images) == 24 and len(predictions) == 48
    assert {p["target_rank"] for p in predictions} == {0, 1}
    config = json.loads((folder / "config.json").read_text())
    assert config["kind"] == "explain" and config["record_version"] == ExplainRun.VERSION == 2
    assert config["maps"] == {"saved": True, "dtype": "float32"}
    loaded = ExplainRun.load(folder)
    assert isinstance(load_run(folder), ExplainRun) and list_runs(world, kind="explain") == [folder]
    assert loaded.n_images == 24 and loaded.split == "aligned" and loaded.target == "topk:2"
    assert set(loaded.groups) <= {"aligned", "conflicting"} and loaded.groups
    for part in loaded.groups.values():
        assert 0 <= part.sss.mean <= 1 and part.n + part.n_nan > 0
    assert set(loaded.by_correct) <= {"correct", "wrong"}
    assert loaded.layer == "visual.layer2" and loaded.prompts_name == "simple" and loaded.method == "gradcam"
    assert loaded.model_id == clip.model_id and loaded.family == "clip"
    # a loaded model is named by what it records about itself (curate.stages.common.model_identity)
    assert loaded.model["name"] == "curate-tiny-rn" and loaded.model["passed"] == "loaded"
    assert loaded.model_label == "curate-tiny-rn"
    assert loaded.by_group()["run"] == "r1" and _same_entry(loaded.by_group(), run.by_group())
    # per-image = mean of the image's predictions
    by_image: dict[str, list[float]] = {}
    for p in predictions:
        if not math.isnan(p["sss"]):
            by_image.setdefault(p["sample_id"], []).append(p["sss"])
    for row in images:
        if row["sample_id"] in by_image:
            assert row["sss"] == pytest.approx(np.mean(by_image[row["sample_id"]]))
        assert row["sss_uniform"] == pytest.approx(1 - row["mask_fraction"])
    classes = loaded.classes().to_pylist()
    assert {c["subset"] for c in classes} >= {"all"}
    assert (world / "features").is_dir()  # the text classifier cache
    sample = predictions[0]["sample_id"]
    saved = loaded.saved_maps(sample)
    assert saved.maps.shape == (2, *clip.image_size) and saved.maps.dtype == np.float32
    assert saved.mask.shape == tuple(clip.image_size)
    assert list(saved.targets) == [p["target_index"] for p in predictions if p["sample_id"] == sample]
    assert len(loaded.map_ids()) == 24
    assert "explain" in Dataset.open(world).provenance
    with pytest.raises(FileExistsError):
        explain(world, clip, ExplainSettings(label_space="present"), run_name="r1")


def _same_entry(a: dict, b: dict) -> bool:
    return json.dumps({**a, "run": None, "seconds": None}, sort_keys=True) == \
        json.dumps({**b, "run": None, "seconds": None}, sort_keys=True)


@pytest.mark.parametrize("threshold,mode", [(None, "soft"), (0.3, "soft"), (0.5, "hard")])
def test_saved_maps_reproduce_the_scores_exactly(world, clip, threshold, mode) -> None:
    """issue 14 §5: the saved maps are the float32 arrays the scores came from, so SSS and RMA
    recomputed from them with curate.metrics.spuriousity are the run's values, bit for bit."""
    run = explain(world, clip, ExplainSettings(method="layercam", target=TopK(2), label_space="present",
                                               threshold=threshold, threshold_mode=mode, save_maps=True,
                                               batch_size=7, device="cpu"), run_name="maps")
    run = ExplainRun.load(run.run_dir)
    predictions = run.predictions().to_pylist()
    assert run.map_ids() == sorted({p["sample_id"] for p in predictions})
    assert np.isfinite([p["sss"] for p in predictions]).sum() > 40  # LayerCAM's maps of this model are defined
    half_differs = False
    for sample in run.map_ids():
        saved = run.saved_maps(sample)
        assert saved.maps.dtype == np.float32
        scores = spuriousity_scores(saved.maps, saved.mask, run.threshold, run.threshold_mode)
        rows = sorted((p for p in predictions if p["sample_id"] == sample), key=lambda p: p["target_rank"])
        expected_sss = np.array([p["sss"] for p in rows])
        expected_rma = np.array([p["rma"] for p in rows])
        np.testing.assert_array_equal(scores.sss.numpy(), expected_sss)
        np.testing.assert_array_equal(scores.rma.numpy(), expected_rma)
        half = spuriousity_scores(saved.maps.astype(np.float16), saved.mask, run.threshold, run.threshold_mode)
        half_differs |= not np.array_equal(half.rma.numpy(), expected_rma, equal_nan=True)
        for got, row in zip(scores.reason_names(), rows):  # the pipeline names a flat raw map constant_map
            assert got == row["nan_reason"] or (got, row["nan_reason"]) == ("zero_map", "constant_map")
    assert half_differs  # what version 1 saved (float16) would not have reproduced them


def test_group_column_takes_precedence_and_classes_split(world, clip) -> None:
    ds = Dataset.open(world)
    ids = ds.sample_ids()
    ds.update(ids[:10], {"group": "easy"}, actor="test", reason="split")
    ds.update(ids[10:20], {"group": "hard"}, actor="test", reason="split")
    summary = _compute(world, clip, method="layercam", threshold=0.5, threshold_mode="hard",
                       label_space="present").by_group()
    assert summary["split"] == "group" and list(summary["groups"]) == ["easy", "hard"]
    assert summary["groups"]["easy"]["n"] + summary["groups"]["easy"]["n_nan"] == 10
    for key in ("sss", "rma", "sss_uniform", "sss_balanced", "n_nan", "nan_reasons"):
        assert key in summary["groups"]["hard"]
    assert summary["method"] == "layercam" and summary["nan"] >= 0
    assert not (world / "runs").exists()  # computing in memory writes nothing


def test_damaged_masks_are_handled_and_counted(world, clip, caplog) -> None:
    ds = Dataset.open(world)
    rows = ds.rows()
    masks = [world / r["mask_path"] for r in rows[:4]]
    original = np.array(Image.open(masks[0]))
    Image.fromarray(original[::2, ::2] * 255).save(masks[0])  # half size, same aspect: resized
    Image.fromarray(np.zeros((48, 30), np.uint8)).save(masks[1])  # wrong aspect: skipped
    ids = np.array(Image.open(masks[2])) * 7
    Image.fromarray(ids.astype(np.uint8)).save(masks[2])  # instance ids: union
    masks[3].unlink()  # missing: skipped
    with caplog.at_level(logging.WARNING):
        run = _compute(world, clip, label_space="present")
    assert run.skipped_reasons == {"mask_size_mismatch": 1, "mask_unreadable": 1}
    assert {s["sample_id"] for s in run.skipped_samples} == {rows[1]["sample_id"], rows[3]["sample_id"]}
    assert run.masks == {"non_binary": 2, "resized": 1}  # the 0/255 one and the instance ids
    assert run.n_images == 22
    assert "mask problems" in caplog.text


def test_nan_reasons_reach_the_summary_per_group(world, clip) -> None:
    """issue 14 §4: NaN counts with their reasons, overall and per group."""
    ds = Dataset.open(world)
    rows = ds.rows()
    Image.fromarray(np.zeros((48, 48), np.uint8)).save(world / rows[0]["mask_path"])  # empty mask
    run = _compute(world, clip, label_space="present")
    assert run.nan_reasons.get("empty_mask") == 1
    first = next(p for p in run.predictions().to_pylist() if p["sample_id"] == rows[0]["sample_id"])
    assert first["nan_reason"] == "empty_mask" and math.isnan(first["sss"])
    part = "aligned" if first["aligned"] else "conflicting"
    entry = run.by_group()
    assert entry["nan_reasons"]["empty_mask"] == 1 and entry["nan"] == run.nan_count
    assert entry["groups"][part]["nan_reasons"].get("empty_mask") == 1
    assert entry["groups"][part]["n_nan"] >= 1 and entry["overall"]["n_nan"] >= 1
    assert sum(sum(g["nan_reasons"].values()) for g in entry["groups"].values()) == run.nan_count


def test_version_1_runs_still_load(world, clip) -> None:
    """A run folder written before records (flat config, config repeated in summary.json, no
    per-group NaN reasons) loads as version 1 and reads the same."""
    ds = Dataset.open(world)
    Image.fromarray(np.zeros((48, 48), np.uint8)).save(world / ds.rows()[0]["mask_path"])  # one NaN
    run = explain(world, clip, ExplainSettings(label_space="present"), run_name="new")
    folder = run.run_dir
    config = json.loads((folder / "config.json").read_text())
    old_config = {"kind": "explain", "curate_version": "0.1.0", "dataset": config["dataset"],
                  "model": config["model"]["model_id"], "model_kind": "clip", "method": config["method"],
                  "layer": config["layer"], "target": config["target"], "threshold": None, "threshold_mode": "soft",
                  "label_space": "present", "label_space_name": config["label_space_name"],
                  "num_classes_scored": 3, "prompts": config["prompts"], "normalisation": "...", "batch_size": 32,
                  "device": "cpu", "precision": "fp32", "statuses": ["accepted", "candidate"], "limit": None,
                  "sample_ids": None, "method_options": {}}
    summary = json.loads((folder / "summary.json").read_text())
    del summary["nan"]["by_group"]
    (folder / "config.json").write_text(json.dumps(old_config))
    (folder / "summary.json").write_text(json.dumps({"config": old_config, **summary}))
    old = ExplainRun.load(folder)
    assert old.model_id == clip.model_id and old.family == "clip" and old.settings["batch_size"] == 32
    assert old.maps_saved is False and old.maps_dtype == "float16"
    assert _same_entry(old.by_group(), run.by_group())  # NaN reasons per group counted from the parquet
    assert old.config_dict()["model"]["model_id"] == clip.model_id


def test_unfinished_and_damaged_runs_raise_run_errors(world, clip) -> None:
    run = explain(world, clip, ExplainSettings(label_space="present"), run_name="r")
    (run.run_dir / "summary.json").write_text(json.dumps({"by_group": {"easy": {}}}))
    with pytest.raises(RunError, match="expected shape"):
        ExplainRun.load(run.run_dir)
    (run.run_dir / "summary.json").unlink()
    with pytest.raises(RunError, match="summary.json"):
        ExplainRun.load(run.run_dir)
    (run.run_dir / "config.json").unlink()
    with pytest.raises(RunError, match="not a finished run"):
        ExplainRun.load(run.run_dir)
    with pytest.raises(RunError, match="saved no maps"):
        ExplainRun(config={}, summary={}, run_dir=run.run_dir).saved_maps("x")


def test_settings_are_checked_before_any_work(world) -> None:
    with pytest.raises(SaliencyError, match="unknown saliency method"):
        ExplainSettings(method="saliencymagic")
    with pytest.raises(SaliencyError, match="topk:K"):
        ExplainSettings(target="top")
    with pytest.raises(SaliencyError, match="threshold mode"):
        ExplainSettings(threshold_mode="medium")
    with pytest.raises(SaliencyError, match="label_space"):
        ExplainSettings(label_space="all")
    settings = ExplainSettings(method="Grad-CAM", target="topk:3")
    assert settings.method == "gradcam" and settings.target == TopK(3)
    assert settings.to_config()["target"] == "topk:3"


def test_a_failed_run_leaves_no_folder(world, clip) -> None:
    with pytest.raises(SaliencyError):
        explain(world, clip, ExplainSettings(layer="visual.layer7", save_maps=True), run_name="bad")
    assert not (world / "runs" / "bad").exists()


def test_overwrite_replaces_the_run_and_its_maps(world, clip) -> None:
    explain(world, clip, ExplainSettings(label_space="present", save_maps=True, limit=5), run_name="o")
    run = explain(world, clip, ExplainSettings(label_space="present", limit=3, save_maps=True), run_name="o",
                  overwrite=True)
    assert len(run.map_ids()) == 3 and ExplainRun.load(run.run_dir).n_images == 3


def test_timm_classifier_on_its_own_logits(world) -> None:
    model = load_model("timm:test_resnet", seed=0)
    run = _compute(world, model, method="layercam", target="predicted", label_space="dataset")
    rows = run.predictions().to_pylist()
    assert len(rows) == 24 and all(0 <= r["target_index"] < 1000 for r in rows)
    assert run.layer == "layer4" and run.config["prompts"] is None and run.family == "classifier"
    present = _compute(world, model, target="topk:2", label_space="present")
    classes = {r["class_index"] for r in present.predictions().to_pylist()}
    assert {r["target_index"] for r in present.predictions().to_pylist()} <= classes


def test_classifier_on_a_non_imagenet_space_is_refused(tmp_path) -> None:
    from curate.labels import LabelSpace

    ds = Dataset.create(tmp_path / "custom", name="custom", label_space=LabelSpace("mine", ("a", "b")))
    with pytest.raises(SaliencyError, match="ImageNet-1K"):
        explain(ds, load_model("timm:test_resnet", seed=0))


def test_cli_explain(world) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["explain", str(world), "--model", "curate-tiny-rn", "--method", "layercam",
                                  "--target", "topk:2", "--label-space", "present", "--threshold", "0.3",
                                  "--threshold-mode", "hard", "--run-name", "cli", "--device", "cpu",
                                  "--batch-size", "7", "--workers", "1"])
    assert result.exit_code == 0, result.output
    for text in ("SSS", "aligned", "conflicting", "RMA", "wrote", "NaN maps"):
        assert text in result.output
    run = ExplainRun.load(world / "runs" / "cli")
    assert run.threshold == 0.3 and run.threshold_mode == "hard" and run.method == "layercam"
    assert run.settings["workers"] == 1 and run.model["name"] == "curate-tiny-rn" and run.model["pretrained"] is None
    result = runner.invoke(main, ["explain", str(world), "--model", "curate-tiny-rn", "--pretrained", "none",
                                  "--label-space", "present", "--json", "--run-name", "cli-json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{"):])
    assert data["n_images"] == 24 and data["run"] == "cli-json" and data["config"]["method"] == "gradcam"
    result = runner.invoke(main, ["explain", str(world), "--model", "curate-tiny-rn", "--layer", "visual.layer7",
                                  "--run-name", "bad"])
    assert result.exit_code == 1 and "visual.layer4" in result.output and "layer7" in result.output
    result = runner.invoke(main, ["explain", str(world), "--model", "curate-tiny-rn", "--target", "best"])
    assert result.exit_code == 2 and "topk:K" in result.output
    result = runner.invoke(main, ["explain", str(world), "--pretrained", "none"])
    assert result.exit_code == 2 and "--model NAME" in result.output


# ----------------------------------------------------------------------------- the demo's models
FAST_METHODS = ("gradcam", "gradcam++", "xgradcam", "layercam", "eigencam", "eigengradcam", "fullgrad")


def _welch_t(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    return float((a.mean() - b.mean()) / math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b)))


@functools.cache
def _image_sss(demo_dir: Path, world: str, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-image SSS (true-class target, default layer) and aligned flags on the evaluation world."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = _compute(demo_dir / "world-eval", demo_dir / "models" / f"reference-{world}.pt",
                       method=method, target="true", label_space="present", batch_size=128)
    assert run.n_images == 1200 and run.nan_count < 200, run.nan_reasons
    rows = run.images().to_pylist()
    return np.array([r["sss"] for r in rows], dtype=float), np.array([bool(r["aligned"]) for r in rows])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["layercam", "gradcam++"])
def test_reference_clip_with_the_shortcut_scores_more_spurious(demo_dir, method) -> None:
    """papers/003 §4 on the synthetic world, seen through SSS (true-class target, default layer).

    The CLIP trained with p = 0.9 leans on the background, so more of its saliency mass lies off
    the object than for the CLIP trained without the correlation. Measured (issue note): LayerCAM
    0.566 vs 0.548 (Welch t 4.6), GradCAM++ 0.577 vs 0.551 (t 7.5); GradCAM does not separate
    them (next test).
    """
    shortcut, _ = _image_sss(demo_dir, "p0.9", method)
    plain, _ = _image_sss(demo_dir, "uncorrelated", method)
    t = _welch_t(shortcut, plain)
    logger.warning("%s mean SSS: p=0.9 %.4f, uncorrelated %.4f (Welch t %.1f)", method, np.nanmean(shortcut),
                   np.nanmean(plain), t)
    assert np.nanmean(shortcut) > np.nanmean(plain) + 0.01
    assert t > 3.0, t


@pytest.mark.slow
@pytest.mark.xfail(reason="measured: GradCAM (true class, layer2) gives p=0.9 0.638 vs uncorrelated 0.649 (Welch t "
                          "-1.1): it does not separate the two CLIPs on this world (it did on the world before the "
                          "1-px object outline: 0.670 vs 0.633); papers/004 §5: methods differ. Those numbers are from the "
                          "reference CLIPs before text-only negatives; with the current ones the test still fails "
                          "(make test, 2026-11-22)", strict=False)
def test_gradcam_separates_the_two_reference_clips(demo_dir) -> None:
    shortcut, _ = _image_sss(demo_dir, "p0.9", "gradcam")
    plain, _ = _image_sss(demo_dir, "uncorrelated", "gradcam")
    assert np.nanmean(shortcut) > np.nanmean(plain) + 0.01 and _welch_t(shortcut, plain) > 3.0


@pytest.mark.slow
def test_only_the_shortcut_clip_is_more_spurious_where_its_background_is_planted(demo_dir) -> None:
    """GradCAM: the p=0.9 CLIP's SSS is higher on aligned than on conflicting images; the
    uncorrelated CLIP's is not (measured gaps 0.031 vs 0.000)."""
    shortcut, aligned = _image_sss(demo_dir, "p0.9", "gradcam")
    plain, aligned_plain = _image_sss(demo_dir, "uncorrelated", "gradcam")
    gap = np.nanmean(shortcut[aligned]) - np.nanmean(shortcut[~aligned])
    gap_plain = np.nanmean(plain[aligned_plain]) - np.nanmean(plain[~aligned_plain])
    logger.warning("GradCAM aligned - conflicting SSS: p=0.9 %.4f, uncorrelated %.4f", gap, gap_plain)
    assert gap > gap_plain + 0.01


@pytest.mark.slow
@pytest.mark.xfail(reason="measured the other way round: the p=0.9 CLIP's true-class GradCAM is MORE spurious on "
                          "aligned (easy) images (0.664), where the background is evidence for the true class, than "
                          "on conflicting (hard) ones (0.633), where it is evidence against it and the ReLU drops "
                          "it (see the issue note). Numbers from the reference CLIPs before text-only negatives; the demo's "
                          "current p=0.9 GradCAM gives easy 0.658 vs hard 0.629 on its split, the same direction", strict=False)
def test_shortcut_clip_is_more_spurious_on_hard_images(demo_dir) -> None:
    groups = _compute(demo_dir / "world-eval", demo_dir / "models" / "reference-p0.9.pt", method="gradcam",
                      label_space="present", batch_size=64).by_group()["groups"]
    assert groups["conflicting"]["sss"] > groups["aligned"]["sss"], groups


@pytest.mark.slow
def test_every_fast_method_runs_on_the_demo_models(demo_dir) -> None:
    """Numbers for the issue note (logged); each method must produce defined scores for most images
    (over 3/4) of every 5th evaluation image: 240 of the 1200, 40 per class (issue 42: all 1200 took
    50-90 s for these 14 runs, whose point is that each method runs; the SSS comparisons above use
    all 1200)."""
    ids = tuple(Dataset.open(demo_dir / "world-eval").sample_ids()[::5])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in FAST_METHODS:
            row = {}
            for world in ("p0.9", "uncorrelated"):
                s = _compute(demo_dir / "world-eval", demo_dir / "models" / f"reference-{world}.pt",
                             method=method, label_space="present", batch_size=128, sample_ids=ids).by_group()
                row[world] = s
                assert len(ids) == 240 and s["overall"]["n"] > 0.75 * len(ids), (method, world, s)
            logger.warning("%-12s p0.9 %.3f (aligned %.3f, conflicting %.3f) | uncorrelated %.3f (aligned %.3f, "
                           "conflicting %.3f)", method, row["p0.9"]["overall"]["sss"],
                           row["p0.9"]["groups"]["aligned"]["sss"], row["p0.9"]["groups"]["conflicting"]["sss"],
                           row["uncorrelated"]["overall"]["sss"], row["uncorrelated"]["groups"]["aligned"]["sss"],
                           row["uncorrelated"]["groups"]["conflicting"]["sss"])
