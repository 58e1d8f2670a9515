"""The simulated annotators' draws (curate.collect.annotator_sim): the matrices, the team text, the
labels drawn from them and the masks' known errors (issue 44)."""
from __future__ import annotations

import numpy as np
import pytest

from curate.agreement.metrics import mask_iou
from curate.collect.annotator_sim import (
    DEFAULT_TEAM,
    MaskNoise,
    SimulatedAnnotator,
    confusion_matrix,
    draw_label,
    noisy_mask,
    parse_team,
    sample_rng,
)

BACKGROUNDS = ("snow", "water", "grass", "tree")


def test_matrices_are_row_stochastic_with_the_stated_entries():
    careful, confuse, random_ = parse_team(DEFAULT_TEAM)
    for member in (careful, confuse, random_):
        assert np.allclose(confusion_matrix(member, BACKGROUNDS).sum(axis=1), 1.0)
    assert np.allclose(np.diag(confusion_matrix(careful, BACKGROUNDS)), 0.95)
    assert confusion_matrix(careful, BACKGROUNDS)[0, 1] == pytest.approx(0.05 / 3)
    c = confusion_matrix(confuse, BACKGROUNDS)
    assert c[2, 3] == c[3, 2] == pytest.approx(0.3) and c[0, 0] == c[1, 1] == 1.0 and c[0, 1] == 0.0
    r = confusion_matrix(random_, BACKGROUNDS)
    assert r[0, 0] == pytest.approx(0.9 + 0.1 / 4) and r[0, 1] == pytest.approx(0.1 / 4)


def test_team_text_names_kinds_and_refuses_bad_items():
    team = parse_team("careful, random:0.2, random:0.1")
    assert [m.name for m in team] == ["careful", "random", "random-2"]
    assert team[0].rate == 0.0 and team[2].text == "random:0.1"
    for bad, words in [("sloppy:0.1", "kind must be one of"), ("confuse:grass:0.3", "confuse:<background>"),
                       ("random:x", "random:x"), ("careful:1.5", "rate must be in"), ("", "no annotator"),
                       ("confuse:tree-tree:0.3", "two different")]:
        with pytest.raises(ValueError, match=words):
            parse_team(bad)
    with pytest.raises(ValueError, match="not in the backgrounds"):
        confusion_matrix(parse_team("confuse:shrub-tree:0.3")[0], BACKGROUNDS)


def test_drawn_labels_follow_the_matrix_and_are_reproducible():
    """2,000 draws per row: every frequency within 4.5 binomial standard errors of the matrix
    (a draw from the wrong row, e.g. the answer's, would miss the 0.3 confusion by 0.3)."""
    member = parse_team("confuse:grass-tree:0.3")[0]
    matrix = confusion_matrix(member, BACKGROUNDS)
    n = 2000
    for truth in range(len(BACKGROUNDS)):
        counts = np.bincount([draw_label(matrix, truth, sample_rng(3, 1, f"s{i}")) for i in range(n)], minlength=4)
        se = np.sqrt(matrix[truth] * (1 - matrix[truth]) / n) + 1e-12
        assert np.all(np.abs(counts / n - matrix[truth]) <= 4.5 * se + 1e-9)
    first = [draw_label(matrix, 2, sample_rng(3, 1, f"s{i}")) for i in range(50)]
    assert first == [draw_label(matrix, 2, sample_rng(3, 1, f"s{i}")) for i in range(50)]
    assert first != [draw_label(matrix, 2, sample_rng(4, 1, f"s{i}")) for i in range(50)]


def _disc(size: int = 32, radius: float = 8.0) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size]
    return ((yy - 16) ** 2 + (xx - 16) ** 2 <= radius ** 2).astype(np.uint8)


def test_mask_errors_are_the_stated_ones():
    truth = _disc()
    rng = np.random.default_rng(0)
    grown = noisy_mask(truth, MaskNoise(grow=1), rng)
    shrunk = noisy_mask(truth, MaskNoise(grow=-1), rng)
    assert np.all(grown >= truth) and np.all(shrunk <= truth)
    assert not grown[0].any() and not grown[:, -1].any()  # one step from the object, not the image border
    assert grown.sum() > truth.sum() > shrunk.sum()
    shifted = noisy_mask(truth, MaskNoise(shift=(0, 2)), rng)
    assert shifted.sum() == truth.sum() and np.array_equal(shifted[:, 2:], truth[:, :-2])
    missed = [noisy_mask(truth, MaskNoise(miss=1.0), np.random.default_rng(i)) for i in range(4)]
    for m in missed:  # one quarter gone: about 3/4 of the disc left, nothing added
        assert np.all(m <= truth) and 0.70 < m.sum() / truth.sum() < 0.80
    assert mask_iou(truth, truth) == 1.0 and mask_iou(truth, np.zeros_like(truth)) == 0.0
    assert mask_iou(truth, grown) == pytest.approx(truth.sum() / grown.sum())
    with pytest.raises(ValueError, match="miss share"):
        MaskNoise(miss=2.0)


def test_annotator_checks_its_fields():
    with pytest.raises(ValueError, match="confused pair"):
        SimulatedAnnotator("a", "careful", 0.1, ("grass", "tree"))
    with pytest.raises(ValueError, match="kind must be"):
        SimulatedAnnotator("a", "lazy", 0.1)


@pytest.fixture(scope="module")
def small_world(tmp_path_factory):
    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic

    root = tmp_path_factory.mktemp("sim") / "world"
    collect_synthetic(root, WorldSpec(classes=DEFAULT_CLASSES[:8], per_class=4, image_size=24, seed=5))
    return root


def test_the_team_is_written_to_the_annotation_table_reproducibly(small_world):
    from curate.collect.annotator_sim import SOURCE, simulate_annotators, world_truth
    from curate.store import Dataset
    from curate.store.annotations import current_annotations, gold_answers

    ds = Dataset.open(small_world)
    team = simulate_annotators(ds, seed=1, gold=0.25)
    rows = current_annotations(ds)
    answers = [r for r in rows if r.role == "annotator"]
    assert len(answers) == 3 * 32 and {r.backend for r in answers} == {"simulated"}
    assert {r.source for r in answers} == {SOURCE} and all(r.mask for r in answers)
    assert {r.annotator: 0 for r in answers}.keys() == {"careful", "confuse", "random"}
    truth = world_truth(ds)
    assert team.truth == {s: t.background for s, t in truth.items()}
    assert gold_answers(rows) == {s: (truth[s].background,) for s in team.gold} and len(team.gold) == 8
    assert sum(r.is_gold for r in answers) == 3 * 8
    stored = {(r.annotator, r.sample_id): r.backgrounds[0] for r in answers}
    assert stored == {(a, s): b for a, labels in team.labels.items() for s, b in labels.items()}
    again = simulate_annotators(ds, seed=1, gold=0.25)
    assert again.outcome.counts == {"added": 0, "changed": 0, "deleted": 0, "unchanged": 96}
    assert again.labels == team.labels and again.mask_iou == team.mask_iou
    # the confuser errs only between grass and tree, the careful one's masks contain the truth
    for s, b in team.labels["confuse"].items():
        assert b == team.truth[s] or {b, team.truth[s]} == {"grass", "tree"}
    assert all(v < 1.0 for v in team.mask_iou["careful"].values())


def test_overlap_gives_each_photo_k_annotators_evenly_and_bad_teams_write_nothing(small_world, tmp_path):
    import shutil

    from curate.collect.annotator_sim import simulate_annotators
    from curate.store import Dataset
    from curate.store.annotations import load_annotations

    root = tmp_path / "copy"
    shutil.copytree(small_world, root)
    ds = Dataset.open(root)
    before = load_annotations(ds)
    with pytest.raises(ValueError, match="not in the backgrounds"):
        simulate_annotators(ds, "careful,confuse:shrub-tree:0.3")
    with pytest.raises(ValueError, match="overlap must be 1 to 3"):
        simulate_annotators(ds, overlap=4)
    assert load_annotations(ds) == before
    team = simulate_annotators(ds, "careful,random:0.1,random:0.2", overlap=2)
    counts = sorted(len(v) for v in team.labels.values())
    assert sum(counts) == 64 and counts[-1] - counts[0] <= 1
    assert all(len({a for a, v in team.labels.items() if s in v}) == 2 for s in team.truth)
    with pytest.raises(ValueError, match="not made by `curate collect synthetic`"):
        simulate_annotators(Dataset.create(tmp_path / "empty", name="e", backgrounds=["grass", "tree"]))


def test_the_cli_draws_a_team_and_prints_its_accuracies(tmp_path):
    from click.testing import CliRunner

    from curate.cli import main
    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic

    root = tmp_path / "cli"
    collect_synthetic(root, WorldSpec(classes=DEFAULT_CLASSES[:8], per_class=2, image_size=16, seed=5))
    result = CliRunner().invoke(main, ["simulate-annotators", str(root), "--team", "careful,random:0.5", "--seed", "2"],
                                terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "careful:0" in result.output and "random:0.5" in result.output and "32 added" in result.output
    bad = CliRunner().invoke(main, ["simulate-annotators", str(root), "--team", "lazy:0.1"])
    assert bad.exit_code == 1 and "kind must be one of" in bad.output


def test_the_demo_team_table_measures_three_annotators_against_the_truth(tmp_path):
    """The demo's step (curate.collect.simulated_team): 120 photos, three annotators and the aggregated
    row, alpha per class and overall, kappa per pair; the careful annotator is the most accurate."""
    from curate.collect.simulated_team import team_agreement

    measured = team_agreement(tmp_path / "team", replicates=50)
    assert measured.photos == 120
    rows = [line.split(" | ") for line in measured.annotators.splitlines()[2:]]
    assert [r[0].strip("| ") for r in rows] == ["careful", "confuse", "random", "Dawid-Skene (agreed)"]
    accuracy = {r[0].strip("| "): float(r[2]) for r in rows}
    assert accuracy["careful"] > max(accuracy["confuse"], accuracy["random"])
    assert accuracy["Dawid-Skene (agreed)"] > accuracy["careful"]
    assert "| (all) |" in measured.alpha and measured.kappa.count("-") == 3
    assert measured.lines()[0].startswith("| annotator |")
