"""Fidelity metrics (papers/002): removal bounds, Fid+/Fid- on a hand-made model, seeds, degraded series."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from curate.metrics.fidelity import (
    FidelityCurves, fidelity_curves, finetune, random_input_masks, removal_counts, degrade,
    series_correlations, stochastic_removal, pixel_ranks, explanation_size,
)

H = W = 8
pytestmark = pytest.mark.usefixtures("one_thread")


class RegionModel(torch.nn.Module):
    """Class 0 logit = scale * (sum of channel 0 over the top-left 4x4 region) - threshold; class 1 = 0."""

    def __init__(self, scale: float = 1.0, threshold: float = 8.0) -> None:
        super().__init__()
        region = torch.zeros(1, H, W)
        region[:, :4, :4] = 1
        self.weight = torch.nn.Parameter(region * scale)
        self.threshold = threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = (x[:, 0] * self.weight[0]).flatten(1).sum(1) - self.threshold
        return torch.stack([s, torch.zeros_like(s)], 1)


def region() -> torch.Tensor:
    r = torch.zeros(H, W)
    r[:4, :4] = 1
    return r


def test_removal_never_exceeds_beta():
    d = H * W
    gen = torch.Generator().manual_seed(0)
    ranks = pixel_ranks(torch.rand(3, H, W, generator=gen), generator=gen)
    for beta in (0.05, 0.1, 0.3):
        cap = int(np.floor(beta * d))
        for s in np.arange(0.05, 0.96, 0.05):
            plus, minus = removal_counts(s, d, 1.0, 1.0, beta)
            assert plus <= cap and minus <= cap
            k = explanation_size(s, d)
            for explanation, count in ((True, plus), (False, minus)):
                removed = stochastic_removal(ranks, k, count, explanation=explanation, samples=4, generator=gen)
                assert int(removed.sum(-1).max()) <= cap
                inset = ranks < k if explanation else ranks >= k
                assert not (removed & ~inset).any()  # only from the chosen set
        masks = random_input_masks(50, (H, W), beta, generator=gen)
        assert int(masks.flatten(1).sum(1).max()) <= cap


def test_fid_plus_minus_on_region_model():
    model = RegionModel()
    images = torch.ones(4, 3, H, W)
    labels = [0] * 4
    good = region().expand(4, H, W)
    res = fidelity_curves(model, images, good, labels, sparsities=[0.25, 0.5], metrics=["fid_plus", "fid_minus"])
    # sparsity 0.25 = exactly the region: removing it flips the class, keeping it keeps it
    assert res.curves["fid_plus"] == [1.0, 1.0]
    assert res.curves["fid_minus"] == [0.0, 0.0]
    bad = 1 - good
    res = fidelity_curves(model, images, bad, labels, sparsities=[0.25], metrics=["fid_plus", "fid_minus"])
    assert res.curves["fid_plus"] == [0.0] and res.curves["fid_minus"] == [1.0]
    # probability score: Fid+ = p(x) - p(x - region) = sigmoid(8) - sigmoid(-8)
    res = fidelity_curves(model, images, good, labels, sparsities=[0.25], metrics=["fid_plus"], score="probability")
    assert res.curves["fid_plus"][0] == pytest.approx(float(torch.sigmoid(torch.tensor(8.0)) - torch.sigmoid(torch.tensor(-8.0))), abs=1e-6)
    # R-Fid with alpha 0.5 removes 8 of the 16 region pixels: logit 8 - 8 = 0 -> tie -> argmax 0 stays right
    res = fidelity_curves(model, images, good, labels, sparsities=[0.25], alpha=0.5, samples=3, metrics=["rfid_plus"],
                          score="probability")
    assert res.curves["rfid_plus"][0] == pytest.approx(float(torch.sigmoid(torch.tensor(8.0))) - 0.5, abs=1e-6)


def test_seeds_repeat():
    model = RegionModel()
    gen = torch.Generator().manual_seed(1)
    images = torch.rand(6, 3, H, W, generator=gen) * 2
    expl = torch.rand(6, H, W, generator=gen)
    kw = dict(sparsities=[0.1, 0.3, 0.6], samples=5, score="probability", finetuned=model)
    a = fidelity_curves(model, images, expl, [0] * 6, seed=3, **kw)
    b = fidelity_curves(model, images, expl, [0] * 6, seed=3, **kw)
    c = fidelity_curves(model, images, expl, [0] * 6, seed=4, **kw)
    assert a.curves == b.curves
    assert a.curves["rfid_plus"] != c.curves["rfid_plus"]
    f1 = finetune(model, lambda m, x: m(x), images, [0] * 6, epochs=2, batch_size=3, lr=1e-2, seed=0)
    f2 = finetune(model, lambda m, x: m(x), images, [0] * 6, epochs=2, batch_size=3, lr=1e-2, seed=0)
    assert torch.equal(f1.weight, f2.weight) and not torch.equal(f1.weight, model.weight)


def test_degraded_series_ranked_by_ffidelity():
    """papers/002 §5 on a model that looks at one region: the region mask degraded by noise ratios."""
    torch.manual_seed(0)
    model = RegionModel(scale=0.25, threshold=2.0)
    gen = torch.Generator().manual_seed(0)
    images = 0.5 + torch.rand(16, 3, H, W, generator=gen)
    labels = [0] * 16
    tuned = finetune(model, lambda m, x: m(x), images, labels, beta=0.1, epochs=2, lr=1e-3, seed=0)
    ratios = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    good = region().expand(16, H, W)
    results = {r: fidelity_curves(model, images, degrade(good, r, seed=7), labels, finetuned=tuned, samples=8,
                                  score="probability", seed=0) for r in ratios}
    corr = series_correlations(results, {r: r for r in ratios})
    assert corr["ffid_plus"]["macro"] <= -0.9
    assert corr["ffid_minus"]["macro"] >= 0.9


def test_cli_registered_and_sparsity_parse():
    from click.testing import CliRunner

    from curate.cli import main
    from curate.metrics.fidelity_run import parse_sparsity

    assert parse_sparsity("0.05:0.95:0.05")[-1] == 0.95 and len(parse_sparsity("0.05:0.95:0.05")) == 19
    result = CliRunner().invoke(main, ["fidelity", "--help"])
    assert result.exit_code == 0 and "--finetune-epochs" in result.output


# ----------------------------------------------------------------------------- trust vs a random map
def _curves(per_plus: np.ndarray, per_minus: np.ndarray) -> FidelityCurves:
    sp = [0.1, 0.5, 0.9]
    per = {"ffid_plus": per_plus, "ffid_minus": per_minus}
    return FidelityCurves(sp, {m: [float(x) for x in v.mean(0)] for m, v in per.items()}, per, len(per_plus))


def test_trust_verdicts_against_a_random_map():
    from curate.metrics.fidelity import per_image_aucs
    from curate.metrics.fidelity_run import trust_vs_reference

    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.4, size=(40, 3))
    random = _curves(base, base)
    good = _curves(base + 0.1 + rng.normal(0, 0.01, base.shape), base - 0.1)
    same = _curves(base + rng.normal(0, 0.05, base.shape), base + rng.normal(0, 0.05, base.shape))
    half = _curves(base + 0.1, base + 0.05)
    trust = trust_vs_reference({"random": random, "good": good, "same": same, "half": half}, seed=0)
    assert trust["random"]["verdict"] == "reference"
    assert trust["good"]["verdict"] == "faithful"
    assert trust["good"]["vs_random_morf"] == pytest.approx(0.1, abs=0.01)
    assert trust["good"]["vs_random_lerf"] == pytest.approx(0.1, abs=1e-9)
    assert trust["good"]["vs_random_morf_low"] > 0.09
    assert trust["same"]["verdict"] == "not above random"
    assert trust["same"]["vs_random_morf_low"] <= 0 and trust["same"]["vs_random_lerf_low"] <= 0
    assert trust["half"]["verdict"] == "MoRF only"
    # per-image AUCs average to the curve's AUC
    assert per_image_aucs(good, "ffid_plus").mean() == pytest.approx(good.aucs["ffid_plus"])
    assert trust_vs_reference({"good": good}) == {}


# ----------------------------------------------------------------------------- a dataset folder
@pytest.fixture(scope="module")
def world_template(tmp_path_factory):
    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic

    root = tmp_path_factory.mktemp("fidworld") / "world"
    collect_synthetic(root, WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=6, image_size=48, seed=5, p=0.5))
    return root


@pytest.fixture()
def world(world_template, tmp_path):
    import shutil

    root = tmp_path / "world"
    shutil.copytree(world_template, root)
    return root


FAST = dict(sparsities="0.1,0.5,0.9", samples=2, finetune_epochs=1, batch_size=8, score="probability")


def test_fidelity_dataset_run_folder_cache_and_repeat(world):
    import json

    from curate.metrics.fidelity_run import fidelity_dataset
    from curate.models import load_model

    clip = load_model("curate-tiny-rn", seed=0)
    methods = ["gradcam", "mask", "mask~0.5", "mask~1.0", "random"]
    first = fidelity_dataset(world, clip, methods, run_name="r1", **FAST)
    run = world / "runs" / "r1"
    for name in ("config.json", "curves.csv", "curves.json", "aucs.json", "ranking.csv", "correlations.json",
                 "curves.png", "summary.json"):
        assert (run / name).is_file(), name
    assert first.config["finetune"]["cached"] is False and first.config["images"] == 18
    assert first.config["skipped"] == {}
    assert sorted(r["method"] for r in first.ranking) == sorted(methods)
    assert {r["verdict"] for r in first.ranking} <= {"reference", "faithful", "MoRF only", "LeRF only",
                                                     "not above random"}
    assert set(first.correlations) == {"mask"}  # mask, mask~0.5, mask~1.0: a degraded series
    assert set(first.correlations["mask"]) >= {"fid_plus", "rfid_plus", "ffid_plus", "ffid_morf_vs_lerf"}
    cached = list((world / "features" / "fidelity").glob("*.pt"))
    assert len(cached) == 1
    header = (run / "curves.csv").read_text().splitlines()[0]
    assert header == "method,metric,sparsity,value"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["baseline"].startswith("0 in the model's normalised input space")
    # the report shows the run: ranking with verdicts, the series' correlations, the curves
    from curate.report import build_report

    md = build_report(world).read_text()
    assert "Fidelity: which saliency maps deserve trust" in md and "`r1`" in md
    assert "Degraded series `mask`" in md and "fidelity_r1.png" in md
    assert (md_dir := world / "runs" / "report").joinpath("fidelity_r1.png").is_file(), md_dir
    # a second run reuses the fine-tuned weights and gives the same numbers for the same method and seed
    second = fidelity_dataset(world, clip, ["gradcam"], run_name="r2", **FAST)
    assert second.config["finetune"]["cached"] is True
    assert second.curves["gradcam"].curves == first.curves["gradcam"].curves
    other_seed = fidelity_dataset(world, clip, ["gradcam"], run_name="r3", seed=1, write=False, **FAST)
    assert other_seed.curves["gradcam"].curves["rfid_plus"] != first.curves["gradcam"].curves["rfid_plus"]


def test_fidelity_on_a_timm_classifier(world):
    from curate.metrics.fidelity_run import fidelity_dataset
    from curate.models import load_model

    model = load_model("timm:test_resnet", seed=0)
    res = fidelity_dataset(world, model, ["gradcam", "random"], sparsities="0.2", samples=1, finetune_epochs=1,
                           limit=3, finetune_limit=3, batch_size=3, run_name="timm")
    assert res.config["label_columns"] == 1000 and res.config["model_kind"] != "clip"
    assert res.config["finetune"]["images"] == 3
    assert {"ffid_plus", "ffid_minus"} <= set(res.aucs["gradcam"])
    assert len(list((world / "features" / "fidelity").glob("*.pt"))) == 1


def test_cli_scores_skips_a_corrupt_image_and_refuses_bad_methods(world):
    import json

    from click.testing import CliRunner

    from curate.cli import main
    from curate.store import Dataset

    ds = Dataset.open(world)
    row = ds.rows()[0]
    media = ds.image_path(row)
    media.chmod(0o644)
    media.write_bytes(b"not an image")
    before = (world / "samples.parquet").read_bytes()
    args = ["fidelity", str(world), "--model", "curate-tiny-rn", "--pretrained", "none", "--methods",
            "layercam,random", "--sparsity", "0.1,0.5", "--samples", "2", "--finetune-epochs", "1", "--run-name", "cli"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "layercam" in result.output and "run folder" in result.output
    config = json.loads((world / "runs" / "cli" / "config.json").read_text())
    summary = json.loads((world / "runs" / "cli" / "summary.json").read_text())
    assert summary["config"]["skipped"] == {"image_unreadable": 1} and summary["config"]["images"] == 17
    assert config["methods"] == ["layercam", "random"]
    verdicts = {r["method"]: r["verdict"] for r in summary["ranking"]}
    assert verdicts["random"] == "reference" and verdicts["layercam"] in ("faithful", "MoRF only", "LeRF only",
                                                                         "not above random")
    assert (world / "samples.parquet").read_bytes() == before  # the dataset itself is untouched
    for bad, message in (("gradcam,nonsense", "unknown saliency method"), ("mask~1.5", "noise ratio"),
                         ("mask,mask", "twice")):
        result = CliRunner().invoke(main, [*args[:6], "--methods", bad, "--run-name", "bad"])
        assert result.exit_code == 1 and message in result.output, result.output
    assert not (world / "runs" / "bad").exists()
    result = CliRunner().invoke(main, [*args, "--beta", "1.5"])
    assert result.exit_code == 1 and "alpha and beta" in result.output


# ----------------------------------------------------------------------------- the paper's check (issue bar)
DEGRADED_SERIES = ["mask", "mask~0.2", "mask~0.4", "mask~0.6", "mask~0.8", "mask~1.0"]


@pytest.mark.slow
def test_ffidelity_ranks_a_degraded_mask_series_on_the_synthetic_world(demo_dir):
    """papers/002 §5 on our world: the object mask of the demo's uncorrelated reference CLIP (a model
    that looks at the object), degraded with noise ratios 0-1, scored on 96 evaluation images with
    F-Fidelity fine-tuned on all 1200, logit-margin score. The issue's bar: macro Spearman(F-Fid+
    AUC, noise) <= -0.9 (measured -1.00 for fine-tuning seeds 0, 1 and 2).
    Plain Fid and R-Fid on the same series are logged for the note (not asserted)."""
    import logging

    from curate.metrics.fidelity_run import fidelity_dataset

    torch.set_num_threads(2)
    res = fidelity_dataset(demo_dir / "world-eval", demo_dir / "models" / "reference-uncorrelated.pt",
                           DEGRADED_SERIES, sparsities="0.05:0.95:0.1", samples=4, finetune_epochs=5, limit=96,
                           score="margin", seed=0, write=False)
    corr = res.correlations["mask"]
    logging.getLogger(__name__).warning("macro Spearman vs noise: %s",
                                        {m: round(v["macro"], 2) for m, v in corr.items()})
    assert corr["ffid_plus"]["macro"] <= -0.9, corr
    aucs = [res.aucs[m]["ffid_plus"] for m in DEGRADED_SERIES]
    assert aucs[0] > aucs[-1]  # the clean mask beats the random map by F-Fid+
