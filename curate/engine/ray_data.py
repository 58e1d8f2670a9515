"""The Ray Data engine: the same batches as the local engine, on a cluster.

Why it is long (one job): one engine on a cluster; planning its actors, the Ray Data pipeline and the loss
of a node or actor (said, retried on the survivors, our actors killed) each need their own code.

Pipeline (Ray Data operators; no scheduler, queue or RPC of ours):

1. the driver reads ``sample_id`` and ``filepath`` of the dataset's samples files (pyarrow, two
   string columns), keeps the ids to encode and gathers them into one manifest per batch (ids
   and paths in order; batch ``b`` = ids ``b * batch_size .. (b + 1) * batch_size - 1`` in the
   order given, as in every engine, :mod:`curate.engine.base`), and ``ray.data.from_items``
   feeds them on (never pixels; a Ray Data ``read_parquet`` here started ``FooterReader``
   actors whose loss with a node ended the run, and a ``groupby`` shuffled with aggregator
   actors that deadlocked against the model actors on a 2-CPU machine);
2. CPU tasks decode and preprocess a batch's images (``map_batches``, one manifest per call,
   :data:`DECODE_CPUS` each);
3. an actor pool runs the model: ``workers`` actors placed with Ray's ``SPREAD`` strategy, one
   model load each (:class:`curate.engine.base.ModelFactory`), ``num_gpus=gpus_per_worker``
   when GPUs are asked for, CPUs per actor from each node's resources (:func:`actor_cpus`); a
   batch that runs out of memory is halved (:func:`curate.engine.base.encode_batch`);
4. the driver iterates the results and the caller writes them into the feature cache as
   shards (:func:`curate.features.compute_features`): the same cache and run folders as the
   local engine. The dataset folder must be on storage every node can read (NFS, a shared
   volume): workers open the images by path.

**A lost node or actor.** Actors are not restarted by Ray inside a run (``max_restarts=0``: a
restarted actor on a small surviving node can take the CPUs its own decode tasks need, and
the run stalls). Instead, when the run fails with a node or actor loss (``ActorDiedError``,
``NodeDiedError``, ``ObjectLostError``, ...; :func:`is_node_or_actor_loss`), the engine plans
the actors again for the nodes still alive and runs a new pipeline over the batches not yet
returned, up to ``retries`` times: batches already returned are never encoded again; those in
flight on the lost node are encoded once more, their first results never having arrived.
Before the retry plans, everything the failed pipeline holds on the nodes left is released
(:meth:`RayEngine._release`, issue 47): its Ray Data execution is collected (one that failed
while starting keeps its actor handles in a reference cycle), the model actors it enrolled are
killed, and what Ray's own state (:mod:`curate.engine.ray_state`: the actor and placement
group tables) still shows of this job since the run began is killed or removed; every model
actor enrols in a registry with its pipeline's number, and one of a failed pipeline that enrols
late (it was still starting when the pipeline failed) is killed there. The retry fits what the
nodes left have free then (:func:`plan_actors`, waiting ``release_wait_s`` at most for Ray to
show the CPUs free): each actor keeps the CPU share the first plan gave it, so a smaller
cluster runs fewer actors (two 1-CPU nodes, 2 workers, one node lost: 1 actor of 0.5 CPU, not
2 of 0.25). When not even one actor fits, the run stops with a one-line
:class:`RayNodeLostError` naming what holds the CPUs (actors, tasks and placement groups with
their owner's job and driver: :func:`curate.engine.ray_state.cpu_holders`); when a pipeline's
actors do not start within ``start_timeout_s``, with :class:`RayActorStartError`; never a
silent wait (both waits: ``--ray-release-wait``, ``--ray-start-timeout``). When no retry is left, :class:`RayNodeLostError` names the lost nodes and what
to do; what the caller has already received is kept (the feature cache's shards), so the next
run encodes only the rest.

A :class:`curate.engine.base.BatchJob` (the explain stage's saliency maps) takes the same
route from step 1: one manifest per batch (its items, pickled), a CPU task per batch running
``job.decode``, an actor pool whose actors each build ``job.worker(device)`` once (one model
load) and run the batches; the driver yields the results in batch order (Ray Data does not
promise order; results that arrive early wait in a dict until their turn).
"""
from __future__ import annotations

import gc
import logging
import math
import pickle
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from curate.engine.base import BatchJob, BatchOutput, EncodeJob, batches_of
from curate.engine.defaults import RAY_RELEASE_WAIT_S, RAY_START_TIMEOUT_S

logger = logging.getLogger(__name__)

__all__ = ["DECODE_CPUS", "RayActorStartError", "RayEngine", "RayNodeLostError", "actor_cpus", "is_node_or_actor_loss",
           "plan_actors", "samples_files"]

#: CPUs each decode task asks for; :func:`actor_cpus` leaves this much free on every node that holds an actor
DECODE_CPUS = 0.5
#: the least a node must have to be planned for actors (a smaller one still decodes)
MIN_NODE_CPUS = 2 * DECODE_CPUS
#: seconds to wait, after a loss, for Ray's control store to mark the node dead
NODE_DEATH_WAIT_S = 30.0
#: default ``release_wait_s``: seconds a retry waits for the CPUs of the failed pipeline's actors
#: and tasks to be released before it plans for what is free (``--ray-release-wait``)
RELEASE_WAIT_S = RAY_RELEASE_WAIT_S
#: default ``start_timeout_s``: seconds a pipeline waits for all its actors (model loaded) before
#: the first batch; then :class:`RayActorStartError` instead of a run that waits forever
#: (``--ray-start-timeout``)
ACTOR_START_TIMEOUT_S = RAY_START_TIMEOUT_S


class RayNodeLostError(RuntimeError):
    """A Ray node or actor was lost and the engine could not finish the run on the nodes left."""


class RayActorStartError(RuntimeError):
    """A pipeline's model actors did not start within ``start_timeout_s`` (the cluster cannot
    place them, or loading the model takes longer)."""


def samples_files(dataset: Any) -> list[Path]:
    """The dataset's samples parquet files (``Dataset.samples_files()`` when the store has it)."""
    method = getattr(dataset, "samples_files", None)
    if callable(method):
        return [Path(p) for p in method()]
    return [Path(dataset.root) / "samples.parquet"]


def actor_cpus(node_cpus: Sequence[float], workers: int, decode_cpus: float = DECODE_CPUS) -> float:
    """CPUs per model actor for nodes of ``node_cpus`` CPUs (the alive nodes' ``CPU`` in ``ray.nodes()``).

    The formula: of the nodes with at least ``2 * decode_cpus`` CPUs (the ``n`` eligible nodes),
    Ray's ``SPREAD`` strategy puts at most ``k = ceil(workers / n)`` actors on each, so

        ``cpus = min over eligible nodes i of (c_i - decode_cpus) / k``

    and every node that holds actors keeps at least ``decode_cpus`` free for the decode tasks
    (with 1 CPU per node and 2 workers: 0.5 per actor, 0.5 left for decoding on each node; with
    1 + 3 CPUs and 2 workers: 0.5; one node of 2 CPUs and 2 workers: 0.75). The old formula,
    ``(cluster CPUs - decode_cpus) / workers``, treated the cluster as one pool: 0.75 per actor
    on two 1-CPU nodes left 0.25 on each, and the 0.5-CPU decode tasks never ran. Without an
    eligible node (every node under ``2 * decode_cpus``): the largest node, same formula with
    ``k = workers``; never below 0.01.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    cpus = [float(c) for c in node_cpus if c and c > 0]
    if not cpus:
        return 0.01
    eligible = [c for c in cpus if c >= 2 * decode_cpus]
    if not eligible:
        return max(0.01, (max(cpus) - decode_cpus) / workers)
    per_node = math.ceil(workers / len(eligible))
    return max(0.01, min((c - decode_cpus) / per_node for c in eligible))


def plan_actors(node_cpus: Sequence[float], workers: int, *, cpus: float | None = None, free_cpus: float | None = None,
                decode_cpus: float = DECODE_CPUS) -> tuple[int, float]:
    """``(actors, CPUs per actor)`` on nodes of ``node_cpus`` CPUs for ``workers`` asked for.

    The first plan (``free_cpus`` None): every worker, of ``cpus`` each (GPUs or
    ``cpus_per_worker`` given), else of :func:`actor_cpus`. A retry after a loss (``free_cpus``:
    the CPUs free now; ``cpus``: the first plan's share, which each actor keeps): the most
    actors ``n``, at most ``workers``, such that the nodes have room for them
    (``actor_cpus(node_cpus, n) >= cpus``: ``ceil(n / eligible nodes)`` actors and a decode task
    on each) and they fit in what is free,

        ``n * cpus + decode_cpus * min(n, eligible nodes) <= free_cpus``;

    ``(0, 0.0)`` when not even one fits. One 1-CPU node left of two, 2 workers of 0.5 CPU: 1 of
    0.5 (2 of 0.25 would load the model twice on the smallest node); 0.5 CPU free there: none.
    """
    if free_cpus is None:
        return workers, cpus if cpus is not None else actor_cpus(node_cpus, workers, decode_cpus)
    eligible = sum(1 for c in node_cpus if c >= 2 * decode_cpus) or 1
    for n in range(workers, 0, -1):
        share = cpus if cpus is not None else actor_cpus(node_cpus, n, decode_cpus)
        room = cpus is None or actor_cpus(node_cpus, n, decode_cpus) >= cpus - 1e-9
        if room and n * share + decode_cpus * min(n, eligible) <= free_cpus + 1e-9:
            return n, share
    return 0, 0.0


_LOSS_ERRORS = ("ActorDiedError", "ActorUnavailableError", "NodeDiedError", "ObjectLostError", "OwnerDiedError",
                "WorkerCrashedError", "LocalRayletDiedError", "ObjectReconstructionFailedError")


def is_node_or_actor_loss(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps: its cause, context, a ``RayTaskError``'s cause) is a
    lost node, actor, worker or object (:data:`_LOSS_ERRORS`), after which the batches not yet
    returned can run again on the nodes left."""
    seen: set[int] = set()
    stack: list[Any] = [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if any(cls.__name__ in _LOSS_ERRORS for cls in type(e).__mro__):
            return True
        stack.extend([getattr(e, "cause", None), e.__cause__, e.__context__])
    return False


def _alive_nodes() -> dict[str, dict[str, Any]]:
    """The alive nodes: id -> ``{"ip": address, "cpus": CPU resource}`` (``ray.nodes()``)."""
    import ray

    return {n["NodeID"]: {"ip": n.get("NodeManagerAddress", "?"), "cpus": float(n.get("Resources", {}).get("CPU", 0))}
            for n in ray.nodes() if n.get("Alive")}


def _lost_since(before: dict[str, dict[str, Any]], wait_s: float) -> dict[str, dict[str, Any]]:
    """Nodes of ``before`` no longer alive, polling up to ``wait_s`` for Ray to notice one."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = _alive_nodes()
        lost = {k: v for k, v in before.items() if k not in alive}
        if lost or time.monotonic() >= deadline:
            return lost
        time.sleep(0.5)


def _points_at_node(error: BaseException) -> bool:
    """Whether a loss error looks like a lost node (an unreachable actor, a message naming a node)."""
    text = f"{type(error).__name__} {error}".lower()
    return any(w in text for w in ("unavailable", "unreachable", "node has died", "node was terminated",
                                   "nodedied", "raylet"))


def _free() -> dict[str, float]:
    """The cluster's free ``CPU`` and ``GPU`` now (``ray.available_resources``)."""
    import ray

    free = ray.available_resources()
    return {"CPU": float(free.get("CPU", 0.0)), "GPU": float(free.get("GPU", 0.0))}


def _node_names(nodes: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{k[:12]} ({v['ip']}, {v['cpus']:g} CPU)" for k, v in nodes.items()) or "none seen dead yet"


def _quiet(build: Callable[..., Any]) -> Callable[..., Any]:
    """``build`` without Ray Data's deprecation warning for ``ray_remote_args``, the only way to
    give the model actors ``max_restarts=0`` in Ray 2.60 (pinned in ``pyproject.toml``):
    ``map_batches`` names ``label_selector``, ``fallback_strategy``, ``max_calls``, ``resources``,
    ``accelerator_type``, ``runtime_env`` and ``ray_remote_args_fn`` (itself deprecated), not
    ``max_restarts``; neither ``ActorPoolStrategy`` nor ``DataContext`` has it; and the actor pool
    sets ``max_restarts=-1`` (restart forever) unless the remote args carry it
    (``ActorPoolMapOperator._apply_default_remote_args``, whose comment says
    ``map_batches(..., max_restarts=0)``). Ray 2.60 warns that ``**ray_remote_args`` will be
    removed in Ray 2.64: revisit on upgrading (``tests/test_engine_ray_cluster.py`` reads
    ``max_restarts`` back from Ray's actor table)."""
    def quiet(*args: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
            return build(*args)
    return quiet


class _Registry:
    """A tiny actor (no CPU, on the head node) where each model actor leaves its own handle and
    its pipeline's number, so that the driver can kill a failed pipeline's actors before the
    retry: Ray Data frees them by dropping its handles, which a failed execution keeps until
    the driver exits, and their CPUs would starve the retry on a small node. An actor of an
    earlier pipeline than the current one (it was still starting when its pipeline failed, so
    the driver could not kill it) is killed here as it enrols."""

    def __init__(self) -> None:
        self.actors: list[Any] = []
        self.attempt = 0

    def add(self, handles: list[Any], attempt: int) -> None:
        if attempt >= self.attempt:
            self.actors.extend(handles)
            return
        import ray

        for actor in handles:
            ray.kill(actor, no_restart=True)

    def take(self, next_attempt: int) -> list[Any]:
        """The enrolled actors (forgotten here); from now on only pipeline ``next_attempt`` enrols."""
        actors, self.actors, self.attempt = self.actors, [], next_attempt
        return actors


def _start_registry() -> Any:
    """A :class:`_Registry` actor pinned to the head node (whose loss ends the cluster anyway),
    else (softly) to the driver's node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    heads = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {})]
    strategy = NodeAffinitySchedulingStrategy(node_id=heads[0] if heads else _node_id(), soft=not heads)
    return ray.remote(num_cpus=0, scheduling_strategy=strategy)(_Registry).remote()


def _register(registry: tuple[Any, int] | None) -> None:
    """Leave this actor's handle in ``registry``, a (registry actor, pipeline number) pair (None:
    nothing to do); the registry kills an actor whose pipeline has already failed."""
    if registry is not None:
        import ray

        handle, attempt = registry
        ray.get(handle.add.remote([ray.get_runtime_context().current_actor], attempt))


def _kill_registered(registry: Any, next_attempt: int) -> list[str]:
    """Kill the actors left in ``registry`` (None: none), after which only pipeline
    ``next_attempt`` may enrol; their ids (hex)."""
    import ray

    if registry is None:
        return []
    try:
        actors = ray.get(registry.take.remote(next_attempt), timeout=30)
    except Exception as error:  # noqa: BLE001 - a retry without the kill may still run on larger nodes
        logger.warning("could not list the failed pipeline's actors: %s", error)
        return []
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001, S112 - already dead with its node
            continue
    return [actor._actor_id.hex() for actor in actors]


#: the class names Ray Data gives this engine's model actors (``MapWorker(MapBatches(_Encode))``)
_MODEL_ACTORS = ("MapBatches(_Encode)", "MapBatches(_RunJob)")


class _Owned:
    """This job's actors and placement groups when a run began (Ray's state,
    :mod:`curate.engine.ray_state`), so that what its failed pipelines left can be told apart
    from the rest of the driver's (a notebook's own actors are never touched)."""

    def __init__(self, job: str, actor_ids: set[str], group_ids: set[str]) -> None:
        self.job, self.actor_ids, self.group_ids = job, actor_ids, group_ids
        self.killed: set[str] = set()

    @classmethod
    def now(cls) -> _Owned | None:
        """The snapshot now; None when Ray's tables cannot be read (the registry still frees actors)."""
        from curate.engine.ray_state import actors, job_id, placement_groups

        try:
            job = job_id()
            return cls(job, {a.actor_id for a in actors(job)}, {g["id"] for g in placement_groups() if g["job"] == job})
        except Exception as error:  # noqa: BLE001 - e.g. Ray Client, whose driver has no GCS accessor
            logger.debug("Ray engine: Ray's actor table cannot be read here (%s)", error)
            return None

    def release(self) -> int:
        """Kill the model actors of this job created since the snapshot that still hold resources,
        and remove its placement groups created since; the number of actors killed now."""
        from curate.engine.ray_state import actors, kill_actor, placement_groups, remove_group

        try:
            left = [a.actor_id for a in actors(self.job) if a.actor_id not in self.actor_ids | self.killed
                    and a.state != "DEAD" and any(m in a.class_name for m in _MODEL_ACTORS)]
            groups = [g["id"] for g in placement_groups() if g["job"] == self.job and g["id"] not in self.group_ids]
        except Exception as error:  # noqa: BLE001 - the retry's wait and its error still say what is held
            logger.debug("Ray engine: Ray's tables cannot be read (%s)", error)
            return 0
        self.killed.update(left)
        self.group_ids.update(groups)
        for release, ids in ((kill_actor, left), (remove_group, groups)):
            for i in ids:
                try:
                    release(i)
                except Exception as error:  # noqa: BLE001 - already gone (with its node)
                    logger.debug("Ray engine: %s not released: %s", i, error)
        return len(left)


def _node_id() -> str:
    """The id of the Ray node this code runs on."""
    import ray

    return ray.get_runtime_context().get_node_id()


def _select(table: Any, *, wanted: dict[str, int], batch_size: int) -> Any:
    """Keep the rows to encode, with their batch number and position (a pyarrow table)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    mask = pc.is_in(table["sample_id"], value_set=pa.array(list(wanted), pa.string()))
    kept = table.filter(mask)
    positions = [wanted[s] for s in kept["sample_id"].to_pylist()]
    return pa.table({"sample_id": kept["sample_id"], "filepath": kept["filepath"],
                     "position": pa.array(positions, pa.int64()),
                     "batch": pa.array([p // batch_size for p in positions], pa.int64())})


def _manifests(files: Sequence[Path], *, wanted: dict[str, int], batch_size: int) -> list[dict[str, Any]]:
    """One manifest per batch (its ids and file paths in order), read on the driver: two string
    columns of the samples files (never pixels)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [_select(pq.read_table(str(f), columns=["sample_id", "filepath"]), wanted=wanted,
                      batch_size=batch_size) for f in files]
    tables = [t for t in tables if t.num_rows]
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
    """Actor: one model load, then one batch per call (its results tagged with this node's id)."""

    def __init__(self, factory: Any, kind: str, threads: int, output: Any = None,
                 registry: tuple[Any, int] | None = None) -> None:
        import torch

        _register(registry)
        torch.set_num_threads(max(1, threads))
        self.model = factory()
        self.kind = kind
        self.output = output
        self.node = _node_id()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from curate.engine.base import encode_batch

        outs = []
        for ids, pixels, errors in zip(batch["ids"], batch["pixels"], batch["errors"]):
            out = encode_batch(self.model, self.kind, [str(s) for s in ids], np.asarray(pixels, np.float32),
                               [str(e) for e in errors], self.output)
            outs.append(out)
        return {"batch": batch["batch"], "node": np.array([self.node] * len(outs), dtype=object),
                "ids": _objects([np.array(o.sample_ids, dtype=object) for o in outs]),
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

    def __init__(self, worker: Any, device: str, threads: int, registry: tuple[Any, int] | None = None) -> None:
        import torch

        _register(registry)
        torch.set_num_threads(max(1, threads))
        self.run = worker(device)
        self.node = _node_id()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = [pickle.dumps(self.run(pickle.loads(payload)), protocol=pickle.HIGHEST_PROTOCOL)
                   for payload in batch["payload"]]
        return {"batch": batch["batch"], "node": np.array([self.node] * len(results), dtype=object),
                "result": _objects(results)}


class RayEngine:
    """``map_batches`` on Ray Data (see the module docstring).

    Args:
        address: None (a local Ray instance for the call), ``auto`` or ``ray://HOST:PORT``.
        workers: model actors (one model load each), spread over the nodes.
        gpus_per_worker: GPUs per actor (0: CPU; the model then runs on ``cpu``).
        cpus_per_worker: CPUs per actor (default: 1 with GPUs; else :func:`actor_cpus` of the
            alive nodes' CPUs, which leaves :data:`DECODE_CPUS` for decoding on every node that
            holds an actor) and torch threads in it (rounded, at least 1).
        num_cpus: CPUs of a local instance (default: this machine's).
        retries: new pipelines over the batches not yet returned after a lost node or actor
            (see the module docstring); then :class:`RayNodeLostError`.
        start_timeout_s: seconds a pipeline waits for all its actors to start (model loaded)
            before the first batch; then :class:`RayActorStartError` (default
            :data:`ACTOR_START_TIMEOUT_S`; ``--ray-start-timeout``).
        release_wait_s: seconds a retry waits for the failed pipeline's CPUs to be freed before
            it plans for what is free (default :data:`RELEASE_WAIT_S`; ``--ray-release-wait``);
            when not even one actor fits then, :class:`RayNodeLostError` naming what holds them.

    After a run, :attr:`batches_by_node` counts the batches each Ray node's actors returned.
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, workers: int = 1, gpus_per_worker: float = 0.0,
                 cpus_per_worker: float | None = None, num_cpus: int | None = None, retries: int = 2,
                 threads: int | None = None, start_timeout_s: float | None = None,
                 release_wait_s: float | None = None) -> None:
        if workers < 1:
            raise ValueError(f"--workers must be >= 1 with --engine ray, got {workers}")
        if gpus_per_worker < 0:
            raise ValueError(f"--gpus-per-worker must be >= 0, got {gpus_per_worker}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.address = address
        self.workers = workers
        self.gpus_per_worker = gpus_per_worker
        self.cpus_per_worker = cpus_per_worker
        self.num_cpus = num_cpus
        self.retries = retries
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self.start_timeout_s = ACTOR_START_TIMEOUT_S if start_timeout_s is None else start_timeout_s
        self.release_wait_s = RELEASE_WAIT_S if release_wait_s is None else release_wait_s
        if self.start_timeout_s <= 0 or self.release_wait_s < 0:
            raise ValueError(f"start_timeout_s must be > 0 and release_wait_s >= 0, got {self.start_timeout_s} "
                             f"and {self.release_wait_s}")
        self.batches_by_node: Counter[str] = Counter()

    def actor_threads(self) -> int:
        """Torch threads in every actor: ``threads``, else the driver's ``torch.get_num_threads()``,
        i.e. what the local engine computes with. Float sums depend on how a kernel splits its work
        over threads (an actor on 1 thread gave SSS up to 4e-8 away from the local engine's 2), so
        the same count on every actor and locally is what makes the engines agree bit for bit; it
        is not sized from the actor's CPU share (an actor of 0.5 CPU may then run 2 threads: the
        cost is some oversubscription, the gain exact equality)."""
        if self.threads is not None:
            return self.threads
        import torch

        return max(1, torch.get_num_threads())

    def _plan(self, nodes: dict[str, dict[str, Any]], *, cpus: float | None = None,
              free: dict[str, float] | None = None) -> tuple[int, float]:
        """``(actors, CPUs each)`` on ``nodes`` (:func:`plan_actors`): the first plan (CPUs fixed
        by ``cpus_per_worker``, else 1 with GPUs, else sized per node), or with ``free`` a retry's,
        each actor of ``cpus`` and only what fits in ``free`` (GPUs too)."""
        if cpus is None and (self.cpus_per_worker is not None or self.gpus_per_worker > 0):
            cpus = self.cpus_per_worker if self.cpus_per_worker is not None else 1.0
        workers = self.workers
        if free is not None and self.gpus_per_worker > 0:
            workers = min(workers, int(free["GPU"] / self.gpus_per_worker + 1e-9))
        if workers < 1:
            return 0, 0.0
        return plan_actors([n["cpus"] for n in nodes.values()], workers, cpus=cpus,
                           free_cpus=None if free is None else free["CPU"])

    def _release(self, registry: Any, next_attempt: int, before: _Owned | None) -> None:
        """Free what the failed pipelines hold on the nodes left, before the retry plans:

        1. ``gc.collect()``: a pipeline that failed while starting (Ray Data's actor pool waiting
           for its actors) keeps its actor handles in a reference cycle through the error's
           traceback, never shut down; collected, Ray destroys those actors (out of scope);
        2. the actors enrolled in the registry are killed (:func:`_kill_registered`), and from now
           on one of an earlier pipeline is killed as it enrols;
        3. what Ray's state still shows of this job, created since the run began (``before``):
           model actors (``MapBatches(_Encode)``, ``MapBatches(_RunJob)``) killed by id, placement
           groups removed (:meth:`_Owned.release`); the decode tasks were cancelled by Ray Data's
           own shutdown of the failed execution.

        :meth:`_replan` then waits, up to ``release_wait_s``, for the CPUs to show as free."""
        gc.collect()
        killed = _kill_registered(registry, next_attempt)
        found = 0
        if before is not None:
            before.killed.update(killed)
            found = before.release()
        logger.debug("Ray engine: killed the %d actor(s) of the failed pipeline (%d found in Ray's actor table)",
                     len(killed) + found, found)

    def _replan(self, cpus: float, before: _Owned | None = None
                ) -> tuple[dict[str, dict[str, Any]], dict[str, float], tuple[int, float]]:
        """After a loss: the nodes alive, what they have free and the plan of actors of ``cpus``
        that fits it, waiting up to ``release_wait_s`` while fewer fit than the nodes could hold
        idle (Ray frees a failed pipeline's actors and tasks asynchronously; a model actor of a
        failed pipeline that shows up meanwhile, in Ray's actor table, is killed: ``before``)."""
        deadline = time.monotonic() + self.release_wait_s
        while True:
            if before is not None:
                before.release()
            nodes, free = _alive_nodes(), _free()
            plan = self._plan(nodes, cpus=cpus, free=free)
            idle = {"CPU": sum(n["cpus"] for n in nodes.values()), "GPU": self.workers * self.gpus_per_worker}
            if plan[0] >= self._plan(nodes, cpus=cpus, free=idle)[0] or time.monotonic() >= deadline:
                return nodes, free, plan
            time.sleep(0.25)

    def map_batches(self, dataset: Any, sample_ids: Sequence[str], job: EncodeJob | BatchJob) -> Iterator[Any]:
        from curate.engine.session import ray_session

        if not sample_ids:
            return
        if isinstance(job, EncodeJob) and job.input_path != "cpu-exact":
            raise ValueError(f"the {job.input_path} input path runs on the local engine only (Ray decodes in CPU "
                             "tasks with the exact path); use input path cpu-exact with --engine ray")
        with ray_session(self.address, num_cpus=self.num_cpus):
            import ray.data

            context = ray.data.DataContext.get_current()
            context.enable_progress_bars = False
            context.print_on_execution_start = False
            context.wait_for_min_actors_s = self.start_timeout_s  # every actor up first: batches spread over them
            if isinstance(job, BatchJob):
                yield from self._run_job(job)
            else:
                yield from self._run(dataset, sample_ids, job)

    def _pool(self, actors: int, cpus: float) -> dict[str, Any]:
        """``map_batches`` arguments of a pool of ``actors`` model actors (see the module docstring)."""
        import ray.data

        # Ray Data places actors with its default scheduling strategy, SPREAD; ``max_restarts``
        # has no named parameter in Ray 2.60, so it goes through the deprecated ``**ray_remote_args``
        # (removed in Ray 2.64; see _quiet)
        return {"batch_size": 1, "batch_format": "numpy", "compute": ray.data.ActorPoolStrategy(size=actors),
                "num_cpus": cpus, "num_gpus": self.gpus_per_worker or None, "max_restarts": 0}

    def _execute(self, manifests: list[dict[str, Any]],
                 build: Callable[[list[dict[str, Any]], int, float, Any], Any]) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(batch number, result row)`` for every manifest, from ``build(manifests, actors, actor
        cpus, registry)`` (a Ray Dataset whose rows carry ``batch`` and ``node``; ``registry`` is
        what the model actors enrol with, :func:`_register`), in arrival order; after a lost node
        or actor, again over the batches not yet returned (module docstring)."""
        done: set[int] = set()
        self.batches_by_node = Counter()
        registry = _start_registry() if self.retries else None
        before = _Owned.now() if self.retries else None
        try:
            yield from self._attempts(manifests, build, done, registry, before)
        finally:
            if registry is not None:
                import ray

                try:
                    ray.kill(registry)
                except Exception as error:  # noqa: BLE001 - never hide why the run stopped
                    logger.debug("the actor registry was not killed: %s", error)
        if self.batches_by_node:
            logger.info("Ray engine: batches per node: %s", dict(self.batches_by_node))

    def _attempts(self, manifests: list[dict[str, Any]], build: Callable[[list[dict[str, Any]], int, float, Any], Any],
                  done: set[int], registry: Any, before: _Owned | None) -> Iterator[tuple[int, dict[str, Any]]]:
        """The pipelines of :meth:`_execute`: the first, then one per retry, each planned for
        what the nodes alive have free (:meth:`_replan`, after :meth:`_release`) with the first
        plan's CPUs per actor; ``before``: this job's actors and groups before the first."""
        first_cpus = 0.0
        for attempt in range(self.retries + 1):
            remaining = [m for m in manifests if m["batch"] not in done]
            if not remaining:
                break
            if attempt:
                nodes, free, (actors, cpus) = self._replan(first_cpus, before)
                if not actors:
                    raise RayNodeLostError(self._no_room(nodes, free, first_cpus, len(done), len(manifests)))
            else:
                nodes = _alive_nodes()
                actors, cpus = self._plan(nodes)
                first_cpus = cpus
            logger.info("Ray engine: %d batch(es) on %d node(s) (%s CPUs), %d actor(s) of %.3g CPU", len(remaining),
                        len(nodes), "+".join(f"{n['cpus']:g}" for n in nodes.values()), actors, cpus)
            failure = not_started = ""
            try:
                enrol = None if registry is None else (registry, attempt)
                for rows in _quiet(build)(remaining, actors, cpus, enrol).iter_batches(batch_size=None,
                                                                                       batch_format="numpy"):
                    for i, b in enumerate(rows["batch"].tolist()):
                        if b in done:
                            continue
                        done.add(b)
                        node = str(rows["node"][i])
                        self.batches_by_node[node] += 1
                        logger.debug("Ray engine: batch %d from node %s", b, node)
                        yield b, {k: v[i] for k, v in rows.items()}
            except Exception as error:
                if type(error).__name__ == "GetTimeoutError" and "starting actors" in str(error):
                    not_started = self._not_started(actors, cpus, nodes, len(done), len(manifests))
                elif is_node_or_actor_loss(error):
                    failure = self._failure(error, nodes, attempt, len(done), len(manifests))
                else:
                    raise
            if not_started:  # actors still starting would keep their CPUs after the run
                self._release(registry, attempt + 1, before)
                raise RayActorStartError(not_started)
            if not failure:
                break
            logger.warning("%s", failure)
            self._release(registry, attempt + 1, before)

    def _failure(self, error: BaseException, nodes: dict[str, dict[str, Any]], attempt: int, done: int,
                 total: int) -> str:
        """What a lost node or actor (``error``) did to pipeline ``attempt``, said for the log; raises
        :class:`RayNodeLostError` when no retry is left or no node is."""
        # Ray's control store marks a killed node dead after its health checks fail (~10 s):
        # wait for it when the error points at a node (else the retry plans for a dead node)
        lost = _lost_since(nodes, NODE_DEATH_WAIT_S if _points_at_node(error) else 1.0)
        what = f"Ray node(s) lost: {_node_names(lost)}" if lost else "a Ray actor was lost (no node seen dead)"
        if attempt >= self.retries or not _alive_nodes():
            raise RayNodeLostError(
                f"{what} ({type(error).__name__}: {str(error).splitlines()[0][:300]}); {done} of {total} batches "
                f"finished before it and were returned (the feature cache keeps them), {total - done} did not; tried "
                f"{attempt + 1} time(s). Check the cluster (ray status), then run the command again: it encodes only "
                "the rest") from error
        return (f"{what} during the run ({type(error).__name__}); {done} of {total} batches done; running the "
                f"{total - done} left on the nodes still alive (retry {attempt + 1} of {self.retries})")

    def _no_room(self, nodes: dict[str, dict[str, Any]], free: dict[str, float], cpus: float, done: int,
                 total: int) -> str:
        """Why a retry cannot start (:meth:`_replan` found no actor that fits) and what to do."""
        from curate.engine.ray_state import cpu_holders, describe_holders, job_id

        gpus = f" and {self.gpus_per_worker:g} GPU ({free['GPU']:g} free)" if self.gpus_per_worker > 0 else ""
        try:
            held = describe_holders(cpu_holders({k: v["cpus"] for k, v in nodes.items()}), job_id())
        except Exception as error:  # noqa: BLE001 - the message must come out even if Ray's tables cannot be read
            held = f"unknown (Ray's state could not be read: {type(error).__name__})"
        return (f"after losing a Ray node, the nodes left ({_node_names(nodes)}) have {free['CPU']:g} CPU free after "
                f"waiting {self.release_wait_s:g} s (--ray-release-wait): not enough for one model actor of {cpus:g} "
                f"CPU{gpus} plus {DECODE_CPUS:g} CPU for decoding; the CPUs are held by: {held}. {done} of {total} "
                "batches were returned (the feature cache keeps them). Free those CPUs (ray kill / ray stop on their "
                "owner) or add nodes, then run the command again: it encodes only the rest")

    def _not_started(self, actors: int, cpus: float, nodes: dict[str, dict[str, Any]], done: int, total: int) -> str:
        """Why a pipeline stopped before its first batch (its actors did not start in time) and what to do."""
        gpus = f" and {self.gpus_per_worker:g} GPU" if self.gpus_per_worker > 0 else ""
        return (f"the Ray engine could not start {actors} model actor(s) of {cpus:g} CPU{gpus} within "
                f"{self.start_timeout_s:g} s on {len(nodes)} node(s) ({_node_names(nodes)}; {_free()['CPU']:g} CPU "
                "free now): the cluster cannot place them, or loading the model takes longer. Check ray status (free "
                "CPUs and GPUs, pending actors), then lower --workers, free or add nodes, or raise --ray-start-timeout; "
                f"{done} of {total} batches were returned (the feature cache keeps them)")

    def _run_job(self, job: BatchJob) -> Iterator[Any]:
        """A :class:`BatchJob` (see the module docstring): results in batch order."""
        import ray.data

        device = "cuda" if self.gpus_per_worker > 0 else "cpu"
        manifests = [{"batch": b, "items": pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)}
                     for b, items in enumerate(batches_of(job.items, job.batch_size))]

        def build(remaining: list[dict[str, Any]], actors: int, cpus: float, registry: Any) -> Any:
            return (ray.data.from_items(remaining, override_num_blocks=max(1, len(remaining)))
                    .map_batches(_decode_job, batch_size=1, batch_format="numpy", num_cpus=DECODE_CPUS,
                                 fn_kwargs={"decode": job.decode})
                    .map_batches(_RunJob, **self._pool(actors, cpus),
                                 fn_constructor_kwargs={"worker": job.worker, "device": device,
                                                        "threads": self.actor_threads(), "registry": registry}))

        waiting: dict[int, Any] = {}
        turn = 0
        for b, row in self._execute(manifests, build):
            waiting[b] = pickle.loads(row["result"])
            while turn in waiting:
                yield waiting.pop(turn)
                turn += 1
        if turn != len(manifests):
            raise RuntimeError(f"the Ray engine returned {turn} of {len(manifests)} batches")

    def _run(self, dataset: Any, sample_ids: Sequence[str], job: EncodeJob) -> Iterator[BatchOutput]:
        import ray.data

        device = "cuda" if self.gpus_per_worker > 0 else "cpu"
        factory = job.remote_factory(device)
        model = job.model
        wanted = {sid: i for i, sid in enumerate(dict.fromkeys(sample_ids))}
        manifests = _manifests(samples_files(dataset), wanted=wanted, batch_size=job.batch_size)

        def build(remaining: list[dict[str, Any]], actors: int, cpus: float, registry: Any) -> Any:
            return (ray.data.from_items(remaining, override_num_blocks=max(1, len(remaining)))
                    .map_batches(_decode, batch_size=1, batch_format="numpy", num_cpus=DECODE_CPUS,
                                 fn_kwargs={"root": str(dataset.root), "preprocess": model.preprocess,
                                            "image_size": tuple(model.image_size)})
                    .map_batches(_Encode, **self._pool(actors, cpus),
                                 fn_constructor_kwargs={"factory": factory, "kind": job.kind,
                                                        "threads": self.actor_threads(), "output": job.output,
                                                        "registry": registry}))

        found = 0
        for _, row in self._execute(manifests, build):
            ids, values, failed_ids, reasons = row["ids"], row["values"], row["failed_ids"], row["failed_reasons"]
            out = BatchOutput([str(s) for s in ids], np.asarray(values, np.float32).reshape(len(ids), -1),
                              dict(zip((str(s) for s in failed_ids), (str(r) for r in reasons))))
            found += out.count
            yield out
        if found != len(wanted):
            raise RuntimeError(f"the Ray engine returned {found} of {len(wanted)} samples: some ids are not in "
                               f"{samples_files(dataset)} (a samples file changed during the run?)")
