"""SIGKILL the iNaturalist collector (a real `curate collect inat` process) at random points,
run it again, and check the result equals an uninterrupted run's: same rows, same quarantine,
no stray files, nothing downloaded twice (beyond the few downloads in flight at each kill).

And, for every collector that keeps a journal (iNaturalist, its ``--fill``, folder, COCO, composite, hub, FiftyOne), a
kill at each commit boundary (issue 45): each run is SIGKILLed the moment it replaces
``samples.parquet`` (before the journal and the change log hear of it), the same command again,
until a run finishes; the folder must equal an uninterrupted run's, with an ``add`` record in
``changes.jsonl`` for every row and no temporary file left beside it.

Every run is a process of its own, forked from a zygote that has imported the collectors
(tests/cli_zygote.py), and each kill a real SIGKILL. Measured against a fresh interpreter per run
(2 cores, 2026-11-29): the seven kill-at-each-commit tests 52 -> 27 s of CPU, the three random-kill
tests 29 -> 18."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from cli_zygote import Zygote
from fake_inat import FakeINat, dataset_signature, make_place_world, make_world
from fill_helpers import OSTRICH, labelled_world
from PIL import Image
from publish_helpers import make_dataset

from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.publish.hub import write_hub_folder
from curate.store import Dataset, check_dataset

REPO = Path(__file__).resolve().parent.parent
CONCURRENCY = 3


def faults() -> dict[int, str]:
    probe = FakeINat(make_world(n_per_taxon=14))
    first = {t: probe.expected(t, 10) for t in (20001, 20002, 20003)}
    return {first[20001][1]: "500_once", first[20001][4]: "corrupt", first[20002][2]: "truncate_once",
            first[20002][5]: "truncated_file", first[20003][3]: "404", first[20003][0]: "429_once"}


def server() -> FakeINat:
    return FakeINat(make_world(n_per_taxon=14), api_429_every=6, api_retry_after="0", photo_faults=faults(),
                    photo_delay=0.12, api_delay=0.05)


def inat_args(root: Path, api_url: str) -> list[str]:
    """The arguments of the `curate collect inat` run these tests kill and resume."""
    return ["collect", "inat", str(root), "--classes", "9,10,16",
            "--taxon", "16=Pycnonotidae", "--per-class", "9", "--per-page", "4", "--api-url", api_url,
            "--api-rate", "none", "--download-rate", "none", "--byte-rate", "none",
            "--concurrency", str(CONCURRENCY), "--retry-backoff", "0.01", "--timeout", "10"]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}


def journal_lines(root: Path) -> int:
    total = 0
    for path in (root / ".collect").glob("*.jsonl") if (root / ".collect").is_dir() else []:
        try:
            total += path.read_bytes().count(b"\n")
        except OSError:
            pass
    return total


def run_to_end(root: Path, api_url: str) -> None:
    result = curate(inat_args(root, api_url))
    assert result.returncode == 0, result.stdout + result.stderr


def kill_and_resume(tmp_path: Path, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    with server() as reference:
        run_to_end(tmp_path / "reference", reference.api_url)
    with server() as srv:
        root = tmp_path / "killed"
        killed = 0
        for _ in range(kills * 3):
            if killed >= kills:
                break
            before = journal_lines(root)
            args = inat_args(root, srv.api_url)
            proc = _zygote(args).start(args, Path.cwd(), env())
            wanted = before + rng.randint(1, 14)  # a random point: after some journal progress...
            deadline = time.monotonic() + 60
            while proc.poll() is None and journal_lines(root) < wanted and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.25))  # ...plus a random delay (mid-download, mid-commit)
            if proc.poll() is None:
                proc.kill()  # SIGKILL
                killed += 1
            proc.wait(timeout=30)
        assert killed >= 1
        run_to_end(root, srv.api_url)
        # nothing downloaded twice, except what was in flight when a kill landed
        repeats = sum(n - 1 for n in srv.photo_complete.values() if n > 1)
        assert repeats <= killed * CONCURRENCY * 2, dict(srv.photo_complete)
    assert dataset_signature(root) == dataset_signature(tmp_path / "reference")
    assert not check_dataset(root)
    assert not list((root / ".collect").glob("*.staging"))  # the finished job left no staged bodies
    assert not any(p.is_file() for p in (root / ".tmp").glob("*")) if (root / ".tmp").exists() else True


def test_sigkill_twice_then_resume_equals_uninterrupted(tmp_path) -> None:
    kill_and_resume(tmp_path, kills=2, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3])
def test_sigkill_many_times_then_resume_equals_uninterrupted(tmp_path, seed) -> None:
    kill_and_resume(tmp_path, kills=5, seed=seed)


#: Runs ``curate ARGS`` with ``os.replace`` wrapped so that the process SIGKILLs itself the moment
#: ``$KILL_ROOT/samples.parquet`` is replaced: right after a commit, before anything that follows it.
KILL_AT_COMMIT = (
    "import os, signal, sys\n"
    "real = os.replace\n"
    "target = os.path.join(os.path.realpath(os.environ['KILL_ROOT']), 'samples.parquet')\n"
    "def replace(src, dst, *args, **kwargs):\n"
    "    real(src, dst, *args, **kwargs)\n"
    "    if os.path.realpath(os.fspath(dst)) == target:\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n"
    "os.replace = replace\n"
    "from curate.cli import main\n"
    "main(sys.argv[1:], prog_name='curate')\n"
)


#: What each run's process imports before it forks (tests/cli_zygote.py): the CLI, the collectors and,
#: for ``collect fiftyone``, FiftyOne (about 2.5 s of CPU a run otherwise).
COLLECTORS = ("curate.cli", "curate.collect.inat", "curate.collect.fill", "curate.collect.folder", "curate.collect.coco",
              "curate.collect.composite", "curate.collect.hub", "curate.collect.fiftyone_import")
_ZYGOTES: dict[tuple, Zygote] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_zygotes():
    yield
    while _ZYGOTES:
        _ZYGOTES.popitem()[1].close()


def curate(args: list[str], *, kill_root: Path | None = None) -> subprocess.CompletedProcess:
    """``curate ARGS`` in a process of its own (killed at its first commit to ``kill_root`` when given),
    forked from a zygote that imported the collectors (tests/cli_zygote.py; one per environment)."""
    runtime = {"KILL_ROOT": str(kill_root)} if kill_root else {}  # read when a commit happens, not at import
    return _zygote(args).run(args, Path.cwd(), env(), timeout=120, runtime_env=runtime,
                             code=KILL_AT_COMMIT if kill_root else None)


def _zygote(args: list[str]) -> Zygote:
    """The module's zygote for ``curate ARGS`` in this environment (started at the first use)."""
    preload = (*COLLECTORS, "fiftyone") if args[:2] == ["collect", "fiftyone"] else COLLECTORS
    run_env = env()
    key = (tuple(sorted(run_env.items())), preload)
    if key not in _ZYGOTES:
        _ZYGOTES[key] = Zygote(run_env, REPO, preload=preload)
    return _ZYGOTES[key]


def kill_at_each_commit(args: list[str], root: Path, max_runs: int = 40) -> int:
    """Run ``curate ARGS`` again and again, each run killed right after its first commit to ``root``,
    until one finishes without committing; returns the number of kills."""
    for kills in range(max_runs):
        result = curate(args, kill_root=root)
        if result.returncode == 0:
            return kills
        assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    raise AssertionError(f"still committing after {max_runs} runs")


def assert_left_whole(root: Path) -> None:
    """A valid folder, a change-log ``add`` for every row, no temporary file in or beside it."""
    assert not check_dataset(root)
    ds = Dataset.open(root)
    added = {c["sample_id"] for c in ds.changes() if c.get("op") == "add"}
    assert set(ds.sample_ids()) <= added, sorted(set(ds.sample_ids()) - added)[:5]
    leftovers = [p.name for p in (*root.iterdir(), *root.parent.iterdir())
                 if p.is_file() and (p.name.endswith(".tmp") or "pending" in p.name)]
    assert not leftovers, leftovers
    assert not any(p.is_file() for p in (root / ".tmp").glob("*")) if (root / ".tmp").exists() else True


def compare_killed(tmp_path: Path, args_for, prepare=None, commits: int = 2) -> None:
    """``args_for(root)``: the command; ``prepare(root)``: the folder before it (optional). The
    uninterrupted run and the run killed at each of its (at least ``commits``) commits end with the
    same folder."""
    roots = {}
    for name in ("reference", "killed"):
        roots[name] = tmp_path / name / "ds"
        roots[name].parent.mkdir()
        if prepare is not None:
            prepare(roots[name])
    result = curate(args_for(roots["reference"]))
    assert result.returncode == 0, result.stdout + result.stderr
    kills = kill_at_each_commit(args_for(roots["killed"]), roots["killed"])
    assert kills >= commits
    assert dataset_signature(roots["killed"]) == dataset_signature(roots["reference"])
    assert_left_whole(roots["killed"])


def test_inat_killed_at_each_commit_equals_uninterrupted(tmp_path: Path) -> None:
    with FakeINat(make_world(n_per_taxon=14), photo_faults=faults()) as srv:
        def args(root: Path) -> list[str]:
            args = inat_args(root, srv.api_url)
            args[args.index("--per-page") + 1] = "10"  # fewer commits: one a page
            return args
        compare_killed(tmp_path, args)


@pytest.fixture(scope="module")
def place_server():
    with FakeINat(make_place_world(n_per_taxon=600, seed=7)) as server:
        yield server


def test_fill_killed_at_each_commit_fetches_what_an_uninterrupted_fill_does(tmp_path: Path,
                                                                              place_server: FakeINat) -> None:
    """The fault of issue 45: a fill killed right after its commit listed its own photos as 'in the
    folder', dropped them, and fetched as many again (94 proposed for --n 50)."""
    base = labelled_world(place_server, tmp_path / "base", per_class=80)

    def args(root: Path) -> list[str]:
        return ["collect", "inat", str(root), "--fill", "split-planted", "--class", str(OSTRICH), "--n", "6",
                "--api-url", place_server.api_url, "--api-rate", "none", "--download-rate", "none",
                "--byte-rate", "none"]

    compare_killed(tmp_path, args, prepare=lambda root: shutil.copytree(base, root), commits=1)
    proposed = [r for r in Dataset.open(tmp_path / "killed" / "ds").rows() if "proposed:hard" in r["tags"]]
    assert len(proposed) == 6


def test_folder_killed_at_each_commit_equals_uninterrupted(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for k in range(5):
        (src / ("9" if k % 2 else "10")).mkdir(parents=True, exist_ok=True)
        image = Image.fromarray(np.random.default_rng(k).integers(0, 255, (12, 16, 3), dtype=np.uint8))
        image.save(src / ("9" if k % 2 else "10") / f"{k}.png")
    compare_killed(tmp_path, lambda root: ["collect", "folder", str(root), str(src), "--license", "cc-by"])


def test_composite_killed_at_each_commit_equals_uninterrupted(tmp_path: Path) -> None:
    objects = tmp_path / "objects"
    collect_synthetic(objects, WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=3, image_size=32, seed=3))
    compare_killed(tmp_path, lambda root: ["collect", "composite", str(root), "--objects", str(objects),
                                           "--colors", "red,green", "--seed", "4"])


def test_hub_killed_at_each_commit_equals_uninterrupted(tmp_path: Path) -> None:
    make_dataset(tmp_path / "orig", per_group=2)
    write_hub_folder(tmp_path / "orig", tmp_path / "pub")
    compare_killed(tmp_path, lambda root: ["collect", "hub", str(tmp_path / "pub"), str(root), "--batch-size", "4"])


def test_coco_killed_at_each_commit_equals_uninterrupted(tmp_path: Path) -> None:
    images, annotations, listed = tmp_path / "images", [], []
    images.mkdir()
    for k in range(1, 7):
        Image.fromarray(np.random.default_rng(k).integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(images / f"{k}.jpg")
        listed.append({"id": k, "file_name": f"{k}.jpg", "width": 40, "height": 30, "license": 4})
        annotations.append({"id": 100 + k, "image_id": k, "category_id": 17 + k % 2, "iscrowd": 0, "area": 80.0,
                            "bbox": [5, 5, 10, 8], "segmentation": [[5, 5, 15, 5, 15, 13, 5, 13]]})
    ann = tmp_path / "instances.json"
    ann.write_text(json.dumps({"images": listed, "annotations": annotations,
                               "licenses": [{"id": 4, "name": "Attribution License",
                                             "url": "http://creativecommons.org/licenses/by/2.0/"}],
                               "categories": [{"id": 17, "name": "cat"}, {"id": 18, "name": "dog"}]}))
    compare_killed(tmp_path, lambda root: ["collect", "coco", str(root), "--annotations", str(ann),
                                           "--images-root", str(images), "--categories", "cat,dog"])


@pytest.mark.slow  # ~100 s: each of its runs imports FiftyOne
def test_fiftyone_killed_at_each_commit_equals_uninterrupted(fo, tmp_path: Path) -> None:
    from test_collect_fiftyone import make_source  # here: that module imports this one

    dataset = make_source(fo, tmp_path / "media", n=6)
    compare_killed(tmp_path, lambda root: ["collect", "fiftyone", dataset.name, str(root), "--mask-field", "seg",
                                           "--field", "note", "--batch-size", "2"])
