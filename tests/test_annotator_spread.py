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
