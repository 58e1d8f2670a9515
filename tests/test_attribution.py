"""The drop decomposition's formulas on hand-built tables, the derived licence, and the records.

Formula level only (:mod:`curate.interventions.attribution`, :func:`curate.licenses.derivative_licence`,
:mod:`curate.runs.attribution`, :mod:`curate.runs.interventions`): no images, no model. The stage
and the CLI are tested in tests/test_intervene.py.
"""
from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curate.interventions.attribution import (
    BGONLY_STATISTICS,
    COLUMNS,
    STATISTICS,
    PhotoTable,
    attribute,
    photo_table,
    rfs,
)
from curate.licenses import derivative_licence
from curate.runs.attribution import AttributionRun, ClassRow, ModelAttribution
from curate.runs.base import RunError
from curate.runs.interventions import VARIANT_COLUMNS, InterventionRun, variants_table

NAN = float("nan")


def _table(photos: list[tuple[int, str, dict[str, float]]]) -> PhotoTable:
    """A PhotoTable from (class, group, {variant: value}) per photo (absent variants are NaN)."""
    values = np.full((len(photos), len(COLUMNS)), np.nan)
    for i, (_, _, vals) in enumerate(photos):
        for variant, value in vals.items():
            values[i, COLUMNS.index(variant)] = value
    return PhotoTable([f"p{i:03d}" for i in range(len(photos))], np.array([c for c, _, _ in photos], dtype=np.int64),
                      np.array([g for _, g, _ in photos], dtype=object), values)


def _cell(c: int, group: str, originals: list[int], swaps: list[float] | None = None,
          **more: list[float]) -> list[tuple[int, str, dict[str, float]]]:
    out = []
    for i, original in enumerate(originals):
        vals = {"original": float(original)}
        if swaps is not None:
            vals["swap"] = float(swaps[i])
        for key, column in more.items():
            vals[key.replace("_", "-")] = float(column[i])
        out.append((c, group, vals))
    return out


def _hand_table() -> PhotoTable:
    """Class 0: easy .75, hard .5, hard-on-easy .75 (D .25, B .25, rest 0).
    Class 1: easy .5, hard .25, hard-on-easy .25 (D .25, B 0, rest .25)."""
    return _table(_cell(0, "easy", [1, 1, 1, 0]) + _cell(0, "hard", [0, 0, 1, 1], [1, 1, 1, 0])
                  + _cell(1, "easy", [1, 1, 0, 0]) + _cell(1, "hard", [0, 0, 0, 1], [1, 0, 0, 0]))


EXPECTED = {
    0: {"easy": 0.75, "hard": 0.5, "drop": 0.25, "hard_on_easy": 0.75, "background_part": 0.25, "rest": 0.0},
    1: {"easy": 0.5, "hard": 0.25, "drop": 0.25, "hard_on_easy": 0.25, "background_part": 0.0, "rest": 0.25},
}


# --------------------------------------------------------------------------- attribute()
def test_hand_computed_decomposition_per_class_and_overall() -> None:
    classes, overall, overall_ci, used = attribute(_hand_table(), n_boot=400, seed=3)
    assert [c.class_index for c in classes] == [0, 1] and used == 2
    for c in classes:
        assert (c.n_easy, c.n_hard, c.reason) == (4, 4, "")
        for key, value in EXPECTED[c.class_index].items():
            assert c.values[key] == pytest.approx(value), (c.class_index, key)
        assert c.values["drop"] == pytest.approx(c.values["background_part"] + c.values["rest"], abs=1e-12)
        for key in ("easy", "hard", "drop", "background_part", "rest"):
            low, high = c.intervals[key]
            assert low <= c.values[key] + 1e-12 and c.values[key] - 1e-12 <= high, (c.class_index, key)
    for key in ("easy", "hard", "drop", "hard_on_easy", "background_part", "rest"):
        assert overall[key] == pytest.approx((EXPECTED[0][key] + EXPECTED[1][key]) / 2), key
    assert overall["drop"] == pytest.approx(0.25) and overall["background_part"] == pytest.approx(0.125)
    assert overall["drop"] == pytest.approx(overall["background_part"] + overall["rest"], abs=1e-12)
    for key in ("drop", "background_part", "rest"):
        low, high = overall_ci[key]
        assert low <= overall[key] <= high and low < high, key
    # nothing else was scored: the anchors' numbers are undefined, not zero
    assert math.isnan(overall["only_fg"]) and math.isnan(overall["rfs"]) and math.isnan(overall["paste_cost"])


def test_class_without_hard_photos_or_swaps_is_left_out_of_the_overall_decomposition() -> None:
    table = _table(_cell(0, "easy", [1, 1, 1, 0]) + _cell(0, "hard", [0, 0, 1, 1], [1, 1, 1, 0])
                   + _cell(1, "easy", [1, 0, 1])  # no hard photo
                   + _cell(2, "easy", [1, 1]) + _cell(2, "hard", [0, 1]))  # hard photos without swaps
    classes, overall, _, used = attribute(table, n_boot=50, seed=0)
    by = {c.class_index: c for c in classes}
    assert used == 1
    assert by[1].reason == "no hard photo with a usable mask" and by[1].n_hard == 0
    assert all(math.isnan(by[1].values[k]) for k in ("hard", "drop", "background_part", "rest"))
    assert all(math.isnan(v) for v in by[1].intervals["drop"])
    assert by[1].values["easy"] == pytest.approx(2 / 3)
    assert "swap" in by[2].reason and by[2].values["drop"] == pytest.approx(0.5)
    assert math.isnan(by[2].values["background_part"]) and math.isnan(by[2].values["rest"])
    # overall D, B, rest over class 0 only (the only class where all three are defined): D = B + rest
    assert (overall["drop"], overall["background_part"], overall["rest"]) == pytest.approx((0.25, 0.25, 0.0))
    # easy is defined for every class: its overall is the mean over all three
    assert overall["easy"] == pytest.approx((0.75 + 2 / 3 + 1.0) / 3)


def test_class_without_easy_photos_says_so() -> None:
    classes, _, _, used = attribute(_table(_cell(0, "hard", [0, 1], [1, 1])), n_boot=20)
    assert used == 0 and classes[0].reason == "no easy photo with a usable mask"


def test_paste_cost_bg_gap_and_pooled_anchors() -> None:
    # originals [1, 1, 0, 1], paste [0, 1, 0, NaN]: paired differences 1, 0, 0 -> 1/3 (the unpasted photo is left out)
    photos = [(0, "easy", {"original": 1, "paste": 0, "mixed-same": 1, "mixed-rand": 0, "only-fg": 1}),
              (0, "easy", {"original": 1, "paste": 1, "mixed-same": 1, "mixed-rand": 1, "only-fg": 0}),
              (0, "hard", {"original": 0, "paste": 0, "mixed-same": 1, "mixed-rand": 0, "only-fg": 0}),
              (0, "hard", {"original": 1, "mixed-same": 0, "mixed-rand": 0, "only-fg": 0})]
    classes, overall, _, _ = attribute(_table(photos), n_boot=50)
    values = classes[0].values
    assert values["paste_cost"] == pytest.approx(1 / 3)
    assert values["mixed_same"] == pytest.approx(0.75) and values["mixed_rand"] == pytest.approx(0.25)
    assert values["bg_gap"] == pytest.approx(0.5)
    assert values["only_fg"] == pytest.approx(0.25)  # pooled over both groups
    assert overall["paste_cost"] == pytest.approx(1 / 3) and overall["bg_gap"] == pytest.approx(0.5)


def test_noisy_accuracies_give_the_class_rfs() -> None:
    photos = [(0, g, {"original": 1, "noise-bg": bg, "noise-fg": fg})
              for g, bg, fg in (("easy", 1, 1), ("easy", 1, 0), ("hard", 1, 1), ("hard", 1, 0), ("hard", 0.5, 0.5))]
    # noisy_bg = 4.5 / 5 = .9, noisy_fg = 2.5 / 5 = .5
    classes, overall, _, _ = attribute(_table(photos), n_boot=20)
    assert classes[0].values["noisy_bg"] == pytest.approx(0.9) and classes[0].values["noisy_fg"] == pytest.approx(0.5)
    assert classes[0].values["rfs"] == pytest.approx(0.4 / 0.6) == pytest.approx(rfs(0.9, 0.5))
    assert overall["rfs"] == pytest.approx(0.4 / 0.6)


@pytest.mark.parametrize(("bg", "fg", "expected"), [
    (0.9, 0.5, 0.4 / 0.6), (0.5, 0.9, -0.4 / 0.6), (1.0, 0.0, 1.0), (0.0, 1.0, -1.0), (0.2, 0.2, 0.0),
    (0.0, 0.0, NAN), (1.0, 1.0, NAN), (NAN, 0.5, NAN), (0.5, math.inf, NAN),
])
def test_rfs_hand_cases(bg: float, fg: float, expected: float) -> None:
    value = rfs(bg, fg)
    if math.isnan(expected):
        assert math.isnan(value)
    else:
        assert value == pytest.approx(expected)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1), st.floats(0, 1))
def test_rfs_is_within_minus_one_and_one(bg: float, fg: float) -> None:
    value = rfs(bg, fg)
    a = (bg + fg) / 2
    if min(a, 1 - a) <= 0:
        assert math.isnan(value)
    else:
        assert -1 - 1e-12 <= value <= 1 + 1e-12
        assert (value > 0) == (bg > fg) or value == 0


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    def intervals(result) -> list:  # NaN as None, so that equal results compare equal
        classes, _, overall_ci, _ = result
        return [{k: tuple(None if math.isnan(x) else x for x in v) for k, v in ci.items()}
                for ci in [overall_ci, *(c.intervals for c in classes)]]

    first = intervals(attribute(_hand_table(), n_boot=200, seed=11))
    assert first == intervals(attribute(_hand_table(), n_boot=200, seed=11))
    assert None not in first[0]["drop"] and first[0]["only_fg"] == (None, None)
    assert first != intervals(attribute(_hand_table(), n_boot=200, seed=12))  # the seed does drive the draws


@st.composite
def _random_tables(draw) -> PhotoTable:
    photos = []
    for c in range(draw(st.integers(1, 4))):
        for group in ("easy", "hard"):
            for _ in range(draw(st.integers(1, 6))):
                photos.append((c, group, {"original": draw(st.sampled_from([0.0, 1.0])),
                                          "swap": draw(st.sampled_from([0.0, 0.5, 1.0]))}))
    return _table(photos)


@settings(max_examples=40, deadline=None)
@given(_random_tables(), st.integers(0, 2**16))
def test_drop_is_background_part_plus_rest_for_random_data(table: PhotoTable, seed: int) -> None:
    classes, overall, overall_ci, used = attribute(table, n_boot=10, seed=seed)
    assert used == len(classes)
    for c in classes:
        values = [c.values[k] for k in ("drop", "background_part", "rest")]
        assert all(math.isfinite(v) for v in values) and c.reason == ""
        assert values[0] == pytest.approx(values[1] + values[2], abs=1e-12)
        assert -1 <= values[0] <= 1 and -1 <= values[1] <= 1
    assert overall["drop"] == pytest.approx(overall["background_part"] + overall["rest"], abs=1e-12)
    # the interval rule (curate.metrics.bootstrap.MIN_CELL): no interval rests on a cell of one photo
    thick = all(min(c.n_easy, c.n_hard) >= 2 for c in classes)
    assert all(math.isfinite(x) == thick for k in ("drop", "background_part", "rest") for x in overall_ci[k])


def test_ghost_control_by_hand() -> None:
    """Hard photos only; swap [1, 1, 1, 0], the same donors with their holes boxed [1, 0, 0, 0]: B 3/4 - 1/4,
    B unghosted 1/4 - 1/4, the ghost's share of B 1/2. ghost / ghost-neutral are plain means (easy photos have none)."""
    hard = [(0, "hard", {"original": o, "swap": s, "swap-unghosted": u, "ghost": g, "ghost-neutral": n})
            for o, s, u, g, n in ((0, 1, 1, 1, 1), (0, 1, 0, 1, 0), (1, 1, 0, 0, 0), (0, 0, 0, 0, 0))]
    classes, overall, overall_ci, _ = attribute(_table(_cell(0, "easy", [1, 1]) + hard), n_boot=300, seed=1)
    v = classes[0].values
    assert v["background_part"] == pytest.approx(0.5)
    assert v["hard_on_easy_unghosted"] == pytest.approx(0.25) and v["background_part_unghosted"] == pytest.approx(0.0)
    assert v["ghost_bias"] == pytest.approx(0.5) and v["ghost"] == pytest.approx(0.5)
    assert v["ghost_neutral"] == pytest.approx(0.25)
    low, high = overall_ci["ghost_bias"]  # paired: every replicate's bias is swap - swap-unghosted of one draw
    assert 0.0 <= low <= 0.5 <= high <= 1.0 and overall["ghost_bias"] == pytest.approx(0.5)
    without = attribute(_table(_cell(0, "easy", [1]) + _cell(0, "hard", [0], [1])), n_boot=20)[0][0].values
    assert math.isnan(without["ghost_bias"]) and math.isnan(without["ghost"])  # no ghost images: no control, no flag


def test_fill_control_by_hand() -> None:
    """Issue 45: the fill control is refill - original on each hard photo (its refill: the photo with what its
    swap shows of the donor's filled hole filled the same way from its own background). Class 0: originals
    0, 0, 1, 1, swaps 1, 1, 1, 0 (B = 3/4 - 1/2 = 1/4), refills 1, 1/2 (two refills, one right), 1, 0: fill control
    = mean(1, 1/2, 0, -1) = 1/8, B fill-corrected = 1/4 - 1/8 = 1/8, refilled accuracy 5/8. Class 1: each refill
    answers as its original does (fill control 0, in every replicate: paired) though the refills' accuracy
    varies across photos. Class 2 has no refill: undefined, and no part of the overall value."""
    first = _cell(0, "hard", [0, 0, 1, 1], [1, 1, 1, 0], refill=[1, 0.5, 1, 0])
    second = _cell(1, "hard", [0, 1, 0, 1], [1, 1, 1, 1], refill=[0, 1, 0, 1])
    third = _cell(2, "hard", [0, 1], [1, 1])
    table = _table(_cell(0, "easy", [1, 1]) + first + _cell(1, "easy", [1, 1]) + second + _cell(2, "easy", [1, 0])
                   + third)
    table.refills = np.array([0, 0, 1, 2, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0])
    classes, overall, overall_ci, _ = attribute(table, n_boot=300, seed=2)
    a, b, c = (row.values for row in classes)
    assert (a["background_part"], a["fill_bias"], a["background_part_fill_corrected"]) == (0.25, 0.125, 0.125)
    assert a["hard_refilled"] == 0.625
    assert (b["background_part"], b["fill_bias"], b["background_part_fill_corrected"]) == (0.5, 0.0, 0.5)
    assert classes[1].intervals["fill_bias"] == (0.0, 0.0)  # paired: each photo against itself, in every replicate
    assert classes[1].intervals["hard_refilled"][0] < classes[1].intervals["hard_refilled"][1]
    assert math.isnan(c["fill_bias"]) and math.isnan(c["background_part_fill_corrected"])
    assert math.isnan(classes[2].intervals["fill_bias"][0]) and c["background_part"] == 0.5
    assert [row.n_refills for row in classes] == [5, 4, 0]
    assert overall["fill_bias"] == pytest.approx(0.0625)  # the classes that have it: (1/8 + 0) / 2
    low, high = overall_ci["fill_bias"]
    assert low <= 0.0625 <= high and high > low


def test_fill_effect_by_hand() -> None:
    """Issue 45: the fill control that needs no fill. Class 0, hard: originals 0, 0, 1, 1 (hard 1/2), swaps 1, 1, 1,
    0 (B = 3/4 - 1/2 = 1/4), swap-bgonly (the object on photos of the backgrounds alone) 1, 0, 1/2 and none for
    the fourth photo: fill effect = mean over the three photos with both of swap - swap-bgonly = mean(0, 1, 1/2)
    = 1/2; B bg-alone = mean(1, 0, 1/2) - 1/2 = 0 (over its own photos: with a photo unpaired, fill effect is
    not B - B bg-alone). Class 1 has no swap-bgonly: undefined, no part of the overall value. Class 2 has one
    photo with both: a value and no interval (one photo, under the minimum cell)."""
    first = _cell(0, "hard", [0, 0, 1, 1], [1, 1, 1, 0], swap_bgonly=[1, 0, 0.5, math.nan])
    second = _cell(1, "hard", [0, 1], [1, 1])
    third = _cell(2, "hard", [0, 1], [1, 1], swap_bgonly=[0, math.nan])
    table = _table(_cell(0, "easy", [1, 1]) + first + _cell(1, "easy", [1, 0]) + second + _cell(2, "easy", [1, 1])
                   + third)
    table.bgonly = np.array([0, 0, 2, 1, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0])
    classes, overall, overall_ci, _ = attribute(table, n_boot=300, seed=2)
    a, b, c = (row.values for row in classes)
    assert (a["background_part"], a["fill_effect"], a["background_part_bgonly"]) == (0.25, 0.5, 0.0)
    assert a["hard_on_easy_bgonly"] == 0.5
    low, high = classes[0].intervals["fill_effect"]
    assert low <= 0.5 <= high and high > low
    assert math.isnan(b["fill_effect"]) and math.isnan(b["background_part_bgonly"]) and b["background_part"] == 0.5
    assert c["fill_effect"] == 1.0 and all(math.isnan(x) for x in classes[2].intervals["fill_effect"])
    assert [row.n_bgonly for row in classes] == [5, 0, 1]
    assert overall["fill_effect"] == pytest.approx(0.75)  # the classes that have it: (1/2 + 1) / 2
    low, high = overall_ci["fill_effect"]  # over both classes' four paired photos: allowed
    assert low <= 0.75 <= high and high > low


def test_the_fill_effect_flags_beyond_the_threshold_with_its_interval_clear_of_0() -> None:
    """Issue 45: flagged like the fill control: |fill effect| over the threshold and its interval excluding 0."""
    from curate.stages.attribution import AttributionSettings, class_flag

    settings = AttributionSettings()
    flag = class_flag({"fill_effect": -0.08, "background_part_bgonly": 0.3}, {"fill_effect": (-0.15, -0.01)},
                      settings)
    assert flag.startswith("fill effect:") and "-8.0 points" in flag and "B on those photos is +30.0" in flag
    for value, interval in ((-0.08, (-0.15, 0.01)), (0.04, (0.01, 0.07)), (math.nan, (math.nan, math.nan))):
        assert class_flag({"fill_effect": value}, {"fill_effect": interval}, settings) == ""


def test_photo_table_counts_a_photos_background_alone_swaps() -> None:
    """Issue 45: one swap-bgonly per scored hard swap; a photo's value is the share answered right."""
    rows = [{"sample_id": "o", "variant": "original", "source_sample_id": "a", "class_index": 0, "group": "hard"}]
    correct = {"o": False, "b0": True, "b1": False}
    for i in range(3):
        rows.append({"sample_id": f"b{i}", "variant": "swap-bgonly", "source_sample_id": "a", "class_index": 0,
                     "group": "hard", "k": i})  # b2 was not scored
    table = photo_table(rows, correct)
    assert table.values[0, COLUMNS.index("swap-bgonly")] == 0.5
    assert list(table.bgonly) == [2] and table.bgonly_of(0) == 2 and table.bgonly_of(0, "easy") == 0


def _crossed_rows(outcomes: list[list[tuple[str, bool]]], swaps: list[bool], label_of: dict[str, str] | None = None
                  ) -> tuple[list[dict], dict[str, bool]]:
    """Variant rows and correctness for one class: four easy photos (3 right) and, per hard photo i, its original
    (right when i is odd), one swap (``swaps[i]``) and one swap-bgonly per (background photo, outcome) in
    ``outcomes[i]``; a background photo's label is ``label_of`` (default: all "grass")."""
    rows, correct = [], {}

    def add(sid: str, variant: str, photo: str, group: str, ok: bool, **more: object) -> None:
        rows.append({"sample_id": sid, "variant": variant, "source_sample_id": photo, "class_index": 0,
                     "group": group, "k": 0, **more})
        correct[sid] = ok

    for i in range(4):
        add(f"e{i}", "original", f"easy{i}", "easy", i > 0)
    for i, (images, swap) in enumerate(zip(outcomes, swaps)):
        add(f"h{i}", "original", f"hard{i}", "hard", i % 2 == 1)
        add(f"s{i}", "swap", f"hard{i}", "hard", swap)
        for j, (photo, ok) in enumerate(images):
            add(f"b{i}-{j}", "swap-bgonly", f"hard{i}", "hard", ok, donor_sample_id=photo,
                background=(label_of or {}).get(photo, "grass"))
    return rows, correct


def _photo_only(table: PhotoTable) -> PhotoTable:
    """The same table without its images' background photos: the bgonly statistics resample the photos alone."""
    return PhotoTable(table.photo_ids, table.classes, table.groups, table.values, table.refills, table.bgonly)


def test_photo_table_keeps_each_background_alone_images_photo_for_the_crossed_bootstrap() -> None:
    """Issue 45: each scored swap-bgonly image with its hard photo, outcome, background photo and its label; none
    kept when an image lacks its background photo (``donor_sample_id``)."""
    rows, correct = _crossed_rows([[("g1", True), ("g0", False)], [("g1", False)]], [True, True],
                                  {"g0": "grass", "g1": "sand"})
    table = photo_table(rows, correct)
    images = table.bgonly_images
    assert images is not None and images.background_photo_ids == ["g0", "g1"]
    assert images.background_labels == ["grass", "sand"] and images.photos_per_label() == {"grass": 1, "sand": 1}
    hard = [table.photo_ids.index("hard0"), table.photo_ids.index("hard0"), table.photo_ids.index("hard1")]
    assert list(images.photo) == hard and list(images.correct) == [1.0, 0.0, 0.0]
    assert list(images.background_photo) == [1, 0, 1]
    del rows[-1]["donor_sample_id"]
    assert photo_table(rows, correct).bgonly_images is None


def test_the_crossed_bootstrap_widens_the_fill_effect_where_one_background_photo_carries_it() -> None:
    """Issue 45: 20 hard photos, each swap right and each on the three photos of its donor's background alone,
    wrong on g0 and right on g1, g2: swap-bgonly = 2/3 on every photo, fill effect = 1/3 with no spread over the
    photos, so resampling the photos alone gives [1/3, 1/3], clear of 0, although g0 alone carries it. The
    crossed bootstrap also draws the three background photos: g0 is left out with probability (2/3)^3 = 0.30,
    and then the fill effect is 0, so its interval starts at 0. The other statistics are unchanged, byte for byte."""
    rows, correct = _crossed_rows([[("g0", False), ("g1", True), ("g2", True)]] * 20, [True] * 20)
    crossed = photo_table(rows, correct)
    classes, overall, overall_ci, _ = attribute(crossed, n_boot=400, seed=3)
    plain, plain_overall, plain_ci, _ = attribute(_photo_only(crossed), n_boot=400, seed=3)
    row, flat = classes[0], plain[0]
    assert row.values["fill_effect"] == pytest.approx(1 / 3) == flat.values["fill_effect"]
    assert flat.intervals["fill_effect"] == pytest.approx((1 / 3, 1 / 3))
    low, high = row.intervals["fill_effect"]
    assert low <= 0.0 and high >= 1 / 3 and high - low > 0.3
    assert row.intervals["hard_on_easy_bgonly"][1] - row.intervals["hard_on_easy_bgonly"][0] > (
        flat.intervals["hard_on_easy_bgonly"][1] - flat.intervals["hard_on_easy_bgonly"][0])
    assert overall_ci["fill_effect"] == row.intervals["fill_effect"]  # one class: its replicates
    others = [k for k in STATISTICS if k not in BGONLY_STATISTICS]

    def text(values: dict) -> str:  # exact float repr, NaN included
        return json.dumps(values, sort_keys=True)

    assert text(row.values) == text(flat.values) and text(overall) == text(plain_overall)
    assert text({k: row.intervals[k] for k in others}) == text({k: flat.intervals[k] for k in others})
    assert text({k: overall_ci[k] for k in others}) == text({k: plain_ci[k] for k in others})


def test_the_crossed_bootstrap_is_the_photo_bootstrap_where_the_background_photos_do_not_differ() -> None:
    """Issue 45, the checkable case: each hard photo's outcome is the same on every background photo and each
    photo shows all three photos of its background (at least one is drawn in every replicate), so drawing the
    background photos moves no photo's swap-bgonly value: the crossed intervals are the photo bootstrap's."""
    rows, correct = _crossed_rows([[(g, i % 3 == 0) for g in ("g0", "g1", "g2")] for i in range(12)],
                                  [i % 4 != 0 for i in range(12)])
    crossed = photo_table(rows, correct)
    (row,), _, overall_ci, _ = attribute(crossed, n_boot=300, seed=5)
    (flat,), _, plain_ci, _ = attribute(_photo_only(crossed), n_boot=300, seed=5)
    for k in BGONLY_STATISTICS:
        assert row.intervals[k][1] > row.intervals[k][0]
        np.testing.assert_allclose(row.intervals[k], flat.intervals[k], rtol=0, atol=1e-12)
        np.testing.assert_allclose(overall_ci[k], plain_ci[k], rtol=0, atol=1e-12)


def test_a_background_with_one_photo_alone_gives_the_fill_effect_no_interval() -> None:
    """Issue 45: with every swap-bgonly image on one photo of the background, that photo's draw cannot be resampled
    (it never moves): the interval rule withholds the bgonly intervals (the values stay), as for a cell of one
    photo; the class's other intervals are given."""
    rows, correct = _crossed_rows([[("g0", i % 2 == 0)] for i in range(10)], [True] * 10)
    (row,), overall, overall_ci, _ = attribute(photo_table(rows, correct), n_boot=100, seed=0)
    assert row.values["fill_effect"] == pytest.approx(0.5) and overall["fill_effect"] == pytest.approx(0.5)
    assert all(math.isnan(x) for k in BGONLY_STATISTICS for x in row.intervals[k] + overall_ci[k])
    assert row.intervals["background_part"][1] > row.intervals["background_part"][0]


def test_photo_table_averages_a_photos_refills_and_counts_them() -> None:
    """Issue 45: one refill per scored swap; a photo's refill value is the share of its refills answered right."""
    rows = [{"sample_id": "o", "variant": "original", "source_sample_id": "a", "class_index": 0, "group": "hard"},
            {"sample_id": "q", "variant": "original", "source_sample_id": "b", "class_index": 0, "group": "hard"}]
    correct = {"o": False, "q": True}
    for i, ok in enumerate((True, False, True)):
        rows.append({"sample_id": f"r{i}", "variant": "refill", "source_sample_id": "a", "class_index": 0,
                     "group": "hard", "k": i, "uncovered": 0.3})
        correct[f"r{i}"] = ok
    rows.append({"sample_id": "unscored", "variant": "refill", "source_sample_id": "b", "class_index": 0,
                 "group": "hard", "k": 0})
    table = photo_table(rows, correct)
    refill = COLUMNS.index("refill")
    assert table.values[0, refill] == pytest.approx(2 / 3) and math.isnan(table.values[1, refill])
    assert list(table.refills) == [3, 0] and table.refills_of(0) == 3 and table.refills_of(0, "easy") == 0


# --------------------------------------------------------------------------- photo_table()
def test_photo_table_joins_variants_with_correctness() -> None:
    rows, correct = [], {}

    def image(photo: str, variant: str, ok: bool, c: int = 0, group: str = "hard") -> None:
        sid = f"{photo}-{variant}-{len(rows)}"
        rows.append({"sample_id": sid, "variant": variant, "source_sample_id": photo, "class_index": c, "group": group})
        correct[sid] = ok

    image("a", "original", True)
    for ok in (True, True, True):
        image("a", "adversarial", ok)
    image("b", "original", False, group="easy")
    for ok in (True, False, True):
        image("b", "adversarial", ok, group="easy")
    image("b", "swap", True, group="easy")
    image("b", "swap", False, group="easy")  # two swap donors: their mean
    image("c", "swap", True)  # c's original was not scored (below): c is left out
    rows.append({"sample_id": "c-original", "variant": "original", "source_sample_id": "c", "class_index": 0,
                 "group": "hard"})
    rows.append({"sample_id": "unscored", "variant": "paste", "source_sample_id": "a", "class_index": 0,
                 "group": "hard"})
    table = photo_table(rows, correct)
    assert table.photo_ids == ["a", "b"]
    assert list(table.groups) == ["hard", "easy"] and list(table.classes) == [0, 0]
    col = {name: i for i, name in enumerate(COLUMNS)}
    assert table.values[0, col["adversarial"]] == 1.0 and table.values[1, col["adversarial"]] == 0.0
    assert table.values[1, col["swap"]] == 0.5 and math.isnan(table.values[0, col["swap"]])
    assert math.isnan(table.values[0, col["paste"]])  # an image the evaluation did not score
    assert (table.values[0, col["original"]], table.values[1, col["original"]]) == (1.0, 0.0)
    assert len(table.cell(0, "easy")) == 1 and len(table.cell(0, "hard")) == 1
    assert photo_table(rows, {}).photo_ids == []


# --------------------------------------------------------------------------- derivative_licence
@pytest.mark.parametrize(("codes", "expected"), [
    (("cc-by", "cc-by-nc"), "cc-by-nc"),
    (("cc-by-nc", "cc-by"), "cc-by-nc"),
    (("cc0", "pd"), "pd"),
    (("cc-by-sa", "cc-by"), "cc-by-sa"),
    (("cc0", "cc-by-sa"), "cc-by-sa"),
    (("cc-by-sa", "cc-by-nc-sa"), None),
    (("cc-by-sa", "cc-by-nc"), None),
    (("mit", "cc-by"), None),
    (("cc-by", "cc-by"), "cc-by"),
    (("cc-by-nc-sa",), "cc-by-nc-sa"),
    ((), None),
])
def test_derivative_licence(codes: tuple[str, ...], expected: str | None) -> None:
    assert derivative_licence(codes) == expected


# --------------------------------------------------------------------------- the records
def _model(run: str, threshold: float = 0.05) -> ModelAttribution:
    table = _hand_table()
    table.values[:, COLUMNS.index("paste")] = table.values[:, COLUMNS.index("original")]
    table.values[0, COLUMNS.index("paste")] = 0.0  # class 0 loses one of 8 photos to the paste: 12.5 points
    classes, overall, overall_ci, used = attribute(table, n_boot=100, seed=0)
    rows = tuple(ClassRow(c.class_index, f"class{c.class_index}", c.n_easy, c.n_hard, c.values, c.intervals, c.reason,
                          "paste control loses" if c.values["paste_cost"] > threshold else "")
                 for c in classes)
    return ModelAttribution(run, f"model-{run}", f"id-{run}", "clip", "imagenet1k", 0.001, overall, overall_ci, used,
                            rows)


def test_attribution_run_round_trip(tmp_path) -> None:
    record = AttributionRun(intervention={"run": "intervene", "source_name": "world", "sigma": 0.25},
                            settings={"n_boot": 100, "seed": 0, "control_threshold": 0.05},
                            models=[_model("a"), _model("b")])
    run_dir = record.write(tmp_path / "runs" / "attribution")
    loaded = AttributionRun.load(run_dir)
    assert [m.run for m in loaded.models] == ["a", "b"] and loaded.threshold == 0.05
    for mine, theirs in zip(record.models, loaded.models):
        assert theirs.classes_used == 2 and theirs.model == mine.model and theirs.chance == pytest.approx(0.001)
        for k in STATISTICS:
            a, b = mine.value(k), theirs.value(k)
            assert (math.isnan(a) and math.isnan(b)) or b == pytest.approx(a, abs=1e-6), k
            assert theirs.interval(k) == pytest.approx(mine.interval(k), abs=1e-6, nan_ok=True), k
        assert [c.label for c in theirs.classes] == ["0 class0", "1 class1"]
        assert [bool(c.flag) for c in theirs.classes] == [True, False] and len(theirs.flagged) == 1
        assert theirs.classes[0].values["paste_cost"] == pytest.approx(0.125)
    assert loaded.model("model-b").run == "b" and loaded.model("id-a").run == "a"
    with pytest.raises(KeyError):
        loaded.model("nobody")
    markdown = (run_dir / AttributionRun.MARKDOWN).read_text()
    for header in ("drop D", "background B", "rest D - B", "paste control", "only-FG", "mixed-rand", "## model-a"):
        assert header in markdown, header
    rows = list(csv.DictReader(io.StringIO((run_dir / AttributionRun.CSV).read_text())))
    assert [r["run"] for r in rows if r["class_index"] == "all"] == ["a", "b"]
    assert len(rows) == 2 * 3
    everything = next(r for r in rows if r["class_index"] == "all" and r["run"] == "a")
    assert float(everything["drop"]) == pytest.approx(0.25) and everything["rfs"] == ""  # NaN is an empty cell
    assert (everything["n_easy"], everything["n_hard"]) == ("8", "8")
    saved = json.loads((run_dir / AttributionRun.RESULTS).read_text())
    assert saved["models"][0]["overall"]["rfs"]["value"] is None  # NaN is written as null, not as NaN
    with pytest.raises(RunError, match="not 'intervene'"):
        InterventionRun.load(run_dir)


def test_a_version_1_attribution_record_loads_with_its_old_fill_control_left_out(tmp_path) -> None:
    """Issue 45: a version 1 record's fill_bias was B over all swaps - B over covered ones, another statistic under
    the same name: it reads undefined (with its part of a flag and the ``covered_below`` setting) and the rest as
    written; a version 2 record keeps its fill control."""
    row = ClassRow(0, "class0", 4, 4, {"background_part": 0.25, "fill_bias": 0.125, "background_part_covered": 0.125,
                                       "hard_on_easy_covered": 0.5, "ghost_bias": 0.1},
                   {"fill_bias": (0.1, 0.2), "background_part": (0.1, 0.4)},
                   flag="ghost control: the donors' filled holes move B by +10.0 points (> 5); B without the ghost is "
                        "+15.0; fill control: the swaps' visible fill moves B by +12.5 points (> 5, interval +10.0 to "
                        "+20.0); B covered (uncovered <= 0.2) is +12.5")
    model = ModelAttribution("a", "model-a", "id-a", "timm", "imagenet", 0.001, {"fill_bias": 0.125,
                                                                               "background_part": 0.25},
                             {"fill_bias": (0.1, 0.2)}, 1, (row,))
    record = AttributionRun(intervention={"run": "intervene"}, models=[model],
                            settings={"n_boot": 100, "control_threshold": 0.05, "covered_below": 0.2})
    run_dir = record.write(tmp_path / "runs" / "attribution")
    assert AttributionRun.load(run_dir).models[0].value("fill_bias") == 0.125  # version 2: as written
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "record_version": 1}))
    old = AttributionRun.load(run_dir)
    loaded, kept = old.models[0], old.models[0].classes[0]
    assert math.isnan(loaded.value("fill_bias")) and math.isnan(kept.values.get("fill_bias", math.nan))
    assert not {"fill_bias", "background_part_covered", "hard_on_easy_covered"} & set(kept.values)
    assert loaded.value("background_part") == 0.25 and kept.values["ghost_bias"] == 0.1
    assert kept.flag.startswith("ghost control:") and "B without the ghost is +15.0" in kept.flag
    assert "fill control" not in kept.flag and "covered" not in kept.flag and "covered_below" not in old.settings
    assert "fill control" in old.markdown()  # the column is there, undefined
    assert math.isnan(loaded.value("fill_effect")) and loaded.n_bgonly is None and kept.n_bgonly is None


def test_a_version_2_attribution_record_loads_with_the_fill_effect_undefined(tmp_path) -> None:
    """Issue 45: a version 2 record has no fill effect: its statistics read NaN, its counts None (empty cells),
    and everything else as written; a version 3 record keeps them."""
    row = ClassRow(0, "class0", 4, 4, {"background_part": 0.25, "fill_bias": 0.1}, {"fill_bias": (0.05, 0.2)},
                   n_refills=4)
    model = ModelAttribution("a", "model-a", "id-a", "timm", "imagenet", 0.001, {"background_part": 0.25}, {}, 1,
                             (row,))
    run_dir = AttributionRun(intervention={"run": "intervene"}, settings={"n_boot": 100}, models=[model]).write(
        tmp_path / "runs" / "attribution")
    results = json.loads((run_dir / "attribution.json").read_text())
    for m in results["models"]:  # as version 2 wrote it: no fill effect, no count
        for k in ("hard_on_easy_bgonly", "background_part_bgonly", "fill_effect"):
            del m["overall"][k]
        for c in m["classes"]:
            del c["n_bgonly"]
    (run_dir / "attribution.json").write_text(json.dumps(results))
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "record_version": 2}))
    old = AttributionRun.load(run_dir)
    loaded = old.models[0]
    assert math.isnan(loaded.value("fill_effect")) and math.isnan(loaded.value("background_part_bgonly"))
    assert loaded.n_bgonly is None and loaded.classes[0].n_bgonly is None
    assert loaded.classes[0].values["fill_bias"] == 0.1 and loaded.classes[0].n_refills == 4
    header, first = list(csv.reader(io.StringIO(old.csv())))[:2]
    assert first[header.index("n_bgonly")] == "" and first[header.index("fill_effect")] == ""
    assert "fill effect" in old.markdown() and AttributionRun.VERSION == 3


def _variant_rows() -> list[dict]:
    return [
        {"sample_id": "s2", "variant": "swap", "source_sample_id": "p1", "class_index": 3, "group": "hard", "k": 0,
         "donor_sample_id": "p2", "donor_class_index": 3, "donor_group": "easy", "background": "grass",
         "filled_fraction": 0.1, "fill": "tile-left", "license": "cc-by-nc"},
        {"sample_id": "s1", "variant": "original", "source_sample_id": "p1", "class_index": 3, "group": "hard",
         "background": "sand", "license": "cc-by"},
    ]


def test_intervention_run_round_trip(tmp_path) -> None:
    record = InterventionRun(config={"source": {"root": "/x", "name": "world", "split": None},
                                     "settings": {"sigma": 0.3, "seed": 4}, "counts": {"sources": 1, "images": 2},
                                     "masks": {"exact": 1}, "truth": False},
                             variants_rows=variants_table(_variant_rows()))
    run_dir = record.write(tmp_path / "runs" / "intervene")
    loaded = InterventionRun.load(run_dir)
    assert loaded.counts == {"sources": 1, "images": 2} and loaded.sigma == 0.3 and not loaded.is_truth
    assert loaded.source["name"] == "world" and loaded.masks == {"exact": 1}
    rows = loaded.rows()
    assert [r["variant"] for r in rows] == ["original", "swap"]  # sorted by (source, variant, k)
    assert list(rows[0]) == [name for name, _ in VARIANT_COLUMNS]
    assert rows[0]["donor_sample_id"] is None and rows[0]["k"] is None
    assert rows[1]["donor_sample_id"] == "p2" and rows[1]["filled_fraction"] == pytest.approx(0.1)
    assert loaded.variant_counts() == {"original": 1, "swap": 1}
    assert InterventionRun.of_folder(tmp_path).run_dir == run_dir
    with pytest.raises(RunError, match="not 'attribution'"):
        AttributionRun.load(run_dir)


def test_intervention_records_refuse_a_bad_shape_and_a_missing_record(tmp_path) -> None:
    with pytest.raises(RunError, match="curate intervene"):
        InterventionRun.of_folder(tmp_path)
    broken = InterventionRun(config={"source": {}, "settings": {}}, variants_rows=variants_table([]))
    run_dir = broken.write(tmp_path / "runs" / "broken")
    with pytest.raises(RunError, match="counts"):
        InterventionRun.load(run_dir)
    with pytest.raises(RunError, match="variants table"):
        InterventionRun(config={"source": {}, "settings": {}, "counts": {}}).write(tmp_path / "runs" / "empty")
