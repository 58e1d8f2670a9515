"""The audit stage: rank every sample for the paper's curation problems (``curate audit``).

papers/003 §2.1 cleaned raw photos by hand for label noise, feature noise, obscurity and
clarity; ``audit(dataset, model, settings)`` ranks every sample with a class for each of them
(plus duplicates and outliers; one module per check in :mod:`curate.audit`), writes an
:class:`curate.runs.AuditRun` and pre-tags the top candidates ``suspect:<check>`` in the folder's
``tags`` column (never touching status). :func:`measure_audit` then says what the ranking is
worth: precision and recall at the top 5/10/20 % against the reviewers' ``reject:<reason>``
decisions, or, on the synthetic world, against the planted problems (docs/design.md#audit).

Masks (docs/design.md#masks): the clarity check reads object masks only where
:mod:`curate.masks.sources` trusts them: a model's unverified proposal (``curate propose-masks``)
only with ``allow_model_masks`` (``curate audit --allow-model-masks``), a mask reviewers marked
bad never; the run records how many of each source it used (``AuditRun.clarity_masks``). A folder
whose masks are all unverified proposals is refused while the clarity check runs without the flag.

Speed: the CLIP features come from :func:`curate.features.compute_features` (the cache that
``evaluate`` fills; an image it encoded is not encoded again), the text classifier from the
classifier cache; duplicate search is blockwise (:mod:`curate.audit.duplicates`).
"""
from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from curate.audit.base import (
    ANY_REJECT_CHECKS,
    CHECKS,
    NEEDS_FEATURES,
    PLANTED_TO_CHECK,
    REASON_TO_CHECK,
    AuditInputs,
    CheckResult,
    parse_checks,
)
from curate.audit.combine import ranks, retag, top_candidates
from curate.audit.measure import FRACTIONS, CheckMeasure, measure_check
from curate.masks.sources import trusted_rows, untrusted_masks_message
from curate.progress import Progress, phase
from curate.runs.audit import AuditRun, failure_summary
from curate.shell import suggest
from curate.stages.common import check_device, claim_run_dir, load_spec, model_identity, open_dataset, run_stage

logger = logging.getLogger(__name__)

__all__ = ["AuditSettings", "audit", "measure_audit", "latest_audit", "label_columns"]


@dataclass
class AuditSettings:
    """How to audit (the CLI's options map one to one; the whole object is recorded in the run)."""

    checks: tuple[str, ...] = CHECKS
    label_space: str = "present"  # present (the dataset's classes) | full (every label: 1 vs 1000) | a file
    prompts: str = "simple"
    tag_fraction: float = 0.05  # pre-tag the top 5% of each check
    tag: bool = True
    device: str = "auto"
    precision: str = "fp32"
    batch_size: int = 256
    workers: int | None = None
    use_cache: bool = True
    # duplicates
    block: int = 1024
    cos_threshold: float = 0.998
    hash_threshold: int = 4
    phash: bool = True
    # outliers
    outlier_k: int = 10
    # feature noise
    tile: int = 4
    block_threshold: float = 0.15
    n_jobs: int = 1
    # clarity
    saliency_proxy: bool = True
    saliency_batch: int = 32
    clarity_share: float = 0.1
    allow_model_masks: bool = False  # clarity: also use unverified model-made masks (curate propose-masks)

    def __post_init__(self) -> None:
        self.checks = parse_checks(self.checks)
        if not 0.0 <= self.tag_fraction <= 1.0:
            raise ValueError(f"--tag-fraction must be in [0, 1], got {self.tag_fraction}")


def _check_functions() -> dict[str, Callable[[AuditInputs, AuditSettings], CheckResult]]:
    from curate.audit.clarity import clarity_check
    from curate.audit.duplicates import duplicates_check
    from curate.audit.feature import feature_check
    from curate.audit.label import label_check
    from curate.audit.obscurity import obscurity_check
    from curate.audit.outliers import outliers_check

    return {"label": label_check, "duplicates": duplicates_check, "outliers": outliers_check,
            "feature": feature_check, "obscurity": obscurity_check, "clarity": clarity_check}


def label_columns(ds, spec: str, classes: Sequence[int]) -> np.ndarray:
    """The label-space indices the zero-shot probabilities are taken over.

    ``present``: the classes of the audited samples (the dataset's own label space as used);
    ``full`` / ``imagenet1k`` / ``dataset``: every label of the base space (1 vs 1000 on ImageNet-1K);
    a file: one label (index or name) per line, which must contain every audited class.
    """
    from curate.zeroshot.candidates import file_space

    present = np.array(sorted({int(c) for c in classes}), dtype=np.int64)
    if spec == "present":
        return present
    if spec in ("full", "imagenet1k", "dataset"):
        if spec == "imagenet1k" and not ds.label_space.is_builtin:
            raise ValueError(f"the dataset's label space is '{ds.label_space.name}', not ImageNet-1K; use --label-space full")
        return np.arange(len(ds.label_space), dtype=np.int64)
    columns = file_space(Path(spec), ds.label_space).shared
    missing = sorted(set(present.tolist()) - set(columns.tolist()))
    if missing:
        names = ", ".join(f"{c} ({ds.label_space.name_of(c)})" for c in missing[:10])
        raise ValueError(f"the label space {spec} does not contain the class name of audited samples: {names}; label "
                         "noise is measured against the label's own probability, so every class must be a column")
    return columns


def _inputs(ds, rows: list[dict], checks: Sequence[str], model: Any, settings: AuditSettings,
            progress: Progress | None) -> tuple[AuditInputs, dict[str, Any] | None, int]:
    ids = [r["sample_id"] for r in rows]
    classes = np.array([int(r["class_index"]) for r in rows], dtype=np.int64)
    inputs = AuditInputs(ids=ids, classes=classes, image_paths=[ds.image_path(r) for r in rows],
                         mask_paths=[ds.mask_path(r) for r in rows])
    if not NEEDS_FEATURES.intersection(checks):
        return inputs, None, 0
    if model is None:
        raise ValueError(f"the checks {sorted(NEEDS_FEATURES.intersection(checks))} read CLIP features: pass --model "
                         "(or run only --checks feature)")
    import torch

    from curate.features import FEATURES_DIR, compute_features
    from curate.zeroshot.classifier import classifier_for_labels, zero_shot_logits
    from curate.zeroshot.prompts import load_prompts

    columns = label_columns(ds, settings.label_space, classes)
    loaded = load_spec(model, device=settings.device, precision=settings.precision)
    model_info = model_identity(model, loaded)
    if loaded.kind != "clip":
        raise ValueError(f"the audit needs a CLIP (zero-shot probabilities and image embeddings); {loaded.model_id} "
                         f"is a {loaded.kind}")
    feats = compute_features(ds, loaded, ids, kind="embedding", batch_size=settings.batch_size, workers=settings.workers,
                             use_cache=settings.use_cache, progress=phase(progress, "encoding images"))
    position = feats.row_of()
    embeddings = np.full((len(ids), feats.values.shape[1] if feats.values.ndim == 2 else 0), np.nan, np.float32)
    for i, sid in enumerate(ids):
        if sid in position:
            embeddings[i] = feats.values[position[sid]]
    prompts = load_prompts(settings.prompts)
    classifier = classifier_for_labels(loaded, ds.label_space.names, columns.tolist(), prompts,
                                       ds.root / FEATURES_DIR / "text" if settings.use_cache else None)
    probs = np.full((len(ids), len(columns)), np.nan)
    ok = np.isfinite(embeddings).all(axis=1) if embeddings.shape[1] else np.zeros(len(ids), bool)
    if ok.any():
        logits = zero_shot_logits(torch.from_numpy(embeddings[ok]), classifier).double()
        probs[ok] = torch.softmax(logits, dim=1).numpy()
    col_of = {int(c): j for j, c in enumerate(columns)}
    inputs.embeddings, inputs.probs, inputs.label_columns = embeddings, probs, columns
    inputs.label_col = np.array([col_of[int(c)] for c in classes], dtype=np.int64)
    inputs.failed = dict(feats.failed)
    inputs.model, inputs.classifier = loaded, classifier
    return inputs, model_info, feats.computed


@run_stage("audit")
def audit(
    dataset: Any, model: Any = None, settings: AuditSettings | None = None, *, run_name: str | None = None,
    overwrite: bool = False, progress: Progress | None = None,
) -> AuditRun:
    """Run the audit checks on a dataset folder, write an :class:`AuditRun`, pre-tag suspects.

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        model: a CLIP (a :class:`curate.models.ModelSpec`, loaded model, name or weights file);
            may be None when only pixel checks (``feature``) run.
        settings: :class:`AuditSettings` (default: every check, the dataset's classes, top 5% tagged).
        run_name: the run folder (default ``audit-<model>-<UTC time>``); a finished one is refused
            before any work unless ``overwrite``, an unfinished one (killed) replaced
            (:func:`curate.stages.common.run_stage`).
        progress: phases "encoding images", "check <name>".
    """
    settings = settings or AuditSettings()
    check_device(settings.device)
    ds = open_dataset(dataset)
    rows = [r for r in ds.rows() if r["class_index"] is not None]
    if not rows:
        raise ValueError(f"{ds.root}: no sample has a class; nothing to audit")
    checks = settings.checks
    if "clarity" in checks:
        trusted, untrusted = trusted_rows(rows, allow_model_masks=settings.allow_model_masks)
        if not trusted and untrusted.skipped_model:
            if not settings.saliency_proxy:  # nothing left to score clarity with
                raise ValueError(untrusted_masks_message(ds.root, untrusted, "the clarity check")
                                 + " (or leave clarity out: --checks, or score it with the saliency proxy)")
            logger.warning("%s: every mask is an unverified model proposal; clarity falls back to its saliency "
                           "proxy (review the proposals, or --allow-model-masks)", ds.root)
    inputs, model_info, encoded = _inputs(ds, rows, checks, model, settings, progress)
    functions = _check_functions()
    functions["clarity"] = functools.partial(functions["clarity"], mask_rows=rows)  # the trust rule needs statuses
    results: dict[str, CheckResult] = {}
    for name in checks:
        report = phase(progress, f"check {name}")
        if report:
            report(0, 1)
        result = functions[name](inputs, settings)
        if name in NEEDS_FEATURES:
            for sid, reason in inputs.failed.items():
                result.failed.setdefault(sid, reason)
        results[name] = result
        if report:
            report(1, 1)
    import pyarrow as pa

    eligible = np.array([r["status"] != "rejected" for r in rows])
    columns: dict[str, Any] = {"sample_id": pa.array(inputs.ids, pa.string()),
                               "class_index": pa.array(inputs.classes, pa.int32())}
    summaries: dict[str, Any] = {}
    suspects: dict[str, set[str]] = {}
    for name, result in results.items():
        scores = result.scores
        tagged = np.zeros(len(rows), bool)
        if settings.tag:
            tagged[top_candidates(scores, settings.tag_fraction, eligible)] = True
        for i in np.flatnonzero(tagged):
            suspects.setdefault(inputs.ids[i], set()).add(name)
        flagged = result.flagged if result.flagged is not None else np.zeros(len(rows), bool)
        columns[f"{name}_score"] = pa.array([None if not np.isfinite(v) else float(v) for v in scores], pa.float64())
        columns[f"{name}_rank"] = pa.array(ranks(scores), pa.int64())
        columns[f"{name}_flagged"] = pa.array(np.asarray(flagged, bool), pa.bool_())
        columns[f"{name}_tagged"] = pa.array(tagged, pa.bool_())
        detail = dict(result.detail)
        for key, values in (detail.pop("columns", None) or {}).items():
            columns[f"{name}.{key}"] = pa.array([None if not np.isfinite(v) else float(v) for v in values], pa.float64())
        summaries[name] = {"method": result.method, "notes": list(result.notes),
                           "scored": int(np.isfinite(scores).sum()), "failed": failure_summary(result.failed),
                           "flagged": int(np.asarray(flagged).sum()), "tagged": int(tagged.sum()), "detail": detail}
    run_dir = claim_run_dir(ds.root, run_name, "audit", model_info["model_id"] if model_info else "pixels",
                            overwrite=overwrite)
    if settings.tag:
        changes = retag({r["sample_id"]: list(r["tags"] or []) for r in rows}, suspects, checks)
        if changes:
            ds.update(list(changes), per_sample={sid: {"tags": tags} for sid, tags in changes.items()},
                      actor=f"audit:{run_dir.name}", reason=f"suspect:<check> pre-tags of the top "
                                                           f"{100 * settings.tag_fraction:g}% per check")
    record = AuditRun(
        model=model_info, settings={**asdict(settings), "checks": list(checks)},
        dataset={"name": ds.config.get("name"), "samples": len(rows), "images_encoded": encoded},
        checks=list(checks),
        results={"checks": summaries, "excluded": failure_summary(inputs.failed),
                 "definitions": "docs/design.md#audit"},
        scores_table=pa.table(columns),
    )
    record.write(run_dir)
    logger.info("audit of %d samples (%s) -> %s", len(rows), ", ".join(checks), run_dir)
    return record


def latest_audit(dataset: Any, run_name: str | None = None) -> AuditRun:
    """The audit run ``run_name``, or the newest one (clear error when there is none)."""
    from curate.runs import list_runs
    from curate.runs.lookup import named_run

    ds = open_dataset(dataset)
    if run_name:
        return named_run(ds.root, run_name, AuditRun)  # a missing run is said so, with the audit runs there
    runs = list_runs(ds.root, kind="audit")
    if not runs:
        raise ValueError(f"{ds.root} has no audit run; run `{suggest('curate audit {dir} --model ...', dir=ds.root)}` "
                         "first")
    return AuditRun.load(runs[-1])


def measure_audit(dataset: Any, run_name: str | None = None, *, truth: str = "reviews",
                  fractions: Sequence[float] = FRACTIONS) -> list[CheckMeasure]:
    """Precision and recall at the top ``fractions`` of each check of an audit run.

    ``truth="reviews"``: the population is the samples people decided (accepted or rejected)
    and a check's positives are those rejected with the reason mapped to it
    (:data:`curate.audit.base.REASON_TO_CHECK`; outliers: any rejection; duplicates: none among
    the paper's four reasons, so not measured). ``truth="planted"``: a synthetic world's
    planted problems (:data:`curate.audit.base.PLANTED_TO_CHECK`; outliers: any planted
    problem), over every audited sample.
    """
    from curate.collect.planted import planted_truth

    ds = open_dataset(dataset)
    run = latest_audit(ds, run_name)
    ids = run.sample_ids
    by_id = {r["sample_id"]: r for r in ds.rows()}
    if truth == "reviews":
        population = [i for i, sid in enumerate(ids) if sid in by_id and by_id[sid]["status"] in ("accepted", "rejected")]
        if not population:
            raise ValueError(f"{ds.root}: no audited sample has been reviewed (accepted or rejected) yet; review first "
                             "(curate review fiftyone / labelstudio), then measure")
        labels = {ids[i]: by_id[ids[i]]["reject_reason"] or "reject" for i in population
                  if by_id[ids[i]]["status"] == "rejected"}
        table, described = REASON_TO_CHECK, "reviewers' reject:{reason}"
    elif truth == "planted":
        extras = {}
        for sid, row in by_id.items():
            try:
                extra = json.loads(row["extra"]) if isinstance(row["extra"], str) else dict(row["extra"] or {})
            except ValueError:
                extra = {}
            extras[sid] = {**extra, "source_id": row["source_id"]}
        labels = planted_truth(extras)
        if not labels:
            raise ValueError(f"{ds.root} has no planted problems (a synthetic world made with problem rates > 0)")
        population = [i for i, sid in enumerate(ids) if sid in by_id]
        table, described = PLANTED_TO_CHECK, "planted {reason}"
    else:
        raise ValueError(f"truth must be 'reviews' or 'planted', got {truth!r}")
    out = []
    for check in run.checks:
        scores = run.scores(check)[population]
        if check in ANY_REJECT_CHECKS:
            positive_ids = set(labels)
            what = "any reject" if truth == "reviews" else "any planted problem"
        else:
            reasons = sorted({k for k, v in table.items() if v == check})
            if not reasons:
                continue  # duplicates against reviews: no reason of the paper's four
            positive_ids = {sid for sid, label in labels.items() if label in reasons}
            what = " / ".join(described.format(reason=r) for r in reasons)
        positive = np.array([ids[i] in positive_ids for i in population])
        out.append(measure_check(check, scores, positive, what, fractions))
    return out
