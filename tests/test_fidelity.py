"""Fidelity metrics (papers/002): removal bounds, Fid+/Fid- on a hand-made model, seeds, degraded series."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from curate.metrics.fidelity import (
    fidelity_curves, finetune, random_input_masks, removal_counts, degrade,
    series_correlations, stochastic_removal, pixel_ranks, explanation_size,
)

H = W = 8


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
