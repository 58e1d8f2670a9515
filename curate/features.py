"""Image outputs with a cache: every image is decoded and encoded once per model.

What is cached per (model id, preprocessing, output kind, sample id):
- ``embedding``: the L2-normalised image embedding of a CLIP (zero-shot scoring for any label
  space, prompt set or top-k is then matrix work on these);
- ``logits``: the 1000-way logits of an ImageNet classifier.

Layout: ``DIR/features/<model slug>/<key>/`` with ``index.json`` (the record: model id,
preprocessing, kind, dimension, format version, and the sample ids in row order) and the
array file it names (``values-<token>.npy``, float32). Adding samples writes a new array file
and then replaces ``index.json`` atomically, so a crash leaves the previous cache intact. A
cache whose record does not match (another model, another preprocessing, an older format) is
never reused. Sample ids are content hashes, so an id always names the same pixels.

Images that fail to decode at this stage, and outputs with NaN/inf, are reported with a
reason and left out (not cached), so callers can count and exclude them.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from curate.runs import slug, write_bytes, write_json

logger = logging.getLogger(__name__)

FEATURES_DIR = "features"
CACHE_VERSION = 1
KINDS = ("embedding", "logits")


@dataclass
class Features:
    """Outputs for the samples that succeeded, in ``sample_ids`` order, and the failures."""

    sample_ids: list[str]
    values: np.ndarray  # (N, D) float32
    failed: dict[str, str] = field(default_factory=dict)  # sample id -> reason
    computed: int = 0  # how many were encoded in this call (0 = all from cache)

    def row_of(self) -> dict[str, int]:
        return {sid: i for i, sid in enumerate(self.sample_ids)}


def preprocessing_fingerprint(model) -> str:
    """A stable description of the model's eval transform (part of the cache key)."""
    return repr(model.preprocess)


def cache_key(model, kind: str) -> str:
    blob = json.dumps({"model": model.model_id, "preprocess": preprocessing_fingerprint(model), "kind": kind,
                       "version": CACHE_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


class _ImageFiles(torch.utils.data.Dataset):
    """Decodes and preprocesses images; a failure yields a zero tensor and its reason."""

    def __init__(self, paths: Sequence[Path], preprocess: Callable, image_size: tuple[int, int]) -> None:
        self.paths = list(paths)
        self.preprocess = preprocess
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        from PIL import Image

        try:
            with Image.open(self.paths[index]) as image:
                image.load()
                tensor = self.preprocess(image.convert("RGB"))
            return index, tensor, ""
        except Exception as error:  # reported per sample, never fatal for the batch
            return index, torch.zeros(3, *self.image_size), f"{type(error).__name__}: {error}"[:300]


def _model_output(model, kind: str, batch: torch.Tensor) -> torch.Tensor:
    if kind == "embedding":
        return model.encode_image(batch, normalize=True)
    return model.logits(batch)


def default_workers(device: torch.device) -> int:
    """Decoding workers: several on a GPU machine; none on CPU, where the model needs the cores."""
    cpus = os.cpu_count() or 1
    return min(8, max(1, cpus - 1)) if device.type == "cuda" else 0


def encode_images(
    model, paths: Sequence[Path], *, kind: str, batch_size: int = 256, workers: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, dict[int, str]]:
    """Run the model over image files: (values (N, D) float32, {position: failure reason}).

    Decoding happens in ``workers`` processes with pinned memory on CUDA; batches move to the
    device without blocking. Failed positions hold NaN rows.
    """
    dataset = _ImageFiles(paths, model.preprocess, model.image_size)
    workers = default_workers(model.device) if workers is None else workers
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=False, num_workers=workers,
        pin_memory=model.device.type == "cuda", persistent_workers=False,
    )
    values: np.ndarray | None = None
    failed: dict[int, str] = {}
    for indices, batch, errors in loader:
        good = [i for i, e in enumerate(errors) if not e]
        for i, e in enumerate(errors):
            if e:
                failed[int(indices[i])] = e
        if good:
            out = _model_output(model, kind, batch[good]).float().cpu().numpy()
            if values is None:
                values = np.full((len(dataset), out.shape[1]), np.nan, dtype=np.float32)
            values[indices[good].numpy()] = out
        if progress:
            progress(len(indices))
    if values is None:
        values = np.full((len(dataset), 0), np.nan, dtype=np.float32)
    bad = ~np.isfinite(values).all(axis=1) if values.shape[1] else np.ones(len(dataset), bool)
    for position in np.flatnonzero(bad):
        failed.setdefault(int(position), "non-finite model output (NaN or inf)")
    return values, failed


class FeatureCache:
    """The on-disk cache of one (model, preprocessing, kind) in a dataset folder."""

    def __init__(self, dataset_root: Path, model, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.model = model
        self.kind = kind
        self.folder = Path(dataset_root) / FEATURES_DIR / slug(model.model_id) / cache_key(model, kind)
        self.record = {"model_id": model.model_id, "preprocess": preprocessing_fingerprint(model), "kind": kind,
                       "version": CACHE_VERSION}

    def load(self) -> tuple[list[str], np.ndarray]:
        """Cached (ids, values); empty when absent, foreign or damaged (then logged)."""
        index_path = self.folder / "index.json"
        if not index_path.exists():
            return [], np.zeros((0, 0), np.float32)
        try:
            index = json.loads(index_path.read_text())
            if index.get("record") != self.record:
                logger.warning("feature cache %s belongs to %s; not reusing it", self.folder, index.get("record"))
                return [], np.zeros((0, 0), np.float32)
            values = np.load(self.folder / index["values"], allow_pickle=False)
            ids = list(index["sample_ids"])
            if values.shape[0] != len(ids) or values.dtype != np.float32:
                raise ValueError(f"array of shape {values.shape} for {len(ids)} ids")
            return ids, values
        except Exception as error:
            logger.warning("feature cache %s is damaged (%s); recomputing", self.folder, error)
            return [], np.zeros((0, 0), np.float32)

    def store(self, ids: list[str], values: np.ndarray) -> None:
        """Write a new array file, then point ``index.json`` at it (atomic), then tidy up."""
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"values-{uuid.uuid4().hex[:12]}.npy"
        import io

        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(values, dtype=np.float32), allow_pickle=False)
        write_bytes(self.folder / name, buffer.getvalue())
        write_json(self.folder / "index.json", {"record": self.record, "values": name, "sample_ids": ids,
                                                "dim": int(values.shape[1]) if values.ndim == 2 else 0})
        for old in self.folder.glob("values-*.npy"):
            if old.name != name:
                old.unlink(missing_ok=True)


def compute_features(
    dataset, model, sample_ids: Sequence[str], *, kind: str | None = None, batch_size: int = 256,
    workers: int | None = None, use_cache: bool = True, progress: Callable[[int, int], None] | None = None,
) -> Features:
    """Outputs of ``model`` for ``sample_ids`` of ``dataset``, reusing and extending the cache.

    ``kind`` defaults to ``embedding`` for CLIPs and ``logits`` for classifiers. Models with
    random unseeded weights (``cache_safe`` False) are never cached.
    """
    kind = kind or ("embedding" if model.kind == "clip" else "logits")
    cache = FeatureCache(dataset.root, model, kind) if use_cache and getattr(model, "cache_safe", True) else None
    cached_ids, cached_values = cache.load() if cache else ([], np.zeros((0, 0), np.float32))
    position = {sid: i for i, sid in enumerate(cached_ids)}
    missing = [sid for sid in dict.fromkeys(sample_ids) if sid not in position]
    new_values = np.zeros((0, cached_values.shape[1] if cached_values.size else 0), np.float32)
    failed: dict[str, str] = {}
    if missing:
        paths = [dataset.image_path(sid) for sid in missing]
        done = 0

        def step(n: int) -> None:
            nonlocal done
            done += n
            if progress:
                progress(done, len(missing))

        values, failures = encode_images(model, paths, kind=kind, batch_size=batch_size, workers=workers, progress=step)
        failed = {missing[p]: reason for p, reason in failures.items()}
        keep = [i for i in range(len(missing)) if i not in failures]
        new_ids = [missing[i] for i in keep]
        new_values = values[keep] if values.shape[1] else np.zeros((0, 0), np.float32)
        if cache and new_ids:
            all_ids = cached_ids + new_ids
            all_values = np.concatenate([cached_values, new_values]) if cached_values.size else new_values
            cache.store(all_ids, all_values)
            cached_ids, cached_values = all_ids, all_values
            position = {sid: i for i, sid in enumerate(cached_ids)}
        elif not cache:
            cached_ids = cached_ids + new_ids
            cached_values = np.concatenate([cached_values, new_values]) if cached_values.size else new_values
            position = {sid: i for i, sid in enumerate(cached_ids)}
    ordered = [sid for sid in dict.fromkeys(sample_ids) if sid in position]
    rows = [position[sid] for sid in ordered]
    values = cached_values[rows] if rows else np.zeros((0, cached_values.shape[1] if cached_values.ndim == 2 else 0), np.float32)
    return Features(ordered, values, failed, computed=len(missing))
