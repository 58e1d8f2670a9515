"""The tiny reference CLIP: its loss, its file, its shortcut report, and (slow) the demo's claim."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.models import load_model
from curate.train_reference import (
    TrainConfig,
    clip_loss_unique_captions,
    dataset_arrays,
    default_negative_names,
    evaluate_shortcut,
    shortcut_report,
    train_reference_clip,
    world_arrays,
)


def test_loss_equals_clip_loss_when_captions_are_unique() -> None:
    torch.manual_seed(0)
    img = F.normalize(torch.randn(5, 8), dim=-1)
    txt = F.normalize(torch.randn(5, 8), dim=-1)
    scale = torch.tensor(np.log(10.0))
    logits = 10.0 * img @ txt.t()
    labels = torch.arange(5)
    expected = 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))
    assert torch.allclose(clip_loss_unique_captions(img, txt, labels, scale), expected, atol=1e-6)


def test_loss_with_repeated_captions_uses_all_images_of_a_class_as_positives() -> None:
    img = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    txt = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0, 0, 1])
    loss = clip_loss_unique_captions(img, txt, labels, torch.tensor(np.log(100.0)))
    # image->text: all correct by a margin of 100 -> ~0; text->image: caption 0 splits its mass
    # between its two identical images (-log 1/2 each), caption 1 has one positive (~0).
    assert loss.item() == pytest.approx(0.5 * (0.0 + 0.5 * np.log(2)), abs=1e-3)


def test_text_only_negatives_enter_only_the_image_to_text_term() -> None:
    torch.manual_seed(1)
    img = F.normalize(torch.randn(4, 8), dim=-1)
    txt = F.normalize(torch.randn(5, 8), dim=-1)  # 2 world captions, then 3 captions no image has
    labels = torch.tensor([0, 1, 1, 0])
    scale = torch.tensor(np.log(10.0))
    logits = 10.0 * img @ txt.t()
    image_to_text = F.cross_entropy(logits, labels)  # over all 5 captions
    log_p = F.log_softmax(logits[:, :2].t(), dim=1)  # each world caption over the batch's images
    text_to_image = -(log_p[0, [0, 3]].mean() + log_p[1, [1, 2]].mean()) / 2
    expected = 0.5 * (image_to_text + text_to_image)
    assert torch.allclose(clip_loss_unique_captions(img, txt, labels, scale), expected, atol=1e-6)


def test_default_negatives_are_the_imagenet_labels_that_are_not_world_classes() -> None:
    names = [c.name for c in DEFAULT_CLASSES[:6]]
    pool = default_negative_names(names)
    assert len(pool) == 994 and not set(pool) & set(names)
    assert "brown bear" in pool and "sea lion" in pool  # near neighbours of world names stay negatives


def test_shortcut_report_is_balanced_over_classes() -> None:
    labels = np.array([0, 0, 0, 0, 1, 1])
    aligned = np.array([True, True, False, False, True, False])
    preds = np.array([0, 0, 1, 0, 1, 0])
    report = shortcut_report(preds, labels, aligned)
    assert report.aligned_acc == pytest.approx(100.0)  # class 0: 2/2, class 1: 1/1
    assert report.conflicting_acc == pytest.approx(25.0)  # class 0: 1/2, class 1: 0/1 -> mean 25
    assert report.gap == pytest.approx(75.0) and (report.n_aligned, report.n_conflicting) == (3, 3)


def test_short_training_writes_a_file_the_models_layer_loads(tmp_path) -> None:
    spec = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=8, image_size=48, seed=0)
    root = collect_synthetic(tmp_path / "world", spec).root
    from curate.store import Dataset

    images, labels, aligned, names, order = dataset_arrays(Dataset.open(root))
    assert images.shape == (24, 48, 48, 3) and order == [c.imagenet_index for c in spec.classes]
    out = tmp_path / "ref.pt"
    result = train_reference_clip(images, labels, names, out, TrainConfig(steps=3, batch_size=16, warmup=1))
    assert out.exists() and not list(tmp_path.glob("*.tmp")) and len(result.losses) == 3
    model = load_model("auto", out)
    assert model.kind == "clip" and model.info["arch"] == "curate-tiny-clip-rn"
    meta = torch.load(out, weights_only=True)["curate"]
    assert meta["class_names"] == names and meta["train_config"]["steps"] == 3
    assert meta["train_config"]["text_negatives"] == 128 and meta["text_negative_pool"] == 997
    report = evaluate_shortcut(out, Dataset.open(root))
    assert report.n_aligned + report.n_conflicting == 24


def test_training_is_repeatable_for_a_seed(tmp_path) -> None:
    images, labels, _, names = world_arrays(WorldSpec(classes=DEFAULT_CLASSES[:2], per_class=8, image_size=48))
    config = TrainConfig(steps=2, batch_size=8, warmup=1, seed=7, threads=2)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = train_reference_clip(images, labels, names, tmp_path / "a.pt", config).losses
        assert torch.get_num_threads() == 1  # training uses its own count and gives the caller's back (issue 48)
        b = train_reference_clip(images, labels, names, tmp_path / "b.pt", config).losses
    finally:
        torch.set_num_threads(before)
    assert a == b


def _out_of_world_share(weights, images: np.ndarray, world: list[int]) -> float:
    """Share of 1-vs-1000 top-1 predictions ("A photo of {}.") outside ``world`` (ImageNet indices)."""
    from curate.labels import imagenet1k
    from curate.train_reference import _to_tensor
    from curate.zeroshot import PromptSet, build_text_classifier, zero_shot_logits

    model = load_model("auto", weights)
    with torch.no_grad():
        features = model.module.encode_image(_to_tensor(images))
    classifier = build_text_classifier(model, imagenet1k().names, PromptSet("simple", ("A photo of {}.",)))
    top1 = zero_shot_logits(features, classifier).argmax(dim=1).numpy()
    return float(np.mean(~np.isin(top1, world)))


def test_text_negatives_stop_untrained_labels_from_taking_the_hard_images(tmp_path) -> None:
    """Issue 14 §3: without text-only negatives the 994 ImageNet labels the text tower never saw
    take the images the model is unsure of, so 1 vs 1000 measured the text tower, not the shortcut.

    A short run (3 classes, p = 0.9, 20 steps of 32; ~15 s on one core) on the conflicting
    images of an uncorrelated world: measured 100% of top-1 outside the world's classes without
    negatives, 0% with them (the demo's models: 43% -> 0% on conflicting images, 88% -> 0% on
    the split's hard images).
    """
    from dataclasses import replace

    spec = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=16, image_size=48, p=0.9, seed=0)
    images, labels, _, names = world_arrays(spec)
    eval_images, _, aligned, _ = world_arrays(replace(spec, p=spec.uncorrelated_p, per_class=30, seed=1000))
    world = [c.imagenet_index for c in spec.classes]
    shares = {}
    for negatives in (0, 128):
        config = TrainConfig(steps=20, batch_size=32, warmup=5, threads=1, text_negatives=negatives)
        train_reference_clip(images, labels, names, tmp_path / f"neg{negatives}.pt", config)
        shares[negatives] = _out_of_world_share(tmp_path / f"neg{negatives}.pt", eval_images[~aligned], world)
    assert shares[128] <= 0.1, shares  # measured 0.0
    assert shares[0] >= 0.5, shares  # measured 1.0: the control shows the test can fail


@pytest.mark.slow
def test_demo_plants_a_shortcut_only_when_correlated(demo_dir) -> None:
    """A planted background shortcut (p = 0.9) gives a large aligned-conflicting gap, p = 1/B not.

    The whole demo, on the session's demo folder (tests/conftest.py::demo_dir): its worlds and two
    models were trained there with the demo's own settings (150 steps each, in parallel, one core
    each: measured 95-99 s per model on 2 shared cores), which the demo reuses as a user's second
    `make demo` does, so they are trained once per test session (and once per clone: the models come
    from tests/model_cache.py). F-Fidelity runs with the demo's own single fine-tuning seed (issue 42);
    the three-seed interval is tested on a tiny case in test_fidelity.py.
    """
    from curate.demo import FIDELITY_SETTINGS, run_demo, run_full_demo

    assert FIDELITY_SETTINGS["seeds"] == 1  # the verdicts below are one seed's ("marginal" allowed)
    result = run_full_demo(demo_dir)
    rows = {row.world: row.report for row in result.shortcut}
    correlated, uncorrelated = rows["p=0.9"], rows["uncorrelated"]
    # measured with the demo's settings (1 vs 6, the training caption): aligned/conflicting
    # 100.0/44.1 (gap 55.9) for p = 0.9, 97.4/97.5 (gap -0.1) uncorrelated
    assert correlated.gap > 12.0 and correlated.gap > uncorrelated.gap + 10.0, (correlated, uncorrelated)
    assert abs(uncorrelated.gap) < 8.0, uncorrelated
    assert uncorrelated.conflicting_acc > 60.0, "the uncorrelated model must learn the shapes"
    # the evaluation engine sees the same shortcut at 1 vs 1000 with the paper's prompt; measured
    # easy/hard 100.0/8.9 (drop 91.1) for p = 0.9 and 97.4/99.5 (drop -2.1) uncorrelated
    engine = {e.model: e for e in result.evaluations if e.label_space == "1 vs 1000"}
    assert engine["p=0.9"].drop > engine["uncorrelated"].drop + 0.2, engine
    assert engine["p=0.9"].drop_ci[0] > 0.2 and engine["uncorrelated"].drop_ci[0] < 0.05
    # ... and measures the shortcut, not the text tower (issue 14 §3): thanks to the text-only
    # negatives no untrained ImageNet label takes the hard images, so 1 vs 1000 scores them as
    # 1 vs the world's classes does (measured: equal; without the negatives 8.3 vs 53.2 for p = 0.9)
    world = {e.model: e for e in result.evaluations if e.label_space.startswith("1 vs 6")}
    for model in rows:
        assert abs(engine[model].hard - world[model].hard) < 0.05, (engine[model], world[model])
    # the LVLM row (issue 15): the tiny LLaVA fine-tuned on the p = 0.9 world, scored by answer
    # likelihood over the world's classes, leans on the background too (measured: easy 98.8, hard 0.0, drop 98.8 [97.1, 100])
    lvlm = next(e for e in result.evaluations if e.model == "p=0.9 · tiny LLaVA")
    assert lvlm.drop > 0.5 and lvlm.drop_ci[0] > 0.2, lvlm
    assert (result.compare_dir / "compare.md").exists()
    # fidelity (papers/002): both models' saliency methods next to the object mask and a random map
    verdicts = {(r["model"], r["method"]): r["verdict"] for r in result.fidelity}
    assert set(verdicts) == {(w, m) for w in rows for m in ("gradcam", "layercam", "mask", "random")}
    assert verdicts[("uncorrelated", "random")] == "reference"
    # its object matters more than random pixels (a "(marginal)" mark is allowed: one seed here)
    assert verdicts[("uncorrelated", "mask")].removesuffix(" (marginal)") == "faithful"
    # masks (issue 24): the tiny CLIPSeg fine-tuned on the p = 0.9 world's exact masks proposes
    # masks for the held-out evaluation world far better than the trivial baselines, and every
    # proposal stayed in the run (each photo there already has an exact mask)
    from curate.masks.measure import measure_run
    from curate.runs import MaskRun
    from curate.store import Dataset

    masks = MaskRun.load(demo_dir / "world-eval" / "runs" / "demo-masks")
    assert masks.counts["applied"] == 0 and masks.counts["kept_trusted"] == masks.counts["found"] > 1000
    measured = measure_run(Dataset.open(demo_dir / "world-eval"), masks)
    assert measured.overall.iou > measured.overall.centre_iou + 0.2, measured.overall
    assert "centre box" in result.masks and "mean IoU" in result.masks
    assert "0 model-made" in result.saliency[0]["mask_line"] and "exact" in result.fidelity_masks
    # interventions (issue 25): on the split world most of the p = 0.9 model's drop is the background
    # (measured D 91.1, B 82.1, rest 9.0); on the confound world the shape-only model's drop is object
    # scale, not background (measured D 58.8, B 4.0, exact B -0.4)
    att = {(r["world"].split(" (")[0], r["model"]): r for r in result.attribution}
    split_world = att[("split evaluation world", "reference-p0.9.pt")]
    assert split_world["background_part_ci"][0] > 0.5 and split_world["background_part"] > 0.75 * split_world["drop"]
    confound = att[("confound world", "reference-uncorrelated.pt")]
    assert confound["drop_ci"][0] > 0.3 and abs(confound["background_part"]) < 0.12, confound
    assert abs(confound["truth_b"]) < 0.12 and result.attribution_report.is_file()
    assert abs(confound["ghost_bias"]) < 0.05  # issue 36: the tiled holes of covered donors carry no class
    # discover (issue 26): on the planted world the unlisted road photos form one group per class, named
    # "a road" among its top five, better or as well separated as from whole images; the null world
    # proposes nothing (measured: Jaccard 1.0 in all three classes, "a road" ranked 1-2, ARI 0.96-1.0
    # against 0.61-1.0 for the whole-image baseline; 0 of 5 null groups significant)
    assert len(result.discovery) == 3
    for row in result.discovery:
        assert row["jaccard"] >= 0.9 and row["phrase_rank"] is not None and row["phrase_rank"] <= 5, row
    assert sum(r["ari"] for r in result.discovery) >= sum(r["ari_whole"] for r in result.discovery)
    assert result.discovery_null.startswith("null world") and ": 0 of " in result.discovery_null
    # the simulated team's agreement table (issue 44; curate.collect.simulated_team, tested in test_annotator_sim.py)
    assert any(line.startswith("| careful | careful:0.05 |") for line in result.team), result.team
    # the splitter (papers/003 §2.1) finds the planted backgrounds with the p = 0.9 reference ...
    assert result.split_kept >= 5 and result.split_planted_easy >= 0.9 * result.split_kept
    # ... and, with the uncorrelated reference, few or no classes pass --require-significant
    from curate.models import ModelSpec
    from curate.stages.split import SplitSettings, split

    unc = next(row for row in result.shortcut if row.world == "uncorrelated")
    null_split = split(demo_dir / "world-eval", ModelSpec("auto", str(unc.weights)),
                       SplitSettings(min_per_background=10, require_significant=True), run_name="split-null",
                       overwrite=True)
    assert len(null_split.kept) <= 2, [(s.class_index, s.drop, s.p_value) for s in null_split.classes]  # measured: 1 of 6
    again = run_demo(demo_dir)  # reuses worlds and weights, same numbers
    assert all(not row.trained for row in again)
    assert (demo_dir / "models" / "naming.pt").is_file()  # the naming CLIP is reused too
    assert {row.world: row.report for row in again} == rows
