"""Hand-computed cases for accuracy, drop, top-k, 1-vs-20, bootstrap and effective robustness."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curate.metrics.accuracy import (
    balanced_accuracy,
    class_drops,
    mean_drop,
    mean_per_class_recall,
    topk_correct,
    unbalanced_accuracy,
)
from curate.metrics.bootstrap import bootstrap_groups, bootstrap_mean
from curate.metrics.robustness import effective_robustness, fit_effective_robustness, logit, sigmoid
from curate.stages.evaluate import compute_metrics
from curate.zeroshot.candidates import CandidateSpace, build_top20


def test_balanced_vs_unbalanced() -> None:
    # class 0: 3 of 4 right; class 1: 0 of 1 right
    correct = np.array([1, 1, 1, 0, 0], bool)
    classes = np.array([0, 0, 0, 0, 1])
    assert unbalanced_accuracy(correct) == pytest.approx(3 / 5)
    assert balanced_accuracy(correct, classes) == pytest.approx((0.75 + 0.0) / 2)
    assert np.isnan(balanced_accuracy(np.array([], bool), np.array([], int)))


def test_drop_is_the_mean_of_class_drops_over_classes_with_both_groups() -> None:
    correct = np.array([1, 1, 0, 0, 1, 0, 1, 1], bool)
    classes = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    groups = np.array(["easy", "easy", "hard", "hard", "easy", "hard", "easy", "easy"], dtype=object)
    drops = class_drops(correct, classes, groups)
    assert drops[0][:3] == (1.0, 0.0, 1.0) and drops[1][:3] == (1.0, 0.0, 1.0)
    assert np.isnan(drops[2][1]) and drops[2][3:] == (2, 0)  # class 2 has no hard images
    assert mean_drop(correct, classes, groups) == pytest.approx(1.0)  # class 2 left out
    negative = mean_drop(np.array([0, 1], bool), np.array([5, 5]), np.array(["easy", "hard"], dtype=object))
    assert negative == -1.0


def test_topk_and_mean_per_class_recall() -> None:
    topk = np.array([[3, 1, 2], [2, 3, 1], [1, 2, 3]])
    targets = np.array([1, 1, 3])
    assert topk_correct(topk, targets, 1).tolist() == [False, False, False]
    assert topk_correct(topk, targets, 2).tolist() == [True, False, False]
    assert topk_correct(topk, targets, 3).tolist() == [True, True, True]
    with pytest.raises(ValueError, match="top-4"):
        topk_correct(topk, targets, 4)
    # sklearn's balanced_accuracy_score on the same predictions
    from sklearn.metrics import balanced_accuracy_score

    preds, truth = np.array([0, 0, 1, 2, 2, 2]), np.array([0, 1, 1, 2, 2, 0])
    assert mean_per_class_recall(preds, truth) == pytest.approx(balanced_accuracy_score(truth, preds))


def test_compute_metrics_by_hand() -> None:
    topk = np.array([[0, 1], [1, 0], [1, 0], [1, 0]])
    classes = np.array([0, 0, 1, 1])
    groups = np.array(["easy", "hard", "easy", "hard"], dtype=object)
    backgrounds = np.array(["grass", "water", "grass", None], dtype=object)
    m = compute_metrics(topk, classes, groups, backgrounds, ["a", "b"], candidates_per_sample=2, n_boot=50)
    assert m["overall"]["acc1"] == pytest.approx(0.75)
    assert np.isnan(m["overall"]["acc5"])  # fewer than 5 candidates, as CLIP_benchmark reports
    assert m["groups"]["easy"]["acc1_balanced"] == 1.0 and m["groups"]["hard"]["acc1_balanced"] == 0.5
    assert m["drop"]["acc1"] == pytest.approx(0.5)
    assert [b["background"] for b in m["per_background"]] == ["grass", "water"]
    assert {(c["class_index"], c["background"]): c["acc1"] for c in m["per_class_background"]} == {
        (0, "grass"): 1.0, (0, "water"): 0.0, (1, "grass"): 1.0}


def test_restriction_to_candidates() -> None:
    scores = np.array([[5.0, 9.0, 1.0, 7.0], [5.0, 9.0, 1.0, 7.0]])
    shared = CandidateSpace("file", 4, shared=np.array([0, 2, 3]))
    assert np.argmax(shared.restrict(scores, np.array([0, 3])), axis=1).tolist() == [3, 3]
    per_class = CandidateSpace("top20", 4, per_class={0: np.array([0, 2]), 3: np.array([1, 3])})
    assert np.argmax(per_class.restrict(scores, np.array([0, 3])), axis=1).tolist() == [0, 1]
    with pytest.raises(KeyError, match="no candidate list for class 2"):
        per_class.restrict(scores, np.array([0, 2]))


def test_top20_rule_by_hand() -> None:
    text = np.eye(4)  # label l's embedding is the unit vector e_l
    images = {0: np.array([[0.0, 0.8, 0.6, 0.0], [0.0, 0.6, 0.0, 0.8]]),  # mean cos: l1 .7, l2 .3, l3 .4, l0 0
              2: np.array([[0.0, 0.0, 1.0, 0.0]])}
    table = build_top20(images, text, k=2)
    assert table[0].tolist() == [1, 0]  # true label 0 not in the top 2 -> replaces the 2nd
    assert table[2].tolist() == [2, 0]


def test_bootstrap_is_deterministic_and_covers_the_estimate() -> None:
    rng = np.random.default_rng(1)
    classes = np.repeat(np.arange(5), 40)
    groups = np.tile(np.array(["easy", "hard"], dtype=object), 100)
    correct = rng.random(200) < np.where(groups == "easy", 0.9, 0.4)
    a = bootstrap_groups(correct, classes, groups, n_boot=500, seed=3)
    b = bootstrap_groups(correct, classes, groups, n_boot=500, seed=3)
    c = bootstrap_groups(correct, classes, groups, n_boot=500, seed=4)
    assert a == b and a != c
    drop = mean_drop(correct, classes, groups)
    assert a["drop"].low < drop < a["drop"].high and a["drop"].low > 0.2
    assert bootstrap_mean(np.array([1, 1, 1]), n_boot=10).to_list() == [1.0, 1.0]
    assert np.isnan(bootstrap_mean(np.array([])).low)


def test_effective_robustness_by_hand() -> None:
    easy = np.array([0.6, 0.7, 0.8])
    hard = sigmoid(logit(easy) - 1.0)  # exactly on a line of slope 1 in logit space
    fit = fit_effective_robustness(easy, hard)
    assert fit.slope == pytest.approx(1.0) and fit.intercept == pytest.approx(-1.0)
    assert np.allclose(effective_robustness(easy, hard), 0.0, atol=1e-9)
    better = hard.copy()
    better[1] += 0.05
    er = effective_robustness(easy, better)
    assert er[1] > 0 and er.argmax() == 1
    assert np.isnan(effective_robustness(np.array([0.5]), np.array([0.4]))).all()  # one model: undefined
    assert np.isnan(effective_robustness(np.array([0.5, 0.7]), np.array([0.4, 0.3]))).all()  # two: trivially 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.booleans(), st.sampled_from(["easy", "hard"])), min_size=1, max_size=60))
def test_properties(rows) -> None:
    classes = np.array([r[0] for r in rows])
    correct = np.array([r[1] for r in rows])
    groups = np.array([r[2] for r in rows], dtype=object)
    bal = balanced_accuracy(correct, classes)
    assert 0.0 <= bal <= 1.0
    assert 0.0 <= unbalanced_accuracy(correct) <= 1.0
    d = mean_drop(correct, classes, groups)
    assert np.isnan(d) or -1.0 <= d <= 1.0
    if len(np.unique(classes)) == 1:
        assert bal == pytest.approx(unbalanced_accuracy(correct))
    intervals = bootstrap_groups(correct, classes, groups, n_boot=30, seed=0)
    for interval in intervals.values():
        assert np.isnan(interval.low) or interval.low <= interval.high


def test_no_interval_rests_on_a_cell_of_one_photo() -> None:
    """Issue 45: with one photo per (class, group) the stratified bootstrap never moves, and the
    drop printed as ``19.23 [19.23, 19.23]``; the rule gives no interval (NaN) instead."""
    from curate.metrics.bootstrap import MIN_CELL, allowed_or_nan, bootstrap_paired_mean, interval_allowed

    assert MIN_CELL == 2
    assert interval_allowed([2, 5]) and not interval_allowed([1, 5]) and not interval_allowed([])
    assert allowed_or_nan((0.1, 0.3), [3, 3]) == (0.1, 0.3)
    assert all(np.isnan(allowed_or_nan((0.1, 0.3), [3, 1])))
    rng = np.random.default_rng(0)
    classes = np.repeat(np.arange(26), 2)
    groups = np.array(["easy", "hard"] * 26, dtype=object)
    correct = (rng.random(52) < 0.7).astype(float)
    one = bootstrap_groups(correct, classes, groups, n_boot=200, seed=0)
    for name in ("easy", "hard", "drop"):
        assert np.isnan(one[name].low) and np.isnan(one[name].high), name
    assert np.isnan(bootstrap_mean(np.array([1.0])).low)
    assert np.isnan(bootstrap_paired_mean(np.array([0.5])).low)
    # hand-computed: two photos per cell, one class: easy {1, 0}, hard {0, 0}. The easy cell's replicate
    # is Binomial(2, 0.5) / 2 in {0, 0.5, 1}; the hard cell never moves (all wrong), so the drop's
    # replicates are the easy ones: 2.5 and 97.5 percentiles of 0 / 0.5 / 1 drawn 1/4, 1/2, 1/4 -> [0, 1]
    two = bootstrap_groups(np.array([1.0, 0.0, 0.0, 0.0]), np.zeros(4, int),
                           np.array(["easy", "easy", "hard", "hard"], dtype=object), n_boot=2000, seed=0)
    assert two["drop"].to_list() == [0.0, 1.0] and two["hard"].to_list() == [0.0, 0.0]
    # one thin cell among thick ones: the intervals that resample it go, the others stay
    thin = bootstrap_groups(np.r_[correct, correct, 1.0, 1.0, 0.0], np.r_[classes, classes, 26, 26, 26],
                            np.r_[groups, groups, ["easy", "easy", "hard"]].astype(object), n_boot=50, seed=0)
    assert np.isnan(thin["hard"].low) and np.isnan(thin["drop"].low) and np.isfinite(thin["easy"].low)
