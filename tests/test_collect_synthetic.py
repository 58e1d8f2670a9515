"""The synthetic world: determinism, exact masks, the planted correlation, the dataset folder."""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curate.collect.synthetic import (
    DEFAULT_CLASSES,
    WorldSpec,
    _bg,
    _eroded,
    classes_by_name,
    collect_synthetic,
    generate_sample,
    generate_world,
    png_bytes,
    render_counterfactual,
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


# ---------------------------------------------------------------------------------------------
# Byte identity of existing worlds, the uncommon-scale confound, counterfactual rendering
# ---------------------------------------------------------------------------------------------

#: sha256 of ``image.tobytes() + mask.tobytes()``, computed before ``uncommon_scale`` and
#: :func:`render_counterfactual` existed (raw pixels, not PNG bytes: those also depend on the
#: PNG encoder's zlib, and the arrays determine them). Any change here changes existing worlds.
FROZEN = {
    "clean": (WorldSpec(per_class=3, seed=0), {
        0: "cfe34940bdf957b3782468c3af4aabc2134e416aa74c349aa57584efcfedae1f",
        7: "ea611465dd26cbd2474536dd7ffad854decf7a8d358ee8bb6ded1c824c0a4f5e",
        13: "ef0221620ea36b0406c05cef4df9d8b6df4b958bdc74bc099732dbcec7a60dbc",
    }),
    "off_common": (WorldSpec(per_class=3, seed=0, p=0.5), {  # all three on another background
        0: "2f8ea23db71b997926034379cd228baa0c3c7e0f9cf36fc78a95a99e526aae78",
        9: "c44fba9a6ca5ce3fa473130d80b1228643b8e108134c080dfd06faf917d60967",
        15: "0e2088eed9111e1a1a5b57b8b79cfa0ff197a85bbdbc979699793bebbf2abddc",
    }),
    "wrong_small": (WorldSpec(per_class=5, seed=0, wrong_label_rate=0.3, small_object_rate=0.3), {
        0: "f245fb7f8ec49d78457fc4da75d5bb140973cd04cd6e65131050d719007d4fbb",  # wrong_label
        1: "f2cac01cb09f0a3b5b0fa04fdaebcdaa1447fa7fb6e7a93714fa505afc7b0d40",  # small_object
        18: "bfe6d54abb6b4179d3d79f57204488710ce2124ae2dd460f673a15e0145b75f8",  # wrong_label, off common
        26: "8eb78729ce89b17a32d098cda8d6b0730d9f554e11fec42daf93d9f4e6f45b8c",  # small_object, off common
        28: "a76e43750838edebdaaa019fae5a918f31eddba733ad25a8a16eb0cf406f0f3a",  # clean, off common
    }),
    "other_problems": (WorldSpec(per_class=5, seed=0, duplicate_rate=0.15, near_duplicate_rate=0.15,
                                 feature_noise_rate=0.2, second_object_rate=0.2), {
        1: "29a22e4f0de532a76a28fe94da1cca8cdde06149751df49bfb0ac0b4ebf0fcc8",  # feature_noise
        5: "eef705ce1ee857f13ba3e9ee06275ebe3dae48e6db11f53f341b0263352637b1",  # second_object
        17: "d77f8a834db9ba77fb5c5e51630136fc0be22e0f8112dd6f2dfe12092d359191",  # exact_duplicate
        21: "e40a40a25b4ccd178c4517118e2e90b4115183f93df6cab52d78f930482addc6",  # near_duplicate
        26: "68db5c09cbfaf9107b034dad0e7d1d75c1ebe462a296131859b392687e6d3e81",  # second_object, off common
    }),
}


@pytest.mark.parametrize("world", list(FROZEN))
def test_existing_worlds_are_byte_identical(world: str) -> None:
    spec, expected = FROZEN[world]
    for index, digest in expected.items():
        sample = generate_sample(spec, index)
        assert hashlib.sha256(sample.image.tobytes() + sample.mask.tobytes()).hexdigest() == digest, (world, index)
        assert "object_scale" not in sample.extra


SCALE_BASE = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=8, image_size=48, p=0.5, seed=3)


def test_uncommon_scale_shrinks_objects_off_the_common_background_only() -> None:
    scale = 0.6
    scaled = replace(SCALE_BASE, uncommon_scale=scale)
    ratios = []
    for base, small in zip(generate_world(SCALE_BASE), generate_world(scaled)):
        assert small.background == base.background and small.aligned == base.aligned
        if base.aligned:
            assert np.array_equal(small.image, base.image) and np.array_equal(small.mask, base.mask)
            assert "object_scale" not in small.extra
        else:
            assert small.extra["object_scale"] == scale
            ratios.append(small.mask.sum() / base.mask.sum())
    assert len(ratios) >= 4
    assert 0.6 * scale**2 < np.mean(ratios) < 1.4 * scale**2


def test_uncommon_scale_is_validated_and_round_trips(tmp_path) -> None:
    for bad in (0.1, 1.6, float("nan")):
        with pytest.raises(ValueError, match="uncommon_scale must be in"):
            WorldSpec(uncommon_scale=bad)
    assert "uncommon_scale" not in WorldSpec().to_dict()
    assert WorldSpec(uncommon_scale=0.5).to_dict()["uncommon_scale"] == 0.5
    small = replace(SCALE_BASE, per_class=3, image_size=32)
    plain = collect_synthetic(tmp_path / "plain", small)
    assert world_spec_of(Dataset.open(plain.root)) == small
    assert all("object_scale" not in json.loads(r["extra"]) for r in plain.rows())
    scaled_spec = replace(small, uncommon_scale=0.5, wrong_label_rate=0.2)
    scaled = collect_synthetic(tmp_path / "scaled", scaled_spec)
    assert world_spec_of(Dataset.open(scaled.root)) == scaled_spec
    extras = [(r["background"], r["class_index"], json.loads(r["extra"])) for r in scaled.rows()]
    common = {c.imagenet_index: c.common_background for c in small.classes}
    assert any(e.get("object_scale") == 0.5 for _, _, e in extras)
    for background, class_index, extra in extras:
        assert ("object_scale" in extra) == (background != common[class_index])


def test_counterfactual_without_intervention_is_the_sample() -> None:
    for index in (0, 5, 11):
        cf, sample = render_counterfactual(SCALE_BASE, index), generate_sample(SCALE_BASE, index)
        assert png_bytes(cf.image) == png_bytes(sample.image) and np.array_equal(cf.mask, sample.mask)
        own = render_counterfactual(SCALE_BASE, index, background=sample.background)  # the factual
        assert np.array_equal(own.image, sample.image) and own.extra == {"counterfactual": {"background": sample.background}}


def test_counterfactual_background_keeps_the_object_and_swaps_the_background() -> None:
    spec = SCALE_BASE
    for index in (1, 9, 20):
        sample = generate_sample(spec, index)
        other = next(b for b in ("road", "snow") if b != sample.background)
        cf = render_counterfactual(spec, index, background=other)
        mask = sample.mask.astype(bool)
        assert np.array_equal(cf.mask, sample.mask)
        inner = _eroded(mask)
        assert inner.any() and np.array_equal(cf.image[inner], sample.image[inner])  # the object's fill texture
        fresh = np.clip(_bg(spec.image_size, np.random.default_rng([spec.seed, index, 1]), other), 0, 255).astype(np.uint8)
        assert np.array_equal(cf.image[~mask], fresh[~mask])  # a texture of the asked kind, exactly
        assert not np.array_equal(cf.image[~mask], sample.image[~mask])
        assert cf.background == other and cf.aligned == (other == sample.cls.common_background)
        assert cf.cls == sample.cls and cf.extra == {"counterfactual": {"background": other}}


def test_counterfactual_scale_changes_the_object_size_only() -> None:
    scaled = replace(SCALE_BASE, uncommon_scale=0.6)
    index = next(s.index for s in generate_world(SCALE_BASE) if not s.aligned)
    sample = generate_sample(SCALE_BASE, index)
    half = render_counterfactual(SCALE_BASE, index, scale=0.5)
    assert 0.15 < half.mask.sum() / sample.mask.sum() < 0.35
    outside = ~(half.mask.astype(bool) | sample.mask.astype(bool))
    assert np.array_equal(half.image[outside], sample.image[outside])  # same background texture
    assert half.background == sample.background and half.extra == {"counterfactual": {"scale": 0.5}}
    # undoing the confound: the off-common sample of the scaled world at full size is the unscaled one
    assert np.array_equal(render_counterfactual(scaled, index, scale=1.0).image, sample.image)
    # moving it to the common background keeps the world's scale unless asked
    common = sample.cls.common_background
    moved = render_counterfactual(scaled, index, background=common)
    assert np.array_equal(moved.mask, generate_sample(scaled, index).mask) and moved.aligned


def test_counterfactual_refusals() -> None:
    planted_world = FROZEN["wrong_small"][0]
    with pytest.raises(ValueError, match="planted problem"):
        render_counterfactual(planted_world, 0, background="snow")
    assert render_counterfactual(planted_world, 28, background="snow").background == "snow"  # clean sample
    with pytest.raises(ValueError, match="unknown synthetic background 'lava'"):
        render_counterfactual(SCALE_BASE, 0, background="lava")
    for bad in (0.1, 1.6):
        with pytest.raises(ValueError, match="scale must be in"):
            render_counterfactual(SCALE_BASE, 0, scale=bad)
    with pytest.raises(ValueError, match="outside the world"):
        render_counterfactual(SCALE_BASE, 24)
