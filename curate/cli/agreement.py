"""The agreement verb: how far the annotators agree, and each photo's label (issue 44)."""
from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from curate.cli import StageProgress, main, out, progress, shown
from curate.cli.options import UserPath, run_options
from curate.formatting import num


@main.command("agreement")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--rule", type=click.Choice(["majority", "dawid-skene"]), default="dawid-skene", show_default=True,
              help="How each photo's label is decided: the most frequent answer (ties disputed), or crowd-kit's "
                   "Dawid-Skene posterior.")
@click.option("--threshold", type=float, default=None,
              help="Below this confidence (vote share, or posterior) a photo is disputed. Default: 0 for majority "
                   "(only ties), 0.9 for dawid-skene.")
@click.option("--replicates", type=int, default=1000, show_default=True,
              help="Bootstrap replicates (over photos) of alpha's interval.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap.")
@click.option("--mask-method", type=click.Choice(["majority", "em", "rasa"]), default="majority", show_default=True,
              help="crowd-kit's segmentation aggregator for the agreed masks (SegmentationMajorityVote, "
                   "SegmentationEM, SegmentationRASA).")
@click.option("--measure-only", is_flag=True,
              help="Measure and decide, but leave the folder's backgrounds and label_status.parquet as they are.")
@run_options
def agreement_cmd(directory: Path, rule: str, threshold: float | None, replicates: int, seed: int, mask_method: str,
                  measure_only: bool, run_name: str | None, overwrite: bool) -> None:
    """Agreement of several annotators (Krippendorff's alpha, Cohen's kappa), each photo's label, the disputes."""
    from curate.agreement.aggregate import STATUSES
    from curate.stages.agreement import AgreementSettings, agreement

    settings = AgreementSettings(rule=rule, threshold=threshold, replicates=replicates, seed=seed,
                                 mask_method=mask_method, derive=not measure_only)
    with progress() as bar:
        run = agreement(directory, None, settings, run_name=run_name, overwrite=overwrite, progress=StageProgress(bar))
    disputed = {}
    if run.decisions:
        from curate.agreement.answers import photo_classes
        from curate.store import Dataset

        disputed = run.disputed_by_class(photo_classes(Dataset.open(directory)))
    level = int(round(run.level * 100))
    table = Table(title=f"Krippendorff's alpha (nominal) [{level}% bootstrap interval over photos, "
                        f"{run.replicates} replicates, seed {run.seed}]", title_justify="left")
    for column in ("class", "alpha", f"{level}% interval", "photos", "2+ answers", "annotators", "disputed"):
        table.add_column(column, justify="left" if column == "class" else "right")
    for a in run.alpha:
        count = sum(disputed.values()) if a.group == "(all)" else disputed.get(a.group, 0)
        table.add_row(escape(a.group), num(a.alpha), f"[{num(a.low)}, {num(a.high)}]", str(a.n_photos), str(a.n_pairable),
                      str(a.n_annotators), str(count))
    out().print(table)
    out().print("alpha: 1 = the annotators always agree, 0 = no better than chance; — = undefined (no photo with "
                "two answers, or one background only); agreement, not accuracy "
                "(docs/science.md#what-alpha-can-and-cannot-show)", highlight=False)
    kappa = Table(title="Cohen's kappa per pair of annotators", title_justify="left")
    for column in ("annotator A", "annotator B", "common photos", "kappa", "sets agree"):
        kappa.add_column(column, justify="left" if column.startswith("annotator") else "right")
    for k in run.kappa:
        kappa.add_row(escape(k.a), escape(k.b), str(k.n_common), num(k.kappa), num(k.set_agreement))
    out().print(kappa)
    out().print("kappa: the pair's chance-corrected agreement on primary backgrounds; sets agree: share of their common "
                "photos whose answer sets intersect", highlight=False)
    who = Table(title="Annotators", title_justify="left")
    for column in ("annotator", "answered", "skipped", "gold accuracy", "agreement with the rest"):
        who.add_column(column, justify="left" if column == "annotator" else "right")
    for a in run.annotators:
        who.add_row(escape(a.annotator), str(a.answered), str(a.skipped),
                    f"{num(a.gold_accuracy)} ({a.gold_correct}/{a.gold_n})" if a.gold_n else "no gold",
                    f"{num(a.loo_agreement)} ({a.loo_n} photos)")
    out().print(who)
    out().print("gold accuracy: share of gold photos whose primary is in the gold answer; agreement with the rest: "
                "share of photos where the primary equals the unique majority of the others' (ties left out)",
                highlight=False)
    counts = run.status_counts
    out().print(f"labels by {run.rule} (threshold {run.threshold:g}): "
                + ", ".join(f"{s} {counts.get(s, 0)}" for s in STATUSES), highlight=False)
    if run.confused:
        pairs = ", ".join(f"{c.first}/{c.second} {c.count}" for c in run.confused[:5])
        out().print("most confused (times two annotators gave the pair to one photo): " + escape(pairs),
                    highlight=False)
    for m in run.gold_mistakes[:10]:
        out().print(f"[yellow]gold answered wrongly[/] by {escape(m.annotator)} on {m.sample_id}: "
                    + escape(f"{'/'.join(m.answered)} (gold {'/'.join(m.gold)})"))
    if len(run.gold_mistakes) > 10:
        out().print(f"... and {len(run.gold_mistakes) - 10} more gold photo(s) answered wrongly (in the run)")
    derived = (f"{run.changed} background(s) of the folder changed" if run.derived
               else "the folder's backgrounds were left as they are (--measure-only)")
    out().print(f"{derived}; tables in {shown(run.run_dir)}")
