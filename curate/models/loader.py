"""``load_model``: one entry point for every model curate scores.

Names:

- ``"timm:<model>[.<tag>]"``: an ImageNet-1K classifier (:mod:`curate.models.classifier`);
- ``"open_clip:<arch>"`` or a bare open_clip architecture (``"ViT-B-32-quickgelu"``,
  ``"ViT-B/32"``, ``"curate-tiny-clip"``): a CLIP (:mod:`curate.models.clip`);
- a paper name from the zoo (``"CLIP-LAION400M-ViT-B/32"``): its open_clip architecture, with
  the zoo's pretrained tag unless ``pretrained`` is given;
- ``None`` or ``"auto"``: the architecture recorded in a local weights file's metadata
  (``{"state_dict": ..., "curate": {"arch": "curate-tiny-clip"}}``, as written by
  ``curate train-reference``).

``pretrained``: a pretrained tag (``"laion400m_e31"``), a local weights file (a
:class:`pathlib.Path`, or a string that looks like a path: contains a separator, starts with
``~`` or ``.``, or ends in .pt/.pth/.bin/.safetensors/.ckpt/.npz), or ``None`` for random
weights (``seed=`` makes them reproducible and their ``model_id`` cache-safe).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from curate.models.base import LoadedModel, ModelNotFoundError, check_precision, resolve_device
from curate.models.registry import DEFAULT_BACKEND, ModelRequest, get_backend, split_prefix
from curate.models.weights import Checkpoint, checkpoint_arch, looks_like_path
from curate.models.zoo import find_zoo_entry

log = logging.getLogger(__name__)

AUTO_NAMES = (None, "", "auto")


def as_pretrained(pretrained: str | Path | Checkpoint | None) -> str | Checkpoint | None:
    """Normalise ``pretrained``: None, a tag string, or a :class:`Checkpoint` for a file.

    Raises :class:`~curate.models.base.WeightsNotFoundError` for a path that does not exist.
    """
    if pretrained is None or isinstance(pretrained, Checkpoint):
        return pretrained
    if isinstance(pretrained, Path):
        return Checkpoint(pretrained)
    if not isinstance(pretrained, str):
        raise TypeError(f"pretrained must be a tag, a path or None, not {type(pretrained).__name__}")
    value = pretrained.strip()
    if not value:
        return None
    return Checkpoint(value) if looks_like_path(value) else value


def parse_model_name(name: str) -> tuple[str, str, str | None, str | None]:
    """``name`` -> ``(backend, arch, zoo_name, zoo_tag)``; zoo fields are None for non-zoo names."""
    prefix, rest = split_prefix(name)
    if prefix is not None:
        if not rest:
            raise ModelNotFoundError(f"model name {name!r} names no model after '{prefix}:'")
        return prefix, rest, None, None
    entry = find_zoo_entry(name)
    if entry is not None:
        return DEFAULT_BACKEND, entry.model, name, entry.pretrained
    if ":" in name:
        head = name.partition(":")[0]
        from curate.models.registry import backends

        raise ModelNotFoundError(
            f"model name {name!r} has an unknown prefix {head!r}; known prefixes: "
            f"{', '.join(backends())} (or a bare open_clip architecture / zoo name)"
        )
    return DEFAULT_BACKEND, name, None, None


def _same_model(a: str, b: str) -> bool:
    try:
        pa, pb = parse_model_name(a), parse_model_name(b)
    except ModelNotFoundError:
        return a == b
    arch_a, arch_b = (p[1].partition("#")[0] if p[0] == "timm" else p[1] for p in (pa, pb))  # timm: options aside
    return (pa[0], arch_a.replace("/", "-")) == (pb[0], arch_b.replace("/", "-"))


def load_model(
    name: str | None,
    pretrained: str | Path | Checkpoint | None = None,
    *,
    device: Any = "cpu",
    precision: str = "fp32",
    seed: int | None = None,
) -> LoadedModel:
    """Load a CLIP or an ImageNet classifier by name (see the module docstring).

    Args:
        name: model name, zoo name, ``"timm:<model>"``, or None/``"auto"`` with a local file.
        pretrained: pretrained tag, local weights file, or None (random weights).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``, or ``"auto"``.
        precision: ``fp32`` | ``fp16`` | ``bf16`` | ``amp`` | ``amp_bf16``; ``model_id`` does not
            depend on it.
        seed: seed for random init (only used when no weights are loaded).

    Returns:
        A :class:`~curate.models.base.LoadedModel` in eval mode.

    Raises:
        ModelNotFoundError: unknown name, zoo name or tag (with close matches).
        WeightsNotFoundError: the weights are not on disk (immediately; nothing is downloaded).
        ModelError: the weights file cannot be read or does not fit the architecture.
    """
    check_precision(precision)
    weights = as_pretrained(pretrained)
    if name in AUTO_NAMES:
        if not isinstance(weights, Checkpoint):
            raise ModelNotFoundError(
                "no model name given: name=None/'auto' needs a local weights file whose curate metadata "
                "names its architecture (pass e.g. load_model('curate-tiny-clip', 'ref.pt'))"
            )
        inferred = checkpoint_arch(weights)
        if not inferred:
            raise ModelNotFoundError(
                f"{weights.path} carries no curate metadata naming its architecture "
                "({'curate': {'arch': ...}}); pass the model name explicitly"
            )
        log.info("architecture %r taken from %s", inferred, weights.path)
        name = inferred
    assert name is not None
    backend, arch, zoo_name, zoo_tag = parse_model_name(name)
    if weights is None and zoo_tag is not None:
        weights = zoo_tag
    if isinstance(weights, Checkpoint):
        recorded = checkpoint_arch(weights)
        if recorded and not _same_model(recorded, name):
            warnings.warn(
                f"{weights.path} was saved from {recorded!r} but is being loaded as {name!r}",
                UserWarning,
                stacklevel=2,
            )
    request = ModelRequest(
        name=name,
        arch=arch,
        pretrained=weights,
        device=resolve_device(device),
        precision=precision,
        seed=seed,
        zoo_name=zoo_name,
        zoo_tag=zoo_tag,
    )
    model = get_backend(backend)(request)
    log.info("loaded %s (%s) on %s", model.model_id, model.kind, model.device)
    return model
