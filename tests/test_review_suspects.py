"""`curate audit` suspicions in the review tools, without a server: the Label Studio task payload
(a pre-selected reason, the suspects line), what a pull makes of a confirmed or cleared reason,
the ``audit:<check>`` sort pseudo column of the views, and the shared check <-> reason table.
The real-server round trips are in tests/test_review_labelstudio.py / test_review_fiftyone.py."""
from __future__ import annotations

import pytest
from review_helpers import review_world

from curate.audit.base import CHECK_TO_REASON, REASON_TO_CHECK
from curate.review.labelstudio import CURATION, observe_task, pushed_values, suspects_text
from curate.review.sync import apply_pull, folder_units
from curate.review.views import ViewError, load_views
from curate.review.vocabulary import TagVocabulary


@pytest.fixture(scope="module")
def vocab() -> TagVocabulary:
    return TagVocabulary.load()


@pytest.fixture()
def world(tmp_path):
    """A review world whose first candidate is suspected of label noise (and of being a duplicate)
    and whose first accepted photo is suspected of clarity."""
    ds = review_world(tmp_path / "world", with_run=False)
    rows = ds.rows()
    candidate = next(r for r in rows if r["status"] == "candidate")
    accepted = next(r for r in rows if r["status"] == "accepted")
    ds.update([candidate["sample_id"], accepted["sample_id"]], per_sample={
        candidate["sample_id"]: {"tags": [*(candidate["tags"] or []), "suspect:label", "suspect:duplicates"]},
        accepted["sample_id"]: {"tags": ["suspect:clarity"]}}, actor="audit:test", reason="suspects")
    ds.suspect, ds.decided = candidate["sample_id"], accepted["sample_id"]
    return ds


def _curation(results):
    return [r["value"]["choices"] for r in results if r["from_name"] == CURATION]


def test_the_reason_table_is_one_table_read_both_ways() -> None:
    assert {CHECK_TO_REASON[c]: c for c in CHECK_TO_REASON} == REASON_TO_CHECK
    assert CHECK_TO_REASON["label"] == "label_noise" and "duplicates" not in CHECK_TO_REASON


def test_a_task_preselects_the_suspected_reason_only_where_nobody_decided(world, vocab) -> None:
    row = world.row(world.suspect)
    view, results, _ = pushed_values(world, row, vocab)
    assert _curation(results) == [["reject:label_noise"]]
    assert view["curation"] is None and view["suspicion"] == {"label": "reject:label_noise"}
    text = suspects_text(row, vocab)
    assert "label, duplicates" in text and "reject:label_noise is pre-selected" in text
    decided = world.row(world.decided)  # a person's decision is shown, never a suspicion over it
    view, results, _ = pushed_values(world, decided, vocab)
    assert _curation(results) == [["accept"]] and "suspicion" not in view
    assert "pre-selected" not in suspects_text(decided, vocab) and "clarity" in suspects_text(decided, vocab)
    plain = next(r for r in world.rows() if r["status"] == "candidate" and r["sample_id"] != world.suspect)
    assert not _curation(pushed_values(world, plain, vocab)[1]) and suspects_text(plain, vocab) == ""


def _pull(world, vocab, result):
    """Observe an annotation with ``result`` on the suspect's task and apply it to the folder."""
    from curate.review.sync import Snapshot

    row = world.row(world.suspect)
    view, _, _ = pushed_values(world, row, vocab)
    entry = {"folder": folder_units(world, row), "view": view}
    task = {"id": 1, "data": {"sample_id": world.suspect},
            "annotations": [{"id": 9, "completed_by": {"email": "r@example.com"}, "result": result}]}
    obs = observe_task(world, task, entry, vocab)
    snapshot = Snapshot(backend="labelstudio", target={}, path=world.root / ".review" / "t.json")
    snapshot.samples[world.suspect] = entry
    report = apply_pull(world, snapshot, [obs], backend="labelstudio", target="test", actor="t")
    assert not report.problems and not report.conflicts, [str(p) for p in report.problems]
    return obs, world.row(world.suspect)


def _choice(name, value):
    return {"from_name": name, "to_name": "image", "type": "choices", "value": {"choices": [value]}}


def test_a_confirmed_reason_is_the_decision_and_the_suspicion_stays(world, vocab) -> None:
    obs, row = _pull(world, vocab, [_choice(CURATION, "reject:label_noise")])
    assert set(obs.edits) == {"curation"}
    assert (row["status"], row["reject_reason"]) == ("rejected", "label_noise")
    assert {"suspect:label", "suspect:duplicates"} <= set(row["tags"])


def test_a_cleared_reason_drops_the_suspicion_and_leaves_the_status(world, vocab) -> None:
    before = world.row(world.suspect)
    obs, row = _pull(world, vocab, [_choice("background", before["background"])])
    assert "curation" not in obs.edits and row["status"] == "candidate"
    assert "suspect:label" not in row["tags"]
    assert row["tags"] == [t for t in before["tags"] if t != "suspect:label"]  # duplicates and free tags kept


def test_another_reason_is_the_decision_and_clears_the_suspected_one(world, vocab) -> None:
    obs, row = _pull(world, vocab, [_choice(CURATION, "reject:clarity")])
    assert (row["status"], row["reject_reason"]) == ("rejected", "clarity")
    assert "suspect:label" not in row["tags"] and "suspect:duplicates" in row["tags"]


def test_views_sort_by_audit_scores_and_refuse_unknown_checks(tmp_path) -> None:
    views = {v.name: v for v in load_views()}
    assert views["suspects: label"].sort_key() == ("audit:label", True)
    bad = tmp_path / "views.yaml"
    bad.write_text('version: 1\nviews:\n  - name: x\n    match: {status: candidate}\n    sort_by: "-audit:nope"\n')
    with pytest.raises(ViewError, match="audit:<check>"):
        load_views(bad)
