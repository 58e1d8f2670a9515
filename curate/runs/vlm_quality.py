"""The vlm-quality run: Visual Fidelity and Contrastiveness of a vlm-explain run's explanations (``curate vlm-quality``).

Written by :func:`curate.stages.vlm_quality.vlm_quality` (papers/001 §2-3; definitions in
``docs/design.md#explanation-quality``). Files (``runs/<name>/``):

- ``config.json``: ``dataset``, ``source_run`` (the vlm-explain run), ``explainer`` (its model id),
  ``judges`` (per role: ``spec``, ``model_id``; the verifier's ``mode``), ``prompts``
  (:class:`curate.vlm_quality.prompts.JudgePrompts`), ``settings``;
- ``scores.parquet`` (:func:`scores_schema`): one row per sample with every intermediate:
  the verification ``questions``, the verifier's ``replies``, ``verdicts`` (yes / no / null =
  unparsed), ``p_yes`` (likelihood verifier), ``qgen_output``; the ``masked_explanation``,
  ``mask_log`` (JSON: option, count, spans), ``hypotheses``, ``entailment`` (per option, in
  ``options`` order); the scores ``vf``, ``contr``, ``avg``, ``prod``, ``min`` with
  ``vf_reason`` / ``contr_reason`` when NaN; the background mentions;
- ``summary.json``: ``scores`` (per score: ``by_group`` easy / hard / all and ``by_correct``,
  each ``{mean, n, n_nan}``; ``nan_reasons``), ``discriminability`` (per score, see
  :class:`curate.vlm_quality.calibration.Discriminability`), ``ece`` (per score, with bins),
  ``bins``, ``background`` (share of explanations naming the sample's own background, the
  class's hard background, any background; by group x correct / wrong), ``masking`` (explanations
  that named no option), ``verifier`` (questions, unparsed answers), ``accuracy``, ``cache``,
  ``timing``;
- ``reliability.png``: the reliability diagram of every score.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from curate.jsonio import write_json
from curate.runs.base import (
    RunError,
    RunRecord,
    read_parquet,
    read_result_json,
    write_bytes,
    write_parquet,
)
from curate.runs.registry import register_run_kind

__all__ = ["VlmQualityRun", "scores_schema", "SCORES"]

#: The scores, in table order (papers/001 §2.1-2.3).
SCORES = ("vf", "contr", "avg", "prod", "min")
SCORE_LABELS = {"vf": "Visual Fidelity", "contr": "Contrastiveness", "avg": "avg(VF, Contr)",
                "prod": "prod(VF, Contr)", "min": "min(VF, Contr)"}


def scores_schema():
    import pyarrow as pa

    strings = pa.list_(pa.string())
    floats = pa.list_(pa.float64())
    return pa.schema([
        ("sample_id", pa.string()), ("class_index", pa.int32()), ("group", pa.string()), ("background", pa.string()),
        ("predicted_name", pa.string()), ("correct", pa.bool_()), ("explanation", pa.string()),
        ("vf", pa.float64()), ("vf_reason", pa.string()), ("questions", strings), ("replies", strings),
        ("verdicts", strings), ("p_yes", floats), ("qgen_output", pa.string()),
        ("n_questions", pa.int32()), ("n_yes", pa.int32()), ("n_no", pa.int32()), ("n_unparsed", pa.int32()),
        ("contr", pa.float64()), ("contr_reason", pa.string()), ("masked_explanation", pa.string()),
        ("mask_log", pa.string()), ("n_masked", pa.int32()), ("options", strings), ("hypotheses", strings),
        ("entailment", floats),
        ("avg", pa.float64()), ("prod", pa.float64()), ("min", pa.float64()),
        ("hard_background", pa.string()), ("mentions_own_background", pa.bool_()),
        ("mentions_hard_background", pa.bool_()), ("mentioned_backgrounds", strings),
    ])


@register_run_kind
@dataclass
class VlmQualityRun(RunRecord):
    """Config and results of one vlm-quality run (see the module docstring)."""

    KIND: ClassVar[str] = "vlm-quality"
    VERSION: ClassVar[int] = 1
    SCORES_FILE: ClassVar[str] = "scores.parquet"
    SUMMARY: ClassVar[str] = "summary.json"
    PLOT: ClassVar[str] = "reliability.png"

    config: dict[str, Any]
    summary: dict[str, Any]
    table: Any = field(default=None, repr=False)
    plot: bytes | None = field(default=None, repr=False)
    run_dir: Path | None = None

    def config_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.config.items() if k not in ("kind", "record_version", "curate_version")}

    def _write_results(self, run_dir: Path) -> None:
        if self.table is None:
            raise RunError("a vlm-quality run needs its scores table to be written")
        write_parquet(run_dir / self.SCORES_FILE, self.table.cast(scores_schema()))
        if self.plot is not None:
            write_bytes(run_dir / self.PLOT, self.plot)
        write_json(run_dir / self.SUMMARY, self.summary)

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> VlmQualityRun:
        summary = read_result_json(run_dir, cls.SUMMARY)
        record = cls(config=config, summary=summary, run_dir=run_dir)
        _ = [record.group_means(s) for s in SCORES], record.discriminability, record.ece
        return record

    # -- what was asked
    @property
    def source_run(self) -> str:
        return str(self.config.get("source_run") or "")

    @property
    def explainer(self) -> str:
        return str(self.config.get("explainer") or "")

    @property
    def judges(self) -> dict[str, dict[str, Any]]:
        return dict(self.config.get("judges") or {})

    # -- results
    @property
    def n(self) -> int:
        return int(self.summary.get("n") or 0)

    @property
    def accuracy(self) -> float:
        value = self.summary.get("accuracy")
        return float("nan") if value is None else float(value)

    def group_means(self, score: str) -> dict[str, dict[str, float]]:
        """``{part: {"mean", "n", "n_nan"}}`` for easy / hard / all and correct / wrong."""
        entry = self.summary["scores"][score]
        out = {}
        for part, value in {**entry.get("by_group", {}), **entry.get("by_correct", {})}.items():
            out[part] = {"mean": _f(value.get("mean")), "n": int(value.get("n") or 0),
                         "n_nan": int(value.get("n_nan") or 0)}
        return out

    def nan_reasons(self, score: str) -> dict[str, int]:
        return {str(k): int(v) for k, v in (self.summary["scores"][score].get("nan_reasons") or {}).items()}

    @property
    def discriminability(self) -> dict[str, dict[str, Any]]:
        """Per score: ``disc, mean_correct, mean_wrong, n_correct, n_wrong, n_nan, t, p, test, nan_reason``."""
        return {k: {kk: _f(vv) if kk in ("disc", "mean_correct", "mean_wrong", "t", "p") else vv
                    for kk, vv in v.items()} for k, v in (self.summary.get("discriminability") or {}).items()}

    @property
    def ece(self) -> dict[str, dict[str, Any]]:
        """Per score: ``ece``, ``edges``, ``counts``, ``confidence``, ``accuracy``, ``n``, ``n_nan``."""
        return {k: {**v, "ece": _f(v.get("ece"))} for k, v in (self.summary.get("ece") or {}).items()}

    @property
    def bins(self) -> int:
        return int(self.summary.get("bins") or 10)

    @property
    def background(self) -> dict[str, Any]:
        """The background-mention table (``rows``: part, n, own, hard, any; shares in [0, 1])."""
        return dict(self.summary.get("background") or {})

    @property
    def plot_path(self) -> Path | None:
        if self.run_dir is None or not (self.run_dir / self.PLOT).is_file():
            return None
        return self.run_dir / self.PLOT

    def scores(self, columns: Sequence[str] | None = None):
        """The per-sample table (pyarrow) with every intermediate."""
        if self.table is None:
            if self.run_dir is None:
                raise RunError("this vlm-quality run has no folder to read from")
            self.table = read_parquet(self.run_dir / self.SCORES_FILE)
        return self.table.select(list(columns)) if columns else self.table


def _f(x: Any) -> float:
    return float("nan") if x is None else float(x)
