"""Saliency maps for CLIPs and classifiers, batched on the device.

>>> from curate.models import load_model
>>> from curate.saliency import Explainer, TopK, clip_classifier, saliency_maps
>>> clip = load_model("curate-tiny-vit", seed=0)
>>> W = clip_classifier(clip, ["ice bear", "lion"])             # zero-shot targets (C, D)
>>> result = saliency_maps(clip, images, method="gradcam", classifier=W, labels=[0, 1])
>>> result.maps.shape                                            # (N, K, H, W) on the device
>>> Explainer(clip, "layercam", classifier=W).explain(images, TopK(2)).maps.shape   # (N, 2, H, W)

SSS and RMA over a dataset folder are the explain stage's (:mod:`curate.stages.explain`):

>>> from curate.stages.explain import ExplainSettings, explain
>>> run = explain("world/", "ref.pt", ExplainSettings(method="layercam", target="topk:3"), run_name="lc")
>>> run.by_group()                  # {"split": "aligned", "groups": {...}, "nan_reasons": {...}, ...}

Modules: :mod:`.registry` (the method table, torch-free), :mod:`.methods` (formulas),
:mod:`.layers` (default layers, token layouts), :mod:`.targets` (``TrueClass`` / ``Predicted`` /
``TopK``, zero-shot logits), :mod:`.engine` (:class:`Explainer`), :mod:`.attention` (rollout),
:mod:`.masks` (masks through the model's preprocessing), :mod:`.inputs` (masked images of a
dataset, shared with ``curate fidelity``).

Names load lazily: importing ``curate.saliency`` (or :mod:`.registry`) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "Explainer": "curate.saliency.engine",
    "explain_with_backoff": "curate.saliency.engine",
    "frozen_parameters": "curate.saliency.engine",
    "saliency_maps": "curate.saliency.engine",
    "SaliencyError": "curate.saliency.base",
    "SaliencyResult": "curate.saliency.base",
    "TargetIgnoredWarning": "curate.saliency.base",
    "UnknownLayerError": "curate.saliency.base",
    "METHODS": "curate.saliency.registry",
    "MethodInfo": "curate.saliency.registry",
    "method_info": "curate.saliency.registry",
    "method_names": "curate.saliency.registry",
    "default_layer": "curate.saliency.layers",
    "layer_candidates": "curate.saliency.layers",
    "resolve_layer": "curate.saliency.layers",
    "Target": "curate.saliency.targets",
    "TrueClass": "curate.saliency.targets",
    "Predicted": "curate.saliency.targets",
    "TopK": "curate.saliency.targets",
    "parse_target": "curate.saliency.targets",
    "clip_classifier": "curate.saliency.targets",
    "mask_transform_for": "curate.saliency.masks",
}

__all__ = [
    "METHODS",
    "Explainer",
    "MethodInfo",
    "Predicted",
    "SaliencyError",
    "SaliencyResult",
    "Target",
    "TargetIgnoredWarning",
    "TopK",
    "TrueClass",
    "UnknownLayerError",
    "clip_classifier",
    "default_layer",
    "explain_with_backoff",
    "frozen_parameters",
    "layer_candidates",
    "mask_transform_for",
    "method_info",
    "method_names",
    "parse_target",
    "resolve_layer",
    "saliency_maps",
]  # = sorted(_LAZY)

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
        saliency_maps,
    )
    from curate.saliency.layers import default_layer, layer_candidates, resolve_layer
    from curate.saliency.masks import mask_transform_for
    from curate.saliency.registry import METHODS, MethodInfo, method_info, method_names
    from curate.saliency.targets import (
        Predicted,
        Target,
        TopK,
        TrueClass,
        clip_classifier,
        parse_target,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'curate.saliency' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
