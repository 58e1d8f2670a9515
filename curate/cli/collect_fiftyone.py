"""``curate collect fiftyone NAME DIRECTORY``: import a FiftyOne dataset or saved view (a thin shell
over :func:`curate.collect.fiftyone_import.collect_fiftyone`)."""
from __future__ import annotations

from pathlib import Path

import click

from curate.cli import err, out
from curate.cli.collect import collect
from curate.cli.collect_sources import collect_bar, interruptible, print_collect_report
from curate.cli.options import UserPath, creation_vocabulary


@collect.command("fiftyone")
@click.argument("name")
@click.argument("directory", type=UserPath(path_type=Path))
@click.option("--view", help="A saved view of the dataset to import (default: every sample); a group_by view "
                             "imports every sample of each group.")
@click.option("--label-field", help="The Classification field that holds the class (default: the only one).")
@click.option("--mask-field", help="A Segmentation or Detections (instance masks) field: the pixels of the "
                                   "sample's label become its object mask (default: no masks).")
@click.option("--mask-label", help="Take the mask pixels of this label instead of the sample's class label.")
@click.option("--mask-source", default="human", show_default=True,
              help="mask_status of the imported masks: human, exact or model:<model id> (docs/design.md#masks).")
@click.option("--field", "fields", multiple=True, help="A sample field to keep in extra.fiftyone_fields (repeatable).")
@click.option("--license", "license_", help="Licence of samples without one in --license-field (e.g. cc-by).")
@click.option("--attribution", help="Attribution of samples without one in --attribution-field.")
@click.option("--license-field", help="The sample field that holds each image's licence.")
@click.option("--attribution-field", help="The sample field that holds each image's attribution.")
@click.option("--status", type=click.Choice(["candidate", "accepted", "rejected"]), default="candidate",
              show_default=True)
@click.option("--skip-unknown", is_flag=True,
              help="Leave out (and count) samples whose label is not in the label space, instead of failing.")
@click.option("--link", is_flag=True,
              help="Hard-link media files into the folder instead of copying them, where the stored bytes are the "
                   "file's (JPEG/PNG; same file system); an edit of such a file then changes the folder.")
@click.option("--label-space", default="imagenet1k", show_default=True,
              help="When creating the folder: 'imagenet1k', 'fiftyone' (the dataset's classes for the label field) "
                   "or a text file with one class name per line. An existing folder keeps its own.")
@click.option("--backgrounds", help="When creating the folder: comma-separated background vocabulary.")
@click.option("--concurrency", type=int, default=4, show_default=True)
@click.option("--batch-size", type=int, default=256, show_default=True, help="Commit every this many samples.")
@click.option("--name", "dataset_name", help="Dataset name when creating the folder (default: the folder's name).")
def collect_fiftyone_cmd(name: str, directory: Path, view: str | None, label_field: str | None,
                         mask_field: str | None, mask_label: str | None, mask_source: str, fields: tuple[str, ...],
                         license_: str | None, attribution: str | None, license_field: str | None,
                         attribution_field: str | None, status: str, skip_unknown: bool, link: bool, label_space: str,
                         backgrounds: str | None, concurrency: int, batch_size: int, dataset_name: str | None) -> None:
    """Import a FiftyOne dataset (or a saved view of it) into DIRECTORY: class from a Classification
    field, object masks from a Segmentation or instance masks, tags and named fields; resumable."""
    from curate.collect.fiftyone_import import FROM_DATASET, collect_fiftyone

    if label_space == FROM_DATASET:
        space, vocab = FROM_DATASET, creation_vocabulary("imagenet1k", backgrounds)[1]
    else:
        space, vocab = creation_vocabulary(label_space, backgrounds)
    with interruptible(), collect_bar("importing", None) as update:  # drawn once the import starts
        report = collect_fiftyone(
            name, directory, view=view, label_field=label_field, mask_field=mask_field, mask_label=mask_label,
            mask_source=mask_source, fields=fields, license=license_, attribution=attribution,
            license_field=license_field, attribution_field=attribution_field, status=status,
            skip_unknown=skip_unknown, link=link, label_space=space, backgrounds=vocab, dataset_name=dataset_name,
            concurrency=concurrency, batch_size=batch_size, progress=update)
    print_collect_report(report)
    skipped = report.info.get("skipped") or []
    if skipped:
        err().print(f"[yellow]{len(skipped)} sample(s) left out[/]: "
                    + "; ".join(f"{sid}: {why}" for sid, why in skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
    if link:
        out().print(f"media: {report.info['linked']} hard-linked, {report.info['copied']} copied "
                    "(converted by the store, or on another file system)")
    no_mask = report.info.get("no_mask") or []
    if mask_field and no_mask:
        out().print(f"{len(no_mask)} sample(s) have no pixel of their label in {mask_field!r}: imported without a mask")
