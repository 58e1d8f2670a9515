"""What holds the CPUs of a Ray cluster's nodes, from Ray's own state (issue 47).

After a lost node the Ray engine releases what its failed pipeline still holds on the nodes
left and plans the retry on what is free (:mod:`curate.engine.ray_data`); when a retry still
cannot fit, its error names what holds the CPUs, so that a user can act. Ray's state, read here:

- **actors**: the GCS actor table (every actor not dead, with its class or name, the resources
  it asked for, its node, its job and process id). A model actor of this run's pipelines is
  ``MapWorker(MapBatches(_Encode))`` (or ``_RunJob``) there; it is killed by id when a failed
  pipeline left it (:func:`kill_actor`);
- **placement groups**: the GCS placement group table: a created group reserves its bundles'
  CPUs on their nodes whether or not anything runs in them;
- **tasks**: Ray's task list (``ray.util.state.list_tasks``, the state API) when the cluster runs
  Ray's dashboard, which serves it; without the dashboard (``ray[data]`` does not install its
  dependencies) the CPUs a node holds beyond its actors and groups are reported as held by
  tasks, without names, and the message says how to list them (``ray list tasks``);
- **owners**: the GCS job table: each job's driver (process id, address, command line); this
  run's own job is called so.

Ray's public API has no dashboard-free call for the actor and placement group tables nor for a
node's free resources, so this module reads them through ``ray._private.state`` (the GCS
accessor that ``ray list`` and ``ray status`` use), pinned with Ray itself in
``pyproject.toml`` (``ray[data]==2.60.0``): revisit on upgrading
(``tests/test_engine_ray_cluster.py`` runs every reader here on a real cluster).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["ActorRecord", "Holder", "actors", "cpu_holders", "describe_holders", "free_cpus_per_node", "job_id",
           "kill_actor", "placement_groups", "remove_group"]

#: actor states that hold the resources they asked for, once placed on a node
_HOLDING = ("ALIVE", "PENDING_CREATION", "RESTARTING", "DEPENDENCIES_UNREADY")


@dataclass(frozen=True)
class ActorRecord:
    """One row of Ray's actor table."""

    actor_id: str
    class_name: str
    name: str
    state: str
    node: str
    cpus: float
    job: str
    pid: int
    in_group: bool


@dataclass(frozen=True)
class Holder:
    """Something that holds ``cpus`` CPUs on ``node``: an actor, a task or a placement group
    (``kind``), its ``name`` and the job that owns it (``job``: hex id, '' when unknown)."""

    kind: str
    name: str
    node: str
    cpus: float
    job: str
    detail: str = ""


def _accessor() -> Any:
    from ray._private.state import state

    return state._connect_and_get_accessor()  # the GCS accessor behind ray._private.state (module docstring)


def job_id() -> str:
    """This driver's Ray job id (hex)."""
    import ray

    return ray.get_runtime_context().get_job_id()


def actors(job: str | None = None) -> list[ActorRecord]:
    """Ray's actor table (the GCS's), of job ``job`` (hex) or of every job."""
    import ray
    from ray.core.generated import gcs_pb2

    selected = ray.JobID.from_hex(job) if job else None
    out = []
    for raw in _accessor().get_actor_table(selected, None):
        row = gcs_pb2.ActorTableData.FromString(raw)
        node = row.address.node_id.hex() or row.node_id.hex()
        out.append(ActorRecord(row.actor_id.hex(), row.class_name, row.name,
                               gcs_pb2.ActorTableData.ActorState.Name(row.state), node,
                               float(row.required_resources.get("CPU", 0.0)), row.job_id.hex(), row.pid,
                               _in_group(row.placement_group_id)))
    return out


def _in_group(group_id: bytes) -> bool:
    """Whether an actor table row's placement group id names a group (unset, or Ray's nil id, does not)."""
    import ray

    return bool(group_id) and not ray.PlacementGroupID(group_id).is_nil()


def kill_actor(actor_id: str) -> None:
    """Kill the actor ``actor_id`` (hex) without restart, as ``ray.kill`` does with a handle
    (its core-worker call by id: a failed pipeline's actor may have no handle left here)."""
    import ray
    from ray._private import worker

    worker.global_worker.core_worker.kill_actor(ray.ActorID.from_hex(actor_id), True)


def remove_group(group_id: str) -> None:
    """Remove the placement group ``group_id`` (hex): its bundles' resources are freed."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))


def placement_groups() -> list[dict[str, Any]]:
    """Ray's placement groups not removed: ``{"id", "name", "state", "job", "cpus_by_node"}``."""
    from ray.core.generated import gcs_pb2

    out = []
    for raw in _accessor().get_placement_group_table():
        row = gcs_pb2.PlacementGroupTableData.FromString(raw)
        state = gcs_pb2.PlacementGroupTableData.PlacementGroupState.Name(row.state)
        if state == "REMOVED":
            continue
        cpus: dict[str, float] = defaultdict(float)
        for bundle in row.bundles:
            if bundle.node_id:
                cpus[bundle.node_id.hex()] += float(bundle.unit_resources.get("CPU", 0.0))
        out.append({"id": row.placement_group_id.hex(), "name": row.name, "state": state,
                    "job": row.creator_job_id.hex(), "cpus_by_node": dict(cpus)})
    return out


def free_cpus_per_node() -> dict[str, float]:
    """The CPUs free now on each alive node (the GCS's resource view)."""
    from ray._private.state import state

    return {node: float(r.get("CPU", 0.0)) for node, r in state.available_resources_per_node().items()}


def _jobs() -> dict[str, str]:
    """Job id -> its driver, said for a message (process id, address, command line)."""
    from ray._private.state import state

    out = {}
    for j in state.job_table():
        entry = " ".join(w.rsplit("/", 1)[-1] or w for w in str(j.get("Entrypoint") or "").split())  # file names
        entry = entry if len(entry) <= 100 else entry[:97] + "..."
        out[j["JobID"]] = f"driver pid {j['DriverPid']} at {j['DriverIPAddress']}" + (f": {entry}" if entry else "")
    return out


def _named_tasks(nodes: Iterable[str]) -> list[Holder] | None:
    """Running tasks that hold CPUs on ``nodes``, from Ray's state API (None without the dashboard)."""
    wanted = set(nodes)
    try:
        from ray.util.state import list_tasks

        rows = list_tasks(filters=[("state", "=", "RUNNING")], detail=True, timeout=5, raise_on_missing_output=False)
    except Exception:  # noqa: BLE001 - no dashboard (or no state API): the caller reports tasks unnamed
        return None
    out = []
    for t in rows:
        cpus = float((getattr(t, "required_resources", None) or {}).get("CPU", 0.0))
        if getattr(t, "node_id", None) in wanted and cpus > 0 and getattr(t, "type", "") == "NORMAL_TASK":
            out.append(Holder("task", str(t.name), t.node_id, cpus, str(t.job_id), f"pid {t.worker_pid}"))
    return out


def cpu_holders(node_cpus: dict[str, float]) -> list[Holder]:
    """What holds CPUs on the nodes of ``node_cpus`` (node id -> its CPUs): actors placed there
    (outside placement groups, whose bundles are counted instead), placement groups' bundles,
    and tasks (named from the state API, else one unnamed row per node for the CPUs held
    beyond its actors and groups: ``CPUs - free - actors - groups``)."""
    holders = [Holder("actor", a.name or a.class_name, a.node, a.cpus, a.job, f"pid {a.pid}, {a.state.lower()}")
               for a in actors() if a.state in _HOLDING and a.node in node_cpus and a.cpus > 0 and not a.in_group]
    for group in placement_groups():
        for node, cpus in group["cpus_by_node"].items():
            if node in node_cpus and cpus > 0:
                holders.append(Holder("placement group", group["name"] or group["id"][:12], node, cpus, group["job"],
                                      group["state"].lower()))
    tasks = _named_tasks(node_cpus)
    if tasks is not None:
        return holders + tasks
    free = free_cpus_per_node()
    for node, total in node_cpus.items():
        rest = total - free.get(node, total) - sum(h.cpus for h in holders if h.node == node)
        if rest > 1e-6:
            holders.append(Holder("task", "unnamed (ray list tasks names them where Ray's dashboard runs)", node,
                                  round(rest, 6), ""))
    return holders


def describe_holders(holders: list[Holder], this_job: str) -> str:
    """One line naming each holder: kind, name, CPUs, node, owner (this run, or the job's driver)."""
    if not holders:
        return "nothing in Ray's actor, task or placement group tables"
    jobs = _jobs() if any(h.job and h.job != this_job for h in holders) else {}

    def owner(h: Holder) -> str:
        if not h.job:
            return "owner unknown"
        if h.job == this_job:
            return f"job {h.job}, this run"
        return f"job {h.job}, {jobs.get(h.job, 'driver unknown')}"

    return "; ".join(f"{h.kind} {h.name} ({h.cpus:g} CPU on node {h.node[:12]}, {owner(h)}"
                     + (f", {h.detail}" if h.detail else "") + ")" for h in holders)
