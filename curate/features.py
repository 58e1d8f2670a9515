"""Image outputs with a cache: every image is decoded and encoded once per model.

What is cached per (model id, preprocessing, precision, input path, output kind, sample id):
- ``embedding``: the L2-normalised image embedding of a CLIP (zero-shot scoring for any label
  space, prompt set or top-k is then matrix work on these);
- ``logits``: the 1000-way logits of an ImageNet classifier.

Layout: ``DIR/features/<model slug>/<key>/`` with ``index.json`` (the record: model id,
preprocessing, precision, input path, kind, format version; the dimension and the sample ids in
row order) and the
array file it names (``values-<token>.npy``, float32): the compacted base. While a run
encodes, every finished shard of outputs goes to its own ``shard-<token>.npz`` (sample ids,
values and the record, written atomically), so a run that is killed keeps every shard it
finished and the next run encodes only what is missing. A run that is interrupted (Ctrl-C, or
SIGTERM, which is turned into the same ``KeyboardInterrupt`` while images are encoded) first
writes every batch it finished as one more shard, then stops. At the end of a run the base and the
shards are merged into a new base (new array file, then ``index.json`` replaced atomically,
then the shards deleted; a crash in between leaves duplicates, which readers drop: an id
always names the same pixels, so both copies hold the same output). A cache or shard whose
record does not match (another model, another preprocessing, another precision or input path,
an older format) is never reused.

Precision and input path are part of the key (:func:`cache_key`; format version 2): a bf16
run on a folder that holds fp32 features encodes its own, and reports bf16 numbers. The
precision keyed is the one the model computes in (:func:`feature_precision`): ``amp`` on a
CPU autocasts to bf16 exactly as ``amp_bf16`` does, so the two share; ``amp`` on CUDA
autocasts to fp16. fp32 and ``amp`` never share (unmeasured: ``amp`` changes the matmuls'
dtype). The device kind is not part of the key: the same precision on a CPU and on a GPU
computes the same function up to rounding (measured for ViT-B-32 fp32, CPU vs CUDA: the same
top-1 on 300/300 images, largest top-1 score difference 1.4e-3, issue 27), so a cache encoded
on a GPU serves a re-score on a laptop; the run records the device that encoded
(:class:`Features`). Caches of format version 1 (no precision in the key) are not reused:
their precision is unknown. Which engine encodes (in-process or Ray Data, :mod:`curate.engine`) does not change
the cache: both write the same shards. The engines never import this module: what they run per
batch is in :mod:`curate.engine.images` and :mod:`curate.engine.identity`, which this module
imports (and re-exports: ``preprocessing_fingerprint``, ``default_workers``).

Images that fail to decode at this stage, and outputs with NaN/inf, are reported with a
reason and left out (not cached), so callers can count and exclude them.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from curate.engine.identity import LazyModel, preprocessing_fingerprint
from curate.engine.images import ImageFiles as _ImageFiles
from curate.engine.images import default_workers
from curate.engine.images import model_output as _model_output
from curate.runs import slug, write_bytes, write_json

if TYPE_CHECKING:  # torch is imported where images are encoded, so reading the cache imports no torch
    import torch

logger = logging.getLogger(__name__)

FEATURES_DIR = "features"
CACHE_VERSION = 2  # 2: precision and input path in the key and the record
KINDS = ("embedding", "logits")


@dataclass
class Features:
    """Outputs for the samples that succeeded, in ``sample_ids`` order, and the failures."""

    sample_ids: list[str]
    values: np.ndarray  # (N, D) float32
    failed: dict[str, str] = field(default_factory=dict)  # sample id -> reason
    computed: int = 0  # how many were encoded in this call (0 = all from cache)
    cached: int = 0  # how many came from the cache (computed + cached = the distinct ids asked for)
    precision: str = "fp32"  # the precision that made every one of them (feature_precision; part of the key)
    input_path: str = "cpu-exact"  # the input path that made them (curate.engine.images.INPUT_PATHS; part of the key)
    device: str | None = None  # the device that encoded the ``computed`` ones (None: nothing was encoded)

    def provenance(self) -> dict[str, object]:
        """What a run records about its features: ``precision``, ``input_path``, ``device``
        (of this call's encoding), ``encoded``, ``cached``."""
        return {"precision": self.precision, "input_path": self.input_path, "device": self.device,
                "encoded": self.computed, "cached": self.cached}

    def row_of(self) -> dict[str, int]:
        return {sid: i for i, sid in enumerate(self.sample_ids)}


def _device_kind(model) -> str:
    """``cpu`` / ``cuda`` / ... of the model's device, without loading a lazy model (its
    recorded ``info["device"]``, which :func:`curate.engine.stage_model` sets to this run's);
    ``auto`` is resolved (which imports torch)."""
    if isinstance(model, LazyModel) and not model.loaded:
        device = (model.info or {}).get("device") or "auto"
    else:
        device = getattr(model, "device", None) or "auto"
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    if kind == "auto":
        from curate.models.base import resolve_device

        kind = resolve_device("auto").type
    return kind


def feature_precision(model) -> str:
    """The precision the model's outputs are computed in (part of the cache key).

    The model's ``precision`` (a lazy model's recorded ``info["precision"]``, which the stage
    sets to this run's; fp32 when neither says), with ``amp`` named by what it autocasts to:
    ``amp_bf16`` on a CPU (torch autocasts to bf16 there, exactly as ``amp_bf16`` does), ``amp``
    (fp16) elsewhere."""
    if isinstance(model, LazyModel) and not model.loaded:
        precision = str((model.info or {}).get("precision") or "fp32")
    else:
        precision = str(getattr(model, "precision", None) or "fp32")
    if precision == "amp" and _device_kind(model) == "cpu":
        return "amp_bf16"
    return precision


def resolve_input_path(model, requested: str = "cpu-exact") -> str:
    """``requested`` (``auto`` | ``cpu-exact`` | ``gpu``) as the path that will run
    (:func:`curate.engine.images.choose_input_path`); only ``auto`` looks at the model's device
    (loading a lazy model's device kind from its record, :func:`_device_kind`) and transform."""
    from curate.engine.images import choose_input_path

    if requested == "cpu-exact":
        return requested
    if requested == "auto":
        if _device_kind(model) != "cuda":
            return "cpu-exact"
        return choose_input_path("cuda", "auto", model.preprocess)
    return choose_input_path("cpu", requested)


def cache_key(model, kind: str, input_path: str = "cpu-exact") -> str:
    """The cache folder's name: a hash of the model id, its preprocessing fingerprint, the
    precision its outputs are computed in (:func:`feature_precision`), the input path, the
    output kind and :data:`CACHE_VERSION` (module docstring: why not the device)."""
    blob = json.dumps(_record(model, kind, input_path), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _record(model, kind: str, input_path: str) -> dict[str, object]:
    return {"model_id": model.model_id, "preprocess": preprocessing_fingerprint(model), "kind": kind,
            "precision": feature_precision(model), "input_path": input_path, "version": CACHE_VERSION}


def model_output(model, kind: str, batch: torch.Tensor) -> torch.Tensor:
    """The cached output of ``kind`` for a preprocessed batch (what every engine runs: passed to
    it in the :class:`curate.engine.base.EncodeJob`; :func:`curate.engine.images.model_output`)."""
    return _model_output(model, kind, batch)


def encode_images(
    model, paths: Sequence[Path], *, kind: str, batch_size: int = 256, workers: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, dict[int, str]]:
    """Run the model over image files: (values (N, D) float32, {position: failure reason}).

    Decoding happens in ``workers`` processes with pinned memory on CUDA; batches move to the
    device without blocking. Failed positions hold NaN rows.
    """
    import torch

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
    """The on-disk cache of one (model, preprocessing, precision, input path, kind) in a dataset folder."""

    def __init__(self, dataset_root: Path, model, kind: str, input_path: str = "cpu-exact") -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        from curate.engine.images import INPUT_PATHS

        if input_path not in INPUT_PATHS:
            raise ValueError(f"input path must be one of {INPUT_PATHS}, got {input_path!r}")
        self.model = model
        self.kind = kind
        self.input_path = input_path
        self.record = _record(model, kind, input_path)
        self.precision = str(self.record["precision"])
        self.folder = Path(dataset_root) / FEATURES_DIR / slug(model.model_id) / cache_key(model, kind, input_path)

    def _load_base(self) -> tuple[list[str], np.ndarray, str | None]:
        index_path = self.folder / "index.json"
        empty: tuple[list[str], np.ndarray, str | None] = ([], np.zeros((0, 0), np.float32), None)
        if not index_path.exists():
            return empty
        try:
            index = json.loads(index_path.read_text())
            if index.get("record") != self.record:
                logger.warning("feature cache %s belongs to %s; not reusing it", self.folder, index.get("record"))
                return empty
            values = np.load(self.folder / index["values"], allow_pickle=False)
            ids = list(index["sample_ids"])
            if values.shape[0] != len(ids) or values.dtype != np.float32:
                raise ValueError(f"array of shape {values.shape} for {len(ids)} ids")
            return ids, values, index["values"]
        except Exception as error:
            logger.warning("feature cache %s is damaged (%s); recomputing", self.folder, error)
            return empty

    def shard_files(self) -> list[Path]:
        """The uncompacted shards, oldest first."""
        return sorted(self.folder.glob("shard-*.npz"), key=lambda p: (p.stat().st_mtime_ns, p.name))

    def _load_shard(self, path: Path) -> tuple[list[str], np.ndarray] | None:
        try:
            with np.load(path, allow_pickle=False) as data:
                record = json.loads(str(data["record"]))
                ids = [str(x) for x in data["ids"]]
                values = np.asarray(data["values"], dtype=np.float32)
            if record != self.record:
                logger.warning("feature shard %s belongs to %s; not reusing it", path, record)
                return None
            if values.ndim != 2 or values.shape[0] != len(ids):
                raise ValueError(f"array of shape {values.shape} for {len(ids)} ids")
            return ids, values
        except Exception as error:
            logger.warning("feature shard %s is damaged (%s); its samples will be recomputed", path, error)
            return None

    def load(self) -> tuple[list[str], np.ndarray]:
        """Cached (ids, values) of the base and every shard, each id once; empty when absent,
        foreign or damaged (then logged)."""
        ids, values, _ = self._load_base()
        parts_ids, parts_values = [ids], [values] if len(ids) else []
        seen = set(ids)
        for path in self.shard_files() if self.folder.is_dir() else []:
            shard = self._load_shard(path)
            if shard is None:
                continue
            keep = [i for i, sid in enumerate(shard[0]) if sid not in seen]
            if not keep:
                continue
            if parts_values and parts_values[0].shape[1] != shard[1].shape[1]:
                logger.warning("feature shard %s has width %d, not %d; ignoring it", path, shard[1].shape[1],
                               parts_values[0].shape[1])
                continue
            new_ids = [shard[0][i] for i in keep]
            seen.update(new_ids)
            parts_ids.append(new_ids)
            parts_values.append(shard[1][keep])
        all_ids = [sid for part in parts_ids for sid in part]
        if not all_ids:
            return [], np.zeros((0, 0), np.float32)
        return all_ids, np.concatenate(parts_values) if len(parts_values) > 1 else parts_values[0]

    def append(self, ids: Sequence[str], values: np.ndarray) -> Path:
        """Write one shard (``shard-<token>.npz``: ids, values, record) atomically."""
        import io

        self.folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, ids=np.array(list(ids), dtype=str), values=np.ascontiguousarray(values, dtype=np.float32),
                 record=np.array(json.dumps(self.record, sort_keys=True)))
        path = self.folder / f"shard-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.npz"
        write_bytes(path, buffer.getvalue())
        return path

    def store(self, ids: list[str], values: np.ndarray) -> None:
        """Write a new base array file, point ``index.json`` at it (atomic), then delete the old
        base and every shard (their content is in the new base)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        shards = self.shard_files()
        name = f"values-{uuid.uuid4().hex[:12]}.npy"
        import io

        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(values, dtype=np.float32), allow_pickle=False)
        write_bytes(self.folder / name, buffer.getvalue())
        write_json(self.folder / "index.json", {"record": self.record, "values": name, "sample_ids": list(ids),
                                                "dim": int(values.shape[1]) if values.ndim == 2 else 0})
        for old in self.folder.glob("values-*.npy"):
            if old.name != name:
                old.unlink(missing_ok=True)
        for shard in shards:
            shard.unlink(missing_ok=True)

    def compact(self) -> None:
        """Merge the base and the shards into one base (nothing to do without shards)."""
        if not self.shard_files():
            return
        ids, values = self.load()
        if ids:
            self.store(ids, values)


def cache_use_text(encoded: int, cached: int) -> str:
    """How a run says where its image outputs came from: ``696 images encoded, 2304 from the cache``,
    ``3000 images encoded`` (nothing came from the cache), ``all 3000 images from the cache``."""
    def images(n: int) -> str:
        return f"{n} image{'s' if n != 1 else ''}"

    if encoded and cached:
        return f"{images(encoded)} encoded, {cached} from the cache"
    if encoded:
        return f"{images(encoded)} encoded"
    if cached:
        return f"all {images(cached)} from the cache"
    return "no images"


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``KeyboardInterrupt`` (the path Ctrl-C takes), so an
    encode stopped by ``timeout``, a scheduler or ``kill`` writes what it finished. Only in the
    main thread (the only one that may set handlers) and only over the default handler (one an
    application installed is left to do its own work); the old handler is restored after."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def compute_features(
    dataset, model, sample_ids: Sequence[str], *, kind: str | None = None, batch_size: int = 256,
    workers: int | None = None, use_cache: bool = True, progress: Callable[[int, int], None] | None = None,
    engine=None, shard_rows: int = 4096, factory=None, input_path: str = "cpu-exact",
) -> Features:
    """Outputs of ``model`` for ``sample_ids`` of ``dataset``, reusing and extending the cache.

    ``kind`` defaults to ``embedding`` for CLIPs and ``logits`` for classifiers. Models with
    random unseeded weights (``cache_safe`` False) are never cached. ``engine`` (a
    :class:`curate.engine.Engine`; default the in-process one) encodes what is missing, in
    batches of ``batch_size`` consecutive missing ids (the same batches on every engine, so
    fp32 CPU outputs are bit-identical); every ``shard_rows`` outputs are written as a shard,
    so a killed run keeps them, and when the encoding stops on an exception (Ctrl-C, SIGTERM
    while encoding, a failing ``progress`` callback, an engine error) the batches finished
    since the last shard are written as one more shard before the exception goes on: the next
    call encodes only the rest. The model is touched only when something is missing.
    ``factory`` (:class:`curate.engine.base.ModelFactory`) is how a remote worker loads the
    model; without one a remote engine ships the loaded model by value. ``input_path``
    (``cpu-exact``, the default and CLIP_benchmark's; ``gpu``; ``auto``:
    :func:`resolve_input_path`) is how files become the model's input; it and the precision
    key the cache, and the result says which made its features (:meth:`Features.provenance`).
    """
    from curate.engine.base import EncodeJob
    from curate.engine.local import LocalEngine

    kind = kind or ("embedding" if model.kind == "clip" else "logits")
    input_path = resolve_input_path(model, input_path)
    precision = feature_precision(model)
    cache = (FeatureCache(dataset.root, model, kind, input_path) if use_cache and getattr(model, "cache_safe", True)
             else None)
    cached_ids, cached_values = cache.load() if cache else ([], np.zeros((0, 0), np.float32))
    position = {sid: i for i, sid in enumerate(cached_ids)}
    wanted = list(dict.fromkeys(sample_ids))
    missing = [sid for sid in wanted if sid not in position]
    failed: dict[str, str] = {}
    if missing:
        engine = engine or LocalEngine(workers=workers)
        job = EncodeJob.for_model(model, kind, batch_size=batch_size, output=model_output, input_path=input_path)
        job.factory = factory or job.factory
        new_ids: list[str] = []
        new_parts: list[np.ndarray] = []
        pending_ids: list[str] = []
        pending: list[np.ndarray] = []
        done = 0
        batches = engine.map_batches(dataset, missing, job)
        try:
            with _sigterm_as_interrupt():
                for out in batches:
                    failed.update(out.failed)
                    if out.sample_ids:
                        new_ids.extend(out.sample_ids)
                        new_parts.append(out.values)
                        pending_ids.extend(out.sample_ids)
                        pending.append(out.values)
                    if cache and len(pending_ids) >= shard_rows:
                        cache.append(pending_ids, np.concatenate(pending))
                        pending_ids, pending = [], []
                    done += out.count
                    if progress:
                        progress(done, len(missing))
        except BaseException as error:
            if cache and pending_ids:
                try:
                    cache.append(pending_ids, np.concatenate(pending))
                    logger.warning("encoding stopped (%s) after %d of %d images; the %d finished since the last "
                                   "shard are kept in the cache, so the next run encodes only the rest",
                                   type(error).__name__, done, len(missing), len(pending_ids))
                except Exception as flush_error:  # noqa: BLE001 - the interruption is what the caller must see
                    logger.warning("encoding stopped (%s) and its last %d outputs could not be kept: %s",
                                   type(error).__name__, len(pending_ids), flush_error)
            raise
        finally:
            close = getattr(batches, "close", None)
            if close is not None:  # an engine's generator: its loader workers or Ray session end now
                try:
                    close()
                except Exception as close_error:  # noqa: BLE001 - never hide why the encoding stopped
                    logger.warning("the %s engine did not shut down cleanly: %s", getattr(engine, "name", "?"),
                                   close_error)
        if cache and pending_ids:
            cache.append(pending_ids, np.concatenate(pending))
        if cache and new_ids:
            cache.compact()
        if new_ids:
            new_values = np.concatenate(new_parts)
            cached_values = np.concatenate([cached_values, new_values]) if cached_values.size else new_values
            cached_ids = cached_ids + new_ids
            position = {sid: i for i, sid in enumerate(cached_ids)}
    ordered = [sid for sid in wanted if sid in position]
    rows = [position[sid] for sid in ordered]
    width = cached_values.shape[1] if cached_values.ndim == 2 else 0
    values = cached_values[rows] if rows else np.zeros((0, width), np.float32)
    device = str(getattr(model, "device", "")) if missing else None
    return Features(ordered, values, failed, computed=len(missing), cached=len(wanted) - len(missing),
                    precision=precision, input_path=input_path, device=device)
