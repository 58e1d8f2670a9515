"""ImageNet-1K classifiers from timm, named ``"timm:<model>[.<tag>]"``.

Scored on their own 1000-way logits (index order = ImageNet-1K class index, as in
``curate.labels.imagenet1k()``); ``encode_image`` gives the pooled pre-logits features.

Weights (never downloaded):

- ``pretrained=None``: random init (seed it with ``seed=`` for a reproducible, cache-safe id);
- a tag (``"a1_in1k"``), or ``"default"`` for the tag in the name or timm's default tag:
  the file timm would download is looked up on disk
  (:func:`curate.models.weights.timm_weights_source`) and handed to
  ``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=...))``;
- a local file: the same call with that file.

The eval transform is timm's: ``timm.data.resolve_model_data_config`` then
``timm.data.create_transform(is_training=False)`` (resize by ``crop_pct``, center crop,
normalise with the weights' mean/std).

Models whose head is not ImageNet-1K are refused, except 1001-way heads with
``label_offset=1`` (a leading background class, e.g. TF-ported Inceptions), whose first
logit is dropped.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from curate.models.base import LoadedModel, ModelError, ModelNotFoundError, close_matches
from curate.models.clip import seeded, weights_key
from curate.models.registry import ModelRequest, register_backend
from curate.models.weights import Checkpoint, hub_offline, resolve_weights, timm_weights_source

log = logging.getLogger(__name__)

IMAGENET_CLASSES = 1000
#: ``pretrained`` strings meaning "the tag in the name, else timm's default tag".
DEFAULT_TAG_WORDS = ("default", "timm", "pretrained")


class ClassifierModel(LoadedModel):
    """A timm ImageNet-1K classifier: ``logits`` (``[N, 1000]``) and pooled features."""

    kind = "classifier"

    def __init__(self, *, label_offset: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.label_offset = int(label_offset)

    @property
    def num_classes(self) -> int:
        return IMAGENET_CLASSES

    @property
    def embed_dim(self) -> int:
        m = self.module
        return int(getattr(m, "head_hidden_size", None) or m.num_features)

    def _image_features(self, batch: torch.Tensor) -> torch.Tensor:
        feats = self.module.forward_head(self.module.forward_features(batch), pre_logits=True)
        return feats.flatten(1) if feats.ndim > 2 else feats

    def logits(self, batch: torch.Tensor, *, grad: bool = False) -> torch.Tensor:
        """ImageNet-1K logits ``Tensor[N, 1000]`` (float32)."""
        with self._grad_context(grad), self.autocast():
            out = self.module(self.to_input(batch))
        out = out.float()
        return out[:, self.label_offset :] if self.label_offset else out


def _timm_pretrained_cfg(arch: str, name_tag: str, pretrained: str) -> Any:
    """The timm pretrained cfg for the requested tag, or :class:`ModelNotFoundError`."""
    import timm
    from timm.models import get_pretrained_cfg

    tag = name_tag if pretrained.lower() in DEFAULT_TAG_WORDS else pretrained
    if name_tag and tag != name_tag:
        raise ModelNotFoundError(
            f"timm name '{arch}.{name_tag}' already names the tag {name_tag!r} but pretrained={pretrained!r}; "
            f"give the tag once (pretrained='default' uses the one in the name)"
        )
    full = f"{arch}.{tag}" if tag else arch
    known = [n.partition(".")[2] for n in timm.list_pretrained(f"{arch}.*")]
    try:
        cfg = get_pretrained_cfg(full, allow_unregistered=False)
    except RuntimeError:
        cfg = None
    if cfg is None or (tag and tag not in known):
        raise ModelNotFoundError(
            f"timm has no pretrained weights {full!r}"
            + (f"; tags for {arch}: {', '.join(known)}" if known else f"; {arch} has no pretrained tags"),
            close_matches(tag, known) if tag else [],
        )
    return cfg


@register_backend("timm")
def load_timm(req: ModelRequest) -> ClassifierModel:
    """Build a timm ImageNet-1K classifier for ``req`` (see the module docstring)."""
    import timm
    from timm.data import create_transform, resolve_model_data_config
    from timm.models import split_model_name_tag

    name = req.arch
    arch, name_tag = split_model_name_tag(name)
    if not timm.is_model(arch):
        raise ModelNotFoundError(f"timm has no model {arch!r}", close_matches(arch, timm.list_models()))

    create_kwargs: dict[str, Any] = {}
    weights_file = None
    file_metadata: dict[str, Any] = {}
    if isinstance(req.pretrained, str):
        cfg = _timm_pretrained_cfg(arch, name_tag, req.pretrained)
        if cfg.num_classes not in (IMAGENET_CLASSES, IMAGENET_CLASSES + 1):
            raise ModelError(
                f"timm weights {arch}.{cfg.tag} have {cfg.num_classes} classes; curate scores ImageNet-1K "
                "classifiers (1000 logits): pick an *in1k tag"
            )
        weights_file = resolve_weights(timm_weights_source(f"{arch}.{cfg.tag}", cfg.to_dict()))
        name = f"{arch}.{cfg.tag}"
        create_kwargs = {"pretrained": True, "pretrained_cfg_overlay": {"file": str(weights_file)}}
        model_id = f"timm:{arch}:{cfg.tag}"
    elif isinstance(req.pretrained, Checkpoint):
        weights_file = req.pretrained.path
        file_metadata = req.pretrained.metadata
        req.pretrained.release()  # timm reads the file itself
        create_kwargs = {"pretrained": True, "pretrained_cfg_overlay": {"file": str(weights_file)}}
        model_id = f"timm:{name}:{weights_key(req.pretrained, None)}"
    else:
        create_kwargs = {"pretrained": False}
        model_id = f"timm:{name}:{weights_key(None, req.seed)}"

    with hub_offline(), seeded(req.seed if weights_file is None else None):
        try:
            module = timm.create_model(name, **create_kwargs)
        except (RuntimeError, KeyError) as exc:
            if weights_file is None:
                raise
            raise ModelError(f"timm could not load {weights_file} into {name!r}: {str(exc)[:600]}") from exc

    label_offset = int(getattr(module, "pretrained_cfg", {}).get("label_offset") or 0)
    if module.num_classes - label_offset != IMAGENET_CLASSES:
        raise ModelError(
            f"timm model {name!r} has {module.num_classes} outputs; curate scores ImageNet-1K classifiers "
            "(1000 logits)"
        )
    precision = req.precision
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    module = module.to(req.device, dtype=dtype) if dtype is not None else module.to(req.device)
    module.eval()

    data_cfg = resolve_model_data_config(module)
    preprocess = create_transform(**data_cfg, is_training=False)
    info = {
        "backend": "timm",
        "arch": arch,
        "name": name,
        "pretrained": req.pretrained if isinstance(req.pretrained, str) else None,
        "weights_file": str(weights_file) if weights_file is not None else None,
        "sha256": req.pretrained.sha256 if isinstance(req.pretrained, Checkpoint) else None,
        "seed": req.seed if weights_file is None else None,
        "label_offset": label_offset,
        "preprocess": {k: (list(v) if isinstance(v, tuple) else v) for k, v in data_cfg.items()},
        "metadata": file_metadata,
        "device": str(req.device),
        "precision": precision,
    }
    return ClassifierModel(
        module=module,
        model_id=model_id,
        preprocess=preprocess,
        image_size=data_cfg["input_size"],
        device=req.device,
        precision=precision,
        tokenizer=None,
        cache_safe=weights_file is not None or req.seed is not None,
        label_offset=label_offset,
        info=info,
    )
