"""The Ray Data engine: same cache, predictions and metrics as the local engine; faults.

One local Ray instance for the module (2 CPUs, dashboard off, 100 MB object store), started
beside a Ray head as on a user's Ray node (``ray start --head``, ``RAY_ADDRESS`` naming it:
:class:`ray_helpers.RayHead`), which it must not join; the last Ray test shuts both down and
checks that no Ray process is left."""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner
from eval_helpers import CLASSES, make_folder, saved_tiny_vit
from ray_helpers import KEEP_IDLE_WORKERS, RayHead

from curate.models import ModelSpec, load_model

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def user_head():
    """A Ray head running beside the module, with ``RAY_ADDRESS`` naming it, as on a user's Ray
    node (issue 39: ``ray.init`` without an address joined it and refused ``num_cpus``, erroring
    9 tests); ended by process id after the module, whatever happened."""
    head = RayHead()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("RAY_ADDRESS", head.address)
            yield head
    finally:
        head.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, user_head):
    kill_flag = tmp_path_factory.mktemp("faults") / "kill-once"
    # address="local", as the engine's own ray_session: a new instance, never the head beside it
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024,
             log_to_driver=False, _system_config=KEEP_IDLE_WORKERS)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fault-injecting model below
    yield kill_flag
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def world(tmp_path_factory, cluster):
    root = tmp_path_factory.mktemp("engine")
    return make_folder(root / "ds", per_class=4), saved_tiny_vit(root)


def _doubled(items: list[int]) -> list[int]:
    return [2 * i for i in items]


class _PlusOne:
    """A :class:`curate.engine.base.BatchJob` worker: ``run(payload)`` adds 1 to each item."""

    def __init__(self, device: str) -> None:
        self.device = device

    def __call__(self, payload: list[int]) -> list[int]:
        return [x + 1 for x in payload]


def _tiny_job(n: int):
    from curate.engine.base import BatchJob

    return BatchJob(items=list(range(n)), batch_size=2, decode=_doubled, worker=_PlusOne)


def test_the_module_runs_beside_a_users_ray_head(user_head, cluster) -> None:
    """Issue 39: with a Ray head running and ``RAY_ADDRESS`` naming it, the module's Ray is an
    instance of its own (the fixture's ``address="local"``; without it ``ray.init`` joined the
    head and failed: "When connecting to an existing cluster, num_cpus and num_gpus must not be
    provided"), and an engine call runs there, not on the head."""
    from curate.engine.ray_data import RayEngine

    assert os.environ["RAY_ADDRESS"] == user_head.address and user_head.processes()
    assert ray.get_runtime_context().gcs_address != user_head.address
    assert ray.cluster_resources()["CPU"] == 2  # the head has 1
    engine = RayEngine(workers=1)
    assert list(engine.map_batches(None, [str(i) for i in range(5)], _tiny_job(5))) == [[1, 3], [5, 7], [9]]
    assert set(engine.batches_by_node) == {ray.get_runtime_context().get_node_id()}


def test_actors_that_cannot_start_stop_the_run_with_a_clear_error(cluster) -> None:
    """Issue 39: a pipeline whose actors cannot be placed (4 CPUs each on this 2-CPU instance)
    stops after ``start_timeout_s`` with a one-line :class:`RayActorStartError` saying what the
    nodes have and what to do, not Ray Data's bare ``GetTimeoutError`` after 600 s."""
    from curate.engine.ray_data import RayActorStartError, RayEngine

    engine = RayEngine(workers=1, cpus_per_worker=4, start_timeout_s=2)
    start = time.perf_counter()
    with pytest.raises(RayActorStartError, match=r"could not start 1 model actor\(s\) of 4 CPU within 2 s on 1 "
                                                  r"node\(s\) \(\w+ \([\d.]+, 2 CPU\); [\d.]+ CPU free now\)") as error:
        list(engine.map_batches(None, [str(i) for i in range(3)], _tiny_job(3)))
    assert time.perf_counter() - start < 60
    assert "lower --workers" in str(error.value) and "0 of 2 batches" in str(error.value)
    assert "\n" not in str(error.value)


def test_the_bounded_waits_from_the_cli(world) -> None:
    """Issue 47: ``--ray-release-wait`` and ``--ray-start-timeout`` (defaults in ``--help``) reach
    the engine of whatever stage the verb runs (:func:`curate.engine.ray_waits`): ``evaluate
    --ray-start-timeout 0.01`` stops with the one-line start error naming that bound, and the
    actors it was starting are released (the instance's 2 CPUs free again; they kept starting
    before); either flag without ``--engine ray`` is a usage error."""
    from curate.cli import main
    from curate.engine import make_engine, ray_waits

    ds, spec = world
    runner = CliRunner()
    shown = " ".join(runner.invoke(main, ["evaluate", "--help"]).output.split())
    assert "--ray-release-wait SECONDS" in shown and "[default: (30 s); x>=0]" in shown, shown
    assert "--ray-start-timeout SECONDS" in shown and "[default: (600 s); x>0]" in shown, shown
    base = ["evaluate", str(ds.root), "--model", spec.name, "--pretrained", spec.pretrained, "--bootstrap", "10",
            "--device", "cpu", "--no-cache", "--run-name", "waits"]
    local = runner.invoke(main, [*base, "--ray-release-wait", "5"])
    assert local.exit_code == 2 and "--ray-release-wait and --ray-start-timeout need --engine ray" in local.output
    result = runner.invoke(main, [*base, "--engine", "ray", "--ray-start-timeout", "0.01", "--ray-release-wait", "7"])
    assert result.exit_code == 1, result.output
    assert "within 0.01 s" in result.output and "raise --ray-start-timeout" in result.output, result.output
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2
    with ray_waits(release_wait_s=7):
        engine = make_engine("ray")
        assert (engine.release_wait_s, engine.start_timeout_s) == (7, 600)
        assert make_engine("ray", release_wait_s=1).release_wait_s == 1
    assert make_engine("ray").release_wait_s == 30


def _cache(ds, model):
    from curate.features import FeatureCache

    ids, values = FeatureCache(ds.root, model, "embedding").load()
    return dict(zip(ids, values))


def test_ray_engine_equals_the_local_engine_exactly(world, tmp_path) -> None:
    """Through the CLI: features bit-identical, predictions and metrics identical."""
    from curate.cli import main

    ds, spec = world
    runner = CliRunner()
    base = ["evaluate", str(ds.root), "--model", spec.name, "--pretrained", spec.pretrained, "--bootstrap", "20",
            "--batch-size", "8", "--device", "cpu"]
    local = runner.invoke(main, [*base, "--run-name", "local"])
    assert local.exit_code == 0, local.output
    model = load_model(spec.name, spec.pretrained)
    local_features = _cache(ds, model)
    shutil.rmtree(ds.root / "features")
    remote = runner.invoke(main, [*base, "--run-name", "ray", "--engine", "ray", "--workers", "2"])
    assert remote.exit_code == 0, remote.output
    ray_features = _cache(ds, model)
    assert ray_features.keys() == local_features.keys() and len(ray_features) == len(ds.rows())
    assert all(np.array_equal(ray_features[k], local_features[k]) for k in local_features)
    runs = ds.root / "runs"
    assert pq.read_table(runs / "ray" / "predictions.parquet").equals(pq.read_table(runs / "local" / "predictions.parquet"))
    m_local = json.loads((runs / "local" / "metrics.json").read_text())
    m_ray = json.loads((runs / "ray" / "metrics.json").read_text())
    assert json.dumps(m_ray, sort_keys=True) == json.dumps(m_local, sort_keys=True)


def test_label_backgrounds_on_ray_equals_local(world, tmp_path) -> None:
    """Through the CLI: the pre-labels and their probabilities are identical on both engines."""
    from PIL import Image

    from curate.cli import main
    from curate.store import Dataset, NewSample

    _, spec = world
    ds = Dataset.create(tmp_path / "bg", backgrounds=["snow", "grass", "water"])
    rng = np.random.default_rng(1)
    ds.add_samples([NewSample(image=Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)),
                              class_index=c, status="accepted") for c in (1, 2, 3) for _ in range(3)])
    runner = CliRunner()
    base = ["label-backgrounds", str(ds.root), "--model", spec.name, "--pretrained", spec.pretrained,
            "--batch-size", "4", "--device", "cpu", "--threshold", "0.9"]

    def labels():
        return {r["sample_id"]: (r["background"], r["background_score"], r["background_source"], tuple(r["tags"] or ()))
                for r in Dataset.open(ds.root).rows()}

    local = runner.invoke(main, base)
    assert local.exit_code == 0, local.output
    by_local = labels()
    shutil.rmtree(ds.root / "features")  # nothing cached: Ray encodes every image again
    remote = runner.invoke(main, [*base, "--engine", "ray", "--workers", "1"])
    assert remote.exit_code == 0, remote.output
    assert "labelled 9 sample(s)" in remote.output
    by_ray = labels()
    assert len(by_ray) == 9 and all(v[2] == "model" for v in by_ray.values())
    assert by_ray == by_local  # exact: same batches of 4, fp32 on CPU
    bad = runner.invoke(main, [*base, "--ray-address", "auto"])
    assert bad.exit_code != 0 and "need --engine ray" in bad.output


class Faulty:
    """A model factory (pickled by value into the Ray actors) whose model kills its process on
    the first batch while ``kill_flag`` exists (deleting it first, so the retry lives), runs out
    of memory on batches larger than ``limit``, and logs the batch sizes it ran."""

    def __init__(self, spec, limit, log, kill_flag):
        self.spec, self.limit, self.log, self.kill_flag = spec, limit, str(log), str(kill_flag)

    def __call__(self):
        model = load_model(self.spec.name, self.spec.pretrained)
        encode, limit, log, kill_flag = model.encode_image, self.limit, self.log, self.kill_flag

        def encode_image(batch, normalize=True, **kwargs):
            if os.path.exists(kill_flag):
                os.unlink(kill_flag)
                os._exit(1)  # a worker killed mid-run: the engine runs the batch again on a new actor
            with open(log, "a") as fh:
                fh.write(f"{len(batch)}\n")
            if len(batch) > limit:
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
            return encode(batch, normalize, **kwargs)

        model.encode_image = encode_image
        return model


def test_killed_worker_oom_and_interrupt_resume_without_duplicates(world, cluster, tmp_path) -> None:
    """One Ray run with three faults: the first batch kills its actor (the engine's retry runs it
    again on a new actor; Ray restarts none), the retried batch of 8 runs out of memory (it is halved), and the run is
    interrupted after that first batch (its shard is kept). The rerun computes only the missing
    samples (on the local engine: the cache is the engine's, not Ray's); every sample is cached
    exactly once, equal to the local result."""
    from curate.engine import make_engine
    from curate.features import FeatureCache, compute_features

    ds, spec = world
    ids = [r["sample_id"] for r in ds.rows()]
    model = load_model(spec.name, spec.pretrained)
    expected = compute_features(ds, model, ids, use_cache=False, batch_size=4).values
    cache = FeatureCache(ds.root, model, "embedding")
    shutil.rmtree(cache.folder, ignore_errors=True)
    cluster.write_text("kill")  # the first batch an actor sees kills it
    log = tmp_path / "batches.txt"

    def stop(done, total):
        raise KeyboardInterrupt("interrupted after the first batch")

    with pytest.raises(KeyboardInterrupt):
        compute_features(ds, model, ids, batch_size=8, shard_rows=8, engine=make_engine("ray", workers=1),
                         factory=Faulty(spec, 4, log, cluster), progress=stop)
    assert not cluster.exists(), "the fault was not triggered"
    sizes = [int(x) for x in log.read_text().split()]
    assert 8 in sizes and max(s for s in sizes if s <= 4) == 4  # tried 8, ran halves of 4
    kept, _ = cache.load()
    assert len(kept) == 8 and len(cache.shard_files()) == 1
    again = compute_features(ds, model, ids, batch_size=8)
    assert again.computed == len(ids) - 8
    cached_ids, _ = cache.load()
    assert sorted(cached_ids) == sorted(ids) and len(set(cached_ids)) == len(cached_ids)
    assert not cache.shard_files()  # compacted, each id once
    np.testing.assert_allclose(again.values, expected, atol=1e-6)  # halves of 4 = the local batches of 4


def test_an_address_that_does_not_answer_fails_fast(world) -> None:
    import socket

    from curate.engine import make_engine
    from curate.engine.session import RayUnavailableError
    from curate.features import compute_features

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    ds, spec = world
    model = load_model(spec.name, spec.pretrained)
    start = time.perf_counter()
    with pytest.raises(RayUnavailableError, match=f"no Ray cluster answers at ray://127.0.0.1:{port}"):
        compute_features(ds, model, [r["sample_id"] for r in ds.rows()], use_cache=False,
                         engine=make_engine("ray", ray_address=f"ray://127.0.0.1:{port}"))
    assert time.perf_counter() - start < 5
    with pytest.raises(ValueError, match="need --engine ray"):
        make_engine("local", ray_address="auto")


def test_a_dead_address_fails_before_the_stage_writes_anything(world, tmp_path) -> None:
    """Issue 29: the address is probed when the engine is made, before the folder is opened or a
    model loaded, so a failed run leaves no feature-cache or model-identity file behind."""
    import shutil
    import socket

    from curate.cli import main

    ds, spec = world
    root = tmp_path / "copy"
    shutil.copytree(ds.root, root)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    result = CliRunner().invoke(main, ["evaluate", str(root), "--model", spec.name, "--pretrained", spec.pretrained,
                                       "--engine", "ray", "--ray-address", f"ray://127.0.0.1:{port}"])
    assert result.exit_code != 0 and "no Ray cluster answers" in result.output
    assert time.perf_counter() - start < 10
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before  # nothing written


def test_without_an_address_ray_starts_its_own_local_instance(monkeypatch) -> None:
    """Issue 29: with no --ray-address, ray.init gets address="local", so a cluster that `ray start`
    left running on the machine is not joined."""
    import ray

    from curate.engine.session import ray_session

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    with ray_session(None, num_cpus=2):
        pass
    assert calls and calls[0]["address"] == "local" and calls[0]["num_cpus"] == 2


def test_lvlm_scoring_on_ray_equals_local(world, tmp_path, monkeypatch) -> None:
    """An lvlm: model on Ray: each actor loads the tiny LLaVA from its folder (the driver loads
    nothing), batches of 5 images come back in order, and the run equals the local engine's:
    predictions, candidate losses, metrics and the model's identity (exact: same batches, fp32
    on CPU)."""
    from curate.lvlm import scoring
    from curate.lvlm.tiny import build_tiny_llava
    from curate.runs.evaluation import EvaluationRun
    from curate.stages.evaluate import EvalSettings, evaluate

    ds, _ = world
    spec = ModelSpec(f"lvlm:{build_tiny_llava(tmp_path / 'tiny', seed=0)}")
    monkeypatch.setattr(scoring, "IMAGES_PER_BATCH", 5)  # several batches, the last one short
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"{c}\n" for c in CLASSES))  # 1 vs 5
    settings = EvalSettings(label_space=str(labels), bootstrap=20, batch_size=4, device="cpu")
    local = evaluate(ds.root, spec, settings, run_name="lvlm-local", overwrite=True)
    remote = evaluate(ds.root, spec, EvalSettings(**{**settings.__dict__, "engine": "ray", "workers": 1}),
                      run_name="lvlm-ray", overwrite=True)
    a, b = EvaluationRun.load(local.run_dir), EvaluationRun.load(remote.run_dir)
    assert b.model["model_id"] == a.model["model_id"] and b.model["info"] == a.model["info"]
    assert b.predictions().equals(a.predictions()) and b.candidate_losses().equals(a.candidate_losses())
    assert a.candidate_losses().num_rows == len(ds.rows()) * len(CLASSES)
    assert json.dumps(b.metrics, sort_keys=True) == json.dumps(a.metrics, sort_keys=True)


def test_propose_masks_on_ray_equals_local(world, tmp_path) -> None:
    """propose-masks on Ray: each actor loads the tiny CLIPSeg from its folder (the driver only
    names it), batches come back in order, and the run and the dataset's masks equal the local
    engine's exactly (same batches, fp32 on CPU)."""
    from curate.masks.tiny import build_tiny_clipseg
    from curate.stages.propose_masks import ProposeMasksSettings, propose_masks
    from curate.store import Dataset

    ds, _ = world
    folder = build_tiny_clipseg(tmp_path / "cs", seed=2)
    roots = {}
    for engine in ("local", "ray"):
        root = tmp_path / engine
        shutil.copytree(ds.root, root, ignore=shutil.ignore_patterns("runs", "features"))
        copy = Dataset.open(root)
        copy.set_masks({sid: None for sid in copy.sample_ids()[::2]}, clear_status=True, actor="test")
        settings = ProposeMasksSettings(threshold=0.5, batch_size=3, device="cpu", engine=engine,
                                        workers=1 if engine == "ray" else None)
        roots[engine] = (root, propose_masks(root, f"clipseg:{folder}", settings, run_name="m"))
    (a_root, a), (b_root, b) = roots["local"], roots["ray"]
    assert b.model_id == a.model_id and b.config["model"]["info"] == a.config["model"]["info"]
    assert b.table().equals(a.table()) and a.counts == b.counts and a.counts["applied"] > 0
    for row in a.rows():
        path = a.proposal_path(row["sample_id"])
        assert (path is None) == (b.proposal_path(row["sample_id"]) is None)
        if path is not None:
            assert path.read_bytes() == b.proposal_path(row["sample_id"]).read_bytes()
    rows_a, rows_b = Dataset.open(a_root).rows(), Dataset.open(b_root).rows()
    assert [(r["mask_status"], r["extra"]) for r in rows_a] == [(r["mask_status"], r["extra"]) for r in rows_b]


def test_no_ray_process_is_left_after_shutdown(cluster, user_head) -> None:
    import psutil

    ray.shutdown()
    user_head.stop()
    assert user_head.processes() == []
    deadline = time.time() + 15
    while True:
        alive = []
        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and ("ray" in proc.name().lower()
                                                              or "ray::" in " ".join(proc.cmdline())):
                    alive.append(proc.name())
            except psutil.NoSuchProcess:
                continue
        if not alive or time.time() > deadline:
            break
        time.sleep(0.5)
    assert alive == []


def test_actors_compute_with_the_local_engines_thread_count(monkeypatch) -> None:
    """Issue 29: actors used to run round(CPU share) torch threads (1 for two actors on 2 CPUs) where
    the local engine runs torch.get_num_threads(); float sums then depend on the split. Now every
    actor gets the driver's count (or an explicit ``threads``), whatever its CPU share."""
    import torch

    from curate.engine.ray_data import RayEngine

    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert RayEngine(workers=2).actor_threads() == 3
    assert RayEngine(workers=2, threads=1).actor_threads() == 1
    with pytest.raises(ValueError, match="threads"):
        RayEngine(threads=0)
