"""The Ray engine on a real two-node cluster on loopback (issue 29 §3).

One ``ray.cluster_utils.Cluster`` for the module: a head and a second node, 1 CPU each (the
smallest nodes: the old cluster-as-one-pool sizing hung there), with health checks every second
(:data:`HEALTH`: a killed node is seen dead in ~5 s, not ~15). ``evaluate`` (through the stage)
and ``explain`` (through the CLI, ``--ray-address``) run with the cluster's address: batches are
computed on both nodes and the results equal the local engine's. Then the node-loss tests
(issue 47), each on the same cluster: the second node killed after the first batch, then a new
node killed as a model actor starts there (the head's actor stuck starting meanwhile): both runs
finish on the 1-CPU head and equal the local engine; last, a retry that cannot fit (another
driver's actor holds half of the head) stops with an error naming that actor and its owner.

Where the work ran is shown twice: the node id each batch comes back with (the engine's log),
and Ray's own record, the GCS actor table (:func:`_model_actors`: node, ``max_restarts`` and
restarts of each model actor). Ray's state API (``ray.util.state.list_actors``) would say the
same but needs the dashboard, whose dependencies ``ray[data]`` does not install."""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from eval_helpers import make_folder, saved_tiny_vit
from ray_helpers import KEEP_IDLE_WORKERS

from curate.models import load_model

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ENGINE_LOG = "curate.engine.ray_data"
STORE_MB = 80 * 1024 * 1024
#: Ray's health checks of the nodes, every second and dead after 5 missed (default: 3 s and 5, so
#: a killed node was seen dead ~15 s later; now ~5 s, which is what the kill tests wait for)
HEALTH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}


@pytest.fixture(scope="module")
def cluster():
    """The module's cluster. ``Cluster`` picks free ports (its GCS on port 0), so a user's head on
    the default port is neither joined nor disturbed, but it writes its address into Ray's
    ``ray_current_cluster`` file, where ``ray status`` and ``ray.init("auto")`` look for a user's
    head: the file is put back as it was after the module."""
    from ray._common.utils import get_ray_address_file
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    address_file = Path(get_ray_address_file(None))
    saved = address_file.read_text() if address_file.exists() else None
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                      "object_store_memory": STORE_MB,
                                                      "_system_config": {**HEALTH, **KEEP_IDLE_WORKERS}})
    second = c.add_node(num_cpus=1, object_store_memory=STORE_MB)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c, second
    finally:
        ray.shutdown()
        c.shutdown()
        if saved is None:
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(saved)


@pytest.fixture(scope="module")
def world(tmp_path_factory, cluster):
    root = tmp_path_factory.mktemp("cluster")
    return make_folder(root / "ds", per_class=40, size=8), saved_tiny_vit(root)  # 200 images, 50 batches of 4


def _settings(**kw):
    from curate.stages.evaluate import EvalSettings

    return EvalSettings(bootstrap=10, batch_size=4, device="cpu", **kw)


def _cached_ids(ds, spec) -> list[str]:
    from curate.features import FeatureCache

    ids, _ = FeatureCache(ds.root, load_model(spec.name, spec.pretrained), "embedding").load()
    return ids


def _model_actors(udf: str) -> dict[str, dict]:
    """Ray's record of the model actors that ran ``udf`` (``_Encode``, ``_RunJob``) for this
    driver: actor id -> ``{"node", "state", "max_restarts", "restarts"}``, from the GCS actor
    table. Private API (``ray._private.state``, Ray 2.60), so tests only: it needs no dashboard
    (``ray.util.state`` does) and, unlike ``ray._private.state.actors()``, keeps the actor's
    ``max_restarts``. Ray Data names each pool's actor class ``MapWorker(<operators>)``, e.g.
    ``MapWorker(MapBatches(_RunJob))``; dead actors stay in the table with their node."""
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
    rows = (gcs_pb2.ActorTableData.FromString(b) for b in state._connect_and_get_accessor().get_actor_table(job, None))
    return {r.actor_id.hex(): {"node": r.address.node_id.hex(), "state": gcs_pb2.ActorTableData.ActorState.Name(r.state),
                               "max_restarts": r.max_restarts, "restarts": r.num_restarts}
            for r in rows if f"MapBatches({udf})" in r.class_name}


class _Batches(logging.Handler):
    """Collects the engine's per-batch node ids and per-attempt plans; calls ``on_batch(node)``,
    and ``on_kill()`` once the driver has killed a failed pipeline's actors."""

    def __init__(self, on_batch=None, on_kill=None) -> None:
        super().__init__(logging.DEBUG)
        self.nodes: list[str] = []
        self.plans: list[str] = []
        self.on_batch, self.on_kill = on_batch, on_kill

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("Ray engine: batch %d from node"):
            self.nodes.append(record.args[1])
            if self.on_batch:
                self.on_batch(record.args[1])
        elif record.msg.startswith("Ray engine: %d batch(es) on"):
            self.plans.append(record.getMessage())
        elif record.msg.startswith("Ray engine: killed the") and self.on_kill:
            self.on_kill()


@pytest.fixture
def engine_log():
    logger = logging.getLogger(ENGINE_LOG)
    handlers: list[_Batches] = []

    def attach(on_batch=None, on_kill=None) -> _Batches:
        handler = _Batches(on_batch, on_kill)
        logger.addHandler(handler)
        handlers.append(handler)
        return handler

    level = logger.level
    logger.setLevel(logging.DEBUG)
    yield attach
    for h in handlers:
        logger.removeHandler(h)
    logger.setLevel(level)


def test_one_cpu_nodes_spread_and_equal_the_local_engine(world, cluster, engine_log) -> None:
    """2 actors on two 1-CPU nodes: 0.5 CPU each, 0.5 left on each node for decoding (the old
    sizing, 0.75 each, never finished); batches come from both nodes; predictions and metrics
    equal the local engine's exactly."""
    from curate.stages.evaluate import evaluate

    c, second = cluster
    ds, spec = world
    local = evaluate(ds.root, spec, _settings(), run_name="local", overwrite=True)
    shutil.rmtree(ds.root / "features")
    log = engine_log()
    before = _model_actors("_Encode")
    remote = evaluate(ds.root, spec, _settings(engine="ray", workers=2, ray_address=c.address), run_name="ray",
                      overwrite=True)
    assert log.plans == ["Ray engine: 50 batch(es) on 2 node(s) (1+1 CPUs), 2 actor(s) of 0.5 CPU"]
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(log.nodes) == 50 and set(log.nodes) == alive == {c.head_node.node_id, second.node_id}
    actors = [a for k, a in _model_actors("_Encode").items() if k not in before]  # Ray's record: one per node
    assert sorted(a["node"] for a in actors) == sorted(alive), actors
    assert all(a["max_restarts"] == 0 for a in actors), actors
    assert len(_cached_ids(ds, spec)) == 200
    a, b = local.run_dir, remote.run_dir
    assert pq.read_table(b / "predictions.parquet").equals(pq.read_table(a / "predictions.parquet"))
    m_local, m_ray = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    assert json.dumps(m_ray, sort_keys=True) == json.dumps(m_local, sort_keys=True)


def test_explain_spreads_and_equals_the_local_engine(world, cluster, engine_log, tmp_path) -> None:
    """``curate explain --engine ray --workers 2 --ray-address HOST:PORT``: 24 masked images in
    batches of 1, one ``_RunJob`` actor per node (Ray's actor table) and batches back from both;
    tables, summary (less timing) and saved maps equal the local engine's exactly (same batches,
    fp32 on CPU, every actor on the driver's torch thread count).

    Why 24 batches: with a handful, one actor can take them all. Decoding is the bottleneck here
    (a decode task waits for its node's free 0.5 CPU, ~2 s on average on this loaded 2-core
    machine; a tiny-ViT batch takes ~0.1 s), so the first actor is often idle again when the
    next batch is ready, and Ray Data's pool hands work to the least busy actor, equally idle
    ones in a fixed order (a heap of in-flight counts); its locality rule did not help either
    (one run decoded 5 of 6 batches on the second node, and the head's actor ran all 6: the
    small decoded batches have no object-store location). 6 batches of 2 came back from one
    node in 5 of 15 runs, 12 batches of 2 split 11 + 1 once; 24 batches of 1 split between
    8 + 16 and 12 + 12 in 5 of 5 runs (and in every run of this test since)."""
    from click.testing import CliRunner

    from curate.cli import main
    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
    from curate.runs.explain import ExplainRun

    c, second = cluster
    _, spec = world
    root = tmp_path / "masked"
    collect_synthetic(root, WorldSpec(classes=DEFAULT_CLASSES[:2], per_class=12, image_size=32, seed=5, p=0.9))
    runner = CliRunner()
    base = ["explain", str(root), "--model", spec.name, "--pretrained", spec.pretrained, "--target", "topk:2",
            "--batch-size", "1", "--device", "cpu", "--save-maps"]
    local = runner.invoke(main, [*base, "--run-name", "local"])
    assert local.exit_code == 0, local.output
    log = engine_log()
    before = _model_actors("_RunJob")
    remote = runner.invoke(main, [*base, "--run-name", "ray", "--engine", "ray", "--workers", "2",
                                  "--ray-address", c.address])
    assert remote.exit_code == 0, remote.output
    assert log.plans == ["Ray engine: 24 batch(es) on 2 node(s) (1+1 CPUs), 2 actor(s) of 0.5 CPU"]
    both = {c.head_node.node_id, second.node_id}
    assert len(log.nodes) == 24 and set(log.nodes) == both, log.nodes
    actors = [a for k, a in _model_actors("_RunJob").items() if k not in before]
    assert sorted(a["node"] for a in actors) == sorted(both), actors
    assert all(a["max_restarts"] == 0 and a["restarts"] == 0 for a in actors), actors
    runs = root / "runs"
    a, b = ExplainRun.load(runs / "local"), ExplainRun.load(runs / "ray")
    assert a.config["engine"] == "local" and b.config["engine"] == "ray"
    for name in (ExplainRun.PREDICTIONS, ExplainRun.IMAGES, ExplainRun.CLASSES):  # as text: NaN == NaN there
        local_rows, ray_rows = (pq.read_table(runs / r / name) for r in ("local", "ray"))
        assert ray_rows.schema == local_rows.schema, name
        assert json.dumps(ray_rows.to_pylist(), default=str) == json.dumps(local_rows.to_pylist(), default=str), name
    predictions = pq.read_table(runs / "ray" / ExplainRun.PREDICTIONS).to_pylist()
    assert len(predictions) == 48 and sum(p["sss"] == p["sss"] for p in predictions) > 0  # 24 images x top-2
    s_local, s_ray = (json.loads((runs / r / ExplainRun.SUMMARY).read_text()) for r in ("local", "ray"))
    s_local.pop("timing"), s_ray.pop("timing")
    assert json.dumps(s_ray, sort_keys=True) == json.dumps(s_local, sort_keys=True)
    maps = sorted((runs / "local" / ExplainRun.MAPS).glob("*.npz"))
    assert len(maps) == 24
    for path in maps:
        with np.load(path) as x, np.load(runs / "ray" / ExplainRun.MAPS / path.name) as y:
            assert all(np.array_equal(x[k], y[k]) for k in ("maps", "mask", "targets")), path.name


def _expected(ds, spec, ids: list[str]) -> np.ndarray:
    """The local engine's embeddings of ``ids`` (the reference every Ray run must equal), with
    the feature cache of the model emptied for the Ray run that follows."""
    from curate.features import FeatureCache, compute_features

    model = load_model(spec.name, spec.pretrained)
    expected = compute_features(ds, model, ids, use_cache=False, batch_size=4).values
    shutil.rmtree(FeatureCache(ds.root, model, "embedding").folder, ignore_errors=True)
    return expected


def _watch_actor_on(c, node, before: set[str], killed: threading.Event, stop: threading.Event,
                    udf: str = "_Encode") -> threading.Thread:
    """A thread that kills ``node`` once Ray's actor table shows a model actor of this run
    (``udf``, not in ``before``) placed there (polling every 50 ms until ``stop``)."""
    def watch() -> None:
        while not stop.is_set():
            if any(a["node"] == node.node_id for k, a in _model_actors(udf).items() if k not in before):
                c.remove_node(node, allow_graceful=False)
                killed.set()
                return
            stop.wait(0.05)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def test_second_node_killed_after_the_first_batch(world, cluster, engine_log) -> None:
    """Issue 47: the second 1-CPU node is killed as soon as the first batch comes back (from
    either node): the run finishes on the head (issue 29's version of this test let it stop with
    RayNodeLostError and finish on a rerun; issue 47 asks for one run), with one actor of 0.5 CPU
    for the batches not yet returned (issue 39: the retry keeps each actor's share; 2 of 0.25
    before); every batch comes back once, the features equal the local engine's and are cached
    once. Ray's actor table: an actor ran on the killed node and Ray restarted none
    (``max_restarts=0``: the engine plans new actors instead)."""
    from curate.engine import make_engine
    from curate.features import FeatureCache, compute_features

    c, second = cluster
    ds, spec = world
    if second not in c.worker_nodes:  # gone with a test before this one that failed
        second = c.add_node(num_cpus=1, object_store_memory=STORE_MB)
        c.wait_for_nodes()
    # every batch of the world (50 of 4): with 12 (before) a quiet machine returned all of them before the
    # killed node was gone, once in four fresh-clone runs (one plan, no retry); 50 leave the loss in flight
    ids = [r["sample_id"] for r in ds.rows()]
    expected = _expected(ds, spec, ids)
    killed = threading.Event()
    killers: list[threading.Thread] = []

    def kill(node: str) -> None:
        if not killed.is_set():
            killed.set()
            killers.append(threading.Thread(target=c.remove_node, args=(second,), kwargs={"allow_graceful": False}))
            killers[-1].start()

    log = engine_log(kill)
    before = _model_actors("_Encode")
    start = time.perf_counter()
    got = compute_features(ds, load_model(spec.name, spec.pretrained), ids, batch_size=4,
                           engine=make_engine("ray", workers=2, release_wait_s=20))
    wall = time.perf_counter() - start
    for t in killers:
        t.join(60)
    assert killed.is_set()
    assert log.plans[0] == "Ray engine: 50 batch(es) on 2 node(s) (1+1 CPUs), 2 actor(s) of 0.5 CPU", log.plans
    assert len(log.plans) == 2 and log.plans[1].endswith("on 1 node(s) (1 CPUs), 1 actor(s) of 0.5 CPU"), log.plans
    assert len(log.nodes) == 50  # every batch returned once
    actors = [a for k, a in _model_actors("_Encode").items() if k not in before]
    assert second.node_id in {a["node"] for a in actors} and c.head_node.node_id in {a["node"] for a in actors}
    assert all(a["max_restarts"] == 0 and a["restarts"] == 0 for a in actors), actors
    np.testing.assert_array_equal(got.values, expected)
    cached, _ = FeatureCache(ds.root, load_model(spec.name, spec.pretrained), "embedding").load()
    assert sorted(cached) == sorted(ids)
    print(f"run with the loss after the first batch: {wall:.1f} s")


class SlowHeadStart:
    """A model factory (pickled by value into the actors) whose unpickling on the head node, the
    first time (while ``hold`` exists: deleted first), waits until ``release`` exists (120 s at
    most): the head's model actor then holds its CPU without having reached its constructor,
    where a model actor enrols in the engine's registry (an actor whose process or imports are
    slow to start does the same). The run stalled at this point before issue 39's fix, and
    stopped with "0.5 CPU free after waiting 30 s" before issue 47's (the registry never saw the
    actor, so nothing killed it)."""

    def __init__(self, spec, head: str, hold, release) -> None:
        self.spec, self.head, self.hold, self.release = spec, head, str(hold), str(release)

    def __setstate__(self, state: dict) -> None:
        import os
        import time

        self.__dict__.update(state)
        if ray.get_runtime_context().get_node_id() == self.head and os.path.exists(self.hold):
            os.unlink(self.hold)
            deadline = time.monotonic() + 120
            while not os.path.exists(self.release) and time.monotonic() < deadline:
                time.sleep(0.1)

    def __call__(self):
        return load_model(self.spec.name, self.spec.pretrained)


def test_node_killed_as_its_actor_starts(world, cluster, engine_log, tmp_path) -> None:
    """Issue 39/47: a new 1-CPU node joins the head and is killed as soon as a model actor of the
    run appears on it in Ray's actor table (before any batch returns), while the head's actor is
    still starting and stays so until the run ends (:class:`SlowHeadStart`: it never reaches the
    registry). The engine finds it in Ray's actor table and kills it, the retry plans for what
    the head can give (one actor of 0.5 CPU, 0.5 left for decoding; before issue 39: two of 0.25
    beside the stuck actor's 0.5, and the run never ended; before issue 47: RayNodeLostError,
    "0.5 CPU free after waiting 30 s"), every batch comes from the head, and the features equal
    the local engine's."""
    from curate.engine import make_engine
    from curate.features import FeatureCache, compute_features

    c, second = cluster
    ds, spec = world
    if second in c.worker_nodes:  # killed by the test above unless that one was deselected
        c.remove_node(second, allow_graceful=False)
    node = c.add_node(num_cpus=1, object_store_memory=STORE_MB)
    c.wait_for_nodes()
    model = load_model(spec.name, spec.pretrained)
    ids = [r["sample_id"] for r in ds.rows()][:40]  # 10 batches: enough to run on one node after the loss
    expected = _expected(ds, spec, ids)
    hold, release = tmp_path / "hold", tmp_path / "release"
    hold.touch()
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    killed, stop = threading.Event(), threading.Event()
    watcher = _watch_actor_on(c, node, set(_model_actors("_Encode")), killed, stop)
    log = engine_log()
    start = time.perf_counter()
    try:
        got = compute_features(ds, model, ids, batch_size=4, engine=make_engine("ray", workers=2),
                               factory=SlowHeadStart(spec, c.head_node.node_id, hold, release))
    finally:
        stop.set()
        release.touch()
        watcher.join(60)
    wall = time.perf_counter() - start
    assert killed.is_set(), "no actor was placed on the new node"
    assert not hold.exists(), "the head's actor did not wait"
    assert log.plans[0] == "Ray engine: 10 batch(es) on 2 node(s) (1+1 CPUs), 2 actor(s) of 0.5 CPU", log.plans
    assert log.plans[1:] == ["Ray engine: 10 batch(es) on 1 node(s) (1 CPUs), 1 actor(s) of 0.5 CPU"], log.plans
    assert len(log.nodes) == 10 and set(log.nodes) == {c.head_node.node_id}, log.nodes
    np.testing.assert_array_equal(got.values, expected)
    cached, _ = FeatureCache(ds.root, model, "embedding").load()
    assert sorted(cached) == sorted(ids)
    print(f"run with the loss at actor start: {wall:.1f} s")


BLOCKER = """
import sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(address=sys.argv[1], log_to_driver=False)


@ray.remote(num_cpus=0.5)
class Blocker:
    def ping(self):
        return 1


blocker = Blocker.options(name="user-blocker",
                          scheduling_strategy=NodeAffinitySchedulingStrategy(sys.argv[2], soft=False)).remote()
ray.get(blocker.ping.remote())
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_retry_that_cannot_fit_names_what_holds_the_cpus(world, cluster, tmp_path) -> None:
    """Issue 47: another driver's actor (``user-blocker``, 0.5 CPU) holds half of the head; a new
    1-CPU node is killed as a model actor of the run appears there. The retry needs 0.5 CPU for
    an actor and 0.5 for decoding on the head, where 0.5 is free after the release: the run
    stops after ``release_wait_s`` with a one-line RayNodeLostError that names the blocker, its
    CPUs, node and owner (the other job's driver: pid and command line) and what to do; this
    run's own actors are gone from the head (released), the other job's actor is left alone."""
    from curate.engine import make_engine
    from curate.engine.ray_data import RayNodeLostError
    from curate.features import FeatureCache, compute_features

    c, second = cluster
    ds, spec = world
    for n in list(c.worker_nodes):  # only the head and the node added below
        c.remove_node(n, allow_graceful=False)
    script = tmp_path / "blocker.py"
    script.write_text(BLOCKER)
    driver = subprocess.Popen([sys.executable, str(script), c.address, c.head_node.node_id], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    killed, stop = threading.Event(), threading.Event()
    watcher = None
    try:
        assert driver.stdout.readline().strip() == "ready"
        node = c.add_node(num_cpus=1, object_store_memory=STORE_MB)
        c.wait_for_nodes()
        ids = [r["sample_id"] for r in ds.rows()][:16]
        model = load_model(spec.name, spec.pretrained)
        shutil.rmtree(FeatureCache(ds.root, model, "embedding").folder, ignore_errors=True)  # all 16 to encode
        watcher = _watch_actor_on(c, node, set(_model_actors("_Encode")), killed, stop)
        with pytest.raises(RayNodeLostError) as caught:
            compute_features(ds, model, ids, batch_size=4, engine=make_engine("ray", workers=2, release_wait_s=3))
    finally:
        stop.set()
        if watcher is not None:
            watcher.join(60)
        driver.stdin.close()
        driver.wait(60)
    message = str(caught.value)
    assert killed.is_set() and "\n" not in message
    assert "have 0.5 CPU free after waiting 3 s (--ray-release-wait)" in message, message
    assert (f"actor user-blocker (0.5 CPU on node {c.head_node.node_id[:12]}, job " in message
            and f"driver pid {driver.pid} at " in message and "blocker.py" in message), message
    assert "_Encode" not in message, message  # this run's actors on the head were released
def test_actor_cpus_leave_room_for_decoding_on_every_node() -> None:
    """The per-node formula (no cluster needed): small, uneven and single nodes."""
    from curate.engine.ray_data import DECODE_CPUS, actor_cpus

    assert actor_cpus([1, 1], 2) == 0.5  # the old (2 - 0.5) / 2 = 0.75 left 0.25 per node: never finished
    assert actor_cpus([1, 3], 2) == 0.5 and actor_cpus([1, 3], 4) == 0.25
    assert actor_cpus([2], 2) == 0.75 and actor_cpus([2], 1) == 1.5  # one node: as before
    assert actor_cpus([4, 4], 2) == 3.5 and actor_cpus([0.5, 2], 1) == 1.5  # a node under 1 CPU gets no actor
    for cpus, workers in [([1, 1], 2), ([1, 3], 3), ([1, 3], 4), ([2, 2, 8], 5), ([1], 3)]:
        a, k = actor_cpus(cpus, workers), -(-workers // len([c for c in cpus if c >= 1]))
        assert all(c - k * a >= DECODE_CPUS - 1e-9 for c in cpus if c >= 1)


def test_a_retry_plans_the_actors_that_fit_what_is_left() -> None:
    """Issue 39, the retry plan's formula (no cluster needed): the most actors, at most the
    workers asked for, that keep the first plan's CPUs each and, with a decode task per node
    that holds one, fit in the CPUs free; none when not even one fits."""
    from curate.engine.ray_data import plan_actors

    assert plan_actors([1, 1], 2) == (2, 0.5) and plan_actors([2], 3, cpus=1.0) == (3, 1.0)  # first plans: all
    assert plan_actors([1], 2, cpus=0.5, free_cpus=1.0) == (1, 0.5)  # one node left: not 2 of 0.25
    assert plan_actors([1], 2, cpus=0.5, free_cpus=0.5) == (0, 0.0)  # a late actor keeps 0.5: no room
    assert plan_actors([1], 2, free_cpus=1.0) == (2, 0.25)  # no share to keep: both fit
    assert plan_actors([4, 4, 4], 8, cpus=1.75, free_cpus=12) == (6, 1.75)  # 8 of 1.75 on 4 nodes, one lost
    assert plan_actors([4, 4, 4], 8, cpus=1.75, free_cpus=6) == (2, 1.75)  # 3 * 1.75 + 3 * 0.5 = 6.75 > 6
    assert plan_actors([2], 3, cpus=1.0, free_cpus=2.0) == (1, 1.0)  # 2 actors of 1 CPU leave no room to decode
