"""How the suite runs on several pytest-xdist workers (``make test``: ``pytest -n 2 --dist loadfile``).

``--dist loadfile`` sends each test module to one worker, so a module's module-scoped fixtures are
built once per run, as in a serial run. :data:`SHARED_MODULE_GROUPS` joins modules that must also
share one worker: the suites of one real server (session fixtures are per worker, so two workers
would start two), and the Ray suites (two Ray instances at once on 2 cores starve the cluster
suite's 1-CPU nodes, whose health checks declare a node dead after 5 s). xdist's own
``--dist loadgroup`` cannot do this under pytest 9: it appends the group to ``item._nodeid``, which
pytest 9's ``nodeid`` no longer reads (measured: tests marked with one group ran on both workers).
"""
from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

#: Module file name -> the group whose modules run in one worker, one after another.
SHARED_MODULE_GROUPS = {
    "test_review_labelstudio.py": "labelstudio", "test_discover_review.py": "labelstudio",
    "test_review_masks.py": "labelstudio", "test_review_overlap_labelstudio.py": "labelstudio",  # the `ls` fixture
    "test_engine_ray.py": "ray", "test_engine_ray_cluster.py": "ray",  # one Ray at a time
}


def scheduling_group(nodeid: str) -> str:
    """The unit of work ``nodeid`` belongs to: its module's group in :data:`SHARED_MODULE_GROUPS`, else its
    module file (``tests/test_x.py::test_y[p]`` -> ``tests/test_x.py``)."""
    path = nodeid.split("::", 1)[0]
    return SHARED_MODULE_GROUPS.get(PurePosixPath(path).name, path)


def worker_threads(workers: int, cores: int | None) -> int:
    """Torch threads for each of ``workers`` parallel test processes on ``cores`` cores: cores // workers,
    at least 1 (2 workers on 2 cores: 1 each)."""
    return max(1, (cores or 1) // max(1, workers))


def group_scheduler(config: Any, log: Any) -> Any:
    """xdist's ``loadfile`` scheduler with :func:`scheduling_group` as its unit (xdist imported here only:
    a run without xdist never calls this). Units go out largest first (xdist's ``--loadscope-reorder``)."""
    from xdist.scheduler import LoadFileScheduling

    class GroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_group(nodeid)

    return GroupScheduling(config, log)
