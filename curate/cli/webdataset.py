"""``curate collect webdataset``: import webdataset shards (a thin shell over
:func:`curate.collect.webdataset.collect_webdataset`). The export side is
``curate export DIR OUT --layout webdataset`` (curate/cli/split.py)."""
from __future__ import annotations

from pathlib import Path

import click

from curate.cli import err, out, shown
from curate.cli.collect import collect
from curate.cli.collect_sources import collect_bar
from curate.cli.options import UserPath, creation_vocabulary, expand_home


@collect.command("webdataset")
@click.argument("directory", type=UserPath(path_type=Path))
@click.option("--shards", required=True,
              help="Shard files: a brace pattern such as 'data/shard-{000000..000099}.tar' (quote it).")
@click.option("--label-space", callback=expand_home, default="imagenet1k", show_default=True,
              help="When creating the dataset without a curate.json beside the shards: 'imagenet1k' or a text "
                   "file with one class name per line.")
@click.option("--backgrounds", help="When creating the dataset: comma-separated background vocabulary.")
@click.option("--batch-size", type=int, default=1000, show_default=True, help="Samples per commit.")
@click.option("--name", help="Dataset name when creating it.")
def collect_webdataset_cmd(directory: Path, shards: str, label_space: str, backgrounds: str | None,
                           batch_size: int, name: str | None) -> None:
    """Import webdataset shards (image, json, cls, mask.png members per key); corrupt members are quarantined."""
    from curate.collect.webdataset import collect_webdataset, expand_shards

    space, vocab = creation_vocabulary(label_space, backgrounds)
    total = len(expand_shards(shards))
    with collect_bar("reading", total) as update:  # opens on the first shard: a refusal is only its error line
        report = collect_webdataset(directory, shards, label_space=space, backgrounds=vocab, name=name,
                                    batch_size=batch_size, progress=update)
    out().print(f"{shown(report.root)}: {report}")
    for where, reason in report.quarantined[:10]:
        err().print(f"[yellow]quarantined[/] {where}: {reason}")
    if len(report.quarantined) > 10:
        err().print(f"... and {len(report.quarantined) - 10} more (see quarantine.jsonl)")
    for shard, message in report.damaged_shards:
        err().print(f"[red]damaged shard[/] {shard}: {message} (the samples before the damage were read)")
