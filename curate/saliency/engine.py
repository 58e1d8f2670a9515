"""Batched saliency maps: one :class:`Explainer` per (model, method, layer, label space).

Why not call pytorch-grad-cam per image (what SemScore does)? It runs one forward and one
full ``backward()`` (parameter gradients included) per image and target, copies activations
and gradients to numpy on the host, and resizes with OpenCV there. Here, for a whole batch:

- the parameters are frozen for the duration of a call and the target layer's output is cut
  from the graph (a leaf that requires grad), so autograd records and differentiates only the
  part of the network above the layer, and computes no parameter gradients;
- ``K`` targets per image (``topk:K``) share one forward pass: ``torch.autograd.grad`` is
  called K times on the retained graph, each for all images at once (the images of a batch
  are independent in eval mode, so ``d sum_n y_n / d A_n = d y_n / d A_n``);
- gradient-free methods (ScoreCAM, AblationCAM) batch their many masked/ablated forward passes
  across channels *and* images (``inner_batch_size`` per pass), reading all K targets from each;
- maps are resized and normalised on the device; nothing leaves it until the caller reduces
  them (:func:`curate.metrics.spuriousity.spuriousity_scores` runs on the device too).

Equivalence with pytorch-grad-cam (same layer, same target, after min-max normalisation) is
tested for GradCAM, GradCAM++, XGradCAM, LayerCAM, EigenCAM (sign-corrected), ScoreCAM,
AblationCAM and FullGrad.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from curate.saliency.attention import attention_geometry, record_attention, rollout
from curate.saliency.base import (
    SaliencyError,
    SaliencyResult,
    TargetIgnoredWarning,
    free_device_memory,
    is_oom,
    warn_once,
)
from curate.saliency.layers import (
    DEFAULT_MIN_GRID,
    Layout,
    default_layer,
    detect_layout,
    is_vit,
    resolve_layer,
    vision_tower,
)
from curate.saliency.methods import GRADIENT_CAMS, eigencam, eigengradcam, finish_maps
from curate.saliency.registry import method_info
from curate.saliency.targets import ScoreHead, Target, parse_target

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self

    from curate.models.base import LoadedModel

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def frozen_parameters(module: nn.Module) -> Iterator[None]:
    """Set ``requires_grad=False`` on every parameter for the block; restore the flags after."""
    flags = [(p, p.requires_grad) for p in module.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


class _Capture:
    """A forward hook on the target layer (owned by a context manager, removed on exit).

    ``leaf=True``: the output is replaced by a clone of a detached leaf that requires grad
    (autograd then starts at the layer; in-place ops after the layer touch the clone, not the
    stored activation). ``replace``: a function returning a substitute output (AblationCAM).
    """

    def __init__(self, module: nn.Module, name: str) -> None:
        self.module = module
        self.name = name
        self.leaf = False
        self.active = True
        self.replace: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.output: torch.Tensor | None = None
        self.calls = 0
        self._handle: Any = None

    def __enter__(self) -> Self:
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
        self._handle = None

    def reset(self) -> None:
        self.output = None
        self.calls = 0

    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> Any:
        if not self.active:
            return None
        is_seq = isinstance(output, (tuple, list))
        tensor = output[0] if is_seq else output
        if not isinstance(tensor, torch.Tensor):
            raise SaliencyError(f"layer {self.name} returns {type(tensor).__name__}, not a tensor: choose another layer")
        if self.replace is not None:
            new = self.replace(tensor)
        else:
            self.calls += 1
            if self.calls > 1:
                raise SaliencyError(
                    f"layer {self.name} runs more than once per forward pass (a shared module); choose a layer "
                    "that runs once"
                )
            if self.leaf:
                leaf = tensor.detach().requires_grad_(True)
                self.output = leaf
                new = leaf.clone()
            else:
                self.output = tensor.detach()
                return None
        if is_seq:
            return type(output)([new, *output[1:]])
        return new


class Explainer:
    """Saliency maps of one model with one method, batched, on the model's device.

    Args:
        model: a :class:`curate.models.LoadedModel` (CLIP or timm classifier).
        method: one of :data:`curate.saliency.registry.METHODS` (``gradcam``, ``gradcam++``,
            ``xgradcam``, ``layercam``, ``eigencam``, ``eigengradcam``, ``scorecam``,
            ``ablationcam``, ``fullgrad``, ``rollout``, ``grad-rollout``).
        layer: the layer CAMs read (default: :func:`curate.saliency.layers.default_layer`:
            the last block's ``ln_1``/``norm1`` for ViTs, the last stage with a grid of at
            least ``min_grid`` for CNNs). ``fullgrad`` and the rollouts use every layer they
            need and take no ``layer``.
        classifier: for a CLIP, the ``(C, D)`` zero-shot text classifier (rows = ``columns``).
        columns: label-space class index of each logit column (default ``0..C-1``); for a
            timm classifier, a subset of its 1000 classes to score (targets and predictions
            are then among them).
        sign_correction: EigenCAM/EigenGradCAM sign convention (see :mod:`.methods`).
        inner_batch_size: images per forward pass inside ScoreCAM / AblationCAM.
        head_fusion, discard_ratio: rollout options (see :mod:`.attention`).
    """

    def __init__(
        self,
        model: LoadedModel,
        method: str = "gradcam",
        *,
        layer: str | None = None,
        classifier: torch.Tensor | None = None,
        columns: Sequence[int] | None = None,
        min_grid: int = DEFAULT_MIN_GRID,
        sign_correction: bool = True,
        inner_batch_size: int = 64,
        head_fusion: str = "mean",
        discard_ratio: float = 0.0,
    ) -> None:
        self.model = model
        self.info = method_info(method)
        self.method = self.info.name
        self.head = ScoreHead(model, classifier=classifier, columns=columns)
        self.sign_correction = sign_correction
        self.inner_batch_size = max(1, int(inner_batch_size))
        self.head_fusion = head_fusion
        self.discard_ratio = float(discard_ratio)
        _, self.tower = vision_tower(model)
        if self.info.vit_only and not is_vit(self.tower):
            raise SaliencyError(
                f"{self.method} needs a ViT image tower; {model.model_id} has {type(self.tower).__name__}. "
                "Use a CAM method (gradcam, layercam, ...) for CNN towers."
            )
        self.layer_name: str | None = None
        self.layer: nn.Module | None = None
        if self.info.uses_layer:
            name = layer if layer is not None else default_layer(model, min_grid=min_grid)
            self.layer_name, self.layer = resolve_layer(model, name)
        elif layer is not None:
            raise SaliencyError(
                f"{self.method} does not read one layer (it reads {self.info.default_layer}): drop layer="
            )
        if not self.info.target_dependent:
            warn_once(
                f"target-ignored:{self.method}",
                f"{self.method} does not depend on the target: every target of an image gets the same map, so "
                "per-target and per-class differences mean nothing with it (papers/004 §5: methods differ)",
                TargetIgnoredWarning,
            )
        # dispatch on the registry entry: one runner per family (curate.saliency.registry.FAMILIES)
        self._runner = getattr(self, _RUNNERS[self.info.family])
        cam = GRADIENT_CAMS.get(self.method)
        self._cam = (lambda a, g: eigengradcam(a, g, self.sign_correction)) if cam is eigengradcam else cam

    # -------------------------------------------------------------------------------- public
    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def columns(self) -> list[int]:
        return self.head.columns

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """``(N, C)`` logits of the columns, without gradients."""
        with torch.no_grad():
            return self.head(self.model.to_input(images))

    def explain(
        self,
        images: torch.Tensor,
        target: Target | str = "true",
        labels: Sequence[int] | torch.Tensor | None = None,
    ) -> SaliencyResult:
        """Maps for a batch ``(N, 3, H, W)`` (the model's preprocessing already applied).

        Args:
            images: the preprocessed batch (any device; moved to the model's).
            target: a :class:`curate.saliency.targets.Target` (``TrueClass()``, ``Predicted()``,
                ``TopK(k)``) or its spelling ``"true"``, ``"predicted"``, ``"topk:K"``.
            labels: ``(N,)`` label-space class indices (needed for ``"true"``).

        Returns:
            :class:`SaliencyResult` with ``(N, K, H, W)`` maps on the device.
        """
        spec = parse_target(target)
        x = self.model.to_input(images)
        label_cols = None
        if labels is not None:
            label_cols = self.head.column_of(labels).to(self.device)
            if spec.needs_labels and bool((label_cols < 0).any()):
                missing = sorted({int(c) for c, col in zip(
                    (labels.tolist() if isinstance(labels, torch.Tensor) else list(labels)), label_cols.tolist())
                    if col < 0})
                raise SaliencyError(f"true classes {missing[:10]} are not among the scored classes (columns)")
        cams, logits, targets = self._runner(x, spec, label_cols)
        maps, flat = finish_maps(cams.detach(), tuple(x.shape[-2:]))
        logits = logits.detach().float()
        return SaliencyResult(
            maps=maps,
            targets=targets,
            target_scores=logits.gather(1, targets),
            logits=logits,
            flat=flat,
            columns=self.columns,
            method=self.method,
            layer=self.layer_name,
        )

    def explain_batched(
        self,
        images: torch.Tensor,
        target: Target | str = "true",
        labels: Sequence[int] | torch.Tensor | None = None,
        *,
        batch_size: int = 32,
    ) -> SaliencyResult:
        """:meth:`explain` over ``batch_size`` images at a time; halves the batch on out-of-memory."""
        return explain_with_backoff(self, images, target, labels, batch_size=batch_size)[0]

    # -------------------------------------------------------------------------------- methods
    def _capture(self) -> _Capture:
        assert self.layer is not None and self.layer_name is not None
        return _Capture(self.layer, self.layer_name)

    def _layout(self, raw: torch.Tensor, batch: int) -> Layout:
        assert self.layer_name is not None
        return detect_layout(self.model, self.layer_name, raw, batch)

    def _gradient(self, x: torch.Tensor, spec: Target, labels: torch.Tensor | None):
        fn = self._cam
        with self._capture() as cap, frozen_parameters(self.model.module), torch.enable_grad():
            cap.leaf = True
            logits = self.head(x)
            if cap.output is None:
                raise SaliencyError(f"layer {self.layer_name} did not run in the image tower's forward pass")
            targets = spec.select(logits.detach(), labels)
            act = cap.output
            layout = self._layout(act, x.shape[0])
            a = layout.to_spatial(act.detach()).float()
            cams = []
            for k in range(targets.shape[1]):
                score = logits.gather(1, targets[:, k:k + 1]).sum()
                (grad,) = torch.autograd.grad(score, act, retain_graph=k + 1 < targets.shape[1], allow_unused=True)
                if grad is None:
                    warn_once(f"unused:{self.layer_name}",
                              f"layer {self.layer_name} does not influence the target score (zero gradient): its "
                              "maps are empty; choose an earlier layer (e.g. the last block's ln_1 for a ViT)")
                    grad = torch.zeros_like(act)
                cams.append(fn(a, layout.to_spatial(grad).float()))
        return torch.stack(cams, dim=1), logits.detach(), targets

    def _eigen(self, x: torch.Tensor, spec: Target, labels: torch.Tensor | None):
        with self._capture() as cap, torch.no_grad():
            logits = self.head(x)
            targets = spec.select(logits, labels)
            layout = self._layout(cap.output, x.shape[0])
            cam = eigencam(layout.to_spatial(cap.output).float(), self.sign_correction)
        return cam.unsqueeze(1).expand(-1, targets.shape[1], -1, -1), logits, targets

    def _pairs(self, n: int, c: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(image, channel) index pairs in chunks of ``inner_batch_size``."""
        total = n * c
        for start in range(0, total, self.inner_batch_size):
            flat = torch.arange(start, min(total, start + self.inner_batch_size), device=self.device)
            yield flat // c, flat % c

    def _score(self, x: torch.Tensor, spec: Target, labels: torch.Tensor | None):
        size = tuple(x.shape[-2:])
        with self._capture() as cap, torch.no_grad():
            logits = self.head(x)
            targets = spec.select(logits, labels)
            layout = self._layout(cap.output, x.shape[0])
            a = layout.to_spatial(cap.output).float()
            cap.active = False
            n, c = a.shape[:2]
            scores = torch.empty(n, c, targets.shape[1], device=self.device)
            for img, ch in self._pairs(n, c):
                up = F.interpolate(a[img, ch].unsqueeze(1), size=size, mode="bilinear", align_corners=True)
                lo = up.flatten(1).min(dim=1).values.view(-1, 1, 1, 1)
                hi = up.flatten(1).max(dim=1).values.view(-1, 1, 1, 1)
                up = (up - lo) / (hi - lo + 1e-8)
                out = self.head(x[img] * up.to(x.dtype))
                scores[img, ch] = out.gather(1, targets[img]).float()
            weights = scores.softmax(dim=1)  # over channels, per target
            cams = torch.einsum("nck,nchw->nkhw", weights, a)
        return cams, logits, targets

    def _ablation(self, x: torch.Tensor, spec: Target, labels: torch.Tensor | None):
        with self._capture() as cap, torch.no_grad():
            logits = self.head(x)
            targets = spec.select(logits, labels)
            raw = cap.output
            layout = self._layout(raw, x.shape[0])
            a = layout.to_spatial(raw).float()
            n, c = a.shape[:2]
            # the raw output with batch first and channels second ("canonical"), to ablate channels
            if layout.kind == "tokens_lnd":
                canon = raw.transpose(0, 1).movedim(-1, 1)
            elif layout.kind in ("tokens_nld", "nhwc"):
                canon = raw.movedim(-1, 1)
            else:
                canon = raw
            mins = canon.flatten(1).min(dim=1).values
            ablate_value = torch.where(mins == 0, torch.zeros_like(mins), mins - 1e7)
            original = logits.gather(1, targets).float()
            scores = torch.empty(n, c, targets.shape[1], device=self.device)
            current: dict[str, torch.Tensor] = {}

            def substitute(_: torch.Tensor) -> torch.Tensor:
                rep = current["canon"]
                if layout.kind == "tokens_lnd":
                    return rep.movedim(1, -1).transpose(0, 1)
                if layout.kind in ("tokens_nld", "nhwc"):
                    return rep.movedim(1, -1)
                return rep

            cap.replace = substitute
            for img, ch in self._pairs(n, c):
                rep = canon[img].clone()
                rows = torch.arange(len(img), device=self.device)
                rep[rows, ch] = ablate_value[img].view(-1, *([1] * (rep.ndim - 2))).to(rep.dtype)
                current["canon"] = rep.contiguous()
                out = self.head(x[img])
                scores[img, ch] = out.gather(1, targets[img]).float()
            cap.replace = None
            weights = (original.unsqueeze(1) - scores) / original.unsqueeze(1)  # (N, C, K)
            cams = torch.einsum("nck,nchw->nkhw", weights, a)
        return cams, logits, targets

    def _bias_layers(self) -> list[tuple[nn.Module, torch.Tensor]]:
        """FullGrad's layers: every Conv2d / BatchNorm2d of the tower with a bias, and that bias.

        For BatchNorm the effective bias is ``beta - mu * gamma / sqrt(var + eps)``.
        """
        layers = []
        for module in self.tower.modules():
            if type(module) is nn.Conv2d and module.bias is not None:
                layers.append((module, module.bias.detach().float()))
            elif type(module) is nn.BatchNorm2d and module.bias is not None:
                bias = module.bias - module.running_mean * module.weight / torch.sqrt(module.running_var + module.eps)
                layers.append((module, bias.detach().float()))
        return layers

    def _fullgrad(self, x: torch.Tensor, spec: Target, labels: torch.Tensor | None):
        from curate.saliency.methods import minmax

        size = tuple(x.shape[-2:])
        layers = self._bias_layers()
        grads: dict[int, torch.Tensor] = {}
        handles = []

        def forward_hook(index: int) -> Callable:
            def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
                if output.requires_grad:
                    output.register_hook(lambda g, index=index: grads.__setitem__(index, g))
            return hook

        for i, (module, _) in enumerate(layers):
            handles.append(module.register_forward_hook(forward_hook(i)))
        try:
            with frozen_parameters(self.model.module), torch.enable_grad():
                xi = x.detach().requires_grad_(True)
                logits = self.head(xi)
                targets = spec.select(logits.detach(), labels)
                cams = []
                for k in range(targets.shape[1]):
                    grads.clear()
                    score = logits.gather(1, targets[:, k:k + 1]).sum()
                    (gx,) = torch.autograd.grad(score, xi, retain_graph=k + 1 < targets.shape[1])
                    total = minmax((gx * xi.detach()).abs().float()).sum(dim=1)  # (N, H, W)
                    for i, (_, bias) in enumerate(layers):
                        g = grads.get(i)
                        if g is None:
                            continue
                        term = minmax((bias.view(1, -1, 1, 1) * g.float()).abs()).sum(dim=1, keepdim=True)
                        if tuple(term.shape[-2:]) != size:
                            term = F.interpolate(term, size=size, mode="bilinear", align_corners=False)
                        total = total + term[:, 0]
                    cams.append(total)
        finally:
            for handle in handles:
                handle.remove()
        return torch.stack(cams, dim=1), logits.detach(), targets

    def _rollout(self, x: torch.Tensor, spec: Target, labels: torch.Tensor | None):
        use_grad = self.info.needs_gradients  # grad-rollout; plain rollout reads the attention only
        grad_ctx = torch.enable_grad() if use_grad else torch.no_grad()
        with record_attention(self.tower) as probs, frozen_parameters(self.model.module), grad_ctx:
            xi = x.detach().requires_grad_(use_grad)
            logits = self.head(xi)
            targets = spec.select(logits.detach(), labels)
            tokens = probs[0].shape[-1]
            prefix, grid = attention_geometry(self.tower, tokens)
            if not use_grad:
                cam = rollout(probs, prefix=prefix, grid=grid, head_fusion=self.head_fusion,
                              discard_ratio=self.discard_ratio)
                cams = cam.unsqueeze(1).expand(-1, targets.shape[1], -1, -1)
            else:
                out = []
                for k in range(targets.shape[1]):
                    score = logits.gather(1, targets[:, k:k + 1]).sum()
                    g = torch.autograd.grad(score, probs, retain_graph=k + 1 < targets.shape[1], allow_unused=True)
                    g = [torch.zeros_like(p) if gi is None else gi for p, gi in zip(probs, g)]
                    out.append(rollout([p.detach() for p in probs], g, prefix=prefix, grid=grid,
                                       discard_ratio=self.discard_ratio))
                cams = torch.stack(out, dim=1)
        return cams, logits.detach(), targets


#: The :class:`Explainer` method that computes each family's maps.
_RUNNERS: dict[str, str] = {
    "gradient": "_gradient",
    "eigen": "_eigen",
    "score": "_score",
    "ablation": "_ablation",
    "fullgrad": "_fullgrad",
    "rollout": "_rollout",
}


def _cat_results(parts: list[SaliencyResult]) -> SaliencyResult:
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    return SaliencyResult(
        maps=torch.cat([p.maps for p in parts]),
        targets=torch.cat([p.targets for p in parts]),
        target_scores=torch.cat([p.target_scores for p in parts]),
        logits=torch.cat([p.logits for p in parts]),
        flat=torch.cat([p.flat for p in parts]),
        columns=first.columns,
        method=first.method,
        layer=first.layer,
        info=dict(first.info),
    )


def explain_with_backoff(
    explainer: Explainer,
    images: torch.Tensor,
    target: Target | str,
    labels: Sequence[int] | torch.Tensor | None,
    *,
    batch_size: int,
) -> tuple[SaliencyResult, int]:
    """Explain ``images`` in chunks of ``batch_size``; on out-of-memory, halve the chunk and go on.

    Returns the concatenated result and the chunk size that worked (reuse it for the next
    call). Raises the out-of-memory error when even one image does not fit.
    """
    n = images.shape[0]
    size = max(1, min(int(batch_size), n))
    labels_t = None if labels is None else torch.as_tensor(
        labels.tolist() if isinstance(labels, torch.Tensor) else list(labels), dtype=torch.long)
    parts: list[SaliencyResult] = []
    start = 0
    while start < n:
        stop = min(n, start + size)
        try:
            part = explainer.explain(images[start:stop], target, None if labels_t is None else labels_t[start:stop])
        except Exception as error:
            if not is_oom(error):
                raise
            free_device_memory(explainer.device)
            if size == 1:
                raise
            size = max(1, size // 2)
            logger.warning("out of memory with %d images per batch on %s; continuing with %d",
                           stop - start, explainer.device, size)
            continue
        parts.append(part)
        start = stop
    return _cat_results(parts), size


def saliency_maps(
    model: LoadedModel,
    images: torch.Tensor | Sequence[Any],
    *,
    method: str = "gradcam",
    target: Target | str = "true",
    labels: Sequence[int] | torch.Tensor | None = None,
    layer: str | None = None,
    classifier: torch.Tensor | None = None,
    columns: Sequence[int] | None = None,
    batch_size: int = 32,
    **options: Any,
) -> SaliencyResult:
    """Maps for a batch of images: a tensor already preprocessed ``(N, 3, H, W)`` or PIL images.

    A thin wrapper over :class:`Explainer` (see it for the arguments); batches of
    ``batch_size``, halved on out-of-memory.
    """
    if not isinstance(images, torch.Tensor):
        images = model.preprocess_images(list(images))
    explainer = Explainer(model, method, layer=layer, classifier=classifier, columns=columns, **options)
    return explain_with_backoff(explainer, images, target, labels, batch_size=batch_size)[0]
