"""Zero-shot text classifiers (DESIGN.md "Definitions"; papers/003 App. C, CLIP §3.1.4).

For label c and templates t_1..t_T, ``w_c = normalize(mean_j normalize(g(t_j(c))))`` where g is
the text tower; the classifier is ``W = [w_1 .. w_C]`` and the logits of an image embedding f
are ``100 * normalize(f) @ W^T``. This is what CLIP_benchmark computes class by class; here all
C x T prompts go through the text tower in large batches (one pass, no per-class loop), and
the result is cached on disk per (model id, label space, prompts): ``text-<key>.npy`` (W, float32)
beside ``text-<key>.json`` (what it was built from), so a cache hit needs numpy only and a
re-scoring run imports no torch (``docs/design.md#speed``). Entries of the older ``text-<key>.pt``
format (``torch.save``) are still read, which imports torch once.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from curate.jsonio import write_json
from curate.store.atomic import atomic_write_beside
from curate.zeroshot.prompts import PromptSet

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

LOGIT_SCALE = 100.0
CLASSIFIER_CACHE_VERSION = 1


def build_text_classifier(
    model, class_names: Sequence[str], prompts: PromptSet, *, batch_size: int = 1024
) -> torch.Tensor:
    """``W`` of shape (C, D), float32 on CPU: the averaged, normalised prompt embeddings.

    Args:
        model: a :class:`curate.models.LoadedModel` with a text tower.
        class_names: the label space's names, in index order (duplicates allowed: identity is
            the index, ImageNet has two "missile" and two "sunglasses").
        prompts: the templates.
        batch_size: prompts per text-tower pass.
    """
    import torch.nn.functional as F

    texts = [template.format(name) for name in class_names for template in prompts.templates]
    embeddings = model.encode_text(texts, normalize=True, batch_size=batch_size).float().cpu()
    per_class = embeddings.view(len(class_names), len(prompts.templates), -1).mean(dim=1)
    return F.normalize(per_class, dim=-1)


def classifier_key(model_id: str, class_names: Sequence[str], prompts: PromptSet) -> str:
    """A content key: model id + the exact label names + the exact templates."""
    blob = json.dumps({"model": model_id, "labels": list(class_names), "templates": list(prompts.templates),
                       "version": CLASSIFIER_CACHE_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _cache_entry(model, class_names: Sequence[str], prompts: PromptSet, cache_dir: Path) -> tuple[Path, dict]:
    """``(cache_dir/text-<key>, record)``; the entry is ``<base>.npy`` + ``<base>.json`` (older: ``<base>.pt``)."""
    key = classifier_key(model.model_id, class_names, prompts)
    record = {"model_id": model.model_id, "labels": list(class_names), "templates": list(prompts.templates),
              "version": CLASSIFIER_CACHE_VERSION}
    return Path(cache_dir) / f"text-{key}", record


def _read_npy_entry(base: Path, record: dict) -> np.ndarray | None:
    meta, values = base.with_suffix(".json"), base.with_suffix(".npy")
    if not (meta.exists() and values.exists()):
        return None
    try:
        if json.loads(meta.read_text()).get("record") != record:
            logger.warning("text classifier cache %s was built for something else; rebuilding", values)
            return None
        weights = np.load(values, allow_pickle=False)
        if weights.dtype != np.float32 or weights.ndim != 2 or weights.shape[0] != len(record["labels"]):
            raise ValueError(f"array of shape {weights.shape} and type {weights.dtype} for {len(record['labels'])} labels")
        return weights
    except Exception as error:  # a torn or foreign file is rebuilt
        logger.warning("cannot read text classifier cache %s (%s); rebuilding", values, error)
        return None


def _read_pt_entry(base: Path, record: dict) -> np.ndarray | None:
    """The older ``torch.save`` format (imports torch; only for caches written before the .npy format)."""
    path = base.with_suffix(".pt")
    if not path.exists():
        return None
    import torch

    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a torn or foreign file is rebuilt
        logger.warning("cannot read text classifier cache %s (%s); rebuilding", path, error)
        return None
    if payload.get("record") != record:
        logger.warning("text classifier cache %s was built for something else; rebuilding", path)
        return None
    return payload["weights"].float().numpy()


def _load_cached(model, class_names: Sequence[str], prompts: PromptSet, cache_dir: Path | None) -> np.ndarray | None:
    if cache_dir is None or not getattr(model, "cache_safe", True):
        return None
    base, record = _cache_entry(model, class_names, prompts, cache_dir)
    found = _read_npy_entry(base, record)
    if found is not None:
        return found
    found = _read_pt_entry(base, record)
    if found is not None:  # rewritten in the new format, so only the first re-score imports torch
        _write_entry(base, record, found)
    return found


def _write_entry(base: Path, record: dict, weights: np.ndarray) -> np.ndarray:
    """Write ``<base>.npy`` then ``<base>.json`` (each atomically; an interrupted write is a miss)."""
    array = np.ascontiguousarray(weights, dtype=np.float32)
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    atomic_write_beside(base.with_suffix(".npy"), buffer.getvalue())
    write_json(base.with_suffix(".json"), {"record": record, "shape": list(array.shape)})
    return array


def _as(weights: np.ndarray, numpy: bool):
    if numpy:
        return weights
    import torch

    return torch.from_numpy(weights)


def load_cached_text_classifier(model, class_names: Sequence[str], prompts: PromptSet, cache_dir: Path | None,
                                *, numpy: bool = False) -> torch.Tensor | np.ndarray | None:
    """The cached classifier for exactly these labels and prompts, or None (never builds).

    ``numpy=True`` returns a float32 array and, on a hit in the ``.npy`` format, imports no torch."""
    found = _load_cached(model, class_names, prompts, cache_dir)
    return None if found is None else _as(found, numpy)


def cached_text_classifier(
    model, class_names: Sequence[str], prompts: PromptSet, cache_dir: Path | None, *, batch_size: int = 1024,
    numpy: bool = False,
) -> torch.Tensor | np.ndarray:
    """:func:`build_text_classifier` with an on-disk cache under ``cache_dir`` (None: no cache).

    The entry records the model id, label names and templates it was built from; an entry whose
    record differs (another model, edited labels, an older format) is rebuilt, never reused.
    Models with random unseeded weights (``cache_safe`` False) are never cached. The array is
    written before its record (each atomically), so an interrupted write is a miss, never a
    wrong hit. ``numpy=True`` returns a float32 array (a torch tensor otherwise).
    """
    if cache_dir is None or not getattr(model, "cache_safe", True):
        built = build_text_classifier(model, class_names, prompts, batch_size=batch_size)
        return built.numpy() if numpy else built
    cached = _load_cached(model, class_names, prompts, cache_dir)
    if cached is not None:
        return _as(cached, numpy)
    base, record = _cache_entry(model, class_names, prompts, cache_dir)
    weights = build_text_classifier(model, class_names, prompts, batch_size=batch_size)
    array = _write_entry(base, record, weights.numpy())
    return array if numpy else weights


def classifier_for_labels(
    model, all_names: Sequence[str], labels: Sequence[int] | None, prompts: PromptSet, cache_dir: Path | None,
    *, batch_size: int = 1024, numpy: bool = False,
) -> torch.Tensor | np.ndarray:
    """Rows of the text classifier for ``labels`` (indices into ``all_names``; None = all).

    Reuses a cached classifier of the whole label space when there is one (slicing its rows);
    otherwise builds (and caches) only the rows asked for, so scoring a 1-vs-20 or a subset
    label space with new prompts encodes 20 or 100 labels' prompts, not 1000. ``numpy`` as in
    :func:`cached_text_classifier`.
    """
    if labels is None:
        return cached_text_classifier(model, all_names, prompts, cache_dir, batch_size=batch_size, numpy=numpy)
    labels = [int(i) for i in labels]
    full = _load_cached(model, all_names, prompts, cache_dir)
    if full is not None:
        return _as(np.ascontiguousarray(full[labels]), numpy)
    return cached_text_classifier(model, [all_names[i] for i in labels], prompts, cache_dir, batch_size=batch_size,
                                  numpy=numpy)


def zero_shot_logits(image_features, classifier):
    """``100 * normalize(f) @ W^T`` (the CLIP zero-shot logits, :data:`LOGIT_SCALE`).

    Two numpy arrays give a float32 numpy array (no torch: the re-scoring path); torch tensors
    give a tensor on the image features' device. The numpy path equals the torch one within
    1e-5 (tests/test_rescore.py); ``normalize`` divides by ``max(||f||, 1e-12)`` as
    ``torch.nn.functional.normalize`` does.
    """
    if isinstance(image_features, np.ndarray):
        f = np.asarray(image_features, dtype=np.float32)
        f = f / np.maximum(np.linalg.norm(f, axis=-1, keepdims=True), np.float32(1e-12))
        return (np.float32(LOGIT_SCALE) * f) @ np.asarray(classifier, dtype=np.float32).T
    import torch.nn.functional as F

    return LOGIT_SCALE * F.normalize(image_features.float(), dim=-1) @ classifier.t().to(image_features.device)
