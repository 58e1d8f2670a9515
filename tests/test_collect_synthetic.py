"""The synthetic world: determinism, exact masks, the planted correlation, the dataset folder."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curate.collect.synthetic import (
    DEFAULT_CLASSES,
    WorldSpec,
    classes_by_name,
    collect_synthetic,
    generate_sample,
    generate_world,
    png_bytes,
    world_spec_of,
)
from curate.store import Dataset, check_dataset

SMALL = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=6, image_size=32, seed=5)


def test_same_seed_same_bytes_other_seed_differs() -> None:
    a = [png_bytes(s.image) + png_bytes(s.mask) for s in generate_world(SMALL)]
    b = [png_bytes(s.image) + png_bytes(s.mask) for s in generate_world(SMALL)]
    c = [png_bytes(s.image) for s in generate_world(replace(SMALL, seed=6))]
    assert a == b
    assert sum(x[: len(y)] == y for x, y in zip(a, c)) == 0


def test_sample_depends_only_on_seed_and_index() -> None:
    """Growing the world does not reshuffle existing samples (index-keyed RNG)."""
    bigger = replace(SMALL, classes=DEFAULT_CLASSES[:5], backgrounds=())  # more classes, same first ones
    assert np.array_equal(generate_sample(SMALL, 4).image, generate_sample(bigger, 4).image)


@settings(max_examples=25, deadline=None)
@given(index=st.integers(0, 10 * 6 - 1), seed=st.integers(0, 2**16), size=st.sampled_from([16, 32, 48]))
def test_mask_is_exact(index: int, seed: int, size: int) -> None:
    spec = WorldSpec(classes=DEFAULT_CLASSES, per_class=6, image_size=size, seed=seed)
    sample = generate_sample(spec, index, keep_layers=True)
    mask = sample.mask.astype(bool)
    assert sample.mask.dtype == np.uint8 and set(np.unique(sample.mask)) <= {0, 1}
    assert mask.any() and (~mask).any(), "object and background must both be visible"
    expected = np.where(mask[..., None], sample.extra["object_layer"], sample.extra["background_layer"])
    assert np.array_equal(sample.image, expected)


def test_each_class_has_its_own_shape_and_mask_area_is_sane() -> None:
    spec = WorldSpec(classes=DEFAULT_CLASSES, per_class=4, image_size=48, seed=1)
    areas = [s.mask.mean() for s in generate_world(spec)]
    assert 0.05 < min(areas) and max(areas) < 0.6


@pytest.mark.parametrize("p", [0.9, 0.5, 1 / 6])
def test_planted_correlation_matches_p(p: float) -> None:
    spec = WorldSpec(classes=DEFAULT_CLASSES[:6], per_class=300, image_size=16, p=p, seed=2)
    samples = list(generate_world(spec))
    aligned = np.mean([s.aligned for s in samples])
    assert abs(aligned - p) < 0.04
    # off-common backgrounds are spread uniformly over the others
    off = [s.background for s in samples if not s.aligned and s.cls == spec.classes[0]]
    counts = np.array([off.count(b) for b in spec.backgrounds if b != spec.classes[0].common_background])
    if len(off) > 100:
        assert counts.min() > 0.5 * counts.mean()


def test_bad_specs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="p must be"):
        WorldSpec(p=1.5)
    with pytest.raises(ValueError, match="unknown synthetic backgrounds"):
        WorldSpec(backgrounds=("lava", "snow", "water", "sky", "grass", "sand", "rock"))
    with pytest.raises(ValueError, match="no class 'unicorn'"):
        classes_by_name(["unicorn"])
    assert classes_by_name(["lion", "296"])[1].name == "polar bear"


def test_collect_into_dataset_folder_round_trips(tmp_path) -> None:
    root = tmp_path / "world"
    ds = collect_synthetic(root, SMALL)
    assert len(ds) == 18 and check_dataset(root) == []
    rows = ds.rows()
    assert {r["background_source"] for r in rows} == {"synthetic"}
    assert {r["status"] for r in rows} == {"accepted"}
    assert {r["class_index"] for r in rows} == {c.imagenet_index for c in SMALL.classes}
    by_source = {r["source_id"]: r for r in rows}
    for sample in generate_world(SMALL):
        row = by_source[f"{SMALL.seed}:{sample.index}"]
        assert np.array_equal(np.asarray(ds.load_image(row["sample_id"])), sample.image)
        assert np.array_equal(ds.load_mask(row["sample_id"]), sample.mask)
        assert row["background"] == sample.background
    assert world_spec_of(Dataset.open(root)) == SMALL
    again = collect_synthetic(root, SMALL)  # idempotent: nothing added twice
    assert len(again) == 18


def test_class_names_are_the_label_space_names() -> None:
    """Training captions use these names; zero-shot over ImageNet-1K uses the label space's."""
    from curate.labels import imagenet1k

    for cls in DEFAULT_CLASSES:
        assert imagenet1k().name_of(cls.imagenet_index) == cls.name
