"""The zero-shot evaluation engine: agreement with CLIP_benchmark, the cache, the run layout."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from eval_helpers import CLASSES, make_folder

from curate.features import FEATURES_DIR
from curate.models import ModelSpec, load_model
from curate.stages.evaluate import EvalSettings, evaluate

TINY = ModelSpec("curate-tiny-vit", None)


def _seeded(name: str = "curate-tiny-vit", seed: int = 0):
    return load_model(name, seed=seed)


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    ds = make_folder(tmp_path / "ds")
    # curate loads models by spec; route the tiny spec to a seeded model so runs are repeatable
    import curate.stages.evaluate as ev

    monkeypatch.setattr(ev, "_load", lambda spec, settings: load_model(spec.name, spec.pretrained, seed=0,
                                                                       device=settings.device, precision=settings.precision))
    return ds


def test_agrees_exactly_with_clip_benchmark(tmp_path, monkeypatch) -> None:
    """acc1, acc5 and mean_per_class_recall equal CLIP_benchmark's evaluate on the same model,
    images, prompt and 12 candidate labels (a subset, so that random weights give accuracies
    strictly between 0 and 1 and the comparison can fail)."""
    from clip_benchmark.metrics import zeroshot_classification as zsc

    import curate.stages.evaluate as ev
    from curate.labels import imagenet1k

    monkeypatch.setattr(ev, "_load", lambda spec, settings: load_model(spec.name, seed=0))
    classes = (9, 296, 100, 23, 291)
    subset = list(classes) + [0, 1, 2, 3, 4, 5, 6]
    ds = make_folder(tmp_path / "agree", classes=classes, per_class=12)
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(map(str, subset)))
    result = evaluate(ds.root, TINY, EvalSettings(label_space=str(labels), bootstrap=10))
    model = _seeded()
    rows = ds.rows()
    names = [imagenet1k().names[i] for i in subset]

    class ImageSet(torch.utils.data.Dataset):
        classes = names

        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return model.preprocess(ds.load_image(rows[i]["sample_id"])), subset.index(rows[i]["class_index"])

    loader = torch.utils.data.DataLoader(ImageSet(), batch_size=7)
    theirs = zsc.evaluate(model.module, loader, model.tokenizer, names, ["A photo of {c}."], "cpu", amp=False)
    ours = result.metrics["overall"]
    assert 0 < ours["acc1"] < 1 and 0 < ours["acc5"] < 1, ours  # a comparison that can fail
    assert ours["acc1"] == theirs["acc1"]
    assert ours["acc5"] == theirs["acc5"]
    assert ours["mean_per_class_recall"] == pytest.approx(theirs["mean_per_class_recall"], abs=1e-12)


def test_run_layout_and_second_evaluation_reuses_the_cache(folder) -> None:
    first = evaluate(folder.root, TINY, EvalSettings(bootstrap=50), run_name="a")
    assert first.images_encoded == len(CLASSES) * 6
    run = first.run_dir
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["model_id"] == "open_clip:curate-tiny-vit:random-seed0"
    assert config["prompts"]["templates"] == ["A photo of {}."] and config["label_space"]["name"] == "imagenet1k"
    table = pq.read_table(run / "predictions.parquet")
    assert table.num_rows == 30 and len(table.column("topk_labels")[0].as_py()) == 5
    metrics = json.loads((run / "metrics.json").read_text())
    for key in ("acc1_balanced", "acc1_unbalanced", "acc5_balanced", "n", "acc1_balanced_ci95"):
        assert key in metrics["groups"]["easy"] and key in metrics["groups"]["hard"]
    assert {row["class_index"] for row in metrics["per_class"]} == set(CLASSES)
    assert {"easy_acc1", "hard_acc1", "drop", "n_easy", "n_hard"} <= set(metrics["per_class"][0])
    # another prompt set, label space and run: no image is encoded again
    second = evaluate(folder.root, TINY, EvalSettings(prompts="openai", bootstrap=50), run_name="b")
    assert second.images_encoded == 0
    third = evaluate(folder.root, TINY, EvalSettings(bootstrap=50), run_name="c")
    assert third.images_encoded == 0 and third.metrics["overall"] == first.metrics["overall"]
    with pytest.raises(FileExistsError):
        evaluate(folder.root, TINY, EvalSettings(bootstrap=50), run_name="a")


def test_duplicate_imagenet_names_are_scored_by_index(folder) -> None:
    result = evaluate(folder.root, TINY, EvalSettings(bootstrap=10))
    per_class = {row["class_index"]: row for row in result.metrics["per_class"]}
    assert per_class[657]["class_name"] == per_class[744]["class_name"] == "missile"
    assert per_class[657]["n"] == per_class[744]["n"] == 6
    preds = pq.read_table(result.run_dir / "predictions.parquet").to_pylist()
    # the two missile labels have identical prompts, hence identical logits; each is a label of its own
    for row in preds:
        if 657 in row["topk_labels"][:2] and 744 in row["topk_labels"][:2]:
            assert row["topk_scores"][0] == pytest.approx(row["topk_scores"][1])


def test_file_label_space_and_unknown_labels(folder, tmp_path) -> None:
    good = tmp_path / "five.txt"
    good.write_text("ostrich\n296\nn01860187  # black swan by WordNet id\n657\n744\n")
    result = evaluate(folder.root, TINY, EvalSettings(label_space=str(good), bootstrap=10))
    preds = pq.read_table(result.run_dir / "predictions.parquet").to_pylist()
    assert all(set(r["topk_labels"]) <= set(CLASSES) for r in preds)
    bad = tmp_path / "bad.txt"
    bad.write_text("ostrich\nunicorn\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: unknown class 'unicorn'"):
        evaluate(folder.root, TINY, EvalSettings(label_space=str(bad)))
    partial = tmp_path / "partial.txt"
    partial.write_text("ostrich\n")
    with pytest.raises(ValueError, match="does not contain the true class"):
        evaluate(folder.root, TINY, EvalSettings(label_space=str(partial)))


def test_top20_is_built_once_saved_and_reused(folder) -> None:
    ref = ModelSpec("curate-tiny-vit", None)
    settings = EvalSettings(label_space="top20", top20_reference=ref, bootstrap=10)
    first = evaluate(folder.root, TINY, settings)
    saved = json.loads((folder.root / "labelspaces" / "top20.json").read_text())
    assert set(saved["classes"]) == {str(c) for c in CLASSES}
    for c, labels in saved["classes"].items():
        assert len(labels) == 20 and int(c) in labels
    preds = pq.read_table(first.run_dir / "predictions.parquet").to_pylist()
    for row in preds:
        assert set(row["topk_labels"]) <= set(saved["classes"][str(row["class_index"])])
    mtime = (folder.root / "labelspaces" / "top20.json").stat().st_mtime_ns
    evaluate(folder.root, ModelSpec("curate-tiny-rn", None), EvalSettings(label_space="top20", bootstrap=10))
    assert (folder.root / "labelspaces" / "top20.json").stat().st_mtime_ns == mtime  # reused unchanged
    with pytest.raises(ValueError, match="rebuild-top20"):
        evaluate(folder.root, TINY, EvalSettings(label_space="top20", top20_reference=ModelSpec("curate-tiny-rn")))


def test_top20_needs_a_reference(folder) -> None:
    with pytest.raises(ValueError, match="--top20-reference"):
        evaluate(folder.root, TINY, EvalSettings(label_space="top20"))


def test_classifier_uses_its_logits_restricted_to_the_candidates(folder, tmp_path) -> None:
    labels = tmp_path / "five.txt"
    labels.write_text("\n".join(str(c) for c in CLASSES))
    spec = ModelSpec("timm:test_resnet", None)
    full = evaluate(folder.root, spec, EvalSettings(bootstrap=10), run_name="full")
    sub = evaluate(folder.root, spec, EvalSettings(label_space=str(labels), bootstrap=10), run_name="sub")
    assert sub.images_encoded == 0  # logits came from the cache
    model = load_model("timm:test_resnet", seed=0)
    rows = {r["sample_id"]: r for r in folder.rows()}
    preds = pq.read_table(sub.run_dir / "predictions.parquet").to_pylist()
    for row in preds[:5]:
        image = model.preprocess_images([folder.load_image(row["sample_id"])])
        logits = model.logits(image)[0].numpy()
        expected = np.array(CLASSES)[np.argsort(-logits[list(CLASSES)], kind="stable")]
        assert row["topk_labels"] == expected.tolist()
        assert rows[row["sample_id"]]["class_index"] == row["class_index"]
    assert full.metrics["overall"]["n"] == sub.metrics["overall"]["n"] == 30


def test_no_groups_still_reports_overall_and_per_background(tmp_path, monkeypatch) -> None:
    ds = make_folder(tmp_path / "nogroups", with_groups=False)
    import curate.stages.evaluate as ev

    monkeypatch.setattr(ev, "_load", lambda spec, settings: load_model(spec.name, seed=0))
    result = evaluate(ds.root, TINY, EvalSettings(bootstrap=10))
    assert result.metrics["groups"] == {} and result.metrics["drop"] is None
    assert {row["background"] for row in result.metrics["per_background"]} == {"grass", "water"}
    assert result.metrics["overall"]["n"] == 30


def test_corrupt_image_at_evaluation_time_is_excluded_and_counted(folder) -> None:
    victim = folder.rows()[3]
    path = folder.image_path(victim["sample_id"])
    path.write_bytes(path.read_bytes()[:40])  # damaged after ingestion
    result = evaluate(folder.root, TINY, EvalSettings(bootstrap=10))
    excluded = result.metrics["excluded"]
    assert excluded["count"] == 1 and excluded["samples"][0]["sample_id"] == victim["sample_id"]
    assert result.metrics["overall"]["n"] == 29


def test_non_finite_outputs_are_excluded(folder, monkeypatch) -> None:
    import curate.features as features

    real = features._model_output
    first = folder.rows()[0]["sample_id"]

    def poisoned(model, kind, batch):
        out = real(model, kind, batch)
        out[0] = float("nan")
        return out

    monkeypatch.setattr(features, "_model_output", poisoned)
    result = evaluate(folder.root, TINY, EvalSettings(bootstrap=10, batch_size=64))
    assert result.metrics["excluded"]["count"] == 1
    assert result.metrics["excluded"]["samples"][0]["sample_id"] == first
    assert "non-finite" in result.metrics["excluded"]["samples"][0]["reason"]


def test_a_cache_from_another_model_or_format_is_never_reused(folder) -> None:
    from curate.features import FeatureCache, compute_features

    model = _seeded()
    ids = [r["sample_id"] for r in folder.rows()]
    compute_features(folder, model, ids)
    cache = FeatureCache(folder.root, model, "embedding")
    index = json.loads((cache.folder / "index.json").read_text())
    index["record"]["model_id"] = "open_clip:someone-else"
    (cache.folder / "index.json").write_text(json.dumps(index))
    again = compute_features(folder, model, ids)
    assert again.computed == len(ids)  # recomputed, not reused
    index = json.loads((cache.folder / "index.json").read_text())
    index["record"]["version"] = 0  # an older format
    (cache.folder / "index.json").write_text(json.dumps(index))
    assert compute_features(folder, model, ids).computed == len(ids)
    np.save(cache.folder / json.loads((cache.folder / "index.json").read_text())["values"], np.zeros((2, 2), np.float32))
    assert compute_features(folder, model, ids).computed == len(ids)  # damaged array: recomputed


def test_cuda_requested_but_absent_is_a_clear_error(folder) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the error case cannot happen here")
    with pytest.raises(RuntimeError, match="CUDA was requested"):
        evaluate(folder.root, TINY, EvalSettings(device="cuda"))


def test_empty_selection_is_a_clear_error(folder) -> None:
    with pytest.raises(ValueError, match="no samples with status"):
        evaluate(folder.root, TINY, EvalSettings(statuses=("rejected",)))


def test_a_finished_run_name_is_refused_before_any_work(folder) -> None:
    """docs/design.md#run-folders: the name is checked first; no image is encoded, no progress reported."""
    finished = folder.root / "runs" / "a"
    finished.mkdir(parents=True)
    (finished / "config.json").write_text("{}")
    calls: list = []
    with pytest.raises(FileExistsError, match="--overwrite"):
        evaluate(folder.root, TINY, EvalSettings(bootstrap=10), run_name="a", progress=lambda *call: calls.append(call))
    assert calls == [] and not (folder.root / FEATURES_DIR).exists()


def test_nothing_scored_writes_no_run(folder) -> None:
    """Every image unreadable: a clear error naming the reason, and no empty run to hide a real one."""
    for row in folder.rows():
        path = folder.image_path(row["sample_id"])
        path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match="no sample could be scored: all 30 "):
        evaluate(folder.root, TINY, EvalSettings(bootstrap=10), run_name="empty")
    assert not (folder.root / "runs" / "empty").exists()


def test_rescoring_a_subset_slices_the_cached_classifier_and_encodes_nothing(folder, tmp_path, monkeypatch) -> None:
    """After a 1-vs-1000 run, a subset label space with the same prompts needs no text or image encoding,
    and equals the 1-vs-1000 scores restricted to the subset."""
    from curate.models.clip import ClipModel

    full = evaluate(folder.root, TINY, EvalSettings(bootstrap=10), run_name="full")
    calls = {"text": 0}
    real = ClipModel.encode_text

    def counting(self, *args, **kwargs):
        calls["text"] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ClipModel, "encode_text", counting)
    labels = tmp_path / "five.txt"
    labels.write_text("\n".join(str(c) for c in CLASSES))
    sub = evaluate(folder.root, TINY, EvalSettings(label_space=str(labels), bootstrap=10), run_name="sub")
    assert sub.images_encoded == 0 and calls["text"] == 0
    full_rows = {r["sample_id"]: r for r in pq.read_table(full.run_dir / "predictions.parquet").to_pylist()}
    for row in pq.read_table(sub.run_dir / "predictions.parquet").to_pylist():
        kept = [(label, s) for label, s in zip(full_rows[row["sample_id"]]["topk_labels"], full_rows[row["sample_id"]]["topk_scores"])
                if label in CLASSES]
        if kept:  # the best subset label among the full run's top-5 is the subset run's top-1
            assert row["topk_labels"][0] == kept[0][0] and row["topk_scores"][0] == pytest.approx(kept[0][1])


def test_the_evaluate_table_labels_each_column_by_what_it_holds(tmp_path) -> None:
    """Issue 45: the title said "balanced top-1 %" while the `acc1` column held the per-image accuracy."""
    from click.testing import CliRunner

    from curate.cli import main
    from curate.formatting import pct

    ds = make_folder(tmp_path / "ds", per_class=5)  # 3 easy + 2 hard per class: per-photo != balanced
    result = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["evaluate", str(ds.root), "--model", "curate-tiny-vit",
                                                             "--bootstrap", "10"])
    assert result.exit_code == 0, result.output
    assert "balanced top-1 %" not in result.output
    header = next(line for line in result.output.splitlines() if "model" in line and "drop" in line)
    assert "top-1 (per photo)" in header and "easy (balanced)" in header and "hard (balanced)" in header
    from curate.runs import EvaluationRun

    run = EvaluationRun.load(next((ds.root / "runs").iterdir()))
    row = next(line for line in result.output.splitlines() if run.model_label[:10] in line and line != header)
    cells = [c.strip() for c in row.split("│")[1:]]
    assert cells[1] == pct(run.overall["acc1"], 2) and cells[3] == pct(run.group("easy").acc1, 2)


def test_one_photo_per_cell_gives_no_interval_in_evaluate_compare_and_the_report(tmp_path) -> None:
    """Issue 45: one photo per (class, group) printed `19.23 [19.23, 19.23]` in evaluate, compare.csv and
    the report's Table 2; the interval rule (curate.metrics.bootstrap) gives none in each."""
    from click.testing import CliRunner

    from curate.cli import main
    from curate.compare import compare_runs
    from curate.report import evaluation_rows

    ds = make_folder(tmp_path / "ds", per_class=2)  # one easy and one hard photo per class
    result = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["evaluate", str(ds.root), "--model", "curate-tiny-vit",
                                                             "--bootstrap", "50", "--run-name", "one"])
    assert result.exit_code == 0, result.output
    from curate.runs import EvaluationRun

    run = EvaluationRun.load(ds.root / "runs" / "one")
    assert all(np.isnan(run.drop.acc1_ci)) and all(np.isnan(run.group("hard").acc1_ci))
    row = next(line for line in result.output.splitlines() if "curate-tiny-vit" in line)
    assert "[" not in row  # the drop is printed without an interval
    rows, folder = compare_runs(ds.root, tmp_path / "cmp", None)
    assert all(np.isnan(rows[0].drop_ci)) and all(np.isnan(rows[0].easy_ci))
    compared = next(line for line in (folder / "compare.md").read_text().splitlines() if "curate-tiny-vit" in line)
    assert "[" not in compared
    assert all(np.isnan(evaluation_rows(ds.root)[0][0].drop_ci))
    from curate.report import build_report

    table2 = [line for line in build_report(ds.root).read_text().splitlines() if line.startswith("| curate-tiny-vit")]
    assert table2 and all("[" not in line for line in table2)
