"""The engine seam: one "map batches over samples" interface (``docs/design.md#engines``).

An :class:`Engine` takes a dataset, the sample ids to encode and an :class:`EncodeJob` (which
model, which output, the batch size) and yields one :class:`BatchOutput` per batch. Batches are
always consecutive runs of ``batch_size`` ids in the order given, whatever the engine, so an
fp32 CPU output is bit-identical on every engine (BLAS kernels round differently for different
batch shapes, so the batches themselves must match). Writing the results (the feature cache)
is the caller's job (:func:`curate.features.compute_features`), so every engine fills the same
cache; the engines never import the cache (it imports them): what they run per batch lives in
:mod:`curate.engine.images`, or comes in the job (:attr:`EncodeJob.output`). Implementations:
:class:`curate.engine.local.LocalEngine` (in-process, a torch ``DataLoader``) and
:class:`curate.engine.ray_data.RayEngine` (Ray Data: CPU decode tasks and a model actor pool).
Another engine (Spark, Daft) implements :meth:`Engine.map_batches`.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["BatchJob", "BatchOutput", "DecodeImages", "EncodeJob", "Engine", "ModelFactory", "batches_of", "encode_batch",
           "halving", "is_out_of_memory", "remote_factory", "worker_model"]


@dataclass
class BatchOutput:
    """One batch's result: outputs of the samples that succeeded, and the failures."""

    sample_ids: list[str]
    values: np.ndarray  # (n, D) float32, rows in ``sample_ids`` order
    failed: dict[str, str] = field(default_factory=dict)  # sample id -> reason

    @property
    def count(self) -> int:
        """Samples this batch accounts for (successes and failures)."""
        return len(self.sample_ids) + len(self.failed)


@dataclass(frozen=True)
class ModelFactory:
    """A picklable recipe that loads the model in a worker: ``load_model(name, pretrained)``.

    ``expected_model_id`` guards against a worker whose files resolve to other weights.
    """

    name: str
    pretrained: str | None
    device: str = "cpu"
    precision: str = "fp32"
    expected_model_id: str | None = None

    def __call__(self):
        from curate.models import load_model

        model = load_model(self.name, self.pretrained, device=self.device, precision=self.precision)
        if self.expected_model_id and model.model_id != self.expected_model_id:
            raise RuntimeError(f"a worker loaded {model.model_id} for {self.name}:{self.pretrained}, but the driver "
                               f"has {self.expected_model_id}: the weights file differs on that node")
        return model


@dataclass(frozen=True)
class _ShippedModel:
    """A factory that carries an already loaded model by value (random weights, test models)."""

    model: Any

    def __call__(self):
        return self.model


@dataclass
class EncodeJob:
    """What to compute for every sample: ``kind`` outputs of a model, ``batch_size`` at a time.

    ``model`` is the driver's model (possibly not loaded yet, see
    :class:`curate.engine.identity.LazyModel`); ``factory`` loads it in a remote worker (None:
    the driver's model is shipped by value).
    """

    model: Any
    kind: str
    batch_size: int = 256
    factory: Callable[[], Any] | None = None
    #: ``output(model, kind, batch)``: the tensor to keep per image (None:
    #: :func:`curate.engine.images.model_output`); picklable (a module-level function) for remote workers
    output: Callable[[Any, str, Any], Any] | None = None
    #: how files become the model's input: ``cpu-exact`` or ``gpu`` (already chosen:
    #: :func:`curate.engine.images.choose_input_path`); the ``gpu`` path runs on the local engine only
    input_path: str = "cpu-exact"

    @classmethod
    def for_model(cls, model: Any, kind: str, *, batch_size: int = 256,
                  output: Callable[[Any, str, Any], Any] | None = None, input_path: str = "cpu-exact") -> EncodeJob:
        return cls(model=model, kind=kind, batch_size=batch_size, factory=getattr(model, "factory", None),
                   output=output, input_path=input_path)

    def remote_factory(self, device: str) -> Callable[[], Any]:
        """The factory a remote worker calls (:func:`remote_factory` of this job's model)."""
        return remote_factory(self.model, self.factory, device)


def remote_factory(model: Any, factory: Callable[[], Any] | None, device: str) -> Callable[[], Any]:
    """What a remote worker loads ``model`` with: ``factory`` moved to ``device`` (a
    :class:`ModelFactory`), else ``factory``, else the driver's model shipped by value."""
    if isinstance(factory, ModelFactory):
        return ModelFactory(factory.name, factory.pretrained, device, factory.precision, factory.expected_model_id)
    if factory is not None:
        return factory
    return _ShippedModel(model.materialise() if hasattr(model, "materialise") else model)


@dataclass
class BatchJob:
    """The second job kind: any per-batch work, decoded in CPU tasks, run by stateful workers.

    ``items`` holds one picklable item per sample id (in the order of the ids given to
    :meth:`Engine.map_batches`); batches are the same consecutive runs of ``batch_size`` items
    as for an :class:`EncodeJob`. ``decode(items_of_one_batch)`` runs where the engine decodes
    (DataLoader workers, Ray CPU tasks) and returns a payload; ``worker(device)`` is called once
    per worker (an actor: one model load) and returns ``run``; ``run(payload)`` returns the
    batch's result. ``map_batches`` yields the results in batch order. Everything here must be
    picklable (module-level classes; no lambdas). Used by the explain stage
    (:mod:`curate.stages.explain`).
    """

    items: list[Any]
    batch_size: int
    decode: Callable[[list[Any]], Any]
    worker: Callable[[str], Callable[[Any], Any]]
    #: the device the local worker runs on (``cuda:0``, ``cpu``; None: unknown): the local
    #: engine sizes its decoding processes by it when given none
    #: (:func:`curate.engine.images.default_workers`) and pins the decoded batches for CUDA
    device: str | None = None


class DecodeImages:
    """A :class:`BatchJob` ``decode`` for jobs whose items are dicts with a ``sample_id``: one
    batch -> ``{"images": the PIL images that decoded, "items": their items, "failed": {sample id:
    reason}}`` (a failure is reported per sample, never fatal; ``prefix`` starts each reason).
    Used by LVLM scoring and mask proposals; picklable (it runs in loader workers or Ray tasks)."""

    def __init__(self, ds: Any, prefix: str = "") -> None:
        self.ds, self.prefix = ds, prefix

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        images, good, failed = [], [], {}
        for item in items:
            try:
                images.append(self.ds.load_image(item["sample_id"]))
                good.append(item)
            except Exception as error:  # noqa: BLE001 - reported per sample, never fatal
                failed[item["sample_id"]] = f"{self.prefix}{type(error).__name__}: {error}"[:300]
        return {"images": images, "items": good, "failed": failed}


class Engine(Protocol):
    """Maps the model over batches of samples; see the module docstring."""

    name: str

    def map_batches(self, dataset: Any, sample_ids: Sequence[str], job: EncodeJob | BatchJob) -> Iterator[Any]:
        """One output per batch of ``job.batch_size`` consecutive ``sample_ids``: a
        :class:`BatchOutput` for an :class:`EncodeJob`, ``run(payload)`` for a :class:`BatchJob`
        (in batch order)."""
        ...


def batches_of(sample_ids: Sequence[str], batch_size: int) -> list[list[str]]:
    """The batches every engine uses: consecutive runs of ``batch_size`` ids."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    ids = list(sample_ids)
    return [ids[i:i + batch_size] for i in range(0, len(ids), batch_size)]


def is_out_of_memory(error: BaseException) -> bool:
    """A device (or host) out-of-memory error, after which a smaller batch may fit."""
    import torch

    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def halving(items: Sequence[Any], size: int, run: Callable[[Sequence[Any]], None], *, what: str = "batch") -> int:
    """Call ``run`` on consecutive chunks of ``items`` of at most ``size``; on out of memory
    (:func:`is_out_of_memory`) halve the chunk size and retry that chunk (a chunk of one that
    still does not fit re-raises). Returns the chunk size that worked last (callers keep it for
    the next call). Used by in-process models that batch within a call (LVLMs, mask backends).
    """
    import torch

    start = 0
    size = max(1, int(size))
    while start < len(items):
        chunk = items[start:start + size]
        try:
            run(chunk)
        except Exception as error:  # noqa: BLE001 - only OOM is handled, the rest re-raised
            if not is_out_of_memory(error) or size == 1:
                raise
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            size = max(1, size // 2)
            logger.warning("out of memory with a %s of %d; halving to %d and going on", what, len(chunk), size)
            continue
        start += len(chunk)
    return size


def worker_model(driver_model: Any | None, device: str, load: Callable[[str], Any], expected_model_id: str,
                 what: str) -> Any:
    """The model a :class:`BatchJob` worker runs: the driver's own on the local engine (``device``
    ``auto``), else ``load(device)`` once in the worker (a Ray actor), refused when it names other
    weights than the driver's (``what``: where it was loaded from, for the message)."""
    if device == "auto" and driver_model is not None:
        return driver_model
    model = load(device)
    if model.model_id != expected_model_id:
        raise RuntimeError(f"a worker loaded {model.model_id} from {what}, but the driver has {expected_model_id}: "
                           "the model folder differs on that node")
    return model


def _run_halving(run: Callable[[Any], Any], batch: Any) -> np.ndarray:
    """``run(batch)``; on out-of-memory, the two halves separately (recursively), then joined."""
    try:
        return run(batch).float().cpu().numpy()
    except Exception as error:
        if not is_out_of_memory(error) or len(batch) <= 1:
            raise
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        half = len(batch) // 2
        logger.warning("out of memory on a batch of %d; retrying as %d + %d", len(batch), half, len(batch) - half)
        return np.concatenate([_run_halving(run, batch[:half]), _run_halving(run, batch[half:])])


def encode_batch(model: Any, kind: str, ids: Sequence[str], pixels: Any, errors: Sequence[str],
                 output: Callable[[Any, str, Any], Any] | None = None) -> BatchOutput:
    """Run ``model`` on the decoded rows of one batch (``errors[i]`` non-empty: decoding failed).

    ``output(model, kind, batch)`` computes the outputs (default
    :func:`curate.engine.images.model_output`). Outputs with NaN/inf become failures. The batch
    halves on out-of-memory.
    """
    import torch

    from curate.engine.images import model_output

    run = output or model_output

    failed = {ids[i]: e for i, e in enumerate(errors) if e}
    good = [i for i, e in enumerate(errors) if not e]
    if not good:
        return BatchOutput([], np.zeros((0, 0), np.float32), failed)
    batch = torch.as_tensor(pixels)
    if len(good) < len(ids):
        batch = batch[good]
    values = _run_halving(lambda b: run(model, kind, b), batch)
    finite = np.isfinite(values).all(axis=1)
    for j in np.flatnonzero(~finite):
        failed[ids[good[j]]] = "non-finite model output (NaN or inf)"
    keep = np.flatnonzero(finite)
    return BatchOutput([ids[good[j]] for j in keep], np.ascontiguousarray(values[keep], dtype=np.float32), failed)
