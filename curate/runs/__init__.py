"""Run folders as typed, versioned records: ``DIR/runs/<name>/``.

One record class per run kind (:class:`EvaluationRun`, :class:`ExplainRun`,
:class:`FidelityRun`, :class:`SplitRun`, ...), each with ``write(run_dir)``,
``load(run_dir)``, a ``VERSION`` and its file names as constants (see :mod:`curate.runs.base`).

>>> from curate.runs import EvaluationRun, list_runs
>>> for path in list_runs("world/", kind="evaluate"):
...     run = EvaluationRun.load(path); print(run.model_label, run.group("hard").acc1)
"""
from __future__ import annotations

from curate.runs.audit import AuditRun, CheckSummary
from curate.runs.base import (
    CONFIG_FILE,
    RUNS_DIR,
    RunError,
    RunRecord,
    create_run,
    iter_runs,
    list_runs,
    load_run,
    prepare_run_dir,
    read_config,
    read_parquet,
    record_class,
    register_run_kind,
    run_kinds,
    run_name,
    slug,
    unique_run_name,
    write_bytes,
    write_json,
    write_parquet,
)
from curate.runs.evaluation import DropStats, EvaluationRun, GroupStats
from curate.runs.explain import ExplainRun
from curate.runs.fidelity import FidelityRow, FidelityRun
from curate.runs.split import LabelSources, ReferenceDrop, SplitCell, SplitClass, SplitReference, SplitRun
from curate.runs.vlm_explain import VlmExplainRun
from curate.runs.vlm_quality import VlmQualityRun

__all__ = [
    "CONFIG_FILE", "RUNS_DIR", "RunError", "RunRecord", "create_run", "iter_runs", "list_runs", "load_run",
    "prepare_run_dir", "read_config", "read_parquet", "record_class", "register_run_kind", "run_kinds", "run_name",
    "slug", "unique_run_name", "write_bytes", "write_json", "write_parquet",
    "AuditRun", "CheckSummary",
    "EvaluationRun", "GroupStats", "DropStats",
    "ExplainRun", "FidelityRun", "FidelityRow", "SplitRun", "SplitClass", "SplitCell", "SplitReference", "LabelSources", "ReferenceDrop",
    "VlmExplainRun", "VlmQualityRun",
]
