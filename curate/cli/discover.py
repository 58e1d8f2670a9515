"""``curate discover``, ``curate groups``, ``curate accept-group`` / ``reject-group``: backgrounds nobody listed."""
from __future__ import annotations

import getpass
from pathlib import Path

import click

from curate.cli import StageProgress, main, out, progress, shown
from curate.cli.options import CLIP_ONLY, UserPath, device_options, model_options, one_model_spec
from curate.discover.phrases import MIN_NAME_SCORE
from curate.shell import suggest

#: What a group's figures can and cannot show, printed under every table of groups (then :func:`groups_note`'s
#: run-specific sentences: chance, the bootstrap minimum, the name threshold).
GROUPS_NOTE = (
    "acc = the reference's top-1 accuracy on the group's photos, each assigned by groups fitted on the other half "
    "of its class (held out); gap = accuracy on the rest of the class minus on the group, in points (positive: the "
    "model does worse on this background); [95% bootstrap intervals]; q = Benjamini-Hochberg over every group of "
    "the run (a group is proposed when q < FDR: about that share of proposed groups may be noise); labelled as = the "
    "vocabulary label most of its photos already carry (under 50%: a background nobody listed). A group is a "
    "correlation in this data, not a cause: `curate intervene` tests causes.")

#: The ways forward printed beside a reason a class has no groups.
REASON_HINTS = {
    "no_trusted_mask": "removal uses only masks a person verified or the generator drew: add --allow-model-masks "
                       "to use model-made ones, or --background-embedding projection, which needs no mask",
    "too_few_photos": "fewer than two halves of --min-half photos",
}


def groups_note(record) -> str:
    """:data:`GROUPS_NOTE` and what holds for this run: the name threshold, the bootstrap minimum, chance."""
    from curate.discover.decide import name_threshold
    from curate.discover.figures import bootstrap_minimum, chance_text

    return (f"{GROUPS_NOTE} name = the group's top phrase (score = how much closer the phrase lies to the group's "
            f"mean background than to its class's, in CLIP cosine, x100 = zero-shot logits; then its margin over the "
            f"next phrase); under {name_threshold(record):g} it is only the closest phrase: unnamed, to be named by a "
            f"person (accept-group --name). No interval for a group of fewer than {bootstrap_minimum(record)} photos "
            f"(too few to bootstrap). {chance_text(record)}")


def _actor(actor: str | None) -> str:
    if actor:
        return actor
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (a container without a passwd entry)
        raise click.UsageError("give --actor NAME: who decided (no login name to default to)") from None


def print_groups(record, *, show_all: bool = False) -> None:
    """The run's groups as a table (significant ones only unless ``show_all``), then what they mean."""
    from rich.table import Table

    from curate.discover.decide import top_name
    from curate.discover.figures import has_interval

    groups = record.groups if show_all else record.proposed
    decisions = record.decisions()
    table = Table(title=f"{'groups' if show_all else 'proposed groups'} of {record.name} "
                        f"(FDR {record.fdr:g}, {record.counts.get('significant', 0)} of "
                        f"{record.counts.get('groups', 0)} groups significant)")
    for column in ("group", "class", "photos", "acc %", "gap", "q", "name (score, margin)", "next names", "labelled as",
                   "decided"):
        table.add_column(column, justify="right" if column in ("photos", "acc %", "gap", "q") else "left")
    for g in groups:
        decided = decisions.get(g.group_id, {})
        sampled = has_interval(record, g)
        name = top_name(record, g)
        table.add_row(g.group_id + ("" if g.significant else " (n.s.)"), g.class_name, str(g.size),
                      f"{100 * g.accuracy:.1f}" + (f" [{100 * g.accuracy_low:.0f}, {100 * g.accuracy_high:.0f}]"
                                                   if sampled else ""),
                      f"{g.gap:+.1f}" + (f" [{g.gap_low:+.0f}, {g.gap_high:+.0f}]" if sampled else ""),
                      f"{g.q_value:.3f}", name.text() if name else "(no names)",
                      "; ".join(p for p, _ in g.names[1:3]),
                      f"{g.labelled_as} ({100 * g.labelled_share:.0f}%)" if g.labelled_as else "nothing (new)",
                      (f"{decided['decision']}" + (f" as {decided['background']!r}" if decided.get("background") else ""))
                      if decided else "")
    out().print(table)
    counts = record.counts
    lines = [f"{counts.get('grouped', 0)} of {counts.get('photos', 0)} photos grouped in {counts.get('classes', 0)} "
             f"classes; background embedding by class: "
             + ", ".join(f"{v} {k}" for k, v in (counts.get("methods") or {}).items())]
    if counts.get("classes_without_groups"):
        lines.append("classes without groups: " + ", ".join(
            f"{v} {k.replace('_', ' ')}" + (f" ({REASON_HINTS[k]})" if k in REASON_HINTS else "")
            for k, v in counts["classes_without_groups"].items()))
    if counts.get("left_out"):
        lines.append("photos left out: " + ", ".join(f"{v} {k.replace('_', ' ')}"
                                                     for k, v in counts["left_out"].items()))
    for line in [*lines, groups_note(record)]:
        out().print(line, highlight=False)


@main.command("discover")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@model_options(required=False, accepts=CLIP_ONLY)
@click.option("--phrases", type=UserPath(path_type=Path, exists=True, dir_okay=False), default=None,
              help="Your phrase bank (UTF-8, one phrase per line; default: curate's, datasets/phrases.txt).")
@click.option("--max-groups", type=int, default=6, show_default=True, help="Most groups per class (K is chosen in 2..K).")
@click.option("--fdr", type=float, default=0.1, show_default=True,
              help="False-discovery rate over all groups of the run (Benjamini-Hochberg).")
@click.option("--seed", type=int, default=0, show_default=True, help="Halves, k-means and permutations.")
@click.option("--predictions", multiple=True,
              help="Finished evaluation runs whose correctness scores the groups (repeatable; mean over runs).")
@click.option("--background-embedding", type=click.Choice(["auto", "removal", "projection", "whole"]), default="auto",
              show_default=True, help="removal: object masked out and filled; projection: class direction "
                                      "projected out (no mask needed, weaker); auto: removal where 90% have masks; "
                                      "whole: the whole image, object and all (the baseline).")
@click.option("--allow-model-masks", is_flag=True, help="Treat unverified model-made masks as trusted.")
@click.option("--classes", "class_names", default=None, help="Comma-separated class names (default: every class).")
@click.option("--min-half", type=int, default=10, show_default=True,
              help="Photos per half below which a class gets no groups.")
@click.option("--permutations", "n_perm", type=int, default=2000, show_default=True, help="Permutations of the null.")
@click.option("--error-weight", type=float, default=0.0, show_default=True,
              help="> 0: error-aware grouping (Domino-style); still scored on the other half.")
@click.option("--min-name-score", type=float, default=MIN_NAME_SCORE, show_default=True,
              help="A group's top phrase names it only from this score (CLIP cosine, x100 = zero-shot logits); "
                   "below, the group is unnamed and accept-group needs --name.")
@device_options
@click.option("--all", "show_all", is_flag=True, help="List every group, not only the significant ones.")
@click.option("--run-name", default=None, help="Run folder under DIR/runs/ (default: discover-<model>-<UTC time>).")
@click.option("--overwrite", is_flag=True, help="Replace an existing run of that name.")
def discover_cmd(directory: Path, model: str | None, pretrained: str | None, phrases: Path | None, max_groups: int, fdr: float, seed: int,
                 predictions: tuple[str, ...], background_embedding: str, allow_model_masks: bool,
                 class_names: str | None, min_half: int, n_perm: int, error_weight: float, min_name_score: float,
                 device: str, precision: str, show_all: bool, run_name: str | None, overwrite: bool) -> None:
    """Find backgrounds nobody listed: groups of photos within a class, named, for people to accept.

    The CLIP (--model / --pretrained) embeds the backgrounds and names the groups; without
    --predictions it is also the reference whose accuracy scores them. Groups are fitted on one half of each class and scored on the other; a permutation null and
    the FDR say which are more than noise. Nothing is labelled until a person accepts a group
    (`curate accept-group`, or in review: `curate review groups DIR --fiftyone`).
    """
    from curate.stages.discover import DiscoverSettings, discover

    settings = DiscoverSettings(max_groups=max_groups, fdr=fdr, seed=seed, predictions=tuple(predictions),
                                background_embedding=background_embedding, allow_model_masks=allow_model_masks,
                                classes=tuple(c.strip() for c in class_names.split(",") if c.strip())
                                if class_names else (), min_half=min_half, n_perm=n_perm, error_weight=error_weight,
                                min_name_score=min_name_score, phrases=phrases, device=device, precision=precision)
    with progress() as bar:
        record = discover(directory, one_model_spec(model, pretrained), settings, run_name=run_name, overwrite=overwrite,
                          progress=StageProgress(bar))
    print_groups(record, show_all=show_all)
    out().print(f"run: {shown(record.run_dir)}", highlight=False)
    if record.proposed:
        from curate.discover.decide import top_name

        first = record.proposed[0]
        named = top_name(record, first)
        name = "[--name NAME]" if named and named.named else "--name NAME"
        values = {"dir": shown(directory), "group": first.group_id}
        out().print(f"next: look at them (`{suggest('curate review groups {dir} --fiftyone', **values)}`), then "
                    f"`{suggest('curate accept-group {dir} {group} ', **values)}{name}` or "
                    f"`{suggest('curate reject-group {dir} {group}', **values)}`", highlight=False)


@main.command("groups")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--run", "run_name", default=None, help="The discovery run (default: the latest).")
@click.option("--all", "show_all", is_flag=True, help="List every group, not only the significant ones.")
def groups_cmd(directory: Path, run_name: str | None, show_all: bool) -> None:
    """Show a discovery run's groups, their figures, names and the decisions made on them."""
    from curate.runs.discovery import DiscoveryRun

    print_groups(DiscoveryRun.of_folder(directory, run_name), show_all=show_all)


@main.command("accept-group")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.argument("group_id")
@click.option("--name", default=None,
              help="The background label it becomes (default: its top phrase, article dropped; required when the "
                   "group is unnamed, its top phrase scoring under the run's min_name_score).")
@click.option("--run", "run_name", default=None, help="The discovery run (default: the latest).")
@click.option("--actor", default=None, help="Who decided (recorded with every label; default: your login).")
@click.option("--force", is_flag=True,
              help="Replace an acceptance under another name: its photos get their earlier label back first.")
def accept_group_cmd(directory: Path, group_id: str, name: str | None, run_name: str | None,
                     actor: str | None, force: bool) -> None:
    """Accept a discovered group: its name joins the vocabulary and labels its photos (source human)."""
    from curate.discover.decide import accept_group
    from curate.runs.discovery import DiscoveryRun
    from curate.store import Dataset

    record = DiscoveryRun.of_folder(directory, run_name)
    decision = accept_group(Dataset.open(directory), record, group_id, name=name, actor=_actor(actor), force=force)
    out().print(decision.line(), highlight=False)
    out().print(f"next: `{suggest('curate split {dir} --reference ...', dir=shown(directory))}` splits on it as on any label",
                highlight=False)


@main.command("reject-group")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.argument("group_id")
@click.option("--run", "run_name", default=None, help="The discovery run (default: the latest).")
@click.option("--actor", default=None, help="Who decided (default: your login).")
@click.option("--force", is_flag=True,
              help="Reject an accepted group: undo its acceptance (photos get their earlier label back; the name "
                   "leaves the vocabulary when the acceptance added it and no photo carries it).")
def reject_group_cmd(directory: Path, group_id: str, run_name: str | None, actor: str | None, force: bool) -> None:
    """Reject a discovered group: recorded in the run, nothing in the dataset changes (an accepted
    group only with --force, which undoes the acceptance)."""
    from curate.discover.decide import reject_group
    from curate.runs.discovery import DiscoveryRun
    from curate.store import Dataset

    record = DiscoveryRun.of_folder(directory, run_name)
    decision = reject_group(record, group_id, actor=_actor(actor), force=force,
                            ds=Dataset.open(directory) if force else None)
    out().print(decision.line(), highlight=False)


def _review_group():
    from curate.cli.review import review

    return review


@_review_group().command("groups")
@click.argument("words", nargs=-1, required=True, metavar="[pull] DIR")
@click.option("--run", "run_name", default=None, help="The discovery run (default: the latest).")
@click.option("--fiftyone", "backend", flag_value="fiftyone", default=True,
              help="Saved views in FiftyOne; decide with discover: tags (the default).")
@click.option("--labelstudio", "backend", flag_value="labelstudio", help="One Label Studio project per group.")
@click.option("--name", default=None, help="FiftyOne dataset name (default: the folder's).")
@click.option("--url", default=None, help="--labelstudio: the server, e.g. http://127.0.0.1:8080")
@click.option("--token-env", default="LABEL_STUDIO_API_KEY", show_default=True,
              help="--labelstudio: the environment variable holding your token.")
@click.option("--media", type=click.Choice(["local-files", "url", "inline"]), default="local-files", show_default=True,
              help="--labelstudio: how the server gets the images (as `curate review labelstudio`).")
@click.option("--document-root", type=UserPath(path_type=Path, file_okay=False),
              help="--labelstudio local-files: the server's LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT.")
@click.option("--media-url", help="--labelstudio --media url: where DIR is served.")
@click.option("--group", "groups", multiple=True, help="Only this group (repeatable; default: every proposed one).")
@click.option("--force", is_flag=True, help="FiftyOne push: drop another run's discover: tags still on the samples.")
@click.option("--actor", default=None, help="pull: who decided (default: your login / the annotators).")
def review_groups(words: tuple[str, ...], run_name: str | None, backend: str, name: str | None, url: str | None,
                  token_env: str, media: str, document_root: Path | None, media_url: str | None,
                  groups: tuple[str, ...], force: bool, actor: str | None) -> None:
    """Show a discovery run's proposed groups to people, or (`groups pull DIR`) apply their decisions.

    FiftyOne: one saved view per group (discover-<group>); tag any photo of it discover:accept,
    discover:reject or discover:name=<text>, and photos that do not belong discover:out.
    Label Studio (--labelstudio --url ...): one project per group, accept / reject and a name on
    every task, in group / not this background per photo; the majority decides.
    """
    from curate.discover import review as group_review
    from curate.runs.discovery import DiscoveryRun

    if len(words) == 2 and words[0] == "pull":
        pull, directory = True, Path(words[1]).expanduser()
    elif len(words) == 1:
        pull, directory = False, Path(words[0]).expanduser()
    else:
        raise click.UsageError("give DIR to push, or `pull DIR` to read the decisions back")
    if not directory.is_dir():
        raise click.BadParameter(f"{shown(directory)} is not a folder", param_hint="DIR")
    record = DiscoveryRun.of_folder(directory, run_name)
    if backend == "labelstudio":
        if not url:
            raise click.UsageError("--labelstudio needs --url (the Label Studio server)")
        if pull:
            result = group_review.pull_groups_labelstudio(directory, record, url=url, token_env=token_env, actor=actor)
        else:
            from curate.review.labelstudio import MediaSource

            projects = group_review.push_groups_labelstudio(directory, record, url=url, token_env=token_env,
                                                            groups=groups or None,
                                                            media=MediaSource(media, document_root, media_url))
            for group_id, project in projects.items():
                out().print(f"{group_id}: project {project} at {url}", highlight=False)
            pull_command = suggest("curate review groups pull {dir} --labelstudio --url {url}", dir=shown(directory), url=url)
            out().print(f"then: `{pull_command}`",
                        highlight=False)
            return
    elif pull:
        result = group_review.pull_groups_fiftyone(directory, record, name=name, actor=actor)
    else:
        views = group_review.push_groups_fiftyone(directory, record, name=name, groups=groups or None, force=force)
        out().print(f"{len(views)} saved view(s): {', '.join(views)}", highlight=False)
        out().print(f"open them with `{suggest('curate review fiftyone {dir} --launch', dir=shown(directory))}`, tag, then "
                    f"`{suggest('curate review groups pull {dir}', dir=shown(directory))}`", highlight=False)
        return
    for line in result.lines() or ["no decision found"]:
        out().print(line, highlight=False)
