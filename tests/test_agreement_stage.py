"""The agreement stage, its run and its CLI on a small folder (issue 44): measured tables, the
derived backgrounds and label status, adjudication, gold mistakes, masks, refusals."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from store_helpers import SIZE, make_dataset

from curate.cli import main
from curate.runs.agreement import AgreementRun
from curate.runs.base import load_run
from curate.stages.agreement import AgreementSettings, agreement
from curate.store import Dataset, check_dataset
from curate.store.annotation_schema import LABEL_STATUS_FILE
from curate.store.annotations import Annotation, load_label_status, upsert_annotations, write_gold

# photo index -> answers of (alice, bob, carol); None = not in their queue, "" = skipped
ANSWERS = [("grass", "grass", "grass"), ("tree", "tree", "shrub"), ("shrub", "tree", None), ("snow", None, None),
           ("", "", None), ("water", "sand", "rock"), ("grass", "grass", "tree"), ("tree", "tree", "tree")]


def team_folder(tmp_path, *, masks: bool = True) -> Dataset:
    ds = make_dataset(tmp_path / "d", n=len(ANSWERS), masks=False)
    ids = ds.sample_ids()
    rows, drawn = [], {}
    for i, answers in enumerate(ANSWERS):
        for who, label in zip(("alice", "bob", "carol"), answers):
            if label is None:
                continue
            aid = f"simulated:{who}:{ids[i]}"
            rows.append(Annotation(aid, ids[i], who, "simulated", (label,) if label else (),
                                   is_gold=i == 7))
            if masks and label and i < 2:
                m = np.zeros((SIZE[1], SIZE[0]), np.uint8)
                m[2:10, 2 + (who == "carol"):10] = 1
                drawn[aid] = m
    upsert_annotations(ds, rows, source="simulated", actor="test", masks=drawn)
    write_gold(ds, {ids[7]: "tree"}, actor="lead")
    return ds


def test_stage_measures_decides_and_derives(tmp_path):
    ds = team_folder(tmp_path)
    ids = ds.sample_ids()
    run = agreement(ds, None, AgreementSettings(rule="majority", replicates=100), run_name="agree")
    status = {d.sample_id: d.status for d in run.decisions}
    assert [status[s] for s in ids] == ["agreed", "agreed", "disputed", "single", "unlabelled", "disputed", "agreed",
                                        "adjudicated"]
    rows = {r["sample_id"]: r for r in Dataset.open(ds.root).rows()}
    assert rows[ids[1]]["background"] == "tree" and rows[ids[1]]["background_source"] == "human"
    assert rows[ids[2]]["background"] is None and rows[ids[4]]["background"] is None  # disputed, unlabelled
    assert rows[ids[3]]["background"] == "snow"  # single: the one answer, and the status says so
    assert load_label_status(ds)[ids[3]].status == "single" and load_label_status(ds)[ids[2]].background is None
    assert check_dataset(ds.root) == []
    overall = run.alpha[-1]
    assert overall.group == "(all)" and overall.n_photos == 7 and overall.n_annotators == 3
    assert overall.low <= overall.alpha <= overall.high
    by = {a.annotator: a for a in run.annotators}
    assert by["alice"].skipped == 1 and by["alice"].gold_n == 1 and by["alice"].gold_accuracy == 1.0
    assert {(c.first, c.second) for c in run.confused} >= {("shrub", "tree")}
    assert run.mask_iou and all(0 < m.iou <= 1 for m in run.mask_iou) and set(run.aggregated_mask_iou) == {
        "alice", "bob", "carol"}
    loaded = load_run(ds.root / "runs" / "agree")
    assert isinstance(loaded, AgreementRun) and loaded.photos_csv() == run.photos_csv()
    assert loaded.alpha == run.alpha and loaded.kappa[0].n_common == run.kappa[0].n_common
    assert ds.config["provenance"]["agreement"]["run"] == "agree"


def test_an_adjudicator_settles_a_dispute_and_a_wrong_gold_answer_is_reported(tmp_path):
    ds = team_folder(tmp_path, masks=False)
    ids = ds.sample_ids()
    upsert_annotations(ds, [Annotation("ls:adj:1", ids[2], "boss", "labelstudio", ("shrub",), role="adjudicator"),
                            Annotation("simulated:carol:" + ids[7], ids[7], "carol", "simulated", ("shrub",),
                                       is_gold=True)],
                       source="adjudication", actor="test")
    run = agreement(ds, None, AgreementSettings(rule="majority", replicates=10))
    decided = {d.sample_id: d for d in run.decisions}
    assert decided[ids[2]].status == "adjudicated" and decided[ids[2]].background == "shrub"
    assert Dataset.open(ds.root).row(ids[2])["background"] == "shrub"
    assert [(m.annotator, m.sample_id, m.answered) for m in run.gold_mistakes] == [("carol", ids[7], ("shrub",))]


def test_measure_only_leaves_the_folder_and_a_folder_without_annotations_is_refused(tmp_path):
    ds = team_folder(tmp_path, masks=False)
    before = pq.read_table(ds.root / "samples.parquet").column("background").to_pylist()
    agreement(ds, None, AgreementSettings(replicates=10, derive=False))
    assert pq.read_table(ds.root / "samples.parquet").column("background").to_pylist() == before
    assert not (ds.root / LABEL_STATUS_FILE).exists()
    bare = make_dataset(tmp_path / "bare", n=2, masks=False)
    with pytest.raises(ValueError, match="no annotations to measure.*curate review labelstudio.*curate simulate-annotators"):
        agreement(bare, None, AgreementSettings(replicates=10))
    with pytest.raises(ValueError, match="unknown aggregation rule"):
        agreement(ds, None, AgreementSettings(rule="vote"))


def test_a_hand_edited_label_status_is_named_by_check(tmp_path):
    ds = team_folder(tmp_path, masks=False)
    agreement(ds, None, AgreementSettings(rule="majority", replicates=10))
    path = ds.root / LABEL_STATUS_FILE
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[0]["status"] = "probably"
    rows[1]["background"] = None
    pq.write_table(table.from_pylist(rows, schema=table.schema), path)
    messages = [p.message for p in check_dataset(ds.root)]
    assert any("status 'probably'" in m for m in messages) and any("without a background" in m for m in messages)
    assert any("differs from the derived one" in m for m in messages)


def test_cli_prints_the_agreement_and_kappa_tables(tmp_path):
    ds = team_folder(tmp_path, masks=False)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        main, ["agreement", str(ds.root), "--rule", "majority", "--replicates", "50", "--run-name", "a1"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "Krippendorff's alpha" in text and "Cohen's kappa" in text and "(all)" in text
    assert "disputed 2" in text and "alice" in text and "runs/a1" in text.replace("\\", "/")
    # every figure says what it means: undefined alpha, the set agreement, the confusion counts
    assert "— = undefined" in text and "sets agree: share of" in text and "agreement with the rest: share" in text
    assert "most confused (times two annotators gave the pair to one photo): " in text
    again = CliRunner().invoke(main, ["agreement", str(ds.root), "--threshold", "2"])
    assert again.exit_code == 1 and "outside [0, 1]" in again.output


def test_a_derivation_stopped_between_its_two_writes_leaves_a_valid_folder(tmp_path, monkeypatch):
    """derive_backgrounds writes label_status.parquet, then samples.parquet: a stop between the two
    (here the update raises, as a kill would leave it) is a warning, and the next run cures it."""
    ds = team_folder(tmp_path, masks=False)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Dataset, "update", stopped)
    with pytest.raises(KeyboardInterrupt):
        agreement(ds, None, AgreementSettings(rule="majority", replicates=10), run_name="stopped")
    monkeypatch.undo()
    problems = check_dataset(ds.root)
    assert problems and all(p.severity == "warning" for p in problems), problems
    assert "run `curate agreement` again" in problems[0].message
    Dataset.open(ds.root)  # opens: a warning is no refusal
    agreement(ds, None, AgreementSettings(rule="majority", replicates=10))
    assert check_dataset(ds.root) == []


def test_cli_prints_annotator_names_as_written(tmp_path):
    """Names come from a review server: one that reads as console markup is printed as written, not
    interpreted (a closing tag with nothing to close stopped the command)."""
    ds = make_dataset(tmp_path / "d", n=3, masks=False)
    ids = ds.sample_ids()
    names = ("ann[/b]@x.org", "[bold]bob@x.org")
    rows = [Annotation(f"simulated:{k}:{s}", s, who, "simulated", ("grass",) if i else ("tree",), is_gold=i == 0)
            for k, who in enumerate(names) for i, s in enumerate(ids)]
    upsert_annotations(ds, rows, source="simulated", actor="test")
    write_gold(ds, {ids[0]: "grass"}, actor="lead")
    result = CliRunner(env={"COLUMNS": "250"}).invoke(main, ["agreement", str(ds.root), "--replicates", "5"])
    assert result.exit_code == 0, result.output
    assert "ann[/b]@x.org" in result.output and "[bold]bob@x.org" in result.output
    assert "gold answered wrongly by ann[/b]@x.org" in result.output
