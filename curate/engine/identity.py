"""Naming a model without loading it, so re-scoring loads nothing (``docs/design.md#speed``).

Every cache curate keeps is keyed by the model's identity: ``model_id`` (which, for a weights
file, contains the sha256 of its bytes), its ``kind``, and the fingerprint of its eval
preprocessing. Building the model and hashing its file cost 1.3-2.5 s for a ViT-B/32, which a
re-scoring run (another label space over cached image embeddings and a cached text
classifier) otherwise spends for nothing.

So when a model is loaded, its identity is recorded in the dataset folder, in
``features/models/<key>.json``, under a key computed without reading the weights:

- the name and ``pretrained`` as given;
- for a weights file: its absolute path, size and modification time (ns). A file replaced in
  place changes its mtime (and almost always its size), so the key changes and the model is
  loaded and hashed again. This is the rule ``make`` and ``rsync`` trust; a file rewritten
  with the same size and a forged mtime would defeat it;
- the versions of curate, open_clip and timm (a tag's preprocessing is theirs to define).

The next run with the same key gets a :class:`LazyModel`: it answers ``model_id``, ``kind``,
``cache_safe``, ``info`` and the preprocessing fingerprint from the record and loads the real
model (through the same loader) only when something asks for more: an image or a prompt to
encode. A loaded model whose identity differs from the record (a stale record) stops the run
with an error and the record is deleted. Random weights without a seed have no identity
(``cache_safe`` False) and are always loaded.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["IDENTITY_DIR", "LazyModel", "StaleIdentityError", "identity_key", "lazy_model", "preprocessing_fingerprint"]

IDENTITY_DIR = Path("features") / "models"
IDENTITY_VERSION = 1


class StaleIdentityError(RuntimeError):
    """A recorded model identity that no longer matches the loaded model."""


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def identity_key(name: str, pretrained: str | None) -> dict[str, Any] | None:
    """What names the weights of ``(name, pretrained)`` without reading them; None when the
    weights are random (nothing to name) or a file that does not exist (loading will say so)."""
    import curate
    from curate.models.weights import looks_like_path

    if not pretrained:
        return None
    key: dict[str, Any] = {"name": name, "pretrained": pretrained, "version": IDENTITY_VERSION,
                           "curate": curate.__version__, "open_clip": _version("open_clip_torch"),
                           "timm": _version("timm")}
    if looks_like_path(pretrained):
        path = Path(pretrained).expanduser()
        if not path.is_file():
            return None
        stat = path.stat()
        key["file"] = {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return key


def _record_path(root: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return Path(root) / IDENTITY_DIR / f"{digest}.json"


def preprocessing_fingerprint(model: Any) -> str:
    """A stable description of the model's eval transform (part of every cache key).

    A model not yet loaded (:class:`LazyModel`) carries the fingerprint recorded when it was
    last loaded, so looking a cache up does not load it."""
    recorded = getattr(model, "preprocess_fingerprint", None)
    return recorded if isinstance(recorded, str) else repr(model.preprocess)


def _identity_of(model: Any) -> dict[str, Any]:
    return {"model_id": model.model_id, "kind": model.kind, "cache_safe": bool(model.cache_safe),
            "preprocess": preprocessing_fingerprint(model), "image_size": list(model.image_size),
            "info": model.info}


class LazyModel:
    """A model known by its recorded identity, loaded on first real use (module docstring).

    ``model_id``, ``kind``, ``cache_safe``, ``info``, ``image_size`` and
    ``preprocess_fingerprint`` come from the record; any other attribute (``preprocess``,
    ``encode_image``, ``encode_text``, ``module``, ``device``, ...) loads the model first.
    """

    def __init__(self, identity: dict[str, Any], loader: Callable[[], Any], *, record_path: Path | None = None,
                 factory: Any = None, overrides: dict[str, Any] | None = None) -> None:
        self._identity = identity
        self._loader = loader
        self._record_path = record_path
        self._model: Any = None
        self.factory = factory
        self.model_id: str = identity["model_id"]
        self.kind: str = identity["kind"]
        self.cache_safe: bool = identity["cache_safe"]
        self.preprocess_fingerprint: str = identity["preprocess"]
        self.image_size = tuple(identity["image_size"])
        self.info: dict[str, Any] = {**identity["info"], **(overrides or {})}

    @property
    def loaded(self) -> bool:
        """Whether the real model has been built."""
        return self._model is not None

    def materialise(self) -> Any:
        """The real model (loaded now if it was not), checked against the record."""
        if self._model is None:
            model = self._loader()
            seen = _identity_of(model)
            expected = {k: self._identity[k] for k in ("model_id", "kind", "preprocess")}
            if {k: seen[k] for k in expected} != expected:
                if self._record_path is not None:
                    self._record_path.unlink(missing_ok=True)
                raise StaleIdentityError(
                    f"the recorded identity of this model ({expected['model_id']}) does not match the loaded model "
                    f"({seen['model_id']}); the stale record was deleted, run the command again")
            self._model = model
        return self._model

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_identity", "_loader", "_record_path", "_model"):
            raise AttributeError(name)
        return getattr(self.materialise(), name)

    def __repr__(self) -> str:
        return f"LazyModel({self.model_id!r}, loaded={self.loaded})"


def lazy_model(name: str, pretrained: str | None, root: Path, loader: Callable[[], Any], *,
               overrides: dict[str, Any] | None = None, factory: Any = None) -> Any:
    """A :class:`LazyModel` when the identity of ``(name, pretrained)`` is recorded under
    ``root``; otherwise the model loaded now by ``loader`` (its identity then recorded).

    ``overrides`` replace entries of the recorded ``info`` that depend on this run (device,
    precision), so a run record does not claim the device of an older run.
    """
    from curate.jsonio import write_json

    key = identity_key(name, pretrained)
    if key is None:
        return loader()
    path = _record_path(root, key)
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
            if stored.get("key") == key:
                return LazyModel(stored["identity"], loader, record_path=path, factory=factory, overrides=overrides)
        except (ValueError, KeyError, TypeError) as error:
            logger.warning("model identity record %s is unreadable (%s); loading the model", path, error)
    model = loader()
    if model.cache_safe:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, {"key": key, "identity": _identity_of(model)})
        except OSError as error:  # a read-only folder only costs the next run a load
            logger.warning("cannot record the model identity in %s: %s", path, error)
    return model
