"""Split verbs: label-backgrounds (CLIP pre-labels), split (spurious discovery), export."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from curate.cli import err, main, out, progress


def _pct(x) -> str:
    return "—" if x is None or x != x else f"{100 * x:.1f}"


@main.command("label-backgrounds")
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--model", required=True, help="A CLIP: open_clip arch, zoo name, or 'auto' with a curate weights file.")
@click.option("--pretrained", help="Tag or weights file.")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="YAML with 'phrases' and 'templates' (default datasets/backgrounds.yaml).")
@click.option("--threshold", type=float, default=0.5, show_default=True,
              help="Below this probability a pre-label gets the tag review:background.")
@click.option("--measure", is_flag=True, help="Write nothing; score against existing human/synthetic labels.")
@click.option("--device", default="auto", show_default=True)
@click.option("--batch-size", type=int, default=256, show_default=True)
def label_backgrounds_cmd(directory: Path, model: str, pretrained: str | None, prompts_file: Path | None, threshold: float,
                          measure: bool, device: str, batch_size: int) -> None:
    """CLIP background pre-labels for unlabelled samples (people's labels are never overwritten)."""
    from curate.split.backgrounds import label_backgrounds

    with progress() as bar:
        task = bar.add_task("encoding images", total=None)
        report = label_backgrounds(directory, model, pretrained, prompts_file=prompts_file, threshold=threshold,
                                   measure=measure, device=device, batch_size=batch_size,
                                   progress=lambda done, total: bar.update(task, completed=done, total=total))
    if measure:
        out().print(f"agreement with the existing labels: {_pct(report.agreement)}% on {report.n_measured} samples "
                    f"(chance: uniform {_pct(report.chance_uniform)}%, majority {_pct(report.chance_majority)}%)")
        table = Table(title="recall per background (%)", title_justify="left")
        table.add_column("background")
        table.add_column("recall", justify="right")
        for b, recall in sorted(report.per_background_recall.items()):
            table.add_row(b, _pct(recall))
        out().print(table)
    else:
        out().print(f"labelled {report.labelled} sample(s); {report.low_confidence} below {threshold:g} tagged "
                    f"review:background; {report.skipped_protected} human/synthetic label(s) left untouched")
    if report.failed:
        err().print(f"[yellow]{len(report.failed)} image(s) could not be scored[/]: {next(iter(report.failed.values()))}")


def _parse_pin(ds, text: str) -> tuple[int, tuple[str, str]]:
    parts = text.split(":")
    if len(parts) != 3:
        raise click.BadParameter(f"{text!r}: use CLASS:EASY:HARD (e.g. 296:snow:grass)", param_hint="--pin")
    return ds.label_space.resolve(parts[0]), (parts[1], parts[2])


@main.command("split")
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--reference", "references", multiple=True,
              help="Reference model(s) (paper: CLIP-LAION400M-ViT-B/32); several -> mean accuracy.")
@click.option("--pretrained", "pretrained", multiple=True, help="Tag or weights file per --reference ('none' for random).")
@click.option("--predictions", "predictions", multiple=True, help="Finished evaluation run name(s) to use instead.")
@click.option("--min-per-background", type=int, default=10, show_default=True)
@click.option("--min-drop", type=float, default=5.0, show_default=True, help="Points.")
@click.option("--require-significant", is_flag=True, help="Keep a class only when the drop's 95% interval excludes 0.")
@click.option("--pin", "pins", multiple=True, help="CLASS:EASY:HARD — fix a class's backgrounds (kept across re-runs).")
@click.option("--unpin", "unpins", multiple=True, help="CLASS — remove a pin.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--run-name", help="Name of the split run folder (re-using a name replaces it).")
def split_cmd(directory: Path, references: tuple[str, ...], pretrained: tuple[str, ...], predictions: tuple[str, ...],
              min_per_background: int, min_drop: float, require_significant: bool, pins: tuple[str, ...],
              unpins: tuple[str, ...], seed: int, device: str, run_name: str | None) -> None:
    """Spurious discovery (papers/003 §2.1): per class an easy and a hard background."""
    from curate.evaluate import ModelSpec
    from curate.split.apply import set_pins, split_dataset
    from curate.split.discovery import SplitRule
    from curate.store import Dataset

    if pretrained and len(pretrained) != len(references):
        raise click.BadParameter("give one --pretrained per --reference", param_hint="--pretrained")
    if pins or unpins:
        ds = Dataset.open(directory)
        set_pins(ds, dict(_parse_pin(ds, p) for p in pins), [ds.label_space.resolve(u) for u in unpins])
    tags = [None if (p or "").lower() in ("", "none") else p for p in (pretrained or [None] * len(references))]
    rule = SplitRule(min_per_background=min_per_background, min_drop=min_drop, require_significant=require_significant, seed=seed)
    with progress() as bar:
        task = bar.add_task("reference model", total=None)
        result = split_dataset(directory, references=[ModelSpec(r, t) for r, t in zip(references, tags)],
                               predictions=predictions, rule=rule, eval_settings={"device": device}, run=run_name,
                               progress=lambda done, total: bar.update(task, completed=done, total=total))
    names = Dataset.open(directory).label_space.names
    table = Table(title=f"{len(result.kept)} classes kept (accuracy %, drop in points)", title_justify="left")
    for column in ("class", "easy bkg", "easy", "hard bkg", "hard", "drop [95% CI]", "n easy/hard"):
        table.add_column(column, justify="right" if column in ("easy", "hard", "drop [95% CI]", "n easy/hard") else "left")
    for s in sorted(result.kept, key=lambda s: -s.drop):
        table.add_row(f"{s.class_index} {names[s.class_index]}" + (" (pinned)" if s.pinned else ""), s.easy, _pct(s.easy_acc),
                      s.hard, _pct(s.hard_acc), f"{_pct(s.drop)} [{_pct(s.drop_ci[0])}, {_pct(s.drop_ci[1])}]",
                      f"{s.n_easy}/{s.n_hard}")
    out().print(table)
    for s in result.splits:
        if not s.kept:
            out().print(f"[yellow]dropped[/] {s.class_index} {names[s.class_index]}: {s.reason}")
    out().print(f"{result.changed} sample(s) changed group; tables and figures in {result.run_dir}")


@main.command("export")
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--layout", type=click.Choice(["counteranimal"]), default="counteranimal", show_default=True)
@click.option("--include-restricted-licenses", is_flag=True, help="Also export ND / all-rights-reserved / unlicensed images.")
@click.option("--overwrite", is_flag=True)
def export_cmd(directory: Path, out_dir: Path, layout: str, include_restricted_licenses: bool, overwrite: bool) -> None:
    """Write the released folder layout (<class>/easy-<bg>/, <class>/hard-<bg>/, metadata.csv)."""
    from curate.split.export import export_counteranimal

    report = export_counteranimal(directory, out_dir, include_restricted=include_restricted_licenses, overwrite=overwrite)
    out().print(f"wrote {report.files} files in {report.classes} classes to {report.out}"
                + (f"; {report.excluded_licence} left out for their licence" if report.excluded_licence else ""))
