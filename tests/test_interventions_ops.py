"""curate.interventions.image_ops: holes, Only-BG-T fill, Only-FG / No-FG, paste, donor fitting, noise, PNG."""
from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from curate.interventions.image_ops import (
    FILLS,
    Filled,
    area_fraction,
    box_hole,
    fill_hole,
    fit_background,
    fit_mask,
    gaussian_noise,
    hole_margin,
    mask_box,
    neutral_object,
    no_foreground,
    object_hole,
    only_foreground,
    paste,
    png_bytes,
    uncovered_fraction,
)
from curate.interventions.plan import Source, grid_mask, grid_uncovered, parse_variants, plan_donors


def random_image(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def box_mask(h: int, w: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
    mask = np.zeros((h, w), dtype=bool)
    mask[y0:y1, x0:x1] = True
    return mask


@st.composite
def image_and_mask(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    h = draw(st.integers(1, 12))
    w = draw(st.integers(1, 12))
    image = draw(arrays(np.uint8, (h, w, 3)))
    mask = draw(arrays(np.bool_, (h, w)))
    return image, mask


# --- hole_margin / object_hole ----------------------------------------------------------------


def test_hole_margin_formula() -> None:
    assert hole_margin((500, 400)) == 8  # round(0.02 * 400)
    assert hole_margin((10, 10)) == 1  # never below 1
    assert hole_margin((224, 300), fraction=0.1) == 22
    assert hole_margin((224, 300, 3)) == 4  # image.shape works too


def test_object_hole_margin_zero_is_the_mask() -> None:
    mask = box_mask(7, 9, 2, 4, 3, 6)
    hole = object_hole(mask, 0)
    assert hole.dtype == np.bool_
    np.testing.assert_array_equal(hole, mask)
    assert hole is not mask


def test_object_hole_single_pixel_grows_to_square() -> None:
    mask = np.zeros((7, 7), dtype=bool)
    mask[3, 3] = True
    np.testing.assert_array_equal(object_hole(mask, 1), box_mask(7, 7, 2, 5, 2, 5))
    np.testing.assert_array_equal(object_hole(mask, 2), box_mask(7, 7, 1, 6, 1, 6))
    # At a corner the square is cut by the image's edge; nothing enters from outside.
    corner = np.zeros((5, 5), dtype=bool)
    corner[0, 0] = True
    np.testing.assert_array_equal(object_hole(corner, 1), box_mask(5, 5, 0, 2, 0, 2))
    # A margin beyond the image covers it all; an empty mask stays empty.
    assert object_hole(corner, 50).all()
    assert not object_hole(np.zeros((4, 4), dtype=bool), 3).any()


def test_object_hole_coerces_non_bool_masks() -> None:
    mask = np.zeros((5, 5), dtype=np.uint8)
    mask[2, 2] = 255
    np.testing.assert_array_equal(object_hole(mask, 1), box_mask(5, 5, 1, 4, 1, 4))


@settings(max_examples=80, deadline=None)
@given(mask=arrays(np.bool_, st.tuples(st.integers(1, 12), st.integers(1, 12))), margin=st.integers(0, 4))
def test_object_hole_contains_mask(mask: np.ndarray, margin: int) -> None:
    hole = object_hole(mask, margin)
    assert hole.shape == mask.shape
    assert not (mask & ~hole).any()


# --- fill_hole --------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(data=image_and_mask())
def test_fill_hole_never_touches_pixels_outside_the_hole(data: tuple[np.ndarray, np.ndarray]) -> None:
    image, hole = data
    before = image.copy()
    if hole.all():
        with pytest.raises(ValueError, match="covers the whole image"):
            fill_hole(image, hole)
        return
    filled = fill_hole(image, hole)
    np.testing.assert_array_equal(image, before)  # the input is not modified
    assert filled.image is not image
    assert filled.image.dtype == np.uint8 and filled.image.shape == image.shape
    np.testing.assert_array_equal(filled.image[~hole], image[~hole])
    assert filled.fraction == pytest.approx(hole.mean())
    assert filled.method in {"tile-left", "tile-right", "tile-top", "tile-bottom", "mean", "none"}


def horizontal_stripes(h: int, w: int) -> np.ndarray:
    colours = np.random.default_rng(1).integers(0, 256, (h, 3), dtype=np.uint8)
    return np.repeat(colours[:, None, :], w, axis=1)


def test_fill_hole_left_right_tiling_continues_horizontal_stripes() -> None:
    stripes = horizontal_stripes(10, 12)
    ruined = stripes.copy()
    hole = box_mask(10, 12, 3, 7, 4, 8)  # left strip 10 x 4 ties right strip 10 x 4: left wins
    ruined[hole] = 0
    filled = fill_hole(ruined, hole)
    assert filled.method == "tile-left"
    np.testing.assert_array_equal(filled.image, stripes)
    assert filled.fraction == pytest.approx(16 / 120)

    hole = box_mask(10, 12, 3, 7, 1, 5)  # right strip (7 columns) is the largest
    ruined = stripes.copy()
    ruined[hole] = 0
    filled = fill_hole(ruined, hole)
    assert filled.method == "tile-right"
    np.testing.assert_array_equal(filled.image, stripes)


def test_fill_hole_tiling_formula() -> None:
    image = random_image(6, 10, seed=3)
    hole = box_mask(6, 10, 1, 5, 3, 9)  # left 6x3=18, right 6x1=6, top 1x10=10, bottom 1x10=10
    filled = fill_hole(image, hole)
    assert filled.method == "tile-left"
    for y, x in zip(*np.nonzero(hole)):
        np.testing.assert_array_equal(filled.image[y, x], image[y, (x - 3) % 3])


def test_fill_hole_full_width_hole_tiles_from_top_or_bottom() -> None:
    columns = np.random.default_rng(2).integers(0, 256, (9, 3), dtype=np.uint8)
    vertical = np.repeat(columns[None, :, :], 8, axis=0)  # 8 x 9, columns constant
    hole = box_mask(8, 9, 2, 5, 0, 9)  # top 2 rows, bottom 3 rows: bottom wins
    ruined = vertical.copy()
    ruined[hole] = 0
    filled = fill_hole(ruined, hole)
    assert filled.method == "tile-bottom"
    np.testing.assert_array_equal(filled.image, vertical)
    for y, x in zip(*np.nonzero(hole)):
        np.testing.assert_array_equal(filled.image[y, x], ruined[5 + (y - 2) % 3, x])

    hole = box_mask(8, 9, 4, 6, 0, 9)  # top 4 rows beat bottom 2
    ruined = vertical.copy()
    ruined[hole] = 0
    filled = fill_hole(ruined, hole)
    assert filled.method == "tile-top"
    np.testing.assert_array_equal(filled.image, vertical)


def test_fill_hole_full_box_uses_mean_colour_of_the_rest() -> None:
    image = random_image(5, 5, seed=4)
    hole = np.zeros((5, 5), dtype=bool)
    hole[2, :] = True
    hole[:, 2] = True  # a cross: its box is the whole image, yet 16 pixels are background
    filled = fill_hole(image, hole)
    assert filled.method == "mean"
    expected = np.round(image[~hole].astype(float).mean(axis=0)).astype(np.uint8)
    assert (filled.image[hole] == expected).all()
    np.testing.assert_array_equal(filled.image[~hole], image[~hole])
    assert filled.fraction == pytest.approx(9 / 25)


def test_fill_hole_whole_image_raises() -> None:
    with pytest.raises(ValueError, match="the object covers the whole image: no background to keep"):
        fill_hole(random_image(3, 4), np.ones((3, 4), dtype=bool))


def test_fill_hole_empty_hole_is_unchanged() -> None:
    image = random_image(4, 4)
    filled = fill_hole(image, np.zeros((4, 4), dtype=bool))
    assert filled == Filled(image=filled.image, method="none", fraction=0.0)
    np.testing.assert_array_equal(filled.image, image)
    assert filled.image is not image


# --- the other fills, the neutral object, the uncovered hole (the ghost control) -------------


def test_box_fill_hides_the_outline_of_the_hole() -> None:
    """box-tile fills the hole's bounding box: stripes that run across a crescent-shaped hole come back
    whole, and no pixel inside the box keeps anything of the shape that was there."""
    stripes = horizontal_stripes(10, 12)
    hole = box_mask(10, 12, 3, 7, 6, 10) & ~box_mask(10, 12, 4, 6, 8, 10)  # a C shape
    ruined = stripes.copy()
    ruined[hole] = 255
    boxed = fill_hole(ruined, hole, "box-tile")
    assert boxed.method == "box-tile-left" and boxed.fraction == pytest.approx(16 / 120)
    np.testing.assert_array_equal(boxed.image, stripes)  # the box's rows continue from the left strip
    assert box_hole(hole).sum() == 16 and box_hole(np.zeros((3, 3), bool)).sum() == 0


@pytest.mark.parametrize("method", ["telea", "ns", "box-telea"])
def test_inpainting_fills_only_the_hole_and_comes_close_to_a_flat_background(method: str) -> None:
    flat = np.full((16, 16, 3), (40, 120, 200), dtype=np.uint8)
    hole = box_mask(16, 16, 5, 11, 4, 9)
    ruined = flat.copy()
    ruined[hole] = 0
    filled = fill_hole(ruined, hole, method)
    assert filled.method == method and filled.fraction == pytest.approx(30 / 256)
    np.testing.assert_array_equal(filled.image[~hole], flat[~hole])  # outside the (box) hole: untouched
    assert np.abs(filled.image.astype(int) - flat.astype(int)).max() <= 2  # a flat background is inpainted flat


def test_fill_refuses_an_unknown_method() -> None:
    with pytest.raises(ValueError, match="unknown fill 'blur'; known: tile, telea"):
        fill_hole(random_image(4, 4), box_mask(4, 4, 1, 2, 1, 2), "blur")
    assert set(FILLS) == {"tile", "telea", "ns", "box-tile", "box-telea", "box-ns"}


def test_neutral_object_is_the_mask_in_the_mean_colour_by_hand() -> None:
    background = np.zeros((2, 2, 3), dtype=np.uint8)
    background[0, 0] = (100, 0, 3)
    background[1, 1] = (1, 50, 0)  # mean per channel: 25.25, 12.5, 0.75 -> round: 25, 12 (half to even), 1
    mask = box_mask(2, 2, 0, 1, 0, 2)
    out = neutral_object(background, mask)
    assert out[0].tolist() == [[25, 12, 1], [25, 12, 1]]
    np.testing.assert_array_equal(out[1], background[1])


def test_uncovered_fraction_by_hand() -> None:
    hole = box_mask(6, 6, 1, 5, 1, 5)  # 16 pixels
    assert uncovered_fraction(hole, box_mask(6, 6, 1, 5, 1, 3)) == pytest.approx(8 / 16)
    assert uncovered_fraction(hole, np.ones((6, 6), bool)) == 0.0
    assert uncovered_fraction(np.zeros((6, 6), bool), hole) == 0.0
    with pytest.raises(ValueError, match="does not match hole shape"):
        uncovered_fraction(hole, np.ones((5, 6), bool))


# --- only_foreground / no_foreground / paste --------------------------------------------------


def test_only_and_no_foreground() -> None:
    image = random_image(4, 5)
    mask = box_mask(4, 5, 1, 3, 1, 4)
    fg = only_foreground(image, mask)
    np.testing.assert_array_equal(fg[mask], image[mask])
    assert (fg[~mask] == 0).all()
    nofg = no_foreground(image, mask)
    assert (nofg[mask] == 0).all()
    np.testing.assert_array_equal(nofg[~mask], image[~mask])
    np.testing.assert_array_equal(fg + nofg, image)  # they partition the image


def test_paste_all_and_nothing() -> None:
    obj, bg = random_image(4, 6, seed=1), random_image(4, 6, seed=2)
    np.testing.assert_array_equal(paste(obj, np.ones((4, 6), dtype=bool), bg), obj)
    np.testing.assert_array_equal(paste(obj, np.zeros((4, 6), dtype=bool), bg), bg)


@settings(max_examples=80, deadline=None)
@given(data=image_and_mask(), margin=st.integers(0, 3))
def test_paste_control_footprint(data: tuple[np.ndarray, np.ndarray], margin: int) -> None:
    """Pasting the object back on its own filled background changes only the ring ``hole & ~mask``."""
    obj, mask = data
    hole = object_hole(mask, margin)
    if hole.all():
        return
    control = paste(obj, mask, fill_hole(obj, hole).image)
    np.testing.assert_array_equal(control[mask], obj[mask])
    changed = (control != obj).any(axis=2)
    assert not (changed & ~(hole & ~mask)).any()


# --- fit_background / fit_mask ----------------------------------------------------------------


def test_fit_background_wider_donor_is_centre_cropped() -> None:
    donor = random_image(6, 12)
    fitted = fit_background(donor, (6, 6))
    assert fitted.shape == (6, 6, 3)
    np.testing.assert_array_equal(fitted, donor[:, 3:9])


def test_fit_background_scales_to_cover() -> None:
    donor = random_image(4, 8)
    fitted = fit_background(donor, (8, 8))  # scale 2 -> 8 x 16, then the middle 8 columns
    assert fitted.shape == (8, 8, 3)
    grey = np.full((3, 5, 3), 77, dtype=np.uint8)
    fitted = fit_background(grey, (10, 7))  # scale 10/3: bilinear on a constant stays constant
    assert fitted.shape == (10, 7, 3) and (fitted == 77).all()


def test_fit_background_same_size_is_a_copy() -> None:
    donor = random_image(5, 7)
    fitted = fit_background(donor, (5, 7))
    np.testing.assert_array_equal(fitted, donor)
    assert fitted is not donor


def test_fit_mask_keeps_a_centred_square_centred() -> None:
    mask = box_mask(8, 16, 2, 6, 6, 10)  # a 4 x 4 square in the middle of 8 x 16
    fitted = fit_mask(mask, (8, 8))
    np.testing.assert_array_equal(fitted, box_mask(8, 8, 2, 6, 2, 6))
    scaled = fit_mask(mask, (16, 16))  # scale 2 -> 16 x 32, crop the middle 16 columns
    assert scaled.dtype == np.bool_ and scaled.shape == (16, 16)
    assert mask_box(scaled) == pytest.approx((0.5, 0.5, 0.5, 0.5))
    np.testing.assert_array_equal(fit_mask(mask, (8, 16)), mask)


# --- gaussian_noise ---------------------------------------------------------------------------


def test_gaussian_noise_outside_region_unchanged_and_std() -> None:
    grey = np.full((64, 64, 3), 128, dtype=np.uint8)
    region = box_mask(64, 64, 0, 64, 0, 40)
    noisy = gaussian_noise(grey, region, 0.1, np.random.default_rng(0))
    np.testing.assert_array_equal(noisy[~region], grey[~region])
    delta = (noisy[region].astype(float) - grey[region]) / 255.0
    assert 0.09 <= delta.std() <= 0.11
    assert abs(delta.mean()) < 0.01


def test_gaussian_noise_same_seed_same_output() -> None:
    image = random_image(8, 8)
    region = box_mask(8, 8, 2, 6, 2, 6)
    a = gaussian_noise(image, region, 0.25, np.random.default_rng(7))
    b = gaussian_noise(image, region, 0.25, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    c = gaussian_noise(image, region, 0.25, np.random.default_rng(8))
    assert not np.array_equal(a, c)


def test_gaussian_noise_foreground_and_background_share_the_field() -> None:
    image = random_image(10, 12, seed=5)
    mask = box_mask(10, 12, 3, 8, 2, 9)
    fg = gaussian_noise(image, mask, 0.2, np.random.default_rng(11))
    bg = gaussian_noise(image, ~mask, 0.2, np.random.default_rng(11))
    whole = gaussian_noise(image, np.ones_like(mask), 0.2, np.random.default_rng(11))
    np.testing.assert_array_equal(np.where(mask[..., None], fg, bg), whole)


# --- validation, measurements, PNG ------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda img, m: fill_hole(img, m),
        lambda img, m: only_foreground(img, m),
        lambda img, m: no_foreground(img, m),
        lambda img, m: paste(img, m, img),
        lambda img, m: gaussian_noise(img, m, 0.1, np.random.default_rng(0)),
    ],
)
def test_shape_mismatch_names_both_shapes(call) -> None:
    with pytest.raises(ValueError, match=r"\(4, 5\).*\(4, 6, 3\)"):
        call(random_image(4, 6), np.zeros((4, 5), dtype=bool))


def test_paste_background_mismatch_names_both_shapes() -> None:
    with pytest.raises(ValueError, match=r"\(4, 7, 3\).*\(4, 6, 3\)"):
        paste(random_image(4, 6), np.zeros((4, 6), dtype=bool), random_image(4, 7))


def test_mask_box_and_area() -> None:
    mask = box_mask(10, 20, 2, 6, 5, 15)
    assert mask_box(mask) == pytest.approx((0.4, 0.5, 0.4, 0.5))
    assert area_fraction(mask) == pytest.approx(40 / 200)
    with pytest.raises(ValueError):
        mask_box(np.zeros((3, 3), dtype=bool))


def test_png_bytes_deterministic_and_round_trips() -> None:
    image = random_image(9, 11, seed=6)
    first, second = png_bytes(image), png_bytes(image.copy())
    assert first == second
    with Image.open(io.BytesIO(first)) as png:
        np.testing.assert_array_equal(np.asarray(png.convert("RGB")), image)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 24), st.integers(1, 24), st.integers(0, 9), st.integers(0, 2**31 - 1))
def test_object_hole_equals_a_square_max_filter(height: int, width: int, margin: int, seed: int) -> None:
    """Our separable dilation against PIL's rank filter (the reference it replaces)."""
    from PIL import ImageFilter

    mask = np.random.default_rng(seed).random((height, width)) > 0.85
    ours = object_hole(mask, margin)
    if margin == 0 or not mask.any():
        assert np.array_equal(ours, mask)
        return
    size = 2 * min(margin, max(height, width) - 1) + 1
    padded = np.pad(mask, size, constant_values=False)  # PIL replicates edges; pad so outside counts as 0
    reference = np.asarray(Image.fromarray(padded.astype(np.uint8) * 255).filter(ImageFilter.MaxFilter(size))) > 127
    assert np.array_equal(ours, reference[size:size + height, size:size + width])


# --- the planner: donors whose hole the object covers ------------------------------------------


def _source(sid: str, group: str, mask: np.ndarray, hole: np.ndarray) -> Source:
    return Source(sid, 0, group, "cc0", float(mask.mean()), True, grid_mask(mask), grid_mask(hole))


def test_cover_match_prefers_the_donor_whose_hole_the_object_covers_and_the_cap_counts() -> None:
    """A hard object on the left half; two easy donors of the same size: one's hole on the left (covered),
    one's on the right (wholly uncovered). Size alone cannot tell them apart; cover picks the left one."""
    left, right = box_mask(64, 64, 8, 56, 4, 30), box_mask(64, 64, 8, 56, 34, 60)
    hard = _source("a" * 16, "hard", left, left)
    covered, exposed = _source("b" * 16, "easy", left, left), _source("c" * 16, "easy", right, right)
    assert grid_uncovered(hard, covered) == 0.0 and grid_uncovered(hard, exposed) == 1.0
    plan, missing = plan_donors([hard, covered, exposed], ["swap"], seed=0, match_pool=1)
    assert [a.donor.sample_id for a in plan if a.source == hard] == [covered.sample_id]
    by_size = {a.donor.sample_id for s in range(8)
               for a in plan_donors([hard, covered, exposed], ["swap"], seed=s, match_pool=2, match="size")[0]
               if a.source == hard}
    assert by_size == {covered.sample_id, exposed.sample_id}  # the size rule draws either
    capped, missing = plan_donors([hard, exposed], ["swap"], seed=0, max_uncovered=0.5)
    assert not [a for a in capped if a.source == hard]
    assert missing == {"uncovered_over_cap:swap": 2, "no_donor:swap": 2}  # both ways: hard on easy, easy on hard
    with pytest.raises(ValueError, match="unknown donor rule 'nearest'"):
        plan_donors([hard], ["swap"], seed=0, match="nearest")


def test_a_swap_brings_its_ghost_control() -> None:
    assert parse_variants("swap") == ("original", "swap", "ghost", "ghost-neutral", "swap-unghosted", "refill")
    assert parse_variants("paste") == ("original", "paste")
