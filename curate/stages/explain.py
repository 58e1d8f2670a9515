"""The explain stage: saliency maps, SSS and RMA for every masked sample of a dataset folder.

Why it is long (one job): one stage from maps to tables: batched saliency on the device (workers,
batches), the reduction to SSS / RMA, and the per prediction, image, class and group rows the run holds.

``explain(dataset, model, settings)`` is what ``curate explain DIR`` calls. For every sample with
a trusted mask it computes the saliency maps of the chosen targets in batches on the
device (:class:`curate.saliency.Explainer`), carries the mask through the model's preprocessing
(:mod:`curate.saliency.masks`), reduces each map to SSS and RMA there
(:mod:`curate.metrics.spuriousity`), aggregates per prediction, image and class, by group
(easy/hard; or aligned/conflicting on a synthetic world without a split) and by correct/wrong,
and writes an :class:`curate.runs.explain.ExplainRun` (files and layout documented there).

:func:`compute_explanations` does the same work in memory and returns the record unwritten
(``run.by_group()``, ``run.predictions()``, ``run.kept_maps``): what a script or a test that
wants numbers, not a run folder, calls.

``mask_fraction`` is the share of input pixels inside the mask: a uniform map scores
``SSS = 1 - mask_fraction``, the chance level to compare an SSS against.

**Which masks** (docs/design.md#masks, :mod:`curate.masks.sources`): SSS and RMA measure the
saliency on and off the object, so they are only as right as the mask. Human and exact
(synthetic / COCO) masks are used; a model's unverified proposal (``mask_status =
model:<id>``, from ``curate propose-masks``) only with ``allow_model_masks`` (``curate explain
--allow-model-masks``), the rule the split applies to model-made background labels: SSS on
unchecked proposals measures the segmenter as much as the classifier. Masks reviewers marked bad
are never used. Samples left out are counted in ``summary.json`` (``skipped``: ``model_mask``,
``rejected_mask``), never silently dropped, and the run records how many masks of each source
the scores used (``mask_sources``; :attr:`curate.runs.explain.ExplainRun.mask_line`). A
selection whose masks are all model proposals is refused without ``allow_model_masks``.
"""
from __future__ import annotations

import io
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from curate.engine.base import BatchJob
from curate.masks.sources import MaskCounts, mask_counts, mask_source, trusted_rows, untrusted_masks_message
from curate.metrics.spuriousity import (
    NAN_REASONS,
    THRESHOLD_MODES,
    aggregate_scores,
    mean_stat,
    spuriousity_scores,
)
from curate.progress import Progress, report
from curate.runs.base import CONFIG_FILE, discard_if_empty, write_bytes
from curate.runs.explain import (
    SPLIT_ORDER,
    ExplainRun,
    classes_schema,
    images_schema,
    predictions_schema,
    split_value,
)
from curate.saliency.base import SaliencyError, SaliencyResult
from curate.saliency.inputs import (
    UNTRUSTED_MASK_REASONS,
    MaskedDecode,
    model_class_names,
    open_masked_dataset,
    prompt_set_for,
    row_extra,
)
from curate.saliency.masks import mask_transform_for
from curate.saliency.registry import method_info
from curate.saliency.targets import Target, parse_target
from curate.stages.common import check_device, claim_run_dir, load_spec, model_identity, run_stage, spec_of

if TYPE_CHECKING:  # pragma: no cover
    from curate.models.base import LoadedModel
    from curate.models.spec import ModelSpec
    from curate.store import Dataset

__all__ = [
    "CONSTANT_MAP",
    "DEFAULT_STATUSES",
    "LABEL_SPACES",
    "SKIP_REASONS",
    "ExplainSettings",
    "compute_explanations",
    "explain",
]

logger = logging.getLogger(__name__)

LABEL_SPACES = ("dataset", "present")
DEFAULT_STATUSES = ("accepted", "candidate")
#: NaN reason added by the pipeline: the raw map was constant (e.g. a 1 x 1 layer).
CONSTANT_MAP = "constant_map"
#: Samples that are not scored, and why.
SKIP_REASONS = ("no_mask", "model_mask", "rejected_mask", "no_class", "mask_size_mismatch", "mask_not_2d",
                "mask_unreadable", "image_unreadable")
NORMALISATION = "relu, min-max per map, bilinear resize to the model input, min-max (pytorch-grad-cam)"


@dataclass
class ExplainSettings:
    """How to explain (the ``curate explain`` options, one field each).

    Attributes:
        method: a saliency method (:func:`curate.saliency.registry.method_names`; aliases
            accepted, stored canonical).
        target: a :class:`curate.saliency.targets.Target` or its spelling ``"true"``,
            ``"predicted"``, ``"topk:K"`` (parsed here).
        layer: the CAM layer (default: :func:`curate.saliency.layers.default_layer`).
        threshold, threshold_mode: papers/004 App. C thresholding of the [0, 1] maps
            (``soft`` keeps the map above ``threshold``, ``hard`` sets it to 1 there).
        label_space: ``"dataset"`` (all classes of the dataset's label space: 1-vs-1000 on
            ImageNet-1K) or ``"present"`` (only the classes that occur in the dataset). It sets
            the candidates of ``predicted`` / ``topk`` targets and of correct/wrong; the logit of
            a given class (the ``true`` target) does not depend on it.
        prompts: ``"simple"``, ``"openai"``, a template file or a
            :class:`curate.zeroshot.PromptSet`; None: the caption template a curate reference
            CLIP was trained with, else ``"simple"``.
        statuses: sample statuses to include (None: all).
        sample_ids: explain only these samples (in the dataset's order).
        limit: explain only the first ``limit`` eligible samples.
        batch_size: images per batch (halved automatically on out-of-memory).
        device, precision: where and how to load the model when it is not loaded yet.
        workers: DataLoader worker processes decoding images and masks (``engine="local"``;
            0: in this process; None: :func:`curate.engine.images.default_workers` of the
            model's device, every core but one on a GPU machine), or the number of model actors
            (``engine="ray"``, default 1). The maps do not depend on it.
        engine, ray_address, gpus_per_worker: where the maps are computed
            (:func:`curate.engine.make_engine`: ``local`` = this process; ``ray`` = Ray Data, one
            model and :class:`curate.saliency.Explainer` per actor). The batches, and so the
            maps and scores, are the same on both (``docs/design.md#engines``).
        save_maps: write ``maps/<sample_id>.npz`` (float32, the maps the scores come from).
        method_options: extra :class:`curate.saliency.Explainer` options (``inner_batch_size``,
            ``sign_correction``, ``head_fusion``, ``discard_ratio``, ``min_grid``).
        class_names: names to prompt a CLIP with, by class index (default: the label space's,
            overridden by the names a curate reference CLIP was trained with). Python only.
        allow_model_masks: also score samples whose mask is an unverified model proposal
            (``mask_status = model:<id>``); by default they are skipped and counted
            (``model_mask``). Masks reviewers marked bad are never used.
    """

    method: str = "gradcam"
    target: Target | str = "true"
    layer: str | None = None
    threshold: float | None = None
    threshold_mode: str = "soft"
    label_space: str = "dataset"
    prompts: Any = None
    statuses: tuple[str, ...] | None = DEFAULT_STATUSES
    sample_ids: tuple[str, ...] | None = None
    limit: int | None = None
    batch_size: int = 32
    device: str = "auto"
    precision: str = "fp32"
    workers: int | None = None
    engine: str = "local"
    ray_address: str | None = None
    gpus_per_worker: float = 0.0
    save_maps: bool = False
    method_options: dict[str, Any] = field(default_factory=dict)
    class_names: dict[int, str] | None = None
    allow_model_masks: bool = False

    def __post_init__(self) -> None:
        self.method = method_info(self.method).name
        self.target = parse_target(self.target)
        if self.threshold_mode not in THRESHOLD_MODES:
            raise SaliencyError(f"threshold mode {self.threshold_mode!r} is not one of {', '.join(THRESHOLD_MODES)}")
        if self.label_space not in LABEL_SPACES:
            raise SaliencyError(f"label_space {self.label_space!r} is not one of {', '.join(LABEL_SPACES)}")
        if int(self.batch_size) < 1:
            raise SaliencyError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.workers is not None and int(self.workers) < 0:
            raise SaliencyError(f"workers must be >= 0, got {self.workers}")
        if self.statuses is not None:
            self.statuses = tuple(self.statuses)
        if self.sample_ids is not None:
            self.sample_ids = tuple(self.sample_ids)
        self.method_options = dict(self.method_options or {})

    def to_config(self) -> dict[str, Any]:
        """What was asked, JSON-ready (``sample_ids`` as a count; prompts by name)."""
        data = asdict(self)
        data["target"] = str(self.target)
        data["sample_ids"] = None if self.sample_ids is None else len(self.sample_ids)
        data["prompts"] = getattr(self.prompts, "name", self.prompts)
        data["class_names"] = None if self.class_names is None else len(self.class_names)
        return data


# ----------------------------------------------------------------------------- the stage
@run_stage("explain")
def explain(
    dataset: Dataset | str | Path,
    model: ModelSpec | LoadedModel | str | Path,
    settings: ExplainSettings | None = None,
    *,
    run_name: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    mask_transform: Callable[[np.ndarray], torch.Tensor] | None = None,
) -> ExplainRun:
    """Explain ``model`` on ``dataset`` and write the run (see the module docstring).

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        model: a :class:`curate.models.ModelSpec`, a loaded model, a model name, or a curate
            weights file.
        settings: :class:`ExplainSettings` (default: GradCAM, true class, the whole label space).
        run_name: the run folder name (default ``explain-<method>-<model>-<UTC time>``); a finished
            one is refused before any work unless ``overwrite``, an unfinished one (killed) replaced
            (:func:`curate.stages.common.run_stage`).
        overwrite: replace a finished run of the same name.
        progress: ``progress(done, total, message)``.
        mask_transform: custom ``(H, W) mask -> (h, w) bool`` (default: from the model's preprocessing).

    Returns:
        The written :class:`curate.runs.explain.ExplainRun`.
    """
    settings = settings or ExplainSettings()
    check_device(settings.device)
    _engine(settings)  # a bad engine combination fails before anything is loaded or written
    ds = open_masked_dataset(dataset)
    loaded = load_spec(model, device=settings.device, precision=settings.precision)
    run_dir = claim_run_dir(ds.root, run_name, "explain", f"{settings.method}-{loaded.model_id}", overwrite=overwrite)
    if overwrite:
        # the run being replaced is unfinished until the new config.json is written; its maps go
        (run_dir / CONFIG_FILE).unlink(missing_ok=True)
        shutil.rmtree(run_dir / ExplainRun.MAPS, ignore_errors=True)
    try:
        run = compute_explanations(
            ds, loaded, settings, maps_dir=run_dir / ExplainRun.MAPS if settings.save_maps else None,
            mask_transform=mask_transform, text_cache=True, progress=progress,
            model_spec=spec_of(model),
        )
    except BaseException:
        discard_if_empty(run_dir)
        raise
    run.write(run_dir)
    ds.record_provenance("explain", {"run": run_dir.name, "model": loaded.model_id, "method": run.method,
                                     "layer": run.layer, "target": run.target})
    logger.info("explain run %s written", run_dir)
    return run


def _engine(settings: ExplainSettings) -> Any:
    """The engine the settings name (``workers`` = model actors with ``ray``)."""
    from curate.engine import make_engine

    if settings.engine == "ray":
        return make_engine("ray", workers=settings.workers or 1, ray_address=settings.ray_address,
                           gpus_per_worker=settings.gpus_per_worker)
    return make_engine(settings.engine, workers=settings.workers, ray_address=settings.ray_address,
                       gpus_per_worker=settings.gpus_per_worker)


def _model_factory(spec: ModelSpec | None, loaded: LoadedModel, settings: ExplainSettings) -> Any:
    """How Ray actors load the model: by name and weights (checked against the driver's model
    id) for a spec with cache-safe weights; None otherwise (the driver's model is shipped by value)."""
    from curate.engine.base import ModelFactory

    if settings.engine == "local" or spec is None or not spec.pretrained or not getattr(loaded, "cache_safe", False):
        return None
    return ModelFactory(spec.name, spec.pretrained, precision=settings.precision, expected_model_id=loaded.model_id)


def compute_explanations(
    dataset: Dataset | str | Path,
    loaded: LoadedModel,
    settings: ExplainSettings | None = None,
    *,
    maps_dir: Path | None = None,
    keep_maps: bool = False,
    mask_transform: Callable[[np.ndarray], torch.Tensor] | None = None,
    text_cache: bool = False,
    progress: Progress | None = None,
    model_spec: ModelSpec | None = None,
) -> ExplainRun:
    """Maps, SSS and RMA for every masked sample, in memory: an unwritten :class:`ExplainRun`.

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        loaded: the loaded model (:func:`curate.stages.common.load_spec` loads one from a spec).
        settings: :class:`ExplainSettings`.
        maps_dir: write ``<sample_id>.npz`` there (float32 maps, mask, targets) as batches finish.
        keep_maps: also keep the maps in :attr:`ExplainRun.kept_maps` (memory!).
        mask_transform: custom ``(H, W) mask -> (h, w) bool`` (default: from ``loaded.preprocess``).
        text_cache: cache a CLIP's text classifier under the dataset's ``features/``.
        progress: ``progress(done, total, message)`` after each batch.
        model_spec: the spec the model was loaded from; None when it was passed loaded. The config
            records :func:`curate.stages.common.model_identity` of the one or the other.

    Returns:
        An :class:`ExplainRun` with ``run_dir`` None and its tables in memory.
    """
    from curate.saliency.engine import Explainer

    settings = settings or ExplainSettings()
    started = time.perf_counter()
    identity = model_identity(model_spec if model_spec is not None else loaded, loaded)
    target = parse_target(settings.target)
    ds = open_masked_dataset(dataset)
    space = ds.label_space

    # --- which samples
    statuses = settings.statuses
    rows_all = ds.rows() if statuses is None else ds.rows(status=list(statuses))
    if settings.sample_ids is not None:
        wanted = set(settings.sample_ids)
        unknown = wanted - {r["sample_id"] for r in rows_all}
        if unknown:
            raise SaliencyError(f"{len(unknown)} sample ids are not in {ds.root} (with status in {statuses}): "
                                f"{', '.join(sorted(unknown)[:5])}")
        rows_all = [r for r in rows_all if r["sample_id"] in wanted]
    skipped: Counter = Counter()
    skipped_samples: list[dict[str, str]] = []

    def skip(row: Mapping[str, Any], reason: str) -> None:
        skipped[reason] += 1
        if len(skipped_samples) < 200:
            skipped_samples.append({"sample_id": row["sample_id"], "reason": reason})

    # a mask the scores may use (curate.masks.sources): human and exact; model proposals only when allowed
    trusted, left_out = trusted_rows(rows_all, allow_model_masks=settings.allow_model_masks)
    if not trusted and left_out.skipped_model:
        raise SaliencyError(untrusted_masks_message(ds.root, left_out, "explain"))
    usable = {row["sample_id"] for row in trusted}
    rows: list[dict[str, Any]] = []
    for row in rows_all:
        if row.get("mask_path") is None:
            skip(row, "no_mask")
        elif row["sample_id"] not in usable:
            skip(row, UNTRUSTED_MASK_REASONS[str(mask_source(row))])
        elif row.get("class_index") is None and target.needs_labels:
            skip(row, "no_class")
        else:
            rows.append(row)
    if settings.limit is not None:
        rows = rows[: max(0, int(settings.limit))]

    # --- label space, targets' logits
    if settings.label_space == "present":
        columns = sorted({int(r["class_index"]) for r in rows if r.get("class_index") is not None})
        if not columns:
            raise SaliencyError(f"{ds.root}: no sample with a class and a mask to explain")
    else:
        columns = list(range(len(space)))
    names = {i: space.names[i] for i in columns}
    head_columns = None if loaded.kind != "clip" and columns == list(range(1000)) else columns
    names.update({i: n for i, n in model_class_names(loaded).items() if i in names})
    if settings.class_names:
        names.update({int(i): str(n) for i, n in settings.class_names.items() if int(i) in names})
    classifier = None
    prompt_set = None
    if loaded.kind == "clip":
        from curate.zeroshot import cached_text_classifier

        prompt_set = prompt_set_for(loaded, settings.prompts)
        cache = ds.root / "features" if text_cache else None
        classifier = cached_text_classifier(loaded, [names[c] for c in columns], prompt_set, cache)
    elif len(space) != 1000:
        raise SaliencyError(
            f"{loaded.model_id} scores the 1000 ImageNet-1K classes but {ds.root} uses the label space "
            f"'{space.name}' ({len(space)} classes); explain it with a CLIP (zero-shot over any label space)"
        )
    engine = _engine(settings)
    explainer = Explainer(loaded, settings.method, layer=settings.layer, classifier=classifier, columns=head_columns,
                          **_method_options(settings.method_options, loaded))
    factory = _model_factory(model_spec, loaded, settings)
    worker = _ExplainWorker(
        local=explainer if engine.name == "local" else None,
        model=None if engine.name == "local" or factory is not None else loaded, factory=factory,
        method=settings.method, layer=settings.layer,
        classifier=None if classifier is None else (classifier if engine.name == "local" else classifier.cpu()),
        columns=head_columns, method_options=dict(settings.method_options), target=target,
        batch_size=settings.batch_size)

    config = {
        "dataset": str(ds.root),
        "model": {**identity, "family": loaded.kind},
        "method": explainer.method,
        "layer": explainer.layer_name,
        "target": str(target),
        "threshold": settings.threshold,
        "threshold_mode": settings.threshold_mode,
        "label_space": settings.label_space,
        "label_space_name": space.name,
        "num_classes_scored": len(columns),
        "prompts": prompt_set.to_config() if prompt_set is not None else None,
        "normalisation": NORMALISATION,
        "device": str(loaded.device),
        "engine": engine.name,
        "precision": loaded.precision,
        "settings": settings.to_config(),
        "maps": {"saved": maps_dir is not None, "dtype": ExplainRun.MAPS_DTYPE},
    }
    if maps_dir is not None:
        Path(maps_dir).mkdir(parents=True, exist_ok=True)

    # --- the loop
    size = tuple(loaded.image_size)
    mask_fn = mask_transform or mask_transform_for(loaded.preprocess)
    job = BatchJob(items=rows, batch_size=settings.batch_size, decode=MaskedDecode(ds, loaded.preprocess, mask_fn, size),
                   worker=worker, device=str(loaded.device))
    scored = _Scored()
    kept_maps: dict[str, np.ndarray] = {}
    instance_masks = 0
    resized_masks = 0
    chunk = settings.batch_size
    done = 0
    report(progress, 0, len(rows), "explaining")
    sample_ids = [r["sample_id"] for r in rows]
    for b, batch in enumerate(engine.map_batches(ds, sample_ids, job)):
        offset = b * settings.batch_size  # batch b holds rows offset .. offset + batch_size - 1 (every engine)
        good = _good(batch["problem"])
        for j, p in enumerate(batch["problem"]):
            if p not in _SCORED:
                skip(rows[offset + batch["index"][j]], p)
            elif p == "mask_resized":
                resized_masks += 1
        instance_masks += sum(bool(batch["instance_ids"][j]) for j in good)
        done += len(batch["problem"])
        chunk = batch["chunk"]
        if good:
            result = _on_device(batch["result"], loaded.device)
            masks = batch["mask"].to(loaded.device, non_blocking=True)
            batch_rows = [rows[offset + batch["index"][j]] for j in good]
            scored.add(result, masks, batch_rows, settings.threshold, settings.threshold_mode, names)
            if maps_dir is not None or keep_maps:
                _keep_maps(result, masks, batch_rows, maps_dir, kept_maps if keep_maps else None)
        report(progress, done, len(rows), "explaining")
    if instance_masks:
        logger.warning("%d masks hold values other than 0/1 (instance ids, 0/255): every non-zero pixel counted as "
                       "the object", instance_masks)
    if resized_masks:
        logger.warning("%d masks were not the size of their image and were resized to it (same aspect ratio)",
                       resized_masks)

    seconds = time.perf_counter() - started
    split = _split_kind(scored.image_info)
    # the masks the scores used (the scored images'), and the ones the trust rule left out
    by_id = {r["sample_id"]: r for r in rows}
    sources = mask_counts([by_id[sid] for sid in scored.image_info], allow_model_masks=settings.allow_model_masks)
    sources.skipped_model, sources.skipped_rejected = left_out.skipped_model, left_out.skipped_rejected
    if sources.skipped_model or sources.skipped_rejected:
        logger.info("%s: %s", ds.root, sources.line())
    summary = _summary(scored, split, skipped, skipped_samples, instance_masks, resized_masks, seconds, chunk,
                       sources)
    logger.info("explained %d images (%d predictions) in %.1f s", len(scored.image_info), len(scored.records), seconds)
    return ExplainRun(
        config=config, summary=summary,
        predictions_table=pa.Table.from_pylist(scored.records, schema=predictions_schema()),
        images_table=pa.Table.from_pylist(_image_rows(scored), schema=images_schema()),
        classes_table=pa.Table.from_pylist(_class_rows(scored, split, names), schema=classes_schema()),
        kept_maps=kept_maps,
    )


#: Decoding outcomes that are scored (a resized mask is counted, not skipped).
_SCORED = ("", "mask_resized")


def _good(problems: list[str]) -> list[int]:
    """Positions of a batch whose image and mask decoded into something to score."""
    return [j for j, p in enumerate(problems) if p in _SCORED]


class _ExplainWorker:
    """``BatchJob.worker`` of the explain stage: the driver's :class:`curate.saliency.Explainer`
    on the local engine (``local``); in a Ray actor, the model (a
    :class:`curate.engine.base.ModelFactory`, or the driver's model shipped by value) and one
    Explainer with the driver's text classifier, built once per actor."""

    def __init__(self, *, local: Any | None, model: LoadedModel | None, factory: Any, method: str,
                 layer: str | None, classifier: torch.Tensor | None, columns: list[int] | None,
                 method_options: dict[str, Any], target: Target, batch_size: int) -> None:
        self.local = local
        self.model, self.factory, self.method, self.layer = model, factory, method, layer
        self.classifier, self.columns, self.method_options = classifier, columns, method_options
        self.target, self.batch_size = target, batch_size

    def __call__(self, device: str) -> _ExplainBatches:
        from curate.engine.base import remote_factory
        from curate.saliency.engine import Explainer

        if device == "auto" and self.local is not None:  # the local engine: the driver's model and explainer
            return _ExplainBatches(self.local, self.target, self.batch_size, to_cpu=False)
        model = remote_factory(self.model, self.factory, device)()
        explainer = Explainer(model, self.method, layer=self.layer, classifier=self.classifier, columns=self.columns,
                              **_method_options(self.method_options, model))
        return _ExplainBatches(explainer, self.target, self.batch_size, to_cpu=device != "auto")


class _ExplainBatches:
    """Runs one decoded batch: the maps of its good rows (:func:`explain_with_backoff`; the
    chunk size that fit carries over to the next batch, as in one process)."""

    def __init__(self, explainer: Any, target: Target, chunk: int, *, to_cpu: bool) -> None:
        self.explainer, self.target, self.chunk, self.to_cpu = explainer, target, chunk, to_cpu

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from curate.saliency.engine import explain_with_backoff

        good = _good(batch["problem"])
        result = None
        if good:
            images = batch["image"].index_select(0, torch.as_tensor(good))
            labels = [batch["labels"][j] for j in good]
            result, self.chunk = explain_with_backoff(self.explainer, images, self.target,
                                                      labels if self.target.needs_labels else None,
                                                      batch_size=self.chunk)
            if self.to_cpu:
                result = _on_device(result, torch.device("cpu"))
        mask = batch["mask"].index_select(0, torch.as_tensor(good, dtype=torch.long))
        return {"index": list(batch["index"]), "problem": list(batch["problem"]),
                "instance_ids": list(batch["instance_ids"]), "mask": mask, "result": result, "chunk": self.chunk}


def _on_device(result: SaliencyResult, device: torch.device) -> SaliencyResult:
    """``result`` with its tensors on ``device`` (no copy when they are there already)."""
    if result.maps.device == device:
        return result
    return replace(result, maps=result.maps.to(device), targets=result.targets.to(device),
                   target_scores=result.target_scores.to(device), logits=result.logits.to(device),
                   flat=result.flat.to(device))


def _method_options(options: Mapping[str, Any] | None, model: LoadedModel) -> dict[str, Any]:
    out = dict(options or {})
    if "inner_batch_size" not in out:
        out["inner_batch_size"] = 128 if model.device.type == "cuda" else 16
    return out


def _keep_maps(result: SaliencyResult, masks: torch.Tensor, rows: list[dict[str, Any]], maps_dir: Path | None,
               kept: dict[str, np.ndarray] | None) -> None:
    """Save / keep each image's maps exactly as scored: the float32 [0, 1] maps that went into
    :func:`curate.metrics.spuriousity.spuriousity_scores` (thresholding is part of the scoring)."""
    maps_cpu = result.maps.detach().to(torch.float32).cpu().numpy()
    classes = result.target_classes.cpu().numpy()
    masks_cpu = masks.cpu().numpy()
    for j, row in enumerate(rows):
        if kept is not None:
            kept[row["sample_id"]] = maps_cpu[j]
        if maps_dir is not None:
            buffer = io.BytesIO()
            np.savez_compressed(buffer, maps=maps_cpu[j], mask=masks_cpu[j], targets=classes[j])
            write_bytes(Path(maps_dir) / f"{row['sample_id']}.npz", buffer.getvalue())


# ----------------------------------------------------------------------------- scores per batch
class _Scored:
    """What the loop accumulates: one record per (image, target), one info per image, NaN counts."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.image_info: dict[str, dict[str, Any]] = {}
        self.nan_counts: Counter = Counter()

    def add(self, result: SaliencyResult, masks: torch.Tensor, rows: list[dict[str, Any]], threshold: float | None,
            mode: str, names: Mapping[int, str]) -> None:
        n, k, h, w = result.maps.shape
        scores = spuriousity_scores(result.maps.reshape(n * k, h, w), masks.repeat_interleave(k, dim=0),
                                    threshold, mode)
        # float64 as computed (no float32 rounding): the saved maps reproduce these values exactly
        sss = scores.sss.cpu().numpy().reshape(n, k)
        rma = scores.rma.cpu().numpy().reshape(n, k)
        codes = scores.reasons.cpu().numpy().reshape(n, k)
        flat = result.flat.cpu().numpy()
        fraction = masks.flatten(1).float().mean(dim=1).cpu().numpy()
        targets = result.target_classes.cpu().numpy()
        target_scores = result.target_scores.cpu().numpy()
        predicted = result.predicted_classes.cpu().numpy()
        for i, row in enumerate(rows):
            sid = row["sample_id"]
            aligned = row_extra(row).get("aligned")
            true = row.get("class_index")
            info = {
                "sample_id": sid,
                "class_index": true,
                "class_name": row.get("class_name"),
                "group": row.get("group"),
                "background": row.get("background"),
                "aligned": bool(aligned) if isinstance(aligned, bool) else None,
                "predicted_index": int(predicted[i]),
                "correct": None if true is None else bool(int(predicted[i]) == int(true)),
                "mask_fraction": float(fraction[i]),
            }
            self.image_info[sid] = info
            for j in range(k):
                code = int(codes[i, j])
                reason = None if code < 0 else NAN_REASONS[code]
                if reason == "zero_map" and bool(flat[i, j]):
                    reason = CONSTANT_MAP
                if reason is not None:
                    self.nan_counts[reason] += 1
                self.records.append({
                    "sample_id": sid,
                    "class_index": info["class_index"],
                    "target_rank": j,
                    "target_index": int(targets[i, j]),
                    "target_name": names.get(int(targets[i, j])),
                    "target_score": float(target_scores[i, j]),
                    "predicted_index": info["predicted_index"],
                    "correct": info["correct"],
                    "group": info["group"],
                    "background": info["background"],
                    "aligned": info["aligned"],
                    "mask_fraction": info["mask_fraction"],
                    "sss": float(sss[i, j]),
                    "rma": float(rma[i, j]),
                    "nan_reason": reason,
                })


# ----------------------------------------------------------------------------- tables
def _split_kind(image_info: Mapping[str, Mapping[str, Any]]) -> str | None:
    if any(info.get("group") in SPLIT_ORDER["group"] for info in image_info.values()):
        return "group"
    if any(info.get("aligned") is not None for info in image_info.values()):
        return "aligned"
    return None


def _part(info: Mapping[str, Any], split: str | None) -> str | None:
    return split_value(split, info.get("group"), info.get("aligned"))


def _image_rows(scored: _Scored) -> list[dict[str, Any]]:
    by_image: dict[str, list[dict[str, Any]]] = {}
    for rec in scored.records:
        by_image.setdefault(rec["sample_id"], []).append(rec)
    out = []
    for sid, info in scored.image_info.items():
        recs = by_image.get(sid, [])
        sss = mean_stat([r["sss"] for r in recs])
        rma = mean_stat([r["rma"] for r in recs])
        out.append({**info, "n_predictions": len(recs), "n_nan": sss.n_nan, "sss": sss.mean, "rma": rma.mean,
                    "sss_uniform": 1.0 - info["mask_fraction"]})
    return out


def _class_rows(scored: _Scored, split: str | None, names: Mapping[int, str]) -> list[dict[str, Any]]:
    subsets: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rec in scored.records:
        info = scored.image_info[rec["sample_id"]]
        keys = ["all"]
        part = _part(info, split)
        if part is not None:
            keys.append(f"{split}={part}")
        if info.get("correct") is not None:
            keys.append("correct" if info["correct"] else "wrong")
        for key in keys:
            subsets.setdefault((rec["target_index"], key), []).append(rec)
    rows = []
    for (cls, key), recs in sorted(subsets.items()):
        sss = mean_stat([r["sss"] for r in recs])
        rma = mean_stat([r["rma"] for r in recs])
        rows.append({"class_index": cls, "class_name": names.get(cls), "subset": key, "n": sss.n, "n_nan": sss.n_nan,
                     "sss": sss.mean, "sss_std": sss.std, "rma": rma.mean, "rma_std": rma.std})
    return rows


def _summary(scored: _Scored, split: str | None, skipped: Counter, skipped_samples: list[dict[str, str]],
             instance_masks: int, resized_masks: int, seconds: float, chunk: int,
             sources: MaskCounts) -> dict[str, Any]:
    records, image_info = scored.records, scored.image_info
    image_ids = [r["sample_id"] for r in records]
    class_ids = [r["target_index"] for r in records]
    image_class = {sid: info.get("class_index") for sid, info in image_info.items()}
    groups = {sid: _part(info, split) for sid, info in image_info.items()} if split else None
    correct = {sid: info.get("correct") for sid, info in image_info.items()}
    scores = {}
    for metric in ("sss", "rma"):
        scores[metric] = aggregate_scores(
            [r[metric] for r in records], image_ids=image_ids, class_ids=class_ids, image_class=image_class,
            image_group=groups, image_correct=correct,
        )
    uniform = {sid: 1.0 - info["mask_fraction"] for sid, info in image_info.items()}

    def uniform_mean(select: Callable[[str], bool]) -> float:
        values = [v for sid, v in uniform.items() if select(sid)]
        return float(np.mean(values)) if values else float("nan")

    by_group: dict[str, Any] = {}
    nan_by_group: dict[str, Counter] = {}
    if split and groups is not None:
        for part in SPLIT_ORDER[split]:
            if part in scores["sss"].get("by_group", {}):
                by_group[part] = {
                    "sss": scores["sss"]["by_group"][part],
                    "rma": scores["rma"]["by_group"][part],
                    "sss_uniform": uniform_mean(lambda sid, part=part: groups.get(sid) == part),
                }
                nan_by_group[part] = Counter()
        for rec in records:
            part = groups.get(rec["sample_id"])
            if rec["nan_reason"] is not None and part in nan_by_group:
                nan_by_group[part][rec["nan_reason"]] += 1
    by_correct = {}
    for part in ("correct", "wrong"):
        if part in scores["sss"].get("by_correct", {}):
            by_correct[part] = {"sss": scores["sss"]["by_correct"][part], "rma": scores["rma"]["by_correct"][part]}
    accuracy = [v for v in correct.values() if v is not None]
    return {
        "n_images": len(image_info),
        "n_predictions": len(records),
        "accuracy": float(np.mean(accuracy)) if accuracy else None,
        "overall": {
            "sss": {k: scores["sss"][k] for k in ("per_prediction", "per_image")},
            "rma": {k: scores["rma"][k] for k in ("per_prediction", "per_image")},
            "sss_uniform": uniform_mean(lambda sid: True),
        },
        "split": split,
        "by_group": by_group,
        "by_correct": by_correct,
        "per_class": {"sss": scores["sss"]["per_class"], "rma": scores["rma"]["per_class"]},
        "nan": {"count": int(sum(scored.nan_counts.values())), "reasons": dict(scored.nan_counts),
                "by_group": {part: dict(c) for part, c in nan_by_group.items()}},
        "skipped": {"count": int(sum(skipped.values())), "reasons": dict(skipped), "samples": skipped_samples},
        "masks": {"non_binary": instance_masks, "resized": resized_masks},
        "mask_sources": sources.as_dict(),
        "timing": {"seconds": round(seconds, 3), "images_per_second": round(len(image_info) / seconds, 2)
                   if seconds > 0 else None, "final_batch_size": chunk},
    }
