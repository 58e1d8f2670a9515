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
normalise with the weights' mean/std). A file trained with other preprocessing says so in the
name: ``timm:NAME#mean=R/G/B,std=R/G/B,size=N|HxW,interpolation=MODE`` (the CLI's ``--mean``,
``--std``, ``--input-size``, ``--interpolation``; :func:`curate.models.spec.with_preprocess`), each
over timm's value; the run records the whole config (``info["preprocess"]``) and the overrides,
and the model id gains ``+prep-<8 hex of the config>``.

Models whose head is not ImageNet-1K are refused, except 1001-way heads with
``label_offset=1`` (a leading background class, e.g. TF-ported Inceptions), whose first
logit is dropped.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import torch

from curate.models.base import LoadedModel, ModelError, ModelNotFoundError, close_matches
from curate.models.clip import seeded, weights_key
from curate.models.registry import ModelRequest, register_backend
from curate.models.spec import split_preprocess
from curate.models.weights import Checkpoint, hub_offline, resolve_weights, state_mismatch, timm_weights_source

log = logging.getLogger(__name__)

IMAGENET_CLASSES = 1000
#: ``pretrained`` strings meaning "the tag in the name, else timm's default tag".
DEFAULT_TAG_WORDS = ("default", "timm", "pretrained")


class ClassifierModel(LoadedModel):
    """A timm ImageNet-1K classifier: ``logits`` (``[N, 1000]``) and pooled features.

    On a CPU, encoding (:meth:`fast_output`, which :func:`curate.engine.images.model_output` calls)
    runs :attr:`fast_module`: a copy with every batch norm folded into the convolution before it
    (:func:`curate.models.fold.fold_batchnorm`, checked against the original), laid out
    channels-last (``torch.channels_last``, oneDNN's fast layout for convolutions), :attr:`cpu_batch`
    images a pass. EfficientNet-Lite0 on 2 cores: 14 ms an image against 40 ms for timm's module
    one photo at a time (``benchmarks/classifier.py``); only float rounding changes. Everything
    else (:meth:`logits`, :meth:`encode_image`, gradients, saliency's layers and hooks) runs
    :attr:`module`, as built.
    """

    kind = "classifier"
    #: Images per forward pass when encoding on a CPU (class docstring).
    cpu_batch = 4

    def __init__(self, *, label_offset: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.label_offset = int(label_offset)
        self.fast_module = None
        self.folded = 0
        if self.device.type == "cpu" and self.precision in ("fp32", "amp", "amp_bf16"):  # float32 weights to fold
            from curate.models.fold import fold_batchnorm

            example = torch.rand(2, 3, *self.image_size, generator=torch.Generator().manual_seed(0))
            folded, self.folded = fold_batchnorm(self.module, example)
            if self.folded:
                self.fast_module = folded.to(memory_format=torch.channels_last)
                self.info["cpu_inference"] = {"batch_norms_folded": self.folded, "memory_format": "channels_last",
                                              "images_per_pass": self.cpu_batch}

    def fast_output(self, kind: str, batch: torch.Tensor) -> torch.Tensor:
        """What encoding keeps for a preprocessed batch on a CPU (class docstring): ``logits``, or
        the L2-normalised pooled features (``embedding``), from :attr:`fast_module` when there is
        one (else from :attr:`module`, as built), :attr:`cpu_batch` images a pass."""
        import torch.nn.functional as F

        module = self.module if self.fast_module is None else self.fast_module
        parts = []
        with torch.no_grad(), self.autocast():
            for start in range(0, len(batch), self.cpu_batch):
                x = self.to_input(batch[start:start + self.cpu_batch])
                if self.fast_module is not None:
                    x = x.contiguous(memory_format=torch.channels_last)
                if kind == "logits":
                    out = module(x).float()
                    parts.append(out[:, self.label_offset:] if self.label_offset else out)
                else:
                    feats = module.forward_head(module.forward_features(x), pre_logits=True)
                    parts.append(F.normalize((feats.flatten(1) if feats.ndim > 2 else feats).float(), dim=-1))
        return torch.cat(parts)

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


def data_config_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """:func:`curate.models.spec.split_preprocess`'s overrides as timm data-config entries: ``mean``,
    ``std``, ``input_size`` = ``(3, H, W)`` (the centre crop; the resize before it is
    ``size / crop_pct``, as timm's eval transform does), ``interpolation``."""
    cfg: dict[str, Any] = {}
    for key, value in overrides.items():
        if key == "size":
            cfg["input_size"] = (3, int(value[0]), int(value[1]))
        else:
            cfg[key] = tuple(value) if isinstance(value, (list, tuple)) else value
    return cfg


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


def _why_not(name: str, weights_file: Any, error: BaseException) -> str:
    """One line on why a weights file does not load into timm's ``name``: how its tensor names or
    shapes differ from the model's (:func:`curate.models.weights.state_mismatch`), else timm's
    first line."""
    import timm

    try:
        expected = timm.create_model(name, pretrained=False).state_dict()
        file_state = Checkpoint(weights_file).state_dict()
    except Exception:  # noqa: BLE001 - the description is a courtesy; timm's own words then
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return (lines[0] if lines else type(error).__name__)[:300]
    said = state_mismatch(file_state, expected)
    if set(file_state) != set(expected):
        said += "; weights saved by another library or for another architecture need their names converted"
    return said


@register_backend("timm")
def load_timm(req: ModelRequest) -> ClassifierModel:
    """Build a timm ImageNet-1K classifier for ``req`` (see the module docstring)."""
    import timm
    from timm.data import create_transform, resolve_model_data_config
    from timm.models import split_model_name_tag

    plain, overrides = split_preprocess(f"timm:{req.arch}")
    name = plain.removeprefix("timm:")
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
            raise ModelError(f"timm could not load {weights_file} into {name!r}: "
                             f"{_why_not(name, weights_file, exc)}") from exc

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

    data_cfg = dict(resolve_model_data_config(module))
    if overrides:
        data_cfg.update(data_config_overrides(overrides))
        model_id += "+prep-" + hashlib.sha256(json.dumps(data_cfg, sort_keys=True).encode()).hexdigest()[:8]
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
        "preprocess_overrides": {k: (list(v) if isinstance(v, tuple) else v) for k, v in overrides.items()},
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
