"""The feature cache is keyed on the precision and the input path that made the features (issue 27),
and an evaluation run records both."""
from __future__ import annotations

import json

import numpy as np
import pytest
from eval_helpers import make_folder

from curate.features import FeatureCache, cache_key, compute_features, feature_precision
from curate.models import ModelSpec, load_model
from curate.stages.evaluate import EvalSettings, evaluate


@pytest.fixture()
def folder(tmp_path):
    return make_folder(tmp_path / "ds", per_class=2)


def _model(precision: str = "fp32"):
    return load_model("curate-tiny-vit", seed=0, precision=precision)


def test_a_bf16_run_after_an_fp32_run_encodes_its_own_features(folder) -> None:
    ids = folder.sample_ids()
    fp32 = compute_features(folder, _model("fp32"), ids)
    assert fp32.computed == len(ids) and fp32.precision == "fp32"
    bf16 = compute_features(folder, _model("bf16"), ids)
    assert bf16.computed == len(ids) and bf16.cached == 0, "bf16 reused the fp32 features"
    assert bf16.precision == "bf16"
    assert not np.array_equal(bf16.values, fp32.values)  # they are bf16's numbers, not fp32's
    again = compute_features(folder, _model("fp32"), ids)
    assert again.computed == 0 and again.cached == len(ids)
    np.testing.assert_array_equal(again.values, fp32.values)
    assert compute_features(folder, _model("bf16"), ids).computed == 0  # bf16 has its own cache now


def test_amp_is_keyed_by_what_it_autocasts_to(folder) -> None:
    """amp on a CPU autocasts to bf16 exactly as amp_bf16 does: they share; fp32 and amp never do."""
    ids = folder.sample_ids()
    amp, amp_bf16, fp32 = _model("amp"), _model("amp_bf16"), _model("fp32")
    assert feature_precision(amp) == feature_precision(amp_bf16) == "amp_bf16"
    assert cache_key(amp, "embedding") == cache_key(amp_bf16, "embedding") != cache_key(fp32, "embedding")
    first = compute_features(folder, amp, ids)
    assert first.computed == len(ids)
    shared = compute_features(folder, amp_bf16, ids)
    assert shared.computed == 0
    np.testing.assert_array_equal(shared.values, first.values)
    assert compute_features(folder, fp32, ids).computed == len(ids)


def test_the_input_path_is_keyed_and_recorded(folder) -> None:
    ids = folder.sample_ids()
    model = _model()
    exact = compute_features(folder, model, ids)
    device = compute_features(folder, model, ids, input_path="gpu")  # the device code, run on the CPU
    assert device.computed == len(ids) and device.input_path == "gpu" and exact.input_path == "cpu-exact"
    record = json.loads((FeatureCache(folder.root, model, "embedding", "gpu").folder / "index.json").read_text())
    assert record["record"]["input_path"] == "gpu" and record["record"]["precision"] == "fp32"
    assert compute_features(folder, model, ids, input_path="gpu").computed == 0
    assert compute_features(folder, model, ids, input_path="auto").input_path == "cpu-exact"  # auto on a CPU
    with pytest.raises(ValueError, match="input path"):
        compute_features(folder, model, ids, input_path="fast")


def test_a_version_1_cache_is_not_reused(folder) -> None:
    """A cache written before precision was keyed may hold any precision's features."""
    ids = folder.sample_ids()
    model = _model()
    compute_features(folder, model, ids)
    cache = FeatureCache(folder.root, model, "embedding")
    index = json.loads((cache.folder / "index.json").read_text())
    index["record"] = {k: v for k, v in index["record"].items() if k not in ("precision", "input_path")}
    index["record"]["version"] = 1
    (cache.folder / "index.json").write_text(json.dumps(index))
    assert compute_features(folder, model, ids).computed == len(ids)


def test_an_evaluation_run_says_which_precision_and_input_path_made_its_features(folder, monkeypatch) -> None:
    import curate.stages.evaluate as ev
    from curate.runs import load_run

    monkeypatch.setattr(ev, "_load", lambda spec, settings: load_model(spec.name, seed=0, device=settings.device,
                                                                       precision=settings.precision))
    spec = ModelSpec("curate-tiny-vit", None)
    first = evaluate(folder.root, spec, EvalSettings(bootstrap=10), run_name="fp32")
    bf16 = evaluate(folder.root, spec, EvalSettings(bootstrap=10, precision="bf16"), run_name="bf16")
    assert bf16.images_encoded == len(folder) and first.images_encoded == len(folder)
    loaded = load_run(folder.root / "runs" / "bf16")
    assert loaded.features["precision"] == "bf16" and loaded.features["input_path"] == "cpu-exact"
    assert loaded.features["device"] == "cpu" and loaded.features["encoded"] == len(folder)
    again = load_run(evaluate(folder.root, spec, EvalSettings(bootstrap=10), run_name="fp32-again").run_dir)
    assert again.images_encoded == 0
    assert again.features == {"precision": "fp32", "input_path": "cpu-exact", "device": None, "encoded": 0,
                              "cached": len(folder)}
    # a run written before these were recorded still loads; it says nothing about them
    config_path = folder.root / "runs" / "fp32" / "config.json"
    config = json.loads(config_path.read_text())
    del config["dataset"]["features"]
    config_path.write_text(json.dumps(config))
    old = load_run(folder.root / "runs" / "fp32")
    assert old.features["precision"] is None and old.features["input_path"] is None
    assert old.features["encoded"] == len(folder) and old.overall == first.overall
