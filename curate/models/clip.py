"""open_clip models behind curate's :class:`~curate.models.base.LoadedModel` interface.

Any open_clip architecture (``open_clip.list_models()`` plus curate's tiny configs) with
weights from a pretrained tag (resolved to a file on disk, never downloaded: see
:mod:`curate.models.weights`), a local weights file, or random init (optionally seeded).

The model is always built with ``pretrained=None`` and the weights are then loaded by
:func:`apply_checkpoint`, which does what ``open_clip.load_checkpoint`` does (third-party
conversions, old text-tower layout, scalar/1-d ``logit_scale``, position-embedding resizing)
on a state dict read once by :class:`~curate.models.weights.Checkpoint`. A tag's preprocessing
(mean, std, interpolation, resize mode) is applied as open_clip would apply it.

QuickGELU: weights trained with QuickGELU (``quick_gelu`` in the tag's pretrained cfg: the
OpenAI, LAION-400M ViT-B/32, DFN, ... weights) need an architecture with ``quick_gelu``
(``ViT-B-32-quickgelu``); a mismatch runs without error but loses accuracy, so it raises a
:class:`~curate.models.base.QuickGELUWarning`. The zoo names carry the right architecture.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from curate.models.base import (
    LoadedModel,
    ModelError,
    ModelNotFoundError,
    QuickGELUWarning,
    WeightsNotFoundError,
    close_matches,
)
from curate.models.registry import ModelRequest, register_backend
from curate.models.weights import (
    Checkpoint,
    hub_offline,
    open_clip_weights_source,
    resolve_weights,
    state_mismatch,
)
from curate.models.zoo import paper_name

log = logging.getLogger(__name__)

#: Preprocessing keys a pretrained cfg (or a weights file's ``curate.preprocess``) may set.
PREPROCESS_KEYS = ("mean", "std", "interpolation", "resize_mode", "fill_color")


class ClipModel(LoadedModel):
    """An open_clip CLIP: ``encode_image`` and batched ``encode_text`` (float32 outputs)."""

    kind = "clip"

    def __init__(self, *, embed_dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._embed_dim = int(embed_dim)

    @property
    def embed_dim(self) -> int:
        return self._embed_dim

    @property
    def context_length(self) -> int:
        """Tokens per text (the tokenizer pads or truncates to it)."""
        return int(getattr(self.tokenizer, "context_length", 77))

    @property
    def logit_scale(self) -> float:
        """The learned temperature ``exp(logit_scale)`` (curate's zero-shot uses a fixed 100)."""
        return float(self.module.logit_scale.detach().float().exp().item())

    def _image_features(self, batch: torch.Tensor) -> torch.Tensor:
        return self.module.encode_image(batch)

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        """Token ids ``LongTensor[M, context_length]`` (CPU) from the model's own tokenizer."""
        if isinstance(texts, str):
            raise TypeError("pass a list of strings, not a single string")
        return self.tokenizer(list(texts))

    def encode_text(
        self,
        texts: Sequence[str],
        normalize: bool = True,
        *,
        batch_size: int = 256,
        grad: bool = False,
    ) -> torch.Tensor:
        """Text embeddings ``Tensor[M, D]`` (float32), tokenized and encoded ``batch_size`` at a time.

        L2-normalised when ``normalize``. An empty list gives ``Tensor[0, D]``.
        """
        if isinstance(texts, str):
            raise TypeError("encode_text takes a list of strings; wrap a single prompt as [prompt]")
        texts = list(texts)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not texts:
            return torch.empty(0, self.embed_dim, device=self.device)
        from curate.zeroshot.text_tower import encode_text_trimmed

        # Prompts are sorted by token length so each batch is cut at its own longest prompt
        # (exact for causal EOT-pooled towers; curate/zeroshot/text_tower.py), then unsorted.
        tokens = self.tokenizer(texts)
        lengths = (tokens != 0).sum(dim=1)
        order = torch.argsort(lengths, stable=True)
        chunks = []
        with self._grad_context(grad), self.autocast():
            for start in range(0, len(texts), batch_size):
                batch = tokens[order[start : start + batch_size]].to(self.device, non_blocking=True)
                chunks.append(encode_text_trimmed(self.module, batch).float())
        out = torch.cat(chunks)[torch.argsort(order).to(self.device)]
        return F.normalize(out, dim=-1) if normalize else out


# ----------------------------------------------------------------------------- helpers
class _DropRandomInitWarning(logging.Filter):
    """Hide open_clip's 'initialized randomly' warning: curate loads the weights itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No pretrained weights loaded for model")


@contextlib.contextmanager
def _quiet_random_init() -> Iterator[None]:
    root = logging.getLogger()
    flt = _DropRandomInitWarning()
    root.addFilter(flt)
    try:
        yield
    finally:
        root.removeFilter(flt)


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Run with the CPU RNG seeded (random init is reproducible across processes); restores it."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def pretrained_tag_cfg(arch: str, tag: str) -> dict[str, Any]:
    """open_clip's pretrained cfg for ``(arch, tag)``, or :class:`ModelNotFoundError`."""
    import os

    import open_clip

    if open_clip.is_pretrained_cfg(arch, tag):
        return dict(open_clip.get_pretrained_cfg(arch, tag))
    known = open_clip.list_pretrained_tags_by_model(arch)
    others = open_clip.list_pretrained_models_by_tag(tag)
    msg = f"open_clip architecture {arch!r} has no pretrained tag {tag!r}"
    if others:
        msg += f" (that tag exists for {', '.join(others[:8])})"
    if known:
        msg += f"; its tags are: {', '.join(known)}"
    else:
        msg += (
            "; it has no pretrained tags (pass a local weights file, or pretrained=None for random weights)"
        )
    if os.path.isfile(tag):
        msg += f"; to load the file {tag!r}, pass it as a path ('./{tag}') or a pathlib.Path"
    raise ModelNotFoundError(msg, close_matches(tag, known))


def check_quick_gelu(arch: str, tag: str, model_cfg: Mapping[str, Any], tag_cfg: Mapping[str, Any]) -> bool:
    """Warn (:class:`QuickGELUWarning`) when the tag's activation differs from the arch's.

    Returns True when they agree.
    """
    import open_clip

    model_qg = bool(model_cfg.get("quick_gelu", False))
    tag_qg = bool(tag_cfg.get("quick_gelu", False))
    if model_qg == tag_qg:
        return True
    better = f"{arch}-quickgelu" if tag_qg else arch.removesuffix("-quickgelu")
    if open_clip.get_model_config(better) is None:
        hint = "use a -quickgelu architecture" if tag_qg else "use the architecture without -quickgelu"
    else:
        zoo = paper_name(better, tag)
        hint = f"load {better!r} with pretrained {tag!r}" + (f", or the zoo name {zoo!r}" if zoo else "")
    if tag_qg:
        msg = (f"open_clip weights {arch}:{tag} were trained with QuickGELU but architecture {arch!r} uses GELU, "
               f"which silently costs about 3 points of accuracy (ViT-B/32): {hint}")
    else:
        msg = f"open_clip weights {arch}:{tag} were trained with GELU but architecture {arch!r} uses QuickGELU: {hint}"
    warnings.warn(msg, QuickGELUWarning, stacklevel=3)
    return False


def apply_checkpoint(model: torch.nn.Module, checkpoint: Checkpoint, arch: str) -> None:
    """Load ``checkpoint`` into an open_clip model, strictly (as ``open_clip.load_checkpoint``)."""
    import open_clip
    from open_clip.convert import convert_state_dict
    from open_clip.model import convert_to_custom_text_state_dict, resize_pos_embed, resize_text_pos_embed

    if checkpoint.is_npz:
        open_clip.load_checkpoint(model, str(checkpoint.path))
        return
    state = dict(checkpoint.state_dict())
    state = convert_state_dict(model, state)
    if "positional_embedding" in state and not hasattr(model, "positional_embedding"):
        state = convert_to_custom_text_state_dict(state)
    for key in ("logit_scale", "logit_bias"):
        target = getattr(model, key, None)
        if key in state and target is not None and target.ndim != state[key].ndim:
            state[key] = state[key].reshape(target.shape)
    if (
        "logit_bias" not in state
        and getattr(model, "logit_bias", None) is not None
        and "logit_scale" in state
    ):
        state["logit_bias"] = torch.zeros_like(state["logit_scale"])
    state.pop("text.transformer.embeddings.position_ids", None)
    # non-persistent buffers (e.g. the causal attn_mask) appear in TorchScript state dicts
    for key in {n for n, _ in model.named_buffers()} - set(model.state_dict()):
        state.pop(key, None)
    resize_pos_embed(state, model)
    resize_text_pos_embed(state, model)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        said = checkpoint.metadata.get("arch")
        hint = f" (the file's metadata says arch {said!r})" if said else ""
        raise ModelError(
            f"weights in {checkpoint.path} do not fit open_clip architecture {arch!r}{hint}: "
            f"{state_mismatch(state, model.state_dict())}; pass the architecture the weights were saved from"
        ) from exc
    finally:
        checkpoint.release()


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def weights_key(pretrained: Any, seed: int | None) -> str:
    """The weights part of a model id: tag, ``file-<sha256[:12]>``, ``random[-seed<N>]``."""
    if isinstance(pretrained, Checkpoint):
        return f"file-{pretrained.sha256[:12]}"
    if isinstance(pretrained, str):
        return pretrained.lower().replace("-", "_")  # open_clip's tag normalisation
    return "random" if seed is None else f"random-seed{int(seed)}"


# ----------------------------------------------------------------------------- the loader
@register_backend("open_clip")
def load_open_clip(req: ModelRequest) -> ClipModel:
    """Build an open_clip model for ``req`` (see the module docstring)."""
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2

    from curate.models.tiny import register_tiny_configs

    register_tiny_configs()
    arch = req.arch.replace("/", "-")
    model_cfg = open_clip.get_model_config(arch)
    if model_cfg is None:
        from curate.models.zoo import zoo_names

        suggestions = close_matches(arch, [*open_clip.list_models(), *zoo_names()])
        import timm

        if timm.is_model(arch):
            suggestions.insert(0, f"timm:{arch}")
        raise ModelNotFoundError(
            f"{req.name!r} is neither an open_clip architecture nor a zoo name "
            "(ImageNet classifiers are named 'timm:<model>')",
            suggestions,
        )

    tag_cfg: dict[str, Any] = {}
    checkpoint: Checkpoint | None = None
    quick_gelu_ok = True
    if isinstance(req.pretrained, str):
        tag = req.pretrained
        tag_cfg = pretrained_tag_cfg(arch, tag)
        quick_gelu_ok = check_quick_gelu(arch, tag, model_cfg, tag_cfg)
        if tag_cfg.get("file"):
            checkpoint = Checkpoint(tag_cfg["file"])
        else:
            checkpoint = Checkpoint(resolve_weights(open_clip_weights_source(arch, tag, tag_cfg)))
    elif isinstance(req.pretrained, Checkpoint):
        checkpoint = req.pretrained
        if req.zoo_tag:
            tag_cfg = dict(open_clip.get_pretrained_cfg(arch, req.zoo_tag))
    key = weights_key(req.pretrained, req.seed)

    preprocess_cfg = {k: tag_cfg[k] for k in PREPROCESS_KEYS if k in tag_cfg}
    if checkpoint is not None and isinstance(checkpoint.metadata.get("preprocess"), Mapping):
        file_pp = checkpoint.metadata["preprocess"]
        preprocess_cfg.update({k: file_pp[k] for k in PREPROCESS_KEYS if k in file_pp})

    with hub_offline(), seeded(req.seed if checkpoint is None else None), _quiet_random_init():
        try:
            module = open_clip.create_model(
                arch,
                pretrained=None,
                precision=req.precision,
                device=req.device,
                pretrained_image=False,
                pretrained_text=False,
                force_preprocess_cfg=preprocess_cfg or None,
            )
            tokenizer = open_clip.get_tokenizer(arch)
        except (OSError, RuntimeError, ValueError) as exc:
            if "offline" in str(exc).lower() or "cache" in str(exc).lower():
                raise WeightsNotFoundError(
                    f"building open_clip {arch!r} needs Hugging Face files (config or tokenizer) that "
                    f"are not cached, and curate never downloads: {exc}"
                ) from exc
            raise
    if checkpoint is not None:
        apply_checkpoint(module, checkpoint, arch)
    module.eval()

    pp_cfg = PreprocessCfg(**module.visual.preprocess_cfg)
    preprocess = image_transform_v2(pp_cfg, is_train=False)
    info = {
        "backend": "open_clip",
        "arch": arch,
        "pretrained": req.pretrained if isinstance(req.pretrained, str) else None,
        "weights_file": str(checkpoint.path) if checkpoint is not None else None,
        "sha256": req.pretrained.sha256 if isinstance(req.pretrained, Checkpoint) else None,
        "seed": req.seed if checkpoint is None else None,
        "zoo_name": req.zoo_name,
        "quick_gelu": bool(model_cfg.get("quick_gelu", False)),
        "quick_gelu_matches_weights": quick_gelu_ok,
        "preprocess": _jsonable(module.visual.preprocess_cfg),
        "metadata": _jsonable(checkpoint.metadata) if checkpoint is not None else {},
        "device": str(req.device),
        "precision": req.precision,
    }
    return ClipModel(
        module=module,
        model_id=f"open_clip:{arch}:{key}",
        preprocess=preprocess,
        image_size=pp_cfg.size,
        device=req.device,
        precision=req.precision,
        tokenizer=tokenizer,
        cache_safe=checkpoint is not None or req.seed is not None,
        embed_dim=int(model_cfg["embed_dim"]),
        info=info,
    )
