"""Zero-shot text classifiers (DESIGN.md "Definitions"; papers/003 App. C, CLIP §3.1.4).

For label c and templates t_1..t_T, ``w_c = normalize(mean_j normalize(g(t_j(c))))`` where g is
the text tower; the classifier is ``W = [w_1 .. w_C]`` and the logits of an image embedding f
are ``100 * normalize(f) @ W^T``. This is what CLIP_benchmark computes class by class; here all
C x T prompts go through the text tower in large batches (one pass, no per-class loop), and
the result is cached on disk per (model id, label space, prompts).
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from curate.zeroshot.prompts import PromptSet

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
    key = classifier_key(model.model_id, class_names, prompts)
    record = {"model_id": model.model_id, "labels": list(class_names), "templates": list(prompts.templates),
              "version": CLASSIFIER_CACHE_VERSION}
    return Path(cache_dir) / f"text-{key}.pt", record


def load_cached_text_classifier(model, class_names: Sequence[str], prompts: PromptSet, cache_dir: Path | None) -> torch.Tensor | None:
    """The cached classifier for exactly these labels and prompts, or None (never builds)."""
    if cache_dir is None or not getattr(model, "cache_safe", True):
        return None
    path, record = _cache_entry(model, class_names, prompts, cache_dir)
    if not path.exists():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a torn or foreign file is rebuilt
        logger.warning("cannot read text classifier cache %s (%s); rebuilding", path, error)
        return None
    if payload.get("record") != record:
        logger.warning("text classifier cache %s was built for something else; rebuilding", path)
        return None
    return payload["weights"]


def cached_text_classifier(
    model, class_names: Sequence[str], prompts: PromptSet, cache_dir: Path | None, *, batch_size: int = 1024
) -> torch.Tensor:
    """:func:`build_text_classifier` with an on-disk cache under ``cache_dir`` (None: no cache).

    The file records the model id, label names and templates it was built from; a file whose
    record differs (another model, edited labels, an older format) is rebuilt, never reused.
    Models with random unseeded weights (``cache_safe`` False) are never cached.
    """
    if cache_dir is None or not getattr(model, "cache_safe", True):
        return build_text_classifier(model, class_names, prompts, batch_size=batch_size)
    cached = load_cached_text_classifier(model, class_names, prompts, cache_dir)
    if cached is not None:
        return cached
    path, record = _cache_entry(model, class_names, prompts, cache_dir)
    weights = build_text_classifier(model, class_names, prompts, batch_size=batch_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"record": record, "weights": weights}, tmp)
    tmp.replace(path)
    return weights


def classifier_for_labels(
    model, all_names: Sequence[str], labels: Sequence[int] | None, prompts: PromptSet, cache_dir: Path | None,
    *, batch_size: int = 1024,
) -> torch.Tensor:
    """Rows of the text classifier for ``labels`` (indices into ``all_names``; None = all).

    Reuses a cached classifier of the whole label space when there is one (slicing its rows);
    otherwise builds (and caches) only the rows asked for, so scoring a 1-vs-20 or a subset
    label space with new prompts encodes 20 or 100 labels' prompts, not 1000.
    """
    if labels is None:
        return cached_text_classifier(model, all_names, prompts, cache_dir, batch_size=batch_size)
    labels = [int(i) for i in labels]
    full = load_cached_text_classifier(model, all_names, prompts, cache_dir)
    if full is not None:
        return full[labels]
    return cached_text_classifier(model, [all_names[i] for i in labels], prompts, cache_dir, batch_size=batch_size)


def zero_shot_logits(image_features: torch.Tensor, classifier: torch.Tensor) -> torch.Tensor:
    """``100 * normalize(f) @ W^T`` (the CLIP zero-shot logits)."""
    return LOGIT_SCALE * F.normalize(image_features.float(), dim=-1) @ classifier.t().to(image_features.device)
