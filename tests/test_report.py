"""``curate report``: the Markdown + HTML report and its PNG figures."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image
from publish_helpers import (
    explain_summary,
    make_dataset,
    write_eval_run,
    write_explain_run,
)

from curate.cli import main
from curate.report import build_report, explain_summaries
from curate.store import Dataset

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def world(tmp_path: Path) -> Dataset:
    ds = make_dataset(tmp_path / "world")
    write_eval_run(ds, "eval-a", "model-a", 0.90, 0.40)
    write_eval_run(ds, "eval-b", "model-b", 0.80, 0.45)
    write_eval_run(ds, "eval-c", "model-c", 0.70, 0.50)
    again = write_eval_run(ds, "eval-c-again", "model-c", 0.71, 0.52)  # the same model and setup, newer
    later = (again / "config.json").stat().st_mtime + 5
    os.utime(again / "config.json", (later, later))
    os.utime(again, (later, later))
    write_explain_run(ds)
    return ds


def test_report_has_every_section_and_figure(world: Dataset, tmp_path: Path) -> None:
    path = build_report(world.root, tmp_path / "report")
    out = path.parent
    for name in ("report.md", "report.html", "fig2_scatter.png", "fig3_counts.png", "fig4_drops.png", "gallery.png",
                 "table2.csv"):
        assert (out / name).is_file(), name
    for name in ("fig2_scatter.png", "fig3_counts.png", "fig4_drops.png", "gallery.png"):
        assert (out / name).read_bytes().startswith(PNG)
    md = path.read_text()
    for heading in ("## Data layout (Fig. 3)", "## Per-class drops (Fig. 4)", "## Evaluation (Table 2)",
                    "## Easy vs hard (Fig. 2)", "## Saliency: SSS and RMA by group", "## Gallery"):
        assert heading in md
    # Fig. 3 table: counts per class from the folder
    assert "| missile (657) | grass | 3 | water | 3 |" in md and "| **total** |  | 9 |  | 9 |" in md
    # Fig. 4 table: drop with its interval, and the dropped class with its reason
    # (a version-1 split run: no cross-fitted drop, so "—"; the p-value is shown)
    assert "| ostrich (9) | grass | 90.0 | water | 40.0 | 50.0 [30.0, 70.0] | — | 0.010 | 3 | 3 |" in md
    assert "drop 1.0 <= 5" in md
    assert "kept classes are not distinguishable from noise" in md and "in-sample" in md
    assert "`--min-per-background` is a curate addition" in md
    # Table 2: intervals, effective robustness defined for 3 models, the repeat left out
    row = next(line for line in md.splitlines() if line.startswith("| model-a |"))
    assert "90.0 [85.0, 95.0]" in row and "50.0 [40.0, 60.0]" in row
    assert re.search(r"\| -?\d+\.\d \| 9 \| 9 \| `eval-a` \|", row)
    assert "`eval-c` (repeats `eval-c-again`)" in md and "| model-c |" in md
    assert "| clip | imagenet1k | simple | 3 | logit |" in md  # the fit over 3 models of one family
    # SSS / RMA by group
    assert "| `explain-gradcam-m-a` | open_clip:m-a / gradcam / visual.trunk / true | easy | 0.300 | 0.700 | 0.800 | 9 | 0 |" in md
    assert "| hard | 0.600 | 0.400 | 0.800 | 8 | 1 |" in md
    # gallery: 3 + 3 thumbnails for each of the 3 classes
    with Image.open(out / "gallery.png") as gallery:
        assert gallery.height >= 3 * 96
    html = (out / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and '<img src="fig2_scatter.png"' in html and "<table>" in html
    assert "<code>eval-a</code>" in html


def test_report_on_a_folder_without_split_or_runs(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "bare", split_run=False)
    ds.update(ds.ids(), {"group": None}, actor="test", reason="no split")
    path = build_report(ds.root)
    assert path == ds.root / "runs" / "report" / "report.md"
    md = path.read_text()
    assert "run `curate split DIR --reference MODEL` first" in md
    assert "run `curate evaluate DIR --model ...` after the split" in md
    assert "Saliency" not in md  # no explain run, no section
    assert not (path.parent / "fig2_scatter.png").exists() and not (path.parent / "gallery.png").exists()


def test_explain_runs_in_an_unexpected_shape_are_skipped_with_a_note(world: Dataset) -> None:
    write_explain_run(world, "explain-broken", {"config": {"kind": "explain"}, "by_group": {"easy": {}}})
    entries, notes = explain_summaries(world.root)
    assert [e["run"] for e in entries] == ["explain-gradcam-m-a"]
    assert notes and "explain-broken" in notes[0]
    md = build_report(world.root).read_text()
    assert "Skipped: `explain-broken`" in md


def test_explain_section_reads_a_version_1_run_through_the_record(world: Dataset) -> None:
    """A run written before records existed (summary.json, no record_version) loads as ExplainRun,
    and the report's entry carries its numbers and NaN counts unchanged."""
    import json

    (entry,), notes = explain_summaries(world.root)
    assert not notes
    summary = explain_summary()
    for group in ("easy", "hard"):
        expected = summary["by_group"][group]
        assert entry["groups"][group]["sss"] == expected["sss"]["mean"]
        assert entry["groups"][group]["rma"] == expected["rma"]["mean"]
        assert entry["groups"][group]["n_nan"] == expected["sss"]["n_nan"]
    assert entry["overall"]["sss"] == summary["overall"]["sss"]["per_image"]["mean"]
    assert entry["nan"] == 1
    assert json.dumps(entry)  # plain data


def test_cli_report(world: Dataset, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["report", str(world.root), "--out", str(tmp_path / "r"), "--run", "eval-a",
                                       "--run", "eval-b", "--gallery", "1"])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| model-a |" in md and "| model-b |" in md and "| model-c |" not in md
    assert "wrote" in result.output
