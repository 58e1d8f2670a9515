"""curate.metrics.spuriousity: SSS (papers/004 §3.1, App. C), RMA (papers/000), NaN reasons, aggregation."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from curate import metrics
from curate.metrics.info import MetricInfo
from curate.metrics.spuriousity import (
    NAN_REASONS,
    RMA_INFO,
    SSS_INFO,
    aggregate_scores,
    balanced_mean,
    mean_stat,
    nan_reasons,
    per_class,
    per_image,
    rma,
    spuriousity_scores,
    sss,
    threshold_map,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- strategies
@st.composite
def map_and_mask(draw, nonempty: bool = True):
    """A non-negative map with positive mass and a mask with at least one pixel."""
    h = draw(st.integers(1, 8))
    w = draw(st.integers(1, 8))
    values = draw(arrays(np.float64, (h, w), elements=st.floats(0, 100, allow_nan=False, allow_infinity=False)))
    values.flat[draw(st.integers(0, h * w - 1))] += 1.0  # positive total
    mask = draw(arrays(np.bool_, (h, w)))
    if nonempty:
        mask.flat[draw(st.integers(0, h * w - 1))] = True
    return values, mask


# ----------------------------------------------------------------------------- definitions
def test_lazy_names_resolve() -> None:
    assert metrics.sss is sss and metrics.rma is rma


def test_metric_infos_declare_direction_and_nan_reasons() -> None:
    assert isinstance(SSS_INFO, MetricInfo) and isinstance(RMA_INFO, MetricInfo)
    assert (SSS_INFO.name, SSS_INFO.higher_is_better) == ("SSS", False)
    assert (RMA_INFO.name, RMA_INFO.higher_is_better) == ("RMA", True)
    assert SSS_INFO.nan_reasons == RMA_INFO.nan_reasons == NAN_REASONS
    assert "papers/004" in SSS_INFO.paper and "papers/000" in RMA_INFO.paper
    # the direction is what the scores do: more mass on the object = lower SSS, higher RMA
    mask = np.zeros((4, 4), bool)
    mask[:2] = True
    on, off = np.where(mask, 1.0, 0.1), np.where(mask, 0.1, 1.0)
    assert sss(on, mask) < sss(off, mask) and rma(on, mask) > rma(off, mask)


def test_worked_example_matches_the_formulas() -> None:
    h = np.array([[4.0, 1.0], [0.0, 5.0]])
    m = np.array([[1, 0], [0, 1]])
    inside, outside, total = 9.0, 1.0, 10.0
    assert rma(h, m) == pytest.approx(inside / total)
    sss_prime = (inside - outside) / total
    assert sss(h, m) == pytest.approx(1 - (sss_prime + 1) / 2)
    assert sss(h, m) == pytest.approx(0.1)


def test_all_mass_inside_or_outside_gives_the_extremes() -> None:
    m = np.zeros((4, 4), bool)
    m[:2] = True
    assert sss(m.astype(float), m) == 0.0 and rma(m.astype(float), m) == 1.0
    assert sss((~m).astype(float), m) == 1.0 and rma((~m).astype(float), m) == 0.0


def test_thresholding_as_papers_004_appendix_c() -> None:
    h = np.array([[0.9, 0.2], [0.6, 0.4]])
    m = np.array([[1, 1], [0, 0]])
    # soft: keep H >= 0.5 -> [[.9, 0], [.6, 0]]; in R: .9, total 1.5
    assert rma(h, m, threshold=0.5, mode="soft") == pytest.approx(0.9 / 1.5)
    assert sss(h, m, threshold=0.5, mode="soft") == pytest.approx(1 - 0.9 / 1.5)
    # hard: 1 where H >= 0.5 -> [[1, 0], [1, 0]]; in R: 1 of 2
    assert sss(h, m, threshold=0.5, mode="hard") == pytest.approx(0.5)
    np.testing.assert_array_equal(threshold_map(h, 0.5, "hard"), [[1, 0], [1, 0]])
    np.testing.assert_array_equal(threshold_map(h, 0.5, "soft"), [[0.9, 0], [0.6, 0]])
    t = threshold_map(torch.tensor(h), 0.6, "soft")  # ">=": the pixel at exactly tau is kept
    assert float(t[1, 0]) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="threshold mode"):
        sss(h, m, threshold=0.5, mode="medium")


def test_shapes_types_and_broadcasting() -> None:
    rng = np.random.default_rng(0)
    maps = rng.random((5, 6, 7))
    masks = rng.random((5, 6, 7)) > 0.5
    out = sss(maps, masks)
    assert isinstance(out, np.ndarray) and out.shape == (5,)
    assert isinstance(sss(maps[0], masks[0]), float)
    one_mask = sss(maps, masks[0])  # one mask for every map
    np.testing.assert_allclose(one_mask, [sss(m, masks[0]) for m in maps])
    t = sss(torch.tensor(maps, dtype=torch.float32), torch.tensor(masks))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    np.testing.assert_allclose(t.numpy(), out, atol=1e-6)
    np.testing.assert_allclose(rma(maps, masks), 1 - out, atol=1e-12)


def test_bad_shapes_and_masks_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="aligned pixel for pixel"):
        sss(np.ones((4, 4)), np.ones((5, 4)))
    with pytest.raises(ValueError, match="must be"):
        sss(np.ones((2, 3, 4, 4)), np.ones((4, 4)))
    with pytest.raises(ValueError, match="masks"):
        sss(np.ones((3, 4, 4)), np.ones((2, 4, 4)))
    with pytest.raises(ValueError, match="non-integer"):
        sss(np.ones((4, 4)), np.full((4, 4), 0.5))
    with pytest.raises(ValueError, match="negative"):
        sss(np.ones((4, 4)), -np.ones((4, 4)))
    with pytest.raises(TypeError):
        sss("map", np.ones((4, 4)))


def test_instance_id_masks_count_every_instance(caplog) -> None:
    h = np.arange(16, dtype=float).reshape(4, 4)
    ids = np.zeros((4, 4), np.uint8)
    ids[0, :2] = 3
    ids[3, 3] = 7
    binary = ids != 0
    assert sss(h, ids) == pytest.approx(sss(h, binary))
    assert sss(h, binary.astype(np.uint8) * 255) == pytest.approx(sss(h, binary))


# ----------------------------------------------------------------------------- NaN cases
def test_nan_cases_have_reasons_and_are_counted() -> None:
    mask = np.zeros((3, 3), bool)
    mask[1, 1] = True
    good = np.ones((3, 3))
    nan_map = good.copy()
    nan_map[0, 0] = np.nan
    inf_map = good.copy()
    inf_map[0, 1] = np.inf
    negative = good.copy()
    negative[2, 2] = -1
    low = np.full((3, 3), 0.1)
    maps = np.stack([good, good, np.zeros((3, 3)), nan_map, inf_map, negative, low])
    masks = np.stack([mask, np.zeros((3, 3), bool), mask, mask, mask, mask, mask])
    counts: Counter = Counter()
    values = sss(maps, masks, threshold=0.5, nan_counts=counts)
    assert not math.isnan(values[0]) and np.isnan(values[1:]).all()
    reasons = nan_reasons(maps, masks, threshold=0.5)
    assert reasons == [None, "empty_mask", "zero_map", "nonfinite_map", "nonfinite_map", "negative_map",
                       "zero_after_threshold"]
    assert counts == Counter({"nonfinite_map": 2, "empty_mask": 1, "zero_map": 1, "negative_map": 1,
                              "zero_after_threshold": 1})
    assert set(counts) <= set(NAN_REASONS)
    rma_counts: Counter = Counter()
    assert np.isnan(rma(maps, masks, threshold=0.5, nan_counts=rma_counts)[1:]).all()
    assert rma_counts == counts
    # a single map returns a float NaN, the torch path a NaN tensor
    assert math.isnan(sss(np.zeros((3, 3)), mask))
    assert torch.isnan(sss(torch.zeros(2, 3, 3), torch.tensor(mask))).all()


def test_scores_object_reports_masses() -> None:
    scores = spuriousity_scores(torch.tensor([[[1.0, 3.0]]]), torch.tensor([[[True, False]]]))
    assert float(scores.inside[0]) == 1.0 and float(scores.total[0]) == 4.0
    assert scores.reason_names() == [None] and scores.nan_counts() == {}


# ----------------------------------------------------------------------------- properties
@SETTINGS
@given(map_and_mask())
def test_scores_are_in_unit_interval_and_sss_is_one_minus_rma(data) -> None:
    h, m = data
    s, r = sss(h, m), rma(h, m)
    assert 0.0 <= s <= 1.0 and 0.0 <= r <= 1.0
    assert s == pytest.approx(1.0 - r, abs=1e-12)


@SETTINGS
@given(map_and_mask(), st.floats(1e-3, 1e3))
def test_invariant_to_positive_scaling(data, scale) -> None:
    h, m = data
    assert sss(h * scale, m) == pytest.approx(sss(h, m), abs=1e-9)
    assert rma(h * scale, m) == pytest.approx(rma(h, m), abs=1e-9)
    # with a threshold, scaling the map and the threshold together changes nothing either
    tau = float(np.median(h))
    for mode in ("soft", "hard"):
        a, b = sss(h, m, tau, mode), sss(h * scale, m, tau * scale, mode)
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=1e-9)


@SETTINGS
@given(map_and_mask(), st.floats(0, 100))
def test_thresholded_scores_follow_appendix_c(data, tau) -> None:
    h, m = data
    soft = np.where(h >= tau, h, 0.0)
    hard = (h >= tau).astype(float)
    for mode, expected_map in (("soft", soft), ("hard", hard)):
        value = sss(h, m, threshold=tau, mode=mode)
        total = expected_map.sum()
        if total == 0:
            assert math.isnan(value)
            assert nan_reasons(h, m, tau, mode) == ["zero_after_threshold"]
        else:
            inside = expected_map[m].sum()
            expected = 1 - ((inside - (total - inside)) / total + 1) / 2
            assert value == pytest.approx(expected, abs=1e-9)
            assert 0.0 <= value <= 1.0


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 6))
def test_empty_mask_or_zero_map_is_nan(h, w) -> None:
    counts: Counter = Counter()
    assert math.isnan(sss(np.ones((h, w)), np.zeros((h, w), bool), nan_counts=counts))
    assert math.isnan(rma(np.zeros((h, w)), np.ones((h, w), bool), nan_counts=counts))
    assert counts == Counter({"empty_mask": 1, "zero_map": 1})


# ----------------------------------------------------------------------------- Quantus
def test_rma_equals_quantus_relevance_mass_accuracy() -> None:
    quantus = pytest.importorskip("quantus")
    rng = np.random.default_rng(3)
    n = 6
    a = rng.random((n, 1, 12, 12)).astype(np.float32) ** 3
    s = (rng.random((n, 1, 12, 12)) > 0.6).astype(np.float32)
    x = rng.random((n, 3, 12, 12)).astype(np.float32)
    y = np.zeros(n, dtype=np.int64)
    metric = quantus.RelevanceMassAccuracy(disable_warnings=True)
    theirs = np.asarray(metric(model=None, x_batch=x, y_batch=y, a_batch=a, s_batch=s), dtype=np.float64)
    ours = rma(a[:, 0], s[:, 0])
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- aggregation
def test_aggregation_levels() -> None:
    values = [0.2, 0.4, np.nan, 0.9, 0.5]
    images = ["a", "a", "b", "b", "c"]
    classes = [1, 1, 2, 2, 1]
    ids, means, nans = per_image(values, images)
    assert ids == ["a", "b", "c"]
    np.testing.assert_allclose(means, [0.3, 0.9, 0.5])
    assert list(nans) == [0, 1, 0]
    stats = per_class(values, classes)
    assert stats[1].mean == pytest.approx((0.2 + 0.4 + 0.5) / 3) and stats[2].n == 1 and stats[2].n_nan == 1
    assert balanced_mean(values, classes) == pytest.approx((stats[1].mean + 0.9) / 2)
    assert math.isnan(mean_stat([np.nan]).mean) and mean_stat([np.nan]).n_nan == 1
    out = aggregate_scores(values, image_ids=images, class_ids=classes, image_group={"a": "easy", "b": "hard", "c": None},
                           image_correct={"a": True, "b": False, "c": None})
    assert out["per_image"]["mean"] == pytest.approx((0.3 + 0.9 + 0.5) / 3)
    assert out["per_prediction"]["n"] == 4 and out["per_prediction"]["n_nan"] == 1
    assert out["by_group"]["easy"]["mean"] == pytest.approx(0.3) and out["by_group"]["hard"]["mean"] == pytest.approx(0.9)
    assert set(out["by_correct"]) == {"correct", "wrong"}
    assert out["per_class"]["1"]["n"] == 3
