"""Batch norm folded into the convolution before it: the same function, fewer passes over memory.

In eval mode a ``BatchNorm2d`` after a convolution is an affine map per channel, so it can be
folded into the convolution's weights (the standard inference rewrite, e.g. PyTorch's
``torch.fx.experimental.optimization.fuse``). With ``s = gamma / sqrt(running_var + eps)``:

    W' = W * s (per output channel),   b' = (b - running_mean) * s + beta

and the batch norm becomes the identity (timm's ``BatchNormAct2d``, batch norm + dropout +
activation in one module, keeps its dropout and activation). On a CPU this removes a full read
and write of every activation per batch norm: EfficientNet-Lite0 (49 pairs), 2 cores, 24 ->
14 ms an image (``benchmarks/classifier.py``).

Which pairs: the data flow, not the module order, decides. The module is traced with
``torch.fx`` (convolutions and batch norms as leaves); a batch norm whose only input is a
convolution's output, that convolution's only user, each called once, is folded. The rewrite
is then checked: the folded copy must give the original's outputs on a random batch (largest
difference at most 1e-4 of the largest output, plus 1e-5); a model that cannot be traced, or
fails the check, is left as it was. The original module is never changed: the folded one is a
copy, so gradients (saliency, FullGrad's per-layer biases) still see the model as it was built.
"""
from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["conv_bn_pairs", "fold_batchnorm"]

logger = logging.getLogger(__name__)


def conv_bn_pairs(module: torch.nn.Module) -> list[tuple[str, str]]:
    """``(convolution name, batch norm name)`` pairs that can be folded (module docstring);
    raises whatever ``torch.fx`` raises on a module it cannot trace."""
    import torch.fx as fx
    from torch import nn

    class Leaves(fx.Tracer):
        def is_leaf_module(self, m: nn.Module, name: str) -> bool:
            return isinstance(m, (nn.Conv2d, nn.BatchNorm2d)) or super().is_leaf_module(m, name)

    graph = Leaves().trace(module)
    modules = dict(module.named_modules())
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not isinstance(modules[node.target], nn.BatchNorm2d) or len(node.args) != 1:
            continue
        source = node.args[0]
        if (not isinstance(source, fx.Node) or source.op != "call_module"
                or not isinstance(modules[source.target], nn.Conv2d)):
            continue
        if len(source.users) == 1 and calls[source.target] == 1 and calls[node.target] == 1:
            pairs.append((str(source.target), str(node.target)))
    return pairs


def _replacement(bn: torch.nn.Module) -> torch.nn.Module | None:
    """What a folded batch norm becomes: the identity, or a ``BatchNormAct2d``'s dropout + activation."""
    from torch import nn

    if type(bn) is nn.BatchNorm2d:
        return nn.Identity()
    if isinstance(getattr(bn, "drop", None), nn.Module) and isinstance(getattr(bn, "act", None), nn.Module):
        return nn.Sequential(bn.drop, bn.act)
    return None


def _fold_pair(model: torch.nn.Module, conv_name: str, bn_name: str) -> bool:
    import torch
    from torch import nn

    conv, bn = model.get_submodule(conv_name), model.get_submodule(bn_name)
    replacement = _replacement(bn)
    if replacement is None or bn.training or bn.running_mean is None or bn.running_var is None:
        return False
    with torch.no_grad():
        scale = torch.rsqrt(bn.running_var + bn.eps)
        if bn.weight is not None:
            scale = scale * bn.weight
        bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
        bias = (bias - bn.running_mean) * scale + (bn.bias if bn.bias is not None else 0)
        conv.weight = nn.Parameter(conv.weight * scale.reshape(-1, 1, 1, 1), requires_grad=False)
        conv.bias = nn.Parameter(bias, requires_grad=False)
    parent, _, attr = bn_name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, replacement)
    return True


def fold_batchnorm(module: torch.nn.Module, example: torch.Tensor) -> tuple[torch.nn.Module, int]:
    """A copy of ``module`` (in eval mode) with its foldable batch norms folded, and how many were;
    ``(module, 0)`` itself when none can be, the trace fails, or the copy's outputs on ``example``
    differ from the original's (module docstring)."""
    import torch

    if not any(isinstance(m, torch.nn.BatchNorm2d) for m in module.modules()):
        return module, 0  # nothing to fold (a ViT): no trace
    try:
        pairs = conv_bn_pairs(module)
    except Exception as error:  # noqa: BLE001 - tracing is best effort: the model then runs as built
        logger.debug("batch norm folding skipped: %s is not traceable (%s)", type(module).__name__, error)
        return module, 0
    if not pairs:
        return module, 0
    folded = copy.deepcopy(module)
    count = sum(_fold_pair(folded, conv, bn) for conv, bn in pairs)
    if not count:
        return module, 0
    with torch.no_grad():
        want, got = module(example), folded(example)
    scale = float(want.abs().max()) if want.numel() else 0.0
    if want.shape != got.shape or not float((want - got).abs().max()) <= 1e-4 * scale + 1e-5:
        logger.warning("batch norm folding changed %s's outputs; it runs unfolded", type(module).__name__)
        return module, 0
    return folded, count
