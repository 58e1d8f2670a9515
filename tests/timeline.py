"""When each test ran, on which worker: a pytest plugin for measuring the suite's schedule (issue 42).

Active only when ``$CURATE_TEST_TIMELINE`` names a file: each finished test appends one JSON line
``{"worker", "nodeid", "start", "stop", "cpu"}`` (wall-clock seconds since the epoch, and the
worker process's CPU seconds, user + system, spent on the test, setup and teardown included). Every
xdist worker appends to the same file (one ``write`` per line, opened in append mode). Summarise
with ``python tests/timeline.py FILE``: each module's wall and CPU seconds, and each worker's busy
time and when it finished, which shows the idle tail a schedule leaves.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ENV = "CURATE_TEST_TIMELINE"


def _cpu() -> float:
    usage = os.times()
    return usage.user + usage.system + usage.children_user + usage.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    start, cpu = time.time(), _cpu()
    yield
    line = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "nodeid": item.nodeid,
            "start": round(start, 3), "stop": round(time.time(), 3), "cpu": round(_cpu() - cpu, 3)}
    with open(os.environ[ENV], "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def summarise(path: Path) -> str:
    """Per module: wall and CPU seconds; per worker: busy seconds, first start and last stop."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        return "no tests recorded"
    t0 = min(r["start"] for r in rows)
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    workers: dict[str, list[float]] = defaultdict(lambda: [0.0, float("inf"), 0.0])
    for r in rows:
        module = r["nodeid"].split("::", 1)[0]
        modules[module][0] += r["stop"] - r["start"]
        modules[module][1] += r["cpu"]
        w = workers[r["worker"]]
        w[0] += r["stop"] - r["start"]
        w[1], w[2] = min(w[1], r["start"] - t0), max(w[2], r["stop"] - t0)
    lines = [f"{'module':60s} {'wall s':>8s} {'cpu s':>8s}"]
    lines += [f"{m:60s} {v[0]:8.1f} {v[1]:8.1f}" for m, v in sorted(modules.items(), key=lambda kv: -kv[1][0])]
    lines += [f"worker {k}: busy {v[0]:.0f} s, from {v[1]:.0f} s to {v[2]:.0f} s" for k, v in sorted(workers.items())]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarise(Path(sys.argv[1])))
