"""Several annotators in FiftyOne against the real MongoDB (issue 44): a field per annotator, a
saved view per queue and of the disputes, and the pull of every answer into the annotation
table (idempotent, changes and cleared answers recorded, bad labels reported). Answers are
written through the SDK, as an annotation backend run or a script writes them (the open-source
App does not edit classification labels; see curate.review.fiftyone_team).
"""
from __future__ import annotations

import hashlib
import uuid

import pytest
from review_helpers import review_world

pytestmark = [pytest.mark.fiftyone, pytest.mark.slow, pytest.mark.timeout(600)]

TEAM = ("ann@example.com", "bo@example.com")


@pytest.fixture()
def world(tmp_path):
    return review_world(tmp_path / "world", classes=("polar bear", "black swan"))


def _answer(fo, dataset, field: str, answers: dict[str, list[str]]) -> None:
    for sample in dataset.select_by("sample_id", list(answers)):
        labels = answers[sample["sample_id"]]
        sample[field] = fo.Classifications(classifications=[fo.Classification(label=b) for b in labels])
        sample.save()


def test_fields_views_and_pull_of_every_answer(fo, world) -> None:
    from curate.review.fiftyone import push_fiftyone
    from curate.review.fiftyone_team import annotator_field, pull_fiftyone_team, push_fiftyone_team
    from curate.store import Dataset
    from curate.store.annotations import current_annotations, load_annotations

    name = f"t-{uuid.uuid4().hex[:10]}"
    push_fiftyone(world.root, name=name)
    result = push_fiftyone_team(world.root, annotators=list(TEAM), overlap=2, name=name)
    dataset = fo.load_dataset(name)
    assert set(result.views) == {f"queue: {a}" for a in TEAM}  # no answers yet: no disputed view
    rows = world.rows()
    for annotator in TEAM:
        assert len(dataset.load_saved_view(f"queue: {annotator}")) == result.loads[annotator] == len(rows)
    a_field, b_field = (annotator_field(a) for a in TEAM)
    first, second = world.backgrounds[:2]
    sids = [r["sample_id"] for r in rows]
    _answer(fo, dataset, a_field, {sid: [first] for sid in sids})
    _answer(fo, dataset, b_field, {sid: [first] if i % 2 else [second] for i, sid in enumerate(sids)})
    _answer(fo, dataset, b_field, {sids[1]: [first, second]})  # a photo that shows two
    _answer(fo, dataset, b_field, {sids[3]: []})  # skipped
    _answer(fo, dataset, b_field, {sids[5]: ["lava"]})  # outside the vocabulary
    digest = hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest()
    report = pull_fiftyone_team(world.root, name=name)
    assert report.upsert.counts["added"] == 2 * len(sids) - 1
    assert any("'lava' not in the dataset's vocabulary" in p and sids[5] in p for p in report.problems)
    assert report.skipped == {TEAM[1]: 1}
    stored = {(s.annotator, s.sample_id): s for s in current_annotations(world)}
    assert stored[(TEAM[1], sids[1])].backgrounds == (first, second) and stored[(TEAM[1], sids[3])].skipped
    assert all(s.backend == "fiftyone" and s.updated_at for s in stored.values())
    assert hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest() == digest
    assert pull_fiftyone_team(world.root, name=name).upsert.counts["unchanged"] == 2 * len(sids) - 1  # idempotent
    _answer(fo, dataset, a_field, {sids[0]: [second]})  # changed
    sample = dataset.select_by("sample_id", [sids[2]]).first()
    sample[a_field] = None  # cleared
    sample.save()
    again = pull_fiftyone_team(world.root, name=name)
    assert (again.upsert.counts["changed"], again.upsert.counts["deleted"]) == (1, 1)
    states = {(r.annotator, r.sample_id, r.version): r.state for r in load_annotations(world)}
    assert states[(TEAM[0], sids[0], 1)] == "changed" and states[(TEAM[0], sids[2], 1)] == "deleted"
    Dataset.open(world.root)  # still valid
    # the disputes (a and b differ on the even photos) as a saved view for the adjudicator
    from curate.review.fiftyone_team import save_disputed_view

    count = save_disputed_view(world.root, name=name, rule="majority")
    disputed = set(dataset.load_saved_view("disputed").values("sample_id"))
    assert count == len(disputed) > 0 and sids[4] in disputed and sids[7] not in disputed


def test_a_pull_without_a_team_push_is_a_clear_error(fo, world) -> None:
    from curate.review.fiftyone import push_fiftyone
    from curate.review.fiftyone_team import pull_fiftyone_team
    from curate.review.sync import ReviewError

    name = f"t-{uuid.uuid4().hex[:10]}"
    with pytest.raises(ReviewError, match="no FiftyOne dataset"):
        pull_fiftyone_team(world.root, name=name)
    push_fiftyone(world.root, name=name)
    with pytest.raises(ReviewError, match="has no team push: push with --annotators first"):
        pull_fiftyone_team(world.root, name=name)


def test_the_cli_pushes_the_team_fields_and_review_pull_stores_the_answers(fo, world) -> None:
    from click.testing import CliRunner

    from curate.cli import main
    from curate.review.fiftyone_team import annotator_field
    from curate.store.annotations import current_annotations

    name = f"t-{uuid.uuid4().hex[:10]}"
    runner = CliRunner(env={"COLUMNS": "200"})
    misuse = runner.invoke(main, ["review", "fiftyone", str(world.root), "--name", name, "--overlap", "1"])
    assert misuse.exit_code == 2 and "go with --annotators" in misuse.output
    pushed = runner.invoke(main, ["review", "fiftyone", str(world.root), "--name", name, "--annotators", ",".join(TEAM),
                                  "--overlap", "1"])
    assert pushed.exit_code == 0, pushed.output
    assert f"{TEAM[0]}: field {annotator_field(TEAM[0])}" in pushed.output
    dataset = fo.load_dataset(name)
    queue = dataset.load_saved_view(f"queue: {TEAM[0]}")
    _answer(fo, dataset, annotator_field(TEAM[0]), {sid: [world.backgrounds[0]] for sid in queue.values("sample_id")})
    pulled = runner.invoke(main, ["review", "pull", str(world.root), "--name", name])
    assert pulled.exit_code == 0, pulled.output
    assert f"annotations: {len(queue)} added" in pulled.output and "photo(s) nobody labelled" in pulled.output
    assert "derived from every answer by: curate agreement" in pulled.output
    assert len(current_annotations(world)) == len(queue)
