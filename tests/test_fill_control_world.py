"""Issue 45: the fill control on a world where filling itself changes a shape-reading model's answer.

The fill control (:mod:`curate.interventions.attribution`) needs no fill: B over a hard photo's swaps
whose donor hole its object covers (uncovered share <= ``covered_below``) beside B over all of its
swaps. It is validated here against the same donors' real backgrounds: each swap re-drawn by the
generator with the object on its donor photo's own background texture, no hole and nothing filled
(:func:`curate.interventions.worlds.write_truth` with ``same_donors``), so a swap and its truth differ
only by what the donor's filled hole shows.

Why the four worlds of the last session did not move: the synthetic world's textures are stationary,
so a hole tiled from the border of one (Xiao et al.'s Only-BG-T) is nearly invisible. Three generator
options (:class:`curate.collect.synthetic.WorldSpec`, all off by default, the other worlds byte for
byte as before) make the world where it is not: ``vignette`` (the light falls off from the centre, as
a photograph's does, so a hole tiled from the darker border shows as a darker region in the donor
object's shape, with the tiles' seams across it), ``uncommon_contrast`` (hard objects washed towards
grey, as in the issue's world, so the model has little else to read) and ``common_scale_range`` (easy
objects of varied sizes, so some donors' holes are small enough for a hard object to cover).

The model is :class:`fill_reader.ShapeReader`, a hand-built shape reader (outline matched filters on
the edge map; no weights, the same answer on every CPU). Measured figures are in the tests' docstrings
and docs/results.md#interventions.
"""
from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from curate.collect.synthetic import (
    DEFAULT_CLASSES,
    WorldSpec,
    assign_truth_groups,
    collect_synthetic,
    generate_sample,
    render_counterfactual,
    vignette_light,
    world_spec_of,
)
from curate.interventions import image_ops as ops
from curate.interventions.worlds import source_index, world_spec, write_truth
from curate.runs.interventions import InterventionRun
from curate.stages.intervene import InterveneSettings, intervene
from curate.store import Dataset

# ---------------------------------------------------------------------------------------------
# The generator options: off by default, each doing only what it says
# ---------------------------------------------------------------------------------------------

#: sha256 of ``image.tobytes() + mask.tobytes()`` of the ghost world's samples (``world_spec("ghost",
#: per_class=3)``: outline "double", uncommon_scale 0.3) and of one counterfactual's image, computed with
#: the generator before these options existed (commit 922b519).
FROZEN_GHOST = {
    0: "56dda98d8955d9a0867faf4cdeae4c4f9059d086565d5147a14a47c4c6526580",
    4: "caa67a23840ad3afcccf5d73795bf656c744a1cdc666059126a5f8e9a3dfa86a",
    11: "88291321b3c90ea1f238f82f806929923c13fd50577b92412332911b10a2bca6",
    16: "9cbd89b0316dea061de773ad77d5535fecfa3d99d8cc71e03ca537b70a8c120a",
}
FROZEN_COUNTERFACTUAL = "c51172fd64253e9f39574cdeacc4efe63f545ec8d286372f757404eef1c706df"  # sample 4 on sand
NEW_KEYS = ("common_scale_range", "uncommon_contrast", "vignette")
BASE = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=10, image_size=48, p=0.5, seed=4, outline="double")


def _digest(sample) -> str:
    return hashlib.sha256(sample.image.tobytes() + sample.mask.tobytes()).hexdigest()


def test_the_options_are_off_by_default_and_the_intervention_worlds_are_unchanged() -> None:
    spec = world_spec("ghost", per_class=3)
    assert {i: _digest(generate_sample(spec, i)) for i in FROZEN_GHOST} == FROZEN_GHOST
    cf = render_counterfactual(spec, 4, background="sand")
    assert hashlib.sha256(cf.image.tobytes()).hexdigest() == FROZEN_COUNTERFACTUAL
    assert not set(NEW_KEYS) & set(WorldSpec().to_dict()) and not set(NEW_KEYS) & set(spec.to_dict())


def test_common_scale_range_varies_the_easy_objects_only() -> None:
    varied = replace(BASE, common_scale_range=(0.3, 0.9))
    for i in range(30):
        plain, other = generate_sample(BASE, i), generate_sample(varied, i)
        if plain.aligned:
            assert 0.3 <= other.extra["object_scale"] <= 0.9 and other.mask.sum() < plain.mask.sum()
        else:  # a hard sample is drawn exactly as before
            assert np.array_equal(plain.image, other.image) and "object_scale" not in other.extra


def test_uncommon_contrast_washes_the_hard_objects_towards_grey() -> None:
    washed = replace(BASE, uncommon_contrast=0.25)
    for i in range(30):
        plain, other = generate_sample(BASE, i, keep_layers=True), generate_sample(washed, i)
        m = plain.mask.astype(bool)
        if plain.aligned:
            assert np.array_equal(plain.image, other.image)
        else:
            obj = plain.extra["object_layer"].astype(np.float32)[m]  # the unwashed object (clipped to uint8)
            expected = np.clip(128 + 0.25 * (obj - 128), 0, 255)
            assert np.abs(other.image[m].astype(np.float32) - expected).max() <= 1.0
            assert np.array_equal(plain.image[~m], other.image[~m]) and other.extra["object_contrast"] == 0.25


def test_vignette_dims_the_background_and_leaves_the_object() -> None:
    lit = replace(BASE, vignette=0.6)
    light = vignette_light(48, 0.6)
    assert light.max() <= 1.0 and light.min() == pytest.approx(0.4) and light[23:25, 23:25].min() > 0.99
    for i in (0, 13, 27):
        plain, other = generate_sample(BASE, i, keep_layers=True), generate_sample(lit, i, keep_layers=True)
        m = plain.mask.astype(bool)
        assert np.array_equal(plain.image[m], other.image[m])
        assert np.abs(other.extra["background_layer"].astype(np.float32)
                      - plain.extra["background_layer"] * light[..., None]).max() <= 1.0


def test_a_counterfactual_on_a_donors_own_background_is_the_object_pasted_on_that_photos_background() -> None:
    spec = replace(BASE, uncommon_scale=0.7, uncommon_contrast=0.2, vignette=0.6, common_scale_range=(0.3, 1.0))
    for index, donor in ((1, 2), (3, 15), (12, 0), (25, 21)):
        sample, shown = generate_sample(spec, index), generate_sample(spec, donor, keep_layers=True)
        cf = render_counterfactual(spec, index, background_of=donor)
        assert np.array_equal(cf.image, ops.paste(sample.image, sample.mask, shown.extra["background_layer"]))
        assert cf.background == shown.background and np.array_equal(cf.mask, sample.mask)
    assert np.array_equal(render_counterfactual(spec, 5, background_of=5).image, generate_sample(spec, 5).image)
    with pytest.raises(ValueError, match="not both"):
        render_counterfactual(spec, 1, background="snow", background_of=2)
    with pytest.raises(ValueError, match="outside the world"):
        render_counterfactual(spec, 1, background_of=999)


def test_the_options_round_trip_through_a_folder_and_bad_values_are_refused(tmp_path) -> None:
    spec = replace(BASE, per_class=2, common_scale_range=(0.5, 1.0), uncommon_contrast=0.3, vignette=0.5)
    ds = collect_synthetic(tmp_path / "w", spec)
    assert world_spec_of(ds) == spec
    for bad, message in (({"common_scale_range": (0.9, 0.5)}, "common_scale_range must be"),
                         ({"common_scale_range": (0.1, 1.0)}, "common_scale_range must be"),
                         ({"uncommon_contrast": 0.0}, "uncommon_contrast must be in"),
                         ({"vignette": 1.0}, "vignette must be in")):
        with pytest.raises(ValueError, match=message):
            replace(BASE, **bad)


def test_write_truth_on_the_same_donors_redraws_each_swap_on_its_donors_own_background(tmp_path) -> None:
    """Each swap's truth is its object on its donor photo's own background texture: the swap's image wherever
    the donor's hole is covered, and the donor's real pixels wherever it is not."""
    spec = replace(BASE, per_class=8, uncommon_scale=0.7, vignette=0.5, common_scale_range=(0.3, 1.0))
    world = collect_synthetic(tmp_path / "w", spec)
    assign_truth_groups(world)
    intervene(world, tmp_path / "iv", InterveneSettings(variants=("swap",), swaps=2))
    write_truth(world, tmp_path / "iv", tmp_path / "real", same_donors=True)
    rows = {r["sample_id"]: r for r in world.rows()}
    made = {(r["source_sample_id"], r["k"]): r for r in InterventionRun.of_folder(tmp_path / "iv").rows()
            if r["variant"] == "swap"}
    truth = Dataset.open(tmp_path / "real")
    images = {r["sample_id"]: r for r in truth.rows()}
    checked = 0
    for row in InterventionRun.of_folder(tmp_path / "real").rows():
        if row["variant"] != "swap":
            continue
        swap = made[row["source_sample_id"], row["k"]]
        assert row["donor_sample_id"] == swap["donor_sample_id"] and row["uncovered"] == swap["uncovered"]
        source, donor = rows[row["source_sample_id"]], rows[row["donor_sample_id"]]
        shown = generate_sample(spec, source_index(donor), keep_layers=True).extra["background_layer"]
        expected = ops.paste(generate_sample(spec, source_index(source)).image, world.load_mask(source), shown)
        assert np.array_equal(np.asarray(Image.open(truth.image_path(images[row["sample_id"]])).convert("RGB")), expected)
        checked += 1
    assert checked == len(made)
