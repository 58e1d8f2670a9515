"""Dataset verbs: create, info, check."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import click
from rich.table import Table

from curate.cli import cli_advice, main, out, shown
from curate.cli.options import UserPath, creation_vocabulary, expand_home


@main.command()
@click.argument("directory", type=UserPath(path_type=Path))
@click.option("--name", help="Dataset name (default: the folder's name).")
@click.option("--label-space", callback=expand_home, default="imagenet1k", show_default=True,
              help="'imagenet1k' or a text file with one class name per line (e.g. COCO categories).")
@click.option("--backgrounds", help="Comma-separated background vocabulary (default: the paper's 14).")
@click.option("--recipe", help="A recipe name recorded in dataset.yaml (e.g. counteranimal).")
def create(directory: Path, name: str | None, label_space: str, backgrounds: str | None, recipe: str | None) -> None:
    """Create an empty dataset folder."""
    from curate.store import Dataset

    space, vocab = creation_vocabulary(label_space, backgrounds)
    ds = Dataset.create(directory, name=name or directory.name, label_space=space, backgrounds=vocab, recipe=recipe)
    out().print(f"created [bold]{shown(ds.root)}[/] ({len(ds.label_space)} classes, {len(ds.backgrounds)} backgrounds)")


@main.command()
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
def info(directory: Path) -> None:
    """Counts per class, background, group, status and licence."""
    from curate.store import Dataset, summarize
    from curate.store.summary import unfinished

    ds = Dataset.open(directory)
    counts = summarize(ds)
    out().print(f"[bold]{ds.config.get('name', directory.name)}[/] — {len(ds)} samples, label space "
                  f"'{ds.label_space.name}' ({len(ds.label_space)} classes), schema v{ds.config.get('schema_version')}")
    for line in unfinished(ds.config):  # a derived folder its stage has not finished (e.g. curate intervene)
        out().print(line, style="yellow", markup=False, highlight=False)
    for key in ("class", "background", "group", "status", "license", "source"):
        if key in counts:
            out().print(_counter_table(key, counts[key]))
    masks = _mask_sources(ds.table(["mask_path", "mask_status"]))
    if masks:
        out().print(_counter_table("mask source", masks))
        if masks.get("model"):
            out().print(f"{masks['model']} masks are unverified model proposals (curate propose-masks): SSS, RMA, "
                        "clarity, fidelity's mask method and composites leave them out until people verify them "
                        "(curate review) or --allow-model-masks", highlight=False)
    # one arrow pass over the flattened tags (a Python loop over rows costs ~1 s at 1M rows)
    import pyarrow.compute as pc

    flat = pc.list_flatten(ds.table(["tags"]).column("tags"))
    counts = pc.value_counts(flat.filter(pc.starts_with(flat, "suspect:")))
    suspects = Counter({c["values"]: c["counts"] for c in counts.to_pylist()})
    if suspects:  # curate audit's pre-tags (a pointer for reviewers, not a decision)
        out().print(_counter_table("suspect (curate audit pre-tags, not decisions)", suspects))


def _mask_sources(table) -> Counter:
    """Masks per source (curate.masks.sources: human, exact, model, rejected; "none" = no mask), by
    one arrow count of mask_status over the rows that have a mask."""
    import pyarrow.compute as pc

    from curate.masks.sources import mask_source

    has = pc.is_valid(table.column("mask_path"))
    counts = pc.value_counts(table.column("mask_status").filter(has))
    sources: Counter = Counter()
    for item in counts.to_pylist():
        sources[mask_source({"mask_path": "m", "mask_status": item["values"]})] += item["counts"]
    missing = table.num_rows - pc.sum(has.cast("int64")).as_py() if table.num_rows else 0
    if sources and missing:
        sources["none"] = missing
    return sources


def _counter_table(title: str, counter: Counter) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column(title)
    table.add_column("n", justify="right")
    for value, n in sorted(counter.items(), key=lambda kv: (-kv[1], str(kv[0]))):
        table.add_row("—" if value is None else str(value), str(n))
    return table


@main.command()
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--deep", is_flag=True, help="Also re-hash every image against its recorded sha256 and decode every mask.")
def check(directory: Path, deep: bool) -> None:
    """List every problem of a dataset folder; exit 1 when there is any error."""
    from curate.store import check_dataset

    problems = check_dataset(directory, deep=deep)
    errors = [p for p in problems if getattr(p, "severity", "error") == "error"]
    for problem in problems:
        colour = "red" if problem in errors else "yellow"
        out().print(f"[{colour}]{getattr(problem, 'severity', 'error')}[/] {cli_advice(str(problem))}")
    if errors:
        out().print(f"[bold red]{len(errors)} error(s)[/] in {shown(directory)}")
        sys.exit(1)
    from curate.store.validate import licence_warning

    note = licence_warning(directory)  # valid, but `curate publish` would leave these photos out
    if note:
        out().print("[yellow]warning[/] ", end="")
        out().print(note, markup=False, highlight=False)
    warnings = len(problems) + bool(note)
    out().print(f"[green]ok[/] {shown(directory)}" + (f" ({warnings} warning(s))" if warnings else ""))
