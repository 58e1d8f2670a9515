"""The offline demo verb."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from curate.cli import main, out, progress, shown
from curate.cli.options import UserPath
from curate.formatting import num, pct, pct_ci


@main.command()
@click.option("--workdir", type=UserPath(path_type=Path), default=Path("demo-output"), show_default=True)
@click.option("--steps", type=int, default=None, help="Training steps per model (default: the measured demo setting).")
def demo(workdir: Path, steps: int | None) -> None:
    """Offline demo: synthetic worlds, the tiny reference CLIP, and its background shortcut."""
    from curate.demo import DemoSettings, run_full_demo

    settings = DemoSettings()
    if steps:
        settings.steps = steps
    with progress() as bar:
        tasks: dict[str, Any] = {}

        def on_step(label: str, step: int, total: int, loss: float) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(f"train {label}", total=total)
            bar.update(tasks[label], completed=step, description=f"train {label} loss {loss:.3f}")

        result = run_full_demo(workdir, settings, on_stage=lambda m: bar.console.print(f"• {m}"), on_step=on_step)
    rows = result.shortcut
    table = Table(title="zero-shot accuracy of the tiny reference CLIP on an uncorrelated evaluation world (balanced, %)",
                  title_justify="left")
    for column, justify in (("trained on", "left"), ("p", "right"), ("aligned bg", "right"),
                            ("conflicting bg", "right"), ("gap (points)", "right"), ("n aligned / conflicting", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        r = row.report
        table.add_row(row.world, f"{row.p:.3f}", f"{r.aligned_acc:.1f}", f"{r.conflicting_acc:.1f}", f"{r.gap:.1f}",
                      f"{r.n_aligned} / {r.n_conflicting}")
    out().print(table)
    out().print(f"background pre-labels (reference CLIP vs truth): {100 * result.background_agreement:.1f}% agreement, "
                f"chance {100 * result.background_chance:.1f}%")
    out().print(f"split (papers/003 §2.1, reference = the p=0.9 model): {result.split_kept} of {result.split_classes} classes "
                f"kept; easy = the planted background for {result.split_planted_easy} of {result.split_kept}; "
                f"table and Fig. 3/4 in {shown(result.split_dir)}")
    if result.noise_summary:
        out().print(f"  {result.noise_summary}; reference drop {result.reference_drop} (in-sample: the reference chose "
                    "easy/hard; cross-fitted: chosen on one half of the images, measured on the other)")
    evaluation = Table(title="evaluation engine on the split evaluation world "
                             "(CLIPs: prompt 'A photo of {}.'; balanced top-1 %)", title_justify="left")
    for column in ("label space", "trained on", "easy", "hard", "drop [95% CI]", "note"):
        evaluation.add_column(column, justify="left" if column in ("label space", "trained on", "note") else "right")
    for e in result.evaluations:
        note = e.note
        if e.in_sample:
            note = "in-sample (the split's reference)" + (f"; cross-fitted {pct(e.corrected_drop)}"
                                                          if e.corrected_drop == e.corrected_drop else "")
        evaluation.add_row(e.label_space, e.model, pct(e.easy), pct(e.hard),
                           f"{pct(e.drop)} [{pct(e.drop_ci[0])}, {pct(e.drop_ci[1])}]", note)
    out().print(evaluation)
    if result.saliency:
        sal = Table(title="saliency on the split evaluation world, true-class target (SSS: lower = on the object; "
                          "RMA: mass on the object)", title_justify="left")
        for column in ("trained on", "method", "SSS easy", "SSS hard", "RMA easy", "RMA hard", "uniform-map SSS",
                       "NaN images easy / hard"):
            sal.add_column(column, justify="left" if column in ("trained on", "method") else "right")
        for s in result.saliency:
            g = s.get("groups") or {}
            easy, hard = g.get("easy") or g.get("aligned") or {}, g.get("hard") or g.get("conflicting") or {}
            sal.add_row(s["model"], s["method"], num(easy.get("sss")), num(hard.get("sss")), num(easy.get("rma")),
                        num(hard.get("rma")), num((s.get("overall") or {}).get("sss_uniform")),
                        f"{easy.get('n_nan', 0)} / {hard.get('n_nan', 0)} of {easy.get('n', 0)} / {hard.get('n', 0)}")
        out().print(sal)
        if result.saliency[0].get("mask_line"):
            out().print(f"  {result.saliency[0]['mask_line']}", highlight=False)
    if result.fidelity:
        fid = Table(title="fidelity of the saliency maps (F-Fidelity AUCs, papers/002; Fid+ higher and Fid- lower = more "
                          f"faithful; verdict vs a random map, {result.fidelity_note or 'paired 95% bootstrap'})",
                    title_justify="left")
        for column in ("trained on", "method", "F-Fid+", "F-Fid-", "verdict"):
            fid.add_column(column, justify="left" if column in ("trained on", "method", "verdict") else "right")
        for r in result.fidelity:
            fid.add_row(r["model"], r["method"], num(r.get("ffid_plus"), 4), num(r.get("ffid_minus"), 4),
                        r.get("verdict", ""))
        out().print(fid)
        if result.fidelity_masks:
            out().print(f"  the mask reference's {result.fidelity_masks}", highlight=False)
    if result.masks:
        out().print(result.masks, highlight=False)
    if result.attribution:
        att = Table(title="does the background cause the drop? D = easy - hard, B = hard objects pasted on easy "
                          "backgrounds - hard, rest = D - B (points, 1 vs 1000, 95% paired bootstrap)",
                    title_justify="left")
        for column in ("world", "trained on", "drop D", "background B", "rest", "paste control", "ghost control",
                       "BG-gap", "exact B"):
            att.add_column(column, justify="left" if column in ("world", "trained on") else "right")
        for r in result.attribution:
            att.add_row(r["world"], r["model"].removeprefix("reference-").removesuffix(".pt"),
                        pct(r["drop"], signed=True) + pct_ci(r["drop_ci"]),
                        pct(r["background_part"], signed=True) + pct_ci(r["background_part_ci"]),
                        pct(r["rest"], signed=True) + pct_ci(r["rest_ci"]), pct(r["paste_cost"], signed=True),
                        pct(r.get("ghost_bias", float("nan")), signed=True) + pct_ci(r.get("ghost_bias_ci")),
                        pct(r["bg_gap"], signed=True) + pct_ci(r["bg_gap_ci"]), pct(r["truth_b"], signed=True))
        out().print(att)
        out().print("  the split world's p=0.9 row is in-sample (that model chose easy and hard); exact B = the same "
                    "objects re-drawn by the world's generator on the easy background (nothing pasted)",
                    highlight=False)
    if result.discovery:
        disc = Table(title="backgrounds nobody listed: the planted world's road photos carry no label and road is not in "
                           "its vocabulary; the group curate discover found for them (held out, 1 vs 1000, points)",
                     title_justify="left")
        for column in ("class", "road photos", "found as", "overlap", "names (top 3)", "'a road' rank", "gap", "q",
                       "ARI", "ARI whole image"):
            disc.add_column(column, justify="left" if column in ("class", "found as", "names (top 3)") else "right")
        for r in result.discovery:
            disc.add_row(r["class_name"], str(r["planted_photos"]), str(r["group"] or "-"), f"{r['jaccard']:.2f}",
                         "; ".join(r["names"]), str(r["phrase_rank"] or "-"),
                         pct(r["gap"] / 100, signed=True) + pct_ci([v / 100 for v in r["gap_ci"]]), f"{r['q']:.3f}",
                         f"{r['ari']:.2f}", f"{r['ari_whole']:.2f}")
        out().print(disc)
        out().print("  overlap = Jaccard of the found group and the class's road photos; gap = accuracy on the rest of "
                    "the class minus on the group (positive: harder on road); q = FDR-adjusted p over all groups; ARI = "
                    "agreement of all of the class's groups with the drawn backgrounds (1 = identical, 0 = chance), with "
                    f"the object removed and, as the baseline, from whole-image embeddings; {result.discovery_null}",
                    highlight=False)
    if result.team:
        out().print("agreement of a simulated team of three (careful 5 % wrong, confuses grass/tree 30 %, random 10 %) "
                    "on a small world whose truth is known; alpha is agreement, not accuracy (docs/science.md#who-labelled):",
                    highlight=False)
        for line in result.team:
            out().print("  " + line, highlight=False)
    out().print(f"runs: {shown(workdir / 'world-eval' / 'runs')}/"
                + (f"  table and scatter: {shown(result.compare_dir / 'compare.md')}, compare.png"
                   if result.compare_dir else ""))
    if result.report:
        out().print(f"report: {shown(result.report)} (and report.html beside it)")
    if result.attribution_report:
        out().print(f"interventions report: {shown(result.attribution_report)}")
    if result.hub_dir:
        out().print(f"Hub folder: {shown(result.hub_dir)} — python -c \"import datasets; "
                f"print(datasets.load_dataset('{shown(result.hub_dir)}'))\"")
    out().print(f"worlds and weights are in {shown(workdir)}/ (re-running reuses them)")
