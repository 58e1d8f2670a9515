"""Run folders as typed, versioned records: ``DIR/runs/<name>/``.

One record class per run kind (:class:`EvaluationRun`, :class:`ExplainRun`,
:class:`FidelityRun`, :class:`SplitRun`, ...), each with ``write(run_dir)``,
``load(run_dir)``, a ``VERSION`` and its file names as constants (see :mod:`curate.runs.base`).

>>> from curate.runs import EvaluationRun, list_runs
>>> for path in list_runs("world/", kind="evaluate"):
...     run = EvaluationRun.load(path); print(run.model_label, run.group("hard").acc1)
"""
from __future__ import annotations

from curate.lazy import lazy_exports

# Lazy (PEP 562): a stage that needs one record class does not import the others, which keeps
# `curate evaluate` short; load_run imports the one kind it reads, run_kinds() every kind (curate.runs.registry).
__getattr__, __dir__ = lazy_exports(__name__, {
    "CONFIG_FILE": "curate.runs.base",
    "RUNS_DIR": "curate.runs.base",
    "RunError": "curate.runs.base",
    "RunRecord": "curate.runs.base",
    "check_run_name": "curate.runs.base",
    "create_run": "curate.runs.base",
    "discard_if_empty": "curate.runs.base",
    "iter_runs": "curate.runs.base",
    "list_runs": "curate.runs.base",
    "load_run": "curate.runs.base",
    "prepare_run_dir": "curate.runs.base",
    "read_config": "curate.runs.base",
    "read_parquet": "curate.runs.base",
    "record_class": "curate.runs.base",
    "register_run_kind": "curate.runs.registry",
    "run_kinds": "curate.runs.registry",
    "run_name": "curate.runs.base",
    "slug": "curate.runs.base",
    "unique_run_name": "curate.runs.base",
    "write_bytes": "curate.runs.base",
    "write_json": "curate.runs.base",
    "write_parquet": "curate.runs.base",
    "AnnotatorSpreadRun": "curate.runs.annotator_spread",
    "AttributionRun": "curate.runs.attribution",
    "ModelAttribution": "curate.runs.attribution",
    "InterventionRun": "curate.runs.interventions",
    "AuditRun": "curate.runs.audit",
    "CheckSummary": "curate.runs.audit",
    "EvaluationRun": "curate.runs.evaluation",
    "GroupStats": "curate.runs.evaluation",
    "DropStats": "curate.runs.evaluation",
    "ExplainRun": "curate.runs.explain",
    "FidelityRun": "curate.runs.fidelity",
    "FidelityRow": "curate.runs.fidelity",
    "MaskRun": "curate.runs.masks",
    "SplitRun": "curate.runs.split",
    "SplitClass": "curate.runs.split",
    "SplitCell": "curate.runs.split",
    "SplitReference": "curate.runs.split",
    "LabelSources": "curate.runs.split",
    "ReferenceDrop": "curate.runs.split",
    "VlmExplainRun": "curate.runs.vlm_explain",
    "VlmQualityRun": "curate.runs.vlm_quality",
})

__all__ = [
    "CONFIG_FILE", "RUNS_DIR", "RunError", "RunRecord", "check_run_name", "create_run", "discard_if_empty",
    "iter_runs", "list_runs", "load_run", "prepare_run_dir", "read_config", "read_parquet", "record_class", "register_run_kind", "run_kinds", "run_name",
    "slug", "unique_run_name", "write_bytes", "write_json", "write_parquet",
    "AttributionRun", "ModelAttribution", "InterventionRun",
    "AuditRun", "CheckSummary",
    "EvaluationRun", "GroupStats", "DropStats",
    "ExplainRun", "FidelityRun", "FidelityRow", "MaskRun", "SplitRun", "SplitClass", "SplitCell", "SplitReference", "LabelSources", "ReferenceDrop",
    "VlmExplainRun", "VlmQualityRun",
]
