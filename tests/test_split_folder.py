"""`curate split`, pins, export and background pre-labels on dataset folders."""
from __future__ import annotations

import csv
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image

from curate.cli import main
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.split.apply import load_pins, set_pins, split_dataset
from curate.split.discovery import SplitRule
from curate.store import Dataset, NewSample

RULE = SplitRule(min_per_background=3, n_boot=100, n_perm=200)


def fake_run(ds, name: str, correct_by_background: dict[str, float], seed: int = 0) -> str:
    """An evaluation run whose correctness depends only on the background (a planted shortcut)."""
    rng = np.random.default_rng(seed)
    rows = ds.rows()
    correct = [bool(rng.random() < correct_by_background.get(r["background"], 0.5)) for r in rows]
    run = ds.root / "runs" / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"kind": "evaluate", "label_space": {"name": "imagenet1k"},
                                                 "prompts": {"templates": ["A photo of {}."]},
                                                 "model": {"name": "fake", "pretrained": None, "model_id": "fake:1"}}))
    pq.write_table(pa.table({"sample_id": [r["sample_id"] for r in rows], "correct1": correct}), run / "predictions.parquet")
    return name


@pytest.fixture()
def world(tmp_path):
    spec = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=40, image_size=16, p=0.5, seed=0)
    return collect_synthetic(tmp_path / "w", spec)


def test_split_writes_groups_tables_figures_and_provenance(world) -> None:
    run = fake_run(world, "ref", {"snow": 1.0, "water": 1.0, "sky": 0.9})
    result = split_dataset(world.root, predictions=[run], rule=RULE)
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
    assert "| class | easy bkg |" in (result.run_dir / "split.md").read_text()
    prov = Dataset.open(world.root).provenance["split"]
    assert prov["rule"]["min_drop"] == 5.0 and prov["references"][0]["run"] == "ref"
    changes = (world.root / "changes.jsonl").read_text().splitlines()
    assert any(json.loads(line).get("actor") == "split" and json.loads(line).get("field") == "group" for line in changes)


def test_rerun_updates_groups_and_pins_survive(world) -> None:
    first = fake_run(world, "ref1", {"snow": 1.0, "water": 1.0, "sky": 0.9})
    split_dataset(world.root, predictions=[first], rule=RULE)
    ds = Dataset.open(world.root)
    set_pins(ds, {296: ("sky", "water")})
    second = fake_run(ds, "ref2", {"snow": 0.5, "water": 0.5, "sky": 0.5}, seed=1)  # the shortcut is gone
    result = split_dataset(world.root, predictions=[second], rule=SplitRule(min_per_background=3, min_drop=60, n_boot=50, n_perm=50))
    kept = {s.class_index: s for s in result.kept}
    assert set(kept) == {296} and kept[296].pinned and (kept[296].easy, kept[296].hard) == ("sky", "water")
    rows = Dataset.open(world.root).rows()
    assert {r["group"] for r in rows if r["class_index"] != 296} == {None}  # groups of dropped classes cleared
    assert load_pins(Dataset.open(world.root)) == {296: ("sky", "water")}
    with pytest.raises(ValueError, match="not in the vocabulary"):
        set_pins(ds, {296: ("lava", "sand")})


def test_split_errors(world, tmp_path) -> None:
    with pytest.raises(ValueError, match="--reference"):
        split_dataset(world.root, rule=RULE)
    with pytest.raises(FileNotFoundError, match="not a finished evaluation run"):
        split_dataset(world.root, predictions=["nope"], rule=RULE)
    empty = Dataset.create(tmp_path / "empty")
    with pytest.raises(ValueError, match="no accepted samples with a background"):
        split_dataset(empty.root, predictions=["x"], rule=RULE)


def test_export_layout_and_licences(world, tmp_path) -> None:
    split_dataset(world.root, predictions=[fake_run(world, "ref", {"snow": 1.0, "water": 0.9, "sky": 0.1})], rule=RULE)
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
