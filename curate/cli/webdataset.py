"""``curate collect webdataset``: import webdataset shards (a thin shell over
:func:`curate.collect.webdataset.collect_webdataset`). The export side is
``curate export DIR OUT --layout webdataset`` (curate/cli/split.py)."""
from __future__ import annotations

from pathlib import Path

import click

from curate.cli import err, out, progress
from curate.cli.collect import collect


@collect.command("webdataset")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--shards", required=True,
              help="Shard files: a brace pattern such as 'data/shard-{000000..000099}.tar' (quote it).")
@click.option("--label-space", default="imagenet1k", show_default=True,
              help="When creating the dataset without a curate.json beside the shards: 'imagenet1k' or a text "
                   "file with one class name per line.")
@click.option("--backgrounds", help="When creating the dataset: comma-separated background vocabulary.")
@click.option("--batch-size", type=int, default=1000, show_default=True, help="Samples per commit.")
@click.option("--name", help="Dataset name when creating it.")
def collect_webdataset_cmd(directory: Path, shards: str, label_space: str, backgrounds: str | None,
                           batch_size: int, name: str | None) -> None:
    """Import webdataset shards (image, json, cls, mask.png members per key); corrupt members are quarantined."""
    from curate.collect.webdataset import collect_webdataset, expand_shards
    from curate.labels import LabelSpace

    space = None
    if label_space != "imagenet1k":
        path = Path(label_space)
        if not path.is_file():
            raise click.BadParameter(f"{label_space!r} is neither 'imagenet1k' nor a file", param_hint="--label-space")
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                 if line.strip() and not line.startswith("#")]
        space = LabelSpace.from_names(path.stem, names)
    vocab = [b.strip() for b in backgrounds.split(",") if b.strip()] if backgrounds else None
    total = len(expand_shards(shards))
    with progress() as bar:
        task = bar.add_task("reading shards", total=total)
        report = collect_webdataset(directory, shards, label_space=space, backgrounds=vocab, name=name,
                                    batch_size=batch_size,
                                    progress=lambda label, done, target: bar.update(task, completed=done))
    out().print(f"{report.root}: {report}")
    for where, reason in report.quarantined[:10]:
        err().print(f"[yellow]quarantined[/] {where}: {reason}")
    if len(report.quarantined) > 10:
        err().print(f"... and {len(report.quarantined) - 10} more (see quarantine.jsonl)")
    for shard, message in report.damaged_shards:
        err().print(f"[red]damaged shard[/] {shard}: {message} (the samples before the damage were read)")
