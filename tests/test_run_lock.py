"""The per-run writer lock (curate/runs/lock.py): held across processes, naming its holder, released
when the holder dies. The stages' use of it: tests/test_propose_masks.py, tests/test_intervene.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from curate.runs.lock import RunLockedError, lock_path, run_lock

HOLD = """import sys, time
from curate.runs.lock import run_lock
with run_lock(sys.argv[1], "r", purpose="test"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_lock_held_by_another_process_names_it_and_dies_with_it(tmp_path) -> None:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=f"being written by process {child.pid} \\(test: ") as refused:
            with run_lock(tmp_path, "r"):
                pass
        assert refused.value.holder["pid"] == child.pid and refused.value.holder["purpose"] == "test"
        with pytest.raises(RunLockedError, match="waited 0.3 s"):
            with run_lock(tmp_path, "r", timeout=0.3):
                pass
        child.kill()  # SIGKILL: its `with` never exits, the file stays, the kernel drops the lock
        child.wait(timeout=10)
        assert lock_path(tmp_path, "r").exists()
        with run_lock(tmp_path, "r", purpose="second") as path:
            assert json.loads(path.read_text())["pid"] == os.getpid()
        assert not path.exists()  # removed on release
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    with pytest.raises(ValueError, match="plain folder name"):  # never a lock file outside runs/
        with run_lock(tmp_path, "../elsewhere"):
            pass
