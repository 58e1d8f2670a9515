"""Where a sample's object mask came from, and whether a mask-based number may use it.

This is the one mask API that every mask consumer shares (docs/design.md#masks): SSS and RMA
(``curate explain``), the clarity check (``curate audit``), fidelity's ``mask`` method, composites
and the interventions all ask :func:`is_trusted` / :func:`trusted_rows`, and every table that
uses masks prints :meth:`MaskCounts.line`. What ``curate propose-masks`` records about a proposal
in the row's ``extra`` (its score and run) is read here too (:func:`proposal_score`,
:func:`proposal_run`, :func:`proposal_of`), for the review tools, their views and the measurement.

The source of a mask is read from the ``mask_status`` column (schema v1 keeps its columns; the
issue's ``mask_source`` is this column's vocabulary, see docs/design.md#masks):

====================================  ==========  =============================================
``mask_status``                       source      trusted by default
====================================  ==========  =============================================
``synthetic``, ``coco``, ``exact``    exact       yes: drawn by the generator / the annotator
``human``, ``ok``, ``reviewed``,      human       yes: painted or verified by a person
any other text, or null
``model:<model id>`` (or ``model``)   model       no: an unverified proposal of
                                                  ``curate propose-masks``; only with
                                                  ``allow_model_masks``
``bad``                               rejected    no: a reviewer said the mask is wrong
====================================  ==========  =============================================

A model proposal that a reviewer accepts (``mask:ok``) or repaints becomes ``ok`` / ``human``,
i.e. human: the person is the one vouching for it. A mask with an unknown status (folders
written before this vocabulary, or a user's own text) counts as human, since only
``propose-masks`` writes ``model:`` statuses.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EXACT_STATUSES", "HUMAN_STATUSES", "MODEL_PREFIX", "REJECTED_STATUS", "MASK_SCORE_KEY", "MASK_RUN_KEY",
    "SOURCES", "MaskCounts", "ProposalInfo", "mask_source", "model_status", "model_id_of", "is_trusted", "trusted_rows",
    "mask_counts", "untrusted_masks_message", "usable_mask", "row_extra", "proposal_score", "proposal_run", "proposal_of",
]

#: Statuses of masks drawn exactly (the synthetic generator, COCO's annotators, composites).
EXACT_STATUSES: tuple[str, ...] = ("synthetic", "coco", "exact")
#: Statuses a person gives (a painted mask, a verified proposal, a reviewed mask).
HUMAN_STATUSES: tuple[str, ...] = ("human", "ok", "reviewed")
#: ``mask_status`` of a model proposal: ``model:<model id>``.
MODEL_PREFIX = "model:"
#: ``mask_status`` of a mask a reviewer judged wrong (``mask:bad``).
REJECTED_STATUS = "bad"
#: Keys in a row's ``extra`` JSON: the proposal's score and the propose-masks run that wrote it.
MASK_SCORE_KEY = "mask_score"
MASK_RUN_KEY = "mask_run"
#: The sources, in the order tables print them.
SOURCES: tuple[str, ...] = ("human", "exact", "model", "rejected")


def model_status(model_id: str) -> str:
    """The ``mask_status`` of a proposal by ``model_id``: ``model:<model_id>``."""
    if not model_id:
        raise ValueError("a model proposal needs the model's id")
    return f"{MODEL_PREFIX}{model_id}"


def model_id_of(status: str | None) -> str | None:
    """The model id of a ``model:<id>`` status (``""`` for a bare ``model``), else None."""
    if status == "model":
        return ""
    if isinstance(status, str) and status.startswith(MODEL_PREFIX):
        return status[len(MODEL_PREFIX):]
    return None


def mask_source(row: Mapping[str, Any]) -> str | None:
    """``human`` | ``exact`` | ``model`` | ``rejected`` for a row with a mask; None without one."""
    if row.get("mask_path") is None:
        return None
    status = row.get("mask_status")
    if status in EXACT_STATUSES:
        return "exact"
    if model_id_of(status) is not None:
        return "model"
    if status == REJECTED_STATUS:
        return "rejected"
    return "human"


def row_extra(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's ``extra`` object (stored as JSON text, or already a mapping); {} when missing or
    unreadable."""
    extra = row.get("extra")
    if isinstance(extra, Mapping):
        return dict(extra)
    try:
        value = json.loads(extra) if isinstance(extra, (str, bytes)) and extra else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def proposal_score(row: Mapping[str, Any]) -> float | None:
    """The model's confidence that ``curate propose-masks`` recorded on the row
    (``extra.mask_score``), or None (none recorded, or not a finite number).

    Provenance only: it stays on the row after a reviewer verifies or repaints the proposal, so
    whether the mask *is still* a proposal is :func:`mask_source`'s answer (:func:`proposal_of`
    asks both)."""
    score = row_extra(row).get(MASK_SCORE_KEY)
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        return None
    return float(score)


def proposal_run(row: Mapping[str, Any]) -> str | None:
    """The propose-masks run that wrote the row's proposal (``extra.mask_run``), or None.
    Provenance like :func:`proposal_score`: kept after a review."""
    run = row_extra(row).get(MASK_RUN_KEY)
    return None if run is None else str(run)


@dataclass(frozen=True)
class ProposalInfo:
    """A row's unverified model proposal: the model id of ``mask_status = model:<id>`` and the
    provenance propose-masks recorded (:func:`proposal_score`, :func:`proposal_run`). Not the
    backends' ``Proposal`` (a mask being made), this is one stored on a row."""

    model_id: str
    score: float | None
    run: str | None


def proposal_of(row: Mapping[str, Any]) -> ProposalInfo | None:
    """The row's model proposal, or None when its mask is not one (:func:`mask_source` != model)."""
    if mask_source(row) != "model":
        return None
    return ProposalInfo(model_id=model_id_of(row.get("mask_status")) or "", score=proposal_score(row),
                        run=proposal_run(row))


def is_trusted(row: Mapping[str, Any], *, allow_model_masks: bool = False) -> bool:
    """Whether a mask-based number may use this row's mask: human and exact masks always, model
    proposals only with ``allow_model_masks``, rejected masks and rows without a mask never."""
    source = mask_source(row)
    return source in ("human", "exact") or (source == "model" and allow_model_masks)


@dataclass
class MaskCounts:
    """How many masks of each source a number used, and how many it left out.

    ``used`` counts by source the masks that went into the number; ``skipped_model`` the
    unverified proposals left out (no ``--allow-model-masks``); ``skipped_rejected`` the masks
    reviewers marked bad.
    """

    used: dict[str, int] = field(default_factory=lambda: {"human": 0, "exact": 0, "model": 0})
    skipped_model: int = 0
    skipped_rejected: int = 0
    allow_model_masks: bool = False

    @property
    def total(self) -> int:
        return sum(self.used.values())

    def as_dict(self) -> dict[str, Any]:
        return {"human": self.used["human"], "exact": self.used["exact"], "model": self.used["model"],
                "skipped_model": self.skipped_model, "skipped_rejected": self.skipped_rejected,
                "allow_model_masks": self.allow_model_masks}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> MaskCounts:
        data = data or {}
        return cls(used={k: int(data.get(k, 0) or 0) for k in ("human", "exact", "model")},
                   skipped_model=int(data.get("skipped_model", 0) or 0),
                   skipped_rejected=int(data.get("skipped_rejected", 0) or 0),
                   allow_model_masks=bool(data.get("allow_model_masks", False)))

    def line(self) -> str:
        """One line for a table's caption, e.g. ``masks: 40 human, 300 exact (synthetic / COCO),
        0 model-made; 12 unverified model proposals left out (--allow-model-masks uses them)``."""
        text = (f"masks: {self.used['human']} human, {self.used['exact']} exact (synthetic / COCO), "
                f"{self.used['model']} model-made")
        if self.used["model"]:
            text += " (unverified proposals, used with --allow-model-masks)"
        notes = []
        if self.skipped_model:
            noun = "proposal" if self.skipped_model == 1 else "proposals"
            notes.append(f"{self.skipped_model} unverified model {noun} left out (--allow-model-masks uses them)")
        if self.skipped_rejected:
            noun = "mask" if self.skipped_rejected == 1 else "masks"
            notes.append(f"{self.skipped_rejected} {noun} marked bad by reviewers left out")
        return text + ("; " + "; ".join(notes) if notes else "")


def trusted_rows(rows: Iterable[Mapping[str, Any]], *, allow_model_masks: bool = False
                 ) -> tuple[list[Mapping[str, Any]], MaskCounts]:
    """The rows whose mask a mask-based number may use (:func:`is_trusted`), in order, and the
    :class:`MaskCounts` of what was used and left out. Rows without a mask are neither."""
    kept: list[Mapping[str, Any]] = []
    counts = MaskCounts(allow_model_masks=allow_model_masks)
    for row in rows:
        source = mask_source(row)
        if source is None:
            continue
        if source == "rejected":
            counts.skipped_rejected += 1
        elif source == "model" and not allow_model_masks:
            counts.skipped_model += 1
        else:
            counts.used[source] += 1
            kept.append(row)
    return kept, counts


def mask_counts(rows: Iterable[Mapping[str, Any]], *, allow_model_masks: bool = False) -> MaskCounts:
    """:class:`MaskCounts` of ``rows`` (what :func:`trusted_rows` would use and leave out)."""
    return trusted_rows(rows, allow_model_masks=allow_model_masks)[1]


def untrusted_masks_message(root: Any, counts: MaskCounts, used_for: str) -> str:
    """The error for a selection none of whose masks may be used because they are unverified
    model proposals (``counts.skipped_model`` of them; ``counts.skipped_rejected`` more marked
    bad): it names the two ways forward, ``curate review`` and ``--allow-model-masks`` (the
    wording of the split's refusal of model-made background labels)."""
    rejected = (f" ({counts.skipped_rejected} more were marked bad by reviewers and are never used)"
                if counts.skipped_rejected else "")
    return (f"{root}: the {counts.skipped_model} masks {used_for} would use were all made by a model "
            f"(mask_status = model:<id>, from curate propose-masks) and not checked by a person{rejected}; review "
            "them (curate review) or pass --allow-model-masks (allow_model_masks=True) to use them anyway")


def usable_mask(ds: Any, row: Mapping[str, Any]) -> tuple[Any, str | None]:
    """The row's binary object mask (a boolean ``H x W`` array), or None and the reason it cannot
    be used: ``mask_unreadable: ...``, ``mask_missing``, ``mask_size`` (not the photo's recorded
    size) or ``empty_mask``. Trust is a separate question (:func:`is_trusted`)."""
    try:
        mask = ds.load_mask(row)
    except (OSError, ValueError) as error:
        return None, f"mask_unreadable: {error}"
    if mask is None:
        return None, "mask_missing"
    if mask.shape != (int(row["height"]), int(row["width"])):
        return None, "mask_size"
    binary = mask > 0
    if not binary.any():
        return None, "empty_mask"
    return binary, None
