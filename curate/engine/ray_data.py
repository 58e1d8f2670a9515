"""The Ray Data engine: the same batches as the local engine, on a cluster.

Pipeline (all Ray Data operators; no scheduler, queue or RPC of ours):

1. ``ray.data.read_parquet`` reads ``sample_id`` and ``filepath`` from the dataset's samples
   files; a map keeps the ids to encode and tags each with its batch number and position
   (batch ``b`` = ids ``b * batch_size .. (b + 1) * batch_size - 1`` in the order given, as in
   every engine, :mod:`curate.engine.base`);
2. the driver gathers those small rows (a few strings per sample, never pixels) into one
   manifest per batch (ids and paths in order), and ``ray.data.from_items`` feeds them on (a
   Ray Data ``groupby`` would do the same with an all-to-all shuffle whose aggregator actors
   deadlock against the model actors on a 2-CPU machine);
3. CPU tasks decode and preprocess a batch's images (``map_batches``, one manifest per call);
4. an actor pool runs the model: ``workers`` actors, one model load each
   (:class:`curate.engine.base.ModelFactory`), ``num_gpus=gpus_per_worker`` when GPUs are
   asked for; a batch that runs out of memory is halved (:func:`curate.engine.base.encode_batch`);
   an actor that dies is restarted by Ray and its batch retried;
5. the driver iterates the results and the caller writes them into the feature cache as
   shards (:func:`curate.features.compute_features`): the same cache and run folders as the
   local engine. The dataset folder must be on storage every node can read (NFS, a shared
   volume): workers open the images by path.

A :class:`curate.engine.base.BatchJob` (the explain stage's saliency maps) takes the same
route from step 2: one manifest per batch (its items, pickled), a CPU task per batch running
``job.decode``, an actor pool whose actors each build ``job.worker(device)`` once (one model
load) and run the batches; the driver yields the results in batch order (Ray Data does not
promise order; results that arrive early wait in a dict until their turn).
"""
from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from curate.engine.base import BatchJob, BatchOutput, EncodeJob, batches_of

logger = logging.getLogger(__name__)

__all__ = ["RayEngine", "samples_files"]


def samples_files(dataset: Any) -> list[Path]:
    """The dataset's samples parquet files (``Dataset.samples_files()`` when the store has it)."""
    method = getattr(dataset, "samples_files", None)
    if callable(method):
        return [Path(p) for p in method()]
    return [Path(dataset.root) / "samples.parquet"]


def _select(batch: Any, *, wanted: dict[str, int], batch_size: int) -> Any:
    """Keep the rows to encode, with their batch number and position (a pyarrow batch)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    mask = pc.is_in(batch["sample_id"], value_set=pa.array(list(wanted), pa.string()))
    kept = batch.filter(mask)
    positions = [wanted[s] for s in kept["sample_id"].to_pylist()]
    return pa.table({"sample_id": kept["sample_id"], "filepath": kept["filepath"],
                     "position": pa.array(positions, pa.int64()),
                     "batch": pa.array([p // batch_size for p in positions], pa.int64())})


def _manifests(refs: list[Any]) -> list[dict[str, Any]]:
    """One manifest per batch (its ids and file paths in order) from the selected rows: a few
    strings per sample, gathered on the driver (never pixels)."""
    import pyarrow as pa
    import ray

    tables = [t for t in ray.get(refs) if t.num_rows]
    if not tables:
        return []
    table = pa.concat_tables(tables).sort_by("position")
    batches = table["batch"].to_pylist()
    ids = table["sample_id"].to_pylist()
    paths = table["filepath"].to_pylist()
    manifests: list[dict[str, Any]] = []
    for b, sid, path in zip(batches, ids, paths):
        if not manifests or manifests[-1]["batch"] != b:
            manifests.append({"batch": b, "ids": [], "paths": []})
        manifests[-1]["ids"].append(sid)
        manifests[-1]["paths"].append(path)
    return manifests


def _decode(batch: dict[str, np.ndarray], *, root: str, preprocess: Any,
            image_size: tuple[int, int]) -> dict[str, np.ndarray]:
    """CPU task: decode and preprocess the images of each manifest row (failures kept with a reason)."""
    from curate.engine.images import ImageFiles

    out_ids, out_pixels, out_errors = [], [], []
    for ids, paths in zip(batch["ids"], batch["paths"]):
        files = ImageFiles([Path(root) / p for p in paths], preprocess, image_size)
        items = [files[i] for i in range(len(files))]
        out_ids.append(np.array(list(ids), dtype=object))
        out_pixels.append(np.stack([t.numpy() for _, t, _ in items]).astype(np.float32))
        out_errors.append(np.array([e for _, _, e in items], dtype=object))
    return {"batch": batch["batch"], "ids": _objects(out_ids), "pixels": _objects(out_pixels),
            "errors": _objects(out_errors)}


def _objects(items: list[Any]) -> np.ndarray:
    """A 1-d object array holding ``items`` (one array per row, whatever their shapes)."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


class _Encode:
    """Actor: one model load, then one batch per call."""

    def __init__(self, factory: Any, kind: str, threads: int, output: Any = None) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.model = factory()
        self.kind = kind
        self.output = output

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from curate.engine.base import encode_batch

        outs = []
        for ids, pixels, errors in zip(batch["ids"], batch["pixels"], batch["errors"]):
            out = encode_batch(self.model, self.kind, [str(s) for s in ids], np.asarray(pixels, np.float32),
                               [str(e) for e in errors], self.output)
            outs.append(out)
        return {"ids": _objects([np.array(o.sample_ids, dtype=object) for o in outs]),
                "values": _objects([o.values for o in outs]),
                "failed_ids": _objects([np.array(list(o.failed), dtype=object) for o in outs]),
                "failed_reasons": _objects([np.array(list(o.failed.values()), dtype=object) for o in outs])}


def _decode_job(batch: dict[str, np.ndarray], *, decode: Any) -> dict[str, np.ndarray]:
    """CPU task of a :class:`BatchJob`: ``decode`` each manifest's items (pickled in and out, so
    Ray Data never converts the payload's types)."""
    payloads = [pickle.dumps(decode(pickle.loads(items)), protocol=pickle.HIGHEST_PROTOCOL)
                for items in batch["items"]]
    return {"batch": batch["batch"], "payload": _objects(payloads)}


class _RunJob:
    """Actor of a :class:`BatchJob`: ``worker(device)`` once (one model load), then one batch per call."""

    def __init__(self, worker: Any, device: str, threads: int) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.run = worker(device)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = [pickle.dumps(self.run(pickle.loads(payload)), protocol=pickle.HIGHEST_PROTOCOL)
                   for payload in batch["payload"]]
        return {"batch": batch["batch"], "result": _objects(results)}


class RayEngine:
    """``map_batches`` on Ray Data (see the module docstring).

    Args:
        address: None (a local Ray instance for the call), ``auto`` or ``ray://HOST:PORT``.
        workers: model actors (one model load each).
        gpus_per_worker: GPUs per actor (0: CPU; the model then runs on ``cpu``).
        cpus_per_worker: CPUs per actor (default: 1 with GPUs; else the cluster's CPUs, less
            half a CPU for decoding, shared by the actors) and torch threads in it.
        num_cpus: CPUs of a local instance (default: this machine's).
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, workers: int = 1, gpus_per_worker: float = 0.0,
                 cpus_per_worker: float | None = None, num_cpus: int | None = None) -> None:
        if workers < 1:
            raise ValueError(f"--workers must be >= 1 with --engine ray, got {workers}")
        if gpus_per_worker < 0:
            raise ValueError(f"--gpus-per-worker must be >= 0, got {gpus_per_worker}")
        self.address = address
        self.workers = workers
        self.gpus_per_worker = gpus_per_worker
        self.cpus_per_worker = cpus_per_worker
        self.num_cpus = num_cpus

    def _actor_cpus(self) -> float:
        import ray

        if self.cpus_per_worker is not None:
            return self.cpus_per_worker
        if self.gpus_per_worker > 0:
            return 1.0
        total = float(ray.cluster_resources().get("CPU", 1.0))
        return max(0.25, min(float(os.cpu_count() or 1), (total - 0.5) / self.workers))

    def map_batches(self, dataset: Any, sample_ids: Sequence[str], job: EncodeJob | BatchJob) -> Iterator[Any]:
        from curate.engine.session import ray_session

        if not sample_ids:
            return
        if isinstance(job, EncodeJob) and job.input_path != "cpu-exact":
            raise ValueError(f"the {job.input_path} input path runs on the local engine only (Ray decodes in CPU "
                             "tasks with the exact path); use input path cpu-exact with --engine ray")
        with ray_session(self.address, num_cpus=self.num_cpus):
            if isinstance(job, BatchJob):
                yield from self._run_job(job)
            else:
                yield from self._run(dataset, sample_ids, job)

    def _run_job(self, job: BatchJob) -> Iterator[Any]:
        """A :class:`BatchJob` (see the module docstring): results in batch order."""
        import ray.data

        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        device = "cuda" if self.gpus_per_worker > 0 else "cpu"
        actor_cpus = self._actor_cpus()
        manifests = [{"batch": b, "items": pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)}
                     for b, items in enumerate(batches_of(job.items, job.batch_size))]
        pipeline = (
            ray.data.from_items(manifests, override_num_blocks=max(1, len(manifests)))
            .map_batches(_decode_job, batch_size=1, batch_format="numpy", num_cpus=0.5,
                         fn_kwargs={"decode": job.decode})
            .map_batches(_RunJob, batch_size=1, batch_format="numpy",
                         compute=ray.data.ActorPoolStrategy(size=self.workers),
                         num_cpus=actor_cpus, num_gpus=self.gpus_per_worker or None,
                         fn_constructor_kwargs={"worker": job.worker, "device": device,
                                                "threads": max(1, round(actor_cpus))})
        )
        waiting: dict[int, Any] = {}
        turn = 0
        for batch in pipeline.iter_batches(batch_size=None, batch_format="numpy"):
            for b, result in zip(batch["batch"], batch["result"]):
                waiting[int(b)] = pickle.loads(result)
            while turn in waiting:
                yield waiting.pop(turn)
                turn += 1
        if turn != len(manifests):
            raise RuntimeError(f"the Ray engine returned {turn} of {len(manifests)} batches")

    def _run(self, dataset: Any, sample_ids: Sequence[str], job: EncodeJob) -> Iterator[BatchOutput]:
        import ray.data

        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        device = "cuda" if self.gpus_per_worker > 0 else "cpu"
        factory = job.remote_factory(device)
        model = job.model
        wanted = {sid: i for i, sid in enumerate(dict.fromkeys(sample_ids))}
        actor_cpus = self._actor_cpus()
        decode_cpus = 0.5
        found = 0
        selected = ray.data.read_parquet([str(p) for p in samples_files(dataset)]).select_columns(
            ["sample_id", "filepath"])
        selected = selected.map_batches(_select, batch_format="pyarrow", num_cpus=decode_cpus,
                                        fn_kwargs={"wanted": wanted, "batch_size": job.batch_size})
        manifests = _manifests(selected.to_arrow_refs())
        pipeline = (
            ray.data.from_items(manifests, override_num_blocks=max(1, len(manifests)))
            .map_batches(_decode, batch_size=1, batch_format="numpy", num_cpus=decode_cpus,
                         fn_kwargs={"root": str(dataset.root), "preprocess": model.preprocess,
                                    "image_size": tuple(model.image_size)})
            .map_batches(_Encode, batch_size=1, batch_format="numpy",
                         compute=ray.data.ActorPoolStrategy(size=self.workers),
                         num_cpus=actor_cpus, num_gpus=self.gpus_per_worker or None,
                         fn_constructor_kwargs={"factory": factory, "kind": job.kind,
                                                "threads": max(1, round(actor_cpus)), "output": job.output})
        )
        for batch in pipeline.iter_batches(batch_size=None, batch_format="numpy"):
            for ids, values, failed_ids, reasons in zip(batch["ids"], batch["values"], batch["failed_ids"],
                                                        batch["failed_reasons"]):
                out = BatchOutput([str(s) for s in ids], np.asarray(values, np.float32).reshape(len(ids), -1),
                                  dict(zip((str(s) for s in failed_ids), (str(r) for r in reasons))))
                found += out.count
                yield out
        if found != len(wanted):
            raise RuntimeError(f"the Ray engine returned {found} of {len(wanted)} samples: some ids are not in "
                               f"{samples_files(dataset)} (a samples file changed during the run?)")
