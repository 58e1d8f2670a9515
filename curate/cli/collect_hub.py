"""``curate collect hub SOURCE DIR``: import a Hugging Face dataset (a thin shell over
:func:`curate.collect.hub.collect_hub`): a repo id (cache only unless ``--online``), a local Hub
folder such as one ``curate publish --out`` wrote, or a ``datasets`` save folder."""
from __future__ import annotations

from pathlib import Path

import click

from curate.cli import err, out
from curate.cli.collect import collect
from curate.cli.collect_sources import collect_bar, interruptible, print_collect_report
from curate.cli.options import UserPath, creation_vocabulary, expand_home


@collect.command("hub")
@click.argument("source")
@click.argument("directory", type=UserPath(path_type=Path))
@click.option("--revision", help="Branch, tag or commit of a repo id (default main); resolved to a commit and recorded.")
@click.option("--online", is_flag=True,
              help="Download what the local Hugging Face cache lacks (default: read the cache only).")
@click.option("--endpoint", help="Hub base URL (default: huggingface_hub's, i.e. $HF_ENDPOINT or huggingface.co).")
@click.option("--token-env", default="HF_TOKEN", show_default=True,
              help="Environment variable holding a token for private repos (read from the environment only).")
@click.option("--cache-dir", type=UserPath(path_type=Path), help="Hugging Face cache folder (default: HF_HUB_CACHE).")
@click.option("--config", help="The dataset config to import, when the card lists several (default: its default one).")
@click.option("--image-column", default="image", show_default=True, help="Any dataset: the image column.")
@click.option("--label-column", default="label", show_default=True,
              help="Any dataset: the label column (ClassLabel names, strings or indices; mapped as `collect folder` "
                   "maps folder names).")
@click.option("--mask-column", help="Any dataset: an object-mask column (image size).")
@click.option("--license-column", help="Any dataset: a per-row licence column.")
@click.option("--attribution-column", help="Any dataset: a per-row attribution column.")
@click.option("--license", "license_", help="Licence of rows without one (e.g. cc-by).")
@click.option("--attribution", help="Attribution of rows without one.")
@click.option("--status", type=click.Choice(["candidate", "accepted", "rejected"]),
              help="Any dataset: status of the new samples (default candidate; a curate-published folder's rows "
                   "come back accepted).")
@click.option("--allow-restricted-licenses", is_flag=True,
              help="Keep rows whose licence forbids redistribution (ND, all rights reserved); only if you have the "
                   "rights.")
@click.option("--split", "splits", multiple=True,
              help="Import only this split (repeatable, or comma-separated: --split train,validation; default: "
                   "every split).")
@click.option("--skip-unknown", is_flag=True,
              help="Leave out (and count) rows whose label is not in the label space, instead of failing.")
@click.option("--label-space", callback=expand_home, default="imagenet1k", show_default=True,
              help="When creating the dataset: 'imagenet1k', 'hub' (the dataset's own class names: its ClassLabel "
                   "names, else its sorted labels) or a text file with one class name per line. An existing dataset "
                   "keeps its own.")
@click.option("--backgrounds", help="When creating the dataset: comma-separated background vocabulary (default: a "
                                    "curate-published folder's own, else the paper's 14).")
@click.option("--concurrency", type=int, default=4, show_default=True)
@click.option("--batch-size", type=int, default=256, show_default=True, help="Rows per commit.")
@click.option("--name", help="Dataset name when creating it (default: the repo's or folder's name).")
def collect_hub_cmd(source: str, directory: Path, revision: str | None, online: bool, endpoint: str | None,
                    token_env: str, cache_dir: Path | None, config: str | None, image_column: str, label_column: str,
                    mask_column: str | None, license_column: str | None, attribution_column: str | None,
                    license_: str | None, attribution: str | None, status: str | None,
                    allow_restricted_licenses: bool, splits: tuple[str, ...], skip_unknown: bool, label_space: str,
                    backgrounds: str | None, concurrency: int, batch_size: int, name: str | None) -> None:
    """Import SOURCE (a Hub dataset repo id, a local Hub folder, or a `datasets` save) into DIRECTORY.
    A folder curate published comes back row for row; any image-classification dataset is mapped
    to the label space. Resumable: run the same command again after an interruption."""
    from curate.collect.hub import FROM_DATASET, collect_hub

    if label_space == FROM_DATASET:
        space, vocab = FROM_DATASET, creation_vocabulary("imagenet1k", backgrounds)[1]
    else:
        space, vocab = creation_vocabulary(label_space, backgrounds)
    chosen = [part.strip() for value in splits for part in value.split(",") if part.strip()]
    with interruptible(), collect_bar("importing", None) as update:
        report = collect_hub(source, directory, revision=revision, endpoint=endpoint, online=online,
                             token_env=token_env, cache_dir=cache_dir, config=config, image_column=image_column,
                             label_column=label_column, mask_column=mask_column, license_column=license_column,
                             attribution_column=attribution_column, license=license_, attribution=attribution,
                             status=status, allow_restricted=allow_restricted_licenses, label_space=space,
                             splits=chosen or None, skip_unknown=skip_unknown, backgrounds=vocab, name=name, concurrency=concurrency, batch_size=batch_size,
                             progress=update)
    print_collect_report(report, heading="split")  # the import's groups are the source's splits
    info = report.info
    out().print(f"source {info['source']}" + (" (a curate-published folder: rows restored as published)"
                                               if info["curate_folder"] else ""))
    unmapped = info.get("unmapped") or {}
    if unmapped:
        hints = info.get("unmapped_hints") or {}
        err().print(f"[yellow]{sum(unmapped.values())} row(s) with labels outside the label space[/], skipped "
                    "(--skip-unknown): ", end="")
        err().print("; ".join(f"{label!r} ({n}{': ' + hints[label] if hints.get(label) else ''})"
                              for label, n in list(unmapped.items())[:8]) + (" ..." if len(unmapped) > 8 else ""),
                    markup=False, highlight=False)
