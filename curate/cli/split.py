"""Split verbs: label-backgrounds (CLIP pre-labels), split (spurious discovery), export."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from curate.cli import StageProgress, err, main, out, progress, shown
from curate.cli.options import UserPath, batch_options, device_options, engine_options, expand_home, run_options
from curate.formatting import num, pct, pct_ci


@main.command("label-backgrounds")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--model", required=True, help="A CLIP: open_clip arch, zoo name, or 'auto' with a curate weights file.")
@click.option("--pretrained", callback=expand_home, help="Tag or weights file.")
@click.option("--prompts", "prompts_file", type=UserPath(path_type=Path, exists=True, dir_okay=False),
              help="YAML with 'phrases' and 'templates' (default datasets/backgrounds.yaml).")
@click.option("--threshold", type=float, default=0.5, show_default=True,
              help="Below this probability a pre-label gets the tag review:background.")
@click.option("--measure", is_flag=True, help="Write nothing; score against existing human/synthetic labels.")
@device_options
@batch_options(batch_size=256)
@engine_options
def label_backgrounds_cmd(directory: Path, model: str, pretrained: str | None, prompts_file: Path | None, threshold: float,
                          measure: bool, device: str, precision: str, batch_size: int, workers: int | None, engine: str,
                          ray_address: str | None, gpus_per_worker: float) -> None:
    """CLIP background pre-labels for unlabelled samples (people's labels are never overwritten)."""
    from curate.models.spec import ModelSpec, parse_pretrained
    from curate.stages.label_backgrounds import (
        LabelBackgroundsSettings,
        label_backgrounds,
    )

    settings = LabelBackgroundsSettings(prompts_file=prompts_file, threshold=threshold, measure=measure, device=device,
                                        precision=precision, batch_size=batch_size, workers=workers, engine=engine,
                                        ray_address=ray_address, gpus_per_worker=gpus_per_worker)
    with progress() as bar:
        report = label_backgrounds(directory, ModelSpec(model, parse_pretrained(pretrained)), settings,
                                   progress=StageProgress(bar))
    if measure:
        out().print(f"agreement with the existing labels: {pct(report.agreement)}% on {report.n_measured} samples "
                    f"(chance: uniform {pct(report.chance_uniform)}%, majority {pct(report.chance_majority)}%)")
        table = Table(title="recall per background (%)", title_justify="left")
        table.add_column("background")
        table.add_column("recall", justify="right")
        for b, recall in sorted(report.per_background_recall.items()):
            table.add_row(b, pct(recall))
        out().print(table)
    else:
        out().print(f"labelled {report.labelled} sample(s); {report.low_confidence} below {threshold:g} tagged "
                    f"review:background; {report.skipped_protected} human/synthetic label(s) left untouched")
        if report.labelled:
            out().print("these labels are background_source = model: `curate split` refuses them until people have "
                        "reviewed them (or --allow-model-backgrounds)")
    if report.failed:
        err().print(f"[yellow]{len(report.failed)} image(s) could not be scored[/]: {next(iter(report.failed.values()))}")


def _parse_pin(ds, text: str) -> tuple[int, tuple[str, str]]:
    parts = text.split(":")
    if len(parts) != 3:
        raise click.BadParameter(f"{text!r}: use CLASS:EASY:HARD (e.g. 296:snow:grass)", param_hint="--pin")
    return ds.label_space.resolve(parts[0]), (parts[1], parts[2])


@main.command("split")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--reference", "references", multiple=True,
              help="Reference model(s) (paper: CLIP-LAION400M-ViT-B/32); several -> mean accuracy.")
@click.option("--pretrained", "pretrained", callback=expand_home, multiple=True, help="Tag or weights file per --reference ('none' for random).")
@click.option("--predictions", "predictions", multiple=True, help="Finished evaluation run name(s) to use instead.")
@click.option("--min-per-background", type=int, default=10, show_default=True,
              help="Backgrounds with fewer accepted images are ignored (a curate addition: the paper has no minimum).")
@click.option("--min-drop", type=float, default=5.0, show_default=True, help="Points (the paper's 5).")
@click.option("--require-significant", is_flag=True,
              help="Also require permutation p < --alpha (max-min over backgrounds) and a 95% interval above 0. Use it "
                   "when the kept classes will be reported as having a background effect, or backgrounds have few "
                   "images; the default reproduces the paper.")
@click.option("--alpha", type=float, default=0.05, show_default=True, help="Level of the permutation test.")
@click.option("--n-perm", type=int, default=2000, show_default=True, help="Permutations per class.")
@click.option("--n-boot", type=int, default=1000, show_default=True, help="Bootstrap replicates for the intervals.")
@click.option("--crossfit-folds", type=int, default=2, show_default=True,
              help="Folds of the cross-fitted (selection-corrected) drop.")
@click.option("--crossfit-repeats", type=int, default=10, show_default=True, help="Seeded repeats of the cross-fitting.")
@click.option("--allow-model-backgrounds", is_flag=True,
              help="Split on background labels made by a model (curate label-backgrounds) that no person checked.")
@click.option("--annotator", default=None,
              help="Split on this annotator's answers alone (from the annotation table), for comparison with the "
                   "agreed labels; the folder's groups are left as they are.")
@click.option("--pin", "pins", multiple=True, help="CLASS:EASY:HARD — fix a class's backgrounds (kept across re-runs).")
@click.option("--unpin", "unpins", multiple=True, help="CLASS — remove a pin.")
@click.option("--seed", type=int, default=0, show_default=True)
@device_options
@batch_options(batch_size=256, with_workers=False)
@run_options
def split_cmd(directory: Path, references: tuple[str, ...], pretrained: tuple[str, ...], predictions: tuple[str, ...],
              min_per_background: int, min_drop: float, require_significant: bool, alpha: float, n_perm: int,
              n_boot: int, crossfit_folds: int, crossfit_repeats: int, allow_model_backgrounds: bool,
              annotator: str | None, pins: tuple[str, ...], unpins: tuple[str, ...], seed: int, device: str, precision: str, batch_size: int,
              run_name: str | None, overwrite: bool) -> None:
    """Spurious discovery (papers/003 §2.1): per class an easy and a hard background."""
    from curate.models.spec import specs_from_cli
    from curate.split.pins import set_pins
    from curate.split.tables import rule_text
    from curate.stages.split import SplitSettings, split
    from curate.store import Dataset

    try:
        specs = specs_from_cli(references, pretrained)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--pretrained") from None
    if pins or unpins:
        ds = Dataset.open(directory)
        set_pins(ds, dict(_parse_pin(ds, p) for p in pins), [ds.label_space.resolve(u) for u in unpins])
    settings = SplitSettings(
        min_per_background=min_per_background, min_drop=min_drop, require_significant=require_significant, alpha=alpha,
        n_perm=n_perm, n_boot=n_boot, seed=seed, crossfit_folds=crossfit_folds, crossfit_repeats=crossfit_repeats,
        predictions=tuple(predictions), allow_model_backgrounds=allow_model_backgrounds, annotator=annotator, device=device,
        precision=precision, batch_size=batch_size)
    with progress() as bar:
        run = split(directory, specs or None, settings, run_name=run_name, overwrite=overwrite,
                    progress=StageProgress(bar))
    table = Table(title=f"{len(run.kept)} classes kept (accuracy %, drops in points)", title_justify="left")
    numeric = ("easy", "hard", "drop [95% CI]", "cross-fitted", "p", "n easy/hard")
    for column in ("class", "easy bkg", "easy", "hard bkg", "hard", "drop [95% CI]", "cross-fitted", "p", "n easy/hard"):
        table.add_column(column, justify="right" if column in numeric else "left")
    for s in sorted(run.kept, key=lambda s: -s.drop):
        table.add_row(s.label, s.easy + (" (tie)" if s.easy_ties else ""), pct(s.easy_acc),
                      s.hard + (" (tie)" if s.hard_ties else ""), pct(s.hard_acc), f"{pct(s.drop)}{pct_ci(s.drop_ci)}",
                      pct(s.crossfit_drop), num(s.p_value, 3), f"{s.n_easy}/{s.n_hard}")
    out().print(table)
    for s in sorted(run.kept, key=lambda s: s.class_index):
        for note in s.tie_notes:
            out().print(f"{s.label}: {note}", highlight=False)
    for s in run.dropped:
        out().print(f"[yellow]dropped[/] {s.label}: {s.reason}")
    out().print(rule_text(run.rule))
    out().print(f"{run.noise_summary.text}; cross-fitted drop: {run.rule.crossfit_scheme}")
    if run.references:
        out().print(f"reference drop over the kept classes: {run.reference_drop_text()}")
    if run.label_sources is not None:
        out().print(run.label_sources.text)
    if run.label_use is not None:
        out().print(run.label_use.text, highlight=False)
    out().print(f"{run.changed} sample(s) changed group; tables and figures in {shown(run.run_dir)}")


@main.command("export")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.argument("out_dir", type=UserPath(path_type=Path))
@click.option("--layout", type=click.Choice(["counteranimal", "webdataset"]), default="counteranimal", show_default=True)
@click.option("--shard-size", type=click.IntRange(min=1), default=1000, show_default=True,
              help="webdataset layout: samples per shard.")
@click.option("--include-restricted-licenses", is_flag=True, help="Also export ND / all-rights-reserved / unlicensed images.")
@click.option("--overwrite", is_flag=True)
def export_cmd(directory: Path, out_dir: Path, layout: str, shard_size: int, include_restricted_licenses: bool,
               overwrite: bool) -> None:
    """Write the released folder layout (<class>/easy-<bg>/, <class>/hard-<bg>/, metadata.csv), or
    webdataset shards of every sample (--layout webdataset)."""
    if layout == "webdataset":
        from curate.export.webdataset import export_webdataset

        shards = export_webdataset(directory, out_dir, shard_size=shard_size,
                                   include_restricted=include_restricted_licenses, overwrite=overwrite)
        out().print(f"wrote {shards.samples} samples in {len(shards.shards)} shard(s) to {shown(shards.out)}"
                    + (f"; {shards.excluded_licence} left out for their licence" if shards.excluded_licence else ""))
        return
    from curate.split.export import export_counteranimal

    report = export_counteranimal(directory, out_dir, include_restricted=include_restricted_licenses, overwrite=overwrite)
    out().print(f"wrote {report.files} files in {report.classes} classes to {shown(report.out)}"
                + (f"; {report.excluded_licence} left out for their licence" if report.excluded_licence else ""))
