"""``curate intervene`` and ``curate attribution``: does the background cause the drop?"""
from __future__ import annotations

from pathlib import Path

import click

from curate.cli import StageProgress, main, out, progress, shown
from curate.cli.options import UserPath
from curate.interventions.image_ops import FILLS
from curate.interventions.plan import MATCHES, VARIANTS
from curate.shell import suggest


@main.command("intervene")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--out", "out_dir", type=UserPath(path_type=Path), required=True,
              help="The new dataset folder for the variants (re-running into it with the same settings adds nothing).")
@click.option("--split", "split_run", default=None,
              help="The split run whose easy / hard backgrounds define the groups (default: the group column).")
@click.option("--variants", default="all", show_default=True,
              help=f"Comma-separated, from: {', '.join(VARIANTS)} (original is always made).")
@click.option("--seed", type=int, default=0, show_default=True, help="Donor draws and noise (a re-run reproduces OUT).")
@click.option("--swaps", type=int, default=1, show_default=True, help="Donor backgrounds per photo for the swap.")
@click.option("--adversarial-backgrounds", type=int, default=8, show_default=True,
              help="Size of the fixed background set every object is tried on (0: none).")
@click.option("--hole-margin", type=float, default=0.02, show_default=True,
              help="The object's hole grows by this share of the image's shorter side (at least 1 px) before filling.")
@click.option("--sigma", type=float, default=0.25, show_default=True,
              help="Standard deviation of the Gaussian noise on the [0, 1] pixel scale (noise-fg / noise-bg).")
@click.option("--per-cell", type=int, default=None, help="At most N photos per (class, group), in a seeded order.")
@click.option("--fill", type=click.Choice(FILLS), default="tile", show_default=True,
              help="How a hole is filled: tiles of the photo's background, OpenCV inpainting (telea, ns), or box-*: "
                   "the hole's bounding box filled so no outline of the object is left.")
@click.option("--donor-match", type=click.Choice(MATCHES), default="cover", show_default=True,
              help="Donors whose hole the pasted object covers best (cover) or whose object is closest in size (size).")
@click.option("--max-uncovered", type=float, default=None,
              help="Leave out donors whose hole the pasted object leaves more than this share of (0-1; counted).")
@click.option("--background-photos", type=UserPath(path_type=Path), default=None,
              help="A dataset folder of photos of backgrounds alone (no class, background labelled): each hard swap "
                   "also pasted on one of its donor's background (swap-bgonly), the fill control that needs no fill.")
@click.option("--allow-model-masks", is_flag=True,
              help="Also use unverified model-made masks (curate propose-masks) as objects (counted either way).")
@click.option("--allow-restricted-licenses", is_flag=True,
              help="Also use photos whose licence forbids derivative works (never published).")
@click.option("--workers", type=int, default=None,
              help="Threads making images (default: up to 4, one per core); the output does not depend on it.")
@click.option("--run-name", default=None,
              help="The record's folder under OUT/runs/ (default: intervene; a re-run with the same settings rewrites it).")
@click.option("--overwrite", is_flag=True,
              help="Accepted as in every verb; changes nothing here: the same intervention rewrites the same record, "
                   "another one into OUT is refused.")
def intervene_cmd(directory: Path, out_dir: Path, split_run: str | None, variants: str, seed: int, swaps: int,
                  adversarial_backgrounds: int, hole_margin: float, sigma: float, per_cell: int | None,
                  fill: str, donor_match: str, max_uncovered: float | None, background_photos: Path | None,
                  allow_model_masks: bool, allow_restricted_licenses: bool, workers: int | None,
                  run_name: str | None, overwrite: bool) -> None:
    """Keep each masked photo's object, change its background: write the variants as a new folder.

    Then score OUT with `curate evaluate OUT --model ...` (as many models as you like) and split
    each model's drop with `curate attribution OUT`.
    """
    from curate.masks.sources import MaskCounts
    from curate.stages.intervene import InterveneSettings, intervene

    settings = InterveneSettings(variants=variants, split=split_run, seed=seed, swaps=swaps,
                                 adversarial_backgrounds=adversarial_backgrounds, hole_margin=hole_margin, sigma=sigma,
                                 per_cell=per_cell, fill=fill, match=donor_match, max_uncovered=max_uncovered,
                                 background_photos=str(background_photos) if background_photos is not None else None,
                                 allow_model_masks=allow_model_masks,
                                 allow_restricted_licenses=allow_restricted_licenses, workers=workers)
    with progress() as bar:
        record = intervene(directory, out_dir, settings, run_name=run_name, overwrite=overwrite,
                           progress=StageProgress(bar))
    c = record.counts
    groups = c.get("by_group") or {}
    out().print(f"{c.get('sources', 0)} photos ({groups.get('easy', 0)} easy, {groups.get('hard', 0)} hard, "
                f"{c.get('classes', 0)} classes) -> {c.get('images', 0)} images in {shown(out_dir)}", highlight=False)
    out().print("variants: " + ", ".join(f"{k} {v}" for k, v in (c.get("variants") or {}).items()), highlight=False)
    out().print(MaskCounts.from_dict(record.masks).line(), highlight=False)
    for label, key in (("photos skipped", "skipped_sources"), ("not planned", "not_planned")):
        if c.get(key):
            out().print(f"{label}: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in c[key].items()),
                        highlight=False)
    out().print(f"record: {shown(record.run_dir)}", highlight=False)
    out().print(f"next: `{suggest('curate evaluate {out} --model NAME', out=shown(out_dir))}` for each model, then "
                f"`{suggest('curate attribution {out}', out=shown(out_dir))}`",
                highlight=False)


@main.command("attribution")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--runs", default=None, help="Comma-separated evaluation runs on DIR (default: every one).")
@click.option("--intervention", default=None, help="The intervention record's run name (default: the latest).")
@click.option("--bootstrap", "n_boot", type=int, default=1000, show_default=True, help="Paired bootstrap replicates.")
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@click.option("--control-threshold", type=float, default=0.05, show_default=True,
              help="Flag a class whose paste control loses, or whose ghost or fill control or fill effect moves B by, "
                   "more than "
                   "this (a fraction: 0.05 = 5 points; the fill control and the fill effect also need their interval clear of 0).")
@click.option("--classes", "show_classes", is_flag=True, help="Also print the per-class table of each model.")
@click.option("--run-name", default=None,
              help="Run folder name under DIR/runs/ (default: attribution-<intervention>-<UTC time>).")
@click.option("--overwrite", is_flag=True, help="Replace a finished run of that name (refused otherwise; an "
              "unfinished one, without config.json, is replaced anyway).")
def attribution_cmd(directory: Path, runs: str | None, intervention: str | None, n_boot: int, seed: int,
                    control_threshold: float, show_classes: bool, run_name: str | None,
                    overwrite: bool) -> None:
    """Split each model's drop on an intervention folder into the background's part and the rest."""
    from rich.table import Table

    from curate.runs.attribution import CLASS_COLUMNS, DECOMPOSITION_COLUMNS, DECOMPOSITION_NOTE, GHOST_NOTE
    from curate.stages.attribution import AttributionSettings, attribution

    settings = AttributionSettings(intervention=intervention, n_boot=n_boot, seed=seed,
                                   control_threshold=control_threshold)
    names = [r.strip() for r in runs.split(",") if r.strip()] if runs else None
    with progress() as bar:
        record = attribution(directory, names, settings, run_name=run_name, overwrite=overwrite,
                             progress=StageProgress(bar))
    table = Table(title="does the background cause the drop? points, 95% paired bootstrap intervals",
                  title_justify="left", show_edge=False)
    for column in DECOMPOSITION_COLUMNS:
        table.add_column(column)
    for row in record.decomposition_rows():
        table.add_row(*row)
    out().print(table)
    anchors = Table(title="the anchors' numbers (accuracy %, RFS in [-1, 1], chance = one guess among the candidates)",
                    title_justify="left", show_edge=False)
    for column in ("model", "only-FG", "no-FG", "only-BG", "mixed-same", "mixed-rand", "BG-gap", "RFS", "adversarial",
                   "ghost", "ghost-neutral", "chance"):
        anchors.add_column(column)
    for row in record.anchor_rows():
        anchors.add_row(*row)
    out().print(anchors)
    if show_classes:
        for model in record.models:
            per_class = Table(title=f"{model.model} per class", title_justify="left", show_edge=False)
            for column in CLASS_COLUMNS:
                per_class.add_column(column)
            for row in record.class_rows(model):
                per_class.add_row(*row)
            out().print(per_class)
    out().print(DECOMPOSITION_NOTE, highlight=False)
    out().print(GHOST_NOTE, highlight=False)
    from curate.masks.sources import MaskCounts

    out().print(MaskCounts.from_dict(record.intervention.get("masks")).line(), highlight=False)
    for model in record.models:
        for row in model.flagged:
            out().print(f"[yellow]flagged[/] {model.model} {row.label}: {row.flag}")
    if record.ghost_advice():
        out().print(f"next: {record.ghost_advice()}", highlight=False, markup=False)
    out().print(f"run: {shown(record.run_dir)} (attribution.md, attribution.csv, decomposition.png)", highlight=False)
