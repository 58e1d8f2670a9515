"""Background embeddings: what a photo shows once its object is taken out (docs/design.md#discover).

Two ways, chosen per class (:func:`choose_method`), recorded per class in the run:

- ``removal`` (the stronger one): the object's hole (its trusted mask grown by 2 % of the shorter
  side) is filled with tiles of the photo's own background, exactly as ``curate intervene``
  makes its Only-BG-T variant (:func:`curate.interventions.image_ops.fill_hole`), and the filled
  image is encoded by the CLIP's image tower. What is left to see is the background.
- ``projection`` (the weaker one, for photos without a trusted mask): the whole-image embedding
  ``e`` (from the feature cache that evaluate and label-backgrounds share, so nothing is encoded
  twice) with the class's text direction ``t`` (the zero-shot classifier row of "A photo of
  {class}.") projected out: ``b = (e - (e . t) t) / ||e - (e . t) t||``. It removes the one
  direction along which the model reads the class; the object still shapes the rest of ``e``,
  so groups found this way may be groups of poses or sizes as well as backgrounds.

- ``whole`` (the baseline, never chosen by ``auto``): the whole-image embedding as it is, object
  and all; what slice-discovery methods that cluster whole images use (Domino, Eyuboglu et al.
  2022). It runs beside the others to measure what removing the object gains.

``auto`` uses removal for a class when at least ``min_masked_share`` (default 0.9) of its photos
have a trusted mask (those without one are left out of that class's groups, counted as
``no_trusted_mask``), and projection for every photo of the class otherwise: one class is never
grouped in two geometries at once.

The removal embeddings are cached in ``DIR/features/<model>/discover-background-<key>/`` keyed on
(model id, preprocessing, precision, fill rule) and, per photo, on the mask's digest: a repainted
mask is encoded again, an unchanged one never.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from curate.interventions import image_ops as ops
from curate.metrics.projection import project_out
from curate.runs.base import slug, write_bytes
from curate.store.mask_sources import is_trusted, usable_mask

__all__ = ["METHODS", "FILL_RULE", "BackgroundEmbeddings", "choose_method", "project_out", "removal_embeddings",
           "RemovalCache"]

logger = logging.getLogger(__name__)

METHODS = ("auto", "removal", "projection", "whole")
#: How the hole is made and filled (part of the cache key: change it and the cache is rebuilt).
FILL_RULE = "hole = trusted mask grown by max(1, round(0.02 * min(H, W))) px; Only-BG-T tile fill (v1)"
CACHE_FILE = "embeddings.npz"


@dataclass
class BackgroundEmbeddings:
    """Background embeddings of one class's photos (L2-normalised rows, in ``sample_ids`` order)."""

    method: str  # removal | projection
    sample_ids: list[str]
    values: np.ndarray
    left_out: Counter = field(default_factory=Counter)  # reason -> photos of the class left out


def choose_method(rows: Sequence[Mapping[str, Any]], method: str, *, min_masked_share: float = 0.9,
                  allow_model_masks: bool = False) -> str:
    """``removal`` or ``projection`` for one class's rows (module docstring's ``auto`` rule)."""
    if method not in METHODS:
        raise ValueError(f"background embedding must be one of {', '.join(METHODS)}, got {method!r}")
    if method != "auto":
        return method
    if not rows:
        return "projection"
    masked = sum(1 for r in rows if is_trusted(r, allow_model_masks=allow_model_masks))
    return "removal" if masked / len(rows) >= min_masked_share else "projection"


class RemovalCache:
    """Removal embeddings of one (model, preprocessing, precision, fill rule), keyed per photo on
    ``<sample id>@<mask digest>``; one ``.npz`` replaced atomically at each save."""

    def __init__(self, dataset_root: Path, model: Any) -> None:
        from curate.engine.identity import preprocessing_fingerprint

        record = {"model": model.model_id, "preprocess": preprocessing_fingerprint(model),
                  "precision": str(getattr(model, "precision", "fp32")), "fill": FILL_RULE}
        key = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
        self.folder = Path(dataset_root) / "features" / slug(model.model_id) / f"discover-background-{key}"
        self.record = record
        self.values: dict[str, np.ndarray] = {}
        path = self.folder / CACHE_FILE
        if path.exists():
            try:
                with np.load(path, allow_pickle=False) as data:
                    if json.loads(str(data["record"])) == record:
                        self.values = dict(zip((str(k) for k in data["keys"]), np.asarray(data["values"])))
            except Exception as error:  # noqa: BLE001 - a damaged cache is rebuilt, never trusted
                logger.warning("discover cache %s is damaged (%s); encoding again", path, error)

    def save(self) -> None:
        if not self.values:
            return
        keys = sorted(self.values)
        buffer = io.BytesIO()
        np.savez(buffer, keys=np.array(keys, dtype=str), values=np.stack([self.values[k] for k in keys]),
                 record=np.array(json.dumps(self.record, sort_keys=True)))
        self.folder.mkdir(parents=True, exist_ok=True)
        write_bytes(self.folder / CACHE_FILE, buffer.getvalue())


def _mask_key(row: Mapping[str, Any], mask: np.ndarray) -> str:
    return f"{row['sample_id']}@{hashlib.sha256(np.packbits(mask).tobytes()).hexdigest()[:16]}"


def _filled(ds: Any, row: Mapping[str, Any], mask: np.ndarray) -> tuple[np.ndarray | None, str | None]:
    """(background image with the object's hole filled in, or None and why it could not be made)."""
    from PIL import Image

    try:
        with Image.open(ds.image_path(row)) as opened:
            image = np.asarray(opened.convert("RGB"))
    except (OSError, ValueError) as error:
        return None, f"image_unreadable: {type(error).__name__}"
    if image.shape[:2] != mask.shape:
        return None, "mask_size"
    hole = ops.object_hole(mask, ops.hole_margin(mask.shape))
    if hole.all():
        return None, "mask_covers_image"
    return ops.fill_hole(image, hole).image, None


def removal_embeddings(ds: Any, model: Any, rows: Sequence[Mapping[str, Any]], cache: RemovalCache | None, *,
                       batch_size: int = 64, progress: Callable[[int], None] | None = None
                       ) -> tuple[list[str], np.ndarray, Counter]:
    """Removal embeddings of ``rows`` (module docstring): (sample ids that worked, (n, D) values,
    reasons of the photos that did not: unreadable image or mask, wrong-size or empty mask, a mask
    covering the image)."""
    import torch
    from PIL import Image

    ids: list[str] = []
    parts: list[np.ndarray] = []
    failed: Counter = Counter()
    pending: list[tuple[str, str, np.ndarray]] = []

    def flush() -> None:
        if not pending:
            return
        batch = torch.stack([model.preprocess(Image.fromarray(img)) for _, _, img in pending])
        out = model.encode_image(batch, normalize=True).float().cpu().numpy()
        for (sid, key, _), value in zip(pending, out):
            if not np.isfinite(value).all():
                failed["non_finite_output"] += 1
                continue
            if cache is not None:
                cache.values[key] = value
            ids.append(sid)
            parts.append(value[None])
        if progress:
            progress(len(pending))
        pending.clear()

    for row in rows:
        mask, reason = usable_mask(ds, row)
        image = None
        if mask is not None:
            key = _mask_key(row, mask)
            if cache is not None and key in cache.values:
                ids.append(str(row["sample_id"]))
                parts.append(np.asarray(cache.values[key])[None])
                if progress:
                    progress(1)
                continue
            image, reason = _filled(ds, row, mask)
        if image is None:
            failed[str(reason).split(":")[0]] += 1
            if progress:
                progress(1)
            continue
        pending.append((str(row["sample_id"]), str(key), image))
        if len(pending) >= batch_size:
            flush()
    flush()
    width = parts[0].shape[1] if parts else 0
    values = np.concatenate(parts).astype(np.float32) if parts else np.zeros((0, width), np.float32)
    return ids, values, failed
