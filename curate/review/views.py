"""Saved views for the review tasks, defined as data in ``annotation/views.yaml``.

A view is a name, a description, ``match`` conditions on the columns of ``samples.parquet``
(all must hold), an optional ``sort_by`` and flags: ``per_run`` (made once per evaluation run;
``{run}`` in the name, description and conditions is the run's name; the pseudo column
``correct@{run}`` is whether that run's top-1 prediction is right) and ``review`` (its samples
become Label Studio tasks by default). ``sort_by`` may also name the pseudo column
``audit:<check>``: the score of that check in the newest audit run that ran it (FiftyOne shows it
as the sample field ``audit_<check>``; docs/design.md#audit).

Derived columns (:data:`DERIVED_COLUMNS`), usable in ``match`` and ``sort_by`` like columns of
``samples.parquet`` and pushed to FiftyOne as sample fields of the same name:

================  ============================================================================
``mask_source``   human | exact | model | rejected, or null without a mask
                  (:func:`curate.masks.sources.mask_source` of ``mask_status``)
``mask_score``    a model proposal's confidence in [0, 1] (``extra.mask_score``, written by
                  ``curate propose-masks``); null for any other mask and for proposals without one
================  ============================================================================

Conditions: a plain value (equal), null (missing), or a mapping of operators ``eq``, ``ne``,
``lt``, ``le``, ``gt``, ``ge``, ``in``, ``nin``, ``exists``, ``has`` (a list column such as
``tags`` contains the value). The list of ``in`` / ``nin`` may be named instead of written out:
``{mask_statuses: <source>}`` is the ``mask_status`` values :mod:`curate.masks.sources` gives
that source (:data:`MASK_STATUSES`), so a view cannot drift from the mask-source table
(docs/design.md#masks). ``match_any`` (a list of such mappings) adds "and at least one of
these holds". The same definitions select rows
of the folder in Python (:meth:`ViewSpec.matches`, for Label Studio) and are compiled to
FiftyOne view expressions by :mod:`curate.review.fiftyone`. Comparisons with a missing value
are false (``nin`` and ``ne`` are true), in both.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from curate.review.annotation import VIEWS_FILE, annotation_file
from curate.store.mask_sources import EXACT_STATUSES, HUMAN_STATUSES, REJECTED_STATUS, mask_source, proposal_score
from curate.store.schema import COLUMN_NAMES

log = logging.getLogger(__name__)

OPERATORS: tuple[str, ...] = ("eq", "ne", "lt", "le", "gt", "ge", "in", "nin", "exists", "has")
#: The pseudo column of per-run correctness: ``correct@<run name>``.
CORRECT_PREFIX = "correct@"
#: The pseudo column of an audit check's score (``sort_by`` only): ``audit:<check>``.
AUDIT_PREFIX = "audit:"
#: Columns computed from a row (see the module docstring), with what they hold.
DERIVED_COLUMNS: dict[str, str] = {
    "mask_source": "where the mask came from: human, exact, model or rejected (null without a mask)",
    "mask_score": "a model proposal's confidence in [0, 1] (null for other masks)",
}
#: ``{mask_statuses: <source>}`` in a view: the statuses :mod:`curate.masks.sources` names for the
#: source (a model proposal's ``model:<id>`` cannot be listed, and "any other text or null" counts
#: as human without being listed: the view "masks to review" is those).
MASK_STATUSES: dict[str, tuple[str, ...]] = {"exact": EXACT_STATUSES, "human": HUMAN_STATUSES,
                                             "rejected": (REJECTED_STATUS,)}


def column_value(row: Mapping[str, Any], column: str) -> Any:
    """A row's value of a column of samples.parquet or of a derived column."""
    if column == "mask_source":
        return mask_source(row)
    if column == "mask_score":  # only while the mask is a proposal (the score stays in extra after a review)
        return proposal_score(row) if mask_source(row) == "model" else None
    return row.get(column)


class ViewError(ValueError):
    """A view definition that cannot be used; the message names the view and the problem."""


@dataclass(frozen=True)
class Condition:
    """One ``column op value`` test."""

    column: str
    op: str
    value: Any

    def test(self, actual: Any) -> bool:
        """The condition on one value (missing = None)."""
        op, value = self.op, self.value
        if op == "exists":
            return (actual is not None) == bool(value)
        if op == "has":
            return isinstance(actual, (list, tuple)) and value in actual
        if op == "eq":
            return actual is None if value is None else actual == value
        if op == "ne":
            return actual is not None if value is None else actual != value
        if op == "in":
            return actual in value
        if op == "nin":
            return actual not in value
        if actual is None:
            return False
        try:
            return {"lt": actual < value, "le": actual <= value, "gt": actual > value, "ge": actual >= value}[op]
        except TypeError:
            return False


@dataclass(frozen=True)
class ViewSpec:
    """One saved view (see the module docstring)."""

    name: str
    description: str = ""
    conditions: tuple[Condition, ...] = ()
    sort_by: str | None = None
    per_run: bool = False
    review: bool = False
    run: str | None = None
    any_of: tuple[tuple[Condition, ...], ...] = ()
    raw_match: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def for_run(self, run: str) -> ViewSpec:
        """This per-run view instantiated for one run."""
        if not self.per_run:
            return self
        text = lambda s: s.replace("{run}", run)
        conditions = tuple(replace(c, column=text(c.column)) for c in self.conditions)
        any_of = tuple(tuple(replace(c, column=text(c.column)) for c in group) for group in self.any_of)
        return replace(self, name=text(self.name), description=text(self.description), conditions=conditions,
                       any_of=any_of, run=run, per_run=False)

    def matches(self, row: Mapping[str, Any], correct: Mapping[str, Mapping[str, bool]] | None = None) -> bool:
        """Whether a folder row is in the view. ``correct[run][sample_id]`` answers ``correct@run``."""

        def holds(condition: Condition) -> bool:
            if condition.column.startswith(CORRECT_PREFIX):
                run = condition.column[len(CORRECT_PREFIX):]
                actual = (correct or {}).get(run, {}).get(row.get("sample_id"))
            else:
                actual = column_value(row, condition.column)
            return condition.test(actual)

        if not all(holds(c) for c in self.conditions):
            return False
        return not self.any_of or any(all(holds(c) for c in group) for group in self.any_of)

    def sort_key(self) -> tuple[str, bool] | None:
        """(column, descending) of ``sort_by``, or None."""
        if not self.sort_by:
            return None
        return (self.sort_by[1:], True) if self.sort_by.startswith("-") else (self.sort_by, False)


def _conditions(view: str, match: Any) -> tuple[Condition, ...]:
    if match is None:
        return ()
    if not isinstance(match, Mapping):
        raise ViewError(f"view {view!r}: match must be a mapping of column -> condition, got {type(match).__name__}")
    out: list[Condition] = []
    for column, condition in match.items():
        column = str(column)
        if column not in COLUMN_NAMES and column not in DERIVED_COLUMNS and not column.startswith(CORRECT_PREFIX):
            raise ViewError(f"view {view!r}: unknown column {column!r} (columns of samples.parquet, "
                            f"{', '.join(DERIVED_COLUMNS)}, or {CORRECT_PREFIX}{{run}})")
        if isinstance(condition, Mapping):
            if not condition:
                raise ViewError(f"view {view!r}: empty condition for {column!r}")
            for op, value in condition.items():
                if op not in OPERATORS:
                    raise ViewError(f"view {view!r}: unknown operator {op!r} for {column!r} ({', '.join(OPERATORS)})")
                if op in ("in", "nin") and isinstance(value, Mapping):
                    value = _named_list(view, column, op, value)
                if op in ("in", "nin") and not isinstance(value, (list, tuple)):
                    raise ViewError(f"view {view!r}: {op} of {column!r} needs a list")
                if op == "has" and column != "tags":
                    raise ViewError(f"view {view!r}: has works on the list column tags, not {column!r}")
                out.append(Condition(column, op, tuple(value) if op in ("in", "nin") else value))
        elif isinstance(condition, (list, tuple)):
            out.append(Condition(column, "in", tuple(condition)))
        else:
            out.append(Condition(column, "eq", condition))
    return tuple(out)


def _named_list(view: str, column: str, op: str, value: Mapping[str, Any]) -> tuple[str, ...]:
    """The list a named ``in`` / ``nin`` value stands for (``{mask_statuses: <source>}``)."""
    source = value.get("mask_statuses") if list(value) == ["mask_statuses"] else None
    if source not in MASK_STATUSES:
        raise ViewError(f"view {view!r}: {op} of {column!r} is a list or {{mask_statuses: SOURCE}} with SOURCE one "
                        f"of {', '.join(MASK_STATUSES)}, got {dict(value)!r}")
    return MASK_STATUSES[source]


def _sortable(column: str) -> bool:
    """A column of samples.parquet, a derived column, or ``audit:<check>`` with a check ``curate audit`` runs."""
    if column in COLUMN_NAMES or column in DERIVED_COLUMNS:
        return True
    if column.startswith(AUDIT_PREFIX):
        from curate.audit.base import CHECKS

        return column[len(AUDIT_PREFIX):] in CHECKS
    return False


def load_views(path: str | Path | None = None) -> list[ViewSpec]:
    """The view definitions of ``views.yaml`` (default ``annotation/views.yaml``), checked."""
    path = Path(path) if path is not None else annotation_file(VIEWS_FILE)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ViewError(f"{path} cannot be read: {exc}") from None
    items = data.get("views") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ViewError(f"{path}: expected a non-empty list under 'views'")
    views: list[ViewSpec] = []
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, dict) or not item.get("name"):
            raise ViewError(f"{path}: every view needs a name, got {item!r}")
        name = str(item["name"])
        if name in seen:
            raise ViewError(f"{path}: view {name!r} is defined twice")
        seen.add(name)
        unknown = set(item) - {"name", "description", "match", "match_any", "sort_by", "per_run", "review"}
        if unknown:
            raise ViewError(f"{path}: view {name!r} has unknown keys {sorted(unknown)}")
        per_run = bool(item.get("per_run", False))
        if per_run and "{run}" not in name:
            raise ViewError(f"{path}: per-run view {name!r} needs '{{run}}' in its name")
        sort_by = item.get("sort_by")
        if sort_by is not None and not _sortable(str(sort_by).lstrip("-")):
            raise ViewError(f"{path}: view {name!r} sorts by unknown column {sort_by!r} (columns of samples.parquet, "
                            f"{', '.join(DERIVED_COLUMNS)}, or {AUDIT_PREFIX}<check>)")
        match_any = item.get("match_any") or []
        if not isinstance(match_any, list):
            raise ViewError(f"{path}: view {name!r}: match_any must be a list of match mappings")
        views.append(ViewSpec(name=name, description=str(item.get("description") or "").strip(),
                              conditions=_conditions(name, item.get("match")), sort_by=sort_by, per_run=per_run,
                              any_of=tuple(_conditions(name, group) for group in match_any),
                              review=bool(item.get("review", False)), raw_match=dict(item.get("match") or {})))
    return views


def expand_views(views: Sequence[ViewSpec], runs: Sequence[str]) -> list[ViewSpec]:
    """Every view of a dataset: plain views once, per-run views once per run (none without runs)."""
    out: list[ViewSpec] = []
    for view in views:
        if view.per_run:
            out.extend(view.for_run(run) for run in runs)
        else:
            out.append(view)
    return out


def find_view(views: Sequence[ViewSpec], name: str) -> ViewSpec:
    """The view called ``name`` (case-insensitive), with a clear error listing the names."""
    for view in views:
        if view.name.lower() == name.lower():
            return view
    raise ViewError(f"no view {name!r}; views: {', '.join(v.name for v in views)}")
