"""The discovery run: background groups nobody listed, their names and the people's decisions (``curate discover``).

Written by :func:`curate.stages.discover.discover` into ``runs/<name>/``; every reader (the CLI's
tables, the review push, ``accept``) goes through this class, never through the files by key.

Files:

- ``config.json``: ``model`` (what was passed and what it is), ``settings`` (the whole
  :class:`curate.stages.discover.DiscoverSettings`), ``references`` (the evaluation runs whose
  correctness scored the groups), ``phrases`` (the bank's source, sha256 and size), ``counts``
  (photos, classes, groups proposed and significant, classes without groups by reason, photos
  left out by reason), ``classes`` (per class: photos, background method, K on each half,
  silhouettes, unstable groups, unassigned photos, reason);
- ``groups.parquet`` (:data:`GROUP_COLUMNS`): one row per group found on both halves, with its
  held-out accuracy and interval, the rest of the class's accuracy, the gap in points with its
  interval, the permutation p-value, the Benjamini-Hochberg q-value over all groups of the run,
  ``significant`` (q < fdr), the top names (JSON list of [phrase, score]) and the exemplars (JSON
  list of sample ids nearest the centroid), ``labelled_as`` / ``labelled_share`` (the vocabulary
  label most of its photos already carry and their share: a group with a share of 0.5 or more
  is a background the vocabulary has; below, one nobody listed);
- ``members.parquet`` (:data:`MEMBER_COLUMNS`): every grouped photo with its held-out group
  (null when its group was unstable) and its cosine to that group's centroid;
- ``decisions.json`` (optional, the only file written after the run): what people decided per
  group (``accepted`` with the background name it became, ``rejected``), who and when.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any, ClassVar

from curate.jsonio import read_json
from curate.runs.base import RunError, RunRecord, read_parquet, write_json, write_parquet
from curate.runs.registry import register_run_kind
from curate.shell import suggest

__all__ = ["DiscoveryRun", "DiscoveredGroup", "UnknownGroupError", "GROUP_COLUMNS", "MEMBER_COLUMNS", "DECISIONS"]

GROUP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("group_id", "string"), ("class_index", "int32"), ("class_name", "string"), ("method", "string"),
    ("size", "int32"), ("accuracy", "float64"), ("accuracy_low", "float64"), ("accuracy_high", "float64"),
    ("rest_accuracy", "float64"), ("gap", "float64"), ("gap_low", "float64"), ("gap_high", "float64"),
    ("p_value", "float64"), ("q_value", "float64"), ("significant", "bool"), ("overlap", "float64"),
    ("names", "string"), ("exemplars", "string"), ("labelled_as", "string"), ("labelled_share", "float64"),
)
MEMBER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("sample_id", "string"), ("class_index", "int32"), ("group_id", "string"), ("similarity", "float64"),
)
#: What a person may decide about a group.
DECISIONS = ("accepted", "rejected")


def _table(columns: tuple[tuple[str, str], ...], rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "int32": pa.int32(), "float64": pa.float64(), "bool": pa.bool_()}
    schema = pa.schema([(name, types[kind]) for name, kind in columns])
    return pa.table({name: pa.array([r.get(name) for r in rows], schema.field(name).type) for name in schema.names},
                    schema=schema)


class UnknownGroupError(KeyError):
    """A group id the run does not have; its message names the command that lists the run's groups
    (a :class:`KeyError` that prints as a sentence, not as a quoted key)."""

    def __init__(self, run: DiscoveryRun, group_id: str) -> None:
        root = run.run_dir.parent.parent if run.run_dir is not None else "DIR"
        close = get_close_matches(group_id, [g.group_id for g in run.groups], n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        listing = suggest("curate groups {dir} --run {run} --all", dir=root, run=run.name)
        super().__init__(f"run {run.name} has no group {group_id!r}; {hint}its {len(run.groups)} groups are listed by "
                         f"`{listing}`")

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class DiscoveredGroup:
    """One row of ``groups.parquet``, typed."""

    group_id: str
    class_index: int
    class_name: str
    method: str
    size: int
    accuracy: float
    accuracy_low: float
    accuracy_high: float
    rest_accuracy: float
    gap: float
    gap_low: float
    gap_high: float
    p_value: float
    q_value: float
    significant: bool
    overlap: float
    names: list[tuple[str, float]] = field(default_factory=list)
    exemplars: list[str] = field(default_factory=list)
    labelled_as: str | None = None  # the vocabulary label most of its photos already carry, if any
    labelled_share: float = 0.0  # share of its photos carrying that label (0: none is labelled)

    @property
    def is_new(self) -> bool:
        """Mostly unlabelled (under half its photos carry one vocabulary label): a background nobody listed."""
        return self.labelled_share < 0.5

    @property
    def top_name(self) -> str:
        return self.names[0][0] if self.names else ""

    def to_row(self) -> dict[str, Any]:
        row = {name: getattr(self, name) for name, _ in GROUP_COLUMNS}
        row["names"] = json.dumps([[p, round(float(s), 6)] for p, s in self.names])
        row["exemplars"] = json.dumps(list(self.exemplars))
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> DiscoveredGroup:
        values = dict(row)
        values["names"] = [(str(p), float(s)) for p, s in json.loads(values.get("names") or "[]")]
        values["exemplars"] = [str(s) for s in json.loads(values.get("exemplars") or "[]")]
        return cls(**values)


@register_run_kind
@dataclass
class DiscoveryRun(RunRecord):
    """Config, groups and members of one ``curate discover`` (module docstring)."""

    KIND: ClassVar[str] = "discover"
    VERSION: ClassVar[int] = 1
    GROUPS: ClassVar[str] = "groups.parquet"
    MEMBERS: ClassVar[str] = "members.parquet"
    DECISIONS_FILE: ClassVar[str] = "decisions.json"

    config: dict[str, Any]
    groups: list[DiscoveredGroup] = field(default_factory=list)
    member_rows: list[dict[str, Any]] | None = field(default=None, repr=False)
    run_dir: Path | None = None

    def config_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.config.items() if k not in ("kind", "record_version", "curate_version")}

    def _write_results(self, run_dir: Path) -> None:
        write_parquet(run_dir / self.GROUPS, _table(GROUP_COLUMNS, [g.to_row() for g in self.groups]))
        write_parquet(run_dir / self.MEMBERS, _table(MEMBER_COLUMNS, list(self.member_rows or [])))

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> DiscoveryRun:
        for key in ("settings", "counts", "classes"):
            if key not in config:
                raise RunError(f"run {run_dir.name} (discover) has no {key!r} in its config.json")
        groups = [DiscoveredGroup.from_row(r) for r in read_parquet(run_dir / cls.GROUPS).to_pylist()]
        return cls(config=config, groups=groups, run_dir=run_dir)

    @classmethod
    def of_folder(cls, root: Path | str, name: str | None = None) -> DiscoveryRun:
        """The discovery run ``name`` of the folder ``root``, else its latest one that grouped
        photos: a run whose every photo was left out (no trusted mask, no prediction) did nothing
        and does not hide the last real one (docs/design.md#run-folders); the latest run when none did."""
        from curate.runs.base import list_runs, read_config
        from curate.runs.lookup import named_run

        if name is not None:
            return named_run(root, name, cls)  # a missing run is said so, with the runs there
        found = list_runs(Path(root), cls.KIND)
        if not found:
            discover = suggest("curate discover {dir} --model ...", dir=root)
            raise RunError(f"{root} has no finished discovery run: run `{discover}` first")
        for path in reversed(found):
            try:
                grouped = (read_config(path).get("counts") or {}).get("grouped", 1)
            except RunError:  # load it: its error names what is wrong
                grouped = 1
            if grouped != 0:
                return cls.load(path)
        return cls.load(found[-1])

    # -- typed views
    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.config.get("settings") or {})

    @property
    def counts(self) -> dict[str, Any]:
        return dict(self.config.get("counts") or {})

    @property
    def classes(self) -> list[dict[str, Any]]:
        return [dict(c) for c in self.config.get("classes") or []]

    @property
    def phrases(self) -> dict[str, Any]:
        return dict(self.config.get("phrases") or {})

    @property
    def fdr(self) -> float:
        return float(self.settings.get("fdr", 0.1))

    @property
    def proposed(self) -> list[DiscoveredGroup]:
        """The significant groups (q < fdr): what people are asked to judge."""
        return [g for g in self.groups if g.significant]

    def group(self, group_id: str) -> DiscoveredGroup:
        for g in self.groups:
            if g.group_id == group_id:
                return g
        raise UnknownGroupError(self, group_id)

    def members(self) -> list[dict[str, Any]]:
        """``members.parquet`` as rows (read on first use)."""
        if self.member_rows is None:
            if self.run_dir is None:
                raise RunError("this discovery run has no members and no folder to read them from")
            self.member_rows = read_parquet(self.run_dir / self.MEMBERS).to_pylist()
        return self.member_rows

    def member_ids(self, group_id: str) -> list[str]:
        """The photos of a group (held-out assignments), most typical first."""
        rows = [r for r in self.members() if r["group_id"] == group_id]
        return [r["sample_id"] for r in sorted(rows, key=lambda r: (-(r["similarity"] or 0.0), r["sample_id"]))]

    # -- people's decisions (the one file written after the run)
    def decisions(self) -> dict[str, dict[str, Any]]:
        """group id -> {"decision": accepted | rejected, "background": name (accepted), "actor", "at"}."""
        if self.run_dir is None or not (self.run_dir / self.DECISIONS_FILE).is_file():
            return {}
        data = read_json(self.run_dir / self.DECISIONS_FILE)
        if not isinstance(data, dict):
            raise RunError(f"{self.run_dir / self.DECISIONS_FILE} does not hold a JSON object")
        return {str(k): dict(v) for k, v in data.items()}

    def record_decisions(self, decisions: dict[str, dict[str, Any]]) -> None:
        """Merge ``decisions`` into ``decisions.json`` (atomic replace)."""
        if self.run_dir is None:
            raise RunError("write the run before recording decisions on it")
        for group_id, decision in decisions.items():
            self.group(group_id)
            if decision.get("decision") not in DECISIONS:
                raise ValueError(f"decision for {group_id} must be one of {DECISIONS}, got {decision.get('decision')!r}")
        write_json(self.run_dir / self.DECISIONS_FILE, {**self.decisions(), **decisions})
