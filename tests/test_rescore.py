"""Re-scoring loads no model: the identity of a weights file is recorded the first time it is
loaded and answers every cache lookup afterwards (curate/engine/identity.py)."""
from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from eval_helpers import CLASSES, make_folder

import curate.models.loader as loader_module
from curate.engine.identity import IDENTITY_DIR, LazyModel
from curate.models import ModelSpec, load_model
from curate.stages.evaluate import EvalSettings, evaluate


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("weights") / "tiny-vit.pt"
    model = load_model("curate-tiny-vit", None, seed=0)
    torch.save({"state_dict": model.module.state_dict(), "curate": {"arch": "curate-tiny-vit"}}, path)
    return path


@pytest.fixture()
def folder(tmp_path):
    ds = make_folder(tmp_path / "ds", per_class=4)
    subset = tmp_path / "subset.txt"
    subset.write_text("\n".join(str(i) for i in [*CLASSES, 0, 1, 2, 3, 4, 5, 6, 7]))
    return ds, subset


def _refuse_loading(monkeypatch) -> list[str]:
    calls: list[str] = []

    def refuse(prefix):
        calls.append(prefix)
        raise AssertionError("the model was built during a re-scoring run")

    monkeypatch.setattr(loader_module, "get_backend", refuse)
    return calls


def test_rescoring_builds_no_model_and_predicts_the_same(folder, weights, monkeypatch) -> None:
    ds, subset = folder
    spec = ModelSpec("curate-tiny-vit", str(weights))
    first = evaluate(ds.root, spec, EvalSettings(bootstrap=10, batch_size=16), run_name="first")
    assert first.images_encoded == len(ds.rows())
    assert list((ds.root / IDENTITY_DIR).glob("*.json")), "the first load records the model's identity"

    calls = _refuse_loading(monkeypatch)
    again = evaluate(ds.root, spec, EvalSettings(label_space=str(subset), bootstrap=10, batch_size=16),
                     run_name="rescored")
    assert calls == [] and again.images_encoded == 0
    assert again.model_id == first.model_id and again.model_id.startswith("open_clip:curate-tiny-vit:file-")

    monkeypatch.undo()  # the same label space from scratch, model loaded, nothing cached
    fresh = evaluate(ds.root, spec, EvalSettings(label_space=str(subset), bootstrap=10, batch_size=16,
                                                 use_cache=False), run_name="fresh")
    a = pq.read_table(again.run_dir / "predictions.parquet").to_pydict()
    b = pq.read_table(fresh.run_dir / "predictions.parquet").to_pydict()
    assert a["sample_id"] == b["sample_id"] and a["topk_labels"] == b["topk_labels"]
    np.testing.assert_allclose(np.array(a["topk_scores"]), np.array(b["topk_scores"]), atol=1e-4)
    assert again.metrics["overall"] == fresh.metrics["overall"]


def test_a_new_prompt_loads_the_model_lazily_and_a_touched_file_is_hashed_again(folder, weights, tmp_path,
                                                                                  monkeypatch) -> None:
    ds, _ = folder
    spec = ModelSpec("curate-tiny-vit", str(weights))
    evaluate(ds.root, spec, EvalSettings(bootstrap=10), run_name="first")
    import curate.stages.evaluate as ev

    seen = []
    real = ev._load
    monkeypatch.setattr(ev, "_load", lambda s, settings: seen.append(s) or real(s, settings))
    model = ev._model(spec, EvalSettings(), ds.root)
    assert isinstance(model, LazyModel) and not model.loaded and seen == []
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("a photo of a {}.\n")
    run = evaluate(ds.root, spec, EvalSettings(prompts=str(prompt), bootstrap=10), run_name="new-prompt")
    assert len(seen) == 1 and run.images_encoded == 0  # prompts to encode: loaded once, images from the cache

    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the file changed: its identity is unknown
    seen.clear()
    model = ev._model(spec, EvalSettings(), ds.root)
    assert not isinstance(model, LazyModel) and len(seen) == 1


def test_a_stale_identity_record_is_an_error_and_is_removed(folder, weights) -> None:
    ds, _ = folder
    spec = ModelSpec("curate-tiny-vit", str(weights))
    evaluate(ds.root, spec, EvalSettings(bootstrap=10), run_name="first")
    record = next((ds.root / IDENTITY_DIR).glob("*.json"))
    import json

    data = json.loads(record.read_text())
    data["identity"]["model_id"] = "open_clip:curate-tiny-vit:file-000000000000"
    record.write_text(json.dumps(data))
    import curate.stages.evaluate as ev

    model = ev._model(spec, EvalSettings(), ds.root)
    with pytest.raises(RuntimeError, match="does not match the loaded model"):
        model.encode_text(["a"])
    assert not record.exists()


# A re-score as a fresh `curate evaluate` process: everything cached, so neither torch nor open_clip is imported.
_CLI_THEN_REPORT_MODULES = """
import json, sys
from curate.cli import main
try:
    main(sys.argv[1:], prog_name="curate")
except SystemExit as stop:
    code = stop.code
heavy = [m for m in ("torch", "open_clip", "timm", "transformers", "torchvision") if m in sys.modules]
print("MODULES " + json.dumps({"code": code, "heavy": heavy}))
"""


def _cli_in_subprocess(*args: str) -> dict:
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CLI_THEN_REPORT_MODULES, *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})
    line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES "))
    report = json.loads(line.removeprefix("MODULES "))
    assert report["code"] in (0, None), done.stdout + done.stderr
    return report


def test_a_cli_rescore_imports_no_torch_and_predicts_the_same(folder, weights) -> None:
    ds, subset = folder
    spec = ModelSpec("curate-tiny-vit", str(weights))
    evaluate(ds.root, spec, EvalSettings(bootstrap=10, batch_size=16), run_name="first")  # caches everything
    reference = evaluate(ds.root, spec, EvalSettings(label_space=str(subset), bootstrap=10), run_name="in-process")
    assert not list((ds.root / "features" / "text").glob("*.pt")), "new text classifiers are .npy + .json"

    report = _cli_in_subprocess("-q", "evaluate", str(ds.root), "--model", "curate-tiny-vit", "--pretrained",
                                str(weights), "--label-space", str(subset), "--bootstrap", "10", "--device", "cpu",
                                "--run-name", "cli-rescore")
    assert report["heavy"] == [], f"a cached re-score imported {report['heavy']}"
    a = pq.read_table(reference.run_dir / "predictions.parquet")
    b = pq.read_table(ds.root / "runs" / "cli-rescore" / "predictions.parquet")
    assert a.equals(b), "the CLI re-score's predictions differ from the in-process run's"
    from curate.runs import load_run

    again = load_run(ds.root / "runs" / "cli-rescore")
    assert again.dataset["images_encoded"] == 0 and again.metrics["overall"] == reference.metrics["overall"]


def test_numpy_logits_equal_the_torch_ones_and_old_pt_caches_still_read(tmp_path) -> None:
    from curate.zeroshot import PromptSet, zero_shot_logits
    from curate.zeroshot.classifier import _cache_entry, load_cached_text_classifier

    rng = np.random.default_rng(0)
    feats = rng.normal(size=(64, 32)).astype(np.float32) * 3
    w = rng.normal(size=(10, 32)).astype(np.float32)
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    in_numpy = zero_shot_logits(feats, w)
    in_torch = zero_shot_logits(torch.from_numpy(feats), torch.from_numpy(w)).numpy()
    assert isinstance(in_numpy, np.ndarray) and in_numpy.dtype == np.float32
    # 1e-5 plus float32 rounding of logits up to ~60 (one ulp at 60 is 3.8e-6): the two differ in BLAS order only
    np.testing.assert_allclose(in_numpy, in_torch, rtol=1e-6, atol=1e-5)
    assert np.abs(in_numpy).max() > 10  # the scale (100) is applied in both

    class Named:  # what the cache needs of a model
        model_id, cache_safe = "open_clip:fake", True

    prompts, names = PromptSet("simple", ("A photo of {}.",)), [f"c{i}" for i in range(10)]
    base, record = _cache_entry(Named(), names, prompts, tmp_path)
    torch.save({"record": record, "weights": torch.from_numpy(w)}, base.with_suffix(".pt"))  # the older format
    got = load_cached_text_classifier(Named(), names, prompts, tmp_path, numpy=True)
    np.testing.assert_array_equal(got, w)
    assert base.with_suffix(".npy").exists() and base.with_suffix(".json").exists()  # rewritten in the new format
    base.with_suffix(".pt").unlink()
    assert torch.equal(load_cached_text_classifier(Named(), names, prompts, tmp_path), torch.from_numpy(w))
    base.with_suffix(".json").write_text('{"record": {"model_id": "other"}}')  # another model's record: a miss
    assert load_cached_text_classifier(Named(), names, prompts, tmp_path) is None
