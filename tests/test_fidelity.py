"""Fidelity (papers/002): removal bounds, Fid+/Fid- on a hand-made model, seeds, degraded series, verdicts over
seeds x images, the fidelity stage and its run record."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from progress_helpers import Recorder, assert_closing_lines_full

from curate.metrics.fidelity import (
    FidelityCurves,
    degrade,
    explanation_size,
    fidelity_curves,
    finetune,
    finetune_steps,
    pixel_ranks,
    random_input_masks,
    removal_counts,
    series_correlations,
    stochastic_removal,
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
    kw = {"sparsities": [0.1, 0.3, 0.6], "samples": 5, "score": "probability", "finetuned": model}
    a = fidelity_curves(model, images, expl, [0] * 6, seed=3, **kw)
    b = fidelity_curves(model, images, expl, [0] * 6, seed=3, **kw)
    c = fidelity_curves(model, images, expl, [0] * 6, seed=4, **kw)
    assert a.curves == b.curves
    assert a.curves["rfid_plus"] != c.curves["rfid_plus"]
    steps = []
    f1 = finetune(model, lambda m, x: m(x), images, [0] * 6, epochs=2, batch_size=4, lr=1e-2, seed=0,
                  progress=lambda done, total: steps.append((done, total)))
    f2 = finetune(model, lambda m, x: m(x), images, [0] * 6, epochs=2, batch_size=4, lr=1e-2, seed=0)
    assert torch.equal(f1.weight, f2.weight) and not torch.equal(f1.weight, model.weight)
    # a live count: one update per optimisation step (2 epochs x ceil(6 / 4) batches), ending at n/n
    assert finetune_steps(6, epochs=2, batch_size=4) == 4 and steps == [(i, 4) for i in range(5)]


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
    from curate.stages.fidelity import parse_sparsity

    assert parse_sparsity("0.05:0.95:0.05")[-1] == 0.95 and len(parse_sparsity("0.05:0.95:0.05")) == 19
    result = CliRunner().invoke(main, ["fidelity", "--help"])
    assert result.exit_code == 0 and "--finetune-epochs" in result.output and "--seeds" in result.output


def test_formulas_do_not_import_the_saliency_package():
    """metrics/ holds formulas only: no import of saliency or stages (the old metrics <-> saliency cycle)."""
    import ast
    from pathlib import Path

    import curate.metrics.fidelity as formulas

    tree = ast.parse(Path(formulas.__file__).read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {n for n in names if n.startswith(("curate.saliency", "curate.stages", "curate.runs"))}, names
    from curate.metrics.fidelity import METRIC_INFO, METRICS

    assert list(METRIC_INFO) == list(METRICS)
    assert [METRIC_INFO[m].higher_is_better for m in METRICS] == [True, False] * 3
    assert METRIC_INFO["ffid_plus"].name == "F-Fid+" and "eqs. 5-6" in METRIC_INFO["ffid_plus"].paper


# ----------------------------------------------------------------------------- trust vs a random map
def _curves(per_plus: np.ndarray, per_minus: np.ndarray) -> FidelityCurves:
    sp = [0.1, 0.5, 0.9]
    per = {"ffid_plus": per_plus, "ffid_minus": per_minus}
    return FidelityCurves(sp, {m: [float(x) for x in v.mean(0)] for m, v in per.items()}, per, len(per_plus))


def test_trust_verdicts_against_a_random_map():
    from curate.metrics.fidelity import per_image_aucs, trust_vs_reference

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
    assert trust["good"]["vs_random_morf_low"] > 0.09 and trust["good"]["vs_random_morf_by_seed"] == [
        trust["good"]["vs_random_morf"]]
    assert trust["same"]["verdict"] == "not above random"
    assert trust["same"]["vs_random_morf_low"] <= 0 and trust["same"]["vs_random_lerf_low"] <= 0
    assert trust["half"]["verdict"] == "MoRF only"
    # per-image AUCs average to the curve's AUC
    assert per_image_aucs(good, "ffid_plus").mean() == pytest.approx(good.aucs["ffid_plus"])
    assert trust_vs_reference({"good": good}) == {}


def test_seed_image_bootstrap_carries_the_spread_between_seeds():
    """Issue 14 §4: a verdict must survive re-fitting. Per-image differences that are clearly above 0
    under each seed, but whose level moves between fine-tuned copies, must not pass on images alone."""
    from curate.metrics.bootstrap import bootstrap_paired_mean
    from curate.metrics.fidelity import compare_to_reference, seed_image_bootstrap

    rng = np.random.default_rng(1)
    n = 60
    levels = np.array([0.08, -0.02, 0.09])  # one fine-tuned copy disagrees
    diffs = levels[:, None] + rng.normal(0, 0.01, (3, n))
    images_only = bootstrap_paired_mean(diffs.mean(0), seed=0)  # the old scheme, seeds averaged per image
    low, high = seed_image_bootstrap(diffs, seed=0)
    assert images_only.low > 0.04  # images alone: a tight interval far above 0
    assert low < 0 < high  # seeds x images: the spread between copies reaches 0
    vs = compare_to_reference(diffs, seed=0)
    assert vs.effect == pytest.approx(diffs.mean()) and not vs.above and len(vs.by_seed) == 3
    assert vs.by_seed == pytest.approx(tuple(diffs.mean(1)))
    # one seed: the plain paired bootstrap over images (same width up to bootstrap noise)
    low1, high1 = seed_image_bootstrap(diffs[0], seed=3, n_boot=4000)
    ref = bootstrap_paired_mean(diffs[0], seed=3, n_boot=4000)
    assert high1 - low1 == pytest.approx(ref.high - ref.low, rel=0.15)
    # additive seed + image effects: Var(theta*) = var(a) / R + var(b) / N (population variances)
    r, n = 12, 80
    a, b = rng.normal(0, 0.05, r), rng.normal(0, 0.2, n)
    low2, high2 = seed_image_bootstrap(0.3 + a[:, None] + b[None, :], seed=0, n_boot=8000)
    sd = np.sqrt(a.var() / r + b.var() / n)
    assert (high2 - low2) / (2 * 1.96) == pytest.approx(sd, rel=0.1)
    assert seed_image_bootstrap(np.full((3, 5), np.nan)) != seed_image_bootstrap(np.zeros((3, 5)))  # nan, nan


def test_marginal_rule_and_verdicts():
    from curate.metrics.fidelity import VsReference, is_marginal, verdict

    assert is_marginal(0.10, 0.01, 0.25) and not is_marginal(0.10, 0.03, 0.25)
    assert not is_marginal(0.10, -0.01, 0.25) and not is_marginal(0.10, 0.01, 0.0)
    clear, shaky, below = VsReference(0.1, 0.05, 0.15), VsReference(0.1, 0.007, 0.2, marginal=True), VsReference(
        0.0, -0.1, 0.1)
    assert verdict(clear, clear) == "faithful"
    assert verdict(clear, shaky) == "faithful (marginal)"  # the demo's p=0.9 GradCAM case: LeRF low +0.007
    assert verdict(shaky, below) == "MoRF only (marginal)"
    assert verdict(clear, below) == "MoRF only"
    assert verdict(below, below) == "not above random"


def test_trust_over_replicates():
    from curate.metrics.fidelity import trust_vs_reference

    rng = np.random.default_rng(2)
    base = rng.uniform(0.2, 0.4, size=(30, 3))
    shifts = [0.1, 0.12, -0.05]  # the third fine-tuned copy disagrees
    random = [_curves(base, base) for _ in shifts]
    steady = [_curves(base + 0.1 + rng.normal(0, 0.01, base.shape), base - 0.1) for _ in shifts]
    wobbly = [_curves(base + s + rng.normal(0, 0.01, base.shape), base - 0.1) for s in shifts]
    trust = trust_vs_reference({"random": random, "steady": steady, "wobbly": wobbly}, seed=0)
    assert trust["steady"]["verdict"] == "faithful"
    assert trust["wobbly"]["verdict"] == "LeRF only"
    assert trust["wobbly"]["vs_random_morf_by_seed"] == pytest.approx(shifts, abs=0.01)
    with pytest.raises(ValueError, match="replicates"):
        trust_vs_reference({"random": random, "short": steady[:2]})


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


def settings(**overrides):
    from curate.stages.fidelity import FidelitySettings

    fast = {"sparsities": "0.1,0.5,0.9", "samples": 2, "finetune_epochs": 1, "batch_size": 8, "score": "probability",
            "seeds": 1, "device": "cpu"}
    return FidelitySettings(**{**fast, **overrides})


VERDICTS = {"reference", "faithful", "MoRF only", "LeRF only", "not above random"}
VERDICTS |= {v + " (marginal)" for v in VERDICTS - {"reference"}}


def test_fidelity_run_folder_record_cache_and_repeat(world):
    from curate.models import load_model
    from curate.runs import load_run
    from curate.runs.fidelity import FidelityRun
    from curate.stages.fidelity import compute_fidelity, fidelity

    clip = load_model("curate-tiny-rn", seed=0)
    methods = ("gradcam", "mask", "mask~0.5", "mask~1.0", "random")
    progress = Recorder()
    first = fidelity(world, clip, settings(methods=methods, seeds=2), run_name="r1", progress=progress)
    run = world / "runs" / "r1"
    for name in ("config.json", "curves.csv", "curves.json", "aucs.json", "ranking.csv", "correlations.json",
                 "curves.png", "summary.json"):
        assert (run / name).is_file(), name
    # progress: each replicate's fine-tuning and scoring is a phase of its own that ends at n/n, and
    # both count live (per optimisation step; per batch of images and method) before they end
    progress.assert_every_phase_ends_full()
    phases = progress.phases()
    assert list(phases) == ["decoding images", "fine-tuning copy 1 of 2", "scoring replicate 1 of 2",
                            "fine-tuning copy 2 of 2", "scoring replicate 2 of 2"]
    steps = finetune_steps(18, epochs=1, batch_size=8)
    assert steps == 3  # ceil(18 / 8) batches in the one epoch
    scored = [(0, 5 * 18)] + [(18 * m + min(18, b), 5 * 18) for m in range(5) for b in (8, 16, 24)]
    for k in (1, 2):
        assert phases[f"fine-tuning copy {k} of 2"] == [(i, steps) for i in range(steps + 1)]
        assert phases[f"scoring replicate {k} of 2"] == scored
    cfg = first.config
    assert cfg.seeds == (0, 1) and cfg.marginal == 0.25 and cfg.images == 18 and cfg.skipped == {}
    assert [c.seed for c in cfg.finetune.copies] == [0, 1] and not any(c.cached for c in cfg.finetune.copies)
    assert sorted(first.methods) == sorted(methods)
    assert set(first.verdicts.values()) <= VERDICTS and first.row("random").is_reference
    gradcam = first.row("gradcam")
    assert gradcam.family == "ffid" and gradcam.plus == first.aucs["gradcam"]["ffid_plus"]
    assert len(gradcam.morf.by_seed) == 2 and gradcam.morf.low <= gradcam.morf.effect <= gradcam.morf.high
    assert gradcam.vs_random_text("morf").startswith(("+", "-")) and first.row("random").vs_random_text("morf") == ""
    # the mean AUC is the mean of the per-seed AUCs
    per_seed = [first.aucs_by_seed["gradcam"][s]["ffid_plus"] for s in (0, 1)]
    assert first.aucs["gradcam"]["ffid_plus"] == pytest.approx(np.mean(per_seed))
    assert set(first.correlations) == {"mask"}  # mask, mask~0.5, mask~1.0: a degraded series
    assert set(first.correlations["mask"]) >= {"fid_plus", "rfid_plus", "ffid_plus", "ffid_morf_vs_lerf"}
    assert set(first.macro_correlations("mask")) >= {"ffid_plus"}
    assert len(list((world / "features" / "fidelity").glob("*.pt"))) == 2  # one copy per seed
    assert (run / "curves.csv").read_text().splitlines()[0] == "method,metric,sparsity,value"
    # the record reads back what was written
    loaded = load_run(run)
    assert isinstance(loaded, FidelityRun) and loaded.config == first.config
    assert loaded.ranking == first.ranking and loaded.aucs == first.aucs and loaded.plot_path == run / "curves.png"
    assert loaded.curves["gradcam"].by_seed[1] == first.curves["gradcam"].by_seed[1]
    assert loaded.curves["gradcam"].auc("ffid_plus") == pytest.approx(loaded.aucs["gradcam"]["ffid_plus"])
    assert loaded.aucs_by_seed == first.aucs_by_seed and loaded.metrics == list(METRICS_ALL)
    # a run named like an existing one is refused before any work
    with pytest.raises(FileExistsError):
        fidelity(world, clip, settings(methods=("gradcam",)), run_name="r1")
    # seed 1 alone is the first run's second replicate: its copy comes from the cache, same numbers
    progress = Recorder()
    again = compute_fidelity(world, clip, settings(methods=("gradcam", "random"), seed=1), progress=progress)
    assert again.config.finetune.all_cached and again.run_dir is None
    progress.assert_every_phase_ends_full()
    assert progress.phases()["fine-tuning"] == [(steps, steps)]  # one seed: plain phase names; cached: done at once
    assert again.curves["gradcam"].values == first.curves["gradcam"].by_seed[1]
    assert again.curves["gradcam"].values != first.curves["gradcam"].by_seed[0]


METRICS_ALL = ("fid_plus", "fid_minus", "rfid_plus", "rfid_minus", "ffid_plus", "ffid_minus")


def test_three_seeds_on_a_tiny_case(world):
    from curate.models import load_model
    from curate.stages.fidelity import fidelity

    clip = load_model("curate-tiny-rn", seed=0)
    run = fidelity(world, clip, settings(methods=("mask", "random"), sparsities="0.5", samples=1, limit=6,
                                         finetune_limit=6, batch_size=6, families=("ffid",), seeds=3), run_name="s3")
    assert run.config.seeds == (0, 1, 2) and run.config.finetune.images == 6
    assert len(list((world / "features" / "fidelity").glob("*.pt"))) == 3
    mask = run.row("mask")
    assert len(mask.morf.by_seed) == 3 and len(mask.lerf.by_seed) == 3 and mask.verdict in VERDICTS
    assert mask.morf.effect == pytest.approx(np.mean(mask.morf.by_seed), abs=1e-6)
    assert sorted(run.curves["mask"].by_seed) == [0, 1, 2] and run.metrics == ["ffid_plus", "ffid_minus"]
    assert "3 seeds x images" in run.interval_note


def test_a_version_1_run_still_loads(tmp_path):
    """A fidelity run written before records (no record_version, one fine-tuning seed) is read and migrated."""
    import json

    from curate.runs import iter_runs
    from curate.runs.fidelity import FidelityRun

    run = tmp_path / "runs" / "old"
    run.mkdir(parents=True)
    row = {"rank": 1, "method": "gradcam", "by": "ffid", "ffid_plus": 2.72, "ffid_minus": 1.38,
           "vs_random_morf": 0.8, "vs_random_morf_low": 0.5, "vs_random_morf_high": 1.1, "vs_random_lerf": 0.4,
           "vs_random_lerf_low": 0.007, "vs_random_lerf_high": 0.9, "verdict": "faithful"}
    config = {"kind": "fidelity", "dataset": "w", "model": "tiny", "model_kind": "clip", "methods": ["gradcam", "random"],
              "sparsities": [0.1, 0.5], "alpha": 0.5, "beta": 0.1, "samples": 4, "score": "margin",
              "families": ["ffid"], "seed": 0, "images": 64, "label_columns": 6, "skipped": {},
              "finetune": {"epochs": 5, "key": "abc", "path": "f/abc.pt", "images": 1200, "lr": 1e-4, "cached": True},
              "curate_version": "0.1.0"}
    (run / "summary.json").write_text(json.dumps({"config": config, "aucs": {"gradcam": {"ffid_plus": 2.72}},
                                                  "ranking": [row, {"rank": 2, "method": "random", "by": "ffid",
                                                                    "ffid_plus": 1.8, "ffid_minus": 1.9,
                                                                    "verdict": "reference"}],
                                                  "correlations": {}, "timings": {"total_s": 1.0}}))
    (run / "curves.json").write_text(json.dumps({"gradcam": {"sparsities": [0.1, 0.5], "images": 64,
                                                             "curves": {"ffid_plus": [3.0, 2.4]}}}))
    (run / "aucs.json").write_text(json.dumps({"gradcam": {"ffid_plus": 2.72, "ffid_minus": 1.38}}))
    (run / "config.json").write_text(json.dumps(config))
    [(_, old)] = list(iter_runs(tmp_path, "fidelity"))
    assert isinstance(old, FidelityRun), old
    assert old.config.seeds == (0,) and old.config.marginal is None
    assert old.config.finetune.copies[0].key == "abc" and old.config.finetune.all_cached
    gradcam = old.row("gradcam")
    assert gradcam.verdict == "faithful" and not gradcam.marginal and gradcam.lerf.low == 0.007
    assert gradcam.vs_random_text("lerf") == "+0.400 [+0.007, +0.900]" and gradcam.morf.by_seed == ()
    assert old.curves["gradcam"]["ffid_plus"] == [3.0, 2.4] and old.curves["gradcam"].by_seed == {}
    assert "one fine-tuning seed" in old.interval_note and old.plot_path is None
    (run / "summary.json").unlink()
    [(_, error)] = list(iter_runs(tmp_path, "fidelity"))
    assert "summary.json" in str(error)


def test_report_shows_a_fidelity_run(world):
    from curate.models import load_model
    from curate.report import build_report
    from curate.stages.fidelity import fidelity

    clip = load_model("curate-tiny-rn", seed=0)
    fidelity(world, clip, settings(methods=("mask", "mask~0.5", "mask~1.0", "random"), sparsities="0.5", samples=1,
                                   limit=6, finetune_limit=6, batch_size=6), run_name="r1")
    md = build_report(world).read_text()
    assert "Fidelity: which saliency maps deserve trust" in md and "`r1`" in md
    assert "Degraded series `mask`" in md and "fidelity_r1.png" in md
    assert (world / "runs" / "report" / "fidelity_r1.png").is_file()


def test_fidelity_on_a_timm_classifier(world):
    from curate.models import load_model
    from curate.stages.fidelity import fidelity

    model = load_model("timm:test_resnet", seed=0)
    run = fidelity(world, model, settings(methods=("gradcam", "random"), sparsities="0.2", samples=1, limit=3,
                                          finetune_limit=3, batch_size=3, score="margin"), run_name="timm")
    assert run.config.label_columns == 1000 and run.config.model_kind != "clip"
    assert run.config.finetune.images == 3
    assert {"ffid_plus", "ffid_minus"} <= set(run.aucs["gradcam"])
    assert len(list((world / "features" / "fidelity").glob("*.pt"))) == 1


def test_cli_scores_skips_a_corrupt_image_and_refuses_bad_methods(world):
    import json

    from click.testing import CliRunner

    from curate.cli import main
    from curate.runs.fidelity import FidelityRun
    from curate.store import Dataset

    ds = Dataset.open(world)
    row = ds.rows()[0]
    media = ds.image_path(row)
    media.chmod(0o644)
    media.write_bytes(b"not an image")
    before = (world / "samples.parquet").read_bytes()
    args = ["fidelity", str(world), "--model", "curate-tiny-rn", "--pretrained", "none", "--methods",
            "layercam,random", "--sparsity", "0.1,0.5", "--samples", "2", "--finetune-epochs", "1", "--seeds", "1",
            "--batch-size", "8", "--device", "cpu", "--run-name", "cli"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "layercam" in result.output and "run folder" in result.output and "1 seed x images" in result.output
    # the logged progress (no terminal): each phase's closing line says n/n, fine-tuning counted in steps
    # (ceil(17 / 8) batches of its one epoch), scoring in images x methods
    assert assert_closing_lines_full(result.stderr) == {"decoding images": (18, 18), "fine-tuning": (3, 3),
                                                        "scoring": (2 * 17, 2 * 17)}
    config = json.loads((world / "runs" / "cli" / "config.json").read_text())
    assert config["kind"] == "fidelity" and config["record_version"] == 2 and config["seeds"] == [0]
    run = FidelityRun.load(world / "runs" / "cli")
    assert run.config.skipped == {"image_unreadable": 1} and run.config.images == 17
    assert run.config.methods == ("layercam", "random")
    assert run.verdicts["random"] == "reference" and run.verdicts["layercam"] in VERDICTS
    assert (world / "samples.parquet").read_bytes() == before  # the dataset itself is untouched
    for bad, message in (("gradcam,nonsense", "unknown saliency method"), ("mask~1.5", "noise ratio"),
                         ("mask,mask", "twice")):
        result = CliRunner().invoke(main, [*args[:6], "--methods", bad, "--run-name", "bad"])
        assert result.exit_code == 1 and message in result.output, result.output
    assert not (world / "runs" / "bad").exists()
    result = CliRunner().invoke(main, [*args[:-2], "--run-name", "bad", "--beta", "1.5"])
    assert result.exit_code == 1 and "alpha and beta" in result.output, result.output
    assert not (world / "runs" / "bad").exists()
    result = CliRunner().invoke(main, [*args[:-2], "--run-name", "cli"])
    assert result.exit_code == 1 and "exists" in result.output


# ----------------------------------------------------------------------------- the paper's check (issue bar)
DEGRADED_SERIES = ("mask", "mask~0.2", "mask~0.4", "mask~0.6", "mask~0.8", "mask~1.0")


@pytest.mark.slow
def test_ffidelity_ranks_a_degraded_mask_series_on_the_synthetic_world(demo_dir):
    """papers/002 §5 on our world: the object mask of the demo's uncorrelated reference CLIP (a model
    that looks at the object), degraded with noise ratios 0-1, scored on 64 evaluation images (the
    demo's ``limit``) with F-Fidelity fine-tuned on all 1200, logit-margin score. The issue's bar: macro Spearman(F-Fid+
    AUC, noise) <= -0.9 (measured -1.00 for fine-tuning seeds 0, 1 and 2 each; the three averaged,
    seeds=3, pass too). One seed here: each further seed costs one more fine-tuning of the 1200
    images and triples nothing else but the scoring (31 min instead of about 10 on 2 loaded cores).
    F-Fidelity only (as the demo): plain Fid and R-Fid were scored here for the note, never asserted,
    and were over half of the test's forward passes (issue 42; with ffid alone: -1.00, AUCs 5.39 >
    5.25 > 4.80 > 4.20 > 3.54 > 2.88 on sparsities 0.05:0.95:0.1). The demo's own sparsity grid
    (0.1:0.9:0.2, five instead of ten; issue 42): -1.00 for F-Fid+ and MoRF-vs-LeRF in each of 3 runs,
    98 / 101 s CPU against 142 s with the ten-point grid (fixture included, interleaved, 2026-11-29). The demo's
    64 images instead of 96 (issue 42; the fine-tuning, ~40 s CPU, is the same and cached for the demo test):
    F-Fid+ -1.00, MoRF-vs-LeRF -0.94 (-1.00 on 96), AUCs 4.98 > 4.87 > 4.54 > 4.05 > 3.27 > 2.45; the scoring
    19.6 s CPU against 29.1 s (2 threads, quiet, 2026-11-29)."""
    import logging

    from curate.demo import FIDELITY_SETTINGS
    from curate.stages.fidelity import FidelitySettings, compute_fidelity

    torch.set_num_threads(2)
    run = compute_fidelity(demo_dir / "world-eval", demo_dir / "models" / "reference-uncorrelated.pt",
                           FidelitySettings(methods=DEGRADED_SERIES, sparsities=FIDELITY_SETTINGS["sparsities"],
                                            samples=4, finetune_epochs=5, limit=FIDELITY_SETTINGS["limit"], score="margin", seed=0, seeds=1,
                                            families=("ffid",), device="cpu"))
    # its fine-tuned copy is cached in the world's features/: the demo test reuses it
    corr = run.correlations["mask"]
    logging.getLogger(__name__).warning("macro Spearman vs noise: %s (fine-tuned copies cached: %s)",
                                        {m: round(v["macro"], 2) for m, v in corr.items()},
                                        [c.cached for c in run.config.finetune.copies])
    assert corr["ffid_plus"]["macro"] <= -0.9, corr
    aucs = [run.aucs[m]["ffid_plus"] for m in DEGRADED_SERIES]
    assert aucs[0] > aucs[-1]  # the clean mask beats the random map by F-Fid+
