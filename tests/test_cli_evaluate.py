"""`curate evaluate` and `curate compare` as a user runs them on a small folder."""
from __future__ import annotations

import csv
import json
import os

import pytest
from click.testing import CliRunner
from eval_helpers import CLASSES, make_folder

from curate.cli import main
from curate.runs.evaluation import EvaluationRun


@pytest.fixture()
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200"})


def test_evaluate_three_models_then_compare(tmp_path, runner) -> None:
    ds = make_folder(tmp_path / "ds")
    result = runner.invoke(main, ["evaluate", str(ds.root), "--model", "curate-tiny-vit", "--model", "curate-tiny-rn",
                                  "--model", "timm:test_resnet", "--pretrained", "none", "--pretrained", "none",
                                  "--pretrained", "none", "--run-name", "t", "--bootstrap", "50"])
    assert result.exit_code == 0, result.output
    runs = sorted(p.name for p in (ds.root / "runs").iterdir())
    assert runs == ["t-curate-tiny-rn", "t-curate-tiny-vit", "t-timm-test_resnet"]
    for run in runs:
        metrics = json.loads((ds.root / "runs" / run / "metrics.json").read_text())
        assert set(metrics["groups"]) == {"easy", "hard"} and "drop" in metrics
    result = runner.invoke(main, ["compare", str(ds.root)])
    assert result.exit_code == 0, result.output
    folder = ds.root / "runs" / "compare"
    assert (folder / "compare.png").read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader((folder / "compare.csv").open()))
    assert len(rows) == 3 and {"easy_acc1", "hard_acc1", "drop", "effective_robustness"} <= set(rows[0])
    assert "| model | family | label space |" in (folder / "compare.md").read_text()
    assert sorted(r["family"] for r in rows) == ["classifier", "clip", "clip"]  # fitted separately, never pooled
    assert {r["er_scale"] for r in rows} == {"logit"}
    result = runner.invoke(main, ["compare", str(ds.root), "--er-scale", "linear"])
    assert result.exit_code == 0 and "linear scale" in result.output
    assert {r["er_scale"] for r in csv.DictReader((folder / "compare.csv").open())} == {"linear"}


def test_evaluate_errors_are_clear(tmp_path, runner) -> None:
    ds = make_folder(tmp_path / "ds")
    result = runner.invoke(main, ["evaluate", str(ds.root), "--model", "a", "--model", "b", "--pretrained", "x"])
    assert result.exit_code != 0 and "one --pretrained per --model" in result.output
    result = runner.invoke(main, ["evaluate", str(ds.root), "--model", "no-such-model"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "error: 'no-such-model' is neither" in result.output and "ModelNotFoundError" not in result.output
    bad = tmp_path / "labels.txt"
    bad.write_text("ostrich\nnot a label\n")
    result = runner.invoke(main, ["evaluate", str(ds.root), "--model", "curate-tiny-vit", "--label-space", str(bad)])
    assert result.exit_code == 1 and "labels.txt:2" in result.output
    result = runner.invoke(main, ["compare", str(ds.root)])
    assert result.exit_code == 1 and "no evaluation runs" in result.output


def test_evaluate_replaces_a_killed_run_of_the_same_name(tmp_path, runner) -> None:
    """docs/design.md#run-folders: a folder without config.json (what a killed run leaves) is an
    unfinished run; the same command replaces it, saying so, and leaves none of its files."""
    ds = make_folder(tmp_path / "ds", per_class=2)
    killed = ds.root / "runs" / "t"
    killed.mkdir(parents=True)
    (killed / "predictions.parquet").write_bytes(b"PAR1 torn")
    (killed / "stray.tmp").write_bytes(b"")
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(str(c) for c in CLASSES))
    result = runner.invoke(main, ["evaluate", str(ds.root), "--model", "curate-tiny-vit", "--pretrained", "none",
                                  "--label-space", str(labels), "--run-name", "t", "--bootstrap", "10"])
    assert result.exit_code == 0, result.output
    assert "unfinished" in result.output and "replacing it" in result.output
    assert sorted(p.name for p in killed.iterdir()) == ["config.json", "metrics.json", "predictions.parquet"]
    assert EvaluationRun.load(killed).model_id == "open_clip:curate-tiny-vit:random"


def test_evaluate_checks_every_run_name_before_scoring_the_first_model(tmp_path, runner) -> None:
    """Two models named t-<model>: the second name is taken, so nothing is scored and nothing written."""
    ds = make_folder(tmp_path / "ds", per_class=2)
    taken = ds.root / "runs" / "t-curate-tiny-rn"
    taken.mkdir(parents=True)
    (taken / "config.json").write_text("{}")
    result = runner.invoke(main, ["evaluate", str(ds.root), "--model", "curate-tiny-vit", "--model", "curate-tiny-rn",
                                  "--pretrained", "none", "--pretrained", "none", "--run-name", "t"])
    assert result.exit_code == 1 and "t-curate-tiny-rn exists" in result.output, result.output
    assert sorted(p.name for p in (ds.root / "runs").iterdir()) == ["t-curate-tiny-rn"]
    assert not (ds.root / "features").exists()


def test_evaluate_refuses_a_run_that_a_live_process_writes(tmp_path, runner) -> None:
    """The run's lock (curate.runs.lock) is held by a live writer: refused at once, naming it."""
    from curate.runs.lock import run_lock

    ds = make_folder(tmp_path / "ds", per_class=2)
    with run_lock(ds.root, "t", purpose="evaluate"):
        result = runner.invoke(main, ["evaluate", str(ds.root), "--model", "curate-tiny-vit", "--pretrained", "none",
                                      "--run-name", "t"])
    assert result.exit_code == 1 and f"being written by process {os.getpid()}" in result.output, result.output
    assert not (ds.root / "runs" / "t").exists() and not (ds.root / "features").exists()
