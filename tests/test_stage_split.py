"""`curate split`, pins, export and background pre-labels on dataset folders."""
from __future__ import annotations

import csv
import json

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from PIL import Image
from progress_helpers import Recorder, assert_closing_lines_full

from curate.cli import main
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.jsonio import dumps, write_json
from curate.runs import RunError, create_run, load_run
from curate.runs.evaluation import EvaluationRun
from curate.runs.split import SplitRun
from curate.split.pins import load_pins, set_pins
from curate.stages.label_backgrounds import LabelBackgroundsSettings, label_backgrounds
from curate.stages.split import SplitSettings, split
from curate.store import Dataset, NewSample

SETTINGS = SplitSettings(min_per_background=3, n_boot=100, n_perm=200, crossfit_repeats=4)


def with_runs(*names: str, **changes) -> SplitSettings:
    """:data:`SETTINGS` reading the given evaluation runs."""
    from dataclasses import replace

    return replace(SETTINGS, predictions=tuple(names), **changes)


def fake_run(ds, name: str, correct_by_background: dict[str, float], seed: int = 0) -> str:
    """An evaluation run whose correctness depends only on the background (a planted shortcut)."""
    rng = np.random.default_rng(seed)
    rows = ds.rows()
    correct = [bool(rng.random() < correct_by_background.get(r["background"], 0.5)) for r in rows]
    table = pa.table({
        "sample_id": [r["sample_id"] for r in rows], "class_index": [r["class_index"] for r in rows],
        "group": [r["group"] for r in rows], "background": [r["background"] for r in rows],
        "topk_labels": [[r["class_index"] if ok else 0] for r, ok in zip(rows, correct)],
        "topk_scores": [[1.0] for _ in rows], "correct1": correct, "correct5": correct,
    })
    EvaluationRun(model={"name": "fake", "pretrained": None, "model_id": "fake:1", "family": "clip"},
                  label_space={"name": "imagenet1k"}, prompts={"name": "simple", "templates": ["A photo of {}."]},
                  settings={}, dataset={}, metrics={}, predictions_table=table).write(ds.root / "runs" / name)
    return name


@pytest.fixture()
def world(tmp_path):
    spec = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=40, image_size=16, p=0.5, seed=0)
    return collect_synthetic(tmp_path / "w", spec)


def test_split_writes_groups_tables_figures_and_provenance(world) -> None:
    run = fake_run(world, "ref", {"snow": 1.0, "water": 1.0, "sky": 0.9})
    result = split(world.root, None, with_runs(run))
    kept = {s.class_index: s for s in result.kept}
    assert set(kept) == {296, 100, 23}
    assert kept[296].easy in ("snow", "water")
    groups = {r["sample_id"]: (r["group"], r["background"], r["class_index"]) for r in world.rows()}
    for group, background, c in groups.values():
        if group is not None:
            assert background == (kept[c].easy if group == "easy" else kept[c].hard)
    assert sum(g == "easy" for g, _, _ in groups.values()) == sum(s.n_easy for s in kept.values())
    for name in ("split.md", "split.csv", "cells.csv", "split.json", "fig3_counts.png", "fig4_drops.png", "config.json"):
        assert (result.run_dir / name).exists(), name
    md = (result.run_dir / "split.md").read_text()
    assert "| class | easy bkg |" in md and "cross-fitted drop" in md and "p (permutation)" in md
    assert result.noise_summary.text in md and "a curate addition: the paper states no minimum" in md
    assert "--require-significant" in md and "Background labels used: 0 human, 120 synthetic, 0 model." in md
    prov = Dataset.open(world.root).provenance["split"]
    assert prov["rule"]["min_drop"] == 5.0 and prov["references"][0]["run"] == "ref" and prov["run"] == result.name
    assert prov["label_sources"] == {"human": 0, "synthetic": 120, "model": 0, "other": 0}
    assert prov["noise_summary"]["text"] == result.noise_summary.text
    changes = (world.root / "changes.jsonl").read_text().splitlines()
    assert any(json.loads(line).get("actor") == "split" and json.loads(line).get("field") == "group" for line in changes)


def test_the_record_round_trips_and_reports_the_reference_drop(world) -> None:
    result = split(world.root, None, with_runs(fake_run(world, "ref", {"snow": 1.0, "water": 0.6, "sky": 0.2})))
    loaded = SplitRun.load(result.run_dir)
    assert isinstance(load_run(result.run_dir), SplitRun)
    assert loaded.rule == result.rule and loaded.references == result.references
    assert loaded.label_sources == result.label_sources and loaded.changed == result.changed
    assert [dumps(c.to_dict()) for c in loaded.classes] == [dumps(c.to_dict()) for c in result.classes]  # NaN-safe
    assert loaded.references[0].is_paper_setting and loaded.is_reference(model_id="fake:1")
    in_sample, corrected = loaded.reference_drop()
    assert in_sample == pytest.approx(np.mean([c.drop for c in loaded.kept]))
    assert corrected == pytest.approx(np.mean([c.crossfit_drop for c in loaded.kept]))
    assert loaded.reference_drop_text().startswith("in-sample ") and "selection-corrected" in loaded.reference_drop_text()
    assert "in-sample" in loaded.in_sample_note and "cross-fitting" in loaded.in_sample_note
    with pytest.raises(RunError, match="not 'evaluate'"):
        EvaluationRun.load(result.run_dir)
    from curate.publish.card import (
        split_classes,  # the card reads the split through the record
    )

    card_rows = split_classes(Dataset.open(world.root))
    assert {c: (r["easy"], r["hard"], r["drop"]) for c, r in card_rows.items()} == {
        c.class_index: (c.easy, c.hard, c.drop) for c in loaded.classes}


def test_a_version_1_split_run_loads(world) -> None:
    """The layout curate wrote before records (config.json without record_version)."""
    provenance = {"rule": {"min_per_background": 2, "min_drop": 5.0, "require_significant": False, "n_boot": 100,
                           "level": 0.95, "n_perm": 100, "alpha": 0.05, "seed": 0},
                  "references": [{"run": "r", "model_id": "m", "name": "ViT-B-32", "pretrained": "x",
                                  "label_space": "imagenet1k", "prompts": ["A photo of {}."]}],
                  "prompt": "A photo of {}.", "kept_classes": 1, "dropped_classes": 0, "pins": {}}
    run_dir = create_run(world.root, "old", {"kind": "split", **provenance})
    classes = [{"class_index": 296, "kept": True, "reason": "kept", "easy": "snow", "hard": "sky", "easy_acc": 0.9,
                "hard_acc": 0.5, "drop": 0.4, "drop_ci": [0.2, 0.6], "p_value": 0.01, "n_easy": 3, "n_hard": 3,
                "pinned": False, "class_name": "ice bear",
                "cells": [{"background": "snow", "n": 3, "accuracy": 0.9, "ci": [0.5, 1.0], "eligible": True}]}]
    write_json(run_dir / "split.json", {"classes": classes, **provenance})
    old = SplitRun.load(run_dir)
    assert old.rule.crossfit_folds == 0 and old.label_sources is None and old.changed is None
    row = old.kept[0]
    assert (row.easy, row.hard, row.drop, row.drop_ci, row.cells[0].background) == ("snow", "sky", 0.4, (0.2, 0.6), "snow")
    assert np.isnan(row.crossfit_drop) and np.isnan(old.reference_drop().corrected)
    assert old.noise_summary.text == "0 of 1 kept classes are not distinguishable from noise (permutation p >= 0.05)"


def test_rerun_updates_groups_and_pins_survive(world) -> None:
    first = fake_run(world, "ref1", {"snow": 1.0, "water": 1.0, "sky": 0.9})
    split(world.root, None, with_runs(first))
    ds = Dataset.open(world.root)
    set_pins(ds, {296: ("sky", "water")})
    second = fake_run(ds, "ref2", {"snow": 0.5, "water": 0.5, "sky": 0.5}, seed=1)  # the shortcut is gone
    result = split(world.root, None, with_runs(second, min_drop=60, n_boot=50, n_perm=50))
    kept = {s.class_index: s for s in result.kept}
    assert set(kept) == {296} and kept[296].pinned and (kept[296].easy, kept[296].hard) == ("sky", "water")
    rows = Dataset.open(world.root).rows()
    assert {r["group"] for r in rows if r["class_index"] != 296} == {None}  # groups of dropped classes cleared
    assert load_pins(Dataset.open(world.root)) == {296: ("sky", "water")}
    with pytest.raises(ValueError, match="not in the vocabulary"):
        set_pins(ds, {296: ("lava", "sand")})


def test_split_errors(world, tmp_path) -> None:
    with pytest.raises(ValueError, match="--reference"):
        split(world.root, None, SETTINGS)
    with pytest.raises(FileNotFoundError, match="--predictions nope: no evaluation run named 'nope'"):
        split(world.root, None, with_runs("nope"))  # missing, not "unfinished" (issue 46)
    (world.root / "runs" / "half").mkdir(parents=True)
    with pytest.raises(RunError, match="--predictions half: not a finished evaluation run"):
        split(world.root, None, with_runs("half"))
    empty = Dataset.create(tmp_path / "empty")
    with pytest.raises(ValueError, match="no accepted samples with a background"):
        split(empty.root, None, with_runs("x"))


def test_an_existing_run_name_is_refused_unless_overwrite(world) -> None:
    settings = with_runs(fake_run(world, "ref", {"snow": 1.0, "water": 1.0, "sky": 0.5}))
    first = split(world.root, None, settings, run_name="mine")
    with pytest.raises(FileExistsError, match="--overwrite"):
        split(world.root, None, settings, run_name="mine")
    assert SplitRun.load(first.run_dir).classes  # untouched
    again = split(world.root, None, settings, run_name="mine", overwrite=True)
    assert again.run_dir == first.run_dir
    with pytest.raises(FileNotFoundError):  # a failed split leaves no empty folder behind to block the name
        split(world.root, None, with_runs("nope"), run_name="fresh")
    assert not (world.root / "runs" / "fresh").exists()


def test_model_backgrounds_are_refused_unless_allowed(world) -> None:
    ds = Dataset.open(world.root)
    victims = [r["sample_id"] for r in ds.rows()[:7]]
    ds.update(victims, {"background_source": "model"}, actor="test")
    settings = with_runs(fake_run(ds, "ref", {"snow": 1.0, "water": 1.0, "sky": 0.5}))
    with pytest.raises(ValueError, match=r"7 of the 120 background labels .* --allow-model-backgrounds"):
        split(world.root, None, settings)
    assert not [p for p in (world.root / "runs").iterdir() if p.name.startswith("split-")]
    result = split(world.root, None, with_runs("ref", allow_model_backgrounds=True))
    assert (result.label_sources.synthetic, result.label_sources.model) == (113, 7)
    assert "113 synthetic, 7 model" in (result.run_dir / "split.md").read_text()


def test_a_reference_model_is_evaluated_through_the_evaluate_stage(world) -> None:
    from curate.models import ModelSpec

    progress = Recorder()
    result = split(world.root, ModelSpec("curate-tiny-vit"), SplitSettings(min_per_background=3, n_boot=50, n_perm=50,
                                                                          crossfit_repeats=2, device="cpu"),
                   progress=progress)
    (reference,) = result.references
    evaluation = EvaluationRun.load(world.root / "runs" / reference.run)
    assert reference.run == f"{result.run_dir.name}-reference" and evaluation.is_paper_setting
    assert reference.model_id == evaluation.model_id and reference.is_paper_setting
    assert len(result.classes) == 3 and SplitRun.load(result.run_dir).references == result.references
    # progress: the reference phase counts the 120 images it scored and ends at n/n (the encoding inside too)
    progress.assert_every_phase_ends_full()
    assert progress.phases()["reference model"] == [(0, 120), (120, 120)]
    # the tour's case, as typed: every image already encoded, so the evaluation encodes nothing; the
    # logged closing line still says what was scored (it said "reference model: 0 done in 00:08")
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, [
        "split", str(world.root), "--reference", "curate-tiny-vit", "--min-per-background", "3", "--n-perm", "50",
        "--n-boot", "50", "--crossfit-repeats", "2", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert assert_closing_lines_full(result.stderr)["reference model"] == (120, 120)


def test_split_cli(world) -> None:
    fake_run(world, "ref", {"snow": 1.0, "water": 1.0, "sky": 0.5})
    runner = CliRunner(env={"COLUMNS": "200"})
    args = ["split", str(world.root), "--predictions", "ref", "--min-per-background", "3", "--n-perm", "200",
            "--n-boot", "100", "--run-name", "cli"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "kept classes are not distinguishable from noise" in result.output
    assert "cross-fitted" in result.output and "a curate addition" in result.output
    assert "background labels used: 0 human, 120 synthetic, 0 model" in result.output
    assert "reference drop over the kept classes: in-sample" in result.output
    again = runner.invoke(main, args)
    assert again.exit_code != 0 and "--overwrite" in again.output
    assert runner.invoke(main, [*args, "--overwrite"]).exit_code == 0


def test_export_layout_and_licences(world, tmp_path) -> None:
    split(world.root, None, with_runs(fake_run(world, "ref", {"snow": 1.0, "water": 0.9, "sky": 0.1})))
    ds = Dataset.open(world.root)
    victim = ds.rows(group="easy")[0]
    ds.update([victim["sample_id"]], {"license": "cc-by-nd"}, actor="test")
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["export", str(world.root), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "1 left out for their licence" in result.output
    meta = list(csv.DictReader((tmp_path / "out" / "metadata.csv").open()))
    assert all(m["license"] == "cc0" for m in meta)
    for m in meta:
        path = tmp_path / "out" / m["path"]
        class_folder, group_folder, _ = m["path"].split("/")
        assert path.exists() and group_folder == f"{m['group']}-{m['background']}"
        assert class_folder == m["class_name"]
    assert victim["sample_id"] not in {m["sample_id"] for m in meta}
    result = runner.invoke(main, ["export", str(world.root), str(tmp_path / "out")])
    assert result.exit_code == 1 and "not empty" in result.output


def test_label_backgrounds_never_overwrites_people_and_measures(tmp_path) -> None:
    ds = Dataset.create(tmp_path / "d", backgrounds=["snow", "grass", "water"])
    rng = np.random.default_rng(0)
    items = [NewSample(image=Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)), class_index=296,
                       status="accepted", background=bg, background_source=src)
             for bg, src in [("snow", "human"), ("grass", "human"), (None, None), (None, None), ("water", "model")]]
    ds.add_samples(items)
    with pytest.raises(ValueError, match="takes no run name"):
        label_backgrounds(ds, "curate-tiny-vit", LabelBackgroundsSettings(), run_name="x")
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["label-backgrounds", str(ds.root), "--model", "curate-tiny-vit", "--threshold", "0.9"])
    assert result.exit_code == 0, result.output
    rows = Dataset.open(ds.root).rows()
    humans = [r for r in rows if r["background_source"] == "human"]
    assert sorted(r["background"] for r in humans) == ["grass", "snow"]  # untouched
    models = [r for r in rows if r["background_source"] == "model"]
    assert len(models) == 3 and all(r["background"] in ("snow", "grass", "water") for r in models)
    assert all(0 < r["background_score"] <= 1 for r in models)
    for r in models:  # low confidence <=> the review tag
        assert ("review:background" in r["tags"]) == (r["background_score"] < 0.9)
    result = runner.invoke(main, ["label-backgrounds", str(ds.root), "--model", "curate-tiny-vit", "--measure"])
    assert result.exit_code == 0 and "agreement with the existing labels" in result.output and "on 2 samples" in result.output
