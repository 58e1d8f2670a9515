"""People decide on discovered groups in FiftyOne or Label Studio (docs/design.md#discover).

``curate discover`` proposes groups of photos whose backgrounds look alike and that the
reference model scores differently (:class:`curate.runs.DiscoveryRun`); nothing it found enters
the vocabulary until a person accepts it. This module shows each proposed group to reviewers
and reads their decisions back through :func:`curate.discover.decide.accept_group` and
:func:`curate.discover.decide.reject_group` (the only writers).

**FiftyOne.** :func:`push_groups_fiftyone` works on the FiftyOne dataset ``curate review
fiftyone`` uses for the folder (pushed first when it does not exist yet). It sets three sample
fields for the run's members: ``discover_group`` (the group id, null for other photos),
``discover_names`` (the group's top names) and ``discover_rank`` (1 = the photo nearest the
group's centroid), and saves one view per proposed group, ``discover-<group id>``, with the
group's photos, most typical first; its description gives the class, the names, the held-out
accuracy against the rest of the class and the gap with its q-value. A reviewer tags any photo
of a group's view:

=========================  =====================================================================
tag                        meaning
=========================  =====================================================================
``discover:accept``        accept the group under its top name
``discover:name=<text>``   accept it under the name ``<text>`` (a rename; it implies accept)
``discover:reject``        reject the group (nothing is written to the folder)
``discover:out``           on a photo: it does not show that background; it stays as it is
=========================  =====================================================================

:func:`pull_groups_fiftyone` reads them. A group whose tags contradict (accept and reject, two
different names, a rename with reject) or that carries a ``discover:`` tag outside this table is
refused with a message naming the tags; the other groups are applied. The folder's own review
(``curate review pull``) passes over ``discover:`` tags (:data:`curate.review.vocabulary.DISCOVER_PREFIX`).
A re-push of the folder (``curate review fiftyone``) rewrites sample tags: pull the groups first.

**Label Studio.** :func:`push_groups_labelstudio` makes one project per proposed group, titled
``<group id>: <top name>``, one task per photo of the group (most typical first, images served
as :func:`curate.review.labelstudio.push_labelstudio` serves them, :class:`MediaSource`). Every
task shows the image, the group's names and numbers, a per-photo choice ``in group`` / ``not
this background`` (``in group`` pre-selected) and the group-level controls: a choice ``accept`` /
``reject`` and a text ``name`` pre-filled with the top name (both pre-fills are a prediction, as
curate's other projects pre-fill, so a reviewer's submitted answer is always theirs).
:func:`pull_groups_labelstudio` reads the latest submitted annotation of each task: the group's
decision is the majority of the tasks' accept / reject answers (a tie, or no answer, leaves the
group undecided: reported, nothing written); its name is the most common answer that *changed*
the pre-filled top name (a renamed answer wins over the untouched pre-fill, as a tag added since a
push wins over the pushed one in :mod:`curate.review.vocabulary`), else the top name; photos
answered ``not this background`` are taken out. Which project holds which group is recorded in
``DIR/.review/labelstudio-discover-<run>.json`` (URL and project ids; never the token, which
comes from the environment variable named by ``token_env`` and is handed to the SDK only).

**Both pulls** are idempotent: a group whose decision (accepted under the same name, or
rejected) is already in the run's ``decisions.json`` is skipped. An acceptance without a new name
of a group whose top phrase does not name it (:func:`curate.discover.decide.group_label`) is
refused with a message: name it (``discover:name=<text>`` or a new name in Label Studio). A
changed decision of a rejected group is applied; an accepted group's labels are never undone by a pull (a later
reject or rename is refused with a message: ``curate reject-group`` / ``accept-group --force`` undoes
an acceptance, :func:`curate.discover.decide.undo_acceptance`).
The recorded decision also says where it came from (``via``) and which photos reviewers took out.
"""
from __future__ import annotations

import getpass
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

from curate.discover.decide import Decision, accept_group, background_name, group_label, reject_group
from curate.formatting import is_finite
from curate.review.sync import ReviewError, now_iso
from curate.review.vocabulary import DISCOVER_PREFIX
from curate.runs.discovery import DiscoveredGroup, DiscoveryRun
from curate.store import Dataset

__all__ = [
    "ACCEPT_TAG", "REJECT_TAG", "NAME_TAG_PREFIX", "OUT_TAG", "VIEW_PREFIX", "GROUP_FIELD", "NAMES_FIELD",
    "RANK_FIELD", "GroupVerdict", "GroupPull", "apply_verdicts", "view_name", "group_summary",
    "push_groups_fiftyone", "pull_groups_fiftyone", "read_fiftyone_verdicts",
    "groups_labelstudio_config", "project_title", "state_path", "push_groups_labelstudio",
    "pull_groups_labelstudio", "read_labelstudio_verdicts",
]

log = logging.getLogger(__name__)

ACCEPT_TAG = f"{DISCOVER_PREFIX}accept"
REJECT_TAG = f"{DISCOVER_PREFIX}reject"
NAME_TAG_PREFIX = f"{DISCOVER_PREFIX}name="
OUT_TAG = f"{DISCOVER_PREFIX}out"
VIEW_PREFIX = "discover-"
GROUP_FIELD, NAMES_FIELD, RANK_FIELD = "discover_group", "discover_names", "discover_rank"
#: ``dataset.info`` key of the FiftyOne dataset recording the pushed run and its groups.
INFO_KEY = "curate_discover"
#: How many names a view description, a field and a task show.
SHOWN_NAMES = 5

# Label Studio control names and values (the pull reads them)
IMAGE, MEMBER, GROUP, NAME = "image", "member", "group", "name"
IN_GROUP, NOT_BACKGROUND = "in group", "not this background"
ACCEPT, REJECT = "accept", "reject"
MODEL_VERSION = "curate"
TITLE_LIMIT = 50  # Label Studio's project title length


# ---------------------------------------------------------------------------------------------
# what reviewers said, and applying it
# ---------------------------------------------------------------------------------------------


@dataclass
class GroupVerdict:
    """What the reviewers of one group said, read from a review tool.

    ``decision``: accepted, rejected or None (undecided; ``why`` says why); ``name``: the
    reviewers' name for an accepted group (None: its top name); ``exclude``: photos taken out;
    ``problem``: set when the answers cannot be read (the group is refused, nothing written).
    """

    group_id: str
    decision: str | None
    actor: str
    name: str | None = None
    exclude: list[str] = field(default_factory=list)
    problem: str | None = None
    why: str | None = None


class GroupPull(list[Decision]):
    """The decisions a pull applied (a list of :class:`Decision`), and what it did not apply.

    ``skipped``: groups whose decision was already recorded, unchanged; ``undecided``: group id
    -> why nobody decided it; ``problems``: one message per group refused (contradicting
    answers, an unreadable tag, a reversal of an acceptance) or note worth reading.
    """

    def __init__(self, decisions: Iterable[Decision] = (), *, skipped: Iterable[str] = (),
                 undecided: Mapping[str, str] | None = None, problems: Iterable[str] = ()) -> None:
        super().__init__(decisions)
        self.skipped: list[str] = list(skipped)
        self.undecided: dict[str, str] = dict(undecided or {})
        self.problems: list[str] = list(problems)

    def lines(self) -> list[str]:
        """One line per decision applied, group skipped, left undecided or refused."""
        out = [d.line() for d in self]
        out += [f"{g}: already decided, unchanged" for g in self.skipped]
        out += [f"{g}: undecided ({why})" for g, why in self.undecided.items()]
        return out + [f"problem: {p}" for p in self.problems]


def _open(ds: Dataset | str | Path) -> Dataset:
    return ds if isinstance(ds, Dataset) else Dataset.open(ds)


def _login() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name: still someone
        return "unknown"


def apply_verdicts(ds: Dataset, run: DiscoveryRun, verdicts: Sequence[GroupVerdict], *, via: str) -> GroupPull:
    """Apply reviewers' verdicts through :func:`accept_group` / :func:`reject_group` (module docstring).

    ``via`` (``fiftyone`` / ``labelstudio``) is recorded with each decision, with the photos
    taken out (``excluded_ids``), so the next pull can tell an unchanged decision."""
    result = GroupPull()
    for verdict in verdicts:
        gid = verdict.group_id
        if verdict.problem:
            result.problems.append(f"{gid}: {verdict.problem}; not applied")
            continue
        if verdict.decision is None:
            result.undecided[gid] = verdict.why or "no decision"
            continue
        group = run.group(gid)
        try:
            label = group_label(run, group, verdict.name) if verdict.decision == "accepted" else None
        except ValueError as exc:
            result.problems.append(f"{gid}: {exc}; not applied")
            continue
        previous = run.decisions().get(gid)
        if previous is not None:
            same = previous.get("decision") == verdict.decision and (
                verdict.decision == "rejected" or previous.get("background") == label)
            if same:
                result.skipped.append(gid)
                before = previous.get("excluded_ids")
                if verdict.decision == "accepted" and before is not None and set(before) != set(verdict.exclude):
                    result.problems.append(f"{gid}: the photos taken out changed after the group was accepted; a pull "
                                           "does not relabel them (edit their background by hand)")
                continue
            if previous.get("decision") == "accepted":
                now = f"accepted as {label!r}" if label else "rejected"
                result.problems.append(
                    f"{gid}: accepted as {previous.get('background')!r} by {previous.get('actor')} at {previous.get('at')}, "
                    f"now {now} by {verdict.actor}; a pull does not undo an acceptance: reject-group or accept-group "
                    "with --force does (its photos get their earlier label back); not applied")
                continue
        if verdict.decision == "accepted":
            decision = accept_group(ds, run, gid, name=label, actor=verdict.actor, exclude=verdict.exclude)
        else:
            decision = reject_group(run, gid, actor=verdict.actor)
        entry = run.decisions()[gid]
        extra: dict[str, Any] = {"via": via}
        if verdict.decision == "accepted":
            extra["excluded_ids"] = sorted(set(verdict.exclude))
        run.record_decisions({gid: {**entry, **extra}})
        result.append(decision)
    return result


def _chosen(run: DiscoveryRun, groups: Iterable[str] | None) -> list[DiscoveredGroup]:
    if groups is None:
        return run.proposed
    chosen: list[DiscoveredGroup] = []
    for gid in groups:
        try:
            chosen.append(run.group(gid))
        except KeyError as exc:
            raise ReviewError(str(exc.args[0])) from None
    return chosen


def _check_run(run: DiscoveryRun) -> None:
    if run.run_dir is None:
        raise ReviewError("the discovery run has no folder (write it, or load it with DiscoveryRun.of_folder)")


def group_summary(group: DiscoveredGroup) -> str:
    """One line for a reviewer: class, names, held-out accuracy against the rest, gap with q-value
    (intervals only where the group was large enough to bootstrap, :data:`curate.discover.groups.MIN_BOOT`)."""
    names = ", ".join(p for p, _ in group.names[:SHOWN_NAMES]) or "(no names)"
    sampled = all(is_finite(v) for v in (group.accuracy_low, group.accuracy_high, group.gap_low, group.gap_high))
    acc_ci = f" [{group.accuracy_low:.0%}, {group.accuracy_high:.0%}]" if sampled else ""
    gap_ci = f" [{group.gap_low:+.1f}, {group.gap_high:+.1f}]" if sampled else " (too few photos for an interval)"
    return (f"{group.class_name}: {names}. Held-out accuracy {group.accuracy:.0%}{acc_ci} vs {group.rest_accuracy:.0%} "
            f"for the rest of the class; gap {group.gap:+.1f} points{gap_ci}, q = {group.q_value:.3g} "
            f"({group.size} photos).")


def view_name(group_id: str) -> str:
    """The FiftyOne saved view of a group: ``discover-<group id>``."""
    return f"{VIEW_PREFIX}{group_id}"


# ---------------------------------------------------------------------------------------------
# FiftyOne
# ---------------------------------------------------------------------------------------------


def _discover_tags(dataset: Any) -> int:
    """How many samples carry a ``discover:`` tag."""
    counts = dataset.count_sample_tags()
    return sum(n for tag, n in counts.items() if str(tag).startswith(DISCOVER_PREFIX))


def push_groups_fiftyone(ds: Dataset | str | Path, run: DiscoveryRun, *, name: str | None = None,
                         groups: Iterable[str] | None = None, force: bool = False) -> list[str]:
    """Show the run's proposed groups (or ``groups``) in FiftyOne; returns the saved views' names.

    The FiftyOne dataset is the folder's (``name`` or dataset.yaml's name), pushed with
    :func:`curate.review.fiftyone.push_fiftyone` first when it does not exist. Re-pushing the
    same run keeps the reviewers' tags. Pushing another run while ``discover:`` tags of the
    previous one are on the samples is refused (pull them first) unless ``force``, which drops them.
    """
    from curate.review.fiftyone import dataset_name, import_fiftyone, push_fiftyone

    ds = _open(ds)
    _check_run(run)
    chosen = _chosen(run, groups)
    fo = import_fiftyone()
    fo_name = dataset_name(ds, name)
    if fo_name not in fo.list_datasets():
        push_fiftyone(ds.root, name=name)
    dataset = fo.load_dataset(fo_name)
    info = dict(dataset.info or {})
    owner = info.get("curate_root")
    if owner and owner != str(ds.root):
        raise ReviewError(f"FiftyOne dataset {fo_name!r} was pushed from {owner}, not {ds.root}; pass name= to use another")
    previous = dict(info.get(INFO_KEY) or {})
    if previous.get("run") and previous["run"] != run.name:
        tagged = _discover_tags(dataset)
        if tagged and not force:
            raise ReviewError(f"FiftyOne dataset {fo_name!r} holds {tagged} discover: tag(s) on the groups of run "
                              f"{previous['run']!r}; pull them with that run first, or push with force to drop them")
        if tagged:
            dataset.untag_samples([t for t in dataset.distinct("tags") if str(t).startswith(DISCOVER_PREFIX)])
            log.warning("dropped the discover: tags of run %s from %r", previous["run"], fo_name)
    schema = dataset.get_field_schema()
    for fname, kind in ((GROUP_FIELD, fo.StringField), (NAMES_FIELD, fo.StringField), (RANK_FIELD, fo.IntField)):
        if fname not in schema:
            dataset.add_sample_field(fname, kind)
    present = set(dataset.values("sample_id"))
    group_of: dict[str, str | None] = dict.fromkeys(present)
    names_of: dict[str, str | None] = dict.fromkeys(present)
    rank_of: dict[str, int | None] = dict.fromkeys(present)
    missing = 0
    for group in chosen:
        names = ", ".join(p for p, _ in group.names[:SHOWN_NAMES])
        for rank, sid in enumerate(run.member_ids(group.group_id), 1):
            if sid not in present:
                missing += 1
                continue
            group_of[sid], names_of[sid], rank_of[sid] = group.group_id, names, rank
    if missing:
        log.warning("%d photo(s) of the groups are not in FiftyOne dataset %r; re-push the folder "
                    "(curate review fiftyone) to show them", missing, fo_name)
    for fname, values in ((GROUP_FIELD, group_of), (NAMES_FIELD, names_of), (RANK_FIELD, rank_of)):
        dataset.set_values(fname, values, key_field="sample_id", progress=False)
    F = fo.ViewField
    made: list[str] = []
    for group in chosen:
        view = dataset.match(F(GROUP_FIELD) == group.group_id).sort_by(RANK_FIELD)
        vname = view_name(group.group_id)
        description = (f"{group_summary(group)} Tag {ACCEPT_TAG}, {REJECT_TAG} or {NAME_TAG_PREFIX}<name>; "
                       f"{OUT_TAG} on photos that do not show this background. Run {run.name}.")
        dataset.save_view(vname, view, description=description, overwrite=True)
        made.append(vname)
    for old in previous.get("views") or []:
        if old not in made and dataset.has_saved_view(old):
            dataset.delete_saved_view(old)
    info[INFO_KEY] = {"run": run.name, "run_dir": str(run.run_dir), "groups": [g.group_id for g in chosen],
                      "views": made, "pushed_at": now_iso()}
    dataset.info = info
    dataset.save()
    log.info("pushed %d discovered group(s) of run %s to FiftyOne dataset %r", len(made), run.name, fo_name)
    return made


def read_fiftyone_verdicts(records: Iterable[tuple[str, str | None, Sequence[str] | None]], groups: Sequence[str],
                           actor: str) -> list[GroupVerdict]:
    """Verdicts from ``(sample_id, discover_group, tags)`` of the samples (module docstring's table).

    Groups in ``groups`` without a decision tag come back undecided; a ``discover:`` tag on a
    photo outside every pushed group is ignored (logged)."""
    accept: Counter[str] = Counter()
    reject: Counter[str] = Counter()
    names: dict[str, list[str]] = {g: [] for g in groups}
    out: dict[str, list[str]] = {g: [] for g in groups}
    unknown: dict[str, list[str]] = {g: [] for g in groups}
    for sid, gid, tags in records:
        ours = [t for t in (tags or []) if isinstance(t, str) and t.startswith(DISCOVER_PREFIX)]
        if not ours:
            continue
        if gid not in names:
            log.warning("photo %s carries %s but is in none of the pushed groups; ignored", sid, ", ".join(ours))
            continue
        for tag in ours:
            if tag == ACCEPT_TAG:
                accept[gid] += 1
            elif tag == REJECT_TAG:
                reject[gid] += 1
            elif tag == OUT_TAG:
                out[gid].append(sid)
            elif tag.startswith(NAME_TAG_PREFIX) and tag[len(NAME_TAG_PREFIX):].strip():
                names[gid].append(tag[len(NAME_TAG_PREFIX):])
            else:
                unknown[gid].append(tag)
    verdicts: list[GroupVerdict] = []
    for gid in groups:
        verdict = GroupVerdict(gid, None, actor, exclude=sorted(set(out[gid])))
        distinct: dict[str, str] = {}
        for text in names[gid]:
            try:
                distinct.setdefault(background_name(text), text)
            except ValueError:
                unknown[gid].append(NAME_TAG_PREFIX + text)
        if unknown[gid]:
            verdict.problem = (f"unreadable tag(s) {', '.join(sorted(set(unknown[gid])))} (known: {ACCEPT_TAG}, "
                               f"{REJECT_TAG}, {NAME_TAG_PREFIX}<name>, {OUT_TAG})")
        elif reject[gid] and (accept[gid] or distinct):
            said = [f"{ACCEPT_TAG} on {accept[gid]} photo(s)"] if accept[gid] else []
            said += [f"{NAME_TAG_PREFIX}{n}" for n in distinct.values()]
            verdict.problem = (f"contradicting tags: {REJECT_TAG} on {reject[gid]} photo(s) and {', '.join(said)}; "
                               "keep either the rejection or the acceptance")
        elif len(distinct) > 1:
            verdict.problem = (f"contradicting names: {', '.join(NAME_TAG_PREFIX + n for n in distinct.values())}; "
                               "keep one")
        elif reject[gid]:
            verdict.decision = "rejected"
        elif accept[gid] or distinct:
            verdict.decision = "accepted"
            verdict.name = next(iter(distinct.values()), None)
        else:
            verdict.why = f"no {ACCEPT_TAG}, {REJECT_TAG} or {NAME_TAG_PREFIX}<name> tag"
        verdicts.append(verdict)
    return verdicts


def pull_groups_fiftyone(ds: Dataset | str | Path, run: DiscoveryRun, *, name: str | None = None,
                         actor: str | None = None) -> GroupPull:
    """Read the reviewers' ``discover:`` tags from FiftyOne and apply them (module docstring).

    Actor in changes.jsonl and decisions.json: ``review.fiftyone:<actor>`` (default: the login name)."""
    from curate.review.fiftyone import dataset_name, import_fiftyone

    ds = _open(ds)
    _check_run(run)
    fo = import_fiftyone()
    fo_name = dataset_name(ds, name)
    if fo_name not in fo.list_datasets():
        raise ReviewError(f"FiftyOne dataset {fo_name!r} does not exist; push the groups first (push_groups_fiftyone)")
    dataset = fo.load_dataset(fo_name)
    pushed = dict((dataset.info or {}).get(INFO_KEY) or {})
    if pushed.get("run") != run.name:
        raise ReviewError(f"FiftyOne dataset {fo_name!r} shows the groups of run {pushed.get('run')!r}, not {run.name!r}; "
                          "pull with that run, or push this one first")
    groups = [str(g) for g in pushed.get("groups") or []]
    for gid in groups:
        run.group(gid)
    shown = dataset.exists(GROUP_FIELD)
    records = zip(*shown.values(["sample_id", GROUP_FIELD, "tags"])) if len(shown) else iter(())
    verdicts = read_fiftyone_verdicts(records, groups, f"review.fiftyone:{actor or _login()}")
    result = apply_verdicts(ds, run, verdicts, via="fiftyone")
    for problem in result.problems:
        log.warning("%s", problem)
    return result


# ---------------------------------------------------------------------------------------------
# Label Studio
# ---------------------------------------------------------------------------------------------


def _choice(value: str, hint: str | None = None) -> str:
    attrs = f"value={quoteattr(value)}" + (f" hint={quoteattr(hint)}" if hint else "")
    return f"    <Choice {attrs}/>"


def groups_labelstudio_config() -> str:
    """The labelling config of a group's project (the same for every group: names and numbers
    come with each task's data)."""
    return "\n".join([
        "<View>",
        '  <Header value="$summary"/>',
        '  <Text name="names" value="$names"/>',
        f'  <Image name="{IMAGE}" value="$image" zoom="true"/>',
        '  <Header value="This photo"/>',
        f'  <Choices name="{MEMBER}" toName="{IMAGE}" choice="single" showInline="true">',
        _choice(IN_GROUP, "the photo shows the group's background"),
        _choice(NOT_BACKGROUND, "take the photo out of the group (its label stays as it is)"),
        "  </Choices>",
        '  <Header value="The whole group (majority of the answered photos decides)"/>',
        f'  <Choices name="{GROUP}" toName="{IMAGE}" choice="single" showInline="true">',
        _choice(ACCEPT, "the group becomes a background of the vocabulary, its photos labelled"),
        _choice(REJECT, "not a background worth naming: nothing is written"),
        "  </Choices>",
        f'  <TextArea name="{NAME}" toName="{IMAGE}" rows="1" maxSubmissions="1" editable="true" '
        'placeholder="the background name"/>',
        "</View>",
    ]) + "\n"


def project_title(group: DiscoveredGroup) -> str:
    """``<group id>: <top name>``, cut to Label Studio's 50 characters."""
    title = f"{group.group_id}: {group.top_name}" if group.top_name else group.group_id
    return title if len(title) <= TITLE_LIMIT else title[:TITLE_LIMIT - 1] + "…"


def state_path(ds: Dataset, run: DiscoveryRun) -> Path:
    """``DIR/.review/labelstudio-discover-<run>.json``: URL, run and project per group (no token)."""
    from curate.review.sync import snapshot_path

    return snapshot_path(ds.root, "labelstudio", f"discover-{run.name}")


def _load_state(path: Path) -> dict[str, Any] | None:
    from curate.jsonio import read_json

    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except ValueError as exc:
        raise ReviewError(f"{path} cannot be read ({exc}); push the groups again") from None
    if not isinstance(data, dict) or not isinstance(data.get("projects"), dict):
        raise ReviewError(f"{path} is not a record of a discovered-groups push; push the groups again")
    return data


def _prediction(group: DiscoveredGroup) -> dict[str, Any]:
    results = [{"from_name": MEMBER, "to_name": IMAGE, "type": "choices", "value": {"choices": [IN_GROUP]}}]
    if group.top_name:
        results.append({"from_name": NAME, "to_name": IMAGE, "type": "textarea", "value": {"text": [group.top_name]}})
    return {"model_version": MODEL_VERSION, "result": results}


def push_groups_labelstudio(ds: Dataset | str | Path, run: DiscoveryRun, *, url: str,
                            token_env: str = "LABEL_STUDIO_API_KEY", groups: Iterable[str] | None = None,
                            media: Any = None) -> dict[str, int]:
    """One Label Studio project per proposed group (or per group of ``groups``); returns group id ->
    project id. ``media``: a :class:`curate.review.labelstudio.MediaSource` (default: local-files).

    Re-pushing reuses each group's project (recorded in :func:`state_path`) and imports only the
    photos without a task, so reviewers' answers stay."""
    from curate.review.labelstudio import (
        MediaSource,
        api_error,
        connect,
        ensure_local_storage,
        export_tasks,
        token_from_env,
    )

    ds = _open(ds)
    _check_run(run)
    chosen = _chosen(run, groups)
    media = media or MediaSource()
    media.check(ds)
    token = token_from_env(token_env)
    client = connect(url, token)
    config = groups_labelstudio_config()
    path = state_path(ds, run)
    state = _load_state(path) or {}
    if state and state.get("url") != url.rstrip("/"):
        log.info("the groups of run %s were pushed to %s before; new projects on %s", run.name, state.get("url"), url)
        state = {}
    projects: dict[str, Any] = dict(state.get("projects") or {})
    rows = {r["sample_id"]: r for r in ds.rows()}
    out: dict[str, int] = {}
    for group in chosen:
        gid = group.group_id
        title = project_title(group)
        project_id: int | None = None
        known = projects.get(gid)
        try:
            if known:
                try:
                    existing = client.projects.get(id=int(known["project_id"]))
                    project_id = int(existing.id)
                    if (getattr(existing, "label_config", None) or "").strip() != config.strip():
                        client.projects.update(id=project_id, label_config=config)
                except Exception:  # noqa: BLE001 - deleted on the server: make it again
                    log.info("project %s of group %s is gone; a new one is made", known.get("project_id"), gid)
                    project_id = None
            if project_id is None:
                proj = client.projects.create(
                    title=title, label_config=config, model_version=MODEL_VERSION, show_collab_predictions=True,
                    description=f"curate discover: group {gid} of run {run.name}, dataset {ds.name} ({ds.root}). "
                                f"{group_summary(group)}",
                    expert_instruction=(f"<p>{group_summary(group)}</p><p>Per photo: <b>{IN_GROUP}</b> or "
                                        f"<b>{NOT_BACKGROUND}</b>. For the group: <b>{ACCEPT}</b> or <b>{REJECT}</b> "
                                        "(the majority of the answered photos decides) and, to rename it, a new "
                                        "<b>name</b>.</p>"),
                    show_instruction=True)
                project_id = int(proj.id)
                known = None
            if media.mode == "local-files":
                ensure_local_storage(client, project_id, ds.root / "media")
        except ReviewError:
            raise
        except Exception as exc:  # noqa: BLE001 - the SDK raises many kinds
            raise api_error(f"preparing the project of group {gid}", url, exc) from None
        have = {str((t.get("data") or {}).get("sample_id")) for t in export_tasks(client, url, project_id)} \
            if known else set()
        names = ", ".join(f"{p} ({s:.2f})" for p, s in group.names[:SHOWN_NAMES]) or "(no names)"
        new_tasks = []
        for rank, sid in enumerate(run.member_ids(gid), 1):
            if sid in have or sid not in rows:
                continue
            new_tasks.append({"data": {"image": media.url_of(ds, rows[sid]), "sample_id": sid, "group_id": gid,
                                       "rank": rank, "class_name": group.class_name, "names": f"Names: {names}",
                                       "summary": f"Group {gid} — {group_summary(group)}",
                                       "top_name": group.top_name},
                              "predictions": [_prediction(group)]})
        try:
            for start in range(0, len(new_tasks), 500):
                client.projects.import_tasks(id=project_id, request=new_tasks[start:start + 500])
        except Exception as exc:  # noqa: BLE001
            raise api_error(f"importing the tasks of group {gid}", url, exc) from None
        projects[gid] = {"project_id": project_id, "title": title}
        out[gid] = project_id
        log.info("Label Studio project %r (id %d): %d task(s) imported", title, project_id, len(new_tasks))
    from curate.jsonio import write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"url": url.rstrip("/"), "run": run.name, "root": str(ds.root), "pushed_at": now_iso(),
                      "projects": projects})
    return out


def read_labelstudio_verdicts(group: DiscoveredGroup, tasks: Sequence[Mapping[str, Any]], *,
                              actor: str | None = None, users: Mapping[int, str] | None = None) -> GroupVerdict:
    """A group's verdict from its project's exported tasks (module docstring: majority, rename, out)."""
    from curate.review.labelstudio import annotator_name, submitted_annotations

    votes: dict[str, list[str]] = {ACCEPT: [], REJECT: []}  # answer -> annotators
    renames: list[str] = []
    out: list[str] = []
    answered = 0
    try:
        top = background_name(group.top_name) if group.top_name else None
    except ValueError:
        top = None
    for task in sorted(tasks, key=lambda t: (int((t.get("data") or {}).get("rank") or 0), int(t.get("id") or 0))):
        annotations = submitted_annotations(task)
        if not annotations:
            continue
        answered += 1
        latest = annotations[-1]
        who = annotator_name(latest, users)
        sid = str((task.get("data") or {}).get("sample_id"))
        for result in latest.get("result") or []:
            kind, name = str(result.get("type", "")).lower(), result.get("from_name")
            value = result.get("value") or {}
            if kind == "choices" and name == GROUP:
                for choice in value.get("choices") or []:
                    if choice in votes:
                        votes[choice].append(who)
            elif kind == "choices" and name == MEMBER and NOT_BACKGROUND in (value.get("choices") or []):
                out.append(sid)
            elif kind == "textarea" and name == NAME:
                text = " ".join(str(t) for t in value.get("text") or []).strip()
                if not text:
                    continue
                try:
                    if background_name(text) != top:
                        renames.append(background_name(text))
                except ValueError:
                    continue
    n_accept, n_reject = len(votes[ACCEPT]), len(votes[REJECT])
    verdict = GroupVerdict(group.group_id, None, "", exclude=sorted(set(out)))
    if n_accept == n_reject:
        verdict.why = (f"tie: {n_accept} {ACCEPT}, {n_reject} {REJECT}" if n_accept
                       else f"no {ACCEPT} / {REJECT} answer ({answered} photo(s) answered)")
        return verdict
    verdict.decision = "accepted" if n_accept > n_reject else "rejected"
    if actor:
        verdict.actor = f"review.labelstudio:{actor}"
    else:
        people = sorted({w.split(":", 1)[1] for w in votes[ACCEPT if n_accept > n_reject else REJECT]})
        verdict.actor = "review.labelstudio:" + ",".join(people)
    if verdict.decision == "accepted" and renames:
        verdict.name = Counter(renames).most_common(1)[0][0]
    return verdict


def pull_groups_labelstudio(ds: Dataset | str | Path, run: DiscoveryRun, *, url: str,
                            token_env: str = "LABEL_STUDIO_API_KEY", actor: str | None = None) -> GroupPull:
    """Read each group's project and apply the reviewers' decisions (module docstring).

    Actor: ``review.labelstudio:<actor>``, default the annotators on the winning side."""
    from curate.review.labelstudio import connect, export_tasks, list_users, token_from_env

    ds = _open(ds)
    _check_run(run)
    path = state_path(ds, run)
    state = _load_state(path)
    if state is None:
        raise ReviewError(f"the groups of run {run.name} were never pushed to Label Studio (no {path}); "
                          "push them first (push_groups_labelstudio)")
    if state.get("url") != url.rstrip("/"):
        raise ReviewError(f"the groups of run {run.name} were pushed to {state.get('url')}, not {url}")
    client = connect(url, token_from_env(token_env))
    users = list_users(client)
    verdicts: list[GroupVerdict] = []
    for gid, entry in state["projects"].items():
        group = run.group(gid)
        tasks = export_tasks(client, url, int(entry["project_id"]))
        verdicts.append(read_labelstudio_verdicts(group, tasks, actor=actor, users=users))
    result = apply_verdicts(ds, run, verdicts, via="labelstudio")
    for gid, why in result.undecided.items():
        log.info("group %s: undecided (%s)", gid, why)
    for problem in result.problems:
        log.warning("%s", problem)
    return result
