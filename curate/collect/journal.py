"""The state of one collection job, kept inside the dataset folder so that any run resumes.

A job (one collector with one set of settings on one dataset) owns, under ``<dataset>/.collect/``:

- ``<kind>-<job_id>.jsonl``: an append-only journal (one JSON object per line, fsync-ed per
  batch; a torn last line from a killed writer is skipped on reading). It records the job's
  settings (first line), the final outcome of every item (added / present / duplicate /
  quarantined / failed with a reason / skipped), and checkpoints such as a paging cursor.
- ``<kind>-<job_id>.staging/``: downloaded bodies that are complete but not yet committed, so
  that a process killed after a download never downloads it again. Bodies are written to a
  ``.part`` file and renamed when complete, behind a header with their length and sha256 that
  is checked on reading: a partial download never looks complete. File names are hashes of the
  item key, never names from the server.
- ``<kind>-<job_id>.lock``: held while the job runs; a second process running the same job
  gets :class:`JobBusyError` (the kernel releases the lock when a process dies, even by SIGKILL).

``job_id`` is a hash of the settings that define *which* items the job would collect (source,
classes, filters, size...), not of how many: running the same command with a larger
``--per-class`` continues the same job.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import filelock

from curate.store.atomic import append_jsonl, fsync_dir, read_jsonl
from curate.store.records import iso_time, to_plain

log = logging.getLogger(__name__)

COLLECT_DIR = ".collect"
_STAGE_MAGIC = b"curate-staged-v1"
#: Outcomes that count towards a group's quota (the item is in the dataset for that class).
COUNTED_OUTCOMES = frozenset({"added", "present"})
#: Every outcome an item can have, with its meaning.
OUTCOMES: dict[str, str] = {
    "added": "stored as a new sample",
    "present": "the same source item was already in the dataset, for the same class",
    "duplicate": "the image content is already in the dataset (another source item)",
    "duplicate_source": "the same source item (e.g. iNaturalist photo id) was already taken",
    "quarantined": "the image failed verification (see quarantine.jsonl for the bytes)",
    "failed": "it could not be fetched (the reason says why; retryable ones are retried on re-run)",
    "skipped": "left out by a policy (licence, multiple categories, ...)",
}


class JobBusyError(RuntimeError):
    """Another process is running the same collection job on the same dataset."""


def job_id_for(identity: Mapping[str, Any]) -> str:
    """12 hex digits of the sha256 of the canonical JSON of ``identity``."""
    text = json.dumps(to_plain(dict(identity)), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


class Journal:
    """The journal, staging folder and lock of one job (see the module docstring).

    Use as a context manager (takes the lock and reads the journal)::

        with Journal(dataset_root, "inat", identity) as journal:
            journal.count("9"); journal.final("9/123/456"); journal.append([...])
    """

    def __init__(self, dataset_root: str | Path, kind: str, identity: Mapping[str, Any]) -> None:
        self.root = Path(dataset_root)
        self.kind = kind
        self.identity = to_plain(dict(identity))
        self.job_id = job_id_for({"kind": kind, **self.identity})
        self.dir = self.root / COLLECT_DIR
        self.path = self.dir / f"{kind}-{self.job_id}.jsonl"
        self.staging = self.dir / f"{kind}-{self.job_id}.staging"
        self._lock = filelock.FileLock(str(self.dir / f"{kind}-{self.job_id}.lock"), timeout=0)
        self.items: dict[str, dict[str, Any]] = {}
        self.state: dict[tuple[str, str], Any] = {}
        self.bad_lines = 0
        #: sample ids that some item of this job counts (so a second item never counts them again)
        self.counted_samples: set[str] = set()
        self._counts: Counter[str] = Counter()
        self._cleaner: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Journal:
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def open(self) -> None:
        """Take the job's lock, read the journal (writing its header when new)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise JobBusyError(
                f"another process is running this {self.kind} job on {self.root} (lock {self._lock.lock_file}); "
                "wait for it to finish, or stop it, then run the command again") from None
        records, bad = read_jsonl(self.path)
        self.bad_lines = len(bad)
        if bad:
            log.info("%s: skipped %d unreadable line(s) (a run was killed mid-write)", self.path, len(bad))
        if not records:
            self.append([{"t": "job", "kind": self.kind, "job_id": self.job_id, "identity": self.identity,
                          "created": iso_time()}])
        for record in records:
            self._apply(record)
        self._clean_partials()

    def close(self) -> None:
        if self._cleaner is not None:
            self._cleaner.shutdown(wait=True)
            self._cleaner = None
        if self._lock.is_locked:
            self._lock.release()

    # ------------------------------------------------------------------ reading
    def _apply(self, record: Mapping[str, Any]) -> None:
        kind = record.get("t")
        if kind in ("item", "skip"):
            key = str(record.get("key"))
            previous = self.items.get(key)
            if previous is not None and previous.get("outcome") in COUNTED_OUTCOMES:
                self._counts[str(previous.get("group"))] -= 1
            self.items[key] = dict(record)
            if record.get("outcome") in COUNTED_OUTCOMES:
                self._counts[str(record.get("group"))] += 1
                if record.get("sample_id"):
                    self.counted_samples.add(str(record["sample_id"]))
        elif kind == "state":
            self.state[(str(record.get("group")), str(record.get("name")))] = record.get("value")

    def count(self, group: str) -> int:
        """How many items of ``group`` are in the dataset (outcome added or present)."""
        return self._counts[str(group)]

    def final(self, key: str) -> dict[str, Any] | None:
        """The recorded outcome of ``key`` unless there is none or it is a retryable failure."""
        record = self.items.get(key)
        if record is None or (record.get("outcome") == "failed" and record.get("retryable")):
            return None
        return record

    def retryable_failures(self, group: str) -> list[dict[str, Any]]:
        """Items of ``group`` whose last outcome is a retryable failure, oldest first."""
        return [r for r in self.items.values()
                if str(r.get("group")) == str(group) and r.get("outcome") == "failed" and r.get("retryable")]

    def get_state(self, group: str, name: str, default: Any = None) -> Any:
        return self.state.get((str(group), name), default)

    def outcomes(self, group: str | None = None) -> Counter[str]:
        """How many items (per outcome) the journal holds, for one group or all."""
        return Counter(r.get("outcome") for r in self.items.values()
                       if group is None or str(r.get("group")) == str(group))

    def failures(self) -> list[dict[str, Any]]:
        """Every item whose last outcome is failed or quarantined."""
        return [r for r in self.items.values() if r.get("outcome") in ("failed", "quarantined")]

    # ------------------------------------------------------------------ writing
    def append(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append records durably (one write + fsync) and apply them to the in-memory view."""
        records = [to_plain(dict(r)) for r in records]
        if not records:
            return
        append_jsonl(self.path, records)
        for record in records:
            self._apply(record)

    def set_state(self, group: str, name: str, value: Any) -> dict[str, Any]:
        """A state record (e.g. a paging cursor) for :meth:`append`."""
        return {"t": "state", "group": str(group), "name": name, "value": value, "time": iso_time()}

    # ------------------------------------------------------------------ staging
    def staged_path(self, key: str) -> Path:
        """Where the complete body of ``key`` is kept until committed (a hash, never a server name)."""
        return self.staging / (hashlib.sha256(key.encode("utf-8")).hexdigest()[:40] + ".bin")

    def read_staged(self, key: str) -> bytes | None:
        """The complete body staged for ``key``, or None (also when the file fails its checksum,
        e.g. torn by a power cut: then it is fetched again)."""
        path = self.staged_path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        header, sep, data = raw.partition(b"\n")
        parts = header.split(b" ")
        if not sep or len(parts) != 3 or parts[0] != _STAGE_MAGIC:
            path.unlink(missing_ok=True)
            return None
        if parts[1] != str(len(data)).encode() or parts[2] != hashlib.sha256(data).hexdigest().encode():
            log.info("staged body of %s is damaged; fetching it again", key)
            path.unlink(missing_ok=True)
            return None
        return data

    def stage(self, key: str, data: bytes) -> None:
        """Keep a complete body for ``key``: written to ``.part`` and renamed, behind a header
        holding its length and sha256, so that a partial or torn file is never taken for whole.
        (Not fsync-ed: a process kill keeps the page cache; a power cut is caught by the checksum.)"""
        self.staging.mkdir(parents=True, exist_ok=True)
        target = self.staged_path(key)
        part = target.with_name(f"{target.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}.part")
        header = b"%s %d %s\n" % (_STAGE_MAGIC, len(data), hashlib.sha256(data).hexdigest().encode())
        try:
            with open(part, "wb") as handle:
                handle.write(header)
                handle.write(data)
            os.replace(part, target)
        except BaseException:
            part.unlink(missing_ok=True)
            raise

    def drop_staged(self, keys: Iterable[str]) -> None:
        """Delete the staged bodies of ``keys`` (journaled now), on a background thread: on a busy
        file system an unlink right after the store's flush can take milliseconds each."""
        paths = [self.staged_path(key) for key in keys]
        if not paths:
            return
        if self._cleaner is None:
            self._cleaner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="collect-cleanup")
        self._cleaner.submit(_unlink_all, paths)

    def clear_staging(self) -> None:
        """Remove the staging folder (the job finished: nothing in it is needed any more)."""
        if self._cleaner is not None:
            self._cleaner.shutdown(wait=True)
            self._cleaner = None
        if self.staging.exists():
            shutil.rmtree(self.staging, ignore_errors=True)
            fsync_dir(self.dir)

    def _clean_partials(self) -> None:
        if self.staging.is_dir():
            for leftover in self.staging.glob("*.part"):
                leftover.unlink(missing_ok=True)


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:  # a leftover is harmless: clear_staging removes the folder at the end
            log.debug("could not delete %s: %s", path, exc)


def read_journals(dataset_root: str | Path, kind: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every job journal of a dataset (``{file name: records}``), without taking locks."""
    folder = Path(dataset_root) / COLLECT_DIR
    out: dict[str, list[dict[str, Any]]] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.jsonl")):
        if kind is None or path.name.startswith(f"{kind}-"):
            out[path.name] = read_jsonl(path)[0]
    return out


def collection_failures(dataset_root: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The items of every job of a dataset whose last outcome is failed or quarantined, with the job."""
    failures: list[dict[str, Any]] = []
    for name, records in read_journals(dataset_root, kind).items():
        last: dict[str, dict[str, Any]] = {}
        for record in records:
            if record.get("t") in ("item", "skip"):
                last[str(record.get("key"))] = record
        by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in last.values():
            if record.get("outcome") in ("failed", "quarantined"):
                by_group[str(record.get("group"))].append({**record, "job": name})
        for group in sorted(by_group):
            failures.extend(by_group[group])
    return failures
