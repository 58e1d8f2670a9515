"""The spurious-discovery rule on hand-made prediction tables (papers/003 §2.1)."""
from __future__ import annotations

import numpy as np
import pytest
from split_helpers import by_class, table

from curate.split.discovery import (
    SplitRule,
    discover,
    group_assignments,
    noise_summary,
    permutation_p_value,
)

RULE = SplitRule(min_per_background=2, min_drop=5.0, n_boot=200, n_perm=500)


def test_easy_is_the_best_hard_the_worst_and_the_drop_decides() -> None:
    c, b, y = table((1, "snow", [1, 1, 1, 1]), (1, "grass", [0, 0, 1, 0]), (1, "water", [1, 0, 1, 1]))
    s = by_class(discover(c, b, y, RULE))[1]
    assert (s.easy, s.hard, s.kept) == ("snow", "grass", True)
    assert s.easy_acc == 1.0 and s.hard_acc == 0.25 and s.drop == pytest.approx(0.75)
    assert (s.n_easy, s.n_hard) == (4, 4)


def test_ties_prefer_more_samples_then_alphabetical() -> None:
    c, b, y = table((1, "sand", [1, 1]), (1, "rock", [1, 1, 1]), (1, "grass", [0, 0]), (1, "earth", [0, 0]))
    s = by_class(discover(c, b, y, RULE))[1]
    assert s.easy == "rock"  # 1.0 tie with sand: more samples wins
    assert s.hard == "earth"  # 0.0 tie with grass, equal n: alphabetical


def test_a_class_with_one_background_or_all_below_minimum_is_dropped_with_the_reason() -> None:
    c, b, y = table((1, "snow", [1, 1, 1]), (2, "snow", [1, 1]), (2, "grass", [0]))
    splits = by_class(discover(c, b, y, RULE))
    assert not splits[1].kept and "1 background(s) with >= 2 samples" in splits[1].reason
    assert not splits[2].kept and "grass 1" in splits[2].reason  # grass below the minimum


def test_a_background_below_the_minimum_is_ignored_not_chosen() -> None:
    c, b, y = table((1, "snow", [1, 1, 1]), (1, "grass", [0, 1, 1]), (1, "sky", [0]))
    s = by_class(discover(c, b, y, RULE))[1]
    assert s.hard == "grass"  # sky has accuracy 0 but only one sample
    assert [cell.eligible for cell in s.cells if cell.background == "sky"] == [False]


def test_equal_backgrounds_give_no_drop_and_an_all_wrong_class_is_dropped() -> None:
    c, b, y = table((1, "snow", [1, 0]), (1, "grass", [0, 1]), (2, "snow", [0, 0]), (2, "grass", [0, 0]))
    splits = by_class(discover(c, b, y, RULE))
    assert splits[1].drop == 0.0 and not splits[1].kept and "<= min_drop" in splits[1].reason
    assert splits[2].easy != splits[2].hard and not splits[2].kept  # all wrong: drop 0


def test_negative_drop_is_impossible_without_a_pin_and_reported_with_one() -> None:
    c, b, y = table((1, "snow", [0, 0, 0]), (1, "grass", [1, 1, 1]))
    free = by_class(discover(c, b, y, RULE))[1]
    assert free.easy == "grass" and free.drop > 0
    pinned = by_class(discover(c, b, y, RULE, pins={1: ("snow", "grass")}))[1]
    assert pinned.kept and pinned.pinned and pinned.drop == -1.0  # a person's choice is kept and shown


def test_min_drop_is_exclusive_and_in_points() -> None:
    outcomes_easy = [1] * 20
    outcomes_hard = [1] * 19 + [0]  # exactly 5 points lower
    c, b, y = table((1, "snow", outcomes_easy), (1, "grass", outcomes_hard))
    assert not by_class(discover(c, b, y, RULE))[1].kept
    assert by_class(discover(c, b, y, SplitRule(min_per_background=2, min_drop=4.9, n_boot=50, n_perm=50)))[1].kept


def test_several_models_are_averaged() -> None:
    c, b, y = table((1, "snow", [1, 1]), (1, "grass", [1, 1]))
    second = np.array([1, 1, 0, 0], float)  # the second model fails on grass
    s = by_class(discover(c, b, np.stack([y, second]), RULE))[1]
    assert s.easy == "snow" and s.hard_acc == 0.5 and s.drop == 0.5


def test_require_significant_needs_enough_evidence() -> None:
    rng = np.random.default_rng(0)
    strong = table((1, "snow", [1] * 30), (1, "grass", [0] * 30))
    weak = table((1, "snow", [1, 1, 1]), (1, "grass", [1, 1, 0]), (1, "sky", [1, 0, 1]))
    rule = SplitRule(min_per_background=2, require_significant=True, n_boot=300, n_perm=500)
    assert by_class(discover(*strong, rule))[1].kept
    weak_split = by_class(discover(*weak, rule))[1]
    assert not weak_split.kept and weak_split.drop > 0.05
    # under the null the permutation p-value is roughly uniform: small p rarely
    ps = [permutation_p_value((rng.random(120) < 0.8).astype(float), rng.integers(0, 6, 120), rng, 200) for _ in range(60)]
    assert np.mean(np.array(ps) < 0.05) < 0.2


def test_group_assignments() -> None:
    c, b, y = table((1, "snow", [1, 1]), (1, "grass", [0, 0]), (1, "sky", [1, 0]), (2, "snow", [1]))
    splits = discover(c, b, y, RULE)
    ids = [f"s{i}" for i in range(len(c))]
    groups = group_assignments(ids, c, b, splits)
    assert [groups[i] for i in ids] == ["easy", "easy", "hard", "hard", None, None, None]


def test_deterministic_for_a_seed() -> None:
    c, b, y = table((1, "snow", [1, 1, 0, 1]), (1, "grass", [0, 1, 0, 0]))
    a = discover(c, b, y, RULE)[0]
    again = discover(c, b, y, RULE)[0]
    assert (a.drop_ci, a.p_value, a.crossfit_drop) == (again.drop_ci, again.p_value, again.crossfit_drop)


def test_cross_fitted_drop_by_hand() -> None:
    # snow always right, grass always wrong: whichever half chooses, the other half measures 1 - 0
    c, b, y = table((1, "snow", [1, 1, 1, 1]), (1, "grass", [0, 0, 0, 0]))
    s = by_class(discover(c, b, y, RULE))[1]
    assert s.drop == 1.0 and s.crossfit_drop == 1.0 and s.crossfit_note == ""
    # a noisy third background: a half where sky looks perfect picks it as easy, and the other half
    # (0 of 2 right) undoes it: the cross-fitted drop falls below the in-sample drop
    c, b, y = table((1, "snow", [1, 1, 1, 1]), (1, "grass", [0, 0, 0, 0]), (1, "sky", [1, 1, 0, 0]))
    noisy = by_class(discover(c, b, y, RULE))[1]
    assert noisy.drop == 1.0 and 0 < noisy.crossfit_drop < 1.0
    # a pinned pair is not chosen from the data: nothing to correct
    pinned = by_class(discover(c, b, y, RULE, pins={1: ("sky", "grass")}))[1]
    assert pinned.crossfit_drop == pinned.drop == 0.5 and pinned.crossfit_note.startswith("pinned")


def test_noise_summary_counts_kept_classes_only() -> None:
    strong = [(k, "snow", [1] * 20) for k in (1, 2)] + [(k, "grass", [0] * 20) for k in (1, 2)]
    weak = [(3, "snow", [1, 1, 1]), (3, "grass", [1, 1, 0])]
    flat = [(4, "snow", [1, 0]), (4, "grass", [1, 0])]  # dropped: not counted
    splits = discover(*table(*strong, *weak, *flat), RULE)
    summary = noise_summary(splits, 0.05)
    assert (summary.k, summary.n, summary.untested) == (1, 3, 0)
    assert summary.text == "1 of 3 kept classes are not distinguishable from noise (permutation p >= 0.05)"
    assert noise_summary([], 0.05).text == "no class kept"


def test_rule_settings_are_checked() -> None:
    for bad in ({"min_per_background": 0}, {"crossfit_folds": 1}, {"alpha": 1.0}, {"seed": -1},
                {"crossfit_repeats": 0}):
        with pytest.raises(ValueError):
            SplitRule(**bad)
    assert SplitRule(crossfit_folds=0).crossfit_scheme.startswith("no cross-fitted drop")
