"""curate.masks.measure: IoU, DAVIS boundary F, baselines, measuring a mask run, review verdicts."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.masks.measure import (
    boundary_f,
    boundary_map,
    boundary_tolerance,
    centre_box,
    format_measurement,
    format_verdicts,
    iou,
    measure_run,
    review_verdicts,
    whole_image,
    wilson_interval,
)
from curate.masks.sources import model_status
from curate.runs.masks import MaskRun, proposals_table
from curate.store import Dataset

MODEL_ID = "tiny-seg"


def square(size: int, top: int, left: int, side: int) -> np.ndarray:
    mask = np.zeros((size, size), dtype=bool)
    mask[top:top + side, left:left + side] = True
    return mask


# ----------------------------------------------------------------------------- formulas by hand
def test_iou_by_hand() -> None:
    truth = square(20, 5, 5, 5)                      # 25 pixels
    shifted = square(20, 5, 7, 5)                    # overlaps in columns 7..9: 15 pixels
    assert iou(shifted, truth) == pytest.approx(15 / 35)
    assert iou(truth, truth) == 1.0
    assert iou(np.zeros_like(truth), truth) == 0.0
    assert math.isnan(iou(np.zeros((3, 3)), np.zeros((3, 3))))
    assert iou(truth.astype(np.uint8) * 7, truth) == 1.0   # any non-zero value is foreground
    with pytest.raises(ValueError, match="differ in size"):
        iou(np.ones((3, 3)), np.ones((3, 4)))


def test_boundary_map_is_davis_seg2bmap() -> None:
    # a 5x5 square at rows/cols 5..9: DAVIS marks the outline of rows/cols 4..9 (pixels that differ from
    # their right, lower or lower-right neighbour), 6 + 6 + 4 + 4 = 20 pixels
    bmap = boundary_map(square(20, 5, 5, 5))
    expected = np.zeros((20, 20), dtype=bool)
    expected[4, 4:10] = expected[9, 4:10] = expected[4:10, 4] = expected[4:10, 9] = True
    assert np.array_equal(bmap, expected)
    assert not boundary_map(np.ones((6, 5))).any()            # the image's edge is no boundary
    assert not boundary_map(np.zeros((6, 5))).any()


def test_boundary_f_shifted_square_by_hand() -> None:
    truth = square(20, 5, 5, 5)
    pred = square(20, 5, 7, 5)   # shifted right by 2: outlines rows 4..9 x cols 4..9 and cols 6..11
    # d = 0: only the 8 shared pixels of the top and bottom rows (cols 6..9) match: P = R = 8/20
    assert boundary_f(pred, truth, tolerance=0) == pytest.approx(0.4)
    # d = 1: + the 2 pixels one column past the other's corner (col 10 / col 5 in rows 4 and 9)
    #        + the 2 side pixels next to the other's top/bottom row: P = R = 12/20
    assert boundary_f(pred, truth, tolerance=1) == pytest.approx(0.6)
    # d = 2: every pixel of each outline is within 2 of the other: P = R = 1
    assert boundary_f(pred, truth, tolerance=2) == pytest.approx(1.0)
    # DAVIS's default for a 20x20 image: ceil(0.008 * sqrt(800)) = ceil(0.226) = 1 pixel
    assert boundary_tolerance(20, 20) == 1
    assert boundary_f(pred, truth) == pytest.approx(0.6)
    assert boundary_tolerance(480, 854) == 8                    # DAVIS's 480p frames: ceil(7.84)


def test_boundary_f_empty_boundaries_follow_davis() -> None:
    truth = square(12, 3, 3, 4)
    empty = np.zeros_like(truth)
    assert boundary_f(empty, truth) == 0.0                      # P = 1, R = 0
    assert boundary_f(truth, empty) == 0.0                      # P = 0, R = 1
    assert boundary_f(empty, empty) == 1.0                      # P = R = 1 (DAVIS), unlike IoU
    assert boundary_f(whole_image(12, 12), truth) == 0.0        # the whole image has no boundary
    with pytest.raises(ValueError, match="tolerance"):
        boundary_f(truth, truth, tolerance=-1)


def test_baselines() -> None:
    box = centre_box(4, 6)                                      # h = 2, w = 3, top = 1, left = 1
    expected = np.zeros((4, 6), dtype=bool)
    expected[1:3, 1:4] = True
    assert np.array_equal(box, expected)
    assert centre_box(5, 5).sum() == 4 and centre_box(5, 5)[1:3, 1:3].all()
    assert centre_box(1, 1).all()
    assert whole_image(3, 2).shape == (3, 2) and whole_image(3, 2).all()
    truth = square(20, 5, 5, 10)                                # 100 of 400 pixels, the centre box exactly
    assert iou(centre_box(20, 20), truth) == 1.0
    assert iou(whole_image(20, 20), truth) == pytest.approx(0.25)   # the object's share of the image
    with pytest.raises(ValueError):
        centre_box(0, 4)


def test_wilson_interval_known_values() -> None:
    low, high = wilson_interval(2, 5)                           # p = 0.4, n = 5, z = 1.96
    assert (low, high) == (pytest.approx(0.1176, abs=1e-4), pytest.approx(0.7693, abs=1e-4))
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


# ----------------------------------------------------------------------------- properties
@st.composite
def mask_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    shape = draw(st.tuples(st.integers(1, 14), st.integers(1, 14)))
    return draw(arrays(bool, shape)), draw(arrays(bool, shape))


@settings(max_examples=150, deadline=None)
@given(mask_pairs())
def test_iou_properties(pair: tuple[np.ndarray, np.ndarray]) -> None:
    a, b = pair
    value = iou(a, b)
    if not (a.any() or b.any()):
        assert math.isnan(value)
        return
    assert 0.0 <= value <= 1.0
    assert value == iou(b, a)
    if a.any():
        assert iou(a, a) == 1.0
    # adding a truth pixel to the proposal, or removing a pixel outside the truth, never lowers IoU
    missed = np.argwhere(b & ~a)
    if len(missed):
        more = a.copy()
        more[tuple(missed[0])] = True
        assert iou(more, b) >= value
    wrong = np.argwhere(a & ~b)
    if len(wrong):
        fewer = a.copy()
        fewer[tuple(wrong[0])] = False
        if fewer.any() or b.any():
            assert iou(fewer, b) >= value


@settings(max_examples=150, deadline=None)
@given(mask_pairs(), st.integers(0, 4))
def test_boundary_f_properties(pair: tuple[np.ndarray, np.ndarray], tolerance: int) -> None:
    a, b = pair
    value = boundary_f(a, b, tolerance)
    assert 0.0 <= value <= 1.0
    assert value == pytest.approx(boundary_f(b, a, tolerance))
    assert boundary_f(a, a, tolerance) == 1.0
    # a wider tolerance matches at least as much
    assert boundary_f(a, b, tolerance + 1) >= value - 1e-12


@settings(max_examples=60, deadline=None)
@given(mask_pairs(), st.integers(0, 5))
def test_boundary_f_matches_brute_force_disk(pair: tuple[np.ndarray, np.ndarray], radius: int) -> None:
    """The row-wise disk dilation agrees with the definition: a boundary pixel matches when some
    boundary pixel of the other mask lies within Euclidean distance ``radius``."""
    a, b = pair
    ba, bb = boundary_map(a), boundary_map(b)
    pa, pb = np.argwhere(ba), np.argwhere(bb)
    if len(pa) == 0 or len(pb) == 0:
        return
    dist = np.sqrt(((pa[:, None, :] - pb[None, :, :]) ** 2).sum(-1))
    precision = (dist.min(axis=1) <= radius).mean()
    recall = (dist.min(axis=0) <= radius).mean()
    expected = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    assert boundary_f(a, b, radius) == pytest.approx(expected)


# ----------------------------------------------------------------------------- a run on a synthetic world
def world(tmp_path: Path, per_class: int) -> Dataset:
    return collect_synthetic(tmp_path / "world", WorldSpec(classes=DEFAULT_CLASSES[:2], per_class=per_class, seed=4))


def by_class(ds: Dataset) -> list[list[str]]:
    names = sorted({r["class_index"] for r in ds.rows()})
    return [[r["sample_id"] for r in ds.rows() if r["class_index"] == c] for c in names]


def write_run(ds: Dataset, proposals: dict[str, np.ndarray | None], *, applied: set[str] = frozenset(),
              tuned_on: list[str] | None = None, reasons: dict[str, str] | None = None,
              name: str = "masks-test") -> MaskRun:
    run_dir = ds.root / "runs" / name
    (run_dir / "masks").mkdir(parents=True)
    rows = []
    for sid, mask in proposals.items():
        found = mask is not None
        if found:
            Image.fromarray(mask.astype(np.uint8)).save(run_dir / "masks" / f"{sid}.png")
        rows.append({"sample_id": sid, "class_index": ds.row(sid)["class_index"], "prompt": "a photo of a thing",
                     "found": found, "score": 0.9 if found else None,
                     "reason": None if found else (reasons or {}).get(sid, "nothing_found: no pixel above 0.5"),
                     "mask_file": f"masks/{sid}.png" if found else None, "applied": sid in applied})
    config = {"model": {"spec": "tiny", "model_id": MODEL_ID, "info": {}},
              "settings": {"prompt": "a photo of a {class}", "threshold": 0.5},
              "dataset": {"name": ds.name, "samples": len(rows)},
              "counts": {"in_scope": len(rows), "found": sum(m is not None for m in proposals.values()),
                         "applied": len(applied)},
              "tuned_on": list(tuned_on or [])}
    MaskRun(config=config, proposals_rows=proposals_table(rows)).write(run_dir)
    return MaskRun.load(run_dir)


def dilate4(mask: np.ndarray) -> np.ndarray:
    out = mask.copy()
    out[1:] |= mask[:-1]
    out[:-1] |= mask[1:]
    out[:, 1:] |= mask[:, :-1]
    out[:, :-1] |= mask[:, 1:]
    return out


def test_measure_run_against_hand_computation(tmp_path: Path) -> None:
    ds = world(tmp_path, per_class=6)
    (a0, a1, a2, a3, a4, a5), (b0, b1, b2, b3, b4, b5) = by_class(ds)
    exact = {sid: ds.load_mask(sid) != 0 for sid in ds.sample_ids()}
    human_b3 = square(48, 10, 10, 20)
    ds.set_mask(b3, human_b3.astype(np.uint8), mask_status="human", actor="painter")   # human truth
    ds.set_mask(b4, None, mask_status="bad", actor="reviewer")                          # no truth
    ds.set_mask(b2, dilate4(exact[b2]).astype(np.uint8), mask_status=model_status(MODEL_ID), actor="propose")
    run = write_run(ds, {
        a0: exact[a0],                                   # perfect
        a1: dilate4(exact[a1]),                          # one pixel too wide all round
        a2: None,                                        # nothing found: scores 0
        a5: None,                                        # a mask of the wrong size was refused: scores 0
        b5: None,                                        # the image could not be read: a failure, left out
        a3: exact[a3],                                   # tuned on: left out
        a4: exact[a4],                                   # excluded by the caller
        b0: exact[b0],                                   # perfect
        b1: np.ones((24, 24), dtype=bool),               # another size than the truth: left out
        b2: dilate4(exact[b2]),                          # applied: its mask is the proposal, left out
        b3: exact[b3],                                   # against the human mask
        b4: exact[b4],                                   # rejected, no truth
    }, applied={b2}, tuned_on=[a3], reasons={a5: "wrong_size: the proposal is (24, 24) (w x h), the image 48x48",
                                             b5: "image_unreadable: OSError: truncated"})
    m = measure_run(ds, run, exclude=[a4])

    dil = dilate4(exact[a1])
    iou_a1 = exact[a1].sum() / dil.sum()                 # the truth lies inside the proposal
    iou_b3 = (exact[b3] & human_b3).sum() / (exact[b3] | human_b3).sum()
    f_a1 = boundary_f(dil, exact[a1])
    assert 0.5 <= iou_a1 < 0.9 and 0 < f_a1 <= 1

    scores = {s.sample_id: s for s in m.samples}
    assert set(scores) == {a0, a1, a2, a5, b0, b3}
    assert scores[a0].iou == 1.0 and scores[a0].boundary_f == 1.0
    assert scores[a1].iou == pytest.approx(iou_a1)
    assert scores[a2].iou == 0.0 and scores[a2].boundary_f == 0.0 and not scores[a2].found
    assert scores[a5].iou == 0.0 and not scores[a5].found
    assert scores[b3].iou == pytest.approx(iou_b3) and scores[b3].truth == "human"
    for sid, s in scores.items():
        truth = human_b3 if sid == b3 else exact[sid]
        assert s.centre_iou == pytest.approx(iou(centre_box(48, 48), truth))
        assert s.whole_iou == pytest.approx(truth.mean())
        assert s.whole_f == 0.0

    class_a, class_b = m.per_class
    assert (class_a.n, class_a.found, class_b.n, class_b.found) == (4, 2, 2, 2)
    assert class_a.iou == pytest.approx((1 + iou_a1 + 0 + 0) / 4)
    assert class_a.iou_50 == pytest.approx(2 / 4) and class_a.iou_75 == pytest.approx((1 + (iou_a1 >= 0.75)) / 4)
    assert class_a.boundary_f == pytest.approx((1 + f_a1 + 0 + 0) / 4)
    assert class_b.iou == pytest.approx((1 + iou_b3) / 2)
    assert m.overall.n == 6
    assert m.overall.iou == pytest.approx((1 + iou_a1 + 0 + 0 + 1 + iou_b3) / 6)
    assert m.balanced.iou == pytest.approx((class_a.iou + class_b.iou) / 2)
    assert m.overall.whole_iou == pytest.approx(np.mean([s.whole_iou for s in m.samples]))
    assert m.truth == {"human": 1, "exact": 5}
    assert m.left_out == {"from_this_proposal": 1, "no_truth": 1, "tuned_on": 1, "excluded": 1, "failed": 1,
                          "size_mismatch": 1}
    assert m.nothing_found_reasons == {"nothing_found": 1, "wrong_size": 1}
    low, high = m.iou_interval
    assert low <= m.overall.iou <= high

    data = m.as_dict()
    json.dumps(data, allow_nan=False)                    # JSON-ready: no NaN, no numpy scalars
    assert data["n"] == 6 and data["left_out"]["tuned_on"] == 1 and data["tuned_on_total"] == 1
    text = format_measurement(m)
    for needle in ("class", "mean IoU", "IoU>=0.5", "IoU>=0.75", "boundary F", "centre box IoU", "whole image F",
                   class_a.label, class_b.label, "all (mean over samples)", "all (mean over classes)",
                   "1 human and 5 exact", "1 sample with a trusted mask left out because the model was tuned on",
                   "learned nothing", "2 where the model found nothing", "1 the model did not run on it"):
        assert needle in text, needle


def test_measure_run_refuses_when_nothing_is_out_of_sample(tmp_path: Path) -> None:
    ds = world(tmp_path, per_class=1)
    ids = ds.sample_ids()
    run = write_run(ds, {sid: ds.load_mask(sid) != 0 for sid in ids}, tuned_on=ids)
    with pytest.raises(ValueError, match="human or exact mask that the model was not tuned on.*2 the model was tuned"):
        measure_run(ds, run)


def test_a_verified_earlier_proposal_is_no_truth_for_a_later_run(tmp_path: Path) -> None:
    """A mask that began as a proposal and that people accepted (``ok``) or repainted (``human``)
    keeps ``extra.mask_run``: measuring a later run of the same model against it would score the
    model against its own output, so it is left out (``from_a_proposal``) and said."""
    ds = world(tmp_path, per_class=2)
    accepted, repainted, exact, _ = ds.sample_ids()
    for sid, status in ((accepted, "ok"), (repainted, "human")):
        ds.set_masks({sid: ds.load_mask(sid)}, mask_status=status, extra_updates={sid: {"mask_run": "masks-old"}},
                     actor="review")
    run = write_run(ds, {sid: ds.load_mask(sid) != 0 for sid in (accepted, repainted, exact)})
    measured = measure_run(ds, run)
    assert measured.left_out == {"from_a_proposal": 2} and measured.overall.n == 1
    assert measured.truth.get("exact") == 1 and not measured.truth.get("human")
    assert "began as an earlier run's proposal" in format_measurement(measured)


def test_review_verdicts(tmp_path: Path) -> None:
    ds = world(tmp_path, per_class=5)
    (s0, s1, s2, s3, s4), (s5, s6, s7, s8, s9) = by_class(ds)
    applied = [s0, s1, s2, s3, s4, s5, s6, s7]
    proposals = {sid: dilate4(ds.load_mask(sid) != 0) for sid in ds.sample_ids()}
    for sid in applied:                                   # what propose-masks does when it applies a proposal
        ds.set_mask(sid, proposals[sid].astype(np.uint8), mask_status=model_status(MODEL_ID), actor="propose-masks")
    run = write_run(ds, proposals, applied=set(applied))
    other_model = model_status("another-model")
    repaint = square(48, 4, 4, 30).astype(np.uint8)

    ds.set_mask(s0, proposals[s0].astype(np.uint8), mask_status="ok", actor="alice")        # accepted
    ds.set_mask(s1, repaint, mask_status="ok", actor="alice")                               # changed: repainted
    ds.set_mask(s2, repaint, mask_status="human", actor="bob")                              # repainted
    ds.set_mask(s3, None, mask_status="bad", actor="bob")                                   # rejected
    # s4 stays model:<id>: pending
    ds.set_mask(s5, repaint, mask_status=other_model, actor="propose-masks")                # replaced
    ds.set_mask(s6, repaint, mask_status=other_model, actor="propose-masks")                # replaced, then
    ds.set_mask(s6, repaint, mask_status="ok", actor="alice")                               # the other accepted
    ds.set_mask(s7, proposals[s7].astype(np.uint8), mask_status="ok", actor="carol")        # accepted
    # s8, s9: not applied (they kept their exact masks), so not counted

    v = review_verdicts(ds, run)
    assert v.counts == {"accepted": 2, "repainted": 2, "rejected": 1, "pending": 1, "replaced": 2, "other": 0}
    assert v.by_sample == {s0: "accepted", s1: "repainted", s2: "repainted", s3: "rejected", s4: "pending",
                           s5: "replaced", s6: "replaced", s7: "accepted"}
    assert (v.applied, v.reviewed) == (8, 5)
    assert v.acceptance_rate == pytest.approx(2 / 5)
    assert v.acceptance_interval == (pytest.approx(0.1176, abs=1e-4), pytest.approx(0.7693, abs=1e-4))
    assert sum(sum(c.values()) for c in v.per_class.values()) == 8

    data = v.as_dict()
    json.dumps(data, allow_nan=False)
    assert data["accepted"] == 2 and data["reviewed"] == 5
    text = format_verdicts(v)
    for needle in ("applied", "accepted", "repainted", "rejected", "pending", "replaced", "40.0% [11.8, 76.9]",
                   "of the 5 reviewed", "1 still pending"):
        assert needle in text, needle


def test_review_verdicts_before_any_review(tmp_path: Path) -> None:
    ds = world(tmp_path, per_class=1)
    ids = ds.sample_ids()
    proposals = {sid: ds.load_mask(sid) != 0 for sid in ids}
    ds.set_mask(ids[0], proposals[ids[0]].astype(np.uint8), mask_status=model_status(MODEL_ID), actor="propose")
    ds.set_mask(ids[1], None, mask_status=None, actor="someone")      # removed without a verdict
    run = write_run(ds, proposals, applied=set(ids))
    v = review_verdicts(ds, run)
    assert v.counts["pending"] == 1 and v.counts["other"] == 1 and v.reviewed == 0
    assert math.isnan(v.acceptance_rate)
    json.dumps(v.as_dict(), allow_nan=False)
    assert "nothing reviewed yet" in format_verdicts(v)
