"""People decide: a discovered group becomes a background only when a person accepts it (docs/design.md#discover).

``accept_group`` adds the group's name to the dataset's background vocabulary and labels the
group's photos with it, ``background_source = "human"`` (a person vouched for the group), every
change in ``changes.jsonl`` with the actor and the run; ``reject_group`` records the rejection.
Both record the decision in the run's ``decisions.json``. Nothing enters the vocabulary any other
way: ``curate discover`` itself writes no label.

What is never overwritten: a photo whose background a person or the synthetic generator already
labelled keeps its label (counted as ``kept``); photos a reviewer took out of the group (in
FiftyOne or Label Studio, :mod:`curate.discover.review`) are passed as ``exclude`` and stay as
they are. Labels a model proposed (``curate label-backgrounds``) are replaced.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from curate.runs.discovery import DiscoveryRun
from curate.split.backgrounds import PROTECTED_SOURCES

__all__ = ["Decision", "background_name", "accept_group", "reject_group"]

_ARTICLE = re.compile(r"^(a|an|the)\s+", re.I)


def background_name(phrase: str) -> str:
    """The vocabulary label a phrase becomes: lower case, the leading article dropped, inner spaces
    collapsed (``"A Bird  Feeder"`` -> ``"bird feeder"``)."""
    text = " ".join(str(phrase).split()).lower()
    name = _ARTICLE.sub("", text)
    if not name:
        raise ValueError(f"{phrase!r} does not name a background")
    return name


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

    def line(self) -> str:
        if self.decision == "rejected":
            return f"{self.group_id}: rejected (no label written)"
        new = "new in the vocabulary" if self.new_vocabulary else "already in the vocabulary"
        text = f"{self.group_id}: accepted as {self.background!r} ({new}); {self.labelled} photos labelled"
        if self.kept:
            text += f", {self.kept} kept their label from a person or the generator"
        if self.excluded:
            text += f", {self.excluded} taken out by reviewers"
        return text


def accept_group(ds: Any, run: DiscoveryRun, group_id: str, *, name: str | None = None, actor: str,
                 exclude: Iterable[str] = (), at: str | None = None) -> Decision:
    """Accept ``group_id`` of ``run`` as the background ``name`` (default: its top phrase, as
    :func:`background_name` writes it); see the module docstring."""
    from curate.review.sync import now_iso

    if not actor or not str(actor).strip():
        raise ValueError("a decision needs the person who made it (actor)")
    group = run.group(group_id)
    label = background_name(name if name else group.top_name)
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
                        len([s for s in members if s in excluded]))
    run.record_decisions({group_id: {"decision": "accepted", "background": label, "actor": actor,
                                     "at": at or now_iso(), "labelled": decision.labelled, "kept": decision.kept,
                                     "excluded": decision.excluded}})
    return decision


def reject_group(run: DiscoveryRun, group_id: str, *, actor: str, at: str | None = None) -> Decision:
    """Record that a person rejected ``group_id`` (nothing in the dataset changes)."""
    from curate.review.sync import now_iso

    if not actor or not str(actor).strip():
        raise ValueError("a decision needs the person who made it (actor)")
    run.group(group_id)
    run.record_decisions({group_id: {"decision": "rejected", "actor": actor, "at": at or now_iso()}})
    return Decision(group_id, "rejected")
