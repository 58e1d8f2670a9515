"""The overlap plan (curate.review.overlap): balanced, seeded, gold mixed in; pure, no server."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curate.review.overlap import OverlapError, OverlapPlan, assign_overlap, parse_annotators


@settings(max_examples=60, deadline=None)
@given(n_photos=st.integers(0, 40), n_annotators=st.integers(1, 7), data=st.data())
def test_every_photo_gets_k_distinct_annotators_and_loads_differ_by_at_most_one(n_photos, n_annotators, data) -> None:
    k = data.draw(st.integers(1, n_annotators))
    seed = data.draw(st.integers(0, 2**31))
    names = [f"a{i}@x" for i in range(n_annotators)]
    photos = [f"s{i:03d}" for i in range(n_photos)]
    plan = assign_overlap(photos, names, k, seed=seed)
    assignees = plan.assignees()
    assert set(assignees) == set(photos)
    assert all(len(set(who)) == len(who) == k for who in assignees.values())
    loads = [plan.load(a) for a in names]
    assert max(loads) - min(loads) <= 1 and sum(loads) == n_photos * k
    assert all(not g for g in plan.gold.values())
    assert assign_overlap(photos, names, k, seed=seed) == plan  # seeded: the same plan again
    assert OverlapPlan.from_json(plan.to_json()) == plan


def test_pairs_are_spread_so_every_pair_shares_photos() -> None:
    names = ["a", "b", "c", "d"]
    plan = assign_overlap([f"s{i}" for i in range(12)], names, 2, seed=3)
    together = {pair: 0 for pair in itertools.combinations(names, 2)}
    for who in plan.assignees().values():
        together[tuple(sorted(who))] += 1
    # 12 photos x 1 pair each over 6 pairs: every pair twice (a cyclic rule would give only 2 pairs)
    assert sorted(together.values()) == [2] * 6


def test_another_seed_gives_another_plan() -> None:
    photos = [f"s{i}" for i in range(20)]
    assert assign_overlap(photos, "a,b,c".split(","), 2, seed=0) != assign_overlap(photos, ["a", "b", "c"], 2, seed=1)


@settings(max_examples=40, deadline=None)
@given(n_photos=st.integers(1, 30), n_gold=st.integers(1, 8), share=st.sampled_from([0.1, 0.2, 0.5]), seed=st.integers(0, 99))
def test_gold_photos_are_mixed_into_every_queue_in_proportion(n_photos, n_gold, share, seed) -> None:
    names = ["a", "b", "c"]
    photos = [f"s{i}" for i in range(n_photos)]
    gold = [f"g{i}" for i in range(n_gold)]
    plan = assign_overlap(photos + gold[:1], names, 2, seed=seed, gold=gold, gold_share=share)
    assert "g0" not in plan.assignees()  # a gold photo in scope is gold, not labelled again as regular
    for name in names:
        queue, golds = plan.queues[name], plan.gold[name]
        load = plan.load(name)
        assert len(golds) == len(set(golds)) == min(n_gold, max(1, round(share * load / (1 - share))))
        assert set(golds) <= set(gold) and set(golds) <= set(queue)
        assert len(queue) == load + len(golds)


def test_gold_is_not_appended_at_the_end_of_the_queue() -> None:
    plan = assign_overlap([f"s{i:02d}" for i in range(40)], ["a", "b"], 2, seed=0,
                          gold=[f"g{i}" for i in range(10)], gold_share=0.2)
    positions = [plan.queues["a"].index(g) for g in plan.gold["a"]]
    assert len(positions) == 10 and min(positions) < len(plan.queues["a"]) - 10


@pytest.mark.parametrize(("call", "message"), [
    (lambda: assign_overlap(["s"], ["a", "b"], 3), "--overlap 3 needs 1 <= overlap <= the number of annotators (2)"),
    (lambda: assign_overlap(["s"], ["a", "b"], 0), "--overlap 0 needs"),
    (lambda: assign_overlap(["s"], ["a", "b"], 1, gold_share=0.1), "needs gold photos"),
    (lambda: assign_overlap(["s"], ["a", "b"], 1, gold=["g"], gold_share=1.0), "must be in [0, 1)"),
    (lambda: parse_annotators("a,,b"), "comma-separated"),
    (lambda: parse_annotators("a,b,a"), "named twice in --annotators: a"),
])
def test_bad_overlap_requests_are_clear_errors(call, message) -> None:
    with pytest.raises(OverlapError, match=None) as info:
        call()
    assert message in str(info.value)
