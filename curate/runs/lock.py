"""The per-run writer lock: at most one live process writes ``DIR/runs/<name>/``.

Any stage that writes a run folder (and above all one that resumes an unfinished run of the same
name) holds :func:`run_lock` from BEFORE it looks at the folder (is there an unfinished run to
resume, a finished one to refuse?) until its ``config.json``, the commit marker, is written and
its temporary files are gone::

    from curate.runs.lock import run_lock

    with run_lock(ds.root, name, purpose="evaluate"):
        run_dir = prepare_run_dir(ds.root, name, overwrite=overwrite)
        ...                      # write the results
        record.write(run_dir)    # config.json last

A second writer of the same run, in another process or in this one, gets :class:`RunLockedError`
(a :class:`curate.runs.base.RunError`) naming the live process: its pid, host, command and since
when, at once (``timeout=0``, the default) or after waiting ``timeout`` seconds. Without the lock
a second ``curate propose-masks --run-name X`` took the live run for an interrupted one and
resumed into it (docs/design.md#run-folders).

How: an exclusive ``flock`` on ``DIR/runs/.<name>.lock``, a hidden file BESIDE the run folder (so
the lock is taken before the folder exists and :func:`curate.runs.base.prepare_run_dir` still
refuses an existing folder as before; :func:`curate.runs.base.list_runs` never lists it). The
kernel drops the lock when the holder exits, however it exits (Ctrl-C, an error, SIGKILL), so a
dead writer never leaves a stale lock. While held, the file holds the holder as JSON (``pid``,
``host``, ``since``, ``purpose``, ``command``); it is removed on release (a writer that opened
it meanwhile sees that its file was unlinked and tries again on the new one). A ``runs/`` the lock
made is removed on release when it is empty (a stage refused or failed before making its run: a
model that fails to load leaves the folder as it was). The lock is not re-entrant. Where there is no ``fcntl`` (Windows) runs are not locked.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from curate.runs.base import RUNS_DIR, RunError, slug

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock
    fcntl = None  # type: ignore[assignment]

__all__ = ["RunLockedError", "run_lock", "lock_path", "run_holder"]

#: Seconds between two tries while waiting for a lock (``timeout`` > 0).
POLL_SECONDS = 0.1


class RunLockedError(RunError):
    """Another live process writes this run; ``holder`` is what it recorded (pid, host, ...)."""

    def __init__(self, message: str, holder: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.holder = dict(holder or {})


def lock_path(dataset_root: str | Path, name: str) -> Path:
    """The lock file of run ``name`` of the dataset at ``dataset_root``: ``runs/.<name>.lock``."""
    return Path(dataset_root) / RUNS_DIR / f".{name}.lock"


def run_holder(dataset_root: str | Path, name: str) -> dict[str, Any]:
    """What the live writer of run ``name`` recorded about itself ({} when none is recorded)."""
    try:
        holder = json.loads(lock_path(dataset_root, name).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder.get("pid"):
        return "another process (it has not recorded its pid yet)"
    host = holder.get("host")
    where = f" on {host}" if host and host != socket.gethostname() else ""
    command = f": {holder['command']}" if holder.get("command") else ""
    return f"process {holder['pid']}{where} ({holder.get('purpose') or 'a writer'}{command}, since {holder.get('since')})"


def _try_lock(path: Path) -> int | None:
    """An open descriptor of ``path`` holding its exclusive lock, or None when another holds it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # a writer that had made runs/ removed it empty meanwhile: make it again
            path.parent.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:  # the holder we waited for may have unlinked the file before we locked it: lock the new one
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextmanager
def run_lock(dataset_root: str | Path, name: str, *, purpose: str = "", timeout: float = 0.0) -> Iterator[Path]:
    """Hold run ``name``'s writer lock (module docstring); yields the lock file's path.

    Args:
        dataset_root: the dataset folder (``runs/`` is created if missing).
        name: the run folder's name (a plain name, as :func:`curate.runs.base.prepare_run_dir` takes).
        purpose: what the holder does (e.g. the stage: ``"propose-masks"``), shown to a refused writer.
        timeout: seconds to wait for a live holder to finish; 0 refuses at once.

    Raises:
        RunLockedError: another live writer holds the run past ``timeout``.
    """
    if not name or name != slug(name, limit=200) or name in (".", ".."):  # as prepare_run_dir: never outside runs/
        raise ValueError(f"run name {name!r} must be a plain folder name of letters, digits, '.', '_' or '-'")
    path = lock_path(dataset_root, name)
    if fcntl is None:  # pragma: no cover - Windows
        yield path
        return
    made_runs = not path.parent.is_dir()  # then removed on release if no run was made in it (issue 45)
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + max(0.0, timeout)
    fd = _try_lock(path)
    while fd is None:
        if time.monotonic() >= deadline:
            holder = run_holder(dataset_root, name)
            waited = f"; waited {timeout:g} s" if timeout > 0 else ""
            raise RunLockedError(f"run {name} in {Path(dataset_root) / RUNS_DIR} is being written by "
                                 f"{_describe(holder)}{waited}: wait for it to finish, or stop it and run again "
                                 "(an interrupted run resumes)", holder)
        time.sleep(POLL_SECONDS)
        fd = _try_lock(path)
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "purpose": purpose, "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else ""}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode("utf-8"))
        yield path
    finally:
        try:
            path.unlink()  # while still holding it: a writer that opened it meanwhile retries (_try_lock)
        except OSError:
            pass
        if made_runs:
            try:
                path.parent.rmdir()  # only when empty: a model that failed to load leaves no runs/
            except OSError:
                pass
        os.close(fd)  # releases the flock
