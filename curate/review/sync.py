"""Two-way sync between the dataset folder and a review tool: push snapshots and three-way pulls.

The folder is the single source of truth. A push records, per sample and per *unit* (a field
or a group of fields a reviewer changes together), the folder's value and the tool's value at
push time in ``DIR/.review/<backend>-<target>.json``. A pull compares three values per unit:

- the tool now vs the tool at push: unchanged -> nothing to do (the folder keeps its value,
  even when it changed meanwhile);
- edited in the tool, and the folder still holds the pushed value -> the edit is applied
  (only that unit's fields), and logged to ``changes.jsonl`` by :meth:`Dataset.update` /
  :meth:`Dataset.set_masks`;
- edited in the tool *and* changed in the folder since the push -> a :class:`Conflict`: left as
  it is and reported, unless the caller chose ``on_conflict="view"`` (take the tool's value) or
  ``"folder"`` (keep the folder's and stop reporting it).

Units (:data:`UNITS`) and the folder fields each one writes:

==============  =====================================================
``class``       class_index (and class_name)
``background``  background, background_source, background_score
``curation``    status, reject_reason
``mask``        the mask image (masks/, via set_masks)
``mask_status`` mask_status
``group``       group
``tags``        tags (the free tags)
``license``     license
``attribution`` attribution
==============  =====================================================

Backends (:mod:`curate.review.fiftyone`, :mod:`curate.review.labelstudio`) turn what they read
into :class:`Observation` objects; :func:`apply_pull` does the rest, identically for both.

Masks: a backend reports the reviewer's verdict (``mask_status`` edit, from ``mask:ok`` /
``mask:bad``, or None when the reviewer cleared it) and a new mask (``mask`` edit: repainted
pixels, or None when removed) as it reads them; :func:`decide_mask_review` turns "verdict + maybe
a new mask + the mask_status the push showed" into the folder edits, the same for both tools.
For a *model proposal* (the push showed ``mask_status = model:<id>`` or a bare ``model``;
:mod:`curate.masks.sources`):

=======================  ===========  ===================================================  ==========
verdict                  new mask     folder                                               counted
=======================  ===========  ===================================================  ==========
``mask:ok``              none         the proposal kept, ``mask_status = ok`` (human)      accepted
``mask:ok`` or none      repainted    the new mask, ``mask_status = human``                repainted
``mask:bad``             none         the mask dropped (``set_masks``: None), status bad   rejected
none or ``mask:bad``     removed      the mask dropped, status bad                         rejected
``mask:bad``             repainted    nothing: a problem (drop or keep? choose one)
``mask:ok``              removed      nothing: a problem
cleared (null)           none         nothing: a problem (a null status would read as a
                                      person's mask: the proposal would become trusted)
cleared (null)           removed      nothing: a problem
=======================  ===========  ===================================================  ==========

A new mask with no pixel set (a Label Studio brush erased to nothing, an all-zero FiftyOne
mask) is never stored: on a proposal it counts as *removed* (the table's rows), on any other
mask it is a problem. "Removed" is FiftyOne's ``mask`` field cleared, or a Label Studio
annotation that holds a mask verdict but no brush region where the push showed one (an
annotation without a verdict and without a brush says nothing about the mask).

A proposal decision guards *both* mask units: it is applied only if neither the mask nor its
status changed in the folder since the push (a newer ``curate propose-masks`` run replaced the
proposal: the reviewer judged another mask), otherwise it is a :class:`Conflict` like any other.
Other masks keep the plain rules: a verdict sets ``mask_status``; a new mask takes the verdict's
status, else ``human``; a removed mask with a verdict that keeps it (``mask:ok``) is a problem.
The counts are :attr:`PullReport.proposals`
(``proposals: 5 accepted, 2 repainted, 3 rejected (masks dropped)``).

The masks of a pull are written with :meth:`Dataset.set_masks`, one table commit per actor
(a pull of 13,000 verdicts is not 13,000 commits); each is checked (size, values, not empty)
before anything is written, so one bad mask is a problem of its sample, never a refused batch.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from curate import __version__
from curate.runs import slug
from curate.store import Dataset, DatasetError
from curate.store import schema as S
from curate.store.atomic import atomic_write_bytes
from curate.store.images import ImageRejected, mask_array
from curate.store.mask_sources import REJECTED_STATUS, model_id_of

log = logging.getLogger(__name__)

REVIEW_DIR = ".review"
SNAPSHOT_VERSION = 1
UNITS: tuple[str, ...] = ("class", "background", "curation", "mask", "mask_status", "group", "tags",
                          "license", "attribution")
OnConflict = Literal["report", "view", "folder"]


class ReviewError(RuntimeError):
    """A review push or pull that cannot go on; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# folder values per unit
# ---------------------------------------------------------------------------------------------


def mask_fingerprint(ds: Dataset, row: Mapping[str, Any]) -> str | None:
    """``<mask_path>:<sha256 of the file, 16 hex>`` of a row's mask, or None without one."""
    rel = row.get("mask_path")
    if rel is None:
        return None
    path = ds.mask_path(row)
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]  # type: ignore[union-attr]
    except OSError:
        digest = "missing"
    return f"{rel}:{digest}"


def mask_digest(mask: np.ndarray | None) -> str | None:
    """A digest of a mask's pixels (shape and values), or None."""
    if mask is None:
        return None
    array = np.ascontiguousarray(mask, dtype=np.uint8)
    return hashlib.sha256(f"{array.shape[0]}x{array.shape[1]}:".encode() + array.tobytes()).hexdigest()[:24]


def folder_units(ds: Dataset, row: Mapping[str, Any]) -> dict[str, Any]:
    """The folder's value of every unit for one row (JSON-ready)."""
    return {
        "class": row.get("class_index"),
        "background": [row.get("background"), row.get("background_source"), _float(row.get("background_score"))],
        "curation": [row.get("status"), row.get("reject_reason")],
        "mask": mask_fingerprint(ds, row),
        "mask_status": row.get("mask_status"),
        "group": row.get("group"),
        "tags": list(row.get("tags") or []),
        "license": row.get("license"),
        "attribution": row.get("attribution"),
    }


def unit_fields(unit: str, value: Any) -> dict[str, Any]:
    """The folder fields a unit's value writes (not for ``mask``, which goes through set_masks)."""
    if unit == "class":
        return {"class_index": value}
    if unit == "background":
        background, source, score = value
        return {"background": background, "background_source": source, "background_score": score}
    if unit == "curation":
        status, reason = value
        return {"status": status, "reject_reason": reason}
    if unit in ("mask_status", "group", "license", "attribution"):
        return {unit: value}
    if unit == "tags":
        return {"tags": list(value)}
    raise ValueError(f"unit {unit!r} has no plain fields")


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def jsonable(value: Any) -> Any:
    """Tuples as lists, numpy scalars as Python values (what a snapshot stores and compares)."""
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


# ---------------------------------------------------------------------------------------------
# snapshot
# ---------------------------------------------------------------------------------------------


def snapshot_path(root: Path, backend: str, target: str) -> Path:
    """``DIR/.review/<backend>-<target slug>.json``."""
    return Path(root) / REVIEW_DIR / f"{backend}-{slug(target, limit=100)}.json"


@dataclass
class Snapshot:
    """What one push sent, per sample: ``samples[id] = {"folder": {unit: v}, "view": {unit: v}}``.

    ``target`` says where (FiftyOne dataset name; Label Studio URL, project id and title; never a
    token). ``extra`` holds backend data per sample (e.g. Label Studio task ids).
    """

    backend: str
    target: dict[str, Any]
    samples: dict[str, dict[str, Any]] = field(default_factory=dict)
    pushed_at: str = ""
    path: Path | None = None

    @classmethod
    def load(cls, path: Path) -> Snapshot | None:
        """The snapshot at ``path``, or None when there is none (a damaged one raises)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ReviewError(f"the push snapshot {path} cannot be read ({exc}); push again to recreate it") from None
        if not isinstance(data, dict) or data.get("version") != SNAPSHOT_VERSION or "samples" not in data:
            raise ReviewError(f"{path} is not a curate push snapshot (version {SNAPSHOT_VERSION}); push again")
        return cls(backend=data["backend"], target=data.get("target") or {}, samples=data["samples"],
                   pushed_at=data.get("pushed_at", ""), path=Path(path))

    def save(self, ds: Dataset, path: Path | None = None) -> Path:
        """Write atomically (under the dataset's lock) to ``path`` or where it was loaded from."""
        path = Path(path or self.path or "")
        if not path.name:
            raise ValueError("Snapshot.save needs a path")
        data = {"version": SNAPSHOT_VERSION, "backend": self.backend, "target": self.target,
                "pushed_at": self.pushed_at, "curate_version": __version__, "samples": self.samples}
        text = json.dumps(jsonable(data), indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False)
        with ds.locked("review snapshot"):
            atomic_write_bytes(ds.root, path, text.encode("utf-8"))
        self.path = path
        return path


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------
# observations and the pull
# ---------------------------------------------------------------------------------------------


@dataclass
class Edit:
    """The tool's new value of one unit (in folder terms). For ``mask``, ``value`` is the new
    mask array (or None to remove it) and ``mask_status`` the status to give it (None: decided
    by :func:`decide_mask_review` from the verdict, else ``human``).

    ``covers``: further units this edit decides together with its own (their folder values must
    be unchanged since the push too, and their tool values are settled with it); ``proposal``:
    what the edit does to a model proposal (accepted, repainted, rejected), counted in
    :attr:`PullReport.proposals` when applied.
    """

    unit: str
    value: Any
    source: str
    actor: str | None = None
    mask_status: str | None = None
    covers: tuple[str, ...] = ()
    proposal: str | None = None


@dataclass
class Problem:
    """Something the pull could not read or apply for one sample (an unknown tag, a value
    outside the vocabulary, contradicting tags, ...); nothing was changed for it."""

    sample_id: str | None
    unit: str | None
    message: str

    def __str__(self) -> str:
        where = f"sample {self.sample_id}" if self.sample_id else "dataset"
        return f"{where}{f' [{self.unit}]' if self.unit else ''}: {self.message}"


@dataclass
class Observation:
    """What a backend read for one sample: edits per unit, problems, and the tool's current
    per-unit values (stored in the snapshot for the units that get settled)."""

    sample_id: str
    edits: dict[str, Edit] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    view: dict[str, Any] = field(default_factory=dict)


@dataclass
class Conflict:
    """A unit edited in the tool and changed in the folder since the push."""

    sample_id: str
    unit: str
    pushed: Any
    folder: Any
    view: Any
    resolution: str | None = None  # None (left for the user), "view" or "folder"

    def __str__(self) -> str:
        state = f" -> kept {self.resolution}" if self.resolution else " (left as it is; choose with --on-conflict view|folder)"
        return (f"sample {self.sample_id} [{self.unit}]: pushed {_show(self.pushed)}, folder now {_show(self.folder)}, "
                f"review says {_show(self.view)}{state}")


@dataclass
class Change:
    """One applied unit: the folder's old and new value."""

    sample_id: str
    unit: str
    old: Any
    new: Any
    source: str
    actor: str

    def __str__(self) -> str:
        return f"sample {self.sample_id} [{self.unit}]: {_show(self.old)} -> {_show(self.new)} ({self.source}; {self.actor})"


#: What a pull can do to a model proposal (:func:`decide_mask_review`).
PROPOSAL_OUTCOMES: tuple[str, ...] = ("accepted", "repainted", "rejected")


@dataclass
class ProposalCounts:
    """How many model proposals a pull accepted, repainted and rejected (their masks dropped),
    and how many verdicts on proposals were left in conflict."""

    accepted: int = 0
    repainted: int = 0
    rejected: int = 0
    conflicts: int = 0

    def add(self, outcome: str) -> None:
        if outcome not in PROPOSAL_OUTCOMES:
            raise ValueError(f"a proposal outcome is one of {', '.join(PROPOSAL_OUTCOMES)}, not {outcome!r}")
        setattr(self, outcome, getattr(self, outcome) + 1)

    @property
    def total(self) -> int:
        return self.accepted + self.repainted + self.rejected + self.conflicts

    def as_dict(self) -> dict[str, int]:
        return {"accepted": self.accepted, "repainted": self.repainted, "rejected": self.rejected,
                "conflicts": self.conflicts}

    def line(self) -> str:
        """``proposals: 5 accepted, 2 repainted, 3 rejected (masks dropped)`` (+ ``; 1 left in conflict``)."""
        text = (f"proposals: {self.accepted} accepted, {self.repainted} repainted, "
                f"{self.rejected} rejected (masks dropped)")
        return text + (f"; {self.conflicts} left in conflict" if self.conflicts else "")


@dataclass
class PullReport:
    """The outcome of a pull: applied changes, conflicts, problems (unknown tags and the like),
    and what happened to model mask proposals (:class:`ProposalCounts`)."""

    backend: str
    target: str
    observed: int = 0
    applied: list[Change] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    snapshot: Path | None = None
    proposals: ProposalCounts = field(default_factory=ProposalCounts)

    @property
    def unresolved(self) -> list[Conflict]:
        return [c for c in self.conflicts if c.resolution is None]

    def summary(self) -> str:
        """One line; ``; proposals: ...`` is added when the pull touched model proposals."""
        changed = len({c.sample_id for c in self.applied})
        text = (f"{self.backend} {self.target}: {self.observed} sample(s) read, {len(self.applied)} change(s) applied to "
                f"{changed} sample(s), {len(self.unresolved)} conflict(s) left, {len(self.problems)} problem(s)")
        return text + (f"; {self.proposals.line()}" if self.proposals.total else "")


def _show(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"<mask {value.shape[1]}x{value.shape[0]}, {int((value > 0).sum())} px>"
    text = json.dumps(jsonable(value), ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) < 120 else text[:117] + "..."


def _same_mask(ds: Dataset, row: Mapping[str, Any], new: np.ndarray | None) -> bool:
    current = ds.load_mask(row) if row.get("mask_path") else None
    if current is None or new is None:
        return current is None and new is None
    return current.shape == new.shape and bool(np.array_equal(current, new))


def _already(ds: Dataset, row: Mapping[str, Any], now: Mapping[str, Any], edit: Edit) -> bool:
    """Whether the folder already holds the edit's value (and, for a mask edit that covers its
    status, that status)."""
    if edit.unit == "mask":
        same = _same_mask(ds, row, edit.value)
        return same and ("mask_status" not in edit.covers or now["mask_status"] == edit.mask_status)
    return jsonable(now[edit.unit]) == jsonable(edit.value)


def is_empty_mask(mask: Any) -> bool:
    """Whether a new mask has no pixel set (a brush erased to nothing, an all-zero array)."""
    return isinstance(mask, np.ndarray) and mask.size > 0 and not bool(np.any(mask))


def decide_mask_review(sample_id: str, edits: Mapping[str, Edit], pushed_status: str | None
                       ) -> tuple[dict[str, Edit], list[Problem]]:
    """The folder edits of a reviewer's mask verdict and new mask (module docstring's table).

    ``edits`` are what a backend read for one sample (its ``mask_status`` edit is the verdict, its
    ``mask`` edit the repainted or removed mask); ``pushed_status`` is the ``mask_status`` the
    push showed. Returns the edits to apply (other units untouched) and the problems (a verdict
    that contradicts the mask, a cleared verdict on a proposal, an empty mask on a mask a person
    or the generator made; both mask units are then left as they are). An empty mask is never
    stored: on a proposal it is read as the mask removed.
    """
    verdict, mask = edits.get("mask_status"), edits.get("mask")
    if verdict is None and mask is None:
        return dict(edits), []
    out = {unit: edit for unit, edit in edits.items() if unit not in ("mask", "mask_status")}
    said = verdict.value if verdict is not None else None
    empty = mask is not None and is_empty_mask(mask.value)
    if model_id_of(pushed_status) is None:  # a human, exact or rejected mask (or none): the plain rules
        shown = f"{pushed_status} mask" if pushed_status else "mask"
        if empty:
            return out, [Problem(sample_id, "mask", f"{mask.source}: the new mask is empty (no pixel set) on the "
                                                    f"{shown}; a mask is never stored empty: remove the mask (or mark "
                                                    "it mask:bad) instead; not applied")]
        if mask is not None and mask.value is None and verdict is not None and said is not None \
                and said != REJECTED_STATUS:
            return out, [Problem(sample_id, "mask", f"{verdict.source} but the mask was removed ({mask.source}) on "
                                                    f"the {shown}: the verdict keeps it, the removal drops it; keep "
                                                    "one; not applied")]
        if verdict is not None:
            out["mask_status"] = verdict
        if mask is not None:
            status = mask.mask_status
            if status is None:
                status = said if said is not None else ("human" if mask.value is not None else None)
            out["mask"] = Edit("mask", mask.value, mask.source, mask.actor, mask_status=status)
        return out, []
    what = f"model proposal {pushed_status}"
    if empty:  # erased to nothing: never stored as an empty mask; on a proposal that is a removal
        assert mask is not None
        mask = Edit("mask", None, f"{mask.source}, erased to nothing", mask.actor)
    if mask is not None and mask.value is not None:  # repainted
        if verdict is not None and said == REJECTED_STATUS:
            return out, [Problem(sample_id, "mask", f"{verdict.source} and a repainted mask ({mask.source}) on the "
                                                    f"{what}: mask:bad drops the proposal, a repaint replaces it; "
                                                    "keep one; not applied")]
        out["mask"] = Edit("mask", mask.value, f"{mask.source} (repainted {what})", mask.actor,
                           mask_status="human", covers=("mask_status",), proposal="repainted")
        return out, []
    if mask is not None:  # removed: the proposal is dropped, unless the verdict says keep it
        if verdict is not None and said != REJECTED_STATUS:
            return out, [Problem(sample_id, "mask", f"{verdict.source} but the mask was removed ({mask.source}) on the "
                                                    f"{what}; keep one; not applied")]
        out["mask"] = Edit("mask", None, f"{mask.source} (rejected {what}: mask dropped)", mask.actor,
                           mask_status=REJECTED_STATUS, covers=("mask_status",), proposal="rejected")
        return out, []
    assert verdict is not None
    if said is None:  # the verdict cleared: mask_status null would read as a person's mask (sources.mask_source)
        return out, [Problem(sample_id, "mask_status", f"{verdict.source}: the verdict on the {what} was cleared; a "
                                                       "cleared status would make the unverified proposal count as a "
                                                       "person's mask; give mask:ok or mask:bad; not applied")]
    if said == REJECTED_STATUS:  # mask:bad: the proposal is dropped, never kept as a mask
        out["mask"] = Edit("mask", None, f"{verdict.source} (rejected {what}: mask dropped)", verdict.actor,
                           mask_status=REJECTED_STATUS, covers=("mask_status",), proposal="rejected")
    elif model_id_of(said) is not None:  # another model's status: still an unverified proposal
        out["mask_status"] = verdict
    else:  # mask:ok (or another person's status): the proposal is verified as it is
        out["mask_status"] = Edit("mask_status", said, f"{verdict.source} (accepted {what})", verdict.actor,
                                  covers=("mask",), proposal="accepted")
    return out, []


def _values(units: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    """One unit's value, or ``{unit: value}`` of several (what a conflict shows)."""
    return units.get(names[0]) if len(names) == 1 else {name: units.get(name) for name in names}


def validate_edit(ds: Dataset, edit: Edit, row: Mapping[str, Any] | None = None) -> str | None:
    """Why the folder would refuse this edit, or None (checked before anything is written, so
    that one bad mask never refuses the batch it would be committed with). ``row``: the sample's
    row, to check a mask's size against its image."""
    if edit.unit == "mask":
        if edit.mask_status is not None:
            problem = S.check_value("mask_status", edit.mask_status, S.Vocabulary(None, None))
            if problem:
                return problem
        if edit.value is None:
            return None
        if not isinstance(edit.value, np.ndarray) or edit.value.ndim != 2:
            return "the mask is not an H x W array"
        try:
            mask_array(edit.value)  # the values the folder takes (0..255, integers)
        except ImageRejected as exc:
            return exc.detail
        if is_empty_mask(edit.value):
            return "the mask is empty (no pixel set); an empty mask is never stored"
        if row is not None and edit.value.shape != (row.get("height"), row.get("width")):
            height, width = edit.value.shape
            return f"the mask is {width}x{height} but the stored image is {row.get('width')}x{row.get('height')}"
        return None
    vocab = S.Vocabulary(ds.label_space, ds.backgrounds)
    for column, value in unit_fields(edit.unit, edit.value).items():
        problem = S.check_value(column, value, vocab)
        if problem:
            return problem
    return None


def apply_pull(
    ds: Dataset,
    snapshot: Snapshot,
    observations: Iterable[Observation],
    *,
    backend: str,
    target: str,
    actor: str,
    on_conflict: OnConflict = "report",
    dry_run: bool = False,
) -> PullReport:
    """Apply what the tool changed since the push (see the module docstring); returns a report.

    ``actor`` is recorded in ``changes.jsonl`` (an :class:`Edit` may name its own, e.g. the Label
    Studio annotator). The snapshot is updated for every unit that got settled (applied, already
    equal, or resolved), so a second pull of the same state changes nothing. ``dry_run``
    computes the report and writes nothing.
    """
    if on_conflict not in ("report", "view", "folder"):
        raise ValueError(f"on_conflict must be report, view or folder, not {on_conflict!r}")
    report = PullReport(backend=backend, target=target)
    plans: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)  # actor -> sample -> fields
    masks: dict[tuple[str, str], dict[str, Edit]] = defaultdict(dict)  # (actor, reason) -> sample -> mask edit
    settled: list[tuple[str, str, Any]] = []  # (sample, unit, view value) to store in the snapshot
    reason = f"review pull from {backend} {target}"
    for obs in observations:
        report.observed += 1
        report.problems.extend(obs.problems)
        entry = snapshot.samples.get(obs.sample_id)
        if entry is None:
            if obs.edits:
                report.problems.append(Problem(obs.sample_id, None, "not in the push snapshot (added in the tool?); ignored"))
            continue
        if obs.sample_id not in ds:
            if obs.edits:
                report.problems.append(Problem(obs.sample_id, None, "no longer in the dataset folder; its edits are ignored"))
            continue
        row = ds.row(obs.sample_id)
        now = folder_units(ds, row)
        pushed = entry["folder"]
        edits, mask_problems = decide_mask_review(obs.sample_id, obs.edits, pushed.get("mask_status"))
        report.problems.extend(mask_problems)
        for unit, edit in edits.items():
            why = validate_edit(ds, edit, row)
            if why:
                report.problems.append(Problem(obs.sample_id, unit, f"{edit.source}: {why}; not applied"))
                continue
            units = (unit, *edit.covers)
            folder_unchanged = all(jsonable(now[u]) == jsonable(pushed.get(u)) for u in units)
            if _already(ds, row, now, edit):
                settled.extend((obs.sample_id, u, obs.view.get(u)) for u in units)
                continue
            if not folder_unchanged:
                conflict = Conflict(obs.sample_id, unit, _values(pushed, units), _values(now, units), edit.value)
                report.conflicts.append(conflict)
                if on_conflict == "folder":
                    conflict.resolution = "folder"
                    settled.extend((obs.sample_id, u, obs.view.get(u)) for u in units)
                    continue
                if on_conflict != "view":
                    if edit.proposal:
                        report.proposals.conflicts += 1
                    continue
                conflict.resolution = "view"
            who = edit.actor or actor
            old = row.get("mask_path") if unit == "mask" else now[unit]
            report.applied.append(Change(obs.sample_id, unit, old, edit.value, edit.source, who))
            if edit.proposal:
                report.proposals.add(edit.proposal)
            if unit == "mask":
                masks[(who, reason)][obs.sample_id] = edit
            else:
                plans[who].setdefault(obs.sample_id, {}).update(unit_fields(unit, edit.value))
            settled.extend((obs.sample_id, u, obs.view.get(u)) for u in units)
    if dry_run:
        return report
    for who, per_sample in plans.items():
        if per_sample:
            try:
                ds.update(list(per_sample), per_sample=per_sample, actor=who, reason=reason)
            except DatasetError as exc:  # validated above; a concurrent change of the vocabulary
                raise ReviewError(f"the folder refused the pulled values: {exc}") from None
    for (who, group_reason), per_sample in masks.items():  # one commit per actor, not one per mask
        # a status given is set; a removed mask without one loses its status too (as set_mask does);
        # a new mask without one keeps the row's
        statuses = {sid: e.mask_status for sid, e in per_sample.items() if e.mask_status is not None or e.value is None}
        try:
            ds.set_masks({sid: e.value for sid, e in per_sample.items()}, mask_status=statuses, actor=who, reason=group_reason)
        except DatasetError as exc:  # validated above (sizes, values); a concurrent change of the folder
            raise ReviewError(f"the folder refused the pulled masks of {who}: {exc}") from None
    touched = {sid for sid, _, _ in settled}
    rows = {sid: ds.row(sid) for sid in touched if sid in ds}
    for sample_id, unit, view_value in settled:
        entry = snapshot.samples[sample_id]
        entry["folder"][unit] = folder_units(ds, rows[sample_id])[unit] if sample_id in rows else None
        if view_value is not None or unit in entry.get("view", {}):
            entry.setdefault("view", {})[unit] = view_value
    if settled:
        snapshot.save(ds)
    report.snapshot = snapshot.path
    log.info("%s", report.summary())
    return report

