"""The audit verb: rank every photo for the curation checks, or measure an earlier ranking."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from curate.cli import StageProgress, err, main, out, progress, shown
from curate.cli.options import (
    CLIP_ONLY,
    UserPath,
    batch_options,
    device_options,
    expand_home,
    mask_trust_option,
    model_options,
    one_model_spec,
    run_options,
)
from curate.shell import suggest


@main.command()
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@model_options(required=False, accepts=CLIP_ONLY)
@click.option("--checks", default="all", show_default=True,
              help="Comma-separated: label,duplicates,outliers,feature,obscurity,clarity (feature needs no model).")
@click.option("--label-space", callback=expand_home, default="present", show_default=True,
              help="Zero-shot label space: present (the audited classes) | full (every label, 1 vs 1000) | FILE.")
@click.option("--prompts", callback=expand_home, default="simple", show_default=True, help="simple ('A photo of {}.') | openai | FILE.")
@click.option("--tag-fraction", type=float, default=0.05, show_default=True,
              help="Pre-tag the top fraction of each check suspect:<check> (never changes status).")
@click.option("--no-tag", is_flag=True, help="Write the run only; leave the folder's tags alone.")
@click.option("--measure", is_flag=True,
              help="Do not audit: measure an audit run's precision/recall at the top 5/10/20%% against the reviewers' "
                   "reject:<reason> decisions (or --truth planted on a synthetic world).")
@click.option("--truth", type=click.Choice(["reviews", "planted"]), default="reviews", show_default=True,
              help="With --measure: what counts as a real problem.")
@click.option("--run", "measure_run", default=None, help="With --measure: the audit run (default: the newest).")
@device_options
@batch_options(batch_size=256)
@run_options
@click.option("--no-cache", is_flag=True, help="Neither read nor write the feature cache.")
@mask_trust_option
def audit(directory: Path, model: str | None, pretrained: str | None, checks: str, label_space: str, prompts: str,
          tag_fraction: float, no_tag: bool, measure: bool, truth: str, measure_run: str | None, device: str,
          precision: str, batch_size: int, workers: int | None, run_name: str | None, overwrite: bool,
          no_cache: bool, allow_model_masks: bool) -> None:
    """Curation assists: rank every photo for label noise, duplicates, outliers, feature noise, obscurity, clarity."""
    from curate.audit.report import MEASURE_COLUMNS, SUMMARY_COLUMNS, measure_rows, summary_rows

    if measure:
        from curate.stages.audit import latest_audit, measure_audit

        measures = measure_audit(directory, measure_run, truth=truth)
        run = latest_audit(directory, measure_run)
        population = "reviewed samples (accepted or rejected)" if truth == "reviews" else "audited samples"
        table = Table(title=f"audit {run.name}: precision (P) and recall (R) of each check's top 5/10/20% among the "
                            f"{population}, against {'the reviewers' if truth == 'reviews' else 'the planted'} problems; "
                            "random order's precision = the base rate", title_justify="left")
        for column in MEASURE_COLUMNS:
            table.add_column(column, justify="left" if column in ("check", "positives (truth)") else "right")
        for row in measure_rows(measures):
            table.add_row(*row)
        out().print(table)
        if truth == "reviews" and "duplicates" in run.checks:
            out().print("duplicates: no reviewer reason of the paper's four; see the groups in the run "
                        f"({len(run.duplicate_groups)} group(s))")
        for m in measures:
            for note in m.notes:
                err().print(f"[yellow]{m.check}[/]: {note}")
        return
    from curate.stages.audit import NEEDS_FEATURES, AuditSettings
    from curate.stages.audit import audit as run_audit

    settings = AuditSettings(checks=checks, label_space=label_space, prompts=prompts, tag_fraction=tag_fraction,
                             tag=not no_tag, device=device, precision=precision, batch_size=batch_size, workers=workers,
                             use_cache=not no_cache, allow_model_masks=allow_model_masks)
    spec = one_model_spec(model, pretrained) if NEEDS_FEATURES.intersection(settings.checks) else None
    with progress() as bar:
        run = run_audit(directory, spec, settings, run_name=run_name, overwrite=overwrite, progress=StageProgress(bar))
    masks = run.clarity_masks
    table = Table(title=f"audit of {run.dataset.get('samples')} samples with {run.model_label}: per-check scores "
                        f"(higher = look first); the top {100 * tag_fraction:g}% of each tagged suspect:<check>"
                        + (" (not tagged: --no-tag)" if no_tag else ""), title_justify="left",
                  caption=f"clarity's {masks.line()}" if masks is not None else None, caption_justify="left")
    for column in SUMMARY_COLUMNS:
        table.add_column(column, justify="left" if column in ("check", "score") else "right")
    for row in summary_rows(run):
        table.add_row(*row)
    out().print(table)
    for check in run.checks:
        for note in run.summary(check).notes:
            err().print(f"[yellow]{check}[/]: {note}")
    groups = run.duplicate_groups
    if groups:
        across = sum(1 for g in groups if g["across_classes"])
        out().print(f"duplicate groups: {len(groups)} ({across} across classes), largest {len(groups[0]['sample_ids'])}; "
                    f"listed in {shown(run.run_dir / run.RESULTS)}")
    excluded = run.excluded
    if excluded.get("count"):
        err().print(f"[yellow]{excluded['count']} sample(s) could not be decoded or encoded[/] "
                    f"({excluded.get('reasons')}); their feature-based scores are empty")
    out().print(f"{shown(run.run_dir)} ({run.dataset.get('images_encoded', 0)} images encoded, the rest from the feature cache); "
                f"measure later with: {suggest('curate audit {dir} --measure', dir=directory)}")
