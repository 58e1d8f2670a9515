"""Encode prompts at the batch's longest length instead of the full context (exact).

open_clip's text towers pad every prompt to the context length (77 tokens for the released
CLIPs) and pool the output at the end-of-text token (``text_pool_type`` ``argmax``: the EOT id
is the largest token id; or ``eos``). With a causal attention mask, the output at position
``i`` depends only on tokens ``0..i``; LayerNorm, the MLP and the projection act per token.
So the pooled output of a prompt whose EOT sits at position ``e`` is the same whether the
sequence is cut at any length ``L > e`` or padded to 77: cutting every batch at its longest
prompt (``L = max_b (e_b + 1)``) changes nothing but the work (``docs/design.md#speed``).
"A photo of {}." prompts are 6 to 20 tokens, so the tower does about a quarter of the work.

Only exact where those premises hold; :func:`can_trim` checks them for the module at hand and
anything else (no causal mask, ``last`` / ``avg`` / ``first`` pooling, a CoCa class token, a
pad mask, Hugging Face text towers) falls back to the library's own full-length
``encode_text``. ``tests/test_engine_text.py`` proves equality (fp32, atol 1e-5) on the tiny
configs and a standard open_clip architecture. We write this forward pass ourselves because
open_clip's ``CLIP.encode_text`` adds the full positional table and the full causal mask, so
it only accepts full-length inputs.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["can_trim", "trimmed_length", "encode_text_trimmed"]

EXACT_POOLS = ("argmax", "eos")


def _parts(module: Any) -> dict[str, Any] | None:
    """The pieces of a causal, EOT-pooled text tower, or None when trimming would not be exact."""
    text = getattr(module, "text", None)
    if text is not None and hasattr(text, "token_embedding"):  # CustomTextCLIP with an open_clip TextTransformer
        if getattr(text, "cls_emb", None) is not None or getattr(text, "use_pad_mask", False):
            return None
        parts = {"token_embedding": text.token_embedding, "positional_embedding": text.positional_embedding,
                 "attn_mask": getattr(text, "attn_mask", None), "transformer": text.transformer,
                 "ln_final": text.ln_final, "pool_type": getattr(text, "pool_type", None),
                 "eos_id": getattr(text, "eos_id", None), "text_projection": text.text_projection}
    elif hasattr(module, "token_embedding") and hasattr(module, "transformer"):  # open_clip CLIP
        parts = {"token_embedding": module.token_embedding, "positional_embedding": module.positional_embedding,
                 "attn_mask": getattr(module, "attn_mask", None), "transformer": module.transformer,
                 "ln_final": module.ln_final, "pool_type": getattr(module, "text_pool_type", None),
                 "eos_id": getattr(module, "text_eos_id", None), "text_projection": module.text_projection}
    else:
        return None
    if parts["attn_mask"] is None or parts["pool_type"] not in EXACT_POOLS:
        return None
    if parts["pool_type"] == "eos" and parts["eos_id"] is None:
        return None
    return parts


def can_trim(module: Any) -> bool:
    """Whether ``module``'s text tower is causal and EOT-pooled, so trimming is exact."""
    return _parts(module) is not None


def trimmed_length(tokens: torch.Tensor, pad_id: int = 0) -> int:
    """The longest prompt's length in ``tokens`` (last non-pad position + 1, at least 1)."""
    nonpad = tokens != pad_id
    if not bool(nonpad.any()):
        return 1
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    return int((positions * nonpad).max().item()) + 1


def encode_text_trimmed(module: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Pooled, projected text features of ``tokens`` computed on the first ``trimmed_length``
    positions; the library's full-length ``encode_text`` when trimming is not exact."""
    parts = _parts(module)
    if parts is None:
        return module.encode_text(tokens)
    length = trimmed_length(tokens)
    if length >= tokens.shape[1]:
        return module.encode_text(tokens)
    text = tokens[:, :length]
    cast_dtype = parts["transformer"].get_cast_dtype()
    x = parts["token_embedding"](text).to(cast_dtype)
    x = x + parts["positional_embedding"][:length].to(cast_dtype)
    x = parts["transformer"](x, attn_mask=parts["attn_mask"][:length, :length])
    x = parts["ln_final"](x)
    if parts["pool_type"] == "argmax":
        index = text.argmax(dim=-1)
    else:
        index = (text == parts["eos_id"]).int().argmax(dim=-1)
    pooled = x[torch.arange(x.shape[0], device=x.device), index]
    projection = parts["text_projection"]
    if projection is not None:
        pooled = projection(pooled) if isinstance(projection, torch.nn.Linear) else pooled @ projection
    return pooled
