"""Parallel test runs (``make test``: ``pytest -n 2 --dist loadfile``; tests/conftest.py's module doc and
tests/xdist_groups.py): each pytest-xdist worker computes with its share of the cores, and the scheduler
keeps a module's tests, the Label Studio suites and the Ray suites each in one worker.

The ``test_probe_*`` tests hold under any run; with ``CURATE_TEST_PROBE_DIR`` set each also writes which
worker ran it and with how many threads, which :func:`test_a_parallel_run_computes_with_each_workers_share_of_the_cores`
reads after running this module under ``-n 2``."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import env_count
from xdist_groups import SHARED_MODULE_GROUPS, group_scheduler, scheduling_group, worker_threads

TESTS = Path(__file__).resolve().parent


def test_worker_threads_split_the_cores() -> None:
    assert worker_threads(2, 2) == 1
    assert worker_threads(2, 16) == 8
    assert worker_threads(3, 2) == 1  # never 0
    assert worker_threads(2, None) == 1  # os.cpu_count() may be None


def test_groups_join_the_shared_modules_and_keep_the_others_whole() -> None:
    assert scheduling_group("tests/test_review_masks.py::test_x[a::b]") == "labelstudio"
    assert scheduling_group("tests/test_discover_review.py::test_y") == "labelstudio"
    assert scheduling_group("tests/test_engine_ray.py::test_x") == scheduling_group("tests/test_engine_ray_cluster.py::t")
    assert scheduling_group("tests/test_labels.py::test_x[1]") == "tests/test_labels.py"


def modules_using(names: set[str]) -> set[str]:
    """Test modules with a function (test or fixture) taking one of ``names`` as a parameter."""
    found = set()
    for path in TESTS.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and names & {a.arg for a in node.args.args + node.args.kwonlyargs}:
                found.add(path.name)
    return found


def test_every_suite_of_a_shared_server_or_of_ray_is_grouped() -> None:
    """A new module taking the ``ls`` fixture, or starting Ray, must join its group (else a second Label
    Studio server starts in the other worker, or two Rays run at once)."""
    assert modules_using({"ls"}) <= {m for m, g in SHARED_MODULE_GROUPS.items() if g == "labelstudio"}
    ray_modules = {p.name for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name
                   and ("ray.init(" in p.read_text() or "RayHead" in p.read_text())}
    assert ray_modules <= {m for m, g in SHARED_MODULE_GROUPS.items() if g == "ray"}


class FakeWorker:
    """What xdist's schedulers use of a worker: its id, the test indices sent to it, shutdown."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def send_runtest_all(self) -> None:
        raise AssertionError("not used by the loadfile scheduler")

    def shutdown(self) -> None:
        self.shutting_down = True


def schedule(scheduler_class: type | None, collection: list[str]) -> dict[str, set[str]]:
    """Worker id -> the modules of ``collection`` it ran, two workers; ``scheduler_class`` None: ours."""
    config = SimpleNamespace(getvalue=lambda name: ["2*popen"] if name == "tx" else None,
                             option=SimpleNamespace(loadscopereorder=True))
    scheduler = group_scheduler(config, None) if scheduler_class is None else scheduler_class(config, None)
    workers = [FakeWorker("gw0"), FakeWorker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
    for worker in workers:
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    done = {w.gateway.id: 0 for w in workers}
    while any(done[w.gateway.id] < len(w.sent) for w in workers):  # the workers finish their tests in turn
        for worker in workers:
            if done[worker.gateway.id] < len(worker.sent):
                scheduler.mark_test_complete(worker, worker.sent[done[worker.gateway.id]])
                done[worker.gateway.id] += 1
    assert scheduler.tests_finished
    return {w.gateway.id: {collection[i].split("::")[0] for i in w.sent} for w in workers}


def test_the_scheduler_sends_a_group_to_one_worker() -> None:
    """tests/xdist_groups.py's scheduler: the Label Studio modules land on one worker, the Ray modules on
    one worker, and every other module whole on one worker; xdist's plain loadfile splits the groups."""
    from xdist.scheduler import LoadFileScheduling

    modules = ["tests/test_review_labelstudio.py", "tests/test_discover_review.py", "tests/test_engine_ray.py",
               "tests/test_engine_ray_cluster.py", "tests/test_a.py", "tests/test_review_masks.py", "tests/test_b.py",
               "tests/test_c.py", "tests/test_d.py", "tests/test_e.py"]
    collection = [f"{m}::test_{i}" for m in modules for i in range(3)]
    for groups, split in ((schedule(None, collection), False), (schedule(LoadFileScheduling, collection), True)):
        assert set().union(*groups.values()) == set(modules)
        assert not groups["gw0"] & groups["gw1"]  # no module is split
        for members in ({m for m in modules if "labelstudio" in m or "review" in m},
                        {m for m in modules if "ray" in m}):
            together = any(members <= sent for sent in groups.values())
            assert together != split, (members, groups)


def probe(name: str) -> None:
    """The thread counts of this process; written to ``$CURATE_TEST_PROBE_DIR/<name>.json`` when set."""
    threads = torch.get_num_threads()
    workers = env_count("PYTEST_XDIST_WORKER_COUNT")
    if os.environ.get("PYTEST_XDIST_WORKER") and workers:
        want = env_count("CURATE_TEST_TORCH_THREADS")
        assert want is not None and threads == want
        assert os.environ["OMP_NUM_THREADS"] and os.environ["MKL_NUM_THREADS"]  # for the CLI runs it starts
    folder = os.environ.get("CURATE_TEST_PROBE_DIR")
    if folder:
        record = {"worker": os.environ.get("PYTEST_XDIST_WORKER"), "threads": threads,
                  "omp": os.environ.get("OMP_NUM_THREADS"), "columns": os.environ.get("COLUMNS"), "pid": os.getpid()}
        (Path(folder) / f"{name}.json").write_text(json.dumps(record))


def test_probe_a() -> None:
    probe("a")


def test_probe_b() -> None:
    probe("b")


def test_probe_c() -> None:
    probe("c")


def test_probe_d() -> None:
    probe("d")


@pytest.mark.timeout(300)
def test_a_parallel_run_computes_with_each_workers_share_of_the_cores(tmp_path) -> None:
    """Under ``-n 2 --dist loadfile`` the four probes (one module, one worker) run with cores // 2 torch
    threads (at least 1) and that ``OMP_NUM_THREADS`` for the worker's subprocesses; without the
    conftest's setting each worker took every core (torch's default). ``COLUMNS`` is the shell's (unset here):
    xdist's workers started with 80, which cut the words of CLI tables tests read."""
    env = {key: value for key, value in os.environ.items()  # as from a shell, also when this test runs in a worker
           if key not in ("CURATE_TEST_TORCH_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "COLUMNS")
           and not key.startswith("PYTEST_XDIST_")}
    env["CURATE_TEST_PROBE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadfile", "-k", "probe", str(TESTS / "test_parallel_runs.py")],
                          capture_output=True, text=True, timeout=280, cwd=TESTS.parent, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    records = [json.loads((tmp_path / f"{name}.json").read_text()) for name in "abcd"]
    assert len({r["worker"] for r in records}) == 1 and records[0]["worker"] in ("gw0", "gw1")
    threads = worker_threads(2, os.cpu_count())
    assert {r["threads"] for r in records} == {threads}
    assert {r["omp"] for r in records} == {str(threads)}
    assert {r["columns"] for r in records} == {None}  # as in the shell: the CLI's tables keep their width
