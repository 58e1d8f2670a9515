"""The label-backgrounds stage: CLIP background pre-labels (``curate label-backgrounds``).

``label_backgrounds(dataset, model, settings)`` proposes a background for every sample with a
class that people have not labelled (formulas in :mod:`curate.split.backgrounds`): it writes
``background``, ``background_score``, ``background_source = "model"`` (and the
``review:background`` tag below ``threshold``) into the dataset and records
``provenance.label_backgrounds`` (with ``model``: what was passed, a spec or a loaded model,
:func:`curate.stages.common.model_identity`). Unlike the other stages it writes into the
dataset, not a run folder, so it returns its :class:`curate.split.backgrounds.BackgroundReport`;
``run_name`` is refused and ``overwrite`` has no effect (labels from people and from the
synthetic world are never overwritten; earlier model labels always are refreshed).

``settings.measure`` writes nothing: it scores the pre-labels against the existing human or
synthetic labels (agreement, per-background recall, chance levels).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curate.engine import make_engine
from curate.progress import Progress, phase
from curate.split.backgrounds import (
    PROTECTED_SOURCES,
    BackgroundReport,
    load_background_prompts,
    measure_agreement,
    pre_label_updates,
    predict_backgrounds,
)
from curate.stages.common import check_device, load_spec, model_identity, open_dataset, spec_of

__all__ = ["LabelBackgroundsSettings", "label_backgrounds"]


@dataclass
class LabelBackgroundsSettings:
    """How to pre-label (CLI options of ``curate label-backgrounds`` map one to one)."""

    prompts_file: Path | None = None  # YAML with phrases and templates (default datasets/backgrounds.yaml)
    threshold: float = 0.5  # below this probability a pre-label gets the review:background tag
    measure: bool = False  # write nothing; score against existing human/synthetic labels
    device: str = "auto"
    precision: str = "fp32"
    batch_size: int = 256
    workers: int | None = None  # local: decoding processes; ray: model actors (curate.engine)
    engine: str = "local"  # local | ray: where images are encoded (same cache and labels either way)
    ray_address: str | None = None  # None: a local Ray instance for the run; auto | ray://HOST:PORT
    gpus_per_worker: float = 0.0


def label_backgrounds(
    dataset: Any, model: Any, settings: LabelBackgroundsSettings | None = None, *, run_name: str | None = None,
    overwrite: bool = False, progress: Progress | None = None,
) -> BackgroundReport:
    """Pre-label (or, with ``settings.measure``, score against existing labels); see the module docstring.

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        model: a CLIP: a :class:`curate.models.ModelSpec`, a loaded model, a name or a weights file.
        settings: :class:`LabelBackgroundsSettings`.
        run_name: must be ``None`` (this stage writes no run).
        overwrite: no effect (see the module docstring).
        progress: :class:`curate.progress.Progress` (phase "encoding images").
    """
    settings = settings or LabelBackgroundsSettings()
    if run_name is not None:
        raise ValueError("label-backgrounds writes into the dataset, not a run folder: it takes no run name")
    if not 0.0 <= settings.threshold <= 1.0:
        raise ValueError(f"--threshold must be in [0, 1], got {settings.threshold}")
    check_device(settings.device)
    engine = make_engine(settings.engine, workers=settings.workers, ray_address=settings.ray_address,
                         gpus_per_worker=settings.gpus_per_worker)  # a bad engine choice fails before any work
    ds = open_dataset(dataset)
    prompts = load_background_prompts(settings.prompts_file)
    loaded = load_spec(model, device=settings.device, precision=settings.precision)
    identity = model_identity(model, loaded)
    if loaded.kind != "clip":
        raise ValueError(f"background pre-labels need a CLIP (text prompts); {loaded.model_id} is a {loaded.kind}")
    encode = {"batch_size": settings.batch_size, "workers": settings.workers, "engine": engine,
              "factory": _factory(model, loaded, settings)}
    rows = [r for r in ds.rows() if r["class_index"] is not None and r["status"] != "rejected"]
    encoding = phase(progress, "encoding images")
    if settings.measure:
        target = [r for r in rows if r["background"] is not None and r["background_source"] in PROTECTED_SOURCES]
        if not target:
            raise ValueError("nothing to measure against: no sample has a human or synthetic background label")
        present = sorted({r["background"] for r in target})
        ids, probs, failed = predict_backgrounds(ds, loaded, target, present, prompts, progress=encoding, **encode)
        report = measure_agreement(ids, probs, present, {r["sample_id"]: r["background"] for r in target})
        report.failed = failed
        return report
    report = BackgroundReport()
    vocabulary = list(ds.backgrounds)
    target = [r for r in rows if r["background"] is None or r["background_source"] == "model"]
    report.skipped_protected = sum(1 for r in rows if r["background"] is not None
                                   and r["background_source"] in PROTECTED_SOURCES)
    if not target:
        return report
    ids, probs, failed = predict_backgrounds(ds, loaded, target, vocabulary, prompts, progress=encoding, **encode)
    report.failed = failed
    per_sample, report.low_confidence = pre_label_updates(ids, probs, vocabulary, {r["sample_id"]: r for r in target},
                                                          settings.threshold)
    if per_sample:
        ds.update(list(per_sample), per_sample=per_sample, actor=f"label-backgrounds:{loaded.model_id}",
                  reason="CLIP background pre-label")
    report.labelled = len(per_sample)
    ds.record_provenance("label_backgrounds", {"model_id": loaded.model_id, "model": identity,
                                               "templates": list(prompts.templates),
                                               "threshold": settings.threshold, "labelled": report.labelled,
                                               "low_confidence": report.low_confidence})
    return report


def _factory(model: Any, loaded: Any, settings: LabelBackgroundsSettings) -> Any:
    """How a remote engine's workers load the model: by name and weights (checked against the
    driver's model id) when it was named by a :class:`ModelSpec` with cache-safe weights; None
    otherwise (the loaded model is shipped by value; ``docs/design.md#engines``)."""
    from curate.engine.base import ModelFactory

    spec = spec_of(model)
    if settings.engine == "local" or spec is None or not spec.pretrained:
        return None
    if not getattr(loaded, "cache_safe", False):
        return None
    return ModelFactory(spec.name, spec.pretrained, precision=settings.precision,
                        expected_model_id=loaded.model_id)
