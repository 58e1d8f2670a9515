"""``changes.jsonl`` written as part of the commit (docs/design.md#dataset-folder, issue 45).

A commit that changes rows (:meth:`curate.store.Dataset.add_samples`, ``update``, ``set_masks``)
runs, under the folder's lock:

1. the new ``samples.parquet`` is written whole to a temporary file (not yet in place) and its
   stamp taken: (inode, mtime_ns, size), which the rename keeps;
2. :data:`PENDING_FILE` = ``{"samples": stamp, "log_size": size of changes.jsonl}`` is written
   atomically (:func:`log_ahead`);
3. the change records are appended to ``changes.jsonl`` (one write + fsync);
4. the temporary file is renamed onto ``samples.parquet``: the commit point;
5. the pending file is removed (:func:`done`).

A writer killed anywhere leaves a log that matches the rows once :func:`settle` has run (the next
writer runs it when it takes the lock; :meth:`Dataset.open` runs it when the lock is free): when
``samples.parquet`` has the pending stamp the commit happened and its records are whole in the log
(step 3 ended before step 4 began), so only the pending file goes; otherwise the commit did not
happen and ``changes.jsonl`` is cut back to ``log_size`` (the lines of a change that never
happened are removed). A commit that fails with an error (disk full) is rolled back the same way
at once (:func:`roll_back`). Between steps 3 and 4 a reader may see the lines of a commit in
flight; they stay only if it completes.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from curate.store.atomic import append_jsonl, atomic_write_bytes
from curate.store.validate import CHANGES_FILE, SAMPLES_FILE

log = logging.getLogger(__name__)

#: The write-ahead record of a commit in flight (hidden; removed when the commit is settled).
PENDING_FILE = ".curate.changes.pending.json"


def _stamp(path: Path) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns, st.st_size]


def log_ahead(root: Path, samples_tmp: Path, records: Iterable[dict[str, Any]], *, target: str = SAMPLES_FILE) -> None:
    """Steps 2 and 3 of the module docstring, for the complete new table file ``samples_tmp``
    (``target``: the file it will replace, samples.parquet unless told; the annotation table
    of :mod:`curate.store.annotations` commits the same way)."""
    log_path = root / CHANGES_FILE
    stamp = _stamp(log_path)
    pending = {"samples": _stamp(samples_tmp), "log_size": stamp[2] if stamp else 0}
    if target != SAMPLES_FILE:
        pending["target"] = target
    atomic_write_bytes(root, root / PENDING_FILE, json.dumps(pending).encode("utf-8"))
    append_jsonl(log_path, records)


def done(root: Path) -> None:
    """Step 5: the commit is in place and logged."""
    try:
        (root / PENDING_FILE).unlink()
    except FileNotFoundError:
        pass


def roll_back(root: Path) -> None:
    """Undo steps 2-3 of a commit that failed before its rename (call under the lock)."""
    settle(root)


def settle(root: Path) -> str | None:
    """Settle a commit a killed writer left in flight (call under the folder's lock): "kept" when it
    happened (its records stay), "rolled back" when it did not (the log is cut back), None when
    there was none."""
    path = root / PENDING_FILE
    try:
        pending = json.loads(path.read_text(encoding="utf-8"))
        stamp, log_size = pending["samples"], int(pending["log_size"])
        target = str(pending.get("target", SAMPLES_FILE))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):  # written atomically: only a hand edit gets here
        log.warning("%s is unreadable; removed", path)
        done(root)
        return None
    if stamp is not None and "/" not in target and _stamp(root / target) == list(stamp):
        outcome = "kept"
    else:
        log_path = root / CHANGES_FILE
        current = _stamp(log_path)
        if current is not None and current[2] > log_size:
            with open(log_path, "r+b") as handle:
                handle.truncate(log_size)
                handle.flush()
                os.fsync(handle.fileno())
        outcome = "rolled back"
    done(root)
    log.info("%s: a commit left in flight by an interrupted writer was %s", root, outcome)
    return outcome
