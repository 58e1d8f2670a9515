"""The Ray engine's default bounded waits: one place below both :mod:`curate.engine` (which
re-exports them for the CLI's options) and :mod:`curate.engine.ray_data` (which waits them)."""
from __future__ import annotations

__all__ = ["RAY_RELEASE_WAIT_S", "RAY_START_TIMEOUT_S"]

#: the Ray engine's default ``release_wait_s``: seconds a retry after a lost node waits for the
#: failed pipeline's CPUs to be freed before it plans for what is free (``--ray-release-wait``)
RAY_RELEASE_WAIT_S = 30.0
#: the Ray engine's default ``start_timeout_s``: seconds a pipeline waits for its model actors to
#: start (model loaded) before the first batch (``--ray-start-timeout``)
RAY_START_TIMEOUT_S = 600.0
