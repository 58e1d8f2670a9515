"""The discovery statistics on hand-made embeddings (curate.discover.groups): recovery, held-out
scores, the permutation null and the false-discovery rate, measured where the truth is known."""
from __future__ import annotations

import numpy as np
import pytest

from curate.discover.groups import GroupSettings, adjusted_rand_index, benjamini_hochberg, discover_class

FAST = GroupSettings(n_perm=400, n_boot=100)


def clustered(n: int = 120, k: int = 3, drop: tuple[float, ...] = (0.0, 0.0, 0.5), seed: int = 0, d: int = 32,
              sep: float = 3.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """k well-separated background clusters around a shared class direction; the reference's
    accuracy is 0.9 minus ``drop[cluster]`` (Bernoulli correctness)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    truth = rng.integers(0, k, n)
    x = rng.normal(size=d) * 3 + sep * centres[truth] + rng.normal(size=(n, d)) * 0.6
    y = (rng.random(n) < 0.9 - np.asarray(drop)[truth]).astype(float)
    return x, y, truth


def test_planted_groups_are_recovered_and_the_hard_one_is_significant():
    x, y, truth = clustered()
    found = discover_class(x, y, FAST, "goldfish")
    assert found.reason is None and found.k_halves == (3, 3)
    assert adjusted_rand_index(truth, found.assignment) > 0.95
    hard = max(found.groups, key=lambda g: g.gap)
    members = truth[hard.members]
    assert (members == 2).mean() > 0.95  # the cluster with the planted drop
    assert hard.gap > 30 and hard.gap_low > 0 and hard.p_value < 0.01
    assert hard.accuracy_low <= hard.accuracy <= hard.accuracy_high


def test_scores_are_the_held_out_means_by_hand():
    x, y, _ = clustered(seed=3)
    found = discover_class(x, y, FAST, "c")
    for group in found.groups:
        inside = np.zeros(len(y), bool)
        inside[group.members] = True
        assert group.accuracy == pytest.approx(y[inside].mean())
        assert group.gap == pytest.approx(100 * (y[~inside].mean() - y[inside].mean()))
        assert (found.assignment[inside] == group.index).all()


def test_a_group_too_small_to_bootstrap_gets_no_interval_and_the_others_do_not_move():
    """A group of fewer than min_boot photos gets NaN intervals (resampling a handful of photos, or one,
    gives an interval that cannot be read); its figures and p-value and the other groups' intervals stay."""
    x, y, _ = clustered(seed=3)
    full = discover_class(x, y, FAST, "c")
    assert FAST.min_boot == 10 and all(len(g.members) >= 10 for g in full.groups)
    assert all(np.isfinite([g.gap_low, g.gap_high, g.accuracy_low, g.accuracy_high]).all() for g in full.groups)
    smallest = min(len(g.members) for g in full.groups)
    cut = discover_class(x, y, GroupSettings(n_perm=400, n_boot=100, min_boot=smallest + 1), "c")
    for before, after in zip(full.groups, cut.groups):
        assert (after.members, after.accuracy, after.gap, after.p_value) == (before.members, before.accuracy,
                                                                             before.gap, before.p_value)
        bounds = [after.gap_low, after.gap_high, after.accuracy_low, after.accuracy_high]
        if len(after.members) == smallest:
            assert np.isnan(bounds).all()
        else:
            assert bounds == [before.gap_low, before.gap_high, before.accuracy_low, before.accuracy_high]


def test_same_seed_same_groups_and_another_seed_other_halves():
    x, y, _ = clustered(seed=5)
    a = discover_class(x, y, FAST, "c")
    b = discover_class(x, y, FAST, "c")
    assert (a.assignment == b.assignment).all()
    assert [g.p_value for g in a.groups] == [g.p_value for g in b.groups]


def test_null_world_p_values_are_uniform_and_fdr_proposes_nothing():
    """Clusters exist but correctness ignores them: about 5 % of p-values under 0.05, and BH at
    q < 0.1 over all groups of 25 classes proposes none (measured: 0)."""
    p_values = []
    for seed in range(25):
        x, y, _ = clustered(drop=(0.0, 0.0, 0.0), seed=seed)
        p_values += [g.p_value for g in discover_class(x, y, GroupSettings(n_perm=300, n_boot=50), f"c{seed}").groups]
    p = np.array(p_values)
    assert len(p) >= 60
    assert (p < 0.05).mean() < 0.12
    assert (benjamini_hochberg(p) < 0.1).sum() == 0


def test_error_aware_grouping_is_scored_held_out():
    """With the error coordinate, the fits read correctness; on a world with no background effect
    at all (one cluster) the held-out gaps stay near 0 where in-sample ones would not."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 16)) * 0.2 + 1.0
    y = (rng.random(200) < 0.6).astype(float)
    found = discover_class(x, y, GroupSettings(error_weight=5.0, n_perm=300, n_boot=50, min_silhouette=0.0), "c")
    for group in found.groups:
        assert abs(group.gap) < 25


def test_too_few_photos_and_no_structure_are_reasons():
    x, y, _ = clustered(n=15)
    assert discover_class(x, y, FAST, "c").reason == "too_few_photos"
    flat = np.ones((60, 8)) + np.random.default_rng(0).normal(size=(60, 8)) * 1e-3
    found = discover_class(flat, np.ones(60), GroupSettings(min_silhouette=0.9), "c")
    assert found.reason == "no_structure" and not found.groups


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="correctness"):
        discover_class(np.zeros((10, 3)), np.zeros(9), FAST, "c")
    with pytest.raises(ValueError, match="finite"):
        discover_class(np.full((30, 3), np.nan), np.zeros(30), FAST, "c")
    with pytest.raises(ValueError, match="fdr"):
        GroupSettings(fdr=1.5)


def test_benjamini_hochberg_by_hand():
    q = benjamini_hochberg([0.01, 0.04, 0.03, 0.5])
    # sorted 0.01, 0.03, 0.04, 0.5 -> 0.04, 0.06, 0.0533, 0.5 -> running min from the end
    assert q == pytest.approx([0.04, 0.05333333, 0.05333333, 0.5])
    assert len(benjamini_hochberg([])) == 0


# --- the pieces around the statistics: background embeddings, names, the record -------------

def test_projection_removes_the_class_direction_by_hand():
    from curate.discover.embed import project_out

    e = np.array([[3.0, 4.0, 0.0], [0.0, 1.0, 1.0]])
    out = project_out(e, np.array([2.0, 0.0, 0.0]))
    assert out[0] == pytest.approx([0.0, 1.0, 0.0])
    assert out[1] == pytest.approx([0.0, 2 ** -0.5, 2 ** -0.5])


def test_auto_uses_removal_only_when_most_photos_have_a_trusted_mask():
    from curate.discover.embed import choose_method

    masked = {"mask_path": "m.png", "mask_status": "synthetic"}
    proposal = {"mask_path": "m.png", "mask_status": "model:clipseg"}
    plain = {"mask_path": None, "mask_status": None}
    assert choose_method([masked] * 9 + [plain], "auto") == "removal"
    assert choose_method([masked] * 8 + [plain] * 2, "auto") == "projection"
    assert choose_method([proposal] * 10, "auto") == "projection"
    assert choose_method([proposal] * 10, "auto", allow_model_masks=True) == "removal"
    assert choose_method([plain], "whole") == "whole"
    with pytest.raises(ValueError, match="background embedding"):
        choose_method([plain], "mystery")


def test_background_names_drop_the_article():
    from curate.discover.decide import background_name

    assert background_name("A Bird  Feeder") == "bird feeder"
    assert background_name("the sky") == "sky"
    assert background_name("snow") == "snow"
    with pytest.raises(ValueError):
        background_name("  ")


def test_the_record_round_trips_and_keeps_decisions(tmp_path):
    from curate.runs.base import load_run
    from curate.runs.discovery import DiscoveredGroup, DiscoveryRun

    group = DiscoveredGroup(group_id="lion-g1", class_index=291, class_name="lion", method="removal", size=2,
                            accuracy=0.5, accuracy_low=0.0, accuracy_high=1.0, rest_accuracy=0.9, gap=40.0,
                            gap_low=10.0, gap_high=70.0, p_value=0.01, q_value=0.02, significant=True, overlap=0.8,
                            names=[("a road", 0.3)], exemplars=["b", "a"], labelled_as=None, labelled_share=0.0)
    record = DiscoveryRun(config={"settings": {"fdr": 0.1}, "counts": {"groups": 1}, "classes": []}, groups=[group],
                          member_rows=[{"sample_id": "a", "class_index": 291, "group_id": "lion-g1", "similarity": 0.5},
                                       {"sample_id": "b", "class_index": 291, "group_id": "lion-g1", "similarity": 0.9},
                                       {"sample_id": "c", "class_index": 291, "group_id": None, "similarity": None}])
    record.write(tmp_path / "runs" / "disc")
    loaded = load_run(tmp_path / "runs" / "disc")
    assert isinstance(loaded, DiscoveryRun) and loaded.groups == [group] and loaded.proposed == [group]
    assert loaded.member_ids("lion-g1") == ["b", "a"]  # most typical first
    assert group.is_new and group.top_name == "a road"
    loaded.record_decisions({"lion-g1": {"decision": "rejected", "actor": "me"}})
    assert DiscoveryRun.of_folder(tmp_path).decisions()["lion-g1"]["decision"] == "rejected"
    with pytest.raises(KeyError, match="no group"):
        loaded.record_decisions({"tiger-g9": {"decision": "accepted"}})
    with pytest.raises(ValueError, match="decision"):
        loaded.record_decisions({"lion-g1": {"decision": "maybe"}})
