"""curate.saliency.explain_dataset and ``curate explain``: run folders, aggregates, bad masks, the demo claim.

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
from curate.metrics.spuriousity import rma
from curate.models import load_model
from curate.saliency import SaliencyError, explain_dataset, summarize_by_group
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


def test_run_folder_tables_and_summary(world, clip) -> None:
    result = explain_dataset(world, clip, method="gradcam", target="topk:2", label_space="present",
                             run_name="r1", save_maps=True, batch_size=5)
    run = world / "runs" / "r1"
    assert result.run_dir == run
    for name in ("config.json", "predictions.parquet", "images.parquet", "classes.parquet", "summary.json"):
        assert (run / name).is_file(), name
    predictions = pq.read_table(run / "predictions.parquet").to_pylist()
    images = pq.read_table(run / "images.parquet").to_pylist()
    assert len(images) == 24 and len(predictions) == 48
    assert {p["target_rank"] for p in predictions} == {0, 1}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["n_images"] == 24 and summary["split"] == "aligned"
    assert set(summary["by_group"]) <= {"aligned", "conflicting"} and summary["by_group"]
    for part in summary["by_group"].values():
        assert 0 <= part["sss"]["mean"] <= 1 and part["sss"]["n"] + part["sss"]["n_nan"] > 0
    assert set(summary["by_correct"]) <= {"correct", "wrong"}
    assert summary["config"]["layer"] == "visual.layer2" and summary["config"]["target"] == "topk:2"
    assert summary["config"]["prompts"]["name"] == "simple"
    # per-image = mean of the image's predictions
    by_image: dict[str, list[float]] = {}
    for p in predictions:
        if not math.isnan(p["sss"]):
            by_image.setdefault(p["sample_id"], []).append(p["sss"])
    for row in images:
        if row["sample_id"] in by_image:
            assert row["sss"] == pytest.approx(np.mean(by_image[row["sample_id"]]))
        assert row["sss_uniform"] == pytest.approx(1 - row["mask_fraction"])
    classes = pq.read_table(run / "classes.parquet").to_pylist()
    assert {c["subset"] for c in classes} >= {"all"}
    assert (world / "features").is_dir()  # the text classifier cache
    # saved maps reproduce the scores
    sample = predictions[0]["sample_id"]
    saved = np.load(run / "maps" / f"{sample}.npz")
    assert saved["maps"].shape == (2, *clip.image_size) and saved["mask"].shape == tuple(clip.image_size)
    expected = [p["rma"] for p in predictions if p["sample_id"] == sample]
    got = rma(saved["maps"].astype(np.float64), np.broadcast_to(saved["mask"], saved["maps"].shape))
    np.testing.assert_allclose(got, expected, atol=2e-3)
    assert list(saved["targets"]) == [p["target_index"] for p in predictions if p["sample_id"] == sample]
    assert "explain" in Dataset.open(world).provenance
    with pytest.raises(FileExistsError):
        explain_dataset(world, clip, label_space="present", run_name="r1")


def test_group_column_takes_precedence_and_classes_split(world, clip) -> None:
    ds = Dataset.open(world)
    ids = ds.sample_ids()
    ds.update(ids[:10], {"group": "easy"}, actor="test", reason="split")
    ds.update(ids[10:20], {"group": "hard"}, actor="test", reason="split")
    summary = summarize_by_group(world, clip, method="layercam", threshold=0.5, threshold_mode="hard")
    assert summary["split"] == "group" and list(summary["groups"]) == ["easy", "hard"]
    assert summary["groups"]["easy"]["n"] + summary["groups"]["easy"]["n_nan"] == 10
    for key in ("sss", "rma", "sss_uniform", "sss_balanced"):
        assert key in summary["groups"]["hard"]
    assert summary["method"] == "layercam" and summary["nan"] >= 0
    assert not (world / "runs").exists()  # summarize without a run name writes nothing


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
        result = explain_dataset(world, clip, label_space="present", write=False)
    summary = result.summary
    assert summary["skipped"]["reasons"] == {"mask_size_mismatch": 1, "mask_unreadable": 1}
    assert {s["sample_id"] for s in summary["skipped"]["samples"]} == {rows[1]["sample_id"], rows[3]["sample_id"]}
    assert summary["masks"] == {"non_binary": 2, "resized": 1}  # the 0/255 one and the instance ids
    assert summary["n_images"] == 22
    assert "mask problems" in caplog.text


def test_nan_reasons_reach_the_summary(world, clip) -> None:
    ds = Dataset.open(world)
    rows = ds.rows()
    Image.fromarray(np.zeros((48, 48), np.uint8)).save(world / rows[0]["mask_path"])  # empty mask
    result = explain_dataset(world, clip, label_space="present", write=False)
    reasons = result.summary["nan"]["reasons"]
    assert reasons.get("empty_mask") == 1
    first = [p for p in result.predictions.to_pylist() if p["sample_id"] == rows[0]["sample_id"]][0]
    assert first["nan_reason"] == "empty_mask" and math.isnan(first["sss"])


def test_timm_classifier_on_its_own_logits(world) -> None:
    model = load_model("timm:test_resnet", seed=0)
    result = explain_dataset(world, model, method="layercam", target="predicted", label_space="dataset", write=False)
    rows = result.predictions.to_pylist()
    assert len(rows) == 24 and all(0 <= r["target_index"] < 1000 for r in rows)
    assert result.summary["config"]["layer"] == "layer4" and result.summary["config"]["prompts"] is None
    present = explain_dataset(world, model, target="topk:2", label_space="present", write=False)
    classes = {r["class_index"] for r in present.predictions.to_pylist()}
    assert {r["target_index"] for r in present.predictions.to_pylist()} <= classes


def test_classifier_on_a_non_imagenet_space_is_refused(tmp_path) -> None:
    from curate.labels import LabelSpace

    ds = Dataset.create(tmp_path / "custom", name="custom", label_space=LabelSpace("mine", ("a", "b")))
    with pytest.raises(SaliencyError, match="ImageNet-1K"):
        explain_dataset(ds, load_model("timm:test_resnet", seed=0))


def test_cli_explain(world) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["explain", str(world), "--model", "curate-tiny-rn", "--method", "layercam",
                                  "--target", "topk:2", "--label-space", "present", "--threshold", "0.3",
                                  "--threshold-mode", "hard", "--run-name", "cli", "--device", "cpu",
                                  "--batch-size", "7", "--workers", "1"])
    assert result.exit_code == 0, result.output
    for text in ("SSS", "aligned", "conflicting", "RMA", "wrote"):
        assert text in result.output
    config = json.loads((world / "runs" / "cli" / "config.json").read_text())
    assert config["threshold"] == 0.3 and config["threshold_mode"] == "hard" and config["method"] == "layercam"
    result = runner.invoke(main, ["explain", str(world), "--model", "curate-tiny-rn", "--label-space", "present",
                                  "--json", "--run-name", "cli-json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output[result.output.index("{"):])["n_images"] == 24
    result = runner.invoke(main, ["explain", str(world), "--model", "curate-tiny-rn", "--layer", "visual.layer7",
                                  "--run-name", "bad"])
    assert result.exit_code == 1 and "visual.layer4" in result.output and "layer7" in result.output


# ----------------------------------------------------------------------------- the demo's models
FAST_METHODS = ("gradcam", "gradcam++", "xgradcam", "layercam", "eigencam", "eigengradcam", "fullgrad")


def _welch_t(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    return float((a.mean() - b.mean()) / math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b)))


@functools.lru_cache(maxsize=None)
def _image_sss(demo_dir: Path, world: str, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-image SSS (true-class target, default layer) and aligned flags on the evaluation world."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = explain_dataset(demo_dir / "world-eval", demo_dir / "models" / f"reference-{world}.pt",
                                 method=method, target="true", label_space="present", write=False, batch_size=128)
    assert result.summary["n_images"] == 1200 and result.summary["nan"]["count"] < 200, result.summary["nan"]
    rows = result.images.to_pylist()
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
                          "1-px object outline: 0.670 vs 0.633); papers/004 §5: methods differ", strict=False)
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
                          "it (see the issue note)", strict=False)
def test_shortcut_clip_is_more_spurious_on_hard_images(demo_dir) -> None:
    groups = summarize_by_group(demo_dir / "world-eval", demo_dir / "models" / "reference-p0.9.pt",
                                method="gradcam")["groups"]
    assert groups["conflicting"]["sss"] > groups["aligned"]["sss"], groups


@pytest.mark.slow
def test_every_fast_method_runs_on_the_demo_models(demo_dir) -> None:
    """Numbers for the issue note (logged); each method must produce defined scores for most images."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in FAST_METHODS:
            row = {}
            for world in ("p0.9", "uncorrelated"):
                s = summarize_by_group(demo_dir / "world-eval", demo_dir / "models" / f"reference-{world}.pt",
                                       method=method, batch_size=128)
                row[world] = s
                assert s["overall"]["n"] > 900, (method, world, s)
            logger.warning("%-12s p0.9 %.3f (aligned %.3f, conflicting %.3f) | uncorrelated %.3f (aligned %.3f, "
                           "conflicting %.3f)", method, row["p0.9"]["overall"]["sss"],
                           row["p0.9"]["groups"]["aligned"]["sss"], row["p0.9"]["groups"]["conflicting"]["sss"],
                           row["uncorrelated"]["overall"]["sss"], row["uncorrelated"]["groups"]["aligned"]["sss"],
                           row["uncorrelated"]["groups"]["conflicting"]["sss"])
