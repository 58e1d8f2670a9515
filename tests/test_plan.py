"""``curate plan``: the drop's half-width now and the photos each group needs (formula and CLI)."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from publish_helpers import make_dataset

from curate.cli import main
from curate.metrics.bootstrap import bootstrap_groups
from curate.runs.split import SplitClass, SplitRun
from curate.split.discovery import SplitRule
from curate.split.plan import (
    Z95,
    drop_half_width,
    group_variance,
    make_plan,
    photos_needed,
    review_cost,
)


def _half_width_after(a: float, n_e: int, b: float, n_h: int, need: tuple[int, int]) -> float:
    return drop_half_width(a, n_e + need[0], b, n_h + need[1])


def test_photos_needed_is_the_fewest_that_reach_the_target() -> None:
    # balanced case: both groups at p = 0.5, so the optimum grows both equally
    need = photos_needed(0.25, 100, 0.25, 100, 0.05)
    assert abs(need[0] - need[1]) <= 1 and min(need) > 0  # 669 + 668: both rounded up would be one photo more
    assert _half_width_after(0.25, 100, 0.25, 100, need) <= 0.05
    assert 0.05 < _half_width_after(0.25, 100, 0.25, 100, (need[0] - 1, need[1]))
    assert 0.05 < _half_width_after(0.25, 100, 0.25, 100, (need[0], need[1] - 1))
    # a thick easy group: only the hard group grows, and one photo fewer misses the target
    need = photos_needed(0.09, 5000, 0.25, 20, 0.05)
    assert need[0] == 0 and need[1] > 0
    assert _half_width_after(0.09, 5000, 0.25, 20, need) <= 0.05 < _half_width_after(0.09, 5000, 0.25, 20,
                                                                                       (0, need[1] - 1))
    assert photos_needed(0.09, 5000, 0.25, 5000, 0.05) == (0, 0)  # already there
    with pytest.raises(ValueError, match="> 0"):
        photos_needed(0.25, 10, 0.25, 10, 0.0)


def test_the_formula_is_the_bootstrap_half_width_at_each_size() -> None:
    """z sqrt(p_e q_e / n_e + p_h q_h / n_h) against the stratified bootstrap curate reports, at two sizes
    of the hard group (the 1/n scaling the plan assumes)."""
    rng = np.random.default_rng(3)
    for n_hard in (40, 160):
        correct = np.r_[rng.random(400) < 0.9, rng.random(n_hard) < 0.5].astype(float)
        groups = np.array(["easy"] * 400 + ["hard"] * n_hard, dtype=object)
        boot = bootstrap_groups(correct, np.zeros(correct.size, int), groups, n_boot=4000, seed=1)["drop"]
        measured = (boot.high - boot.low) / 2
        p_e, p_h = correct[:400].mean(), correct[400:].mean()
        formula = Z95 * math.sqrt(p_e * (1 - p_e) / 400 + p_h * (1 - p_h) / n_hard)
        assert measured == pytest.approx(formula, rel=0.06)


def test_smoothing_and_review_cost() -> None:
    assert group_variance(1.0, 20) > 0  # a group the reference gets all right still has a variance to plan with
    assert group_variance(0.5, 20) == pytest.approx(0.25)
    cost, accepted, rejected = review_cost(["accepted"] * 30 + ["rejected"] * 10 + ["candidate"] * 5)
    assert (cost, accepted, rejected) == (pytest.approx(40 / 30), 30, 10)
    assert math.isnan(review_cost(["candidate"])[0])


def _split(classes: list[SplitClass]) -> SplitRun:
    return SplitRun(rule=SplitRule(), references=[], classes=classes, run_dir=Path("runs/split-x"))


def test_make_plan_per_class_and_overall() -> None:
    thin = SplitClass(9, "ostrich", True, "drop", easy="grass", hard="water", easy_acc=0.9, hard_acc=0.5, drop=0.4,
                      drop_ci=(0.25, 0.55), n_easy=400, n_hard=40)
    thick = SplitClass(10, "brambling", True, "drop", easy="grass", hard="snow", easy_acc=0.8, hard_acc=0.6, drop=0.2,
                       drop_ci=(0.15, 0.25), n_easy=3000, n_hard=3000)
    dropped = SplitClass(11, "goldfinch", False, "no drop", n_easy=10, n_hard=10)
    plan = make_plan(_split([thin, thick, dropped]), ["accepted"] * 3 + ["rejected"], half_width=0.05)
    assert [c.class_index for c in plan.classes] == [9, 10]
    ostrich, brambling = plan.classes
    assert ostrich.half_width_bootstrap == pytest.approx(0.15)
    assert ostrich.need_hard > 0 and ostrich.half_width_after <= 0.05
    low, high = ostrich.half_width_after_range
    assert low <= ostrich.half_width_after <= high
    assert (brambling.need_easy, brambling.need_hard) == (0, 0)
    assert ostrich.review_photos == pytest.approx(ostrich.need * 4 / 3)
    assert plan.overall_after < plan.overall_now
    assert plan.overall_now == pytest.approx(math.hypot(ostrich.half_width_now, brambling.half_width_now) / 2)
    rows = list(csv.DictReader(plan.to_csv().splitlines()))
    assert [r["class_index"] for r in rows] == ["9", "10", "all"]
    # the 'all' row plans the mean drop itself: cheaper than the per-class plans summed
    assert rows[2]["need_hard"] == str(plan.need_hard) and 0 < plan.need_hard < ostrich.need_hard
    assert plan.overall_after <= 0.05
    with pytest.raises(ValueError, match="no kept class with photos in both"):
        make_plan(_split([dropped]), [])


def test_cli_plan_writes_table_csv_and_figure(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds")  # a split with 3 kept classes of 3 easy + 3 hard photos
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["plan", str(ds.root), "--half-width", "10"])
    assert result.exit_code == 0, result.output
    assert "collection plan for +-10 points (split split-test)" in result.output
    assert "photos reviewed per accepted photo (21 accepted, 3 rejected so far)" in result.output
    out = ds.root / "runs" / "plan"
    rows = list(csv.DictReader((out / "plan.csv").read_text().splitlines()))
    assert [r["class_index"] for r in rows] == ["9", "657", "744", "all"]
    assert all(int(r["need_hard"]) > 0 for r in rows)
    assert float(rows[0]["half_width_after"]) <= 10.0
    assert json.loads((out / "plan.json").read_text())["split_run"] == "split-test"
    assert (out / "plan.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_plan_bad_input_is_one_line(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    bare = make_dataset(tmp_path / "bare", split_run=False)
    result = runner.invoke(main, ["plan", str(bare.root)])
    assert result.exit_code == 1 and "error: " in result.output and "has no split yet" in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = runner.invoke(main, ["plan", str(bare.root), "--split", "nope"])
    assert result.exit_code == 1 and "cannot plan from split run nope" in result.output
    result = runner.invoke(main, ["plan", str(bare.root), "--split", "x", "--half-width", "0"])
    assert result.exit_code == 1 and "must be > 0" in result.output
    assert not (bare.root / "runs" / "plan").exists()


def test_report_has_the_collection_plan(tmp_path: Path) -> None:
    from curate.report import build_report

    ds = make_dataset(tmp_path / "ds")
    md = build_report(ds.root).read_text()
    assert "## Collection plan" in md and "+-5 points" in md
    assert "1.14 photos reviewed per accepted photo" in md  # 24 reviewed, 21 accepted
    section = md.split("## Collection plan")[1].split("\n## ")[0]
    row = next(line for line in section.splitlines() if line.startswith("| ostrich (9) |"))
    assert row.startswith("| ostrich (9) | 3 | 3 |")
    assert (ds.root / "runs" / "report" / "plan.png").exists()
    bare = make_dataset(tmp_path / "bare", split_run=False)
    assert "Collection plan" not in build_report(bare.root).read_text()


def _brute_force_total(a: float, n_e: int, b: float, n_h: int, target: float) -> int:
    """The fewest photos in total, by trying every easy count and the fewest hard photos for it."""
    best = math.inf
    for m_e in range(0, 2000):
        if drop_half_width(a, n_e + m_e, b, n_h, Z95) <= target:
            return min(best, m_e)
        m_h = 0
        while drop_half_width(a, n_e + m_e, b, n_h + m_h) > target and m_h < 4000:
            m_h += 1
        if drop_half_width(a, n_e + m_e, b, n_h + m_h) <= target:
            best = min(best, m_e + m_h)
        if m_e >= best:
            break
    return best


def test_photos_needed_is_the_true_minimum_total_against_a_brute_force() -> None:
    """Issue 45: rounding both optimal counts up on their own asked for one photo too many, e.g. (63, 129)."""
    rng = np.random.default_rng(45)
    for _ in range(400):
        a, b = (float(rng.uniform(0.01, 0.25)) for _ in range(2))
        n_e, n_h = (int(rng.integers(1, 150)) for _ in range(2))
        target = float(rng.uniform(0.06, 0.3))
        need = photos_needed(a, n_e, b, n_h, target)
        assert _half_width_after(a, n_e, b, n_h, need) <= target
        assert sum(need) == _brute_force_total(a, n_e, b, n_h, target), (a, n_e, b, n_h, target, need)


def test_fewest_photos_for_many_cells_against_a_brute_force() -> None:
    """The mean drop's plan: the fewest photos over four cells, against every allocation."""
    from itertools import product

    from curate.split.plan_alloc import fewest_photos, variance_sum

    rng = np.random.default_rng(7)
    for _ in range(30):
        v = rng.uniform(0.02, 0.25, 4).tolist()
        n = rng.integers(1, 8, 4).tolist()
        limit = variance_sum(v, [x + 6 for x in n]) * float(rng.uniform(0.9, 1.6))
        need = fewest_photos(v, n, limit)
        assert variance_sum(v, [x + m for x, m in zip(n, need)]) <= limit
        best = min(sum(m) for m in product(range(12), repeat=4)
                   if variance_sum(v, [x + y for x, y in zip(n, m)]) <= limit)
        assert sum(need) == best


def test_plan_shows_the_value_it_plans_from_and_plans_the_mean_for_the_mean() -> None:
    """Issue 46: lion showed 4.2 (bootstrap) and got photos for 5 (the smoothed formula); a 100 % / 0 % class
    showed 0.0; the 'all' row summed the per-class plans. Now: the planned-from value, the why, the mean's plan."""
    from curate.split.plan_alloc import fewest_photos
    from curate.split.plan_text import plan_notes

    lion = SplitClass(291, "lion", True, "drop", easy="grass", hard="snow", easy_acc=0.9, hard_acc=0.6, drop=0.3,
                      drop_ci=(0.259, 0.343), n_easy=400, n_hard=400)  # bootstrap 4.2
    perfect = SplitClass(9, "ostrich", True, "drop", easy="grass", hard="water", easy_acc=1.0, hard_acc=0.0,
                         drop=1.0, drop_ci=(1.0, 1.0), n_easy=20, n_hard=20)
    plan = make_plan(_split([lion, perfect]), [], half_width=0.05)
    lion_plan, perfect_plan = plan.classes
    assert lion_plan.half_width_bootstrap <= 0.05 < lion_plan.half_width_now and lion_plan.need > 0
    assert perfect_plan.half_width_bootstrap == 0 and perfect_plan.need > 0
    assert "lion: the plan's formula with smoothed accuracies (k+1)/(n+2) gives" in lion_plan.why(0.05)
    assert "easy 100 % of 20 and hard 0 % of 20 right" in perfect_plan.why(0.05)
    notes = "\n".join(plan_notes(plan))
    assert "(k+1)/(n+2)" in notes and "lion:" in notes and "not the sum of the rows above" in notes
    assert "3.0 %" in notes  # the bootstrap's own noise at 1,000 replicates, said
    # after the plan is never above the value planned from (plan.png's two bars)
    assert all(c.half_width_after <= c.half_width_now for c in plan.classes)
    # the mean's row: the fewest photos over all four cells for the mean's half-width, fewer than the per-class sum
    v = [group_variance(c.easy_acc, c.n_easy) if g == 0 else group_variance(c.hard_acc, c.n_hard)
         for c in (lion, perfect) for g in (0, 1)]
    expected = fewest_photos(v, [400, 400, 20, 20], (0.05 * 2 / Z95) ** 2)
    assert plan.need_easy + plan.need_hard == sum(expected)
    assert plan.need_easy + plan.need_hard < sum(c.need for c in plan.classes)
    assert plan.overall_after <= 0.05 < plan.overall_now or plan.overall_now <= 0.05


def test_cli_plan_takes_class_names_says_what_is_true_and_ends_with_the_next_command(tmp_path: Path) -> None:
    """Issue 46: `plan` ends with the steered fill for the thinnest class and takes names; issue 45:
    `--class 1` (a class the split dropped) no longer suggests running `curate split` first."""
    import shlex

    ds = make_dataset(tmp_path / "ds")
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["plan", str(ds.root), "--half-width", "10", "--class", "ostrich", "--class", "657"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((ds.root / "runs" / "plan" / "plan.csv").read_text().splitlines()))
    assert [r["class_index"] for r in rows] == ["9", "657", "all"]
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("next: curate collect inat ")
    words = shlex.split(last[len("next: "):])
    assert words[:4] == ["curate", "collect", "inat", str(ds.root)]
    assert words[words.index("--fill") + 1] == "split-test" and words[words.index("--group") + 1] == "hard"
    thinnest = max((r for r in rows[:-1] if int(r["need_hard"]) + int(r["need_easy"])),
                   key=lambda r: float(r["half_width_now"]))
    assert words[words.index("--class") + 1] == thinnest["class_index"]
    assert words[words.index("--n") + 1] == thinnest["need_hard"]
    dropped = runner.invoke(main, ["plan", str(ds.root), "--class", "1"])
    assert dropped.exit_code == 1 and "curate split" not in dropped.output
    assert "was not kept by split run split-test (drop 1.0 <= 5)" in dropped.output
    assert "the kept classes: 9 ostrich" in dropped.output
    unknown = runner.invoke(main, ["plan", str(ds.root), "--class", "zebra-ish"])
    assert unknown.exit_code == 1 and "no class named 'zebra-ish'" in unknown.output


def test_bootstrap_noise_is_about_three_percent_at_1000_replicates() -> None:
    """Issue 45: the plan says the bootstrap's own noise. Hand-computed: sqrt(0.025 * 0.975 / 2000) /
    (phi(1.96) * 1.96) = 0.003491 / 0.11455 = 0.0305; and against repeated bootstraps of one sample."""
    from curate.split.plan import bootstrap_noise

    assert bootstrap_noise(1000) == pytest.approx(0.0305, abs=5e-4)
    assert bootstrap_noise(4000) == pytest.approx(bootstrap_noise(1000) / 2)
    correct = np.r_[np.ones(300), np.zeros(100), np.ones(200), np.zeros(200)]
    groups = np.array(["easy"] * 400 + ["hard"] * 400, dtype=object)
    widths = []
    for seed in range(60):
        d = bootstrap_groups(correct, np.zeros(800, int), groups, n_boot=1000, seed=seed)["drop"]
        widths.append((d.high - d.low) / 2)
    assert np.std(widths) / np.mean(widths) == pytest.approx(bootstrap_noise(1000), rel=0.35)
