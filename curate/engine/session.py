"""Starting, joining and leaving a Ray cluster for one stage (``docs/design.md#engines``).

- no address: a local Ray instance is started for the stage (dashboard off, object store
  bounded by ``object_store_mb``, ``num_cpus`` CPUs) and shut down when the stage ends, so the
  code path a cluster uses is the one the tests use; ``address="local"``, so neither a cluster
  that ``ray start`` left running on this machine nor one that ``RAY_ADDRESS`` names is joined
  (Ray reads both only for no address or ``auto``);
- ``auto``: the cluster this machine belongs to (``ray start`` ran here);
- ``ray://HOST:PORT`` (Ray Client) or ``HOST:PORT`` (a head node's GCS): a remote cluster.
  The port is probed with a TCP connection first, so an address that does not answer is a
  clear error within ``connect_timeout`` seconds instead of Ray's own long retry loop.

When Ray is already initialised in this process (a notebook, a test fixture, a driver script)
that instance is used and left running.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator

logger = logging.getLogger(__name__)

__all__ = ["RayUnavailableError", "check_address", "ray_session"]

DEFAULT_OBJECT_STORE_MB = 512
CONNECT_TIMEOUT_S = 3.0


class RayUnavailableError(ConnectionError):
    """The Ray cluster named by ``--ray-address`` cannot be reached."""


def _host_port(address: str) -> tuple[str, int]:
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--ray-address must be auto, ray://HOST:PORT or HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def check_address(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`RayUnavailableError` unless something listens at ``address`` (not ``auto``)."""
    if address == "auto":
        return
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as error:
        raise RayUnavailableError(
            f"no Ray cluster answers at {address} ({type(error).__name__}: {error}) within {timeout:.0f} s; "
            "check the head node's address and port (ray://HOST:10001 for Ray Client, HOST:6379 for the GCS), "
            "or leave --ray-address out to run a local Ray instance") from None


@contextlib.contextmanager
def ray_session(address: str | None = None, *, num_cpus: int | None = None,
                object_store_mb: int = DEFAULT_OBJECT_STORE_MB) -> Iterator[None]:
    """Ray initialised for the duration of the block (see the module docstring)."""
    import ray

    if address:
        check_address(address)
    if ray.is_initialized():
        yield
        return
    if address:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except ConnectionError as error:
            raise RayUnavailableError(f"cannot join the Ray cluster at {address}: {error}") from None
    else:
        # address="local": always a new local instance, never a cluster that `ray start` left
        # running on this machine (Ray would join it without an address)
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
                 object_store_memory=object_store_mb * 1024 * 1024, log_to_driver=False,
                 logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()
