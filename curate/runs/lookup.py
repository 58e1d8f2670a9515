"""A run named by a user: ``DIR/runs/<name>`` of one kind, with an error that says what is true.

Every verb that takes a run name (``plan --split``, ``intervene --split``, ``propose-masks
--measure --run``, ...) loads it through :func:`named_run`: a name with no folder is "no such
run" with the runs of that kind listed (or the verb that makes one), a folder without
``config.json`` is an unfinished run, and a run of another kind says so
(:meth:`curate.runs.base.RunRecord.load`).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TypeVar

from curate.runs.base import CONFIG_FILE, RUNS_DIR, RunError, RunRecord, iter_runs, list_runs

__all__ = ["named_run", "newest_run", "no_such_run", "run_names"]

logger = logging.getLogger(__name__)

R = TypeVar("R", bound=RunRecord)

#: The verb that makes a run of each kind (for "there are none yet: make one with ...").
MAKERS = {"split": "curate split", "masks": "curate propose-masks", "evaluate": "curate evaluate",
          "intervene": "curate intervene", "discover": "curate discover", "attribution": "curate attribution"}
#: How a user calls a run of each kind, where it differs from the kind.
NOUNS = {"masks": "propose-masks", "evaluate": "evaluation", "intervene": "intervention", "discover": "discovery"}


def run_names(dataset_root: str | Path, kind: str) -> list[str]:
    """The finished runs of ``kind`` in ``DIR/runs``, oldest first."""
    return [p.name for p in list_runs(Path(dataset_root), kind)]


def newest_run(dataset_root: str | Path, kind: str) -> RunRecord | None:
    """The newest readable run of ``kind`` in ``DIR/runs`` (None when there is none); an unreadable
    one (unfinished, damaged, newer curate) is logged as a warning and skipped."""
    newest = None
    for path, run in iter_runs(Path(dataset_root), kind):
        if isinstance(run, RunError):
            logger.warning("the %s run %s cannot be read (%s)", NOUNS.get(kind, kind), path.name, run)
        else:
            newest = run
    return newest


def no_such_run(dataset_root: str | Path, name: str, kind: str) -> RunError:
    """The error for a run name with no folder: ``no split run named 'x' in DIR/runs; the split runs there: a, b``."""
    names = run_names(dataset_root, kind)
    folder = Path(dataset_root) / RUNS_DIR
    noun = NOUNS.get(kind, kind)
    if names:
        there = f"the {noun} runs there: {', '.join(names)}"
    else:
        maker = MAKERS.get(kind)
        there = f"there are no {noun} runs yet" + (f" (`{maker}` makes one)" if maker else "")
    return RunError(f"no {noun} run named {name!r} in {folder}; {there}")


def named_run(dataset_root: str | Path, name: str | Path, cls: type[R]) -> R:
    """The run ``name`` (a name in ``DIR/runs``, or a run folder) read as ``cls``.

    Raises :class:`RunError`: :func:`no_such_run` when there is no such folder; "not a finished
    run" when it has no ``config.json``; another kind's or a malformed run as ``cls.load`` says.
    """
    path = Path(name)
    if not (path.is_absolute() or len(path.parts) > 1) or not path.is_dir():
        path = Path(dataset_root) / RUNS_DIR / str(name)
    if not path.is_dir():
        raise no_such_run(dataset_root, str(name), cls.KIND)
    if not (path / CONFIG_FILE).is_file():
        raise RunError(f"run {path.name} in {path.parent} is not finished (no {CONFIG_FILE}: interrupted, or still "
                       f"running); the {NOUNS.get(cls.KIND, cls.KIND)} runs there: "
                       f"{', '.join(run_names(dataset_root, cls.KIND)) or 'none'}")
    return cls.load(path)
