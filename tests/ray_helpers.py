"""A Ray head as on a user's Ray node, for the Ray suites (issue 39).

:class:`RayHead` runs ``ray start --head --block`` on a free loopback port with its own temp
folder, in a session of its own, and ends it by process id: its ``ray start`` process, every
process under it, and any process whose command line names its temp folder. Never ``ray stop``,
which ends every Ray process on the machine (other suites', other users')."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

__all__ = ["KEEP_IDLE_WORKERS", "RayHead", "free_port"]

#: Ray system config for the suites' own instances: keep idle workers for the module's lifetime.
#: Ray kills a node's idle workers beyond its CPU count after 1 s idle (``idle_worker_killing_time_threshold_ms``),
#: so each Ray Data run of a module started new decode workers, each importing torch and
#: torchvision again (about 6 s of CPU each). Kept, the next run reuses them. Measured (2 cores,
#: 2026-11-29, test_engine_ray_cluster.py alone): 110 s -> 85 s wall, the Ray workers' CPU about
#: halved (idle workers 53 -> 11 s). Scheduling and results are Ray's and the engine's as before:
#: only when an idle process exits changes.
KEEP_IDLE_WORKERS = {"idle_worker_killing_time_threshold_ms": 600_000}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayHead:
    """``ray start --head`` (1 CPU, no dashboard) on 127.0.0.1; :attr:`address` is its GCS
    ``HOST:PORT``, as ``RAY_ADDRESS`` names it on a user's node. Use as a context manager, or call
    :meth:`stop` (idempotent) in a ``finally``."""

    def __init__(self, start_timeout_s: float = 90.0) -> None:
        # a short folder: Ray's socket paths under it must stay within 107 characters
        self.temp_dir = Path(tempfile.mkdtemp(prefix="curate-head-", dir="/tmp"))
        self.address = f"127.0.0.1:{free_port()}"
        ray_cli = Path(sys.executable).with_name("ray")
        self.log = self.temp_dir.with_suffix(".log")
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(ray_cli), "start", "--head", f"--port={self.address.rsplit(':', 1)[1]}",
                 "--node-ip-address=127.0.0.1", f"--temp-dir={self.temp_dir}", "--num-cpus=1",
                 "--include-dashboard=false", "--disable-usage-stats", "--block"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait(self, timeout_s: float) -> None:
        """Until ``ray start`` has started every process of the head: it then writes the head's
        address into the temp folder (``ray_current_cluster``, where a user's node has it under
        ``/tmp/ray``)."""
        deadline = time.monotonic() + timeout_s
        while not (self.temp_dir / "ray_current_cluster").exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"ray start --head exited ({self.process.returncode}): {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Ray head at {self.address} did not start within {timeout_s:.0f} s")
            time.sleep(0.25)

    def processes(self) -> list[psutil.Process]:
        """The head's processes still running: ``ray start`` and everything under it, and any
        process whose command line names :attr:`temp_dir` (one that left its parent)."""
        found: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.process.pid)
            for p in [root, *root.children(recursive=True)]:
                found[p.pid] = p
        except psutil.NoSuchProcess:
            pass
        for p in psutil.process_iter(["cmdline"]):
            if str(self.temp_dir) in " ".join(p.info["cmdline"] or ()):
                found[p.pid] = p
        alive = []
        for p in found.values():
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                continue
        return alive

    def stop(self, wait_s: float = 10.0) -> None:
        """End the head: SIGKILL to its processes (a graceful SIGTERM took over 15 s), again for
        any found after the first round; remove its folder. Safe to call twice."""
        for _ in range(3):
            procs = self.processes()
            if not procs:
                break
            for p in procs:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    continue
            psutil.wait_procs(procs, timeout=wait_s)
        if self.process.poll() is None:  # reap the ray start process itself
            self.process.wait(timeout=wait_s)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.log.unlink(missing_ok=True)

    def __enter__(self) -> RayHead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

