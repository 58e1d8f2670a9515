"""The vlm-explain run: a VLM's answer among the candidates and its explanation, per sample (``curate vlm-explain``).

Written by :func:`curate.stages.vlm_explain.vlm_explain` (papers/001 App. C: the answer first,
then "Please explain the reasoning behind your answer."). Files (``runs/<name>/``):

- ``config.json``: ``dataset``; ``model`` (``spec``, ``model_id``, ``backend``); ``label_space``
  (``name`` and how it was built); ``prompts`` (every prompt, :class:`curate.vlm_quality.prompts.ExplainPrompts`);
  ``settings`` (the fields of :class:`curate.stages.vlm_explain.VlmExplainSettings`);
- ``explanations.parquet`` (:func:`explanations_schema`): one row per sample: ``sample_id,
  class_index, class_name, group, background, candidates`` (names, in order) ``candidate_indices,
  answer_raw`` (the model's step-1 reply, or the losses' argmin for ``likelihood``), ``predicted_index,
  predicted_name`` (null when the reply names no candidate), ``correct, explanation, answer_reason``
  (``unparsed_answer`` when no candidate could be read from the reply);
- ``summary.json``: ``n``, ``accuracy`` (overall, and ``by_group``: fraction of samples whose
  answer is the true class; an unparsed answer counts as wrong), ``unparsed`` (count),
  ``skipped`` (samples that could not be read, by reason), ``cache`` (hits / misses),
  ``timing``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from curate.jsonio import write_json
from curate.runs.base import (
    ModelBlock,
    RunError,
    RunRecord,
    read_parquet,
    read_result_json,
    write_parquet,
)
from curate.runs.registry import register_run_kind

__all__ = ["VlmExplainRun", "explanations_schema", "ExplanationRow"]


def explanations_schema():
    import pyarrow as pa

    return pa.schema([
        ("sample_id", pa.string()), ("class_index", pa.int32()), ("class_name", pa.string()),
        ("group", pa.string()), ("background", pa.string()),
        ("candidates", pa.list_(pa.string())), ("candidate_indices", pa.list_(pa.int32())),
        ("answer_raw", pa.string()), ("predicted_index", pa.int32()), ("predicted_name", pa.string()),
        ("correct", pa.bool_()), ("explanation", pa.string()), ("answer_reason", pa.string()),
    ])


@dataclass(frozen=True)
class ExplanationRow:
    """One sample of a vlm-explain run."""

    sample_id: str
    class_index: int
    class_name: str
    group: str | None
    background: str | None
    candidates: list[str]
    candidate_indices: list[int]
    answer_raw: str
    predicted_index: int | None
    predicted_name: str | None
    correct: bool
    explanation: str
    answer_reason: str | None


@register_run_kind
@dataclass
class VlmExplainRun(ModelBlock, RunRecord):
    """Config and results of one vlm-explain run (see the module docstring)."""

    KIND: ClassVar[str] = "vlm-explain"
    VERSION: ClassVar[int] = 1
    EXPLANATIONS: ClassVar[str] = "explanations.parquet"
    SUMMARY: ClassVar[str] = "summary.json"

    config: dict[str, Any]
    summary: dict[str, Any]
    table: Any = field(default=None, repr=False)
    run_dir: Path | None = None

    def config_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.config.items() if k not in ("kind", "record_version", "curate_version")}

    def _write_results(self, run_dir: Path) -> None:
        if self.table is None:
            raise RunError("a vlm-explain run needs its explanations table to be written")
        write_parquet(run_dir / self.EXPLANATIONS, self.table.cast(explanations_schema()))
        write_json(run_dir / self.SUMMARY, self.summary)

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> VlmExplainRun:
        summary = read_result_json(run_dir, cls.SUMMARY)
        if not (run_dir / cls.EXPLANATIONS).is_file():
            raise RunError(f"run {run_dir.name} has no {cls.EXPLANATIONS} (unfinished?)")
        int(summary["n"])
        return cls(config=config, summary=summary, run_dir=run_dir)

    # -- what was asked
    @property
    def question(self) -> str:
        return str((self.config.get("prompts") or {}).get("question") or "")

    @property
    def prompts(self) -> dict[str, str]:
        return dict(self.config.get("prompts") or {})

    @property
    def label_space(self) -> str:
        return str((self.config.get("label_space") or {}).get("name") or "")

    # -- results
    @property
    def n(self) -> int:
        return int(self.summary.get("n") or 0)

    @property
    def accuracy(self) -> float:
        value = (self.summary.get("accuracy") or {}).get("overall")
        return float("nan") if value is None else float(value)

    @property
    def accuracy_by_group(self) -> dict[str, float]:
        return {k: float("nan") if v is None else float(v)
                for k, v in ((self.summary.get("accuracy") or {}).get("by_group") or {}).items()}

    @property
    def unparsed(self) -> int:
        return int(self.summary.get("unparsed") or 0)

    def explanations(self, columns: Sequence[str] | None = None):
        """The per-sample table (pyarrow)."""
        if self.table is None:
            if self.run_dir is None:
                raise RunError("this vlm-explain run has no folder to read from")
            self.table = read_parquet(self.run_dir / self.EXPLANATIONS)
        return self.table.select(list(columns)) if columns else self.table

    def rows(self) -> list[ExplanationRow]:
        """Every sample as an :class:`ExplanationRow`."""
        return [ExplanationRow(**r) for r in self.explanations().to_pylist()]
