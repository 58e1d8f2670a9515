"""``curate collect inat DIR --fill RUN``: the steered fetch on the planted-place world, where each
photo's background follows its place and month (tests/fake_inat.py:make_place_world), so the share
of fetched photos that land in the hard group is known exactly."""
from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from fake_inat import TWO_REGIONS, FakeINat, make_place_world, make_two_region_world
from fill_helpers import (
    FAST,
    OSTRICH,
    client_for,
    hit_rates,
    labelled_world,
    plan_against_fetch,
    ratio_interval,
)

from curate.cli import main
from curate.collect.fill import FillError, fill_group, fill_table, learn_steering
from curate.collect.fill_score import background_score
from curate.collect.http import HttpError
from curate.collect.inat import make_client
from curate.features import compute_features
from curate.models import load_model
from curate.review.views import find_view, load_views
from curate.split.plan import wilson
from curate.store import Dataset, check_dataset
from curate.zeroshot.classifier import build_text_classifier
from curate.zeroshot.prompts import load_prompts

GROUP_OF = {"snow": "hard", "grass": "easy"}  # the split of the planted world: snow is the rare background


@pytest.fixture(scope="module")
def place_server():
    with FakeINat(make_place_world(n_per_taxon=3000, seed=7)) as server:
        yield server


@pytest.fixture(scope="module")
def labelled(place_server: FakeINat, tmp_path_factory) -> Path:
    """The 150 newest ostrich photos, their backgrounds and groups set from the world's truth (what
    review and `curate split` would give)."""
    return labelled_world(place_server, tmp_path_factory.mktemp("fill") / "ds")


def _copy(root: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ds"
    shutil.copytree(root, target)
    return target


def test_steering_is_learned_from_the_groups_provenance(labelled: Path) -> None:
    steering = learn_steering(Dataset.open(labelled).rows(), OSTRICH, "hard")
    assert set(steering.months) <= {11, 12, 1, 2, 3} and steering.months  # the cold months
    swlat, _, nelat, _ = steering.box
    assert 40 < swlat < 50 and nelat >= 68  # the north
    params = steering.params()
    assert params["month"] == ",".join(map(str, steering.months)) and float(params["swlat"]) == pytest.approx(swlat, abs=1e-3)


def test_steered_fetch_lands_in_the_hard_group_three_times_as_often(labelled: Path, place_server: FakeINat,
                                                                    tmp_path: Path) -> None:
    root = _copy(labelled, tmp_path)
    rates = hit_rates(root, place_server, 30)
    (k1, n1), (k2, n2) = rates["steered"], rates["unsteered"]
    assert n1 == n2 == 30
    ratio, low, high = ratio_interval(k1, n1, k2, n2)
    print(f"steered {k1}/{n1} {wilson(k1 / n1, n1)}; unsteered {k2}/{n2} {wilson(k2 / n2, n2)}; "
          f"ratio {ratio:.1f} [{low:.1f}, {high:.1f}]")
    assert ratio >= 3 and low > 1
    rows = Dataset.open(root).rows()
    proposed = [r for r in rows if "proposed:hard" in r["tags"]]
    assert len(proposed) == 60 and all(r["status"] == "candidate" and r["group"] is None for r in proposed)
    extra = json.loads(proposed[0]["extra"])["proposed_for"]
    assert extra["group"] == "hard" and set(extra) == {"group", "score", "query", "split", "steered", "scored_by"}
    assert extra["scored_by"]["method"] == "place-month" and extra["scored_by"]["of"] == 90
    assert not check_dataset(root)
    review = find_view(load_views(), "proposed for hard")  # the review push: a saved view / Label Studio task set
    assert sum(review.matches(r) for r in rows) == 60
    # the same fill again adds nothing (resumed: the journal has them)
    with client_for(place_server) as client:
        again = fill_group(root, {OSTRICH: 30}, group="hard", api_url=place_server.api_url, client=client)
    assert again.collect is not None and again.collect.totals()["added"] == 0
    assert len(Dataset.open(root).rows()) == len(rows)
    # the plan's predicted half-width after the steered fetch against the one measured on it
    low, predicted, high, measured = plan_against_fetch(root, place_server)
    print(f"half-width after the fetch: predicted {100 * predicted:.1f} [{100 * low:.1f}, {100 * high:.1f}], "
          f"measured {100 * measured:.1f} points")
    assert low <= measured <= high


#: A simulated reference model on the planted world: its accuracy on each background.
def test_fill_bad_input(labelled: Path, place_server: FakeINat, tmp_path: Path) -> None:
    root = _copy(labelled, tmp_path)
    with client_for(place_server) as client:
        with pytest.raises(FillError, match="has no photo in its hard group"):
            fill_group(root, {10: 5}, api_url=place_server.api_url, client=client)
        ds = Dataset.open(root)
        hard = ds.ids(group="hard")
        ds.update(hard, {"extra": {"location": [85.0, 0.0], "observed_on": "2023-01-05"}}, actor="test",
                  reason="a place where nobody observes")
        with pytest.raises(FillError, match="lists no photo that is not already in the folder"):
            fill_group(root, {OSTRICH: 5}, api_url=place_server.api_url, client=client)
        ds.update(hard, {"extra": "{}"}, actor="test", reason="a folder import has no provenance")
        with pytest.raises(FillError, match="none of its .* hard photos has a place and a date"):
            fill_group(root, {OSTRICH: 5}, api_url=place_server.api_url, client=client)
    assert len(Dataset.open(root).rows()) == 150  # nothing added


def test_fill_server_failing_mid_fetch_keeps_what_was_added_and_resumes(labelled: Path, place_server: FakeINat,
                                                                         tmp_path: Path) -> None:
    root = _copy(labelled, tmp_path)
    with client_for(place_server) as client:
        first = fill_group(root, {OSTRICH: 10}, api_url=place_server.api_url, client=client, over_fetch=1)
    chosen = [int(r["source_id"]) for r in Dataset.open(root).rows() if "proposed:hard" in r["tags"]]
    assert len(chosen) == 10 and first.classes[0].added == 10
    shutil.rmtree(root)
    root = _copy(labelled, tmp_path)
    place_server.photo_faults.update({pid: "500_always" for pid in chosen[5:]})
    try:
        with client_for(place_server) as client:
            report = fill_group(root, {OSTRICH: 10}, api_url=place_server.api_url, client=client, over_fetch=1)
        assert report.classes[0].added == 5  # what was fetched is kept; the failures are journaled
        assert not check_dataset(root)
    finally:
        for pid in chosen[5:]:
            place_server.photo_faults.pop(pid, None)
    with client_for(place_server) as client:
        resumed = fill_group(root, {OSTRICH: 10}, api_url=place_server.api_url, client=client, over_fetch=1)
    assert resumed.classes[0].added == 10
    assert sorted(int(r["source_id"]) for r in Dataset.open(root).rows() if "proposed:hard" in r["tags"]) == \
        sorted(chosen)


def test_fill_offline_is_one_line(labelled: Path, tmp_path: Path) -> None:
    root = _copy(labelled, tmp_path)
    with pytest.raises(HttpError):
        with make_client(api_url="http://127.0.0.1:9/v1", api_rate=None, retry=FAST) as client:
            fill_group(root, {OSTRICH: 5}, api_url="http://127.0.0.1:9/v1", client=client)
    assert len(Dataset.open(root).rows()) == 150


def test_cli_fill(labelled: Path, place_server: FakeINat, tmp_path: Path) -> None:
    root = _copy(labelled, tmp_path)
    runner = CliRunner(env={"COLUMNS": "200"})
    args = ["collect", "inat", str(root), "--fill", "split-planted", "--class", str(OSTRICH), "--n", "8",
            "--api-url", place_server.api_url, "--api-rate", "none", "--download-rate", "none", "--byte-rate", "none"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "proposed for hard" in result.output and "ranked by place and month (give --model" in result.output
    assert sum("proposed:hard" in r["tags"] for r in Dataset.open(root).rows()) == 8
    bad = runner.invoke(main, ["collect", "inat", str(root), "--fill", "split-planted", "--class", "10", "--n", "3",
                               "--api-url", place_server.api_url])
    assert bad.exit_code == 1 and "class 10 is not among split run split-planted's classes" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_background_score_by_hand() -> None:
    """cos(b, mean_group) - cos(b, mean_other), rows of b normalised first."""
    b = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]])
    group = np.array([[1.0, 0.0], [0.0, 1.0]])  # mean (0.5, 0.5) -> (1, 1) / sqrt 2
    other = np.array([[1.0, 0.0]])
    want = [(0.6 + 0.8) / math.sqrt(2) - 0.6, 1 / math.sqrt(2) - 1.0, 1 / math.sqrt(2) - 0.0]
    assert background_score(b, group, other) == pytest.approx(want, abs=1e-12)
    assert background_score(b, group, np.zeros((0, 2))) == pytest.approx([1.4 / math.sqrt(2), 1 / math.sqrt(2),
                                                                           1 / math.sqrt(2)], abs=1e-12)


@pytest.fixture(scope="module")
def tiny_clip():
    """A random-weight curate-tiny-clip (seed 0): it still tells the stand-in's tinted backgrounds apart."""
    return load_model("curate-tiny-clip", None, seed=0)


def test_fill_ranks_by_background_embedding(labelled: Path, place_server: FakeINat, tiny_clip,
                                            tmp_path: Path) -> None:
    """Unsteered (no provenance used), 40 candidates ranked by the embedding score: the added 8 are
    the top 8, each recorded score is the stated formula recomputed from the stored photo, and the
    snow photos among the candidates come first."""
    root = _copy(labelled, tmp_path)
    with client_for(place_server) as client:
        report = fill_group(root, {OSTRICH: 8}, steer=False, over_fetch=5, model=tiny_clip,
                            api_url=place_server.api_url, client=client)
    entry = report.classes[0]
    assert report.scored_by == "embedding" and entry.listed == len(entry.ranked) == 40
    scores = [v for _, v in entry.ranked]
    assert scores == sorted(scores, reverse=True)
    rows = [r for r in Dataset.open(root).rows() if "proposed:hard" in r["tags"]]
    assert sorted(r["source_id"] for r in rows) == sorted(sid for sid, _ in entry.ranked[:8])
    proposals = {r["sample_id"]: json.loads(r["extra"])["proposed_for"] for r in rows}
    how = next(iter(proposals.values()))["scored_by"]
    assert how["method"] == "embedding" and how["embedding"] == "projection" and how["of"] == 40
    assert how["model"] == tiny_clip.model_id and "cos(b, mean_group) - cos(b, mean_other)" in how["formula"]
    # the score by hand: the added photo's embedding, class direction projected out, against the group means
    ds = Dataset.open(root)
    direction = build_text_classifier(tiny_clip, ["ostrich"], load_prompts("simple")).numpy()[0]

    def backgrounds(ids: list[str]) -> np.ndarray:
        feats = compute_features(ds, tiny_clip, ids)
        e = np.asarray(feats.values, dtype=np.float64)
        rest = e - np.outer(e @ direction, direction) / (direction @ direction)
        return rest / np.linalg.norm(rest, axis=1, keepdims=True)

    hard, easy = backgrounds(ds.ids(group="hard")), backgrounds(ds.ids(group="easy"))
    mh, me = hard.mean(0), easy.mean(0)
    new = backgrounds(list(proposals))
    by_hand = new @ mh / np.linalg.norm(mh) - new @ me / np.linalg.norm(me)
    assert by_hand == pytest.approx([proposals[sid]["score"] for sid in proposals], abs=0.02)
    truth = [place_server.world.background_of(int(sid)) == "snow" for sid, _ in entry.ranked]
    assert 0 < sum(truth) <= 8 and all(truth[:sum(truth)])  # every listed snow photo ranked first


def test_fill_with_a_model_downloads_each_candidate_once(labelled: Path, place_server: FakeINat, tiny_clip,
                                                        tmp_path: Path) -> None:
    """The photos scored by the CLIP are downloaded once each: the top ones are added from what the
    scorer fetched, not downloaded a second time by the engine (issue 42); the staging folder is gone."""
    root = _copy(labelled, tmp_path)
    before = Counter(place_server.photo_requests)
    with client_for(place_server) as client:
        report = fill_group(root, {OSTRICH: 4}, steer=False, over_fetch=2, model=tiny_clip,
                            api_url=place_server.api_url, client=client)
    fetched = Counter(place_server.photo_requests)
    fetched.subtract(before)
    fetched = +fetched  # photos requested during the fill, with how many times
    added = [int(r["source_id"]) for r in Dataset.open(root).rows() if "proposed:hard" in r["tags"]]
    assert report.classes[0].listed == 8 and len(added) == 4 and set(added) <= set(fetched)
    assert len(fetched) == 8 and set(fetched.values()) == {1}, dict(fetched)
    assert report.collect.client["downloads"] == 8
    assert not list((root / ".collect").glob("*.staging"))


def test_cli_fill_with_model(labelled: Path, place_server: FakeINat, tmp_path: Path) -> None:
    root = _copy(labelled, tmp_path)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, [
        "collect", "inat", str(root), "--fill", "split-planted", "--class", str(OSTRICH), "--n", "5",
        "--over-fetch", "2", "--model", "curate-tiny-clip", "--pretrained", "none", "--api-url", place_server.api_url,
        "--api-rate", "none", "--download-rate", "none", "--byte-rate", "none"])
    assert result.exit_code == 0, result.output
    assert "ranked by background embedding (curate-tiny-clip" in result.output
    proposals = [json.loads(r["extra"])["proposed_for"] for r in Dataset.open(root).rows()
                 if "proposed:hard" in r["tags"]]
    ranked = sorted(proposals, key=lambda p: p["scored_by"]["rank"])
    assert [p["scored_by"]["rank"] for p in ranked] == [0, 1, 2, 3, 4]  # the added 5 are the top 5 of 10
    assert all(p["scored_by"]["of"] == 10 and p["scored_by"]["method"] == "embedding" for p in ranked)
    assert [p["score"] for p in ranked] == sorted((p["score"] for p in ranked), reverse=True)
    bad = CliRunner().invoke(main, ["collect", "inat", str(root), "--classes", "9", "--model", "curate-tiny-clip"])
    assert bad.exit_code == 2 and "--model scores --fill candidates" in bad.output


def test_cli_fill_refused_on_folder_photos_prints_no_progress_line(labelled: Path, place_server: FakeINat,
                                                                    tmp_path: Path) -> None:
    """Hard photos without a place and date (a folder import): the refusal is one error line, with no
    ``filling hard: 0/N stopped after`` line before it where stderr is a pipe (issue 45)."""
    root = _copy(labelled, tmp_path)
    ds = Dataset.open(root)
    ds.update(ds.ids(group="hard"), {"extra": "{}"}, actor="test", reason="a folder import has no provenance")
    result = CliRunner().invoke(main, ["collect", "inat", str(root), "--fill", "split-planted", "--class",
                                       str(OSTRICH), "--n", "5", "--api-url", place_server.api_url])
    assert result.exit_code == 1 and "has a place and a date" in result.output, result.output
    assert [line for line in result.output.splitlines() if line.strip()][0].startswith("error:"), result.output
    assert "filling" not in result.output


@pytest.fixture(scope="module")
def two_regions(tmp_path_factory):
    """The two-region world's server, and its 150 newest ostrich photos labelled from its truth: the
    hard group (snow) lies in two regions, at opposite ends of the globe, each in its own season."""
    with FakeINat(make_two_region_world(n_per_taxon=3000, seed=3)) as server:
        yield server, labelled_world(server, tmp_path_factory.mktemp("two") / "ds")


def _region(lat: float, lng: float) -> str | None:
    return next((name for name, ((swlat, swlng, nelat, nelng), _) in TWO_REGIONS.items()
                 if swlat <= lat <= nelat and swlng <= lng <= nelng), None)


def test_steering_learns_a_place_per_region_each_with_its_own_months(two_regions) -> None:
    """Issue 45: one box around a group that spans two regions is nearly the whole globe."""
    rows = Dataset.open(two_regions[1]).rows()
    steering = learn_steering(rows, OSTRICH, "hard")
    assert len(steering.places) == 2
    hard = [json.loads(r["extra"])["location"] for r in rows if r["group"] == "hard"]
    for place in steering.places:
        swlat, swlng, nelat, nelng = place.box
        inside = [_region(lat, lng) for lat, lng in hard if swlat <= lat <= nelat and swlng <= lng <= nelng]
        assert len(set(inside)) == 1 and len(inside) == place.photos  # one region, all its group photos
        region_box, cold = TWO_REGIONS[inside[0]]
        assert region_box[0] - 3 <= swlat and nelat <= region_box[2] + 3  # the region (+ the 2-degree pad)
        assert set(place.months) <= set(cold) and place.months
    assert sum(p.photos for p in steering.places) == len(hard)


def test_steered_fill_lands_in_both_regions_not_in_between(two_regions, tmp_path: Path) -> None:
    """Without re-ranking (over-fetch 1: the steered listing alone decides), the 20 photos added all
    lie in one of the two regions and both regions get their share; the table shows each place and
    the listed photos skipped for their licence (issue 45, "Words")."""
    two_region_server, labelled_root = two_regions
    root = _copy(labelled_root, tmp_path)
    with client_for(two_region_server) as client:
        report = fill_group(root, {OSTRICH: 20}, over_fetch=1, api_url=two_region_server.api_url, client=client)
    where = {p.id: (o.lat, o.lng) for o in two_region_server.world.observations for p in o.photos}
    added = [_region(*where[int(r["source_id"])]) for r in Dataset.open(root).rows() if "proposed:hard" in r["tags"]]
    assert len(added) == 20 and None not in added, added
    assert min(added.count("north"), added.count("south")) >= 5, added
    entry = report.classes[0]
    listed_nd = sum(any(p.license == "cc-by-nd" for p in o.photos) for o in two_region_server.world.observations
                    if any(str(p.id) in {sid for sid, _ in entry.ranked} for p in o.photos))
    assert entry.skipped_license >= listed_nd > 0
    columns, rows = fill_table(report)
    row = dict(zip(columns, rows[0]))
    assert row["skipped (licence)"] == str(entry.skipped_license) and row["listed"] == "20"
    assert "months 1,2,12" in row["places"] and "months 6,7,8" in row["places"]
    result = CliRunner(env={"COLUMNS": "250"}).invoke(main, [
        "collect", "inat", str(root), "--fill", "split-planted", "--class", str(OSTRICH), "--n", "3", "--over-fetch", "1",
        "--api-url", two_region_server.api_url, "--api-rate", "none", "--download-rate", "none", "--byte-rate", "none"])
    assert result.exit_code == 0, result.output
    assert "skipped (licence)" in result.output and "months 6,7,8" in result.output
