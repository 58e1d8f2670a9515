"""The seams of discovered groups as a user meets them at the command line (issue 39): changing a
decision, group names without confidence, reasons that say what to do, intervals of groups too
small to bootstrap, chance of the label space used, an unknown group, and --model help per verb.

Most tests read a hand-made run of a tiny world (tests/discover_helpers.py, no model); one runs
``curate discover`` with a random tiny CLIP (its groups do not matter there, only the reasons).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from discover_helpers import ACC, QUIET, RUN, discovery_world, hand_made_group, write_run

from curate.cli import main
from curate.discover.phrases import MIN_NAME_SCORE, group_name, name_groups
from curate.runs.discovery import DiscoveryRun
from curate.store import Dataset, DatasetError, check_dataset

WIDE = {"COLUMNS": "400"}  # tables are not wrapped inside cells


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("discover-cli") / "world"
    discovery_world(root)
    return root


@pytest.fixture()
def world(template, tmp_path, monkeypatch) -> Path:
    """A fresh copy of the hand-made world, as ``world/`` in the working directory."""
    shutil.copytree(template, tmp_path / "world")
    monkeypatch.chdir(tmp_path)
    return Path("world")


def cli(*args: str):
    return CliRunner(env=WIDE).invoke(main, list(args))


def _labels(root: Path, ids: list[str]) -> dict[str, tuple]:
    ds = Dataset.open(root)
    return {sid: (ds.row(sid)["background"], ds.row(sid)["background_source"]) for sid in ids}


def test_reject_after_accept_is_refused_then_undoes_the_acceptance_with_force(world):
    run = DiscoveryRun.of_folder(world)
    members = run.member_ids(ACC)
    before = _labels(world, members)
    accepted = cli("accept-group", "world", ACC, "--name", "a bird feeder", "--actor", "ann")
    assert accepted.exit_code == 0, accepted.output
    assert "bird feeder" in Dataset.open(world).backgrounds
    refused = cli("reject-group", "world", ACC, "--actor", "bob")
    assert refused.exit_code == 1
    assert "accepted as 'bird feeder' by ann" in refused.output and "--force" in refused.output
    assert run.decisions()[ACC]["decision"] == "accepted"  # nothing changed
    with pytest.raises(DatasetError, match="still label"):  # the vocabulary keeps a name photos carry
        Dataset.open(world).remove_backgrounds(["bird feeder"])
    renamed = cli("accept-group", "world", ACC, "--name", "a feeder", "--actor", "bob")
    assert renamed.exit_code == 1 and "--force" in renamed.output
    assert "already accepted as 'bird feeder'" in cli("accept-group", "world", ACC, "--name", "bird feeder",
                                                      "--actor", "bob").output
    assert set(_labels(world, members).values()) == {("bird feeder", "human")}
    renamed = cli("accept-group", "world", ACC, "--name", "a feeder", "--actor", "bob", "--force")
    assert renamed.exit_code == 0 and "replaces its acceptance as 'bird feeder' by ann" in renamed.output
    assert set(_labels(world, members).values()) == {("feeder", "human")}
    assert "bird feeder" not in Dataset.open(world).backgrounds  # the acceptance added it, nobody carries it
    undone = cli("reject-group", "world", ACC, "--actor", "cy", "--force")
    assert undone.exit_code == 0, undone.output
    assert "replaces its acceptance as 'feeder' by bob" in undone.output
    assert f"{len(members)} photos given back their earlier label" in undone.output
    assert _labels(world, members) == before  # the model's labels again
    assert "feeder" not in Dataset.open(world).backgrounds
    assert run.decisions()[ACC]["decision"] == "rejected"
    assert check_dataset(world) == []
    log = [c for c in Dataset.open(world).changes() if c.get("actor") == "cy"]
    assert log and all("undone" in c["reason"] for c in log)


def test_group_names_show_score_and_margin_and_an_unnamed_group_needs_a_name(world):
    ds = Dataset.open(world)
    base = DiscoveryRun.of_folder(world)
    bear, swan = base.group(ACC).class_index, base.group("black-swan-g1").class_index
    stripes = hand_made_group(ACC, bear, "polar bear", 6, [("a petri dish", 0.012), ("a lab bench", 0.010)])
    road = hand_made_group("black-swan-g1", swan, "black swan", 5, [("a road", 0.081), ("a field road", 0.061)])
    members = [dict(r, group_id={ACC: stripes.group_id, QUIET: None}.get(r["group_id"], road.group_id))
               for r in base.members() if r["group_id"]]
    write_run(ds, "discover-names", [stripes, road], members)
    shown = cli("groups", "world", "--run", "discover-names")
    assert shown.exit_code == 0, shown.output
    assert "unnamed: closest 'a petri dish', 0.012" in shown.output
    assert "a road (0.081, +0.020)" in shown.output
    assert f"under {MIN_NAME_SCORE:g} it is only the closest phrase" in shown.output
    refused = cli("accept-group", "world", stripes.group_id, "--run", "discover-names", "--actor", "ann")
    assert refused.exit_code == 1 and "unnamed" in refused.output and "--name" in refused.output
    assert "petri dish" not in Dataset.open(world).backgrounds
    named = cli("accept-group", "world", stripes.group_id, "--run", "discover-names", "--actor", "ann", "--name",
                "stripes")
    assert named.exit_code == 0 and "accepted as 'stripes'" in named.output
    assert cli("accept-group", "world", road.group_id, "--run", "discover-names", "--actor", "ann").exit_code == 0
    assert {"stripes", "road"} <= set(Dataset.open(world).backgrounds)
    # the threshold is the run's setting; a review pull is refused the same way
    from curate.discover.review import GroupVerdict, apply_verdicts

    low = write_run(ds, "discover-low", [stripes], members[:6], {"settings": {"fdr": 0.1, "min_name_score": 0.01}})
    assert "a petri dish (0.012, +0.002)" in cli("groups", "world", "--run", "discover-low").output
    strict = write_run(ds, "discover-strict", [stripes], members[:6])
    pulled = apply_verdicts(Dataset.open(world), strict, [GroupVerdict(stripes.group_id, "accepted", "r")], via="test")
    assert list(pulled) == [] and "unnamed" in pulled.problems[0]
    assert low.settings["min_name_score"] == 0.01


def test_the_name_score_margin_and_threshold_by_hand():
    """s_p = t_p . (c_g - r) with all three normalised: a difference of two cosines."""
    centroid, reference = np.array([[3.0, 4.0, 0.0]]), np.array([1.0, 0.0, 0.0])
    phrases = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    names = name_groups(centroid, reference, phrases, ["up", "side", "class"], top=3)[0]
    assert names == [("up", pytest.approx(0.8)), ("side", pytest.approx(0.0)), ("class", pytest.approx(-0.4))]
    top = group_name(names)
    assert top.named and top.margin == pytest.approx(0.8) and top.text() == "up (0.800, +0.800)"
    weak = group_name([("a petri dish", 0.012), ("a lab bench", 0.010)])
    assert not weak.named and weak.text() == "unnamed: closest 'a petri dish', 0.012"
    assert group_name([("x", MIN_NAME_SCORE)]).named and group_name([]) is None


def test_a_group_too_small_to_bootstrap_prints_no_interval(world):
    ds = Dataset.open(world)
    base = DiscoveryRun.of_folder(world)
    one = hand_made_group("polar-bear-g3", base.group(ACC).class_index, "polar bear", 1, [("a road", 0.1)], significant=False, accuracy=1.0,
                          accuracy_low=1.0, accuracy_high=1.0, gap=-40.0, gap_low=-60.0, gap_high=-20.0,
                          p_value=1.0, q_value=1.0)
    big = hand_made_group("black-swan-g1", base.group("black-swan-g1").class_index, "black swan", 12, [("a lake", 0.1)], accuracy_low=0.15,
                          accuracy_high=0.55, gap_low=21.0, gap_high=79.0)
    member = next(r for r in base.members() if r["group_id"] == ACC)
    write_run(ds, "discover-small", [one, big], [dict(member, group_id=one.group_id)])
    shown = cli("groups", "world", "--run", "discover-small", "--all")
    assert shown.exit_code == 0, shown.output
    assert "[-60, -20]" not in shown.output and "[100, 100]" not in shown.output
    assert "100.0" in shown.output and "-40.0" in shown.output  # the figures themselves stay
    assert "[+21, +79]" in shown.output and "[15, 55]" in shown.output  # a group large enough keeps them
    assert "No interval for a group of fewer than 10 photos" in shown.output


def test_the_groups_note_gives_chance_of_the_label_space_used(world):
    ds = Dataset.open(world)
    base = DiscoveryRun.of_folder(world)
    write_run(ds, "discover-own", base.groups, base.members(),
              {"references": [{"run": "discover-ref-x", "label_space": "dataset", "chance": 0.25}]})
    shown = cli("groups", "world", "--run", "discover-own")
    assert shown.exit_code == 0, shown.output
    assert "reference's labels: 25% (dataset, 4 labels)" in shown.output
    assert "1-vs-1000" not in shown.output and "0.1%" not in shown.output


def test_an_unknown_group_is_one_sentence_that_names_the_command_listing_them(world):
    result = cli("accept-group", "world", "vulture-g9", "--actor", "ann")
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert "run discover-test has no group 'vulture-g9';" in line, line
    assert '"' not in line and "polar-bear-g2" not in line  # no raw KeyError quoting, no list of every id
    assert f"`curate groups world --run {RUN} --all`" in line
    near = cli("reject-group", "world", "polar-bear-g9", "--actor", "ann")
    assert "did you mean polar-bear-g" in near.output


def test_removal_without_trusted_masks_names_the_reason_and_the_ways_forward(world):
    """Every mask a model proposal: removal cannot run, and the classes say so (not "too few photos")."""
    ds = Dataset.open(world)
    ds.update(ds.sample_ids(), {"mask_status": "model:tiny@abc"}, actor="propose-masks:test")
    result = cli("discover", "world", "--model", "curate-tiny-vit", "--pretrained", "none", "--device", "cpu",
                 "--background-embedding", "removal", "--min-half", "2", "--permutations", "20", "--run-name", "rm")
    assert result.exit_code == 0, result.output
    assert "classes without groups: 2 no trusted mask (removal uses only masks a person verified" in result.output
    assert "--allow-model-masks" in result.output and "--background-embedding projection" in result.output
    assert "too few photos" not in result.output and "photos left out: 24 no trusted mask" in result.output
    record = DiscoveryRun.of_folder(world, "rm")
    assert [c["reason"] for c in record.classes] == ["no_trusted_mask"] * 2
    assert record.config["references"][0]["chance"] == pytest.approx(0.001)  # 1 vs 1000: the synthetic world
    assert "reference's labels: 0.1% (imagenet1k, 1000 labels)" in result.output


@pytest.mark.parametrize(("verb", "listed", "absent"), [
    ("discover", ["A CLIP", "'auto'"], ["timm:", "lvlm:", "endpoint:"]),
    ("audit", ["A CLIP"], ["timm:", "lvlm:", "endpoint:"]),
    ("fidelity", ["timm:"], ["lvlm:", "endpoint:"]),
    ("evaluate", ["timm:", "lvlm:", "endpoint:"], []),
])
def test_model_help_lists_only_what_each_verb_accepts(verb, listed, absent):
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, [verb, "--help"])
    assert result.exit_code == 0, result.output
    assert all(text in result.output for text in listed), result.output
    assert not [text for text in absent if text in result.output], result.output
