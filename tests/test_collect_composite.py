"""Composites: exact masks, the planted correlation (exact and binomial), image backgrounds,
licences, determinism, resume and the CLI. Objects come from a small synthetic world (exact masks)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from fake_inat import dataset_signature
from hypothesis import given, settings
from hypothesis import strategies as st

from curate.cli import main
from curate.collect.composite import (
    NAMED_COLORS,
    CompositeSpec,
    compose,
    parse_color,
    plan_backgrounds,
)
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.store import Dataset, check_dataset


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("objects") / "world"
    collect_synthetic(root, WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=10, image_size=32, seed=3))
    return root


def _rows(root: Path) -> list[dict]:
    rows = Dataset.open(root).rows()
    for row in rows:
        row["extra"] = json.loads(row["extra"])
    return rows


def test_masks_are_exact_and_the_correlation_is_planted(tmp_path, objects) -> None:
    colors = ("red", "green", "blue", "yellow")
    report = compose(objects, tmp_path / "c", CompositeSpec(p=0.8, colors=colors, seed=1))
    ds = Dataset.open(tmp_path / "c")
    src = Dataset.open(objects)
    assert ds.backgrounds == list(colors) and ds.label_space.names == src.label_space.names
    rows = _rows(tmp_path / "c")
    assert len(rows) == 30
    for row in rows:
        image = np.asarray(ds.load_image(row["sample_id"]))
        mask = ds.load_mask(row["sample_id"]).astype(bool)
        obj = np.asarray(src.load_image(row["extra"]["object_sample_id"]))
        obj_mask = src.load_mask(row["extra"]["object_sample_id"]) > 0
        assert np.array_equal(mask, obj_mask)  # the stored mask is exactly the object's pixels
        assert np.array_equal(image[mask], obj[mask])
        assert (image[~mask] == NAMED_COLORS[row["background"]]).all()
        assert row["background_source"] == "synthetic" and row["mask_status"] == "exact"
        assert row["extra"]["aligned"] == (row["background"] == row["extra"]["common_background"])
    by_class: dict[int, list[dict]] = {}
    for row in rows:
        by_class.setdefault(row["class_index"], []).append(row)
    commons = {cls: group[0]["extra"]["common_background"] for cls, group in by_class.items()}
    assert sorted(commons.values()) == sorted(colors[:3])  # classes in index order take colours in order
    for cls, group in by_class.items():
        assert sum(r["background"] == commons[cls] for r in group) == 8  # exactly round(0.8 * 10)
        others = [r["background"] for r in group if r["background"] != commons[cls]]
        assert len(set(others)) == 2  # the other 2 spread over the other backgrounds
    assert all(info["aligned"] == 8 and info["total"] == 10 for info in report.info["aligned"].values())
    assert not check_dataset(tmp_path / "c")
    again = compose(objects, tmp_path / "c", CompositeSpec(p=0.8, colors=colors, seed=1))
    assert not again.added and len(Dataset.open(tmp_path / "c")) == 30


def test_plan_backgrounds_exact_and_binomial() -> None:
    rng = np.random.default_rng(0)
    plan = plan_backgrounds(200, "red", ["green", "blue", "grey"], 0.9, rng)
    assert plan.count("red") == 180 and {plan.count(c) for c in ("green", "blue", "grey")} <= {6, 7}
    draws = plan_backgrounds(4000, "red", ["green", "blue"], 0.7, np.random.default_rng(1), exact=False)
    assert abs(draws.count("red") / 4000 - 0.7) < 0.03
    assert plan_backgrounds(10, "red", ["green"], 0.0, rng).count("red") == 0


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), p=st.floats(0, 1), k=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_plan_backgrounds_properties(n, p, k, seed) -> None:
    others = [f"bg{i}" for i in range(k)]
    plan = plan_backgrounds(n, "common", others, p, np.random.default_rng(seed))
    assert len(plan) == n and plan.count("common") == int(np.floor(p * n + 0.5))
    counts = [plan.count(o) for o in others]
    assert max(counts) - min(counts) <= 1  # the rest is spread evenly


def test_resized_output_and_ood_split(tmp_path, objects) -> None:
    spec = CompositeSpec(p=0.0, colors=("red", "green", "blue"), size=48, seed=2, per_class=6)
    compose(objects, tmp_path / "ood", spec)
    ds = Dataset.open(tmp_path / "ood")
    for row in _rows(tmp_path / "ood"):
        assert not row["extra"]["aligned"]
        image = np.asarray(ds.load_image(row["sample_id"]))
        mask = ds.load_mask(row["sample_id"]).astype(bool)
        assert image.shape == (48, 48, 3) and mask.any()
        assert (image[~mask] == NAMED_COLORS[row["background"]]).all()


def test_image_backgrounds(tmp_path, objects) -> None:
    backs = tmp_path / "backs"
    collect_synthetic(backs, WorldSpec(classes=DEFAULT_CLASSES[3:6], per_class=4, image_size=40, seed=9))
    compose(objects, tmp_path / "c", CompositeSpec(p=1.0, backgrounds_root=str(backs), seed=0, classes=(296,)))
    rows = _rows(tmp_path / "c")
    back_ds = Dataset.open(backs)
    assert rows and all(r["background"] == r["extra"]["common_background"] for r in rows)
    assert Dataset.open(tmp_path / "c").backgrounds == [b for b in back_ds.backgrounds
                                                        if back_ds.select(background=b).num_rows]
    for row in rows:
        assert back_ds.row(row["extra"]["background_sample_id"])["background"] == row["background"]


def test_restricted_object_licences_are_refused(tmp_path, objects) -> None:
    src = tmp_path / "objs"
    collect_synthetic(src, WorldSpec(classes=DEFAULT_CLASSES[:2], per_class=2, image_size=32, seed=5))
    ds = Dataset.open(src)
    ds.update(ds.sample_ids()[:1], {"license": "cc-by-nd"}, actor="test")
    report = compose(src, tmp_path / "c", CompositeSpec(colors=("red", "blue"), seed=0))
    assert report.totals()["skipped"] == 1 and len(Dataset.open(tmp_path / "c")) == 3
    report = compose(src, tmp_path / "d", CompositeSpec(colors=("red", "blue"), seed=0, allow_restricted_licenses=True))
    assert len(Dataset.open(tmp_path / "d")) == 4


def test_deterministic_for_a_seed(tmp_path, objects) -> None:
    spec = CompositeSpec(p=0.5, colors=("red", "green"), seed=7)
    compose(objects, tmp_path / "a", spec)
    compose(objects, tmp_path / "b", spec)
    assert dataset_signature(tmp_path / "a") == dataset_signature(tmp_path / "b")


def test_colours_and_errors(tmp_path, objects) -> None:
    assert parse_color("sea=#1e90ff") == ("sea", (30, 144, 255))
    with pytest.raises(ValueError, match="unknown colour"):
        parse_color("octarine")
    with pytest.raises(ValueError, match="new dataset folder"):
        compose(objects, objects, CompositeSpec())
    with pytest.raises(ValueError, match="p must be"):
        CompositeSpec(p=1.5)


def test_cli_collect_composite(tmp_path, objects) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["collect", "composite", str(tmp_path / "c"), "--objects", str(objects),
                                  "--colors", "red,green,sea=#1e90ff", "--p", "0.7", "--common", "296=sea",
                                  "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert "7/10 on its common background" in result.output
    rows = _rows(tmp_path / "c")
    assert all(r["extra"]["common_background"] == "sea" for r in rows if r["class_index"] == 296)
