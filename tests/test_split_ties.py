"""Issue 28 (split): ties between candidate backgrounds, the "nothing to split" messages, the
record that writes no figures, and a loaded model as the reference."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from split_helpers import by_class, table

from curate.jsonio import write_json
from curate.runs.split import LabelSources, SplitClass, SplitRun
from curate.split.discovery import SplitRule, discover
from curate.stages.split import SplitSettings, split
from curate.store import Dataset, NewSample

RULE = SplitRule(min_per_background=2, n_boot=50, n_perm=50, crossfit_repeats=2)


# -- defect 1: ties -------------------------------------------------------------------------
def test_a_tie_for_easy_follows_the_stated_rule_and_is_recorded() -> None:
    """Two backgrounds at 100%: equal n -> name order; more images -> the larger one."""
    c, b, y = table((1, "water", [1, 1, 1, 1]), (1, "sand", [1, 1, 1, 1]), (1, "grass", [0, 0, 1, 0]),
                    (2, "water", [1] * 6), (2, "sand", [1] * 4), (2, "grass", [0, 0, 0, 1]),
                    (3, "snow", [1, 1, 1]), (3, "grass", [0, 0, 0]), (3, "dirt", [0, 0, 0]))
    s = by_class(discover(c, b, y, RULE))
    assert (s[1].easy, s[1].easy_ties, s[1].hard, s[1].hard_ties) == ("sand", ("sand", "water"), "grass", ())
    assert (s[2].easy, s[2].easy_ties) == ("water", ("water", "sand"))  # more images wins
    assert (s[3].easy, s[3].easy_ties, s[3].hard, s[3].hard_ties) == ("snow", (), "dirt", ("dirt", "grass"))
    assert all(x.kept for x in s.values())


def test_no_tie_records_no_ties() -> None:
    c, b, y = table((1, "snow", [1, 1, 1, 1]), (1, "grass", [0, 0, 1, 0]), (1, "water", [1, 0, 1, 1]))
    s = by_class(discover(c, b, y, RULE))[1]
    assert (s.easy, s.hard, s.easy_ties, s.hard_ties) == ("snow", "grass", (), ())


def test_equal_accuracies_that_differ_by_rounding_are_a_tie() -> None:
    """Three models: beach's per-sample means sum to 0.49999999999999994, cave's to 0.5 -- the same
    accuracy, so the tie rule (equal n -> name order) decides, not the last bit of a float."""
    per_sample = {"beach": [3, 0, 2, 1], "cave": [3, 0, 0, 3], "dirt": [0, 0, 0, 0]}  # models right, of 3
    backgrounds = [bg for bg, counts in per_sample.items() for _ in counts]
    counts = [k for bg_counts in per_sample.values() for k in bg_counts]
    correct = np.array([[1.0 if m < k else 0.0 for k in counts] for m in range(3)])
    s = discover([1] * len(counts), backgrounds, correct, RULE)[0]
    assert s.cells[0].accuracy != s.cells[1].accuracy  # the floats really differ
    assert (s.easy, s.easy_ties) == ("beach", ("beach", "cave"))


def test_all_tied_backgrounds_are_dropped_and_pins_have_no_ties() -> None:
    c, b, y = table((1, "snow", [1, 1]), (1, "grass", [1, 1]), (1, "sky", [1, 1]))
    s = discover(c, b, y, RULE)[0]
    assert not s.kept and s.easy_ties == ("grass", "sky", "snow") and s.hard_ties == ("sky", "snow")
    pinned = discover(c, b, y, RULE, pins={1: ("snow", "sky")})[0]
    assert pinned.kept and (pinned.easy_ties, pinned.hard_ties) == ((), ())


def _record(tmp_path) -> SplitRun:
    c, b, y = table((100, "water", [1, 1, 1, 1]), (100, "sand", [1, 1, 1, 1]), (100, "grass", [0, 0, 0, 1]),
                    (296, "snow", [1, 1, 1, 1]), (296, "grass", [0, 0, 0, 0]))
    names = {100: "black swan", 296: "ice bear"}
    decisions = discover(c, b, y, RULE)
    record = SplitRun(rule=RULE, references=[], classes=[SplitClass.from_split(d, names[d.class_index]) for d in decisions],
                      label_sources=LabelSources(synthetic=len(c)), changed=0)
    record.write(tmp_path / "run")
    return record


NOTE = "tie: easy chosen among sand (n 4), water (n 4), all at 100.00%: sand, by name order"


def test_the_record_and_the_tables_name_the_tie(tmp_path) -> None:
    record = _record(tmp_path)
    run_dir = tmp_path / "run"
    swan = record.by_class()[100]
    assert (swan.easy, swan.easy_ties, swan.hard_ties) == ("sand", ("sand", "water"), ())
    assert swan.tie_notes and swan.tie_notes[0].startswith(NOTE)
    assert record.by_class()[296].tie_notes == []
    md = (run_dir / "split.md").read_text()
    assert "| 100 black swan | sand (tie) |" in md and NOTE in md
    assert "then more images, then name order" in md  # the rule is stated with the table
    rows = {r["class_index"]: r for r in csv.DictReader(io.StringIO((run_dir / "split.csv").read_text()))}
    assert rows["100"]["easy_ties"] == "sand;water" and rows["100"]["hard_ties"] == ""
    assert rows["100"]["tie_note"].startswith(NOTE) and rows["296"]["tie_note"] == ""
    assert json.loads((run_dir / "config.json").read_text())["record_version"] == 3
    summary = json.loads((run_dir / "split.json").read_text())
    assert summary["classes"][0]["easy_ties"] == ["sand", "water"]
    loaded = SplitRun.load(run_dir)
    assert loaded.by_class()[100].easy_ties == ("sand", "water") and loaded.by_class()[296].easy_ties == ()


def test_a_version_2_run_loads_with_its_ties_derived_from_the_cells(tmp_path) -> None:
    _record(tmp_path)
    run_dir = tmp_path / "run"
    config = json.loads((run_dir / "config.json").read_text())
    write_json(run_dir / "config.json", {**config, "record_version": 2})
    summary = json.loads((run_dir / "split.json").read_text())
    for row in summary["classes"]:
        del row["easy_ties"], row["hard_ties"]
    write_json(run_dir / "split.json", summary)
    old = SplitRun.load(run_dir)
    assert old.by_class()[100].easy_ties == ("sand", "water") and old.by_class()[296].easy_ties == ()
    assert old.by_class()[100].tie_notes[0].startswith(NOTE)


# -- defect 2: why there is nothing to split ---------------------------------------------------
def _folder(tmp_path, status: str, background: str | None) -> Dataset:
    ds = Dataset.create(tmp_path / "d", backgrounds=["snow", "grass"])
    rng = np.random.default_rng(0)
    ds.add_samples([NewSample(image=Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)), class_index=296,
                              status=status, background=background, background_source="model" if background else None)
                    for _ in range(3)])
    return ds


def test_labelled_but_not_accepted_says_so_and_how_to_accept(tmp_path) -> None:
    ds = _folder(tmp_path, "candidate", "snow")
    with pytest.raises(ValueError) as error:
        split(ds, None, SplitSettings(predictions=("ref",)))
    text = str(error.value)
    assert "3 sample(s) have a background label but none is accepted (3 candidate)" in text
    assert "curate review fiftyone" in text and "label backgrounds first" not in text


def test_accepted_but_unlabelled_says_to_label_backgrounds(tmp_path) -> None:
    ds = _folder(tmp_path, "accepted", None)
    with pytest.raises(ValueError) as error:
        split(ds, None, SplitSettings(predictions=("ref",)))
    text = str(error.value)
    assert "no sample has a background label" in text and "curate label-backgrounds" in text
    assert "3 accepted" in text


# -- defect 3: the record imports no figure code --------------------------------------------------
def test_writing_a_split_record_imports_no_figure_code(tmp_path) -> None:
    """The run record writes its JSON and text tables without matplotlib or the figure module; the
    figures are the stage's (the record written on its own has none)."""
    code = ("import sys, pathlib; import numpy as np; from curate.runs.split import SplitClass, SplitRun; "
            "from curate.split.discovery import SplitRule, discover; "
            "rule = SplitRule(min_per_background=2, n_boot=20, n_perm=20, crossfit_repeats=1); "
            "d = discover([1] * 8, ['snow'] * 4 + ['grass'] * 4, np.array([1, 1, 1, 1, 0, 0, 0, 0.]), rule); "
            "SplitRun(rule=rule, references=[], classes=[SplitClass.from_split(x, 'c') for x in d])"
            f".write(pathlib.Path({str(tmp_path / 'run')!r})); "
            "print(sorted(m for m in ('matplotlib', 'curate.split.tables', 'curate.stages') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert not (tmp_path / "run" / SplitRun.FIG_COUNTS).exists()  # figures are the stage's
    assert (tmp_path / "run" / "split.md").exists() and (tmp_path / "run" / "config.json").exists()


# -- defect 4: a loaded model as the reference ----------------------------------------------------
def test_a_loaded_model_is_a_reference_and_the_run_says_what_was_passed(tmp_path) -> None:
    from curate.labels import LabelSpace
    from curate.models import load_model
    from curate.runs.evaluation import EvaluationRun

    ds = Dataset.create(tmp_path / "d", label_space=LabelSpace.from_names("pets", ["cat", "dog"]),
                        backgrounds=["snow", "grass"])  # 1 vs 2: no 1000 prompts to encode
    rng = np.random.default_rng(0)
    ds.add_samples([NewSample(image=Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)), class_index=c,
                              status="accepted", background=bg, background_source="human")
                    for c in (0, 1) for bg in ("snow", "grass") for _ in range(3)])
    loaded = load_model("curate-tiny-vit", None, device="cpu", seed=3)
    settings = SplitSettings(min_per_background=2, n_boot=20, n_perm=20, crossfit_repeats=1, device="cpu")
    result = split(ds, loaded, settings)  # before issue 28: TypeError, 'ClipModel' object is not iterable
    (reference,) = result.references
    assert reference.model_id == loaded.model_id == "open_clip:curate-tiny-vit:random-seed3"
    assert (reference.name, reference.pretrained, reference.passed) == ("curate-tiny-vit", None, "loaded")
    evaluation = EvaluationRun.load(ds.root / "runs" / reference.run)
    assert evaluation.model_id == loaded.model_id and reference.label_space == "dataset:pets"
    assert len(result.classes) == 2 and SplitRun.load(result.run_dir).references == result.references
    assert Dataset.open(ds.root).provenance["split"]["references"][0]["passed"] == "loaded"


def test_references_may_be_specs_names_files_loaded_models_or_a_list_of_them() -> None:
    from curate.models import ModelSpec
    from curate.stages.split import _references

    class Loaded:
        kind, model_id = "clip", "bare:1"

    loaded = Loaded()
    assert _references(None) == [] and _references("curate-tiny-vit") == [ModelSpec("curate-tiny-vit", None)]
    assert _references(ModelSpec("a", "b")) == [ModelSpec("a", "b")] and _references(loaded) == [loaded]
    assert _references(["x", loaded]) == [ModelSpec("x", None), loaded]
    Loaded.model_id = None
    with pytest.raises(TypeError, match="model_id"):
        _references(Loaded())


def test_a_split_on_finished_runs_records_predictions_and_shows_its_ties(tmp_path) -> None:
    from test_stage_split import fake_run, with_runs

    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic

    world = collect_synthetic(tmp_path / "w", WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=40, image_size=16,
                                                        p=0.5, seed=0))
    result = split(world.root, None, with_runs(fake_run(world, "ref", {"snow": 1.0, "water": 1.0, "sky": 1.0})))
    assert [r.passed for r in result.references] == ["predictions"]
    tied = [s for s in result.classes if s.easy_ties]
    assert tied  # every background at 100%: each class's easy is a tie (and its drop 0)
    rows = list(csv.DictReader(io.StringIO((result.run_dir / "split.csv").read_text())))
    assert all(r["tie_note"].startswith("tie: easy chosen among") for r in rows if r["easy_ties"])
