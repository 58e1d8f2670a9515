"""SSS and RMA over a dataset folder: maps for every masked sample, scores, aggregates, a run folder.

:func:`explain_dataset` is what ``curate explain DIR`` calls. For every sample with a mask (not
rejected) it computes the saliency maps of the chosen targets in batches on the device, carries
the mask through the model's preprocessing (:mod:`.masks`), reduces each map to SSS and RMA
there (:mod:`curate.metrics.spuriousity`), and writes ``DIR/runs/<run-name>/``:

- ``config.json``: what was asked (model, method, layer, target, threshold, label space, prompts);
- ``predictions.parquet``: one row per (image, target): ``sample_id, class_index, target_rank,
  target_index, target_name, target_score, predicted_index, correct, group, background,
  aligned, mask_fraction, sss, rma, nan_reason``;
- ``images.parquet``: per image, the mean over its predictions (papers/004 §3.2);
- ``classes.parquet``: per target class, over all predictions and split by group and by
  correct/wrong (``subset`` column);
- ``summary.json``: per-prediction / per-image / class-balanced means, the same by group
  (easy/hard; or aligned/conflicting on a synthetic world without a split) and by
  correct/wrong, NaN counts with reasons, samples skipped with reasons, timing;
- ``maps/<sample_id>.npz`` with ``--save-maps``: ``maps`` (K, H, W) float16, ``mask`` (H, W),
  ``targets`` (K,) class indices, on the model input's pixel grid.

``mask_fraction`` is the share of input pixels inside the mask: a uniform map scores
``SSS = 1 - mask_fraction``, the chance level to compare an SSS against.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from curate.metrics.spuriousity import (
    NAN_REASONS,
    THRESHOLD_MODES,
    aggregate_scores,
    mean_stat,
    spuriousity_scores,
)
from curate.saliency.base import SaliencyError, SaliencyResult
from curate.saliency.inputs import (
    MaskedImages,
    collate_masked,
    model_class_names,
    open_masked_dataset,
    prompt_set_for,
    resolve_model,
    row_extra,
)
from curate.saliency.masks import mask_transform_for

if TYPE_CHECKING:  # pragma: no cover
    from curate.models.base import LoadedModel
    from curate.store import Dataset

logger = logging.getLogger(__name__)

LABEL_SPACES = ("dataset", "present")
#: NaN reason added by the pipeline: the raw map was constant (e.g. a 1 x 1 layer).
CONSTANT_MAP = "constant_map"
#: Samples that are not scored, and why.
SKIP_REASONS = ("no_mask", "no_class", "mask_size_mismatch", "mask_not_2d", "mask_unreadable", "image_unreadable")
SPLIT_ORDER = {"group": ("easy", "hard"), "aligned": ("aligned", "conflicting")}


@dataclass
class ExplainResult:
    """What :func:`explain_dataset` computed (and wrote, when ``run_dir`` is set)."""

    run_dir: Path | None
    predictions: pa.Table
    images: pa.Table
    classes: pa.Table
    summary: dict[str, Any]
    maps: dict[str, np.ndarray] = field(default_factory=dict)

    def by_group(self) -> dict[str, Any]:
        """The compact easy-vs-hard (or aligned-vs-conflicting) summary (see :func:`summarize_by_group`)."""
        return compact_summary(self.summary)


# ----------------------------------------------------------------------------- main entry
def explain_dataset(
    dataset: "Dataset | str | Path",
    model: "LoadedModel | str | Path",
    *,
    pretrained: Any = None,
    method: str = "gradcam",
    target: str = "true",
    layer: str | None = None,
    threshold: float | None = None,
    threshold_mode: str = "soft",
    label_space: str = "dataset",
    prompts: Any = None,
    class_names: Mapping[int, str] | None = None,
    statuses: Sequence[str] | None = ("accepted", "candidate"),
    sample_ids: Sequence[str] | None = None,
    limit: int | None = None,
    batch_size: int = 32,
    device: Any = None,
    precision: str = "fp32",
    num_workers: int = 0,
    save_maps: bool = False,
    keep_maps: bool = False,
    run_name: str | None = None,
    write: bool = True,
    overwrite: bool = False,
    mask_transform: Callable[[np.ndarray], torch.Tensor] | None = None,
    method_options: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExplainResult:
    """Saliency maps, SSS and RMA for every masked sample of a dataset (see the module docstring).

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        model: a loaded model, a model name (with ``pretrained``), or a curate weights file.
        pretrained: pretrained tag or weights file when ``model`` is a name.
        method: a method of :data:`curate.saliency.methods.METHODS`.
        target: ``"true"``, ``"predicted"`` or ``"topk:K"``.
        layer: the CAM layer (default: :func:`curate.saliency.layers.default_layer`).
        threshold, threshold_mode: papers/004 App. C thresholding of the [0, 1] maps.
        label_space: ``"dataset"`` (all classes of the dataset's label space: 1-vs-1000 on
            ImageNet-1K) or ``"present"`` (only the classes that occur in the dataset). It sets
            the candidates of ``predicted`` / ``topk`` targets and of correct/wrong; the logit of
            a given class (the ``true`` target) does not depend on it.
        prompts: ``"simple"``, ``"openai"``, a template file or a PromptSet; default: the caption
            template a curate reference CLIP was trained with, else ``"simple"``.
        class_names: names to prompt with, by class index (default: the label space's, overridden
            by the names a curate reference CLIP was trained with).
        statuses: sample statuses to include (None: all).
        sample_ids: explain only these samples (in the dataset's order).
        limit: explain only the first ``limit`` eligible samples.
        batch_size: images per batch (halved automatically on out-of-memory).
        device, precision: where and how to load ``model`` when it is not loaded yet.
        num_workers: DataLoader workers decoding images and masks.
        save_maps: write ``maps/<sample_id>.npz`` into the run folder.
        keep_maps: also return the maps in :attr:`ExplainResult.maps` (memory!).
        run_name: the run folder name (default ``explain-<method>-<model>-<UTC time>``).
        write: write the run folder (False: compute and return only).
        overwrite: replace an existing run of the same name.
        mask_transform: custom ``(H, W) mask -> (h, w) bool`` (default: from ``model.preprocess``).
        method_options: extra :class:`curate.saliency.Explainer` options (``inner_batch_size``,
            ``sign_correction``, ``head_fusion``, ``discard_ratio``, ``min_grid``).
        progress: ``progress(done, total)`` after each batch.

    Returns:
        :class:`ExplainResult`.
    """
    from curate.runs import create_run, write_bytes, write_json
    from curate.runs import run_name as make_run_name
    from curate.saliency.engine import Explainer, explain_with_backoff
    from curate.saliency.targets import TargetSpec

    started = time.perf_counter()
    if threshold_mode not in THRESHOLD_MODES:
        raise SaliencyError(f"threshold mode {threshold_mode!r} is not one of {', '.join(THRESHOLD_MODES)}")
    if label_space not in LABEL_SPACES:
        raise SaliencyError(f"label_space {label_space!r} is not one of {', '.join(LABEL_SPACES)}")
    if batch_size < 1:
        raise SaliencyError(f"batch_size must be >= 1, got {batch_size}")
    spec = TargetSpec.parse(target)
    ds = open_masked_dataset(dataset)
    loaded = resolve_model(model, pretrained, device, precision)
    space = ds.label_space

    # --- which samples
    rows_all = ds.rows() if statuses is None else ds.rows(status=list(statuses))
    if sample_ids is not None:
        wanted = set(sample_ids)
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

    rows: list[dict[str, Any]] = []
    for row in rows_all:
        if row.get("mask_path") is None:
            skip(row, "no_mask")
        elif row.get("class_index") is None and spec.kind == "true":
            skip(row, "no_class")
        else:
            rows.append(row)
    if limit is not None:
        rows = rows[: max(0, int(limit))]

    # --- label space, targets' logits
    if label_space == "present":
        columns = sorted({int(r["class_index"]) for r in rows if r.get("class_index") is not None})
        if not columns:
            raise SaliencyError(f"{ds.root}: no sample with a class and a mask to explain")
    else:
        columns = list(range(len(space)))
    names = {i: space.names[i] for i in columns}
    head_columns = None if loaded.kind != "clip" and columns == list(range(1000)) else columns
    names.update({i: n for i, n in model_class_names(loaded).items() if i in names})
    if class_names:
        names.update({int(i): str(n) for i, n in class_names.items() if int(i) in names})
    classifier = None
    prompt_set = None
    if loaded.kind == "clip":
        from curate.zeroshot import cached_text_classifier

        prompt_set = prompt_set_for(loaded, prompts)
        cache = ds.root / "features" if write else None
        classifier = cached_text_classifier(loaded, [names[c] for c in columns], prompt_set, cache)
    elif len(space) != 1000:
        raise SaliencyError(
            f"{loaded.model_id} scores the 1000 ImageNet-1K classes but {ds.root} uses the label space "
            f"'{space.name}' ({len(space)} classes); explain it with a CLIP (zero-shot over any label space)"
        )
    explainer = Explainer(loaded, method, layer=layer, classifier=classifier, columns=head_columns,
                          **_method_options(method_options, loaded))

    config = {
        "kind": "explain",
        "dataset": str(ds.root),
        "model": loaded.model_id,
        "model_kind": loaded.kind,
        "method": explainer.method,
        "layer": explainer.layer_name,
        "target": str(spec),
        "threshold": threshold,
        "threshold_mode": threshold_mode,
        "label_space": label_space,
        "label_space_name": space.name,
        "num_classes_scored": len(columns),
        "prompts": prompt_set.to_config() if prompt_set is not None else None,
        "normalisation": "relu, min-max per map, bilinear resize to the model input, min-max (pytorch-grad-cam)",
        "batch_size": batch_size,
        "device": str(loaded.device),
        "precision": loaded.precision,
        "statuses": list(statuses) if statuses is not None else None,
        "limit": limit,
        "sample_ids": len(sample_ids) if sample_ids is not None else None,
        "method_options": dict(method_options or {}),
    }
    run_dir: Path | None = None
    if write:
        name = run_name or make_run_name(f"explain-{explainer.method}", loaded.model_id)
        run_dir = create_run(ds.root, name, config, overwrite=overwrite)
        if save_maps:
            (run_dir / "maps").mkdir(exist_ok=True)

    # --- the loop
    size = tuple(loaded.image_size)
    mask_fn = mask_transform or mask_transform_for(loaded.preprocess)
    items = MaskedImages(ds, rows, loaded.preprocess, mask_fn, size)
    loader = torch.utils.data.DataLoader(
        items, batch_size=batch_size, shuffle=False, num_workers=num_workers,
        pin_memory=loaded.device.type == "cuda", collate_fn=collate_masked,
    )
    records: list[dict[str, Any]] = []
    image_info: dict[str, dict[str, Any]] = {}
    nan_counts: Counter = Counter()
    instance_masks = 0
    resized_masks = 0
    kept_maps: dict[str, np.ndarray] = {}
    chunk = batch_size
    done = 0
    for batch in loader:
        good = [j for j, p in enumerate(batch["problem"]) if p in ("", "mask_resized")]
        for j, p in enumerate(batch["problem"]):
            row = rows[batch["index"][j]]
            if p not in ("", "mask_resized"):
                skip(row, p)
            elif p == "mask_resized":
                resized_masks += 1
        instance_masks += sum(bool(batch["instance_ids"][j]) for j in good)
        done += len(batch["problem"])
        if not good:
            if progress:
                progress(done, len(rows))
            continue
        sel = torch.as_tensor(good)
        images = batch["image"].index_select(0, sel)
        masks = batch["mask"].index_select(0, sel).to(loaded.device, non_blocking=True)
        batch_rows = [rows[batch["index"][j]] for j in good]
        labels = [r["class_index"] if r["class_index"] is not None else -1 for r in batch_rows]
        result, chunk = explain_with_backoff(explainer, images, spec, labels if spec.kind == "true" else None,
                                             batch_size=chunk)
        _score_batch(result, masks, batch_rows, threshold, threshold_mode, records, image_info, nan_counts, names)
        if save_maps or keep_maps:
            maps_cpu = result.maps.to(torch.float16).cpu().numpy()
            classes = result.target_classes.cpu().numpy()
            masks_cpu = masks.cpu().numpy()
            for j, row in enumerate(batch_rows):
                if keep_maps:
                    kept_maps[row["sample_id"]] = maps_cpu[j]
                if save_maps and run_dir is not None:
                    import io

                    buffer = io.BytesIO()
                    np.savez_compressed(buffer, maps=maps_cpu[j], mask=masks_cpu[j], targets=classes[j])
                    write_bytes(run_dir / "maps" / f"{row['sample_id']}.npz", buffer.getvalue())
        if progress:
            progress(done, len(rows))
    if instance_masks:
        logger.warning("%d masks hold values other than 0/1 (instance ids, 0/255): every non-zero pixel counted as "
                       "the object",
                       instance_masks)
    if resized_masks:
        logger.warning("%d masks were not the size of their image and were resized to it (same aspect ratio)",
                       resized_masks)

    seconds = time.perf_counter() - started
    predictions = _predictions_table(records)
    images_table = _images_table(records, image_info)
    split = _split_kind(image_info)
    summary = _summary(records, image_info, split, config, nan_counts, skipped, skipped_samples,
                       instance_masks, resized_masks, seconds, chunk)
    classes_table = _classes_table(records, image_info, split, names)
    if run_dir is not None:
        import pyarrow.parquet as pq

        for file_name, table in (("predictions.parquet", predictions), ("images.parquet", images_table),
                                 ("classes.parquet", classes_table)):
            sink = pa.BufferOutputStream()
            pq.write_table(table, sink)
            write_bytes(run_dir / file_name, sink.getvalue().to_pybytes())
        write_json(run_dir / "summary.json", summary)
        ds.record_provenance("explain", {"run": run_dir.name, "model": loaded.model_id, "method": explainer.method,
                                         "layer": explainer.layer_name, "target": str(spec)})
    logger.info("explained %d images (%d predictions) in %.1f s", len(image_info), len(records), seconds)
    return ExplainResult(run_dir, predictions, images_table, classes_table, summary, kept_maps)


def _method_options(options: Mapping[str, Any] | None, model: "LoadedModel") -> dict[str, Any]:
    out = dict(options or {})
    if "inner_batch_size" not in out:
        out["inner_batch_size"] = 128 if model.device.type == "cuda" else 16
    return out


def _score_batch(result: SaliencyResult, masks: torch.Tensor, rows: list[dict[str, Any]], threshold: float | None,
                 mode: str, records: list[dict[str, Any]], image_info: dict[str, dict[str, Any]],
                 nan_counts: Counter, names: Mapping[int, str]) -> None:
    n, k, h, w = result.maps.shape
    scores = spuriousity_scores(result.maps.reshape(n * k, h, w), masks.repeat_interleave(k, dim=0),
                                threshold, mode)
    sss = scores.sss.float().cpu().numpy().reshape(n, k)
    rma = scores.rma.float().cpu().numpy().reshape(n, k)
    codes = scores.reasons.cpu().numpy().reshape(n, k)
    flat = result.flat.cpu().numpy()
    fraction = masks.flatten(1).float().mean(dim=1).cpu().numpy()
    targets = result.target_classes.cpu().numpy()
    target_scores = result.target_scores.cpu().numpy()
    predicted = result.predicted_classes.cpu().numpy()
    for i, row in enumerate(rows):
        sid = row["sample_id"]
        extra = row_extra(row)
        aligned = extra.get("aligned")
        true = row.get("class_index")
        correct = None if true is None else bool(int(predicted[i]) == int(true))
        image_info[sid] = {
            "sample_id": sid,
            "class_index": true,
            "class_name": row.get("class_name"),
            "group": row.get("group"),
            "background": row.get("background"),
            "aligned": bool(aligned) if isinstance(aligned, bool) else None,
            "predicted_index": int(predicted[i]),
            "correct": correct,
            "mask_fraction": float(fraction[i]),
        }
        for j in range(k):
            code = int(codes[i, j])
            reason = None if code < 0 else NAN_REASONS[code]
            if reason == "zero_map" and bool(flat[i, j]):
                reason = CONSTANT_MAP
            if reason is not None:
                nan_counts[reason] += 1
            info = image_info[sid]
            records.append({
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
    if any(info.get("group") in ("easy", "hard") for info in image_info.values()):
        return "group"
    if any(info.get("aligned") is not None for info in image_info.values()):
        return "aligned"
    return None


def _split_value(info: Mapping[str, Any], split: str | None) -> str | None:
    if split == "group":
        return info.get("group") if info.get("group") in ("easy", "hard") else None
    if split == "aligned":
        value = info.get("aligned")
        return None if value is None else ("aligned" if value else "conflicting")
    return None


def _predictions_table(records: list[dict[str, Any]]) -> pa.Table:
    schema = pa.schema([
        ("sample_id", pa.string()), ("class_index", pa.int32()), ("target_rank", pa.int32()),
        ("target_index", pa.int32()), ("target_name", pa.string()), ("target_score", pa.float32()),
        ("predicted_index", pa.int32()), ("correct", pa.bool_()), ("group", pa.string()), ("background", pa.string()),
        ("aligned", pa.bool_()), ("mask_fraction", pa.float64()), ("sss", pa.float64()), ("rma", pa.float64()),
        ("nan_reason", pa.string()),
    ])
    return pa.Table.from_pylist(records, schema=schema)


def _image_rows(records: list[dict[str, Any]], image_info: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    by_image: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_image.setdefault(rec["sample_id"], []).append(rec)
    out = []
    for sid, info in image_info.items():
        recs = by_image.get(sid, [])
        sss = mean_stat([r["sss"] for r in recs])
        rma = mean_stat([r["rma"] for r in recs])
        out.append({**info, "n_predictions": len(recs), "n_nan": sss.n_nan, "sss": sss.mean, "rma": rma.mean,
                    "sss_uniform": 1.0 - info["mask_fraction"]})
    return out


def _images_table(records: list[dict[str, Any]], image_info: Mapping[str, Mapping[str, Any]]) -> pa.Table:
    schema = pa.schema([
        ("sample_id", pa.string()), ("class_index", pa.int32()), ("class_name", pa.string()), ("group", pa.string()),
        ("background", pa.string()), ("aligned", pa.bool_()), ("predicted_index", pa.int32()),
        ("correct", pa.bool_()), ("mask_fraction", pa.float64()), ("n_predictions", pa.int32()),
        ("n_nan", pa.int32()), ("sss", pa.float64()), ("rma", pa.float64()), ("sss_uniform", pa.float64()),
    ])
    return pa.Table.from_pylist(_image_rows(records, image_info), schema=schema)


def _classes_table(records: list[dict[str, Any]], image_info: Mapping[str, Mapping[str, Any]], split: str | None,
                   names: Mapping[int, str]) -> pa.Table:
    subsets: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rec in records:
        info = image_info[rec["sample_id"]]
        keys = ["all"]
        part = _split_value(info, split)
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
    schema = pa.schema([
        ("class_index", pa.int32()), ("class_name", pa.string()), ("subset", pa.string()), ("n", pa.int32()),
        ("n_nan", pa.int32()), ("sss", pa.float64()), ("sss_std", pa.float64()), ("rma", pa.float64()),
        ("rma_std", pa.float64()),
    ])
    return pa.Table.from_pylist(rows, schema=schema)


def _summary(records, image_info, split, config, nan_counts, skipped, skipped_samples, instance_masks,
             resized_masks, seconds, chunk) -> dict[str, Any]:
    image_ids = [r["sample_id"] for r in records]
    class_ids = [r["target_index"] for r in records]
    image_class = {sid: info.get("class_index") for sid, info in image_info.items()}
    groups = {sid: _split_value(info, split) for sid, info in image_info.items()} if split else None
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
    if split:
        for part in SPLIT_ORDER[split]:
            if part in scores["sss"].get("by_group", {}):
                by_group[part] = {
                    "sss": scores["sss"]["by_group"][part],
                    "rma": scores["rma"]["by_group"][part],
                    "sss_uniform": uniform_mean(lambda sid, part=part: groups.get(sid) == part),
                }
    by_correct = {}
    for part in ("correct", "wrong"):
        if part in scores["sss"].get("by_correct", {}):
            by_correct[part] = {"sss": scores["sss"]["by_correct"][part], "rma": scores["rma"]["by_correct"][part]}
    accuracy = [v for v in correct.values() if v is not None]
    return {
        "config": config,
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
        "nan": {"count": int(sum(nan_counts.values())), "reasons": dict(nan_counts)},
        "skipped": {"count": int(sum(skipped.values())), "reasons": dict(skipped), "samples": skipped_samples},
        "masks": {"non_binary": instance_masks, "resized": resized_masks},
        "timing": {"seconds": round(seconds, 3), "images_per_second": round(len(image_info) / seconds, 2)
                   if seconds > 0 else None, "final_batch_size": chunk},
    }


def compact_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Mean SSS / RMA per group (per-image means), overall, and NaN/skip counts, from a summary."""
    groups = {}
    for part, entry in summary.get("by_group", {}).items():
        groups[part] = {
            "sss": entry["sss"]["mean"], "rma": entry["rma"]["mean"], "n": entry["sss"]["n"],
            "n_nan": entry["sss"]["n_nan"], "sss_balanced": entry["sss"]["balanced"],
            "sss_uniform": entry.get("sss_uniform"),
        }
    overall = summary["overall"]
    config = summary.get("config", {})
    return {
        "split": summary.get("split"),
        "model": config.get("model"),
        "method": config.get("method"),
        "layer": config.get("layer"),
        "target": config.get("target"),
        "groups": groups,
        "overall": {"sss": overall["sss"]["per_image"]["mean"], "rma": overall["rma"]["per_image"]["mean"],
                    "n": overall["sss"]["per_image"]["n"], "sss_uniform": overall.get("sss_uniform")},
        "accuracy": summary.get("accuracy"),
        "nan": summary["nan"]["count"],
        "skipped": summary["skipped"]["count"],
        "seconds": summary["timing"]["seconds"],
    }


def summarize_by_group(
    dataset: "Dataset | str | Path",
    model: "LoadedModel | str | Path",
    *,
    method: str = "gradcam",
    target: str = "true",
    label_space: str = "present",
    batch_size: int = 64,
    device: Any = None,
    run_name: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Mean SSS and RMA for easy vs hard images (or aligned vs conflicting on a synthetic world).

    Runs :func:`explain_dataset` (writing a run folder only when ``run_name`` is given) and returns::

        {"split": "group" | "aligned" | None, "model": ..., "method": ..., "layer": ..., "target": ...,
         "groups": {"easy": {"sss", "rma", "n", "n_nan", "sss_balanced", "sss_uniform"}, "hard": {...}},
         "overall": {"sss", "rma", "n", "sss_uniform"}, "accuracy": ..., "nan": ..., "skipped": ..., "seconds": ...}

    ``sss``/``rma`` are means over images of the per-image scores (papers/004 §3.2);
    ``sss_uniform`` is the SSS a uniform map would get (1 - mask area), the chance level.
    Without a ``group`` column, samples whose ``extra`` records ``aligned`` (the synthetic
    world: background = the class's common one) split into aligned / conflicting.
    """
    result = explain_dataset(dataset, model, method=method, target=target, label_space=label_space,
                             batch_size=batch_size, device=device, run_name=run_name, write=run_name is not None,
                             **options)
    return result.by_group()


def saliency_maps(
    model: "LoadedModel",
    images: "torch.Tensor | Sequence[Any]",
    *,
    method: str = "gradcam",
    target: str = "true",
    labels: "Sequence[int] | torch.Tensor | None" = None,
    layer: str | None = None,
    classifier: torch.Tensor | None = None,
    columns: Sequence[int] | None = None,
    batch_size: int = 32,
    **options: Any,
) -> SaliencyResult:
    """Maps for a batch of images: a tensor already preprocessed ``(N, 3, H, W)`` or PIL images.

    A thin wrapper over :class:`curate.saliency.Explainer` (see it for the arguments); batches
    of ``batch_size``, halved on out-of-memory.
    """
    from curate.saliency.engine import Explainer, explain_with_backoff

    if not isinstance(images, torch.Tensor):
        images = model.preprocess_images(list(images))
    explainer = Explainer(model, method, layer=layer, classifier=classifier, columns=columns, **options)
    return explain_with_backoff(explainer, images, target, labels, batch_size=batch_size)[0]

