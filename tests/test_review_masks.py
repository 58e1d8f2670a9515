"""Model mask proposals through the review round trips (issue 24, part 2 "Review").

A tiny synthetic world where six samples got a model proposal (``mask_status = model:tiny@abc``,
``extra.mask_score`` / ``extra.mask_run``, as ``curate propose-masks`` leaves them;
tests/review_helpers.py ``proposal_world``) is pushed to FiftyOne (a real MongoDB) and to Label
Studio (a real server); a reviewer accepts, repaints and rejects proposals through each tool's
API; the pull is checked in the folder (statuses, masks kept / replaced / dropped), in its
report (``proposals: N accepted, N repainted, N rejected (masks dropped)``) and in
``changes.jsonl``. A proposal a newer propose-masks run replaced after the push is a conflict,
never clobbered. A cleared verdict never makes a proposal a person's mask, an empty mask is never
stored, a deleted brush is decided as FiftyOne's removed mask is, and a pull writes its masks in
one commit per actor (these also without a server, through ``apply_pull`` and ``observe_task``).
The servers are the session fixtures of the two review suites.
"""
from __future__ import annotations

import hashlib
import secrets
import uuid
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from review_helpers import PROPOSAL_SCORES, proposal_world, propose, square_mask, table_of

# the session servers of the review suites (pytest needs the fixtures in this module's namespace)
from service_fixtures import EMAIL

from curate.cli import main
from curate.masks.sources import is_trusted, mask_source
from curate.review import rle
from curate.review.sync import (
    Edit,
    Observation,
    ProposalCounts,
    Snapshot,
    apply_pull,
    decide_mask_review,
    folder_units,
    snapshot_path,
)

PROPOSED = "model:tiny@abc"


def _masks(world, ids) -> dict[str, np.ndarray]:
    return {sid: world.load_mask(sid) for sid in ids}


def _other_mask(world, sid: str, shift: int = 0) -> np.ndarray:
    row = world.row(sid)
    mask = square_mask(row["height"], row["width"], 16 + shift, 14, 10)
    mask[2:5, 2:30] = 1
    return mask


def _records_since(world, count: int) -> list[dict[str, Any]]:
    return world.changes()[count:]


# ------------------------------------------------------------------------------ the shared decision


@pytest.mark.parametrize(("pushed", "verdict", "mask", "expected"), [
    # a model proposal
    (PROPOSED, "ok", "same", ("mask_status", "ok", "accepted")),
    (PROPOSED, "ok", "new", ("mask", "human", "repainted")),
    (PROPOSED, None, "new", ("mask", "human", "repainted")),
    (PROPOSED, "bad", "same", ("mask", "bad", "rejected")),
    (PROPOSED, None, "removed", ("mask", "bad", "rejected")),
    (PROPOSED, "bad", "removed", ("mask", "bad", "rejected")),
    (PROPOSED, "bad", "new", "problem: keep one"),
    (PROPOSED, "ok", "removed", "problem: keep one"),
    ("model", "bad", "same", ("mask", "bad", "rejected")),  # a bare `model` status is a proposal too
    # a cleared verdict (FiftyOne's mask_status field emptied) never makes a proposal a person's mask
    (PROPOSED, "cleared", "same", "problem: was cleared"),
    ("model", "cleared", "same", "problem: was cleared"),
    (PROPOSED, "cleared", "removed", "problem: keep one"),
    # an empty new mask (a brush erased to nothing) on a proposal is its removal ...
    (PROPOSED, None, "empty", ("mask", "bad", "rejected")),
    (PROPOSED, "bad", "empty", ("mask", "bad", "rejected")),
    (PROPOSED, "ok", "empty", "problem: keep one"),
    # a human or exact mask: today's rules
    ("synthetic", "bad", "same", ("mask_status", "bad", None)),
    ("synthetic", "bad", "new", ("mask", "bad", None)),
    ("human", None, "new", ("mask", "human", None)),
    ("human", "cleared", "same", ("mask_status", None, None)),  # a person's mask stays a person's
    (None, None, "removed", ("mask", None, None)),
    ("synthetic", "bad", "removed", ("mask", "bad", None)),
    ("human", "ok", "removed", "problem: keep one"),  # keep it and drop it
    # ... and on any other mask a problem: an empty mask is never stored
    ("synthetic", None, "empty", "problem: is empty"),
    ("human", "bad", "empty", "problem: is empty"),
    (None, "ok", "empty", "problem: is empty"),
])
def test_one_decision_turns_verdict_and_mask_into_edits(pushed, verdict, mask, expected) -> None:
    new = np.ones((4, 4), np.uint8)
    edits = {"curation": Edit("curation", ["accepted", None], "tag accept")}
    if verdict is not None:
        value = None if verdict == "cleared" else verdict
        edits["mask_status"] = Edit("mask_status", value, f"tag mask:{verdict}", actor="ann")
    if mask != "same":
        value = {"new": new, "empty": np.zeros_like(new), "removed": None}[mask]
        edits["mask"] = Edit("mask", value, "brush", actor="ann")
    out, problems = decide_mask_review("s1", edits, pushed)
    assert out["curation"] is edits["curation"]  # other units untouched
    if isinstance(expected, str):
        assert len(problems) == 1 and expected.split(": ", 1)[1] in problems[0].message, problems
        assert "mask" not in out and "mask_status" not in out
        return
    unit, status, outcome = expected
    assert not problems
    edit = out[unit]
    assert edit.proposal == outcome and edit.actor == "ann"
    mask_units = {u for u in out if u in ("mask", "mask_status")}
    if outcome:  # one edit decides a proposal and guards both mask units
        assert mask_units == {unit} and set((unit, *edit.covers)) == {"mask", "mask_status"}
    if unit == "mask":
        assert edit.mask_status == status
        assert (edit.value is None) == (outcome == "rejected" or mask in ("removed", "empty"))
        assert edit.value is None or edit.value.any()  # never an empty mask
    else:
        assert edit.value == status


def test_the_report_line_counts_proposals() -> None:
    counts = ProposalCounts()
    for outcome in ("accepted",) * 5 + ("repainted",) * 2 + ("rejected",) * 3:
        counts.add(outcome)
    assert counts.line() == "proposals: 5 accepted, 2 repainted, 3 rejected (masks dropped)"
    counts.conflicts = 1
    assert counts.line().endswith("; 1 left in conflict")
    with pytest.raises(ValueError):
        counts.add("kept")


def _pushed(world, backend: str = "test") -> Snapshot:
    """A push snapshot of every sample as the folder holds it now (what a push records)."""
    samples = {r["sample_id"]: {"folder": folder_units(world, r), "view": {}} for r in world.rows()}
    return Snapshot(backend=backend, target={}, samples=samples,
                    path=snapshot_path(world.root, backend, f"t-{uuid.uuid4().hex[:6]}"))


def _observed(sid: str, verdict: Any = "none", mask: Any = "none", actor: str | None = None) -> Observation:
    """What a backend reads for one sample: a verdict (None: cleared) and / or a new mask (None: removed)."""
    obs = Observation(sid)
    if verdict != "none":
        obs.edits["mask_status"] = Edit("mask_status", verdict, f"tags mask:{verdict}", actor)
    if not isinstance(mask, str):
        obs.edits["mask"] = Edit("mask", mask, "field mask", actor)
    return obs


def test_a_pull_never_trusts_a_cleared_verdict_nor_stores_an_empty_mask(tmp_path) -> None:
    world, p = proposal_world(tmp_path / "world")
    rows = {r["sample_id"]: r for r in world.rows()}
    exact = [sid for sid, r in rows.items() if r["mask_status"] == "synthetic"][:2]
    snapshot = _pushed(world)
    zeros = {sid: np.zeros((rows[sid]["height"], rows[sid]["width"]), np.uint8) for sid in rows}
    proposed = _masks(world, p)
    before = {sid: world.row(sid) for sid in (p[0], p[2], *exact)}
    report = apply_pull(world, snapshot, [
        _observed(p[0], verdict=None),                       # the reviewer cleared mask_status
        _observed(p[1], mask=zeros[p[1]]),                   # the proposal erased to nothing
        _observed(p[2], verdict="ok", mask=zeros[p[2]]),     # "ok" but erased: keep one
        _observed(p[3], verdict="bad", mask=zeros[p[3]]),    # erased and marked bad: dropped
        _observed(exact[0], mask=zeros[exact[0]]),           # an exact mask erased: never stored empty
        _observed(exact[1], verdict="bad", mask=zeros[exact[1]]),
    ], backend="test", target="t", actor="alice")
    # the cleared verdict is reported; the proposal stays an unverified proposal (not a person's mask)
    row = world.row(p[0])
    assert row == before[p[0]] and mask_source(row) == "model" and not is_trusted(row)
    assert np.array_equal(world.load_mask(p[0]), proposed[p[0]])
    problems = {pr.sample_id: pr.message for pr in report.problems}
    assert set(problems) == {p[0], p[2], *exact}, problems
    assert "cleared" in problems[p[0]] and "keep one" in problems[p[2]]
    assert all("empty" in problems[sid] for sid in exact)
    for sid in (p[2], *exact):
        assert world.row(sid) == before[sid]
    # an erased proposal is a rejected one: dropped, counted
    for sid in (p[1], p[3]):
        assert (world.row(sid)["mask_path"], world.row(sid)["mask_status"]) == (None, "bad")
    assert report.proposals.as_dict() == {"accepted": 0, "repainted": 0, "rejected": 2, "conflicts": 0}
    for row in world.rows():  # no empty mask anywhere in the folder
        assert row["mask_path"] is None or world.load_mask(row["sample_id"]).any(), row["sample_id"]


def test_the_pull_writes_masks_in_one_commit_per_actor(tmp_path, monkeypatch) -> None:
    from curate.store import Dataset

    world, p = proposal_world(tmp_path / "world")
    rows = {r["sample_id"]: r for r in world.rows()}
    exact = [sid for sid, r in rows.items() if r["mask_status"] == "synthetic"][:3]
    snapshot = _pushed(world)
    proposed = _masks(world, p)
    repainted = {sid: _other_mask(world, sid) for sid in (p[1], exact[0])}
    propose(world, p[5], _other_mask(world, p[5], shift=3), 0.5, run="masks-tiny-2")  # newer, after the push
    newer = world.load_mask(p[5])
    wrong = np.ones((rows[p[4]]["height"] + 1, rows[p[4]]["width"]), np.uint8)
    calls: list[tuple[str, int]] = []
    commits: list[int] = []
    set_masks, commit = Dataset.set_masks, Dataset._commit_table

    def spy_set_masks(self, masks, **kwargs):
        calls.append((kwargs["actor"], len(masks)))
        return set_masks(self, masks, **kwargs)

    def spy_commit(self, *args, **kwargs):
        commits.append(1)
        return commit(self, *args, **kwargs)

    def no_set_mask(self, *args, **kwargs):
        raise AssertionError("the pull writes masks with set_masks, one commit per actor")

    monkeypatch.setattr(Dataset, "set_masks", spy_set_masks)
    monkeypatch.setattr(Dataset, "_commit_table", spy_commit)
    monkeypatch.setattr(Dataset, "set_mask", no_set_mask)
    log_before = len(world.changes())
    report = apply_pull(world, snapshot, [
        _observed(p[0], verdict="ok", actor="review:ann"),                    # accepted: a status, no mask
        _observed(p[1], mask=repainted[p[1]], actor="review:ann"),            # repainted
        _observed(p[2], verdict="bad", actor="review:ann"),                   # rejected: dropped
        _observed(p[3], verdict="bad", actor="review:bob"),                   # rejected, by another person
        _observed(p[4], verdict="ok", mask=wrong, actor="review:bob"),        # the wrong size: its problem only
        _observed(p[5], verdict="bad", actor="review:bob"),                   # a conflict: left alone
        _observed(exact[0], mask=repainted[exact[0]]),                        # the pull's actor
        _observed(exact[1], mask=None),                                       # removed: no mask, no status
        _observed(exact[2], verdict="bad", actor="review:bob"),               # marked, kept
    ], backend="test", target="t", actor="review:pull")
    assert sorted(calls) == [("review:ann", 2), ("review:bob", 1), ("review:pull", 2)]
    # two status updates (ann, bob) and three mask commits: one per actor, not one per mask
    assert len(commits) == 5
    assert [(pr.sample_id, pr.unit) for pr in report.problems] == [(p[4], "mask")]
    height, width = rows[p[4]]["height"], rows[p[4]]["width"]
    assert f"the mask is {width}x{height + 1} but the stored image is {width}x{height}" in report.problems[0].message
    assert [(c.sample_id, c.resolution) for c in report.conflicts] == [(p[5], None)]
    assert report.proposals.as_dict() == {"accepted": 1, "repainted": 1, "rejected": 2, "conflicts": 1}
    assert world.row(p[0])["mask_status"] == "ok" and np.array_equal(world.load_mask(p[0]), proposed[p[0]])
    assert world.row(p[1])["mask_status"] == "human" and np.array_equal(world.load_mask(p[1]), repainted[p[1]])
    for sid in (p[2], p[3]):
        assert (world.row(sid)["mask_path"], world.row(sid)["mask_status"]) == (None, "bad")
    assert world.row(p[4]) == {**rows[p[4]]} and np.array_equal(world.load_mask(p[4]), proposed[p[4]])
    assert world.row(p[5])["mask_status"] == PROPOSED and np.array_equal(world.load_mask(p[5]), newer)
    assert world.row(exact[0])["mask_status"] == "human"
    assert np.array_equal(world.load_mask(exact[0]), repainted[exact[0]])
    assert (world.row(exact[1])["mask_path"], world.row(exact[1])["mask_status"]) == (None, None)
    assert world.row(exact[2])["mask_status"] == "bad" and world.row(exact[2])["mask_path"] == rows[exact[2]]["mask_path"]
    # the change log names whoever made each change, as before
    actors: dict[str, set[str]] = {}
    for record in world.changes()[log_before:]:
        actors.setdefault(record["sample_id"], set()).add(record["actor"])
    assert actors == {p[0]: {"review:ann"}, p[1]: {"review:ann"}, p[2]: {"review:ann"}, p[3]: {"review:bob"},
                      exact[0]: {"review:pull"}, exact[1]: {"review:pull"}, exact[2]: {"review:bob"}}
    # settled: pulling the same state again changes nothing
    again = apply_pull(world, snapshot, [_observed(p[1], mask=repainted[p[1]], actor="review:ann")],
                       backend="test", target="t", actor="review:pull")
    assert not again.applied and len(calls) == 3


def test_label_studio_reads_a_deleted_or_erased_brush_for_the_one_decision(tmp_path) -> None:
    """Deleting the brush region and choosing mask:ok is the same contradiction as FiftyOne's removed
    mask field with mask:ok (a problem, never an accepted proposal); mask:bad with it deleted and a
    brush erased to nothing drop the proposal. No server: the export's task JSON is made here."""
    from curate.review.labelstudio import observe_task, pushed_values
    from curate.review.vocabulary import TagVocabulary

    world, p = proposal_world(tmp_path / "world")
    vocab = TagVocabulary.load()
    rows = {r["sample_id"]: r for r in world.rows()}
    exact = next(sid for sid, r in rows.items() if r["mask_status"] == "synthetic")
    snapshot = _pushed(world, "labelstudio")
    predicted: dict[str, list[dict[str, Any]]] = {}
    for sid in rows:
        view, results, _score = pushed_values(world, rows[sid], vocab)
        snapshot.samples[sid]["view"] = view
        predicted[sid] = results
    proposed = _masks(world, p)
    erased = np.zeros((rows[p[3]]["height"], rows[p[3]]["width"]), np.uint8)

    def task(sid: str, result: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": 100 + len(sid), "data": {"sample_id": sid},
                "annotations": [{"id": 7, "completed_by": 3, "was_cancelled": False, "result": result}]}

    def without_brush(sid: str) -> list[dict[str, Any]]:
        return [r for r in predicted[sid] if r["type"] != "brushlabels"]

    annotated = {
        p[0]: without_brush(p[0]) + [_verdict("mask:ok")],     # brush deleted, "ok": a problem
        p[1]: predicted[p[1]] + [_verdict("mask:ok")],         # as proposed, "ok": accepted
        p[2]: without_brush(p[2]) + [_verdict("mask:bad")],    # brush deleted, "bad": rejected
        p[3]: without_brush(p[3]) + [_stroke(erased)],         # erased to nothing: rejected
        p[4]: without_brush(p[4]),                             # no verdict, no brush: says nothing of the mask
        exact: without_brush(exact) + [_stroke(erased)],       # an exact mask erased: a problem
    }
    observations = [observe_task(world, task(sid, result), snapshot.samples[sid], vocab)
                    for sid, result in annotated.items()]
    assert "mask" not in observations[4].edits
    def mask_of(sid: str) -> tuple[Any, ...]:
        row = world.row(sid)
        return row["mask_path"], row["mask_status"], row["extra"]

    before = {sid: mask_of(sid) for sid in (p[0], p[4], exact)}
    report = apply_pull(world, snapshot, observations, backend="labelstudio", target="t", actor="review.labelstudio")
    assert sorted(pr.sample_id for pr in report.problems) == sorted([p[0], exact]), [str(x) for x in report.problems]
    assert "keep one" in next(pr.message for pr in report.problems if pr.sample_id == p[0])
    assert {sid: mask_of(sid) for sid in before} == before  # (the background choices may confirm a label)
    assert world.row(p[1])["mask_status"] == "ok" and np.array_equal(world.load_mask(p[1]), proposed[p[1]])
    for sid in (p[2], p[3]):
        assert (world.row(sid)["mask_path"], world.row(sid)["mask_status"]) == (None, "bad")
    assert report.proposals.as_dict() == {"accepted": 1, "repainted": 0, "rejected": 2, "conflicts": 0}
    assert {c.actor for c in report.applied} == {"review.labelstudio:3"}


def test_proposal_provenance_is_read_from_the_row_by_curate_masks_sources(tmp_path) -> None:
    import json
    import subprocess
    import sys

    from curate.masks.sources import MASK_RUN_KEY, MASK_SCORE_KEY, proposal_of, proposal_run, proposal_score
    from curate.review.views import column_value

    extra = json.dumps({MASK_SCORE_KEY: 0.25, MASK_RUN_KEY: "masks-tiny"})
    row = {"mask_path": "masks/a.png", "mask_status": PROPOSED, "extra": extra}
    assert (proposal_score(row), proposal_run(row)) == (0.25, "masks-tiny")
    info = proposal_of(row)
    assert info is not None and (info.model_id, info.score, info.run) == ("tiny@abc", 0.25, "masks-tiny")
    assert column_value(row, "mask_score") == 0.25
    # provenance stays after a review (the measurement reads the run); the view's score is a proposal's only
    reviewed = {**row, "mask_status": "ok"}
    assert proposal_run(reviewed) == "masks-tiny" and proposal_of(reviewed) is None
    assert column_value(reviewed, "mask_score") is None
    for bad in (None, "", "not json", "[1]", json.dumps({MASK_SCORE_KEY: True}), json.dumps({MASK_SCORE_KEY: "0.5"})):
        assert proposal_score({**row, "extra": bad}) is None
    assert proposal_score({**row, "extra": {MASK_SCORE_KEY: 1}}) == 1.0 and proposal_run({"extra": None}) is None
    # the views no longer import the pull module, and sources stays light (stdlib only)
    code = ("import sys, curate.masks.sources; light = not [m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'pyarrow')]; import curate.review.views; print(light, 'curate.review.sync' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["True", "False"], result.stdout + result.stderr


def test_masks_to_verify_and_masks_to_review_never_share_a_sample(tmp_path) -> None:
    from curate.review.views import expand_views, find_view, load_views

    world, proposals = proposal_world(tmp_path / "world")
    views = expand_views(load_views(), [])
    verify, review = find_view(views, "masks to verify"), find_view(views, "masks to review")
    rows = world.rows()
    in_verify = {r["sample_id"] for r in rows if verify.matches(r)}
    in_review = {r["sample_id"] for r in rows if review.matches(r)}
    bare = {r["sample_id"] for r in rows if r["mask_status"] == "model"}
    assert in_verify == set(proposals) | bare and len(bare) == 3
    assert not in_verify & in_review and verify.review and verify.sort_by == "mask_score"
    assert "lowest first" in verify.description


def test_masks_to_review_are_the_masks_whose_maker_the_mask_source_table_does_not_name() -> None:
    """docs/design.md#masks: a mask whose status names its maker is exact, a person's or rejected;
    "masks to review" holds the rest (null or unknown text) but model proposals ("masks to verify"),
    and its filter values come from curate.masks.sources, so a status added there moves with it."""
    import re
    from pathlib import Path

    from curate.masks.sources import HUMAN_STATUSES
    from curate.review.views import find_view, load_views

    design = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text(encoding="utf-8")
    table = design.split("## masks", 1)[1].split("| `mask_status` | source |", 1)[1].split("\n\n", 1)[0]
    named: dict[str, str] = {}
    for line in table.splitlines()[2:]:
        statuses, source = line.split("|")[1:3]
        named.update({status: source.strip() for status in re.findall(r"`([^`]+)`", statuses) if "<" not in status})
    assert set(named.values()) == {"exact", "human", "model", "rejected"}, named
    view = find_view(load_views(), "masks to review")
    row = lambda status: {"mask_path": "masks/a.png", "mask_status": status}  # noqa: E731
    for status, source in named.items():
        assert mask_source(row(status)) == source, status  # the table and the one function agree
        assert not view.matches(row(status)), status
    for status in (None, "", "legacy", "painted in 2019"):  # "any other text or null": nobody named
        assert mask_source(row(status)) == "human" and view.matches(row(status)), status
    assert not view.matches({"mask_path": "masks/a.png", "mask_status": "model:clipseg@1"})
    assert not view.matches({"mask_path": None, "mask_status": None})
    values = {c.column: c.value for c in view.conditions}
    assert values == {"mask_source": "human", "mask_status": HUMAN_STATUSES}, values


def test_a_vocabulary_without_the_rejecting_verdict_is_refused(tmp_path) -> None:
    from curate.review.annotation import annotation_file
    from curate.review.vocabulary import TagVocabulary, VocabularyError

    text = annotation_file("tags.yaml").read_text().replace('"mask:bad": bad', '"mask:bad": wrong')
    path = tmp_path / "tags.yaml"
    path.write_text(text)
    with pytest.raises(VocabularyError, match="'bad'"):
        TagVocabulary.load(path)


# ------------------------------------------------------------------------------ FiftyOne


@pytest.mark.fiftyone
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fiftyone_proposals_are_verified_repainted_or_dropped(fo, tmp_path) -> None:
    from curate.review.fiftyone import pull_fiftyone, push_fiftyone

    world, p = proposal_world(tmp_path / "world")
    rows = {r["sample_id"]: r for r in world.rows()}
    bare = [sid for sid, r in rows.items() if r["mask_status"] == "model"]
    exact = next(sid for sid, r in rows.items() if r["mask_status"] == "synthetic")
    name = f"t-{uuid.uuid4().hex[:10]}"
    result = push_fiftyone(world.root, name=name)
    assert result.proposals == len(p) + len(bare)
    dataset = fo.load_dataset(name)
    sample = lambda sid: dataset.match(fo.ViewField("sample_id") == sid).first()  # noqa: E731
    # the proposal is the sample's Segmentation; its source, score and run are fields
    first = sample(p[0])
    assert isinstance(first.mask, fo.Segmentation) and first.mask.mask_path == str(world.mask_path(p[0]))
    assert (first.mask_source, first.mask_score, first.mask_run) == ("model", PROPOSAL_SCORES[0], "masks-tiny")
    assert (sample(exact).mask_source, sample(exact).mask_score) == ("exact", None)
    # "masks to verify": the proposals, lowest score first (those without a score before all)
    view = dataset.load_saved_view("masks to verify")
    order = [p[i] for i in np.argsort(PROPOSAL_SCORES)]
    assert view.values("sample_id")[len(bare):] == order and set(view.values("sample_id")[:len(bare)]) == set(bare)
    assert view.values("mask_score") == [None] * len(bare) + sorted(PROPOSAL_SCORES)
    assert "lowest first" in dataset.get_saved_view_info("masks to verify")["description"]
    assert not set(dataset.load_saved_view("masks to review").values("sample_id")) & set(view.values("sample_id"))

    # the reviewer, through FiftyOne's API as the App stores it
    proposed = _masks(world, p)
    dataset.select_by("sample_id", [p[0], p[1], p[5]]).tag_samples(["mask:ok"])
    dataset.select_by("sample_id", [p[3], p[4], exact, bare[0]]).tag_samples(["mask:bad"])
    repainted = _other_mask(world, p[2])
    for sid in (p[2], bare[0]):  # p[2]: repainted (and mask:ok); bare[0]: repainted AND mask:bad
        edited = sample(sid)
        edited["mask"] = fo.Segmentation(mask=repainted)
        edited.save()
    dataset.select_by("sample_id", [p[2]]).tag_samples(["mask:ok"])
    # a newer propose-masks run (same model) replaces p[5]'s proposal after the push
    newer = _other_mask(world, p[5], shift=3)
    propose(world, p[5], newer, 0.5, run="masks-tiny-2")
    dropped_files = [world.mask_path(sid) for sid in (p[3], p[4])]
    exact_mask = world.row(exact)["mask_path"]
    bare_before = world.row(bare[0])

    # a dry run through the CLI prints the report line and writes nothing
    digest = hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest()
    cli = CliRunner(env={"COLUMNS": "400"}).invoke(main, ["review", "pull", str(world.root), "--name", name,
                                                          "--actor", "alice", "--dry-run"])
    assert cli.exit_code == 2, cli.output  # the conflict is left for the user
    assert "proposals: 2 accepted, 1 repainted, 2 rejected (masks dropped); 1 left in conflict" in cli.output
    assert f"conflict sample {p[5]} [mask_status]" in cli.output  # the unit is text, not rich markup
    assert hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest() == digest

    log_before = len(world.changes())
    report = pull_fiftyone(world.root, name=name, actor="alice")
    assert report.proposals.as_dict() == {"accepted": 2, "repainted": 1, "rejected": 2, "conflicts": 1}
    assert "proposals: 2 accepted, 1 repainted, 2 rejected (masks dropped)" in report.summary()
    for sid in (p[0], p[1]):  # accepted: the proposal kept, verified by a person
        row = world.row(sid)
        assert row["mask_status"] == "ok" and np.array_equal(world.load_mask(sid), proposed[sid])
    assert world.row(p[2])["mask_status"] == "human" and np.array_equal(world.load_mask(p[2]), repainted)
    for sid, path in zip((p[3], p[4]), dropped_files):  # rejected: dropped, never kept as a mask
        row = world.row(sid)
        assert (row["mask_path"], row["mask_status"]) == (None, "bad") and not path.exists()
    # the newer proposal is not clobbered: a conflict, reported
    assert world.row(p[5])["mask_status"] == PROPOSED and np.array_equal(world.load_mask(p[5]), newer)
    assert [(c.sample_id, c.unit, c.resolution) for c in report.conflicts] == [(p[5], "mask_status", None)]
    # a human or exact mask keeps today's mask:bad: marked, kept
    assert (world.row(exact)["mask_status"], world.row(exact)["mask_path"]) == ("bad", exact_mask)
    # mask:bad beside a repaint contradicts itself: reported, nothing changed
    assert world.row(bare[0]) == bare_before
    assert [p_.sample_id for p_ in report.problems if "keep one" in p_.message] == [bare[0]]
    records = _records_since(world, log_before)
    assert {r["actor"] for r in records} == {"review.fiftyone:alice"}
    assert {r["sample_id"] for r in records} == {p[0], p[1], p[2], p[3], p[4], exact}
    assert {(r["field"], r["new"]) for r in records if r["sample_id"] == p[3]} == {("mask_path", None),
                                                                                 ("mask_status", "bad")}
    # FiftyOne shows the folder again: decided proposals left the view, the dropped mask is gone
    assert set(dataset.load_saved_view("masks to verify").values("sample_id")) == {p[5], *bare}
    assert sample(p[3]).mask is None and sample(p[0]).mask_source == "human"
    # pulling again changes nothing; the conflict stays until chosen
    again = pull_fiftyone(world.root, name=name, actor="alice")
    assert not again.applied and len(again.unresolved) == 1 and len(world.changes()) == log_before + len(records)
    kept = pull_fiftyone(world.root, name=name, actor="alice", on_conflict="folder")
    assert not kept.applied and world.row(p[5])["mask_status"] == PROPOSED
    assert not pull_fiftyone(world.root, name=name, actor="alice").conflicts


@pytest.mark.fiftyone
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fiftyone_a_cleared_status_or_an_empty_mask_never_becomes_a_persons_mask(fo, tmp_path) -> None:
    from curate.review.fiftyone import pull_fiftyone, push_fiftyone

    world, p = proposal_world(tmp_path / "world")
    rows = {r["sample_id"]: r for r in world.rows()}
    exact = next(sid for sid, r in rows.items() if r["mask_status"] == "synthetic")
    name = f"t-{uuid.uuid4().hex[:10]}"
    push_fiftyone(world.root, name=name)
    dataset = fo.load_dataset(name)
    sample = lambda sid: dataset.match(fo.ViewField("sample_id") == sid).first()  # noqa: E731
    edited = sample(p[0])
    edited["mask_status"] = None  # the reviewer emptied the status field of a proposal
    edited.save()
    for sid in (p[1], p[2], exact):  # every pixel erased, in the database
        edited = sample(sid)
        edited["mask"] = fo.Segmentation(mask=np.zeros((rows[sid]["height"], rows[sid]["width"]), np.uint8))
        edited.save()
    edited = sample(p[3])
    edited["mask"] = None  # the mask removed ...
    edited.save()
    dataset.select_by("sample_id", [p[2], p[3]]).tag_samples(["mask:ok"])  # ... and yet "ok"
    proposed = _masks(world, p)
    before = {sid: world.row(sid) for sid in (p[0], p[2], p[3], exact)}
    report = pull_fiftyone(world.root, name=name, actor="alice")
    problems = {pr.sample_id: pr.message for pr in report.problems}
    assert set(problems) == {p[0], p[2], p[3], exact}, problems
    assert "cleared" in problems[p[0]] and "empty" in problems[exact]
    assert "keep one" in problems[p[2]] and "keep one" in problems[p[3]]
    assert {sid: world.row(sid) for sid in before} == before
    assert mask_source(world.row(p[0])) == "model" and np.array_equal(world.load_mask(p[0]), proposed[p[0]])
    row = world.row(p[1])  # erased to nothing: the proposal rejected, never an empty mask
    assert (row["mask_path"], row["mask_status"]) == (None, "bad")
    assert report.proposals.as_dict() == {"accepted": 0, "repainted": 0, "rejected": 1, "conflicts": 0}
    assert sample(p[1]).mask is None and sample(p[1]).mask_status == "bad"
    again = pull_fiftyone(world.root, name=name, actor="alice")  # the problems stay until fixed in FiftyOne
    assert not again.applied and {pr.sample_id for pr in again.problems} == set(problems)


# ------------------------------------------------------------------------------ Label Studio


def _post(ls, project_id: int, task: dict[str, Any], result: list[dict[str, Any]]) -> None:
    body = {"result": result, "lead_time": 4.0, "project": project_id, "was_cancelled": False,
            "parent_prediction": (task.get("predictions") or [{}])[0].get("id")}
    response = ls.http.post(f"/api/tasks/{task['id']}/annotations/", params={"project": project_id}, json=body)
    assert response.status_code == 201, response.text


def _verdict(value: str) -> dict[str, Any]:
    return {"id": secrets.token_hex(5), "from_name": "mask_review", "to_name": "image", "type": "choices",
            "origin": "manual", "value": {"choices": [value]}}


def _stroke(mask: np.ndarray) -> dict[str, Any]:
    height, width = mask.shape
    return {"id": secrets.token_hex(5), "from_name": "mask", "to_name": "image", "type": "brushlabels",
            "origin": "manual", "original_width": width, "original_height": height, "image_rotation": 0,
            "value": {"format": "rle", "rle": rle.encode_rgba(mask), "brushlabels": ["animal"]}}


@pytest.mark.labelstudio
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_labelstudio_proposals_are_verified_repainted_or_dropped(ls) -> None:
    from curate.review.labelstudio import MediaSource, pull_labelstudio, push_labelstudio

    world, p = proposal_world(ls.docroot / f"masks-{uuid.uuid4().hex[:8]}")
    rows = {r["sample_id"]: r for r in world.rows()}
    bare = [sid for sid, r in rows.items() if r["mask_status"] == "model"]
    media = MediaSource("local-files", document_root=ls.docroot)
    result = push_labelstudio(world.root, url=ls.url, token=ls.token, media=media)
    assert result.proposals == len(p) + len(bare)
    response = ls.http.get("/api/tasks", params={"project": result.project_id, "fields": "all", "page_size": 1000})
    response.raise_for_status()
    data = response.json()
    tasks = {t["data"]["sample_id"]: t for t in (data["tasks"] if isinstance(data, dict) else data)}
    assert set(p) | set(bare) <= set(tasks)
    proposed = _masks(world, p)
    for sid, score in zip(p, PROPOSAL_SCORES):  # the proposal is the prediction's brush, with its score
        prediction = tasks[sid]["predictions"][0]
        brush = next(r for r in prediction["result"] if r["type"] == "brushlabels")
        decoded = rle.decode_mask(brush["value"]["rle"], brush["original_width"], brush["original_height"])
        assert np.array_equal(decoded, proposed[sid]) and brush["score"] == pytest.approx(score)
        assert not any(r["from_name"] == "mask_review" for r in prediction["result"])  # no verdict pre-selected
        row = rows[sid]
        model_bg = [row["background_score"]] if row["background_source"] == "model" else []
        assert prediction["score"] == pytest.approx(min([score, *model_bg]))

    def as_predicted(sid: str, brush: bool = True) -> list[dict[str, Any]]:
        """The prediction as the editor loads it (what a reviewer submits when touching nothing)."""
        return [r for r in tasks[sid]["predictions"][0]["result"] if brush or r["type"] != "brushlabels"]

    repainted = _other_mask(world, p[1])
    _post(ls, result.project_id, tasks[p[0]], as_predicted(p[0]) + [_verdict("mask:ok")])
    _post(ls, result.project_id, tasks[p[1]], as_predicted(p[1], brush=False) + [_stroke(repainted), _verdict("mask:ok")])
    _post(ls, result.project_id, tasks[p[2]], as_predicted(p[2]) + [_verdict("mask:bad")])
    _post(ls, result.project_id, tasks[p[3]], [_stroke(repainted), _verdict("mask:bad")])  # contradicts itself
    _post(ls, result.project_id, tasks[p[4]], as_predicted(p[4]) + [_verdict("mask:bad")])
    # p[5] is left unopened; a newer propose-masks run with another model replaces p[4]'s proposal meanwhile
    newer = _other_mask(world, p[4], shift=2)
    propose(world, p[4], newer, 0.8, model="big@def", run="masks-big")
    dropped_file = world.mask_path(p[2])
    before = {sid: world.row(sid) for sid in (p[3], p[5])}
    log_before = len(world.changes())
    report = pull_labelstudio(world.root, url=ls.url, token=ls.token)
    assert report.proposals.as_dict() == {"accepted": 1, "repainted": 1, "rejected": 1, "conflicts": 1}
    assert "proposals: 1 accepted, 1 repainted, 1 rejected (masks dropped); 1 left in conflict" in report.summary()
    assert world.row(p[0])["mask_status"] == "ok" and np.array_equal(world.load_mask(p[0]), proposed[p[0]])
    assert world.row(p[1])["mask_status"] == "human" and np.array_equal(world.load_mask(p[1]), repainted)
    row = world.row(p[2])
    assert (row["mask_path"], row["mask_status"]) == (None, "bad") and not dropped_file.exists()
    assert [p_.sample_id for p_ in report.problems] == [p[3]] and "keep one" in report.problems[0].message
    assert {sid: world.row(sid) for sid in (p[3], p[5])} == before
    assert [(c.sample_id, c.unit) for c in report.unresolved] == [(p[4], "mask")]
    assert world.row(p[4])["mask_status"] == "model:big@def" and np.array_equal(world.load_mask(p[4]), newer)
    records = _records_since(world, log_before)
    assert {r["actor"] for r in records} == {f"review.labelstudio:{EMAIL}"}
    assert {r["sample_id"] for r in records if r["field"] in ("mask_path", "mask_status")} == {p[0], p[1], p[2]}
    snapshot = table_of(world.root)
    again = pull_labelstudio(world.root, url=ls.url, token=ls.token)
    assert not again.applied and table_of(world.root) == snapshot  # idempotent; the conflict stays reported
    assert again.proposals.conflicts == 1


@pytest.mark.labelstudio
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_labelstudio_a_deleted_or_erased_brush_is_decided_as_in_fiftyone(ls) -> None:
    from curate.review.labelstudio import MediaSource, pull_labelstudio, push_labelstudio

    world, p = proposal_world(ls.docroot / f"erase-{uuid.uuid4().hex[:8]}")
    result = push_labelstudio(world.root, url=ls.url, token=ls.token,
                              media=MediaSource("local-files", document_root=ls.docroot))
    response = ls.http.get("/api/tasks", params={"project": result.project_id, "fields": "all", "page_size": 1000})
    response.raise_for_status()
    data = response.json()
    tasks = {t["data"]["sample_id"]: t for t in (data["tasks"] if isinstance(data, dict) else data)}

    def without_brush(sid: str) -> list[dict[str, Any]]:
        return [r for r in tasks[sid]["predictions"][0]["result"] if r["type"] != "brushlabels"]

    row = world.row(p[2])
    _post(ls, result.project_id, tasks[p[0]], without_brush(p[0]) + [_verdict("mask:ok")])  # deleted, "ok"
    _post(ls, result.project_id, tasks[p[1]], without_brush(p[1]) + [_verdict("mask:bad")])  # deleted, "bad"
    _post(ls, result.project_id, tasks[p[2]],
          without_brush(p[2]) + [_stroke(np.zeros((row["height"], row["width"]), np.uint8))])  # erased
    proposed = world.load_mask(p[0])
    report = pull_labelstudio(world.root, url=ls.url, token=ls.token)
    assert [pr.sample_id for pr in report.problems] == [p[0]] and "keep one" in report.problems[0].message
    assert world.row(p[0])["mask_status"] == PROPOSED and np.array_equal(world.load_mask(p[0]), proposed)  # not accepted
    for sid in (p[1], p[2]):
        assert (world.row(sid)["mask_path"], world.row(sid)["mask_status"]) == (None, "bad")
    assert report.proposals.as_dict() == {"accepted": 0, "repainted": 0, "rejected": 2, "conflicts": 0}
    assert not pull_labelstudio(world.root, url=ls.url, token=ls.token).applied
