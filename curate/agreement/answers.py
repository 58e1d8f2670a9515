"""Who answered what on which photo: the annotation table reduced to what agreement needs (issue 44).

:func:`collect_answers` reads current annotations (:func:`curate.store.annotations.current_annotations`)
into an :class:`Answers`:

- ``labels[sample_id][annotator]``: the backgrounds an annotator (role "annotator") chose, first =
  primary. Where one person has several current answers on one photo (two tools, two projects),
  the one with the latest ``updated_at`` counts (``replaced`` counts the others): agreement needs
  one answer per person and photo.
- ``skipped[sample_id]``: annotators whose answer was empty (they skipped the photo). A skip is
  no label: it enters no metric, only the counts.
- ``adjudicated[sample_id]``: the adjudicator's answer (role "adjudicator", latest wins), gold or
  not; ``gold[sample_id]``: the gold answers among them (``is_gold``).
- ``masks[sample_id][annotator]``: the stored mask path of the counted answer, when it drew one.

Two backgrounds on one photo (a set-valued answer): metrics that need one value per answer
(Krippendorff's alpha, Cohen's kappa, the confusion, majority, Dawid-Skene) use the primary (the
first); the set agreement beside them counts two answers as agreeing when their sets intersect
(:func:`sets_agree`). A gold answer is matched when the annotator's primary is in the gold set.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from curate.store.annotations import Annotation, current_annotations

__all__ = ["Answers", "answers_of", "collect_answers", "photo_classes", "sets_agree"]


@dataclass
class Answers:
    """The answers of a team (module docstring); ``vocabulary``: the folder's backgrounds in order."""

    vocabulary: list[str]
    labels: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    skipped: dict[str, set[str]] = field(default_factory=dict)
    adjudicated: dict[str, tuple[str, ...]] = field(default_factory=dict)
    gold: dict[str, tuple[str, ...]] = field(default_factory=dict)
    masks: dict[str, dict[str, str]] = field(default_factory=dict)
    replaced: int = 0

    @property
    def annotators(self) -> list[str]:
        """Every annotator with an answer or a skip, sorted."""
        names = {a for by in self.labels.values() for a in by} | {a for s in self.skipped.values() for a in s}
        return sorted(names)

    @property
    def photos(self) -> list[str]:
        """Every photo any annotator or adjudicator answered or skipped, sorted."""
        return sorted(set(self.labels) | set(self.skipped) | set(self.adjudicated))

    def primary(self, sample_id: str) -> dict[str, str]:
        """annotator -> primary background on one photo."""
        return {a: b[0] for a, b in self.labels.get(sample_id, {}).items()}

    def of(self, annotator: str) -> dict[str, tuple[str, ...]]:
        """sample_id -> that annotator's backgrounds (their labelling alone)."""
        return {sid: by[annotator] for sid, by in self.labels.items() if annotator in by}


def sets_agree(a: Sequence[str], b: Sequence[str]) -> bool:
    """Two answers agree as sets when they share a background."""
    return bool(set(a) & set(b))


def collect_answers(annotations: Iterable[Annotation], vocabulary: Sequence[str]) -> Answers:
    """An :class:`Answers` from current annotations (module docstring for the rules)."""
    out = Answers(vocabulary=list(vocabulary))
    latest: dict[tuple[str, str, str], Any] = {}
    for a in annotations:
        key = (a.sample_id, a.annotator, a.role)
        if key in latest:
            out.replaced += 1
            if (a.updated_at, a.annotation_id) < (latest[key].updated_at, latest[key].annotation_id):
                continue
        latest[key] = a
    adjudicators: dict[str, Any] = {}
    golds: dict[str, Any] = {}
    for (sid, who, role), a in sorted(latest.items()):
        if role == "adjudicator":
            if a.backgrounds and (sid not in adjudicators or a.updated_at >= adjudicators[sid].updated_at):
                adjudicators[sid] = a
            if a.backgrounds and a.is_gold and (sid not in golds or a.updated_at >= golds[sid].updated_at):
                golds[sid] = a
            continue
        if not a.backgrounds:
            out.skipped.setdefault(sid, set()).add(who)
            continue
        out.labels.setdefault(sid, {})[who] = tuple(a.backgrounds)
        if a.mask:
            out.masks.setdefault(sid, {})[who] = a.mask
    out.adjudicated = {sid: tuple(a.backgrounds) for sid, a in adjudicators.items()}
    out.gold = {sid: tuple(a.backgrounds) for sid, a in golds.items()}
    return out


def answers_of(ds: Any) -> Answers:
    """The :class:`Answers` of an open dataset's annotation table (empty when it has none)."""
    return collect_answers(current_annotations(ds), ds.backgrounds)


def photo_classes(ds: Any) -> dict[str, str]:
    """sample_id -> class name of an open dataset (the groups alpha and the disputes are counted by)."""
    table = ds.table(["sample_id", "class_name"])
    return {str(k): str(v) for k, v in zip(table.column("sample_id").to_pylist(), table.column("class_name").to_pylist())}
