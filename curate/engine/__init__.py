"""Engines: where the heavy per-sample work of a stage runs (``docs/design.md#engines``).

- :mod:`curate.engine.base`: the seam (:class:`Engine`, :class:`EncodeJob`, :class:`BatchOutput`);
- :mod:`curate.engine.local`: in-process (a torch ``DataLoader``);
- :mod:`curate.engine.ray_data`: Ray Data (CPU decode tasks, a model actor pool);
- :mod:`curate.engine.session`: starting or joining a Ray cluster;
- :mod:`curate.engine.identity`: naming a model without loading it (re-scoring loads nothing).

:func:`make_engine` builds the engine a stage's settings name. Importing this package imports
neither torch nor Ray.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from curate.engine.defaults import RAY_RELEASE_WAIT_S, RAY_START_TIMEOUT_S

__all__ = ["ENGINES", "RAY_RELEASE_WAIT_S", "RAY_START_TIMEOUT_S", "make_engine", "ray_waits"]

ENGINES = ("local", "ray")

#: the Ray engine's two bounded waits for engines made in this context (:func:`ray_waits`)
_RAY_WAITS: ContextVar[tuple[tuple[str, float], ...]] = ContextVar("curate_ray_waits", default=())


@contextlib.contextmanager
def ray_waits(*, release_wait_s: float | None = None, start_timeout_s: float | None = None) -> Iterator[None]:
    """Within the block, every Ray engine :func:`make_engine` builds without its own values waits
    ``release_wait_s`` (after a lost node, for the failed pipeline's CPUs) and ``start_timeout_s``
    (for a pipeline's actors to start); None keeps the engine's default (:data:`RAY_RELEASE_WAIT_S`,
    :data:`RAY_START_TIMEOUT_S`).
    The CLI's ``--ray-release-wait`` and ``--ray-start-timeout`` set them for the verb, whatever
    stage it runs."""
    waits = {k: v for k, v in (("release_wait_s", release_wait_s), ("start_timeout_s", start_timeout_s))
             if v is not None}
    token = _RAY_WAITS.set(tuple({**dict(_RAY_WAITS.get()), **waits}.items()))
    try:
        yield
    finally:
        _RAY_WAITS.reset(token)


def make_engine(name: str = "local", *, workers: int | None = None, ray_address: str | None = None,
                gpus_per_worker: float = 0.0, release_wait_s: float | None = None,
                start_timeout_s: float | None = None) -> Any:
    """The engine called ``name``: ``local`` (``workers`` = decoding processes) or ``ray``
    (``workers`` = model actors, default 1; ``ray_address`` None starts a local instance;
    ``release_wait_s`` and ``start_timeout_s``: its bounded waits, else those of
    :func:`ray_waits`, else its defaults)."""
    if name == "local":
        if ray_address or gpus_per_worker:
            raise ValueError("--ray-address and --gpus-per-worker need --engine ray")
        from curate.engine.local import LocalEngine

        return LocalEngine(workers=workers)
    if name == "ray":
        from curate.engine.ray_data import RayEngine
        from curate.engine.session import check_address

        if ray_address:  # a dead address fails now, before a stage opens the folder or loads a model
            check_address(ray_address)
        waits = dict(_RAY_WAITS.get())
        return RayEngine(ray_address, workers=workers or 1, gpus_per_worker=gpus_per_worker,
                         release_wait_s=waits.get("release_wait_s") if release_wait_s is None else release_wait_s,
                         start_timeout_s=waits.get("start_timeout_s") if start_timeout_s is None else start_timeout_s)
    raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {name!r}")


def stage_model(spec: Any, root: Any, loader: Any, *, device: str = "auto", precision: str = "fp32") -> Any:
    """The model a stage uses for ``spec``: lazy when its identity is recorded under ``root``
    (:mod:`curate.engine.identity`), loaded now otherwise, with a :class:`ModelFactory` that
    remote workers load it with (``model.factory``; None for random weights, which are
    shipped by value)."""
    from curate.engine.base import ModelFactory
    from curate.engine.identity import LazyModel, lazy_model

    # this run's device and precision, not the recorded run's: the feature cache is keyed on
    # the precision (and, for ``amp``, the device kind) without loading the model
    model = lazy_model(spec.name, spec.pretrained, root, loader, overrides={"precision": precision, "device": device})
    factory = None
    if spec.pretrained and getattr(model, "cache_safe", False):
        factory = ModelFactory(spec.name, spec.pretrained, precision=precision, expected_model_id=model.model_id)
    if isinstance(model, LazyModel):
        model.factory = factory
    else:
        try:
            model.factory = factory
        except AttributeError:  # pragma: no cover - a model class with __slots__
            pass
    return model
