"""The audit run: every sample ranked by each curation check (``curate audit``; docs/design.md#audit).

Files (``runs/<name>/``):

- ``config.json``: ``model`` (name, pretrained, model_id; null when only pixel checks ran),
  ``settings`` (the whole :class:`curate.stages.audit.AuditSettings`), ``dataset`` (name,
  samples audited, images encoded by this run), ``checks`` (the checks run, in order);
- ``scores.parquet``: per sample ``sample_id``, ``class_index``, and for each check ``<check>_score``
  (float64, higher = more suspect, null = not scored), ``<check>_rank`` (1 = first to look at,
  -1 = not scored), ``<check>_flagged`` (the library's own verdict), ``<check>_tagged`` (pre-tagged
  ``suspect:<check>``), plus check-specific columns ``<check>.<name>`` (e.g. ``clarity.object_share``);
- ``audit.json``: per check ``method``, ``notes``, ``scored``, ``failed`` (count and reasons),
  ``flagged``, ``tagged``, ``detail`` (duplicate groups, CleanVision counts, ...; clarity's
  ``sources`` and ``masks``: the masks its shares used by source, human / exact / model, and the
  ones left out, :meth:`curate.masks.sources.MaskCounts.as_dict`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from curate.jsonio import write_json
from curate.runs.base import RunError, RunRecord, read_parquet, read_result_json, write_parquet
from curate.runs.registry import register_run_kind
from curate.store.mask_sources import MaskCounts

__all__ = ["AuditRun", "CheckSummary"]


@dataclass(frozen=True)
class CheckSummary:
    """What one check of an audit did (see ``audit.json``)."""

    name: str
    method: str
    notes: tuple[str, ...]
    scored: int
    failed: int
    failed_reasons: dict[str, int]
    flagged: int
    tagged: int
    detail: dict[str, Any]


@register_run_kind
@dataclass
class AuditRun(RunRecord):
    """Config and results of one audit (see the module docstring)."""

    KIND: ClassVar[str] = "audit"
    VERSION: ClassVar[int] = 1
    SCORES: ClassVar[str] = "scores.parquet"
    RESULTS: ClassVar[str] = "audit.json"

    model: dict[str, Any] | None
    settings: dict[str, Any]
    dataset: dict[str, Any]
    checks: list[str]
    results: dict[str, Any]
    scores_table: Any = field(default=None, repr=False)  # pyarrow Table; read on demand after load
    run_dir: Path | None = None

    def config_dict(self) -> dict[str, Any]:
        return {"model": self.model, "settings": self.settings, "dataset": self.dataset, "checks": list(self.checks)}

    def _write_results(self, run_dir: Path) -> None:
        if self.scores_table is None:
            raise RunError("an audit run needs its scores table to be written")
        write_parquet(run_dir / self.SCORES, self.scores_table)
        write_json(run_dir / self.RESULTS, self.results)

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> AuditRun:
        results = read_result_json(run_dir, cls.RESULTS)
        return cls(model=config.get("model"), settings=dict(config.get("settings") or {}),
                   dataset=dict(config.get("dataset") or {}), checks=list(config["checks"]), results=results,
                   run_dir=run_dir)

    # -- typed views
    def table(self):
        """The scores table (read from the run folder on first use)."""
        if self.scores_table is None:
            if self.run_dir is None:
                raise RunError("this audit run has no scores and no folder to read them from")
            self.scores_table = read_parquet(self.run_dir / self.SCORES)
        return self.scores_table

    @property
    def sample_ids(self) -> list[str]:
        return [str(s) for s in self.table().column("sample_id").to_pylist()]

    def _require(self, check: str) -> None:
        if check not in self.checks:
            raise RunError(f"audit run {self.name} did not run the {check!r} check (it ran: {', '.join(self.checks)})")

    def scores(self, check: str) -> np.ndarray:
        """Scores of ``check`` in :attr:`sample_ids` order (NaN = not scored)."""
        self._require(check)
        values = self.table().column(f"{check}_score").to_pylist()
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)

    def ranks(self, check: str) -> np.ndarray:
        self._require(check)
        return np.asarray(self.table().column(f"{check}_rank").to_pylist(), dtype=np.int64)

    def tagged(self, check: str) -> set[str]:
        """Sample ids this run pre-tagged ``suspect:<check>``."""
        self._require(check)
        flags = self.table().column(f"{check}_tagged").to_pylist()
        return {sid for sid, flag in zip(self.sample_ids, flags) if flag}

    def column(self, check: str, name: str) -> np.ndarray:
        """A check-specific column (e.g. ``column("clarity", "object_share")``)."""
        self._require(check)
        key = f"{check}.{name}"
        if key not in self.table().column_names:
            raise RunError(f"audit run {self.name} has no column {key!r}")
        return np.array([np.nan if v is None else v for v in self.table().column(key).to_pylist()], dtype=np.float64)

    def summary(self, check: str) -> CheckSummary:
        self._require(check)
        data = (self.results.get("checks") or {}).get(check) or {}
        failed = data.get("failed") or {}
        return CheckSummary(check, str(data.get("method") or ""), tuple(data.get("notes") or ()),
                            int(data.get("scored") or 0), int(failed.get("count") or 0),
                            dict(failed.get("reasons") or {}), int(data.get("flagged") or 0),
                            int(data.get("tagged") or 0), dict(data.get("detail") or {}))

    @property
    def duplicate_groups(self) -> list[dict[str, Any]]:
        """The duplicate groups (``sample_ids``, ``classes``, ``across_classes``); empty when not run."""
        if "duplicates" not in self.checks:
            return []
        return list(self.summary("duplicates").detail.get("groups") or [])

    @property
    def clarity_masks(self) -> MaskCounts | None:
        """The masks the clarity check used by source and the ones it left out; None when clarity
        did not run (or the run predates the counts)."""
        if "clarity" not in self.checks:
            return None
        data = self.summary("clarity").detail.get("masks")
        return MaskCounts.from_dict(data) if isinstance(data, dict) else None

    @property
    def excluded(self) -> dict[str, Any]:
        """Samples no feature-based check could score (failed to decode or encode), with reasons."""
        return dict(self.results.get("excluded") or {"count": 0, "reasons": {}})

    @property
    def model_label(self) -> str:
        if not self.model:
            return "(no model)"
        from curate.models.spec import ModelSpec

        return ModelSpec(self.model["name"], self.model.get("pretrained")).label


def failure_summary(failed: dict[str, str]) -> dict[str, Any]:
    """``{"count", "reasons": {kind: n}, "samples": [...]}`` of ``{sample id: reason}``."""
    return {"count": len(failed), "reasons": dict(Counter(r.split(":")[0] for r in failed.values())),
            "samples": [{"sample_id": s, "reason": r} for s, r in sorted(failed.items())[:200]]}
