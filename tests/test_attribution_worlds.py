"""The decomposition where the truth is known (docs/design.md#interventions).

Four synthetic worlds (:mod:`curate.interventions.worlds`), scored with the demo's two tiny
reference CLIPs (``demo_dir``: one trained with the background correlated with the class at
p = 0.9, one without it). Each intervention is checked against the exact counterfactuals of its
swaps (the same objects re-drawn by the world's generator on the easy background, nothing pasted):

- background world, p = 0.9 model: the background explains the drop (B close to D, rest near 0);
- confound world (hard photos show objects at 0.45 scale), shape-only model: B near 0, rest ~ D;
- mixed world (hard photos at 0.6 scale), p = 0.9 model: both parts present, each inside the
  interval of its estimate from the true counterfactuals.

- ghost world (hard objects at 0.3), shape-only model: the ghost control catches a fill that keeps
  the donor object's outline (OpenCV's inpainting), and covered donors with the tiled fill (the
  defaults) give the true B.

Measured with these seeds (per_class 60; donors by cover, tiled fill, issue 36): D +55.5 / B +57.1
(truth +57.1); D +58.1 / B -2.0 [-7.5, 3.8] (truth -1.4); D +79.1 / B +60.3 (truth +59.0); ghost
world D +64.9 / B -5.0 [-9.6, -0.9] (truth -5.9), ghost control +0.7 [-2.8, 4.5]; with `--fill telea`
B +0.0 [-3.6, 3.6], ghost control +5.8 [1.9, 10.2], B unghosted -5.8 (benchmarks/interventions.py
--fills); on the 2026-11-28 session's CPU, with the models retrained there: truth -4.8, tiled B -2.7, telea
ghost control +2.5 [-1.0, 6.1], telea B +1.9. The truth must lie inside the estimate's 95% interval give or take
2 points (TRUTH_SLACK): the models are retrained per test session, and training floats differ by
CPU type.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from curate.cli import main
from curate.interventions.worlds import build_world, write_truth
from curate.models import ModelSpec
from curate.runs.attribution import AttributionRun
from curate.runs.interventions import InterventionRun
from curate.stages.attribution import AttributionSettings, attribution
from curate.stages.evaluate import EvalSettings, evaluate
from curate.stages.intervene import InterveneSettings, intervene

pytestmark = pytest.mark.usefixtures("one_thread")


def _weights(demo_dir: Path, world: str) -> Path:
    return demo_dir / "models" / f"reference-{world}.pt"


def _decompose(folder: Path, weights: Path) -> AttributionRun:
    evaluate(folder, ModelSpec("auto", str(weights)), EvalSettings(bootstrap=20), run_name="eval", overwrite=True)
    return attribution(folder, ["eval"], AttributionSettings(n_boot=500), run_name="attribution", overwrite=True)


def _world_pair(tmp: Path, kind: str, weights: Path) -> tuple[AttributionRun, AttributionRun]:
    """The intervention's decomposition and the exact counterfactuals' for one world and model."""
    world = build_world(kind, tmp / kind, per_class=60)
    intervene(world, tmp / f"{kind}-iv", InterveneSettings(variants=("swap", "paste")))
    write_truth(world, tmp / f"{kind}-iv", tmp / f"{kind}-truth")
    return _decompose(tmp / f"{kind}-iv", weights), _decompose(tmp / f"{kind}-truth", weights)


TRUTH_SLACK = 0.02
SIDES = ("left", "right", "top", "bottom")


def _inside(value: float, interval: tuple[float, float], slack: float = 0.0) -> bool:
    return interval[0] - slack <= value <= interval[1] + slack


def _fill_clean(model) -> bool:
    """The fill control (issue 45: refill - original) flags no class (docs/interventions.md#the-fill-control)."""
    return not any("fill control" in c.flag for c in model.classes)


def test_background_world_the_background_explains_the_drop_through_the_cli(demo_dir, tmp_path, monkeypatch):
    """As a user types it (relative paths): intervene, evaluate, attribution; then the truth."""
    world = build_world("background", tmp_path / "world", per_class=60)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner(env={"COLUMNS": "240"})
    made = runner.invoke(main, ["-q", "intervene", "world", "--out", "iv", "--variants", "swap,paste"])
    assert made.exit_code == 0, made.output
    assert "exact (synthetic / COCO)" in made.output
    scored = runner.invoke(main, ["-q", "evaluate", "iv", "--model", "auto", "--pretrained",
                                  str(_weights(demo_dir, "p0.9")), "--bootstrap", "20", "--run-name", "eval"])
    assert scored.exit_code == 0, scored.output
    result = runner.invoke(main, ["-q", "attribution", "iv", "--bootstrap", "500", "--run-name", "attribution"])
    assert result.exit_code == 0, result.output
    assert "background B" in result.output and "rest D - B" in result.output
    model = AttributionRun.load(Path("iv/runs/attribution")).models[0]
    drop, b, rest = model.value("drop"), model.value("background_part"), model.value("rest")
    assert model.interval("drop")[0] > 0.3  # the shortcut model loses a lot on hard backgrounds
    assert b > 0.85 * drop and abs(rest) < 0.08 and _inside(0.0, model.interval("rest"), 0.02)
    assert abs(model.value("paste_cost")) < 0.05  # pasting an object back costs it (almost) nothing
    assert model.n_refills > 0 and _fill_clean(model)  # a refill a hard swap; the tiled hole does not show here
    write_truth(world, Path("iv"), Path("truth"))
    truth = _decompose(Path("truth"), _weights(demo_dir, "p0.9")).models[0]
    assert truth.value("drop") == pytest.approx(drop)  # the same originals, scored by the same model
    assert _inside(truth.value("background_part"), model.interval("background_part"), TRUTH_SLACK)


def test_confound_world_object_scale_not_background(demo_dir, tmp_path):
    model, truth = (run.models[0] for run in _world_pair(tmp_path, "confound", _weights(demo_dir, "uncorrelated")))
    assert model.interval("drop")[0] > 0.3  # small hard objects cost the shape-only model a lot
    assert abs(model.value("background_part")) < 0.12 and _inside(0.0, model.interval("background_part"))
    assert model.interval("rest")[0] > 0.3 and _fill_clean(model)
    assert _inside(truth.value("background_part"), model.interval("background_part"), TRUTH_SLACK)
    assert _inside(truth.value("rest"), model.interval("rest"), TRUTH_SLACK)


def test_mixed_world_both_parts_recover_their_planted_share(demo_dir, tmp_path):
    model, truth = (run.models[0] for run in _world_pair(tmp_path, "mixed", _weights(demo_dir, "p0.9")))
    assert model.interval("background_part")[0] > 0.3 and model.interval("rest")[0] > 0.05  # both act
    assert _fill_clean(model)
    assert _inside(truth.value("background_part"), model.interval("background_part"), TRUTH_SLACK)
    assert _inside(truth.value("rest"), model.interval("rest"), TRUTH_SLACK)
    assert model.value("drop") == pytest.approx(model.value("background_part") + model.value("rest"))


def test_ghost_world_the_ghost_control_catches_an_outline_fill_and_covered_tiled_donors_recover_b(demo_dir, tmp_path):
    """Hard objects at 0.3 of the easy ones' size, the shape-only model: a swap leaves ~90% of the donor's
    hole uncovered. OpenCV's inpainting keeps a blurred blob of the donor's object (an object of the same
    class) and B moves off the truth; the ghost control (B - B on boxed holes) says by how much, and B
    unghosted is the truth. Covered donors with the tiled fill (the defaults) give the truth as B itself."""
    world = build_world("ghost", tmp_path / "world", per_class=60)
    weights = _weights(demo_dir, "uncorrelated")
    intervene(world, tmp_path / "tiled", InterveneSettings(variants=("swap", "paste")))
    intervene(world, tmp_path / "inpainted", InterveneSettings(variants=("swap",), fill="telea"))
    write_truth(world, tmp_path / "tiled", tmp_path / "truth")  # donors are chosen by cover, not fill: the same
    true_b = _decompose(tmp_path / "truth", weights).models[0].value("background_part")
    tiled = _decompose(tmp_path / "tiled", weights).models[0]
    inpainted = _decompose(tmp_path / "inpainted", weights).models[0]
    assert tiled.interval("drop")[0] > 0.3  # small hard objects cost the shape-only model a lot
    assert _inside(true_b, tiled.interval("background_part"), TRUTH_SLACK)
    assert _inside(0.0, tiled.interval("ghost_bias"), 0.01)  # the tiled holes carry (almost) no class
    # The inpainted holes do carry class, and the control moves towards it. Compared as point estimates: on
    # another CPU type the retrained model gave +5.8 [1.9, 10.2], on this session's +2.5 [-1.0, 6.1] (tiled
    # -2.0): an interval that excludes 0 is not something every CPU's training gives (issue 48).
    assert inpainted.value("ghost_bias") > 0.0
    assert inpainted.value("ghost_bias") - tiled.value("ghost_bias") > 0.02
    assert inpainted.value("background_part") - true_b > 0.03
    assert _inside(true_b, inpainted.interval("background_part_unghosted"), TRUTH_SLACK)
    rows = InterventionRun.of_folder(tmp_path / "tiled").rows()
    assert {r["fill"].split("-")[0] for r in rows if r["variant"] == "swap"} == {"tile"}
    assert {r["fill"] for r in rows if r["variant"] == "swap-unghosted"} <= {f"box-tile-{s}" for s in SIDES}
