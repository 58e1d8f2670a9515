"""The split on agreed labels (issue 44): disputed and unlabelled photos are left out and counted,
a single annotator's labels can be split on for comparison, and old folders split as before."""
from __future__ import annotations

import pytest
from click.testing import CliRunner
from review_helpers import write_run

from curate.cli import main
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.runs.split import SplitRun
from curate.stages.agreement import AgreementSettings, agreement
from curate.stages.split import SplitSettings, split
from curate.store import Dataset
from curate.store.annotations import Annotation, upsert_annotations

SETTINGS = dict(min_per_background=3, n_boot=20, n_perm=20, crossfit_repeats=2, predictions=("ref",))


@pytest.fixture()
def labelled(tmp_path) -> Dataset:
    """A synthetic world (snow, water) whose photos alice and bob labelled: they agree on all but 5
    (disputed) and both skipped 2 (unlabelled); carol labelled 4 more, each with the other background."""
    ds = collect_synthetic(tmp_path / "w", WorldSpec(classes=DEFAULT_CLASSES[:2], per_class=20, image_size=16,
                                                     p=0.5, seed=0))
    write_run(ds, "ref")
    other = {"snow": "water", "water": "snow"}
    rows = [Annotation(f"simulated:{who}:{r['sample_id']}", r["sample_id"], who, "simulated",
                       () if i in (5, 6) else (other[r["background"]],) if who == "bob" and i < 5 else (r["background"],))
            for i, r in enumerate(ds.rows()) for who in ("alice", "bob")]
    extra = [Annotation(f"simulated:carol:{r['sample_id']}", r["sample_id"], "carol", "simulated",
                        (other[r["background"]],))
             for r in ds.rows()[7:11]]
    upsert_annotations(ds, rows + extra, source="simulated", actor="test")
    return ds


def test_split_leaves_out_and_counts_disputed_photos_after_agreement(labelled):
    before = split(labelled, None, SplitSettings(**SETTINGS))
    assert before.label_use.labels == "folder" and before.label_use.left_out == {}  # no status yet: as before
    assert before.label_use.used == {"no status": 40}
    agreement(labelled, None, AgreementSettings(rule="majority", replicates=10))
    after = split(labelled, None, SplitSettings(**SETTINGS))
    # photos 7-10: alice, bob agree, carol says the other -> 2 vs 1, agreed; 0-4: alice vs bob -> tie, disputed
    assert after.label_use.left_out == {"disputed": 5, "unlabelled": 2}
    assert after.label_use.used == {"agreed": 33}
    assert SplitRun.load(after.run_dir).label_use == after.label_use
    grouped = {r["sample_id"]: r["group"] for r in Dataset.open(labelled.root).rows()}
    assert all(grouped[r["sample_id"]] is None for r in Dataset.open(labelled.root).rows() if r["background"] is None)


def test_split_on_one_annotators_labels_leaves_the_folders_groups(labelled):
    agreement(labelled, None, AgreementSettings(rule="majority", replicates=10))
    split(labelled, None, SplitSettings(**SETTINGS), run_name="agreed")
    groups = [r["group"] for r in Dataset.open(labelled.root).rows()]
    provenance = Dataset.open(labelled.root).config["provenance"]["split"]["run"]
    carol = split(labelled, None, SplitSettings(**SETTINGS, annotator="carol"))
    assert carol.label_use.labels == "annotator:carol" and carol.label_use.left_out == {"not answered": 36}
    assert carol.label_use.used == {"no status": 4} and carol.changed == 0
    assert [r["group"] for r in Dataset.open(labelled.root).rows()] == groups
    assert Dataset.open(labelled.root).config["provenance"]["split"]["run"] == provenance == "agreed"
    with pytest.raises(ValueError, match="no annotator 'dave'.*alice, bob, carol"):
        split(labelled, None, SplitSettings(**SETTINGS, annotator="dave"))


def test_cli_split_prints_what_it_left_out(labelled):
    agreement(labelled, None, AgreementSettings(rule="majority", replicates=10))
    result = CliRunner().invoke(main, ["split", str(labelled.root), "--predictions", "ref", "--min-per-background", "3",
                                       "--n-boot", "20", "--n-perm", "20", "--crossfit-repeats", "2"],
                                terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "labels: folder; photos left out for their label: disputed 5, unlabelled 2" in result.output
    one = CliRunner().invoke(main, ["split", str(labelled.root), "--predictions", "ref", "--min-per-background", "3",
                                    "--n-boot", "20", "--n-perm", "20", "--crossfit-repeats", "2", "--annotator",
                                    "alice"], terminal_width=200)
    assert one.exit_code == 0 and "labels: annotator:alice; photos left out for their label: not answered 2" in \
        one.output, one.output
