"""The drop's spread over labellings (curate.metrics.annotator_spread), computed by hand (issue 44)."""
from __future__ import annotations

import numpy as np
import pytest

from curate.metrics.annotator_spread import AGREED, DISPUTED_EASY, DISPUTED_HARD, annotator_spread
from curate.metrics.split_rule import SplitRule

RULE = SplitRule(min_per_background=1, n_boot=20, n_perm=20, crossfit_folds=0)
IDS = [f"s{i}" for i in range(8)]
AGREED_LABELS = {"s0": "a", "s1": "a", "s2": "b", "s3": "b", "s4": "c", "s5": "c", "s6": None, "s7": "a"}
# reference: a 3/3, b 0/2, c 1/2 under the agreed labels -> easy a, hard b
REFERENCE = np.array([1, 1, 0, 0, 1, 0, 0, 1], dtype=float)
MODEL = np.array([1, 0, 1, 1, 0, 0, 0, 1], dtype=float)


def _spread(**labellings):
    return annotator_spread(IDS, [0] * 8, {AGREED: AGREED_LABELS, **labellings}, REFERENCE, {"m": MODEL}, RULE,
                            disputed={"s6": ("a", "b")})


def _drop(spread, labelling):
    (cell,) = [c for c in spread.cells if c.labelling == labelling]
    return cell


def test_drops_by_hand_under_each_labelling_and_the_disputed_bounds():
    # annotator x calls s2 c and s4 b: b = {s3 0, s4 1} -> 0.5, c = {s2 0, s5 0} -> 0: hard becomes c
    spread = _spread(x={**AGREED_LABELS, "s2": "c", "s4": "b"})
    agreed = _drop(spread, AGREED)
    assert (agreed.easy, agreed.hard, agreed.n_easy, agreed.n_hard) == ("a", "b", 3, 2)
    assert agreed.drop == pytest.approx(2 / 3 - 1.0)  # easy {s0 1, s1 0, s7 1}, hard {s2 1, s3 1}
    x = _drop(spread, "x")
    assert (x.easy, x.hard) == ("a", "c") and x.drop == pytest.approx(2 / 3 - 0.5)  # hard {s2 1, s5 0}
    # disputed s6 (answers a or b; model wrong on it) put in easy, then in hard, with the agreed pair
    assert _drop(spread, DISPUTED_EASY).drop == pytest.approx(0.5 - 1.0) and _drop(spread, DISPUTED_EASY).n_easy == 4
    assert _drop(spread, DISPUTED_HARD).drop == pytest.approx(2 / 3 - 2 / 3) and _drop(spread, DISPUTED_HARD).n_hard == 3
    assert spread.spread("m", 0) == pytest.approx((2 / 3 - 0.5) - (0.5 - 1.0))
    assert spread.disputed == 1
    (flip,) = spread.flips()[0]
    assert (flip.labelling, flip.easy, flip.hard) == ("x", "a", "c")


def test_a_labelling_that_keeps_the_pair_is_not_flagged_and_a_dropped_class_is():
    same_pair = _spread(y={**AGREED_LABELS, "s4": "a"})  # c {s5 0} ties b at 0; b has more photos: still hard
    assert same_pair.flips() == {}
    all_one = _spread(z=dict.fromkeys(IDS, "a"))  # one background: the class cannot be split
    (flip,) = all_one.flips()[0]
    assert flip.labelling == "z" and not flip.kept


def test_a_disputed_photo_nobody_put_in_either_background_stays_out():
    spread = annotator_spread(IDS, [0] * 8, {AGREED: AGREED_LABELS}, REFERENCE, {"m": MODEL}, RULE,
                              disputed={"s6": ("c",)})
    assert _drop(spread, DISPUTED_EASY).n_easy == 3 and _drop(spread, DISPUTED_HARD).n_hard == 2


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no 'agreed'"):
        annotator_spread(IDS, [0] * 8, {"x": AGREED_LABELS}, REFERENCE, {"m": MODEL}, RULE)
    with pytest.raises(ValueError, match="correctness values for 8"):
        annotator_spread(IDS, [0] * 8, {AGREED: AGREED_LABELS}, REFERENCE, {"m": MODEL[:3]}, RULE)


def test_the_run_record_round_trips_and_tables_show_drops_spread_and_flips(tmp_path):
    from curate.runs.annotator_spread import AnnotatorSpreadRun, SpreadModel
    from curate.runs.base import load_run

    spread = _spread(x={**AGREED_LABELS, "s2": "c", "s4": "b"})
    record = AnnotatorSpreadRun(split_run="split-1", spread=spread, models=[SpreadModel("m", "eval-m")],
                                class_names={0: "lion"}, photos=8)
    record.write(tmp_path / "runs" / "spread")
    loaded = load_run(tmp_path / "runs" / "spread")
    assert isinstance(loaded, AnnotatorSpreadRun)
    assert loaded.spread.cells == spread.cells and loaded.spread.splits == spread.splits
    assert loaded.columns == [AGREED, "x", DISPUTED_EASY, DISPUTED_HARD]
    (row,) = loaded.rows()
    assert row.flagged and row.spread == pytest.approx(2 / 3)
    assert row.drops[AGREED] == pytest.approx(-1 / 3) and row.drops["x"] == pytest.approx(1 / 6)
    assert loaded.flag_text(0) == "flips: x a/b -> a/c"
    table = (tmp_path / "runs" / "spread" / AnnotatorSpreadRun.MARKDOWN).read_text()
    assert "| 0 lion | -33.3 | 16.7 | -50.0 | 0.0 | 66.7 | flips: x a/b -> a/c |" in table


def _fake_run(ds, name: str, model_id: str, rate_by_background: dict[str, float], seed: int) -> str:
    """An evaluation run whose top-1 correctness depends on the photo's background only."""
    import pyarrow as pa

    from curate.runs.evaluation import EvaluationRun
    from curate.stages.evaluate import compute_metrics

    rng = np.random.default_rng(seed)
    rows = ds.rows()
    correct = [bool(rng.random() < rate_by_background[r["background"]]) for r in rows]
    table = pa.table({
        "sample_id": [r["sample_id"] for r in rows], "class_index": [r["class_index"] for r in rows],
        "group": [r["group"] for r in rows], "background": [r["background"] for r in rows],
        "topk_labels": [[r["class_index"] if ok else 0] for r, ok in zip(rows, correct)],
        "topk_scores": [[1.0] for _ in rows], "correct1": correct, "correct5": correct})
    metrics = compute_metrics(np.array([[r["class_index"] if ok else 0] for r, ok in zip(rows, correct)]),
                              np.array([r["class_index"] for r in rows]), np.array([r["group"] for r in rows], object),
                              np.array([r["background"] for r in rows], object), ds.label_space.names,
                              candidates_per_sample=None, n_boot=20)
    EvaluationRun(model={"name": model_id, "pretrained": None, "model_id": model_id, "family": "clip"},
                  label_space={"name": "imagenet1k"}, prompts={"name": "simple", "templates": ["A photo of {}."]},
                  settings={}, dataset={}, metrics=metrics, predictions_table=table).write(ds.root / "runs" / name)
    return name


def test_the_stage_reads_runs_and_annotations_and_compare_and_report_show_it(tmp_path):
    """End to end on a two-class world (lion on grass, cicada on tree) labelled by a simulated team:
    split (from a fake reference run), the spread stage over two fake models, then compare and report."""
    from click.testing import CliRunner

    from curate.cli import main
    from curate.collect.annotator_sim import simulate_annotators
    from curate.collect.synthetic import WorldSpec, classes_by_name, collect_synthetic
    from curate.compare import compare_runs
    from curate.report import build_report
    from curate.runs.annotator_spread import AnnotatorSpreadRun
    from curate.stages.annotator_spread import SpreadSettings, agreement_rule, annotator_spread
    from curate.stages.split import SplitSettings, split

    ds = collect_synthetic(tmp_path / "w", WorldSpec(classes=classes_by_name(("lion", "cicada", "polar bear")),
                                                     per_class=30, image_size=16, p=0.6, seed=2))
    rates = {"grass": 0.9, "tree": 0.5, "snow": 0.2}
    ref = _fake_run(ds, "ref", "ref", rates, 0)
    split(ds.root, None, SplitSettings(min_per_background=3, n_boot=50, n_perm=50, crossfit_repeats=2,
                                       predictions=(ref,)))
    _fake_run(ds, "eval-a", "a", rates, 1)
    _fake_run(ds, "eval-b", "b", {"grass": 0.6, "tree": 0.6, "snow": 0.6}, 2)
    with pytest.raises(ValueError, match="no annotator's answer"):
        annotator_spread(ds.root, None, SpreadSettings(), run_name="too-early")
    assert not (ds.root / "runs" / "too-early").exists()
    simulate_annotators(ds, "careful:0.05,confuse:grass-tree:0.5,random:0.3", seed=1)
    ds.record_provenance("agreement", {"rule": "majority", "threshold": 0.5})  # as `curate agreement` records it
    assert agreement_rule(ds, SpreadSettings()) == ("majority", 0.5)
    assert agreement_rule(ds, SpreadSettings(rule="dawid-skene")) == ("dawid-skene", None)
    record = annotator_spread(ds.root, None, SpreadSettings(runs=("eval-a", "eval-b")), run_name="spread")
    assert isinstance(record, AnnotatorSpreadRun) and record.photos == 90
    assert (record.rule, record.threshold) == ("majority", 0.5)
    assert AnnotatorSpreadRun.load(record.run_dir).rule == "majority"
    assert record.spread.labellings == [AGREED, "careful", "confuse", "random"]
    assert [m.model for m in record.models] == ["a", "b"] and {c.model for c in record.spread.cells} == {"a", "b"}
    rows, folder = compare_runs(ds.root)
    text = (folder / "compare.md").read_text()
    assert "## How much the drop depends on who labelled (`spread`)" in text and "| class | agreed | careful" in text
    result = CliRunner().invoke(main, ["compare", str(ds.root)], terminal_width=250)
    assert result.exit_code == 0, result.output
    assert "drop by who labelled" in result.output and "confuse" in result.output
    report = build_report(ds.root).read_text()
    assert "## How much the drop depends on who labelled" in report
    assert (ds.root / "runs" / "report" / "spread_spread_0.png").is_file()
    cli = CliRunner().invoke(main, ["annotator-spread", str(ds.root), "--run", "eval-a", "--rule", "majority",
                                    "--run-name", "spread-cli"], terminal_width=250)
    assert cli.exit_code == 0, cli.output
    assert "drop by who labelled" in cli.output and "class(es) flagged" in cli.output
    with pytest.raises(ValueError, match="no finished evaluation run named nope"):
        annotator_spread(ds.root, None, SpreadSettings(runs=("nope",)), run_name="bad")


def test_the_spread_table_prints_annotator_names_as_written():
    """Annotator names come from a review server: the printed table shows them as written, never as console
    markup (a closing tag with nothing to close stopped `curate annotator-spread` and `curate compare`)."""
    import io

    from rich.console import Console

    from curate.cli.annotators import spread_table
    from curate.runs.annotator_spread import AnnotatorSpreadRun, SpreadModel

    name = "x[/b]@y.org"
    record = AnnotatorSpreadRun(split_run="split-1", spread=_spread(**{name: {**AGREED_LABELS, "s2": "c", "s4": "b"}}),
                                models=[SpreadModel("m", "eval-m")], class_names={0: "lion[/i]"}, photos=8)
    console = Console(file=io.StringIO(), width=300, color_system=None)
    console.print(spread_table(record))
    text = console.file.getvalue()
    assert name in text and "0 lion[/i]" in text and f"flips: {name} a/b -> a/c" in text
