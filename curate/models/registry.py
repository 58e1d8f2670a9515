"""Model backends by name prefix, and the request a backend receives.

A name ``"<prefix>:<arch>"`` is handled by the backend registered under ``<prefix>``
(``open_clip``, ``timm``); a name without a known prefix is a zoo name or an open_clip
architecture. Backends are registered as import strings so that ``import curate.models``
does not import torch, open_clip or timm; ``register_backend`` also takes a callable (or
decorates one) to add a backend at run time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from curate.models.base import ModelNotFoundError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from curate.models.base import LoadedModel
    from curate.models.weights import Checkpoint

#: The backend used for names without a prefix.
DEFAULT_BACKEND = "open_clip"


@dataclass
class ModelRequest:
    """What a backend is asked to load.

    Attributes:
        name: the name as the caller gave it (or as a weights file's metadata gave it).
        arch: the backend's architecture name (prefix and zoo name resolved away).
        pretrained: a pretrained tag, a local weights file, or None for random weights.
        device: target device.
        precision: one of :data:`curate.models.base.PRECISIONS`.
        seed: seed for random init (ignored when weights are loaded).
        zoo_name: the paper name, when ``name`` was one.
        zoo_tag: the zoo's pretrained tag for ``zoo_name`` (its preprocessing applies even
            when the weights come from a local file).
    """

    name: str
    arch: str
    pretrained: str | Checkpoint | None
    device: torch.device
    precision: str = "fp32"
    seed: int | None = None
    zoo_name: str | None = None
    zoo_tag: str | None = None


Loader = Callable[[ModelRequest], "LoadedModel"]

_BACKENDS: dict[str, Union[Loader, str]] = {
    "open_clip": "curate.models.clip:load_open_clip",
    "timm": "curate.models.classifier:load_timm",
    "lvlm": "curate.lvlm.hf:load_lvlm_backend",
    "endpoint": "curate.lvlm.endpoint:load_endpoint_backend",
}


def register_backend(prefix: str, loader: Loader | str | None = None) -> Any:
    """Register ``loader`` (a callable or ``"module:function"``) for names ``"<prefix>:..."``.

    Without ``loader`` it returns a decorator.
    """
    if not prefix or ":" in prefix:
        raise ValueError(f"a backend prefix must be non-empty and contain no ':', got {prefix!r}")
    if loader is None:

        def decorate(fn: Loader) -> Loader:
            _BACKENDS[prefix] = fn
            return fn

        return decorate
    _BACKENDS[prefix] = loader
    return loader


def backends() -> list[str]:
    """The registered backend prefixes."""
    return sorted(_BACKENDS)


def get_backend(prefix: str) -> Loader:
    """The loader registered for ``prefix`` (importing it on first use)."""
    try:
        entry = _BACKENDS[prefix]
    except KeyError:
        raise ModelNotFoundError(f"no model backend {prefix!r}; known: {', '.join(backends())}") from None
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        module = importlib.import_module(module_name)  # importing registers the callable
        entry = _BACKENDS[prefix] if not isinstance(_BACKENDS[prefix], str) else getattr(module, attr)
        _BACKENDS[prefix] = entry
    return entry


def split_prefix(name: str) -> tuple[str | None, str]:
    """``"timm:resnet50"`` -> ``("timm", "resnet50")``; no known prefix -> ``(None, name)``."""
    prefix, sep, rest = name.partition(":")
    if sep and prefix in _BACKENDS:
        return prefix, rest
    return None, name
