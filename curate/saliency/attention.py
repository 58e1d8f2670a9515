"""Attention maps of ViT towers: attention rollout and gradient attention rollout.

- **rollout** (Abnar & Zuidema 2020; papers/004 Table 4 "Attention Rollout"): with ``P_l`` the
  attention probabilities of block ``l`` (``(heads, T, T)``), fuse the heads (mean by default),
  add the residual and renormalise the rows, ``A_l = rownorm((fuse(P_l) + I) / 2)``, and
  multiply through the blocks, ``R = A_L ... A_1``. The map is the class token's row of ``R``
  over the patch tokens, reshaped to the grid. It does not depend on the target.
- **grad-rollout** (Gradient Attention Rollout, papers/004 Table 4 "GAR", after Gildenblat's
  vit-explain): the same product with ``fuse(P_l) = mean_heads(relu(P_l * dy_c/dP_l))``.

Rows are normalised to sum to 1 (vit-explain divides by a broadcast column sum, which is the
same for rollout, whose rows already sum to 1, and a rescaling for grad-rollout).
``discard_ratio`` zeroes that fraction of the lowest fused entries per image first (never the
class token's own entry), as vit-explain does; the default 0 keeps them all.

Attention probabilities are not an output of ``nn.MultiheadAttention`` with
``need_weights=False`` (what open_clip calls) nor of fused attention kernels, so while a map is
computed (a context manager, restored on exit even after an error) open_clip blocks run an
explicit ``softmax(q k^T / sqrt(d)) v`` with the same weights, and timm blocks run their own
non-fused path (``fused_attn = False``) whose probabilities pass through ``attn_drop``.
"""
from __future__ import annotations

import contextlib
import math
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from curate.saliency.base import SaliencyError
from curate.saliency.layers import token_geometry, vit_blocks


def _explicit_mha(block: nn.Module, recorder: list[torch.Tensor]) -> Any:
    """A drop-in ``ResidualAttentionBlock.attention`` that records its attention probabilities."""
    mha: nn.MultiheadAttention = block.attn
    if mha.bias_k is not None or mha.add_zero_attn:
        raise SaliencyError("attention rollout does not support nn.MultiheadAttention with add_bias_kv/add_zero_attn")

    def attention(self: nn.Module, q_x: torch.Tensor, k_x: torch.Tensor | None = None,
                  v_x: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        k_x = q_x if k_x is None else k_x
        v_x = q_x if v_x is None else v_x
        if not mha.batch_first:
            q_x, k_x, v_x = (t.transpose(0, 1) for t in (q_x, k_x, v_x))
        d = mha.embed_dim
        heads = mha.num_heads
        if mha._qkv_same_embed_dim:
            w, b = mha.in_proj_weight, mha.in_proj_bias
            wq, wk, wv = w[:d], w[d:2 * d], w[2 * d:]
            bq, bk, bv = (None, None, None) if b is None else (b[:d], b[d:2 * d], b[2 * d:])
        else:
            wq, wk, wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
            b = mha.in_proj_bias
            bq, bk, bv = (None, None, None) if b is None else (b[:d], b[d:2 * d], b[2 * d:])
        n, lq, _ = q_x.shape
        lk = k_x.shape[1]
        q = F.linear(q_x, wq, bq).reshape(n, lq, heads, d // heads).transpose(1, 2)
        k = F.linear(k_x, wk, bk).reshape(n, lk, heads, d // heads).transpose(1, 2)
        v = F.linear(v_x, wv, bv).reshape(n, lk, heads, d // heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // heads)
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(attn_mask, float("-inf"))
            else:
                scores = scores + attn_mask.to(scores.dtype)
        probs = scores.softmax(dim=-1)
        recorder.append(probs)
        out = (probs @ v).transpose(1, 2).reshape(n, lq, d)
        out = mha.out_proj(out)
        return out if mha.batch_first else out.transpose(0, 1)

    return types.MethodType(attention, block)


@contextlib.contextmanager
def record_attention(tower: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Record ``(N, heads, T, T)`` attention probabilities of every block, in order."""
    blocks = vit_blocks(tower)
    recorder: list[torch.Tensor] = []
    undo: list[Any] = []
    try:
        for block in blocks:
            attn = block.attn
            if isinstance(attn, nn.MultiheadAttention) and hasattr(block, "attention"):
                block.attention = _explicit_mha(block, recorder)  # instance attribute shadows the method
                undo.append(lambda block=block: block.__dict__.pop("attention", None))
            elif hasattr(attn, "fused_attn") and isinstance(getattr(attn, "attn_drop", None), nn.Module):
                previous = attn.fused_attn
                attn.fused_attn = False
                undo.append(lambda attn=attn, previous=previous: setattr(attn, "fused_attn", previous))
                handle = attn.attn_drop.register_forward_hook(lambda mod, inp, out: recorder.append(out))
                undo.append(handle.remove)
            else:
                raise SaliencyError(
                    f"cannot record attention of {type(block).__name__}.{type(attn).__name__}: rollout supports "
                    "open_clip ResidualAttentionBlock (nn.MultiheadAttention) and timm Attention"
                )
        yield recorder
    finally:
        for action in reversed(undo):
            action()


def _fuse(probs: torch.Tensor, head_fusion: str) -> torch.Tensor:
    if head_fusion == "mean":
        return probs.mean(dim=1)
    if head_fusion == "max":
        return probs.max(dim=1).values
    if head_fusion == "min":
        return probs.min(dim=1).values
    raise SaliencyError(f"head_fusion {head_fusion!r} is not mean, max or min")


def rollout(
    probs: list[torch.Tensor],
    grads: list[torch.Tensor] | None = None,
    *,
    prefix: int = 1,
    grid: tuple[int, int] | None = None,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
) -> torch.Tensor:
    """Attention rollout (``grads`` None) or gradient rollout -> ``(N, gh, gw)`` raw maps."""
    if not probs:
        raise SaliencyError("no attention was recorded; is this a ViT?")
    n, _, t, _ = probs[0].shape
    eye = torch.eye(t, device=probs[0].device, dtype=torch.float32)
    result = eye.expand(n, t, t).clone()
    for i, p in enumerate(probs):
        p = p.float()
        if grads is not None:
            fused = (p * grads[i].float()).mean(dim=1).clamp(min=0)
        else:
            fused = _fuse(p, head_fusion)
        if discard_ratio > 0:
            flat = fused.reshape(n, -1).clone()
            count = int(flat.shape[1] * discard_ratio)
            if count:
                lowest = flat.topk(count, dim=1, largest=False).indices
                keep_cls = lowest != 0
                rows = torch.arange(n, device=flat.device).unsqueeze(1).expand_as(lowest)
                flat[rows[keep_cls], lowest[keep_cls]] = 0
            fused = flat.reshape(n, t, t)
        a = (fused + eye) / 2
        a = a / a.sum(dim=-1, keepdim=True).clamp(min=1e-12)
        result = a @ result
    row = result[:, 0, prefix:]
    patches = row.shape[1]
    if grid is None or grid[0] * grid[1] != patches:
        side = math.isqrt(patches)
        if side * side != patches:
            raise SaliencyError(f"{patches} patch tokens do not form a square grid; cannot draw a map")
        grid = (side, side)
    return row.reshape(n, *grid)


def attention_geometry(tower: nn.Module, tokens: int) -> tuple[int, tuple[int, int] | None]:
    """Prefix count and grid for ``tokens`` tokens (from the tower, else a square guess)."""
    prefix, grid = token_geometry(tower)
    if grid is not None and prefix + grid[0] * grid[1] == tokens:
        return prefix, grid
    return prefix, None
