"""People decide: a discovered group becomes a background only when a person accepts it (docs/design.md#discover).

``accept_group`` adds the group's name to the dataset's background vocabulary and labels the
group's photos with it, ``background_source = "human"`` (a person vouched for the group), every
change in ``changes.jsonl`` with the actor and the run; ``reject_group`` records the rejection.
Both record the decision in the run's ``decisions.json``. Nothing enters the vocabulary any other
way: ``curate discover`` itself writes no label.

The name: ``name`` when a person gives one, else the group's top phrase, but only when that
phrase *names* it (its score reaches the run's ``min_name_score``,
:data:`curate.discover.phrases.MIN_NAME_SCORE`): an unnamed group is never accepted without a name.

What is never overwritten: a photo whose background a person or the synthetic generator already
labelled keeps its label (counted as ``kept``); photos a reviewer took out of the group (in
FiftyOne or Label Studio, :mod:`curate.discover.review`) are passed as ``exclude`` and stay as
they are. Labels a model proposed (``curate label-backgrounds``) are replaced.

Changing one's mind: an acceptance records the earlier label of every photo it labelled. A later
rejection, or an acceptance under another name, replaces it only with ``force``, and then undoes
it first (:func:`undo_acceptance`): each of those photos that still carries the accepted label gets
its earlier label back (a photo relabelled since is left as it is, counted), and the name leaves the
vocabulary when the acceptance added it and no photo carries it any more. Without ``force`` both
are refused, naming the acceptance, so decisions.json never disagrees with the folder.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from curate.discover.phrases import MIN_NAME_SCORE, GroupName, group_name
from curate.runs.discovery import DiscoveredGroup, DiscoveryRun
from curate.split.backgrounds import PROTECTED_SOURCES

__all__ = ["Decision", "Undone", "background_name", "name_threshold", "top_name", "group_label", "accept_group",
           "reject_group", "undo_acceptance"]

_ARTICLE = re.compile(r"^(a|an|the)\s+", re.I)


def background_name(phrase: str) -> str:
    """The vocabulary label a phrase becomes: lower case, the leading article dropped, inner spaces
    collapsed (``"A Bird  Feeder"`` -> ``"bird feeder"``)."""
    text = " ".join(str(phrase).split()).lower()
    name = _ARTICLE.sub("", text)
    if not name:
        raise ValueError(f"{phrase!r} does not name a background")
    return name


def name_threshold(run: DiscoveryRun) -> float:
    """The score a top phrase needs to name a group of ``run``: its ``min_name_score`` setting
    (:data:`MIN_NAME_SCORE` for runs that recorded none)."""
    value = run.settings.get("min_name_score")
    return MIN_NAME_SCORE if value is None else float(value)


def top_name(run: DiscoveryRun, group: DiscoveredGroup) -> GroupName | None:
    """The group's top phrase with its score, margin and whether it names the group (None: no names)."""
    return group_name(group.names, name_threshold(run))


def group_label(run: DiscoveryRun, group: DiscoveredGroup, name: str | None = None) -> str:
    """The background label accepting ``group`` writes: ``name`` (:func:`background_name`), else its
    top phrase when that names it; ValueError for an unnamed group without ``name``."""
    if name:
        return background_name(name)
    top = top_name(run, group)
    if top is None:
        raise ValueError(f"group {group.group_id} has no names: accept it with a name of your own (--name NAME)")
    if not top.named:
        raise ValueError(f"group {group.group_id} is unnamed (its closest phrase {top.phrase!r} scores "
                         f"{top.score:.3f}, under the run's {top.min_score:g}): accept it with a name of your own "
                         "(--name NAME)")
    return background_name(top.phrase)


@dataclass
class Undone:
    """What undoing an acceptance changed (:func:`undo_acceptance`)."""

    background: str
    actor: str | None = None  # who had accepted
    at: str | None = None
    restored: int = 0  # photos given back their earlier label
    changed_since: int = 0  # photos relabelled after the acceptance: left as they are
    vocabulary_removed: bool = False

    def text(self) -> str:
        who = f" by {self.actor}" if self.actor else ""
        when = f" at {self.at}" if self.at else ""
        text = f"replaces its acceptance as {self.background!r}{who}{when}: {self.restored} photos given back their " \
               "earlier label"
        if self.changed_since:
            text += f", {self.changed_since} relabelled since left as they are"
        if self.vocabulary_removed:
            text += f", {self.background!r} taken out of the vocabulary"
        return text


@dataclass
class Decision:
    """What one decision changed."""

    group_id: str
    decision: str  # accepted | rejected
    background: str | None = None
    new_vocabulary: bool = False
    labelled: int = 0  # photos given the background
    kept: int = 0  # photos whose human / synthetic label was kept
    excluded: int = 0  # photos a reviewer took out of the group
    replaced: str | None = None  # the earlier decision this one replaces, in words
    unchanged: bool = False  # the same decision was already recorded: nothing was written

    def line(self) -> str:
        replaced = f"; it {self.replaced}" if self.replaced else ""
        if self.decision == "rejected":
            return f"{self.group_id}: rejected{replaced}" if replaced else f"{self.group_id}: rejected (no label written)"
        if self.unchanged:
            return f"{self.group_id}: already accepted as {self.background!r}; nothing changed"
        new = "new in the vocabulary" if self.new_vocabulary else "already in the vocabulary"
        text = f"{self.group_id}: accepted as {self.background!r} ({new}); {self.labelled} photos labelled"
        if self.kept:
            text += f", {self.kept} kept their label from a person or the generator"
        if self.excluded:
            text += f", {self.excluded} taken out by reviewers"
        return text + replaced


def _check_actor(actor: str) -> None:
    if not actor or not str(actor).strip():
        raise ValueError("a decision needs the person who made it (actor)")


def _acceptance(run: DiscoveryRun, group_id: str) -> dict[str, Any] | None:
    entry = run.decisions().get(group_id)
    return entry if entry is not None and entry.get("decision") == "accepted" else None


def _refused_replacement(group_id: str, entry: dict[str, Any], now: str) -> ValueError:
    return ValueError(
        f"group {group_id} was accepted as {entry.get('background')!r} by {entry.get('actor')} at {entry.get('at')} "
        f"({entry.get('labelled', 0)} photos labelled); {now} replaces that acceptance: pass --force to give those "
        "photos back their earlier label first")


def _dataset_of(run: DiscoveryRun) -> Any:
    from curate.store import Dataset

    if run.run_dir is None:
        raise ValueError("the discovery run has no folder, so its dataset is unknown: pass the dataset")
    return Dataset.open(run.run_dir.parent.parent)  # DIR/runs/<run>


def undo_acceptance(ds: Any, run: DiscoveryRun, group_id: str, *, actor: str) -> Undone:
    """Undo what accepting ``group_id`` wrote (module docstring); decisions.json is left to the caller.

    Each photo the acceptance labelled that still carries the accepted label, source human, gets
    its earlier label and source back (one ``changes.jsonl`` record per field, ``actor``); the
    name leaves the vocabulary when the acceptance added it and no photo carries it any more.
    ValueError when the group is not accepted, or its acceptance recorded no earlier labels."""
    _check_actor(actor)
    entry = _acceptance(run, group_id)
    if entry is None:
        raise ValueError(f"group {group_id} of run {run.name} is not accepted: nothing to undo")
    label = str(entry.get("background"))
    before = entry.get("previous")
    if not isinstance(before, dict):
        raise ValueError(f"the acceptance of group {group_id} as {label!r} recorded no earlier labels (made by an "
                         "older curate): relabel its photos by hand (changes.jsonl lists what it wrote)")
    undone = Undone(label, entry.get("actor"), entry.get("at"))
    restore: dict[str, dict[str, Any]] = {}
    for sid, (background, source) in before.items():
        row = ds.row(sid) if sid in ds else None
        if row is not None and (row["background"], row["background_source"]) == (label, "human"):
            restore[sid] = {"background": background, "background_source": source}
        else:
            undone.changed_since += 1
    if restore:
        ds.update(list(restore), per_sample=restore, actor=actor,
                  reason=f"discover: acceptance of group {group_id} of run {run.name} as {label!r} undone")
    undone.restored = len(restore)
    if entry.get("new_vocabulary") and label in ds.backgrounds and not ds.ids(background=label):
        undone.vocabulary_removed = bool(ds.remove_backgrounds([label]))
    return undone


def accept_group(ds: Any, run: DiscoveryRun, group_id: str, *, name: str | None = None, actor: str,
                 exclude: Iterable[str] = (), at: str | None = None, force: bool = False) -> Decision:
    """Accept ``group_id`` of ``run`` as the background ``name`` (default: its top phrase, as
    :func:`background_name` writes it, when that phrase names the group); see the module docstring.

    Accepting a group already accepted under the same name changes nothing; under another name
    it is refused unless ``force``, which undoes the first acceptance (:func:`undo_acceptance`)."""
    from curate.review.sync import now_iso

    _check_actor(actor)
    group = run.group(group_id)
    label = group_label(run, group, name)
    replaced = None
    earlier = run.decisions().get(group_id)
    if earlier is not None and earlier.get("decision") == "accepted":
        if earlier.get("background") == label:
            return Decision(group_id, "accepted", label, unchanged=True)
        if not force:
            raise _refused_replacement(group_id, earlier, f"accepting it as {label!r}")
        replaced = undo_acceptance(ds, run, group_id, actor=actor).text()
    elif earlier is not None:
        replaced = f"replaces its rejection by {earlier.get('actor')} at {earlier.get('at')}"
    excluded = set(exclude)
    members = [sid for sid in run.member_ids(group_id) if sid in ds]
    new = ds.add_backgrounds([label])
    rows = {sid: ds.row(sid) for sid in members if sid not in excluded}
    kept = [sid for sid, r in rows.items() if r["background"] is not None and r["background_source"] in PROTECTED_SOURCES]
    target = [sid for sid, r in rows.items() if sid not in kept
              and (r["background"] != label or r["background_source"] != "human")]
    if target:
        ds.update(target, {"background": label, "background_source": "human"}, actor=actor,
                  reason=f"discover: group {group_id} of run {run.name} accepted as {label!r}")
    decision = Decision(group_id, "accepted", label, bool(new), len(target), len(kept),
                        len([s for s in members if s in excluded]), replaced=replaced)
    run.record_decisions({group_id: {
        "decision": "accepted", "background": label, "actor": actor, "at": at or now_iso(),
        "labelled": decision.labelled, "kept": decision.kept, "excluded": decision.excluded,
        "new_vocabulary": decision.new_vocabulary,
        "previous": {sid: [rows[sid]["background"], rows[sid]["background_source"]] for sid in target},
        **({"replaced": replaced} if replaced else {})}})
    return decision


def reject_group(run: DiscoveryRun, group_id: str, *, actor: str, at: str | None = None, force: bool = False,
                 ds: Any = None) -> Decision:
    """Record that a person rejected ``group_id``: nothing in the dataset changes, unless the group
    was accepted: that is refused without ``force``; with it the acceptance is undone first
    (:func:`undo_acceptance` on ``ds``, default the run's dataset folder)."""
    from curate.review.sync import now_iso

    _check_actor(actor)
    run.group(group_id)
    replaced = None
    accepted = _acceptance(run, group_id)
    if accepted is not None:
        if not force:
            raise _refused_replacement(group_id, accepted, "rejecting it")
        replaced = undo_acceptance(ds if ds is not None else _dataset_of(run), run, group_id, actor=actor).text()
    run.record_decisions({group_id: {"decision": "rejected", "actor": actor, "at": at or now_iso(),
                                     **({"replaced": replaced} if replaced else {})}})
    return Decision(group_id, "rejected", replaced=replaced)
