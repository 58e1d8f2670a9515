"""Publishing verbs: publish (Hugging Face Hub layout, card, upload; or FiftyOne's Hub format), report."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from curate.cli import err, main, out, progress, shown
from curate.cli.options import UserPath
from curate.shell import suggest


def _licence_line(licence) -> str:
    text = f"licence {licence.license}"
    if licence.license == "other":
        text += f" ({licence.license_name}, see {licence.license_link})"
    if licence.non_commercial:
        text += " — [bold yellow]non-commercial[/]: some images are NC, so the whole dataset is"
    return text


def _excluded_line(excluded: dict[str, int]) -> str | None:
    if not excluded:
        return None
    return "not published: " + ", ".join(f"{n} {reason}" for reason, n in sorted(excluded.items()))


@main.command("publish")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--repo", "repo_id", help="The dataset repo, OWNER/NAME (required to upload).")
@click.option("--private", is_flag=True, help="Create the repo private (an existing repo keeps its visibility).")
@click.option("--revision", help="Branch to publish to (created when missing; default main).")
@click.option("--out", "out_dir", type=UserPath(path_type=Path, file_okay=False),
              help="Write the Hub folder here and stop (no upload); check it with datasets.load_dataset(FOLDER).")
@click.option("--dry-run", is_flag=True, help="Write the folder and show the commits an upload would make; send nothing.")
@click.option("--format", "fmt", type=click.Choice(["hub", "fiftyone"]), default="hub", show_default=True,
              help="hub: parquet + dataset card for `datasets`; fiftyone: FiftyOne's Hub format (needs MongoDB).")
@click.option("--token-env", default="HF_TOKEN", show_default=True,
              help="Environment variable holding the Hugging Face token (read from the environment only).")
@click.option("--include-unsplit", is_flag=True, help="Also publish accepted images outside the split (split 'other').")
@click.option("--max-shard-mb", type=float, default=500.0, show_default=True, help="Parquet shard size limit.")
@click.option("--max-files-per-commit", type=int, default=50, show_default=True)
@click.option("--fiftyone-name", help="FiftyOne dataset name for --format fiftyone (default: the dataset's name).")
@click.option("--force", is_flag=True, help="Rewrite the folder even when nothing changed.")
def publish_cmd(directory: Path, repo_id: str | None, private: bool, revision: str | None, out_dir: Path | None,
                dry_run: bool, fmt: str, token_env: str, include_unsplit: bool, max_shard_mb: float,
                max_files_per_commit: int, fiftyone_name: str | None, force: bool) -> None:
    """Publish a dataset to the Hugging Face Hub: only images whose licence allows it, a dataset card, resumable upload."""
    from curate.publish import publish_fiftyone, publish_to_hub, write_hub_folder
    from curate.publish.upload import check_repo_id

    if repo_id is not None:
        check_repo_id(repo_id)
    max_shard_bytes = int(max_shard_mb * 1e6)
    if fmt == "fiftyone":
        if out_dir is not None:
            raise click.BadParameter("--out writes the Hub parquet layout; with --format fiftyone use --dry-run",
                                     param_hint="--out")
        if repo_id is None:
            raise click.BadParameter("give the repo to publish to, e.g. --repo alice/my-benchmark", param_hint="--repo")
        result = publish_fiftyone(directory, repo_id, private=private, token_env=token_env, dry_run=dry_run,
                                  include_unsplit=include_unsplit, name=fiftyone_name)
        out().print(f"{'would publish' if dry_run else 'published'} {result.samples} samples through FiftyOne to "
                    f"{result.url}; {_licence_line(result.licence)}")
        if _excluded_line(result.excluded):
            err().print(_excluded_line(result.excluded))
        return
    if out_dir is not None:
        with progress() as bar:
            task = bar.add_task("writing parquet shards", total=None)
            folder = write_hub_folder(directory, out_dir, repo_id=repo_id, include_unsplit=include_unsplit,
                                      max_shard_bytes=max_shard_bytes, force=force,
                                      progress=lambda d, t: bar.update(task, completed=d, total=t))
        _print_folder(folder)
        upload = suggest("curate publish {dir} --repo OWNER/NAME", dir=directory)
        out().print(f"wrote {shown(folder.path)} (not uploaded; `{upload}` uploads)")
        return
    if repo_id is None:
        raise click.BadParameter("give the repo to publish to (--repo OWNER/NAME), or --out FOLDER to only write "
                                 "the Hub folder", param_hint="--repo")
    with progress() as bar:
        tasks: dict[str, int] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task("writing parquet shards" if stage == "write" else "uploading files",
                                            total=total)
            bar.update(tasks[stage], completed=done, total=total)

        result = publish_to_hub(directory, repo_id, private=private, revision=revision, token_env=token_env,
                                dry_run=dry_run, include_unsplit=include_unsplit, max_shard_bytes=max_shard_bytes,
                                max_files_per_commit=max_files_per_commit, progress=on_progress)
    _print_folder(result.folder)
    if result.plan is not None:
        plan = result.plan
        out().print(f"dry run: an upload to {repo_id} would make {plan.commits} commit(s) of {len(plan.to_upload)} "
                    f"file(s) ({len(plan.skipped)} recorded as already uploaded); nothing was sent")
        return
    upload = result.upload
    assert upload is not None
    out().print(f"published to {upload.url}: {upload.commits} commit(s), {len(upload.uploaded)} file(s) uploaded, "
                f"{len(upload.skipped)} already there" + (f", {len(upload.deleted)} stale removed" if upload.deleted else ""))


def _print_folder(folder) -> None:
    table = Table(title=f"Hub folder {shown(folder.path)}" + (" (unchanged, reused)" if folder.reused else ""),
                  title_justify="left")
    table.add_column("split")
    table.add_column("images", justify="right")
    for split, n in folder.splits.items():
        table.add_row(split, str(n))
    out().print(table)
    out().print(f"{folder.classes} classes; {_licence_line(folder.licence)}")
    if _excluded_line(folder.excluded):
        err().print(_excluded_line(folder.excluded))


@main.command("report")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--out", "out_dir", type=UserPath(path_type=Path, file_okay=False),
              help="Folder for report.md / report.html / PNGs (default DIR/runs/report).")
@click.option("--run", "runs", multiple=True, help="Evaluation run(s) for Table 2 / Fig. 2 (default: all).")
@click.option("--gallery", type=int, default=3, show_default=True, help="Easy and hard examples per class.")
def report_cmd(directory: Path, out_dir: Path | None, runs: tuple[str, ...], gallery: int) -> None:
    """One Markdown + HTML report: data layout, drops, Table 2, Fig. 2, SSS/RMA by group, a gallery."""
    from curate.report import REPORT_HTML, build_report

    path = build_report(directory, out_dir, runs=list(runs) or None, gallery_per_group=gallery)
    out().print(f"wrote {shown(path)} and {shown(path.with_name(REPORT_HTML))} (figures beside them)")
