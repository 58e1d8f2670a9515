"""Issue 28: re-runs in `curate compare`, an interrupted encode keeps its batches, no import circles."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from eval_helpers import CLASSES, make_folder

from curate.models import ModelSpec, load_model

ROOT = Path(__file__).resolve().parents[1]
N_IMAGES = len(CLASSES) * 6


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    ds = make_folder(tmp_path / "ds")
    import curate.stages.evaluate as ev

    # the tiny specs load seeded weights, so runs of one spec are runs of the same model
    monkeypatch.setattr(ev, "_load", lambda spec, settings: load_model(spec.name, spec.pretrained, seed=0,
                                                                       device=settings.device,
                                                                       precision=settings.precision))
    return ds


# ----------------------------------------------------------------------------- 1. compare and re-runs
def test_compare_shows_each_model_once_the_newest_run_and_counts_the_repeats(folder) -> None:
    """Three evaluate runs of one model and one of another: compare and the report both give two
    rows, the newest run of the repeated model named, and the two older runs counted."""
    from curate.compare import compare_runs
    from curate.report import evaluation_rows
    from curate.stages.evaluate import EvalSettings, evaluate

    labels = folder.root.parent / "labels.txt"  # a small label space: few prompts to encode
    labels.write_text("\n".join(str(c) for c in CLASSES))
    settings = EvalSettings(label_space=str(labels), bootstrap=10)
    for k in range(3):
        run = evaluate(folder.root, ModelSpec("curate-tiny-vit"), settings, run_name=f"vit-{k}")
        later = 1_000_000 + 10 * k  # the folders' times say which run is newer, whatever the clock's resolution
        os.utime(run.run_dir, (later, later))
    other = evaluate(folder.root, ModelSpec("curate-tiny-rn"), settings, run_name="rn")
    os.utime(other.run_dir, (1_000_005, 1_000_005))

    rows, out = compare_runs(folder.root)
    assert sorted(r.run for r in rows) == ["rn", "vit-2"]  # one row per model and setup: the newest run
    from curate.compare import load_rows, repeats_note

    repeats: list = []
    rows = load_rows(folder.root, repeats=repeats)
    assert sorted(r.run for r in rows) == ["rn", "vit-2"]
    assert [(r.run, r.kept) for r in repeats] == [("vit-0", "vit-2"), ("vit-1", "vit-2")]
    note = repeats_note(repeats)
    assert note.startswith("2 older runs of the same model and setup not shown")
    assert "`vit-0` (repeats `vit-2`)" in note
    md = (out / "compare.md").read_text()
    assert note in md
    table = [line for line in md.splitlines() if line.startswith("| curate-tiny-")]
    assert sorted(line.rstrip(" |").rsplit("| ", 1)[-1] for line in table) == ["rn", "vit-2"]  # the run column

    # the report keeps the same rows and lists the same repeats
    report_rows, omitted = evaluation_rows(folder.root)
    assert sorted(r.run for r in report_rows) == ["rn", "vit-2"]
    assert sorted(omitted) == [("vit-0", "vit-2"), ("vit-1", "vit-2")]
    # naming runs shows exactly those, repeats included
    named, _ = compare_runs(folder.root, runs=["vit-0", "vit-1"])
    assert sorted(r.run for r in named) == ["vit-0", "vit-1"]


# ----------------------------------------------------------------------------- 2. interrupted encoding
def test_an_interrupted_encode_keeps_its_finished_batches(folder) -> None:
    """KeyboardInterrupt after two batches of 4: the 8 outputs are in the cache, the next call
    encodes only the other 22, and the features equal an uninterrupted run's."""
    from curate.features import FeatureCache, compute_features

    model = load_model("curate-tiny-vit", seed=0)
    ids = [r["sample_id"] for r in folder.rows()]
    assert len(ids) == N_IMAGES

    def stop_after_two_batches(done: int, total: int) -> None:
        if done >= 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        compute_features(folder, model, ids, batch_size=4, workers=0, progress=stop_after_two_batches)
    kept, _ = FeatureCache(folder.root, model, "embedding").load()
    assert sorted(kept) == sorted(ids[:8])

    again = compute_features(folder, model, ids, batch_size=4, workers=0)
    assert again.computed == N_IMAGES - 8 and again.cached == 8
    fresh = compute_features(folder, model, ids, batch_size=4, workers=0, use_cache=False)
    assert fresh.computed == N_IMAGES and fresh.cached == 0
    assert again.sample_ids == fresh.sample_ids == ids
    np.testing.assert_array_equal(again.values, fresh.values)
    assert compute_features(folder, model, ids, batch_size=4, workers=0).cached == N_IMAGES


def test_sigterm_during_an_encode_keeps_its_finished_batches(folder) -> None:
    """SIGTERM (what `timeout` and schedulers send) takes the same path as Ctrl-C: a process
    terminated after two batches leaves them in the cache, its default handler is back after,
    and the next call encodes only the rest. (In a child process, with a stand-in model that
    needs no open_clip: SIGTERM's default would end the test run itself.)"""
    script = textwrap.dedent(f"""
        import os, signal, sys
        import numpy as np
        import torch
        from curate.features import compute_features
        from curate.store import Dataset

        class Preprocess:
            def __call__(self, image):
                pixels = np.asarray(image.resize((4, 4)), dtype=np.float32)
                return torch.from_numpy(pixels).permute(2, 0, 1) / 255

            def __repr__(self):
                return "Preprocess(4)"

        class StandIn:
            kind, model_id, cache_safe, image_size = "clip", "stand-in:1", True, (4, 4)
            device, preprocess = torch.device("cpu"), Preprocess()

            def encode_image(self, batch, normalize=True):
                x = batch.flatten(1)[:, :8] + 1e-3
                return x / x.norm(dim=1, keepdim=True)

        ds = Dataset.open({str(folder.root)!r})
        ids = [r["sample_id"] for r in ds.rows()]

        def terminate(done, total):
            if done >= 8:
                os.kill(os.getpid(), signal.SIGTERM)

        try:
            compute_features(ds, StandIn(), ids, batch_size=4, workers=0, progress=terminate)
        except KeyboardInterrupt:
            print("interrupted; default handler back:", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
            again = compute_features(ds, StandIn(), ids, batch_size=4, workers=0)
            print("encoded:", again.computed, "cached:", again.cached)
            sys.exit(3)
        sys.exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
    assert "interrupted; default handler back: True" in done.stdout
    assert f"encoded: {N_IMAGES - 8} cached: 8" in done.stdout


def test_cache_use_wording_says_the_cache_only_when_it_was_used() -> None:
    from curate.features import cache_use_text

    assert cache_use_text(3000, 0) == "3000 images encoded"
    assert cache_use_text(696, 2304) == "696 images encoded, 2304 from the cache"
    assert cache_use_text(0, 3000) == "all 3000 images from the cache"
    assert cache_use_text(1, 0) == "1 image encoded"
    assert cache_use_text(0, 0) == "no images"


def test_an_evaluation_run_records_what_it_encoded_and_what_came_from_the_cache(folder) -> None:
    """The numbers the CLI's line needs: samples and images encoded (cached = samples - encoded)."""
    from curate.runs import EvaluationRun
    from curate.stages.evaluate import EvalSettings, evaluate

    first = evaluate(folder.root, ModelSpec("curate-tiny-vit"), EvalSettings(bootstrap=10), run_name="a")
    second = evaluate(folder.root, ModelSpec("curate-tiny-vit"), EvalSettings(bootstrap=10), run_name="b")
    for run, encoded in ((first, N_IMAGES), (second, 0)):
        loaded = EvaluationRun.load(run.run_dir)
        assert loaded.images_encoded == encoded
        assert int(loaded.dataset["samples"]) - loaded.images_encoded == N_IMAGES - encoded


# ----------------------------------------------------------------------------- 3. import circles
def _imports(path: Path) -> set[str]:
    """Every module a file imports, at module level or inside functions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_lower_floors_never_import_the_floor_above() -> None:
    """The feature cache calls the engine, so no engine module imports curate.features; the Hub
    folder builds the card, so the card never imports curate.publish.hub."""
    for path in sorted((ROOT / "curate" / "engine").glob("*.py")):
        back = {n for n in _imports(path) if n == "curate.features" or n.startswith("curate.features.")}
        assert not back, f"{path.name} imports {back}"
    card = _imports(ROOT / "curate" / "publish" / "card.py")
    assert not {n for n in card if n.startswith("curate.publish.hub")}, card
    layout = ROOT / "curate" / "publish" / "layout.py"
    assert not {n for n in _imports(layout) if n.startswith(("curate.publish.hub", "curate.publish.card"))}


@pytest.mark.parametrize("module", ["curate.features", "curate.engine.base", "curate.engine.local",
                                    "curate.engine.identity", "curate.engine.images", "curate.publish.card",
                                    "curate.publish.hub", "curate.publish.layout"])
def test_each_module_imports_on_its_own(module: str) -> None:
    code = f"import {module}, json, sys; print(json.dumps('torch' in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    if module in ("curate.features", "curate.engine.base", "curate.engine.identity", "curate.publish.layout"):
        assert json.loads(done.stdout) is False  # reading the cache, naming a model: no torch


# ----------------------------------------------------------------------------- issue 46: runs that do not exist
def test_a_run_that_does_not_exist_is_said_so_with_the_runs_of_that_kind(tmp_path) -> None:
    """`plan --split`, `intervene --split` and `propose-masks --measure --run` name a missing run as
    missing (not "unfinished") and list the finished runs of that kind; an unfinished one is still said."""
    from click.testing import CliRunner
    from publish_helpers import make_dataset

    from curate.cli import main
    from curate.runs import RunError
    from curate.stages.intervene import InterveneSettings, intervene
    from curate.stages.propose_masks import measure_masks

    ds = make_dataset(tmp_path / "ds")  # one finished split run: split-test
    result = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["plan", str(ds.root), "--split", "split-ref"])
    assert result.exit_code == 1 and "not a finished run" not in result.output
    assert "no split run named 'split-ref'" in result.output and "the split runs there: split-test" in result.output
    with pytest.raises(RunError, match=r"no split run named 'split-ref' .*the split runs there: split-test"):
        intervene(ds.root, tmp_path / "iv", InterveneSettings(split="split-ref"))
    with pytest.raises(RunError, match=r"no propose-masks run named 'nosuch' .*no propose-masks runs yet"):
        measure_masks(ds.root, "nosuch")
    from curate.runs import InterventionRun
    from curate.runs.discovery import DiscoveryRun
    from curate.stages.audit import latest_audit

    for load, noun in ((lambda: DiscoveryRun.of_folder(ds.root, "nosuch"), "discovery"),
                       (lambda: InterventionRun.of_folder(ds.root, "nosuch"), "intervention"),
                       (lambda: latest_audit(ds.root, "nosuch"), "audit")):
        with pytest.raises(RunError, match=f"no {noun} run named 'nosuch' .*there are no {noun} runs yet"):
            load()
    (ds.root / "runs" / "split-half").mkdir()  # a run folder without config.json: interrupted
    with pytest.raises(RunError, match="split-half .* is not finished"):
        intervene(ds.root, tmp_path / "iv2", InterveneSettings(split="split-half"))

