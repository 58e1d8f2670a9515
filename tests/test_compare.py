"""Effective robustness per family and scale (curate.compare, curate.metrics.robustness)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from curate.compare import RunRow, fit_groups, to_markdown
from curate.metrics.robustness import effective_robustness, fit_effective_robustness

NAN = float("nan")
# papers/003 Table 2 (1 vs 1000, balanced %), from shared/reference/counteranimal.yaml
TABLE2 = {
    "CLIP-LAION400M-ViT-B/32": (67.13, 36.95), "CLIP-OpenAI-ViT-B/32": (69.13, 45.62),
    "CLIP-LAION2B-ViT-B/32": (72.94, 48.74), "CLIP-DataComp1B-ViT-B/32": (75.96, 53.74),
    "CLIP-OpenAI-ViT-L/14": (85.38, 70.28), "CLIP-DFN5B-ViT-H/14": (88.55, 79.13),
}


def _row(name: str, easy: float, hard: float, family: str = "clip") -> RunRow:
    return RunRow(run=name, model=name, model_id=name, family=family, label_space="imagenet1k",
                  prompts="simple" if family == "clip" else "—", easy=easy, hard=hard, drop=easy - hard,
                  easy_ci=(NAN, NAN), hard_ci=(NAN, NAN), drop_ci=(NAN, NAN), n_easy=10, n_hard=10)


def write_evaluation(root, name: str, model_id: str, metrics: dict) -> None:
    """An evaluation run with ``metrics`` and no predictions (as a `curate evaluate` would write them)."""
    import pyarrow as pa

    from curate.runs import EvaluationRun

    empty = pa.table({"sample_id": pa.array([], pa.string()), "class_index": pa.array([], pa.int32()),
                      "group": pa.array([], pa.string()), "background": pa.array([], pa.string()),
                      "topk_labels": pa.array([], pa.list_(pa.int32())),
                      "topk_scores": pa.array([], pa.list_(pa.float32())),
                      "correct1": pa.array([], pa.bool_()), "correct5": pa.array([], pa.bool_())})
    EvaluationRun(model={"name": model_id, "pretrained": None, "model_id": model_id, "family": "clip"},
                  label_space={"name": "imagenet1k"}, prompts={"name": "simple", "templates": ["A photo of {}."]},
                  settings={}, dataset={}, metrics=metrics, predictions_table=empty).write(root / "runs" / name)


def test_linear_and_logit_fits_disagree_in_sign_on_two_table2_models() -> None:
    """The scale is a real choice: on the paper's own models a linear fit flips two signs."""
    easy = np.array([e for e, _ in TABLE2.values()]) / 100
    hard = np.array([h for _, h in TABLE2.values()]) / 100
    logit = effective_robustness(easy, hard, scale="logit")
    linear = effective_robustness(easy, hard, scale="linear")
    flipped = [name for name, a, b in zip(TABLE2, logit, linear) if np.sign(a) != np.sign(b)]
    assert flipped == ["CLIP-LAION2B-ViT-B/32", "CLIP-DataComp1B-ViT-B/32"]


def test_linear_fit_equals_a_hand_computation() -> None:
    easy, hard = np.array([0.5, 0.6, 0.8]), np.array([0.3, 0.5, 0.6])
    # least squares by hand: slope = cov / var
    slope = np.sum((easy - easy.mean()) * (hard - hard.mean())) / np.sum((easy - easy.mean()) ** 2)
    intercept = hard.mean() - slope * easy.mean()
    fit = fit_effective_robustness(easy, hard, "linear")
    assert fit.slope == pytest.approx(slope) and fit.intercept == pytest.approx(intercept)
    assert effective_robustness(easy, hard, scale="linear") == pytest.approx(hard - (slope * easy + intercept))


def test_families_are_fitted_separately() -> None:
    """A classifier never moves the CLIP line, and a family below 3 models gets NaN, not 0."""
    clips = [_row(n, e / 100, h / 100) for n, (e, h) in TABLE2.items()]
    alone = [_row(r.model, r.easy, r.hard) for r in clips]
    fit_groups(alone)
    classifiers = [_row("resnet50", 0.9, 0.2, "classifier"), _row("vit", 0.95, 0.3, "classifier")]
    mixed = clips + classifiers
    fits = fit_groups(mixed)
    assert set(fits) == {("clip", "imagenet1k", "simple"), ("classifier", "imagenet1k", "—")}
    assert [r.effective_robustness for r in clips] == pytest.approx([r.effective_robustness for r in alone])
    assert all(np.isnan(r.effective_robustness) for r in classifiers)
    # pooled, the same CLIP numbers would change: the separation is what keeps them
    pooled = effective_robustness(np.array([r.easy for r in mixed]), np.array([r.hard for r in mixed]))
    assert not np.allclose(pooled[: len(clips)], [r.effective_robustness for r in clips])


def test_markdown_states_scale_and_in_sample() -> None:
    rows = [_row(n, e / 100, h / 100) for n, (e, h) in TABLE2.items()]
    fit_groups(rows, "linear")
    rows[0].in_sample, rows[0].corrected_drop = True, 0.25
    text = to_markdown(rows)
    assert "linear-scale" in text and "(in-sample; corrected 25.00)" in text


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0.05, 0.95), st.floats(0.05, 0.95)), min_size=3, max_size=8),
       st.sampled_from(["logit", "linear"]))
@example(points=[(0.05, 0.5), (0.05, 0.5), (0.05000000000000001, 0.5)], scale="logit")  # rounding, not a spread
def test_er_is_zero_on_average_for_a_linear_fit_and_exact_on_the_line(points, scale) -> None:
    easy = np.array([p[0] for p in points])
    hard = np.array([p[1] for p in points])
    er = effective_robustness(easy, hard, scale=scale)
    if not fit_effective_robustness(easy, hard, scale).defined:  # only where the easy accuracies do not spread
        assert np.isnan(er).all() and np.ptp(easy) < 1e-8, easy
        return
    if scale == "linear":
        assert abs(er.mean()) < 1e-9  # least-squares residuals sum to zero
    # models exactly on a line have ER 0 on that line's scale
    on_line = fit_effective_robustness(easy, hard, scale).predict(easy)
    assert effective_robustness(easy, on_line, scale=scale) == pytest.approx(np.zeros_like(easy), abs=1e-6)


def test_split_reference_is_flagged_in_sample_with_its_cross_fitted_drop(tmp_path) -> None:
    """compare marks the split's own reference model as in-sample and shows the corrected drop;
    another model of the same family is not flagged."""
    from test_stage_split import SETTINGS, fake_run

    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
    from curate.compare import load_rows
    from curate.stages.split import split

    world = collect_synthetic(tmp_path / "w", WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=40, image_size=16,
                                                        p=0.5, seed=0))
    fake_run(world, "ref", {"snow": 1.0, "water": 1.0, "sky": 0.9})
    from dataclasses import replace

    result = split(world.root, None, replace(SETTINGS, predictions=("ref",)))
    corrected = result.reference_drop().corrected
    assert np.isfinite(corrected)

    def grouped(name: str, model_id: str, easy: float, hard: float) -> None:
        """An evaluation run with easy/hard accuracies (as a later `curate evaluate` would write)."""

        group = {"acc1_balanced_ci95": [0.0, 1.0], "n": 10, "n_classes": 3, "acc1_unbalanced": 0.5, "acc5_balanced": 1.0}
        metrics = {"groups": {"easy": {**group, "acc1_balanced": easy}, "hard": {**group, "acc1_balanced": hard}},
                   "drop": {"acc1": easy - hard, "acc1_ci95": [0.0, 1.0]}, "model_id": model_id,
                   "label_space": "imagenet1k", "prompts": "simple"}
        write_evaluation(world.root, name, model_id, metrics)

    grouped("eval-ref", "fake:1", 0.9, 0.3)
    grouped("eval-other", "other:2", 0.8, 0.6)
    rows = {r.run: r for r in load_rows(world.root)}
    assert rows["eval-ref"].in_sample and rows["eval-ref"].corrected_drop == pytest.approx(corrected)
    assert not rows["eval-other"].in_sample and np.isnan(rows["eval-other"].corrected_drop)


def test_readers_and_records_load_no_deep_learning_stack() -> None:
    """compare, the report and every run record read runs without importing torch or matplotlib."""
    import subprocess
    import sys

    code = ("import sys, curate.runs, curate.compare, curate.report; curate.runs.run_kinds(); "
            "print(sorted(m for m in ('torch', 'matplotlib', 'open_clip') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_a_run_written_before_the_interval_rule_loses_its_zero_width_intervals(tmp_path) -> None:
    """Issue 45: a run whose bootstrap rested on one-photo cells stored `[19.23, 19.23]`; compare applies the
    rule from the run's per-class counts (curate.metrics.bootstrap.interval_allowed), and keeps the rest."""
    from eval_helpers import make_folder

    from curate.compare import load_rows

    ds = make_folder(tmp_path / "ds", per_class=2)

    def write(name: str, n: int) -> None:
        group = {"acc1_balanced_ci95": [0.8701, 0.8701], "n": 3 * n, "n_classes": 3, "acc1_unbalanced": 0.87,
                 "acc5_balanced": 1.0, "acc1_balanced": 0.8701}
        metrics = {"groups": {"easy": group, "hard": group}, "drop": {"acc1": 0.1923, "acc1_ci95": [0.1923, 0.1923]},
                   "per_class": [{"class_index": c, "n_easy": n, "n_hard": n} for c in range(3)]}
        write_evaluation(ds.root, name, name, metrics)

    write("one", 1)
    write("two", 2)
    rows = {r.run: r for r in load_rows(ds.root)}
    assert all(np.isnan(rows["one"].drop_ci)) and all(np.isnan(rows["one"].hard_ci))
    assert rows["two"].drop_ci == (0.1923, 0.1923)
