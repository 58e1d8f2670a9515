"""The verbs of issue 44's known-truth team and spread: ``simulate-annotators`` and ``annotator-spread``."""
from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from curate.cli import main, out, shown
from curate.cli.options import UserPath, run_options
from curate.formatting import pct


@main.command("simulate-annotators")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--team", default="careful:0.05,confuse:grass-tree:0.3,random:0.1", show_default=True,
              help="Comma-separated members: careful:<error rate>, confuse:<background>-<background>:<rate>, "
                   "random:<rate> (curate.collect.annotator_sim).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every answer and mask drawn.")
@click.option("--overlap", type=int, default=None, help="Annotators per photo (default: the whole team).")
@click.option("--gold", type=float, default=0.0, show_default=True,
              help="Share of photos whose true background is written as an adjudicator's gold answer.")
def simulate_annotators_cmd(directory: Path, team: str, seed: int, overlap: int | None, gold: float) -> None:
    """Label a synthetic world with simulated annotators of known confusion into its annotation table."""
    from curate.collect.annotator_sim import simulate_annotators
    from curate.store import Dataset

    result = simulate_annotators(Dataset.open(directory), team, seed=seed, overlap=overlap, gold=gold)
    table = Table(title=f"simulated team (seed {seed}): answers, accuracy against the world's truth, mask IoU",
                  title_justify="left")
    for column in ("annotator", "kind", "answers", "accuracy %", "expected %", "mean mask IoU vs truth"):
        table.add_column(column, justify="left" if column in ("annotator", "kind") else "right")
    for m in result.team:
        ious = list(result.mask_iou[m.name].values())
        table.add_row(m.name, m.text, str(len(result.labels[m.name])), pct(result.accuracy(m.name), 1),
                      pct(result.true_accuracy(m.name), 1), f"{sum(ious) / len(ious):.3f}" if ious else "—")
    out().print(table)
    out().print(f"annotation table of {shown(directory)}: {result.outcome}; {len(result.gold)} gold photo(s)")


@main.command("annotator-spread")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--run", "runs", multiple=True,
              help="Evaluation runs to measure (default: the newest of each model and setup).")
@click.option("--split-run", default=None, help="The split whose rule re-derives easy/hard (default: the current one).")
@click.option("--rule", type=click.Choice(["majority", "dawid-skene"]), default=None,
              help="How the agreed labels are decided (default: the rule of the folder's last `curate agreement`, "
                   "else dawid-skene).")
@click.option("--threshold", type=float, default=None,
              help="Below this confidence a photo is disputed (default: that agreement's, else the rule's).")
@run_options
def annotator_spread_cmd(directory: Path, runs: tuple[str, ...], split_run: str | None, rule: str | None,
                         threshold: float | None, run_name: str | None, overwrite: bool) -> None:
    """Each class's drop under the agreed labels, each annotator's and the disputes in either group."""
    from curate.stages.annotator_spread import SpreadSettings, annotator_spread

    record = annotator_spread(directory, None, SpreadSettings(runs=runs, split_run=split_run, rule=rule,
                                                              threshold=threshold),
                              run_name=run_name, overwrite=overwrite)
    out().print(spread_table(record))
    out().print(f"{len(record.flagged())} class(es) flagged; wrote {shown(record.run_dir)}")


def spread_table(record) -> Table:
    """An annotator-spread run as a table: per model and class, the drop under each labelling (points),
    the spread and the flips (also what ``curate compare`` prints)."""
    table = Table(title=f"drop by who labelled (points; easy/hard re-derived per labelling by split "
                        f"{record.split_run}; run {record.name})", title_justify="left")
    for column in ("model", "class", *record.columns, "spread", "flag"):  # names from a server: never markup
        table.add_column(escape(column), justify="left" if column in ("model", "class", "flag") else "right")
    for r in record.rows():
        table.add_row(escape(r.model), escape(f"{r.class_index} {r.class_name}"),
                      *(pct(r.drops.get(n, float("nan")), 1) for n in record.columns), pct(r.spread, 1),
                      escape(record.flag_text(r.class_index)))
    return table
