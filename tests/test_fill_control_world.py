"""Issue 45: the fill control on a world where filling itself changes a shape-reading model's answer.

The fill control (:mod:`curate.interventions.attribution`) needs no truth: each hard swap brings a
*refill*, the hard photo itself with R (what the swap shows of the donor's filled hole) filled the same
way from its own background; fill control = refill - original, paired per photo, and B fill-corrected =
B - fill control. It is checked here against the same donors' real backgrounds: each swap re-drawn by the
generator with the object on its donor photo's own background texture, no hole and nothing filled
(:func:`curate.interventions.worlds.write_truth` with ``same_donors``), so a swap and its truth differ
only by what the donor's filled hole shows. (The first fill control, B over all swaps - B over the
*covered* ones, was measured here and dropped: see the first slow test.)

Why the four worlds of the last session did not move: the synthetic world's textures are stationary,
so a hole tiled from the border of one (Xiao et al.'s Only-BG-T) is nearly invisible. Three generator
options (:class:`curate.collect.synthetic.WorldSpec`, all off by default, the other worlds byte for
byte as before) make the world where it is not: ``vignette`` (the light falls off from the centre, as
a photograph's does, so a hole tiled from the darker border shows as a darker region in the donor
object's shape, with the tiles' seams across it), ``uncommon_contrast`` (hard objects washed towards
grey, as in the issue's world, so the model has little else to read) and ``common_scale_range`` (easy
objects of varied sizes, so some donors' holes are small enough for a hard object to cover).

The model is :class:`fill_reader.ShapeReader`, a hand-built shape reader (outline matched filters on
the edge map; no weights, the same answer on every CPU).

What was found (figures in each test's docstring and docs/results.md#the-fill-control-where-the-fill-acts):
on this world the tiled fill moves the reader's B by more than the threshold in four classes of six. The
refill control flags two of them and no other class (none on the same world without the vignette, where the
fill moves nothing): tarantula with the gap's sign and B fill-corrected 2.4 points from the real value (B
was 7.3 away), but agama with the wrong sign (filling R on agama's flat hard backgrounds costs 21.8 points;
on the busy easy donors the same fill adds 8.9): the fill's effect depends on the background around it, and
the refill measures it on the hard photo's background, not the donor's. That part is a strict xfail.

The second fill control needs no fill: beside each hard swap the hard object on a photo of the donor's
easy background alone (``swap-bgonly``, ``--background-photos``; here 60 photos of each background from
:func:`curate.collect.synthetic.collect_synthetic_backgrounds`); fill effect = swap - swap-bgonly, paired.
Its interval is crossed: it resamples the hard photos and the background-alone photos (issue 45: resampling the
photos alone, a chance draw of 12 or 48 background photos was flagged on the control world). It flags two of the
four classes the fill moves, agama with the right sign, and nothing on the control world at 60 or 48 photos of
each background; it misses black swan and lion (a strict xfail), and at 12 photos it still flags agama on the
control world (a strict xfail, last test).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from fill_reader import ShapeReader, write_evaluation
from PIL import Image

from curate.collect.synthetic import (
    DEFAULT_CLASSES,
    WorldSpec,
    assign_truth_groups,
    collect_synthetic,
    collect_synthetic_backgrounds,
    generate_sample,
    render_counterfactual,
    vignette_light,
    world_spec_of,
)
from curate.interventions import image_ops as ops
from curate.interventions.worlds import source_index, world_spec, write_truth
from curate.runs.attribution import FILL_EFFECT_FLAG, ClassRow, ModelAttribution
from curate.runs.evaluation import EvaluationRun
from curate.runs.interventions import InterventionRun
from curate.stages.attribution import AttributionSettings, attribution
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


# ---------------------------------------------------------------------------------------------
# The world where the tiled fill changes the shape reader's B, and its control (no vignette)
# ---------------------------------------------------------------------------------------------

#: Hard objects at 0.7 of the easy size range's top, washed to 0.15 contrast; easy objects 0.3 to 1.0;
#: the light falls to 20 % at the corners. The control world is the same without the vignette.
FILL_WORLD = WorldSpec(classes=DEFAULT_CLASSES[:6], per_class=60, image_size=48, seed=3000, p=0.5, outline="double",
                       uncommon_scale=0.7, common_scale_range=(0.3, 1.0), uncommon_contrast=0.15, vignette=0.8)
CONTROL_WORLD = replace(FILL_WORLD, vignette=0.0)
#: Four donors a photo from the eight best covered (the fill control is empty at one swap a photo).
SWAPS = InterveneSettings(variants=("swap",), swaps=4, match_pool=8)
THRESHOLD = AttributionSettings().control_threshold  # 0.05
#: The bound the first fill control called a swap *covered* under (its donor hole at most 20 % uncovered).
COVERED = 0.2


@dataclass
class Measured:
    """One world's decomposition with the tiled fill and with the same donors' real backgrounds, and per
    hard swap (class, uncovered share, right with the tiled fill, right on the real background)."""

    tiled: ModelAttribution
    real: ModelAttribution
    swaps: list[tuple[int, float, bool, bool]]
    root: Path = Path()  # the folder the world and its interventions were made in

    def gap(self, class_index: int) -> float:
        """B with the tiled fill minus B on the same donors' real backgrounds, one class."""
        return _row(self.tiled, class_index).values["background_part"] - _row(self.real, class_index).values["background_part"]

    def changed(self, low: float, high: float) -> tuple[int, float]:
        """Over hard swaps with low <= uncovered < high: how many, and tiled minus real accuracy."""
        chosen = [(t, r) for _, u, t, r in self.swaps if low <= u < high]
        return len(chosen), float(np.mean([t for t, _ in chosen]) - np.mean([r for _, r in chosen]))


def _row(model: ModelAttribution, class_index: int) -> ClassRow:
    return next(row for row in model.classes if row.class_index == class_index)


def _measure(root: Path, spec: WorldSpec) -> Measured:
    world = collect_synthetic(root / "world", spec)
    assign_truth_groups(world)
    collect_synthetic_backgrounds(root / "alone", spec, spec.per_class)  # as many of each background as a class has
    intervene(world, root / "tiled", replace(SWAPS, background_photos=str(root / "alone")))
    write_truth(world, root / "tiled", root / "real", same_donors=True)
    reader = ShapeReader([c.shape for c in spec.classes])
    models, correct, rows = {}, {}, {}
    for name in ("tiled", "real"):
        rows[name] = InterventionRun.of_folder(root / name).rows()
        scored = sorted({r["sample_id"] for r in rows[name]
                         if r["variant"] == "original" or (r["variant"] in ("swap", "refill", "swap-bgonly")
                                                           and r["group"] == "hard")})
        write_evaluation(root / name, reader, [c.imagenet_index for c in spec.classes], scored)
        correct[name] = EvaluationRun.load(root / name / "runs" / "reader").correct1_by_sample()
        models[name] = attribution(root / name, ["reader"], AttributionSettings(n_boot=500), run_name="a").models[0]
    real = {(r["source_sample_id"], r["k"]): r["sample_id"] for r in rows["real"] if r["variant"] == "swap"}
    swaps = [(r["class_index"], r["uncovered"], correct["tiled"][r["sample_id"]],
              correct["real"][real[r["source_sample_id"], r["k"]]])
             for r in rows["tiled"] if r["variant"] == "swap" and r["group"] == "hard"]
    return Measured(models["tiled"], models["real"], swaps, root)


def _fill_effect_at(root: Path, spec: WorldSpec, photos: int) -> ModelAttribution:
    """The world made in ``root`` intervened on again with ``photos`` photos of each background alone (the
    first ``photos`` of the 60 :func:`_measure` draws: the swaps and their donors are the same, only the
    swap-bgonly images change), scored by the reader and decomposed."""
    alone, out = root / f"alone{photos}", root / f"tiled{photos}"
    collect_synthetic_backgrounds(alone, spec, photos)
    intervene(root / "world", out, replace(SWAPS, background_photos=str(alone)))
    scored = sorted({r["sample_id"] for r in InterventionRun.of_folder(out).rows()
                     if r["variant"] == "original" or (r["variant"] in ("swap", "swap-bgonly") and r["group"] == "hard")})
    write_evaluation(out, ShapeReader([c.shape for c in spec.classes]), [c.imagenet_index for c in spec.classes],
                     scored)
    return attribution(out, ["reader"], AttributionSettings(n_boot=500), run_name="a").models[0]


@pytest.fixture(scope="module")
def fill_world(tmp_path_factory) -> Measured:
    return _measure(tmp_path_factory.mktemp("fill"), FILL_WORLD)


@pytest.fixture(scope="module")
def control_world(tmp_path_factory) -> Measured:
    return _measure(tmp_path_factory.mktemp("control"), CONTROL_WORLD)


def _report(m: Measured) -> str:
    """Per class: B, the real B, the refill control and B fill-corrected, the fill effect and B bg-alone, counts."""
    def cell(c: ClassRow, k: str) -> str:
        return (f"{100 * c.values[k]:+.1f} [{100 * c.intervals[k][0]:+.1f}, {100 * c.intervals[k][1]:+.1f}]")

    return "; ".join(f"{c.class_index}: B {100 * c.values['background_part']:+.1f} real "
                     f"{cell(_row(m.real, c.class_index), 'background_part')} fill control "
                     f"{cell(c, 'fill_bias')} B fill-corrected {100 * c.values['background_part_fill_corrected']:+.1f}"
                     f" ({c.n_refills} refills){' flagged' if 'fill control' in c.flag else ''}, fill effect "
                     f"{cell(c, 'fill_effect')} B bg-alone {100 * c.values['background_part_bgonly']:+.1f} "
                     f"({c.n_bgonly} bg-alone){' flagged' if FILL_EFFECT_FLAG in c.flag else ''}"
                     for c in m.tiled.classes)


def _moved(m: Measured) -> list[int]:
    """The classes whose B the tiled fill moves beyond the control threshold (against the real backgrounds)."""
    return [c.class_index for c in m.tiled.classes if abs(m.gap(c.class_index)) > THRESHOLD]


def _flagged(m: Measured, marker: str = "fill control") -> list[int]:
    """The classes whose flag names the control ``marker`` (the refill's, or FILL_EFFECT_FLAG)."""
    return [c.class_index for c in m.tiled.classes if marker in c.flag]


def _recovers(m: Measured, class_index: int, control: str = "fill_bias",
              corrected: str = "background_part_fill_corrected") -> bool:
    """The control has the gap's sign and its corrected B is nearer the real B than B is."""
    row, real = _row(m.tiled, class_index), _row(m.real, class_index).values["background_part"]
    return (np.sign(row.values[control]) == np.sign(m.gap(class_index))
            and abs(row.values[corrected] - real) < abs(m.gap(class_index)))


@pytest.mark.slow
def test_on_the_vignette_world_the_tiled_fill_moves_a_shape_readers_b_also_through_covered_swaps(fill_world) -> None:
    """The tiled hole shows (darker, in the donor object's shape, with the tiles' seams) and the shape reader
    reads it. Measured (2026-11-28; the reader has no weights, so every machine gives these):

    - B with the tiled fill against B on the same donors' real backgrounds, per class: vulture +13.2 / +16.0,
      agama -38.7 / -47.6, tarantula -17.7 / -10.5, black swan +20.2 / +26.9, lion -9.7 / -2.8, polar
      bear +27.5 / +28.3: four classes move by more than the 5-point threshold (+8.9, -7.3, -6.7, -6.9);
    - per hard swap, tiled minus real accuracy by the share of the donor's hole left uncovered: -0.0 points
      under 0.05 (109 swaps), -7.2 from 0.05 to 0.2 (138), -5.8 from 0.2 to 0.4 (277), +2.5 above (236).

    So a swap *covered* at the first fill control's bound (0.2) still shows the fill where the reader looks
    (the sliver of the hole left showing hugs the object's outline): B over covered swaps is no fill-free
    reference, which is why that control (B - B covered, ``--covered-below``) was dropped for the refill."""
    print(_report(fill_world))  # the figures of this module, with `pytest -s`
    assert len(_moved(fill_world)) >= 3, _report(fill_world)
    n_tight, tight = fill_world.changed(0.0, 0.05)
    n_loose, loose = fill_world.changed(0.05, COVERED)
    assert n_tight >= 50 and abs(tight) < 0.01  # the hole (almost) all under the object: the fill does nothing
    assert n_loose >= 50 and abs(loose) > THRESHOLD, (loose, _report(fill_world))  # covered by the bound: it does


@pytest.mark.slow
def test_on_the_vignette_world_the_fill_control_flags_only_classes_the_fill_moves(fill_world) -> None:
    """The refill control on the world where the fill acts. Measured (2026-11-28), per class: fill control
    (refill - original) and B fill-corrected against the real B (gap = B tiled - B real):

    - vulture +3.5 [-6.9, +13.9], +9.7 against +16.0 (gap -2.8);
    - agama -21.8 [-39.1, -3.2], flagged, -16.9 against -47.6 (gap +8.9: the wrong sign);
    - tarantula -9.7 [-19.8, -1.6], flagged, -8.1 against -10.5 (gap -7.3: 2.4 points off where B was 7.3);
    - black swan -1.9 [-13.5, +9.6], +22.1 against +26.9 (gap -6.7);
    - lion -6.2 [-18.8, +5.2], -3.5 against -2.8 (gap -6.9: near, but its interval holds 0);
    - polar bear -5.0 [-10.4, +0.0], +32.5 against +28.3 (gap -0.8);

    104 to 144 refills a class (one per hard swap, four swaps a photo). Overall: fill control -6.9 [-11.6,
    -2.0], B -0.9, B fill-corrected +6.0, real +1.7. It flags two of the four classes the fill moves and no
    other; tarantula (and, unflagged, lion and black swan) come nearer the real value, agama goes the other
    way (the next test)."""
    flagged, moved = _flagged(fill_world), _moved(fill_world)
    assert flagged and set(flagged) <= set(moved), _report(fill_world)
    assert any(_recovers(fill_world, c) for c in flagged), _report(fill_world)
    assert all(c.n_refills == SWAPS.swaps * c.n_hard for c in fill_world.tiled.classes)  # one a hard swap


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="measured (issue 45): the refill control flags agama with the wrong sign and "
                   "misses black swan and lion; see the test's docstring and "
                   "docs/results.md#the-fill-control-where-the-fill-acts")
def test_the_fill_control_flags_every_class_the_fill_moves_and_b_fill_corrected_recovers_the_real_value(
        fill_world) -> None:
    """What the fill control is for, on the world where the fill acts: every class the fill moves flagged,
    with the gap's sign, and B fill-corrected nearer the real B than B. Measured: not for agama (flagged,
    fill control -21.8 against a gap of +8.9: filling R on agama's hard photos, whose flat backgrounds let the
    washed-out outline stand out, costs what the same fill on the busy easy donors adds; the refill measures
    the fill on the hard photo's background, not the donor's), and black swan (-1.9) and lion (-6.2, interval
    holding 0) are not flagged. (The first fill control, B - B covered, flagged none of the four.)"""
    for class_index in _moved(fill_world):
        row = _row(fill_world.tiled, class_index)
        assert "fill control" in row.flag and _recovers(fill_world, class_index), _report(fill_world)


@pytest.mark.slow
def test_on_the_control_world_the_tiled_fill_changes_no_class_beyond_the_threshold(control_world) -> None:
    """Without the vignette the textures are stationary and the tiled hole does not show: B with the tiled
    fill is B on the same donors' real backgrounds within the control threshold in every class. Measured
    (2026-11-28): +27.1 / +24.3, -47.6 / -46.0, -4.0 / -4.8, +15.4 / +20.2, -8.3 / -6.2, +25.8 / +25.8 (the
    largest gap -4.8); per hard swap, tiled minus real accuracy -0.9, -0.7, -2.1 and +1.4 points by uncovered
    share (under 0.05, to 0.2, to 0.4, above). The refill control reads under the threshold in every class:
    +4.2, -2.4, -3.2, -2.9, +3.5, +0.8 (the real backgrounds' folder, nothing filled, has no refill: undefined)."""
    print(_report(control_world))  # the figures above, with `pytest -s`
    assert not _moved(control_world), _report(control_world)
    assert all(abs(control_world.changed(low, high)[1]) < 0.03 for low, high in ((0, 0.05), (0.05, COVERED),
                                                                                  (COVERED, 0.4), (0.4, 1.01)))
    assert all(abs(c.values["fill_bias"]) <= THRESHOLD for c in control_world.tiled.classes), _report(control_world)
    assert all(np.isnan(c.values["fill_bias"]) and c.n_refills == 0 for c in control_world.real.classes)


@pytest.mark.slow
def test_on_the_control_world_the_fill_control_flags_nothing(control_world) -> None:
    """Where the fill changes nothing, nothing is flagged (the first fill control flagged lion here, -5.5
    [-10.5, -0.8], for a difference its covered donors showed with nothing filled). Measured: the largest
    refill control is +4.2 [-3.5, +12.2] (vulture); lion +3.5 [+0.0, +7.6] touches 0 and is under the threshold."""
    assert not _flagged(control_world), _report(control_world)


# ---------------------------------------------------------------------------------------------
# The fill control that needs no fill: the hard objects on photos of the easy backgrounds alone
# ---------------------------------------------------------------------------------------------

#: The fill effect's statistics in :func:`_recovers`'s terms.
BGONLY = ("fill_effect", "background_part_bgonly")


@pytest.mark.slow
def test_on_the_vignette_world_the_fill_effect_flags_classes_the_fill_moves_with_their_sign_agama_included(
        fill_world) -> None:
    """The fill control that needs no fill: beside each hard swap, the hard object on a photo of the donor's
    easy background alone (``swap-bgonly``: the world's texture and vignette, no object, no hole, nothing
    filled; 60 photos of each background, a class's count). Fill effect = swap - swap-bgonly paired per
    photo; flagged beyond the threshold with its interval clear of 0, the interval crossed (hard photos and
    background-alone photos resampled). Measured (2026-11-29), per class: B, B bg-alone, the real B (same
    donors' own backgrounds), fill effect crossed (photo-only interval before it; gap = B - real):

    - vulture +13.2, +16.0, +16.0: -2.8 [-18.6, +11.2] ([-12.2, +7.3]; gap -2.8);
    - agama -38.7, -48.4, -47.6: +9.7 [+0.0, +19.0], flagged ([+4.0, +16.1]; gap +8.9: the right sign, where
      the refill control read -21.8);
    - tarantula -17.7, -7.3, -10.5: -10.5 [-22.0, -1.7], flagged ([-18.5, -3.6]; gap -7.3);
    - black swan +20.2, +26.9, +26.9: -6.7 [-15.1, +0.9] ([-14.0, -1.0], flagged then; gap -6.7);
    - lion -9.7, -7.6, -2.8: -2.1 [-12.1, +8.6] ([-10.4, +5.6]; gap -6.9: missed, the next test);
    - polar bear +27.5, +30.8, +28.3: -3.3 [-9.1, +3.5] ([-7.5, +0.8]; gap -0.8);

    104 to 144 background-alone swaps a class (one per hard swap). Two of the four classes the fill moves
    flagged (three with the photo-only interval), each with the gap's sign and B bg-alone nearer the real B
    than B; no other class."""
    print(_report(fill_world))  # the figures above, with `pytest -s`
    recovered = {c: _recovers(fill_world, c, *BGONLY) for c in _flagged(fill_world, FILL_EFFECT_FLAG)}
    assert 42 in recovered and len(recovered) >= 2 and all(recovered.values()), _report(fill_world)
    assert set(recovered) <= set(_moved(fill_world)), _report(fill_world)
    assert {c.n_bgonly - SWAPS.swaps * c.n_hard for c in fill_world.tiled.classes} == {0}  # one a hard swap


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="measured (issue 45): the fill effect misses lion (-2.1 [-12.1, +8.6] against "
                   "a gap of -6.9: photos of grass alone are other texture draws than the donors') and, with its "
                   "crossed interval, black swan (-6.7 [-15.1, +0.9]); see the test's docstring and "
                   "docs/results.md#the-fill-control-where-the-fill-acts")
def test_the_fill_effect_flags_every_class_the_fill_moves(fill_world) -> None:
    """Every class the fill moves flagged, with B bg-alone nearer the real B than B. Measured: not black swan
    (-6.7 [-15.1, +0.9] for a gap of -6.7: the right value, but the crossed interval, which takes in the draw
    of background photos, holds 0), nor lion, whose fill effect is -2.1 [-12.1, +8.6] for a gap of -6.9: B bg-alone (-7.6) is 4.8 points from the real B (-2.8),
    B (-9.7) 6.9. The background-alone photos are other draws of the grass texture than the donors' own, and
    at about 30 hard photos a class, four swaps each, two sets of draws of one background differ by several
    points by chance (on the control world the tiled fill, which moves nothing there, is up to 4.8 points from
    the donors' own backgrounds)."""
    missed = [c for c in _moved(fill_world)
              if FILL_EFFECT_FLAG not in _row(fill_world.tiled, c).flag or not _recovers(fill_world, c, *BGONLY)]
    assert not missed, _report(fill_world)


@pytest.mark.slow
def test_on_the_control_world_the_fill_effect_flags_nothing(control_world) -> None:
    """Where the fill changes nothing, the fill effect flags nothing. Measured (2026-11-29; B, B bg-alone, real,
    fill effect with the crossed interval): vulture +27.1, +18.8, +24.3, +8.3 [-7.1, +22.0] (photo-only
    [-0.7, +17.4]; beyond the threshold, its interval holding 0: chance, not the fill); agama -1.6; tarantula
    +1.6; black swan -4.8 [-13.4, +2.5]; lion +0.7; polar bear +0.0. Other draws of background photos: the
    next test."""
    print(_report(control_world))
    assert not _flagged(control_world, FILL_EFFECT_FLAG), _report(control_world)
    assert all(c.n_bgonly == SWAPS.swaps * c.n_hard for c in control_world.tiled.classes)
    assert all(c.n_bgonly is None or c.n_bgonly == 0 for c in control_world.real.classes)


@pytest.mark.slow
@pytest.mark.parametrize("photos", [pytest.param(12, marks=pytest.mark.xfail(
    strict=True, reason="measured (issue 45): with 12 photos of each background the crossed interval still flags "
    "agama on the control world, +9.7 [+2.3, +15.8] (photo-only [+4.8, +14.9]): B bg-alone -57.3 against the "
    "donors' own backgrounds' -46.0; see the test's docstring"))])  # 48: measured, not run (each about 18 s more)
def test_on_the_control_world_the_fill_effect_flags_nothing_at_other_draws_of_background_photos(control_world,
                                                                                                 photos) -> None:
    """The draw sensitivity: with 12 photos of each background alone the photo-only bootstrap flagged agama
    (+9.7 [+4.8, +14.9]) and with 48 black swan (-7.7 [-15.9, -1.0]) where the fill moves nothing; the crossed
    bootstrap (:mod:`curate.interventions.attribution`: the background-alone photos resampled too) takes that
    draw in. Measured (2026-11-29): at 48 black swan reads -7.7 [-17.3, +0.6], nothing flagged (largest other
    +4.8 [-6.2, +13.8], agama); at 12 agama still reads +9.7 [+2.3, +15.8], flagged (a strict xfail): its 12
    photos give B bg-alone -57.3 where the donors' own backgrounds give -46.0 and the 60 photos -48.4, an 11-point
    draw the crossed interval (half-width about 7) does not cover; nothing else flagged there. Why (measured on
    agama's swap-bgonly images per background photo): 12 of the 55 photos used get the reader to 25-100 %, the rest
    0 %; the first 12 hold none of them (best 22 %), so their resampling never draws one. Each draw costs an
    intervention, its scoring and its decomposition (17.6 s wall at load 1.4), so only 12, the case that failed, is run."""
    model = _fill_effect_at(control_world.root, CONTROL_WORLD, photos)
    print(photos, _report(Measured(model, control_world.real, [])))  # the figures above, with `pytest -s`
    assert not [c.class_index for c in model.classes if FILL_EFFECT_FLAG in c.flag], _report(
        Measured(model, control_world.real, []))
