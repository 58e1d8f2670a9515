"""Trained tiny models cached on disk, keyed by the content of their recipe (issue 42), so that
each trains once per clone instead of once per test session (and once per pytest-xdist worker).

An entry is a folder ``<root>/<name>-<key>/`` where

    key = sha256(json({"recipe": recipe, "code": {file: sha256(file's bytes)}}))[:16]

``recipe`` holds what the training reads besides code (its settings, the data's spec, the seed;
JSON-able), ``code`` the source files (or a function's source text) of the trainer and of what
generates its data: change any of them and the key changes, so the model is trained again. The
root is ``$CURATE_TEST_CACHE`` or ``<repo>/.cache/models`` (gitignored; delete it to start over).

Concurrency: the builder runs under a file lock per entry (``<name>-<key>.lock``) and writes into
a temporary folder that is renamed into place only when it returns, so a second process that asks
for the same entry (another xdist worker) waits for the lock, then finds the finished folder and
reuses it; a builder that fails or is killed leaves no entry (its temporary folder is removed by
the next builder of that key).
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import filelock

REPO = Path(__file__).resolve().parents[1]
#: How long a request waits for another process's build of the same entry before it gives up (s).
LOCK_TIMEOUT = 3600.0


def cache_root() -> Path:
    """``$CURATE_TEST_CACHE`` or ``<repo>/.cache/models``."""
    override = os.environ.get("CURATE_TEST_CACHE", "").strip()
    return Path(override).expanduser().absolute() if override else REPO / ".cache" / "models"


def code_digest(sources: Iterable[Any]) -> dict[str, str]:
    """``{name: sha256}`` of each source: a path (its bytes; relative to the repo where inside it)
    or a function/class (its source text, keyed by its qualified name)."""
    digests = {}
    for source in sources:
        if isinstance(source, (str, Path)):
            path = Path(source).resolve()
            name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
            digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            name = f"{source.__module__}.{source.__qualname__}"
            digests[name] = hashlib.sha256(inspect.getsource(source).encode()).hexdigest()
    return digests


def recipe_key(recipe: dict, code: Iterable[Any] = ()) -> str:
    """The entry's key: the first 16 hex digits of sha256 over the recipe and the code's digests."""
    blob = json.dumps({"recipe": recipe, "code": code_digest(code)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached(name: str, recipe: dict, build: Callable[[Path], None], *, code: Iterable[Any] = (),
           root: Path | None = None, timeout: float = LOCK_TIMEOUT) -> Path:
    """The folder of entry ``name`` for ``recipe`` and ``code``; ``build(folder)`` fills an empty
    folder when the entry is missing (at most once per key across processes: see the module doc)."""
    root = Path(root) if root is not None else cache_root()
    root.mkdir(parents=True, exist_ok=True)
    entry = root / f"{name}-{recipe_key(recipe, code)}"
    if entry.is_dir():
        return entry
    with filelock.FileLock(str(entry) + ".lock", timeout=timeout):
        if entry.is_dir():  # built by the process that held the lock before us
            return entry
        for stale in root.glob(f"{entry.name}.tmp-*"):  # left by a killed builder; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f"{entry.name}.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            build(tmp)
            (tmp / "recipe.json").write_text(json.dumps({"recipe": recipe, "code": code_digest(code)}, indent=2,
                                                        sort_keys=True, default=str))
            tmp.rename(entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def demo_models(build: Callable[[Path], None]) -> Path:
    """The folder of the demo's three tiny CLIPs (``curate.demo.run_demo``: the two references and
    the naming CLIP), cached under the demo's settings, the torch and open_clip versions, and the
    code that generates their worlds and trains them; ``build(folder)`` copies freshly trained ones in."""
    import dataclasses

    import open_clip
    import torch

    from curate import demo
    from curate.collect import synthetic
    from curate.discover import worlds
    from curate.models import tiny

    recipe = {"settings": dataclasses.asdict(demo.DemoSettings()), "torch": torch.__version__,
              "open_clip": open_clip.__version__}
    code = [Path(m.__file__) for m in (demo, synthetic, worlds, tiny)] + [REPO / "curate" / "train_reference.py"]
    return cached("demo-models", recipe, build, code=code)


def demo_worlds(build: Callable[[Path], None]) -> Path:
    """The folder of the demo's three worlds before any training (``curate.demo.build_demo_worlds``:
    ``world-eval``, ``world-p0.9``, ``world-uncorrelated``; 7,200 images and masks, about 14 s of CPU),
    cached under the demo's settings and the code that generates and stores them, so that the second
    xdist worker copies them instead of generating them again. ``build(folder)`` generates them in
    ``folder``. The folders hold no absolute path (datasets are portable; the training's provenance
    record is written later, into the copy)."""
    import dataclasses

    from curate import demo
    from curate.collect import synthetic

    recipe = {"settings": dataclasses.asdict(demo.DemoSettings())}
    code = [Path(m.__file__) for m in (demo, synthetic)] + sorted((REPO / "curate" / "store").glob("*.py"))
    return cached("demo-worlds", recipe, build, code=code)
