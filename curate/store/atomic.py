"""Crash-safe file writes and the dataset folder's writer lock.

Every file of a dataset that is ever rewritten (``samples.parquet``, ``dataset.yaml``) is
replaced whole: the new content goes to a temporary file in the folder's ``.tmp/``, is flushed
and ``fsync``-ed, then ``os.replace``-d over the old name (atomic on POSIX within one file
system) and the parent directory is ``fsync``-ed so the rename itself survives a power cut.
A process killed at any instant therefore leaves either the old file or the new one. Temporary
files of dead writers are removed by the next writer that takes the lock.

Append-only logs (``changes.jsonl``, ``quarantine.jsonl``) are written with one ``write`` per
batch and ``fsync``-ed; a writer killed in the middle can leave a torn last line, which readers
skip (:func:`read_jsonl`) and the next appender terminates before adding its own lines.

All writers hold the folder's lock (:class:`DatasetLock`, a ``filelock.FileLock`` on
``.curate.lock``). A writer that cannot get it within its timeout gets :class:`LockedError`
naming the process that holds it (read from ``.curate.lock.owner``, which the holder writes).
"""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import filelock

log = logging.getLogger(__name__)

TMP_DIR = ".tmp"
LOCK_FILE = ".curate.lock"
LOCK_OWNER_FILE = ".curate.lock.owner"


class DatasetError(Exception):
    """A dataset folder that cannot be opened or written as asked.

    ``problems`` holds the :class:`~curate.store.ValidationProblem` list when the error comes
    from validation (empty otherwise).
    """

    def __init__(self, message: str, problems: list | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


class LockedError(DatasetError):
    """Another writer holds the dataset's lock; ``holder`` describes it (pid, host, since)."""

    def __init__(self, message: str, holder: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.holder = dict(holder or {})


def fsync_dir(path: Path) -> None:
    """fsync a directory so that a rename or a new entry in it is durable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _tmp_path(root: Path, target: Path) -> Path:
    tmp_dir = root / TMP_DIR
    tmp_dir.mkdir(exist_ok=True)
    return tmp_dir / f"{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"


def atomic_write(
    root: Path, target: Path, write: Callable[[BinaryIO], None], *, fsync: bool = True, sync_dir: bool = True,
    before_replace: Callable[[Path], None] | None = None,
) -> None:
    """Write ``target`` (inside dataset ``root``) via ``write(fileobj)`` atomically.

    Order: temp file under ``root/.tmp`` -> ``write`` -> flush + fsync -> ``os.replace`` onto
    ``target`` -> fsync of ``target``'s directory. On any error the temp file is removed and
    ``target`` is untouched. ``fsync=False`` (with ``sync_dir=False``) skips both fsyncs for
    files that a later :func:`durability_barrier` flushes in one go before the commit that
    references them; the rename is still atomic, so no torn file can appear under ``target``.
    ``before_replace(tmp)`` runs once the temporary file is complete and closed, just before the
    rename (the change log's write-ahead step, :mod:`curate.store.changelog`).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    _replace_via(_tmp_path(root, target), target, write, fsync=fsync, sync_dir=sync_dir, before_replace=before_replace)


def atomic_write_beside(target: Path, data: bytes, *, fsync: bool = True) -> None:
    """:func:`atomic_write` of bytes for a file outside any dataset's ``.tmp`` (run folders,
    exports, caches): the temp file is a hidden sibling of ``target``, fsync-ed (unless
    ``fsync=False``: a later :func:`durability_barrier` flushes many at once), then renamed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    _replace_via(tmp, target, lambda handle: handle.write(data), fsync=fsync, sync_dir=False)


def _replace_via(tmp: Path, target: Path, write: Callable[[BinaryIO], None], *, fsync: bool, sync_dir: bool,
                 before_replace: Callable[[Path], None] | None = None) -> None:
    """Write ``tmp``, optionally fsync it, rename it onto ``target``; remove ``tmp`` on any error."""
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        if before_replace is not None:
            before_replace(tmp)
        os.replace(tmp, target)
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise
    if sync_dir:
        fsync_dir(target.parent)


def atomic_write_bytes(root: Path, target: Path, data: bytes, *, fsync: bool = True, sync_dir: bool = True) -> None:
    """:func:`atomic_write` of a bytes object."""
    atomic_write(root, target, lambda handle: handle.write(data), fsync=fsync, sync_dir=sync_dir)


def _syncfs(path: Path) -> bool:
    """Linux ``syncfs(2)`` on the file system holding ``path``; False where unavailable."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        return syncfs(fd) == 0
    finally:
        os.close(fd)


def durability_barrier(root: Path, files: Iterable[Path], dirs: Iterable[Path]) -> None:
    """Make ``files`` (written with ``fsync=False``) and new entries of ``dirs`` durable.

    One ``syncfs`` of the dataset's file system where Linux offers it (a thousand small media
    files cost one flush instead of a thousand), otherwise an fsync per file and directory.
    Call it before the commit that makes rows point at those files.
    """
    files, dirs = list(files), list(dirs)
    if not files and not dirs:
        return
    if _syncfs(root):
        return
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for directory in sorted(set(dirs)):
        fsync_dir(directory)


def clean_tmp(root: Path) -> int:
    """Remove temporary files left by killed writers; call only while holding the lock."""
    tmp_dir = root / TMP_DIR
    removed = 0
    if tmp_dir.is_dir():
        for leftover in tmp_dir.iterdir():
            try:
                leftover.unlink()
                removed += 1
            except OSError:
                pass
    if removed:
        log.info("removed %d temporary file(s) left by an interrupted writer in %s", removed, tmp_dir)
    return removed


#: The name every temporary file of this module has: ``[.]<name>.<pid>.<8 hex>.tmp``.
_TEMP_NAME = re.compile(r"^\.?.+\.(\d+)\.[0-9a-f]{8}\.tmp$")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def clean_dead_temps(root: Path) -> int:
    """Remove the hidden temporary siblings that writers killed mid-write left in ``root`` (the
    names :func:`atomic_write_beside` gives, e.g. ``..curate.filecheck.json.<pid>.<rand>.tmp``)
    whose process no longer runs on this host. Needs no lock: a live writer's file is never touched
    (and a file of a live writer on another host sharing the folder is only a cache's, whose write
    then fails quietly). ``.tmp/`` is the next writer's to clean, under the lock (:func:`clean_tmp`).
    Returns how many were removed (a read-only folder removes none)."""
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        if match is None or not entry.name.startswith(".") or _pid_alive(int(match.group(1))):
            continue
        try:
            os.unlink(entry.path)
            removed += 1
        except OSError:
            pass
    if removed:
        log.info("removed %d temporary file(s) of dead writers in %s", removed, root)
    return removed


def append_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> int:
    """Append records as JSON lines with one write + fsync; returns how many were written.

    If the file's last line is torn (no final newline, from a killed writer), a newline is
    written first so the torn line stays alone and the new lines parse.
    """
    lines = [json.dumps(r, ensure_ascii=False, sort_keys=False, default=str) for r in records]
    if not lines:
        return 0
    payload = "\n".join(lines) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as reader:
                reader.seek(size - 1)
                if reader.read(1) != b"\n":
                    payload = "\n" + payload
        data = payload.encode("utf-8")
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(lines)


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """(records, bad lines as (1-based line number, error)) of a JSON-lines file; missing = empty."""
    records: list[dict[str, Any]] = []
    bad: list[tuple[int, str]] = []
    if not path.exists():
        return records, bad
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                bad.append((number, f"not JSON ({exc})"))
                continue
            if not isinstance(record, dict):
                bad.append((number, "not a JSON object"))
                continue
            records.append(record)
    return records, bad


# One FileLock object per lock path and process, so that several Dataset objects on the same
# folder in one thread nest instead of deadlocking (FileLock counts re-entries per thread).
_LOCKS: dict[str, filelock.FileLock] = {}
_LOCKS_GUARD = threading.Lock()


def _file_lock(path: Path) -> filelock.FileLock:
    key = str(path.resolve())
    with _LOCKS_GUARD:
        lock = _LOCKS.get(key)
        if lock is None:
            lock = filelock.FileLock(key)
            _LOCKS[key] = lock
        return lock


class DatasetLock:
    """The writer lock of one dataset folder (re-entrant within a thread).

    ``with DatasetLock(root, timeout=10): ...`` holds ``root/.curate.lock``; while held,
    ``root/.curate.lock.owner`` records the holder (pid, host, since, purpose). A timeout
    raises :class:`LockedError` naming that holder, so the user knows which process to wait
    for or stop. ``timeout=0`` fails at once if the lock is taken.
    """

    def __init__(self, root: Path, timeout: float = 10.0) -> None:
        self.root = Path(root)
        self.timeout = float(timeout)
        self._lock = _file_lock(self.root / LOCK_FILE)

    @property
    def is_locked(self) -> bool:
        return self._lock.is_locked

    def holder(self) -> dict[str, Any]:
        """What the owner file says about the current holder ({} when unknown)."""
        try:
            return json.loads((self.root / LOCK_OWNER_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    @contextmanager
    def hold(self, purpose: str = "write") -> Iterator[None]:
        outermost = not self._lock.is_locked
        try:
            self._lock.acquire(timeout=self.timeout)
        except filelock.Timeout:
            holder = self.holder()
            who = (
                f"process {holder.get('pid')} on {holder.get('host')} ({holder.get('purpose', 'write')}, "
                f"since {holder.get('since')})"
                if holder
                else "another process (it did not record its pid)"
            )
            raise LockedError(
                f"dataset {self.root} is locked by {who}; waited {self.timeout:g} s. Wait for it to "
                f"finish, or if that process is gone, retry (the lock is released when it exits)",
                holder,
            ) from None
        try:
            if outermost:
                info = {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "purpose": purpose,
                }
                try:
                    (self.root / LOCK_OWNER_FILE).write_text(json.dumps(info), encoding="utf-8")
                except OSError:  # pragma: no cover - read-only owner file is only cosmetic
                    pass
                clean_tmp(self.root)
            yield
        finally:
            if outermost:
                try:
                    (self.root / LOCK_OWNER_FILE).unlink()
                except OSError:
                    pass
            self._lock.release()
