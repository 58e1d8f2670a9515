"""`curate evaluate` and `curate compare` as a user runs them on a small folder."""
from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner
from eval_helpers import make_folder

from curate.cli import main


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
