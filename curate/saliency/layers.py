"""Which layer a CAM reads, and how its output becomes a ``(N, C, h, w)`` feature map.

Default layers (each method's docstring refers here):

- **open_clip ViT** (``VisionTransformer``): ``visual.transformer.resblocks.<last>.ln_1``, the
  normalised input of the last attention block. The output of the last block itself is no
  use: only its class token reaches the embedding, so the patch tokens get zero gradient.
  This is pytorch-grad-cam's and SemScore's choice for ViTs (``blocks[-1].norm1``).
- **timm ViT** (``blocks[i].norm1``): ``blocks.<last>.norm1``, the same.
- **open_clip ModifiedResNet** (``layer1..layer4``) and **timm CNNs** (their ``feature_info``
  stages): the last stage (``layer4``), unless its map is smaller than
  :data:`DEFAULT_MIN_GRID` cells per side; then the deepest stage that is at least that large.
  At the usual 224 px, ResNet-50's ``layer4`` is 7 x 7 and is used; the tiny 48 px reference
  CLIP's ``layer4`` is 1 x 1 (a constant map), so ``layer2`` (6 x 6) is used.

Any module can be named instead (``layer="visual.layer3"``, ``"layer3"`` relative to the
vision tower, ``"transformer.resblocks.-2.ln_1"`` with a negative index); a name that does not
exist raises :class:`~curate.saliency.base.UnknownLayerError` listing close matches and the
stage-level candidates.

Token layouts: a 3-d activation is ``(N, L, D)`` (batch first) or ``(L, N, D)`` (sequence first,
older open_clip / ``nn.MultiheadAttention`` default). The layout is *detected* from the shape,
knowing the batch size and the token count ``L = prefix + gh * gw``; only when ``N == L`` does the
model's own ``batch_first`` attribute decide. Prefix tokens (class token, registers,
distillation token) are dropped and the patch tokens reshaped to the model's grid. A 4-d
activation in channels-last layout (``(N, h, w, C)``, e.g. timm's NHWC stages) is detected from
the known channel count.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from curate.saliency.base import SaliencyError, UnknownLayerError

if TYPE_CHECKING:  # pragma: no cover
    from curate.models.base import LoadedModel

logger = logging.getLogger(__name__)

#: The smallest feature map (cells per side) a default CNN layer may have.
DEFAULT_MIN_GRID = 4


# ------------------------------------------------------------------------- model anatomy
def vision_tower(model: LoadedModel) -> tuple[str, nn.Module]:
    """``(prefix, module)`` of the image tower: ``("visual", clip.visual)`` or ``("", classifier)``."""
    module = model.module
    if model.kind == "clip":
        return "visual", module.visual
    return "", module


def is_vit(tower: nn.Module) -> bool:
    """Whether the tower is a ViT curate knows (open_clip ``transformer.resblocks`` or timm ``blocks``)."""
    return bool(_vit_blocks(tower))


def _vit_blocks(tower: nn.Module) -> list[nn.Module]:
    transformer = getattr(tower, "transformer", None)
    if transformer is not None and hasattr(transformer, "resblocks") and hasattr(tower, "grid_size"):
        return list(transformer.resblocks)
    blocks = getattr(tower, "blocks", None)
    if blocks is not None and hasattr(tower, "patch_embed"):
        try:
            return [b for b in blocks if hasattr(b, "attn")]
        except TypeError:  # pragma: no cover - not iterable
            return []
    return []


def vit_blocks(tower: nn.Module) -> list[nn.Module]:
    """The attention blocks of a ViT tower (raises :class:`SaliencyError` for other towers)."""
    blocks = _vit_blocks(tower)
    if not blocks:
        raise SaliencyError(
            f"{type(tower).__name__} is not a ViT curate can read attention from (open_clip VisionTransformer "
            "or a timm ViT with blocks[i].attn); attention rollout needs one. Use a CAM method instead."
        )
    return blocks


def token_geometry(tower: nn.Module) -> tuple[int, tuple[int, int] | None]:
    """``(prefix tokens, (gh, gw) grid)`` of a ViT tower; grid None when it cannot be read."""
    if hasattr(tower, "grid_size") and hasattr(tower, "transformer"):  # open_clip
        prefix = 1 if getattr(tower, "class_embedding", None) is not None else 0
        gh, gw = tower.grid_size
        return prefix, (int(gh), int(gw))
    prefix = int(getattr(tower, "num_prefix_tokens", 1 if getattr(tower, "cls_token", None) is not None else 0))
    patch_embed = getattr(tower, "patch_embed", None)
    grid = getattr(patch_embed, "grid_size", None) if patch_embed is not None else None
    if grid is not None:
        return prefix, (int(grid[0]), int(grid[1]))
    return prefix, None


def batch_first_attribute(tower: nn.Module) -> bool | None:
    """The tower's own statement of its token layout, when it makes one."""
    transformer = getattr(tower, "transformer", None)
    if transformer is not None and hasattr(transformer, "batch_first"):
        return bool(transformer.batch_first)
    for block in _vit_blocks(tower):
        attn = getattr(block, "attn", None)
        if isinstance(attn, nn.MultiheadAttention):
            return bool(attn.batch_first)
        return True  # timm attention is always batch first
    return None


# ------------------------------------------------------------------------- layer names
def _walk(root: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    """Resolve ``dotted`` under ``root`` (negative indices allowed); return (module, canonical)."""
    module: nn.Module = root
    parts: list[str] = []
    for part in dotted.split("."):
        if part == "":
            raise KeyError(dotted)
        if part.lstrip("-").isdigit() and isinstance(module, (nn.Sequential, nn.ModuleList)):
            index = int(part)
            n = len(module)
            if not -n <= index < n:
                raise KeyError(dotted)
            index %= n
            module = module[index]
            parts.append(str(index))
            continue
        children = dict(module.named_children())
        if part not in children:
            raise KeyError(dotted)
        module = children[part]
        parts.append(part)
    return module, ".".join(parts)


def layer_candidates(model: LoadedModel, limit: int = 40) -> list[str]:
    """Stage-level module names of the image tower (what ``layer=`` usually names)."""
    prefix, tower = vision_tower(model)
    names: list[str] = []
    blocks = _vit_blocks(tower)
    if blocks:
        base = "transformer.resblocks" if hasattr(tower, "transformer") else "blocks"
        for i, block in enumerate(blocks):
            for child, _ in block.named_children():
                if child.startswith(("ln_1", "norm1")):
                    names.append(f"{base}.{i}.{child}")
            names.append(f"{base}.{i}")
    else:
        for name, _ in tower.named_modules():
            if name and name.count(".") <= 1:
                names.append(name)
    full = [f"{prefix}.{n}" if prefix else n for n in names]
    if len(full) > limit:
        full = full[: limit // 2] + ["..."] + full[-limit // 2:]
    return full


def resolve_layer(model: LoadedModel, name: str) -> tuple[str, nn.Module]:
    """``(canonical dotted name under model.module, module)`` for a layer ``name``.

    ``name`` is looked up in the image tower: relative to it (``"layer4"``) or with its prefix
    (``"visual.layer4"``), with negative list indices (``"transformer.resblocks.-1.ln_1"``).
    A CLIP's text tower is never searched (it does not see the image).
    """
    prefix, tower = vision_tower(model)
    relative = name[len(prefix) + 1:] if prefix and name.startswith(prefix + ".") else name
    try:
        module, canonical = _walk(tower, relative)
    except KeyError:
        pass
    else:
        return (f"{prefix}.{canonical}" if prefix else canonical), module
    from curate.models.base import close_matches

    all_names = [f"{prefix}.{n}" if prefix else n for n, _ in tower.named_modules() if n]
    suggestions = close_matches(name if name.startswith(prefix) or not prefix else f"{prefix}.{name}", all_names, n=5)
    candidates = layer_candidates(model)
    message = f"{model.model_id} has no layer {name!r} in its image tower"
    if suggestions:
        message += f"; close matches: {', '.join(suggestions)}"
    message += f"; layers you can name: {', '.join(candidates)}"
    raise UnknownLayerError(message, suggestions + [c for c in candidates if c != "..."])


def _cnn_stages(model: LoadedModel) -> list[str]:
    """Candidate stage names (under model.module), shallow to deep, for a CNN tower."""
    prefix, tower = vision_tower(model)
    stages: list[str] = []
    info = getattr(tower, "feature_info", None)
    if info is not None:
        try:
            stages = [f["module"] for f in info]
        except (TypeError, KeyError):
            stages = []
    if not stages:
        stages = [n for n in ("layer1", "layer2", "layer3", "layer4") if hasattr(tower, n)]
    if not stages:
        stages = [n for n in ("stages", "features", "layers") if hasattr(tower, n)]
        if stages:
            container = getattr(tower, stages[0])
            stages = [f"{stages[0]}.{i}" for i in range(len(container))]
    valid = []
    for stage in stages:
        try:
            _walk(tower, stage)
        except KeyError:
            continue
        valid.append(f"{prefix}.{stage}" if prefix else stage)
    return valid


def measure_outputs(model: LoadedModel, names: list[str]) -> dict[str, tuple[int, ...]]:
    """Output shapes of the named modules for one blank input of the model's size (no grad)."""
    shapes: dict[str, tuple[int, ...]] = {}
    handles = []
    for name in names:
        _, module = resolve_layer(model, name)

        def hook(mod: nn.Module, inputs: Any, output: Any, name: str = name) -> None:
            tensor = output[0] if isinstance(output, (tuple, list)) else output
            if isinstance(tensor, torch.Tensor):
                shapes.setdefault(name, tuple(tensor.shape))

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            blank = torch.zeros(1, 3, *model.image_size)
            model.encode_image(blank, normalize=False)
    finally:
        for handle in handles:
            handle.remove()
    return shapes


def default_layer(model: LoadedModel, *, min_grid: int = DEFAULT_MIN_GRID) -> str:
    """The default CAM layer of ``model`` (see the module docstring for the rule)."""
    prefix, tower = vision_tower(model)
    blocks = _vit_blocks(tower)
    if blocks:
        base = "transformer.resblocks" if hasattr(tower, "transformer") else "blocks"
        last = blocks[-1]
        norm = "ln_1" if hasattr(last, "ln_1") else "norm1" if hasattr(last, "norm1") else None
        if norm is None:
            raise SaliencyError(f"cannot find the first norm of the last block of {type(tower).__name__}; pass layer=")
        name = f"{base}.{len(blocks) - 1}.{norm}"
        return f"{prefix}.{name}" if prefix else name
    stages = _cnn_stages(model)
    if not stages:
        raise SaliencyError(
            f"no default CAM layer for {type(tower).__name__} ({model.model_id}); pass layer=, one of: "
            f"{', '.join(layer_candidates(model))}"
        )
    shapes = measure_outputs(model, stages)
    chosen = None
    for stage in reversed(stages):
        shape = shapes.get(stage)
        if shape is None or len(shape) != 4:
            continue
        h, w = _spatial_hw(shape, None)
        if min(h, w) >= min_grid:
            chosen = stage
            break
    if chosen is None:
        chosen = stages[-1]
    if chosen != stages[-1]:
        last = shapes.get(stages[-1])
        logger.info("default CAM layer %s: the last stage %s is %s, smaller than %dx%d", chosen, stages[-1],
                    "x".join(map(str, _spatial_hw(last, None))) if last and len(last) == 4 else "?", min_grid, min_grid)
    return chosen


def _spatial_hw(shape: tuple[int, ...], channels: int | None) -> tuple[int, int]:
    if channels is not None and shape[-1] == channels and shape[1] != channels:
        return shape[1], shape[2]
    return shape[2], shape[3]


# ------------------------------------------------------------------------- layouts
@dataclass
class Layout:
    """How a layer's raw output maps to ``(N, C, h, w)``.

    ``kind``: ``"nchw"``, ``"nhwc"``, ``"tokens_nld"`` or ``"tokens_lnd"``; ``batch_dim`` and
    ``channel_dim`` index the raw tensor; for tokens, ``prefix`` tokens are dropped and the
    rest reshaped to ``grid``.
    """

    kind: str
    batch_dim: int
    channel_dim: int
    prefix: int = 0
    grid: tuple[int, int] | None = None

    def to_spatial(self, t: torch.Tensor) -> torch.Tensor:
        """Raw layer output (or its gradient) -> ``(N, C, h, w)``."""
        if self.kind == "nchw":
            return t
        if self.kind == "nhwc":
            return t.permute(0, 3, 1, 2)
        if self.kind == "tokens_lnd":
            t = t.transpose(0, 1)
        assert self.grid is not None
        patches = t[:, self.prefix:, :]
        n, _, d = patches.shape
        gh, gw = self.grid
        return patches.reshape(n, gh, gw, d).permute(0, 3, 1, 2)


def detect_layout(model: LoadedModel, layer_name: str, output: torch.Tensor, batch: int) -> Layout:
    """Read the layout of ``output`` (see the module docstring); :class:`SaliencyError` if unreadable."""
    _, tower = vision_tower(model)
    shape = tuple(output.shape)
    if output.ndim == 4:
        channels = _known_channels(model, layer_name)
        if channels is not None and shape[-1] == channels and shape[1] != channels:
            return Layout("nhwc", 0, 3)
        return Layout("nchw", 0, 1)
    if output.ndim != 3:
        raise SaliencyError(
            f"layer {layer_name} outputs a {output.ndim}-d tensor {shape}; CAMs need (N, C, h, w) maps or "
            "(N, L, D) / (L, N, D) tokens: choose another layer"
        )
    prefix, grid = token_geometry(tower)
    said = batch_first_attribute(tower)

    def fits(tokens: int) -> tuple[int, tuple[int, int]] | None:
        if grid is not None and tokens == prefix + grid[0] * grid[1]:
            return prefix, grid
        for p in (prefix, 1, 0):  # other prefix counts (registers, no class token) on square grids
            side = math.isqrt(max(tokens - p, 0))
            if side > 0 and side * side == tokens - p:
                return p, (side, side)
        return None

    first = fits(shape[1]) if shape[0] == batch else None
    second = fits(shape[0]) if shape[1] == batch else None
    if first and second:  # N == L: ambiguous from the shape alone
        if said is None:
            raise SaliencyError(f"cannot tell the token layout of {layer_name} {shape}; use another batch size")
        chosen = ("tokens_nld", first) if said else ("tokens_lnd", second)
    elif first:
        chosen = ("tokens_nld", first)
    elif second:
        chosen = ("tokens_lnd", second)
    else:
        raise SaliencyError(
            f"layer {layer_name} outputs {shape}, which is not (N={batch}, L, D) or (L, N={batch}, D) with "
            f"L = {prefix} prefix tokens + a patch grid{f' {grid}' if grid else ''}: choose another layer"
        )
    kind, (p, g) = chosen
    if said is not None and said != (kind == "tokens_nld"):
        logger.debug("layer %s: tower says batch_first=%s but the shape %s says %s", layer_name, said, shape, kind)
    return Layout(kind, 0 if kind == "tokens_nld" else 1, 2, prefix=p, grid=g)


def _known_channels(model: LoadedModel, layer_name: str) -> int | None:
    """Channel count of a stage from timm's ``feature_info`` (to spot NHWC outputs)."""
    prefix, tower = vision_tower(model)
    info = getattr(tower, "feature_info", None)
    if info is None:
        return None
    relative = layer_name[len(prefix) + 1:] if prefix and layer_name.startswith(prefix + ".") else layer_name
    try:
        for entry in info:
            if entry.get("module") == relative:
                return int(entry["num_chs"])
    except (TypeError, AttributeError, KeyError):
        return None
    return None
