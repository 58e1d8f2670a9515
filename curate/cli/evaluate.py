"""Evaluation verbs: evaluate (one or many models), compare (Table 2 + Fig. 2 over runs)."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from curate.cli import StageProgress, err, main, out, progress, shown
from curate.cli.options import (
    UserPath,
    apply_preprocess,
    batch_options,
    device_options,
    engine_options,
    expand_home,
    lvlm_options,
    model_options,
    model_specs,
    preprocess_options,
    run_options,
)
from curate.formatting import pct, pct_ci


@main.command()
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@model_options(multiple=True)
@click.option("--label-space", callback=expand_home, default="auto", show_default=True,
              help="imagenet1k (1 vs 1000) | top20 (1 vs 20, App. C.2) | dataset (the dataset's own list) | FILE | "
                   "auto (top20 for LVLMs, imagenet1k for the rest).")
@click.option("--prompts", callback=expand_home, default="simple", show_default=True, help="simple ('A photo of {}.') | openai (80) | FILE.")
@device_options
@batch_options(batch_size=256)
@run_options
@click.option("--top20-reference", help="Reference CLIP for building the 1-vs-20 space (paper: CLIP-LAION400M-ViT-B/32).")
@click.option("--top20-pretrained", callback=expand_home, help="Its tag or weights file.")
@click.option("--rebuild-top20", is_flag=True, help="Rebuild the dataset's saved 1-vs-20 space.")
@click.option("--bootstrap", type=int, default=1000, show_default=True, help="Bootstrap replicates for the intervals.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-cache", is_flag=True, help="Neither read nor write the feature cache.")
@click.option("--input-path", type=click.Choice(["cpu-exact", "gpu", "auto"]), default="cpu-exact", show_default=True,
              help="cpu-exact: open_clip's own PIL preprocessing (equal to CLIP_benchmark); gpu: JPEG decode, resize, "
                   "crop and normalise on the device (within 4/255 of cpu-exact); auto: gpu on CUDA where possible.")
@preprocess_options
@lvlm_options
@engine_options
def evaluate(directory: Path, models: tuple[str, ...], pretrained: tuple[str, ...], label_space: str, prompts: str,
             device: str, precision: str, batch_size: int, workers: int | None, run_name: str | None, overwrite: bool,
             top20_reference: str | None, top20_pretrained: str | None, rebuild_top20: bool, bootstrap: int, seed: int,
             no_cache: bool, input_path: str, prep_mean: str | None, prep_std: str | None, prep_size: str | None,
             prep_interpolation: str | None, question: str, answer_template: str, token_env: str | None, engine: str,
             ray_address: str | None, gpus_per_worker: float) -> None:
    """Zero-shot (CLIPs), 1000-way (classifiers) or answer-likelihood (LVLMs) evaluation: accuracy, easy/hard, drop, intervals.

    Several runs with --run-name NAME are named NAME-<model>."""
    from curate.features import cache_use_text
    from curate.models.spec import ModelSpec, parse_pretrained
    from curate.stages.evaluate import EvalSettings, evaluate_models

    specs = apply_preprocess(model_specs(models, pretrained), prep_mean, prep_std, prep_size, prep_interpolation)
    settings = EvalSettings(
        label_space=label_space, prompts=prompts, device=device, batch_size=batch_size, workers=workers,
        precision=precision, bootstrap=bootstrap, seed=seed, rebuild_top20=rebuild_top20, use_cache=not no_cache,
        top20_reference=ModelSpec(top20_reference, parse_pretrained(top20_pretrained)) if top20_reference else None,
        question=question, answer_template=answer_template, token_env=token_env,
        engine=engine, ray_address=ray_address, gpus_per_worker=gpus_per_worker, input_path=input_path,
    )
    with progress() as bar:
        runs = evaluate_models(directory, specs, settings, run_name=run_name, overwrite=overwrite,
                               progress=StageProgress(bar))
    spaces = ", ".join(sorted({r.label_space_name for r in runs})) or label_space
    prompt_names = ", ".join(sorted({r.prompts_name for r in runs})) or prompts
    table = Table(title=f"{shown(directory)} — {spaces}, prompts {prompt_names} ({_header_note(directory, runs)})",
                  title_justify="left")
    # each column says what it holds: top-1 / top-5 over every photo; easy / hard balanced over classes
    for column in ("model", "top-1 (per photo)", "top-5 (per photo)", "easy (balanced)", "hard (balanced)",
                   "drop [95% CI]", "excluded"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for run in runs:
        drop = run.drop
        easy = pct(run.group("easy").acc1, 2) if run.has_groups else "—"
        hard = pct(run.group("hard").acc1, 2) if run.has_groups else "—"
        # no interval where the bootstrap rule gives none (a cell under 2 photos: curate.metrics.bootstrap)
        drop_cell = f"{pct(drop.acc1, 2)}{pct_ci(drop.acc1_ci, 2)}" if drop else "—"
        table.add_row(run.model_label, pct(run.overall.get("acc1"), 2), pct(run.overall.get("acc5"), 2), easy, hard,
                      drop_cell, str(run.excluded_count))
    out().print(table)
    for run in runs:
        out().print(f"{shown(run.run_dir)} ({cache_use_text(run.images_encoded, run.images_cached)})")
    for run in runs:
        if run.excluded_count:
            err().print(f"[yellow]{run.excluded_count} sample(s) excluded[/] ({run.excluded_reasons}); "
                        f"see {shown(run.run_dir / run.METRICS)}")


def _header_note(directory: Path, runs) -> str:
    """What the table's numbers are, and where its easy / hard come from: the folder's groups,
    a `curate split` run (whose reference model's drop is in-sample), or none at all."""
    if not any(run.has_groups for run in runs):
        return "accuracies %; no easy/hard groups in this folder: `curate split DIR --reference MODEL` makes them"
    from curate.compare import split_reference

    split = split_reference(directory)
    if split is None:
        return "accuracies %, drop in points; easy/hard as the folder's group column has them, no `curate split` run"
    if any(split.is_reference(model_id=run.model_id, run=run.name) for run in runs):
        return ("accuracies %, drop in points; the split's reference model's drop is in-sample: "
                "see `curate compare`")
    return "accuracies %, drop in points; easy/hard from `curate split`"

@main.command()
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--run", "runs", multiple=True, help="Only these runs (default: every evaluation run with groups).")
@click.option("--out", "out_dir", type=UserPath(path_type=Path), help="Output folder (default DIR/runs/compare).")
@click.option("--er-scale", type=click.Choice(["logit", "linear"]), default="logit", show_default=True,
              help="Scale of the effective-robustness fit (fitted per model family: CLIP, classifier, LVLM).")
def compare(directory: Path, runs: tuple[str, ...], out_dir: Path | None, er_scale: str) -> None:
    """Table 2 (model, easy, hard, drop, effective robustness) and the Fig. 2 scatter over runs."""
    from curate.compare import annotator_spread_run, compare_runs, drop_text, repeats_note

    repeats: list = []
    rows, folder = compare_runs(directory, out_dir, runs or None, er_scale=er_scale, repeats=repeats)
    table = Table(title=f"easy vs hard (balanced top-1 %); effective robustness on the {er_scale} scale, "
                        "fitted per family and setup (— below 3 models)", title_justify="left")
    for column in ("model", "family", "label space", "prompts", "easy", "hard", "drop", "eff. robustness", "run"):
        table.add_column(column, justify="left" if column in ("model", "family", "label space", "prompts", "run")
                         else "right")
    for r in sorted(rows, key=lambda r: (r.setup, -r.easy)):
        table.add_row(r.model, r.family, r.label_space, r.prompts, pct(r.easy, 2), pct(r.hard, 2), drop_text(r),
                      pct(r.effective_robustness, 2), r.run)
    out().print(table)
    if repeats:
        out().print(repeats_note(repeats, markdown=False), highlight=False)
    if any(r.in_sample for r in rows):
        out().print("in-sample: the split's reference model chose easy/hard to maximise its own drop; 'corrected' "
                    "chooses on one fold of the images and measures on the other (cross-fitting, `curate split`)")
    spread = annotator_spread_run(directory)
    if spread is not None:
        _print_spread(spread)
    out().print(f"wrote {shown(folder / 'compare.md')}, compare.csv, compare.png")


def _print_spread(run) -> None:
    """The newest annotator-spread run's table (issue 44; curate.cli.annotators.spread_table)."""
    from curate.cli.annotators import spread_table

    out().print(spread_table(run))
