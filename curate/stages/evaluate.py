"""The evaluate stage: zero-shot CLIPs and ImageNet classifiers on a dataset folder (papers/003 §3, App. C).

``evaluate(dataset, model, settings)`` scores one model and writes an
:class:`curate.runs.EvaluationRun` (``config.json``, ``predictions.parquet``, ``metrics.json``;
layout in :mod:`curate.runs.evaluation`). ``metrics.json`` holds ``overall`` (acc1, acc5,
mean_per_class_recall: the unbalanced / balanced definitions of :mod:`curate.metrics.accuracy`),
``groups`` (easy / hard: acc1_balanced, acc1_unbalanced, acc5_balanced, n, 95% bootstrap
intervals), ``drop`` (balanced, with its interval), ``per_class``, ``per_background``,
``per_class_background`` and ``excluded`` (samples that failed to decode or gave non-finite
outputs, with reasons). Accuracies are fractions in [0, 1].

Speed: image outputs come from :mod:`curate.features` (cached per model and preprocessing),
text classifiers from :func:`curate.zeroshot.cached_text_classifier`; a second evaluation of
the same model with another label space, prompt set or top-k encodes no image.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from curate.features import FEATURES_DIR, compute_features
from curate.lvlm import scoring as lvlm_scoring
from curate.metrics.accuracy import (
    balanced_accuracy,
    class_accuracies,
    class_drops,
    mean_drop,
    mean_per_class_recall,
    topk_correct,
    unbalanced_accuracy,
)
from curate.metrics.bootstrap import bootstrap_groups
from curate.models.spec import ModelSpec, family_of_kind
from curate.progress import Progress, phase
from curate.runs.base import check_run_name
from curate.runs.evaluation import EvaluationRun
from curate.stages.common import (
    check_device,
    claim_run_dir,
    identity_label,
    model_identity,
    open_dataset,
    run_stage,
    spec_of,
)
from curate.zeroshot.candidates import CandidateSpace, build_top20, file_space, full_space, load_top20, save_top20
from curate.zeroshot.classifier import cached_text_classifier, classifier_for_labels, zero_shot_logits
from curate.zeroshot.prompts import SIMPLE_TEMPLATE, PromptSet, load_prompts

logger = logging.getLogger(__name__)

TOPK = 5
DEFAULT_STATUSES = ("candidate", "accepted")


@dataclass
class EvalSettings:
    """How to evaluate (CLI options map one to one)."""

    label_space: str = "auto"  # auto (top20 for LVLMs, imagenet1k for the rest) | imagenet1k | top20 | dataset | path to a file
    prompts: str = "simple"  # simple | openai | path to a template file
    device: str = "auto"
    batch_size: int = 256
    workers: int | None = None
    precision: str = "fp32"
    bootstrap: int = 1000
    seed: int = 0
    statuses: tuple[str, ...] = DEFAULT_STATUSES
    top20_reference: ModelSpec | None = None
    rebuild_top20: bool = False
    use_cache: bool = True
    question: str = lvlm_scoring.DEFAULT_QUESTION  # LVLMs only (papers/003 App. C.4)
    answer_template: str = lvlm_scoring.DEFAULT_ANSWER_TEMPLATE  # LVLMs only
    token_env: str | None = None  # endpoint LVLMs: the variable holding the API token (its name, never its value)
    engine: str = "local"  # local | ray (curate.engine); with ray, ``workers`` = model actors
    ray_address: str | None = None  # None: a local Ray instance for the run; auto | ray://HOST:PORT
    gpus_per_worker: float = 0.0
    #: how files become the model's input (curate.engine.images): cpu-exact (the model's own PIL
    #: transform, CLIP_benchmark's numbers) | gpu (decode, resize, crop, normalise on the device) |
    #: auto (gpu on CUDA, cpu-exact elsewhere). Part of the feature cache's key; recorded in the run.
    input_path: str = "cpu-exact"


def _evaluation_rows(ds, statuses: Sequence[str]) -> list[dict]:
    rows = [r for r in ds.rows(status=list(statuses)) if r["class_index"] is not None]
    if not rows:
        raise ValueError(f"{ds.root}: no samples with status in {list(statuses)} and a class to evaluate")
    return rows


def _load(spec: ModelSpec, settings: EvalSettings):
    """Load ``spec`` as the settings ask (one seam, so tests can route a spec to a seeded model)."""
    from curate.models import load_model

    return load_model(spec.name, spec.pretrained, device=settings.device, precision=settings.precision)


def _engine(settings: EvalSettings):
    """The engine that encodes images (:mod:`curate.engine`; local by default)."""
    from curate.engine import make_engine

    return make_engine(settings.engine, workers=settings.workers, ray_address=settings.ray_address,
                       gpus_per_worker=settings.gpus_per_worker)


def _model(spec: ModelSpec, settings: EvalSettings, root: Path):
    """``_load(spec)``, lazily when the dataset has seen this model (nothing is loaded when
    nothing must be encoded; curate/engine/identity.py)."""
    if not settings.use_cache:
        return _load(spec, settings)
    from curate.engine import stage_model

    return stage_model(spec, root, lambda: _load(spec, settings), device=settings.device,
                       precision=settings.precision)


def _scores(ds, model, ids: list[str], prompts: PromptSet, settings: EvalSettings, progress,
            needed: np.ndarray | None = None) -> tuple[np.ndarray, list[str], dict[str, str], dict[str, Any]]:
    """Scores over the base label space for the ids that succeeded, the failures, and where the
    features came from (:meth:`curate.features.Features.provenance`); for CLIPs only the
    ``needed`` label columns are computed (the rest are -inf, never candidates anyway)."""
    feats = compute_features(ds, model, ids, batch_size=settings.batch_size, workers=settings.workers,
                             use_cache=settings.use_cache, progress=progress, engine=_engine(settings),
                             factory=getattr(model, "factory", None), input_path=settings.input_path)
    if not feats.sample_ids:
        raise ValueError(_nothing_scored(len(ids), feats.failed))
    if model.kind == "clip":  # in numpy: with everything cached, a re-score imports no torch
        classifier = classifier_for_labels(model, ds.label_space.names, needed, prompts,
                                           ds.root / FEATURES_DIR / "text" if settings.use_cache else None, numpy=True)
        partial = zero_shot_logits(feats.values, classifier)
        if needed is None:
            scores = partial
        else:
            scores = np.full((len(feats.sample_ids), len(ds.label_space)), -np.inf, dtype=np.float32)
            scores[:, needed] = partial
    else:
        if not ds.label_space.is_builtin:
            raise ValueError(f"{model.model_id} is an ImageNet-1K classifier; the dataset's label space "
                             f"'{ds.label_space.name}' is not ImageNet-1K, so it cannot be scored on it")
        scores = feats.values
    return scores.astype(np.float32), feats.sample_ids, feats.failed, feats.provenance()


def resolve_candidates(ds, settings: EvalSettings, rows: list[dict], progress=None) -> CandidateSpace:
    """The candidate space named by ``settings.label_space`` (building 1-vs-20 when needed)."""
    spec = settings.label_space
    space = ds.label_space
    if spec in ("imagenet1k", "dataset", "full"):
        if spec == "imagenet1k" and not space.is_builtin:
            raise ValueError(f"the dataset's label space is '{space.name}', not ImageNet-1K; use --label-space dataset")
        return full_space(space)
    if spec == "top20":
        existing = None if settings.rebuild_top20 else load_top20(ds.root, len(space))
        if existing is not None:
            ref = settings.top20_reference
            if ref and existing.info.get("reference_spec") not in (None, ref.label):
                raise ValueError(f"the dataset's 1-vs-20 label space was built with {existing.info.get('reference_spec')}, "
                                 f"not {ref.label}; it is reused unchanged for every model — pass --rebuild-top20 to replace it")
            return existing
        return _build_top20_space(ds, settings, rows, progress)
    return file_space(Path(spec), space)


def _build_top20_space(ds, settings: EvalSettings, rows: list[dict], progress=None) -> CandidateSpace:
    ref = settings.top20_reference
    if ref is None:
        recorded = (ds.provenance.get("split") or {}).get("reference")
        if isinstance(recorded, dict) and recorded.get("name"):
            ref = ModelSpec(recorded["name"], recorded.get("pretrained"))
    if ref is None:
        raise ValueError("building the 1-vs-20 label space needs a reference CLIP (the paper used "
                         "CLIP-LAION400M-ViT-B/32): pass --top20-reference NAME [--top20-pretrained TAG]")
    model = _model(ref, settings, ds.root)
    if model.kind != "clip":
        raise ValueError(f"the 1-vs-20 reference must be a CLIP (it ranks labels by text similarity); got {model.model_id}")
    grouped = [r for r in rows if r["group"] in ("easy", "hard")]
    use = grouped or rows  # easy and hard together (App. C.2); every sample before a split exists
    feats = compute_features(ds, model, [r["sample_id"] for r in use], kind="embedding", batch_size=settings.batch_size,
                             workers=settings.workers, use_cache=settings.use_cache, progress=progress,
                             input_path=settings.input_path)
    by_id = feats.row_of()
    per_class: dict[int, list[int]] = {}
    for r in use:
        if r["sample_id"] in by_id:
            per_class.setdefault(int(r["class_index"]), []).append(by_id[r["sample_id"]])
    prompts = PromptSet("simple", (SIMPLE_TEMPLATE,))
    classifier = cached_text_classifier(model, ds.label_space.names, prompts, ds.root / FEATURES_DIR / "text")
    table = build_top20({c: feats.values[idx] for c, idx in per_class.items()}, classifier.numpy())
    info = {"reference_model_id": model.model_id, "reference_spec": ref.label, "prompt": SIMPLE_TEMPLATE,
            "images": "easy+hard" if grouped else "all evaluated samples (no groups yet)"}
    path = save_top20(ds.root, table, info)
    logger.info("built the 1-vs-20 label space with %s -> %s", model.model_id, path)
    return CandidateSpace("top20", len(ds.label_space), per_class=table, info={"kind": "top20", "file": str(path), **info})


def compute_metrics(
    topk: np.ndarray, classes: np.ndarray, groups: np.ndarray, backgrounds: np.ndarray, label_names: Sequence[str],
    *, candidates_per_sample: int | None, n_boot: int = 1000, seed: int = 0,
) -> dict[str, Any]:
    """All metrics from stored top-k predictions (see the module docstring for the layout)."""
    k5 = min(TOPK, topk.shape[1])
    c1 = topk_correct(topk, classes, 1)
    c5 = topk_correct(topk, classes, k5)
    acc5_defined = candidates_per_sample is None or candidates_per_sample >= TOPK
    nan = float("nan")
    metrics: dict[str, Any] = {
        "overall": {
            "acc1": unbalanced_accuracy(c1),
            "acc5": unbalanced_accuracy(c5) if acc5_defined else nan,
            "mean_per_class_recall": mean_per_class_recall(topk[:, 0], classes),
            "acc1_balanced": balanced_accuracy(c1, classes),
            "n": int(len(classes)),
        }
    }
    has_groups = np.isin(groups, ["easy", "hard"]).any()
    if has_groups:
        intervals = bootstrap_groups(c1, classes, groups, n_boot=n_boot, seed=seed)
        group_metrics = {}
        for g in ("easy", "hard"):
            sel = groups == g
            group_metrics[g] = {
                "acc1_balanced": balanced_accuracy(c1[sel], classes[sel]) if sel.any() else nan,
                "acc1_unbalanced": unbalanced_accuracy(c1[sel]),
                "acc5_balanced": (balanced_accuracy(c5[sel], classes[sel]) if sel.any() else nan) if acc5_defined else nan,
                "n": int(sel.sum()),
                "n_classes": int(len(np.unique(classes[sel]))),
                "acc1_balanced_ci95": intervals[g].to_list(),
            }
        metrics["groups"] = group_metrics
        drop1 = mean_drop(c1, classes, groups)
        metrics["drop"] = {
            "acc1": drop1,
            "acc5": mean_drop(c5, classes, groups) if acc5_defined else nan,
            "acc1_unbalanced": group_metrics["easy"]["acc1_unbalanced"] - group_metrics["hard"]["acc1_unbalanced"],
            "acc1_ci95": intervals["drop"].to_list(),
            "definition": "mean over classes with both groups of ACC_easy(c) - ACC_hard(c) (papers/003 App. C.3)",
        }
    else:
        metrics["groups"] = {}
        metrics["drop"] = None
    drops = class_drops(c1, classes, groups) if has_groups else {}
    per_class = []
    for c, (acc, n) in class_accuracies(c1, classes).items():
        row = {"class_index": c, "class_name": label_names[c], "n": n, "acc1": acc,
               "acc5": class_accuracies(c5[classes == c], classes[classes == c])[c][0] if acc5_defined else nan}
        if c in drops:
            e, h, d, ne, nh = drops[c]
            row.update({"easy_acc1": e, "hard_acc1": h, "drop": d, "n_easy": ne, "n_hard": nh})
        per_class.append(row)
    metrics["per_class"] = per_class
    per_background = []
    for b in sorted({x for x in backgrounds if x is not None}):
        sel = backgrounds == b
        per_background.append({"background": b, "n": int(sel.sum()), "acc1_balanced": balanced_accuracy(c1[sel], classes[sel]),
                               "acc1_unbalanced": unbalanced_accuracy(c1[sel])})
    metrics["per_background"] = per_background
    cells = []
    for c in np.unique(classes):
        for b in sorted({x for x in backgrounds[classes == c] if x is not None}):
            sel = (classes == c) & (backgrounds == b)
            cells.append({"class_index": int(c), "background": b, "n": int(sel.sum()), "acc1": unbalanced_accuracy(c1[sel])})
    metrics["per_class_background"] = cells
    return metrics


def _check_loaded(model: Any) -> dict[str, Any]:
    """The identity of a model passed already loaded (:func:`curate.stages.common.model_identity`),
    checked before any work: it must have a model id, a known family and, for an LVLM, answer losses."""
    identity = model_identity(model, model)
    kind = getattr(model, "kind", None)
    family_of_kind(str(kind))
    if kind == "lvlm" and not callable(getattr(model, "answer_losses", None)):
        raise TypeError(f"{identity['model_id']} is a loaded LVLM without answer_losses: evaluate scores an LVLM "
                        "by answer likelihood (curate.lvlm.scoring); pass a curate.lvlm.hf.HFLvlm, an "
                        "EndpointClient, or its spec")
    return identity


def _nothing_scored(total: int, failed: dict[str, str]) -> str:
    """Why no run is written when not one of ``total`` samples could be scored (an evaluation of
    nothing would hide the last real one of the model; docs/design.md#run-folders)."""
    reasons = Counter(r.split(":")[0] for r in failed.values())
    example = next(iter(sorted(failed.items())), None)
    return (f"no sample could be scored: all {total} failed ("
            + ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
            + (f"; e.g. {example[0]}: {example[1]}" if example else "") + "); no run was written")


@run_stage("evaluate")
def evaluate(
    dataset: Any, model: ModelSpec | Any, settings: EvalSettings | None = None, *, run_name: str | None = None,
    overwrite: bool = False, progress: Progress | None = None,
) -> EvaluationRun:
    """Evaluate one model on a dataset folder and write its :class:`EvaluationRun`.

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        model: a :class:`curate.models.ModelSpec` (loaded here), a model name or curate weights
            file, or an already loaded model (``curate.load_model(...)``, a loaded LVLM); the run
            records what was passed (:func:`curate.stages.common.model_identity`).
        settings: :class:`EvalSettings` (default: 1 vs 1000, "A photo of {}.").
        run_name: the run folder (default ``eval-<model>-<label space>-<UTC time>``); a finished
            one is refused before any work unless ``overwrite``, an unfinished one replaced
            (:func:`curate.stages.common.run_stage`).
        progress: :class:`curate.progress.Progress` (phases "building 1-vs-20", "encoding images").
    Raises:
        ValueError: no sample could be scored (no run is written), bad settings.
    """
    spec = spec_of(model)
    given = None if spec is not None else _check_loaded(model)  # a bad loaded model fails before any work
    model = spec if spec is not None else model
    settings = lvlm_scoring.resolve_label_space(settings or EvalSettings(), model)
    check_device(settings.device)
    ds = open_dataset(dataset)
    prompts = load_prompts(settings.prompts)
    rows = _evaluation_rows(ds, settings.statuses)
    candidates = resolve_candidates(ds, settings, rows, phase(progress, "building the 1-vs-20 space"))
    candidates.check_covers([r["class_index"] for r in rows], ds.label_space)
    ids = [r["sample_id"] for r in rows]
    lvlm = None
    features: dict[str, Any] | None = None  # which precision and input path made the image features (not LVLMs)
    if lvlm_scoring.is_lvlm_spec(model):  # answer likelihood (curate/lvlm/scoring.py), -inf outside candidates
        lvlm = lvlm_scoring.lvlm_scores(ds, model, rows, candidates, settings, phase(progress, "scoring answers"),
                                        engine=_engine(settings))
        loaded, scores, kept, failed, encoded = lvlm.model, lvlm.scores, lvlm.sample_ids, lvlm.failed, lvlm.scored
        if not kept:
            raise ValueError(_nothing_scored(len(ids), failed))
        prompts_config = lvlm_scoring.prompt_config(settings.question, settings.answer_template)
    else:
        _engine(settings)  # a bad engine choice fails before any work
        loaded = model if spec is None else _model(spec, settings, ds.root)
        scores, kept, failed, features = _scores(ds, loaded, ids, prompts, settings,
                                                 phase(progress, "encoding images"), candidates.needed_labels())
        encoded = int(features["encoded"])
        prompts_config = prompts.to_config()
    identity = given or model_identity(spec, loaded)
    by_id = {r["sample_id"]: r for r in rows}
    kept_rows = [by_id[sid] for sid in kept]
    classes = np.array([r["class_index"] for r in kept_rows], dtype=np.int64)
    groups = np.array([r["group"] for r in kept_rows], dtype=object)
    backgrounds = np.array([r["background"] for r in kept_rows], dtype=object)
    restricted = candidates.restrict(scores, classes)
    k = min(TOPK, candidates.size or TOPK, restricted.shape[1])
    order = np.argsort(-restricted, axis=1, kind="stable")[:, :k]
    top_scores = np.take_along_axis(restricted, order, axis=1)
    metrics = compute_metrics(order, classes, groups, backgrounds, ds.label_space.names,
                              candidates_per_sample=candidates.size, n_boot=settings.bootstrap, seed=settings.seed)
    metrics["excluded"] = {"count": len(failed), "reasons": dict(Counter(r.split(":")[0] for r in failed.values())),
                           "samples": [{"sample_id": s, "reason": r} for s, r in sorted(failed.items())]}
    metrics["model_id"] = loaded.model_id
    metrics["label_space"] = candidates.name
    metrics["candidates_per_sample"] = candidates.size  # chance top-1 = 1 / this (None: varies by class)
    metrics["prompts"] = prompts_config["name"]
    predictions = pa.table({
        "sample_id": pa.array(kept, pa.string()),
        "class_index": pa.array(classes, pa.int32()),
        "group": pa.array(groups.tolist(), pa.string()),
        "background": pa.array(backgrounds.tolist(), pa.string()),
        "topk_labels": pa.array(order.astype(np.int32).tolist(), pa.list_(pa.int32())),
        "topk_scores": pa.array(top_scores.astype(np.float32).tolist(), pa.list_(pa.float32())),
        "correct1": pa.array(order[:, 0] == classes, pa.bool_()),
        "correct5": pa.array((order == classes[:, None]).any(axis=1), pa.bool_()),
    })
    record = EvaluationRun(
        model={**identity, "family": family_of_kind(loaded.kind), "info": dict(getattr(loaded, "info", None) or {})},
        label_space={"name": candidates.name, **candidates.info}, prompts=prompts_config,
        settings={**asdict(settings),
                  "top20_reference": settings.top20_reference.label if settings.top20_reference else None},
        dataset={"name": ds.config.get("name"), "samples": len(rows), "images_encoded": encoded,
                 **({"features": features} if features is not None else {})},
        metrics=metrics, predictions_table=predictions, candidate_losses_table=lvlm.losses if lvlm else None,
    )
    run_dir = claim_run_dir(ds.root, run_name, "eval", f"{identity_label(identity)}-{candidates.name}",
                            overwrite=overwrite)
    record.write(run_dir)
    logger.info("%s: acc1 %.4f -> %s", loaded.model_id, metrics["overall"]["acc1"], run_dir)
    return record


def evaluate_models(dataset: Any, models: Sequence[ModelSpec | Any], settings: EvalSettings | None = None, *,
                    run_name: str | None = None, overwrite: bool = False,
                    progress: Progress | None = None) -> list[EvaluationRun]:
    """:func:`evaluate` for each model (specs or loaded models); with several models a given
    ``run_name`` gets the model's label appended so runs never collide. Every name is checked
    before the first model is scored."""
    from curate.runs import slug

    ds = open_dataset(dataset)
    names = []
    for model in models:
        spec = spec_of(model)
        label = spec.label if spec is not None else identity_label(_check_loaded(model))
        name = run_name if (run_name and len(models) == 1) else (f"{run_name}-{slug(label)}" if run_name else None)
        if name:
            check_run_name(ds.root, name, overwrite=overwrite)
        names.append(name)
    return [evaluate(ds, model, settings, run_name=name, overwrite=overwrite, progress=progress)
            for model, name in zip(models, names)]
