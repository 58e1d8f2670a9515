"""Saliency maps for CLIPs and classifiers, batched on the device, and SSS/RMA over a dataset.

>>> from curate.models import load_model
>>> from curate.saliency import Explainer, clip_classifier, saliency_maps
>>> clip = load_model("curate-tiny-vit", seed=0)
>>> W = clip_classifier(clip, ["ice bear", "lion"])             # zero-shot targets (C, D)
>>> result = saliency_maps(clip, images, method="gradcam", classifier=W, labels=[0, 1])
>>> result.maps.shape                                            # (N, K, H, W) on the device

>>> from curate.saliency import explain_dataset, summarize_by_group
>>> res = explain_dataset("world/", clip, method="layercam", target="topk:3", run_name="lc")
>>> summarize_by_group("world/", "ref.pt")     # {"split": "aligned", "groups": {...}, ...}

Modules: :mod:`.methods` (formulas and the method table), :mod:`.layers` (default layers, token
layouts), :mod:`.targets` (``true`` / ``predicted`` / ``topk:K``, zero-shot logits),
:mod:`.engine` (:class:`Explainer`), :mod:`.attention` (rollout), :mod:`.masks` (masks through the
model's preprocessing), :mod:`.explain` (datasets, run folders, summaries).

Names load lazily: importing ``curate.saliency`` does not import torch.
"""
# ruff: noqa: F401  (the TYPE_CHECKING imports below are for type checkers; names load lazily)
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "Explainer": "curate.saliency.engine",
    "explain_with_backoff": "curate.saliency.engine",
    "frozen_parameters": "curate.saliency.engine",
    "SaliencyError": "curate.saliency.base",
    "SaliencyResult": "curate.saliency.base",
    "TargetIgnoredWarning": "curate.saliency.base",
    "UnknownLayerError": "curate.saliency.base",
    "METHODS": "curate.saliency.methods",
    "MethodInfo": "curate.saliency.methods",
    "method_info": "curate.saliency.methods",
    "default_layer": "curate.saliency.layers",
    "layer_candidates": "curate.saliency.layers",
    "resolve_layer": "curate.saliency.layers",
    "TargetSpec": "curate.saliency.targets",
    "clip_classifier": "curate.saliency.targets",
    "mask_transform_for": "curate.saliency.masks",
    "ExplainResult": "curate.saliency.explain",
    "explain_dataset": "curate.saliency.explain",
    "summarize_by_group": "curate.saliency.explain",
    "saliency_maps": "curate.saliency.explain",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:  # pragma: no cover
    from curate.saliency.base import (
        SaliencyError,
        SaliencyResult,
        TargetIgnoredWarning,
        UnknownLayerError,
    )
    from curate.saliency.engine import (
        Explainer,
        explain_with_backoff,
        frozen_parameters,
    )
    from curate.saliency.explain import (
        ExplainResult,
        explain_dataset,
        saliency_maps,
        summarize_by_group,
    )
    from curate.saliency.layers import default_layer, layer_candidates, resolve_layer
    from curate.saliency.masks import mask_transform_for
    from curate.saliency.methods import METHODS, MethodInfo, method_info
    from curate.saliency.targets import TargetSpec, clip_classifier


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'curate.saliency' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
