"""The reviewer's tag vocabulary (``annotation/tags.yaml``): what a tag means, both ways.

A reviewer speaks in sample tags (FiftyOne) or choices (Label Studio) with documented prefixes:

====================  ===============================================================
tag                   meaning in the dataset folder
====================  ===============================================================
``accept``            status = accepted, reject_reason = null
``reject:<reason>``   status = rejected, reject_reason = <reason>: one of label_noise,
                      feature_noise, obscurity, clarity (papers/003 §2.1)
``bg:<background>``   background = <background> (dataset.yaml's vocabulary),
                      background_source = human, background_score = null
``mask:ok/mask:bad``  mask_status = ok / bad. On a model proposal (``mask_status =
                      model:<id>``): ``mask:ok`` verifies it (ok), ``mask:bad`` drops the
                      mask (no mask, status bad); see :func:`curate.review.sync.decide_mask_review`
``tag:<word>``        <word> in the folder's free ``tags`` column
``suspect:<check>``   ``suspect:<check>`` in the ``tags`` column: ``curate audit`` ranked the
                      photo among the top candidates of a check (docs/design.md#audit); a
                      pointer, never a decision (confirm with ``reject:<reason>``, or clear it
                      by removing the tag)
====================  ===============================================================

:meth:`TagVocabulary.tags_for` derives a row's tags (what a push shows); :meth:`TagVocabulary.read`
sorts tags into *units* (background, curation, mask, free, unknown) and decides each unit's value.
Anything it cannot read (an unknown prefix, a background outside the vocabulary, a reason
outside the four, two contradicting tags) is a :class:`TagProblem`: reported, never guessed.

Contradicting tags and the push snapshot: a reviewer changes a decision by *adding* a tag
(``reject:clarity`` to a sample pushed with ``accept``), since a tool's "tag samples" adds and
rarely removes. Given the unit's tags at push time, :meth:`TagReading.decide` lets the tags added
since the push win over the pushed ones (:func:`newest_values`); only tags that still contradict
after that (two decisions both added since the push, or no snapshot to tell) are reported. Every
backend that compares with a push snapshot passes its pushed tags (FiftyOne: the unit's tags;
Label Studio: the pre-selected choice).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from curate.review.annotation import TAGS_FILE, annotation_file
from curate.store.mask_sources import MODEL_PREFIX, REJECTED_STATUS

#: The audit's pre-tags (``suspect:<check>``, curate.audit): kept as is in the folder's tags column.
SUSPECT_PREFIX = "suspect:"
#: Tags of the discovered-group review (``discover:accept`` ...; :mod:`curate.discover.review`):
#: read by ``curate discover`` pulls only, so the folder's pull and push pass over them.
DISCOVER_PREFIX = "discover:"

#: The units a tag can speak about (each decided independently).
UNITS: tuple[str, ...] = ("background", "curation", "mask", "free")


class VocabularyError(ValueError):
    """``annotation/tags.yaml`` is malformed; the message says which key."""


@dataclass(frozen=True)
class TagProblem:
    """A tag (or a set of tags) that could not be read; ``why`` says what is wrong."""

    tag: str
    why: str

    def __str__(self) -> str:
        return f"{self.tag!r}: {self.why}"


@dataclass
class TagReading:
    """Tags sorted into units. ``tags[unit]`` lists the unit's tags in their order (valid or
    not); ``values[unit]`` the valid values read from them, ``value_tags[unit]`` the tag of each
    value (same order); ``problems`` what could not be read."""

    tags: dict[str, list[str]] = field(default_factory=lambda: {u: [] for u in (*UNITS, "unknown")})
    values: dict[str, list[Any]] = field(default_factory=lambda: {u: [] for u in UNITS})
    value_tags: dict[str, list[str]] = field(default_factory=lambda: {u: [] for u in UNITS})
    problems: dict[str, list[TagProblem]] = field(default_factory=lambda: {u: [] for u in (*UNITS, "unknown")})

    def unit_tags(self, unit: str) -> frozenset[str]:
        return frozenset(self.tags[unit])

    def decide(self, unit: str, pushed: Iterable[str] | None = None) -> tuple[bool, Any, list[TagProblem]]:
        """(readable, value, problems) of one unit from its tags.

        ``background``: (background, "human", None) or (None, None, None) when no bg: tag;
        ``curation``: (status, reject_reason), ("candidate", None) when no curation tag;
        ``mask``: mask_status or None; ``free``: the list of free tags. A unit with an
        unreadable tag or contradicting tags is not readable (its problems say why).

        ``pushed``: the unit's tags the push showed (from the push snapshot). When the tags
        contradict, the tags added since the push win over the pushed ones
        (:func:`newest_values`); only a contradiction that remains is reported.
        """
        problems = list(self.problems[unit])
        values = self.values[unit]
        if unit == "free":
            return (not problems), list(dict.fromkeys(values)), problems
        distinct = list(dict.fromkeys(values))
        if len(distinct) > 1 and pushed is not None:
            pushed = set(pushed)
            distinct = newest_values(self.value_tags[unit], values, pushed)
            if len(distinct) > 1:
                added = [t for t in dict.fromkeys(self.value_tags[unit]) if t not in pushed]
                problems.append(TagProblem(", ".join(added), f"contradicting {unit} tags, all added since the push; "
                                                             "keep exactly one"))
        elif len(distinct) > 1:
            problems.append(TagProblem(", ".join(self.tags[unit]), f"contradicting {unit} tags; keep exactly one"))
        if problems:
            return False, None, problems
        if unit == "background":
            return True, ((distinct[0], "human", None) if distinct else (None, None, None)), []
        if unit == "curation":
            return True, (distinct[0] if distinct else ("candidate", None)), []
        return True, (distinct[0] if distinct else None), []

    def tag_of(self, unit: str, value: Any) -> str | None:
        """The first tag that says ``value`` (e.g. the choice that won :meth:`decide`)."""
        return next((t for t, v in zip(self.value_tags[unit], self.values[unit]) if v == value), None)


def newest_values(tags: Sequence[str], values: Sequence[Any], pushed: Iterable[str]) -> list[Any]:
    """The distinct values of a unit once the tags added since the push win over the pushed ones.

    ``tags[i]`` says ``values[i]``; ``pushed`` are the unit's tags at push time. When some tag is
    new (not pushed), the answer is the new tags' values, else all values. One value back: the
    unit is decided; more than one: a genuine contradiction (several new decisions).

    >>> newest_values(["accept", "reject:clarity"], ["A", "R"], pushed=["accept"])
    ['R']
    >>> newest_values(["accept", "reject:clarity"], ["A", "R"], pushed=[])
    ['A', 'R']
    """
    before = set(pushed)
    new = [v for t, v in zip(tags, values) if t not in before]
    return list(dict.fromkeys(new if new else values))


@dataclass(frozen=True)
class TagVocabulary:
    """The vocabulary of ``annotation/tags.yaml`` (see the module docstring)."""

    accept: str
    reject: str
    reject_prefix: str
    reasons: Mapping[str, str]
    background_prefix: str
    mask_tags: Mapping[str, str]
    free_prefix: str

    @classmethod
    def load(cls, path: str | Path | None = None) -> TagVocabulary:
        """Read ``tags.yaml`` (default: ``annotation/tags.yaml``)."""
        path = Path(path) if path is not None else annotation_file(TAGS_FILE)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise VocabularyError(f"{path} cannot be read: {exc}") from None
        try:
            curation, background, mask, free = data["curation"], data["background"], data["mask"], data["free"]
            vocab = cls(
                accept=str(curation["accept"]), reject=str(curation["reject"]),
                reject_prefix=str(curation["reject_prefix"]),
                reasons={str(k): str(v) for k, v in dict(curation["reasons"]).items()},
                background_prefix=str(background["prefix"]),
                mask_tags={str(k): str(v) for k, v in dict(mask["tags"]).items()},
                free_prefix=str(free["prefix"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise VocabularyError(f"{path}: missing or malformed key {exc} (see the comments in the shipped file)") from None
        if not vocab.reasons:
            raise VocabularyError(f"{path}: curation.reasons is empty")
        if REJECTED_STATUS not in vocab.mask_tags.values():
            raise VocabularyError(f"{path}: mask.tags needs a tag for status {REJECTED_STATUS!r} (the verdict that drops "
                                  "a model proposal and that mask-based numbers leave out; curate/masks/sources.py)")
        if any(status == "model" or status.startswith(MODEL_PREFIX) for status in vocab.mask_tags.values()):
            raise VocabularyError(f"{path}: a mask tag cannot give a model status ({MODEL_PREFIX}...): only "
                                  "curate propose-masks writes those")
        return vocab

    # ------------------------------------------------------------------ folder -> tags
    def curation_tag(self, status: str | None, reason: str | None) -> str | None:
        """The tag showing a status: ``accept``, ``reject:<reason>``, ``reject`` or None."""
        if status == "accepted":
            return self.accept
        if status == "rejected":
            return f"{self.reject_prefix}{reason}" if reason else self.reject
        return None

    def tags_for(self, row: Mapping[str, Any]) -> list[str]:
        """The tags a push shows for a folder row: its human decisions and free tags.

        Only a *human* background becomes ``bg:<background>`` (model and synthetic labels are
        fields, for the reviewer to confirm); status accepted/rejected becomes ``accept`` /
        ``reject:<reason>``; mask_status ok/bad becomes ``mask:ok`` / ``mask:bad``; each free tag
        ``t`` becomes ``tag:t``.
        """
        tags: list[str] = []
        curation = self.curation_tag(row.get("status"), row.get("reject_reason"))
        if curation:
            tags.append(curation)
        if row.get("background") and row.get("background_source") == "human":
            tags.append(f"{self.background_prefix}{row['background']}")
        for tag, status in self.mask_tags.items():
            if row.get("mask_status") == status:
                tags.append(tag)
                break
        tags.extend(t if t.startswith(SUSPECT_PREFIX) else f"{self.free_prefix}{t}" for t in (row.get("tags") or []))
        return tags

    # ------------------------------------------------------------------ tags -> folder
    def unit_of(self, tag: str) -> str:
        """The unit a tag belongs to by its form (valid or not): background, curation, mask,
        free, or unknown."""
        if tag.startswith(self.background_prefix):
            return "background"
        if tag in (self.accept, self.reject) or tag.startswith(self.reject_prefix):
            return "curation"
        if tag in self.mask_tags or tag.startswith(_prefix_of(next(iter(self.mask_tags), ""))):
            return "mask"
        if tag.startswith(self.free_prefix) or tag.startswith(SUSPECT_PREFIX):
            return "free"
        return "unknown"

    def read(self, tags: Iterable[str], backgrounds: Sequence[str]) -> TagReading:
        """Sort ``tags`` into units and read their values against the dataset's ``backgrounds``."""
        reading = TagReading()
        known_backgrounds = set(backgrounds)
        for tag in tags:
            if not isinstance(tag, str) or tag.startswith(DISCOVER_PREFIX):
                continue
            unit = self.unit_of(tag)
            reading.tags[unit].append(tag)
            if unit == "background":
                value = tag[len(self.background_prefix):]
                if value in known_backgrounds:
                    reading.values[unit].append(value)
                    reading.value_tags[unit].append(tag)
                else:
                    reading.problems[unit].append(TagProblem(
                        tag, f"background {value!r} is not in the dataset's vocabulary ({', '.join(backgrounds)})"))
            elif unit == "curation":
                if tag == self.accept:
                    reading.values[unit].append(("accepted", None))
                    reading.value_tags[unit].append(tag)
                elif tag == self.reject:
                    reading.values[unit].append(("rejected", None))
                    reading.value_tags[unit].append(tag)
                else:
                    reason = tag[len(self.reject_prefix):]
                    if reason in self.reasons:
                        reading.values[unit].append(("rejected", reason))
                        reading.value_tags[unit].append(tag)
                    else:
                        reading.problems[unit].append(TagProblem(
                            tag, f"reason {reason!r} is not one of {', '.join(self.reasons)}"))
            elif unit == "mask":
                if tag in self.mask_tags:
                    reading.values[unit].append(self.mask_tags[tag])
                    reading.value_tags[unit].append(tag)
                else:
                    reading.problems[unit].append(TagProblem(tag, f"mask tags are {', '.join(self.mask_tags)}"))
            elif unit == "free":
                value = tag if tag.startswith(SUSPECT_PREFIX) else tag[len(self.free_prefix):]
                if value:
                    reading.values[unit].append(value)
                    reading.value_tags[unit].append(tag)
                else:
                    reading.problems[unit].append(TagProblem(tag, f"{self.free_prefix}<word> needs a word"))
            else:
                reading.problems[unit].append(TagProblem(tag, "not in the review vocabulary " + self.summary()))
        return reading

    def summary(self) -> str:
        """A one-line reminder of the vocabulary (for messages)."""
        mask = "/".join(self.mask_tags)
        return (f"({self.accept}, {self.reject_prefix}<{'|'.join(self.reasons)}>, {self.background_prefix}<background>, "
                f"{mask}, {self.free_prefix}<word>)")

    def describe(self, backgrounds: Sequence[str]) -> list[tuple[str, str]]:
        """Every tag a reviewer may use for a dataset with these backgrounds, with its meaning."""
        rows = [(self.accept, "keep the photo (status accepted)")]
        rows += [(f"{self.reject_prefix}{r}", f"reject: {why}") for r, why in self.reasons.items()]
        rows += [(f"{self.background_prefix}{b}", f"background is {b}") for b in backgrounds]
        rows += [(t, f"mask_status = {s}" + (" (on a model proposal: the mask is dropped)" if s == REJECTED_STATUS
                                              else " (on a model proposal: verified as it is)"))
                 for t, s in self.mask_tags.items()]
        rows.append((f"{self.free_prefix}<word>", "a free tag kept in the folder's tags column"))
        return rows


def _prefix_of(tag: str) -> str:
    """``mask:`` of ``mask:ok`` (so that ``mask:typo`` is read as a bad mask tag)."""
    return tag.split(":", 1)[0] + ":" if ":" in tag else "\0"
