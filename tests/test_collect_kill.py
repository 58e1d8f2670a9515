"""SIGKILL the iNaturalist collector (a real `curate collect inat` subprocess) at random points,
run it again, and check the result equals an uninterrupted run's: same rows, same quarantine,
no stray files, nothing downloaded twice (beyond the few downloads in flight at each kill)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_inat import FakeINat, dataset_signature, make_world

from curate.store import check_dataset

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


def command(root: Path, api_url: str) -> list[str]:
    return [sys.executable, "-m", "curate.cli", "collect", "inat", str(root), "--classes", "9,10,16",
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
    result = subprocess.run(command(root, api_url), env=env(), capture_output=True, text=True, timeout=120,
                            check=False)
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
            proc = subprocess.Popen(command(root, srv.api_url), env=env(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            wanted = before + rng.randint(1, 14)  # a random point: after some journal progress...
            deadline = time.monotonic() + 60
            while proc.poll() is None and journal_lines(root) < wanted and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.25))  # ...plus a random delay (mid-download, mid-commit)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
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
