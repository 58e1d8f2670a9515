"""On-disk cache of every judge call (question generator, verifier, paraphraser, entailment model).

One JSON file per call, keyed by ``sha256([role, model id, prompt, image key])`` and written
atomically (temporary sibling, fsync, rename), so a run killed at any point leaves only whole
entries: a re-run finds every finished call and repeats only the rest, and a second run on the
same inputs calls nothing. Layout: ``<root>/<role>/<hh>/<sha256>.json`` holding the key parts
and the ``response``. The default root is ``DIR/features/vlm_quality/`` of the dataset folder.
A damaged entry is ignored (and rewritten by the next call), never fatal.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RoleCache", "CACHE_DIR"]

log = logging.getLogger(__name__)

#: The cache folder inside a dataset's ``features/``.
CACHE_DIR = "vlm_quality"


@dataclass
class RoleCache:
    """Get / put judge responses by ``(role, model, prompt, image)``; ``root=None`` caches nothing."""

    root: Path | None
    hits: int = 0
    misses: int = 0
    by_role: dict[str, dict[str, int]] = field(default_factory=dict)

    @staticmethod
    def key(role: str, model: str, prompt: Any, image: str | None = None) -> str:
        text = json.dumps([role, model, prompt, image], sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def _path(self, role: str, key: str) -> Path:
        assert self.root is not None
        return Path(self.root) / role / key[:2] / f"{key}.json"

    def _count(self, role: str, what: str) -> None:
        entry = self.by_role.setdefault(role, {"hits": 0, "misses": 0})
        entry[what] += 1
        if what == "hits":
            self.hits += 1
        else:
            self.misses += 1

    def get(self, role: str, model: str, prompt: Any, image: str | None = None) -> tuple[bool, Any]:
        """``(found, response)``."""
        if self.root is None:
            self._count(role, "misses")
            return False, None
        path = self._path(role, self.key(role, model, prompt, image))
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            response = data["response"]
        except FileNotFoundError:
            self._count(role, "misses")
            return False, None
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("ignoring a damaged cache entry %s (%s)", path, error)
            self._count(role, "misses")
            return False, None
        self._count(role, "hits")
        return True, response

    def put(self, role: str, model: str, prompt: Any, response: Any, image: str | None = None) -> None:
        if self.root is None:
            return
        from curate.runs.base import write_bytes

        path = self._path(role, self.key(role, model, prompt, image))
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"role": role, "model": model, "prompt": prompt, "image": image, "response": response}
        write_bytes(path, json.dumps(body, ensure_ascii=False, default=str).encode("utf-8"))

    def call(self, role: str, model: str, prompt: Any, compute, image: str | None = None) -> Any:
        """The cached response, or ``compute()`` stored and returned."""
        found, response = self.get(role, model, prompt, image)
        if found:
            return response
        response = compute()
        self.put(role, model, prompt, response, image)
        return response

    def stats(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "by_role": {k: dict(v) for k, v in self.by_role.items()}}
