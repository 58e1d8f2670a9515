"""Composites: masked objects pasted onto backgrounds with a planted object-background correlation.

This generalises how Waterbirds was made and the paper's ColoredCOCO (papers/003 §4, App. D.3:
each class drawn on its own "biased" colour with probability p = 0.8, otherwise on one of 10
other colours uniformly; the OOD set draws each class on the other classes' colours, p = 0).

Objects are the samples of any dataset folder that have a mask (COCO, the synthetic world,
reviewed iNaturalist photos...). Backgrounds are solid colours (``colors``: names from
:data:`NAMED_COLORS` or ``name=#rrggbb``) or the labelled images of another dataset folder
(``backgrounds_root``: its samples with a ``background`` label, e.g. water / land photos).

Each class c gets a common background b(c) (``common``, else the i-th class in index order gets
the (i mod B)-th background). For the n composites of class c:

- exactly ``round(p * n)`` are drawn on b(c) (``exact=True``, the default, so the planted
  correlation is the one asked for, not a binomial draw from it; ``exact=False`` draws each
  independently with probability p);
- the others are spread evenly over the other backgrounds (or ``others``), in a seeded shuffle.

The composite is ``out = m * object + (1 - m) * background`` with the object's binary mask m
(mask > 0) resized with nearest-neighbour interpolation, written as PNG (lossless), so the
stored mask is exactly the set of object pixels. With ``size`` the object image is scaled to fit
inside size x size (aspect kept) and centred; the rest is background. Everything is
deterministic for a seed: composite i of class c draws from ``default_rng([seed, c, i])``.

Object licences carry over (a composite is a derivative work): objects under -ND or all rights
reserved licences are refused unless ``allow_restricted_licenses``.

Which objects (docs/design.md#masks, :mod:`curate.masks.sources`): the object is cut out along its
mask, so a wrong mask pastes a piece of the original photo's background into the composite. Objects
with a human or exact (synthetic / COCO) mask are used; objects whose mask is an unverified model
proposal (``mask_status = model:<id>``, ``curate propose-masks``) only with ``allow_model_masks``
(``curate collect composite --allow-model-masks``), the rule the split applies to model-made
background labels; masks reviewers marked bad never. A composite's mask is the set of pixels
pasted, ``mask_status = "exact"``, when the object's mask was human or exact; a composite of a
model-made mask keeps the proposal's status (``model:<id>``), never claiming exact, so every
mask consumer of the composite folder applies the same rule to it. ``extra`` records the object
mask's status and source; the report's ``info["masks"]`` (and the provenance) how many objects of
each source were used and left out (:meth:`curate.masks.sources.MaskCounts.as_dict`). An objects
folder whose usable masks are all unverified proposals is refused without the flag.
"""
from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from curate.collect.engine import (
    Candidate,
    CandidateError,
    CollectReport,
    Engine,
    ProgressFn,
    Skip,
    StreamItem,
)
from curate.collect.journal import Journal
from curate.licenses import RESTRICTED, normalize_license, stored_license
from curate.store import Dataset, DatasetError
from curate.store.mask_sources import mask_source, trusted_rows, untrusted_masks_message

log = logging.getLogger(__name__)

#: Well-separated colours (Sasha Trubetskoy's list of 20 distinct colours, plus black/white/grey).
NAMED_COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 25, 75), "green": (60, 180, 75), "yellow": (255, 225, 25), "blue": (0, 130, 200),
    "orange": (245, 130, 48), "purple": (145, 30, 180), "cyan": (70, 240, 240), "magenta": (240, 50, 230),
    "lime": (210, 245, 60), "pink": (250, 190, 212), "teal": (0, 128, 128), "lavender": (220, 190, 255),
    "brown": (170, 110, 40), "beige": (255, 250, 200), "maroon": (128, 0, 0), "mint": (170, 255, 195),
    "olive": (128, 128, 0), "apricot": (255, 215, 180), "navy": (0, 0, 128), "grey": (128, 128, 128),
    "white": (255, 255, 255), "black": (0, 0, 0),
}
#: The ten colours used when none are given (ColoredCOCO-like).
DEFAULT_COLORS: tuple[str, ...] = ("red", "green", "blue", "yellow", "magenta", "cyan", "orange", "purple",
                                   "brown", "grey")


def parse_color(text: str) -> tuple[str, tuple[int, int, int]]:
    """``"red"`` or ``"sea=#1e90ff"`` -> (name, (r, g, b)); raises ValueError otherwise."""
    name, sep, value = text.strip().partition("=")
    name = name.strip()
    if not sep:
        if name.lower() not in NAMED_COLORS:
            raise ValueError(f"unknown colour {name!r}; use one of {', '.join(NAMED_COLORS)} or name=#rrggbb")
        return name.lower(), NAMED_COLORS[name.lower()]
    value = value.strip().lstrip("#")
    if len(value) != 6 or any(c not in "0123456789abcdefABCDEF" for c in value) or not name:
        raise ValueError(f"colour {text!r}: write name=#rrggbb, e.g. sea=#1e90ff")
    return name, (int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16))


@dataclass(frozen=True)
class CompositeSpec:
    """How composites are made (see the module docstring). ``per_class=None``: one composite per
    object of the class; a larger number reuses objects on other backgrounds."""

    p: float = 0.8
    colors: tuple[str, ...] | None = None
    backgrounds_root: str | None = None
    common: tuple[tuple[int, str], ...] = ()
    others: tuple[str, ...] | None = None
    per_class: int | None = None
    classes: tuple[int, ...] | None = None
    size: int | None = None
    seed: int = 0
    exact: bool = True
    object_status: tuple[str, ...] = ("candidate", "accepted")
    allow_restricted_licenses: bool = False
    allow_model_masks: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {self.p}")
        if (self.colors is None) == (self.backgrounds_root is None) and self.colors is not None:
            raise ValueError("give colours or a backgrounds folder, not both")
        if self.size is not None and not 8 <= self.size <= 4096:
            raise ValueError(f"size must be within 8..4096 pixels, got {self.size}")
        if self.per_class is not None and self.per_class < 1:
            raise ValueError("per_class must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["common"] = {str(k): v for k, v in self.common}
        if not self.allow_model_masks:  # absent = off: a job of the same spec keeps the id it had before the flag
            del data["allow_model_masks"]
        return data


@dataclass
class _Backgrounds:
    names: list[str]
    colors: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    images: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    dataset: Dataset | None = None


def _load_backgrounds(spec: CompositeSpec) -> _Backgrounds:
    if spec.backgrounds_root is not None:
        bg_ds = Dataset.open(spec.backgrounds_root)
        images: dict[str, list[dict[str, Any]]] = {}
        for row in bg_ds.rows():
            if row["background"] is not None and row["status"] != "rejected":
                images.setdefault(row["background"], []).append(row)
        names = [b for b in bg_ds.backgrounds if b in images]
        if len(names) < 2:
            raise ValueError(f"{spec.backgrounds_root} has labelled backgrounds {names}; a composite needs at least "
                             "two (label samples' `background` first)")
        for rows in images.values():
            rows.sort(key=lambda r: r["sample_id"])
        return _Backgrounds(names=names, images=images, dataset=bg_ds)
    parsed = [parse_color(c) for c in (spec.colors or DEFAULT_COLORS)]
    names = [n for n, _ in parsed]
    if len(set(names)) != len(names) or len(names) < 2:
        raise ValueError(f"colours {names}: give at least two distinct ones")
    return _Backgrounds(names=names, colors=dict(parsed))


def plan_backgrounds(n: int, common: str, others: Sequence[str], p: float, rng: np.random.Generator, *,
                     exact: bool = True) -> list[str]:
    """The background of each of ``n`` composites of one class (see the module docstring)."""
    if exact:
        aligned = int(math.floor(p * n + 0.5))
        rest = n - aligned
        offset = int(rng.integers(len(others))) if others else 0
        plan = [common] * aligned + [others[(offset + k) % len(others)] for k in range(rest)] if others else [common] * n
        order = rng.permutation(n)
        return [plan[i] for i in order]
    return [common if rng.random() < p or not others else others[int(rng.integers(len(others)))] for _ in range(n)]


def _fit(image: Image.Image, mask: np.ndarray, size: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The object image (H x W x 3) and binary mask at the output geometry."""
    binary = mask > 0
    if size is None:
        return np.asarray(image.convert("RGB")), binary
    scale = min(size / image.width, size / image.height)
    w, h = max(1, round(image.width * scale)), max(1, round(image.height * scale))
    small = np.asarray(image.convert("RGB").resize((w, h), Image.BILINEAR))
    small_mask = np.asarray(Image.fromarray(binary.astype(np.uint8) * 255).resize((w, h), Image.NEAREST)) > 0
    canvas = np.zeros((size, size, 3), dtype=np.uint8)
    full = np.zeros((size, size), dtype=bool)
    top, left = (size - h) // 2, (size - w) // 2
    canvas[top:top + h, left:left + w] = small
    full[top:top + h, left:left + w] = small_mask
    return canvas, full


def _background_array(bgs: _Backgrounds, name: str, shape: tuple[int, int], rng: np.random.Generator
                      ) -> tuple[np.ndarray, dict[str, Any]]:
    height, width = shape
    if bgs.colors:
        color = bgs.colors[name]
        return np.broadcast_to(np.array(color, dtype=np.uint8), (height, width, 3)), {"color_rgb": list(color)}
    rows = bgs.images[name]
    row = rows[int(rng.integers(len(rows)))]
    assert bgs.dataset is not None
    with Image.open(bgs.dataset.image_path(row)) as opened:  # the row itself: no table access from threads
        img = opened.convert("RGB")
    scale = max(width / img.width, height / img.height)  # cover, then centre-crop
    w, h = max(width, math.ceil(img.width * scale)), max(height, math.ceil(img.height * scale))
    img = img.resize((w, h), Image.BILINEAR)
    left, top = (w - width) // 2, (h - height) // 2
    arr = np.asarray(img)[top:top + height, left:left + width]
    return arr, {"background_sample_id": row["sample_id"], "background_license": row["license"],
                 "background_attribution": row["attribution"]}


def composite_image(obj: np.ndarray, mask: np.ndarray, background: np.ndarray) -> np.ndarray:
    """``m * obj + (1 - m) * background`` for a binary mask m (exact: no blending)."""
    return np.where(mask[..., None], obj, background).astype(np.uint8)


def compose(objects_root: str | Path, out_root: str | Path, spec: CompositeSpec | None = None, *,
            name: str | None = None, concurrency: int = 2, progress: ProgressFn | None = None) -> CollectReport:
    """Write composites of the masked objects of ``objects_root`` into the dataset ``out_root``.

    The output dataset has the objects' label space and the backgrounds (colour names or
    background labels) as its vocabulary; samples have ``source="composite"``, ``status``
    accepted, ``background_source="synthetic"``, ``mask_status="exact"`` (``model:<id>`` for an
    object whose mask is a model proposal, used with ``allow_model_masks``) and, in ``extra``, the
    object sample and its mask's status and source, the common background, whether the composite is
    aligned with it, and the colour or background sample. Resumable and idempotent like every
    collector. ``report.info["masks"]`` counts the objects' masks by source, used and left out.
    """
    spec = spec or CompositeSpec()
    objects = Dataset.open(objects_root)
    bgs = _load_backgrounds(spec)
    if Path(out_root).resolve() == objects.root.resolve():
        raise ValueError("write composites into a new dataset folder, not into the objects' folder")
    rows = [r for r in objects.rows() if r["mask_path"] is not None and r["class_index"] is not None
            and r["status"] in spec.object_status]
    if spec.classes is not None:
        rows = [r for r in rows if r["class_index"] in set(spec.classes)]
    # objects whose mask may be cut along (curate.masks.sources): human, exact; model proposals only when allowed
    rows, masks = trusted_rows(rows, allow_model_masks=spec.allow_model_masks)
    if not rows and masks.skipped_model:
        raise ValueError(untrusted_masks_message(objects_root, masks, "the composites"))
    if not rows:
        raise ValueError(f"{objects_root} has no samples with a mask and a class"
                         + (f" among classes {list(spec.classes)}" if spec.classes else "")
                         + (f" (other than {masks.skipped_rejected} masks marked bad)" if masks.skipped_rejected else "")
                         + "; collect COCO with masks, or review masks first")
    if masks.skipped_model or masks.skipped_rejected:
        log.info("%s: object %s", objects_root, masks.line())
    by_class: dict[int, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: (r["class_index"], r["sample_id"])):
        by_class.setdefault(int(row["class_index"]), []).append(row)
    common = dict(spec.common)
    unknown = sorted({b for b in common.values() if b not in bgs.names})
    if unknown:
        raise ValueError(f"common backgrounds {unknown} are not among the backgrounds {bgs.names}")
    for i, cls in enumerate(sorted(by_class)):
        common.setdefault(cls, bgs.names[i % len(bgs.names)])
    others_pool = list(spec.others) if spec.others is not None else None
    if others_pool is not None and any(b not in bgs.names for b in others_pool):
        raise ValueError(f"--others {others_pool} must be among the backgrounds {bgs.names}")

    out = Path(out_root)
    if (out / "dataset.yaml").exists():
        ds = Dataset.open(out)
        if ds.label_space.names != objects.label_space.names:
            raise DatasetError(f"{out} has another label space than {objects_root}; write into a new folder")
        missing = [b for b in bgs.names if b not in ds.backgrounds]
        if missing:
            raise DatasetError(f"{out}'s background vocabulary lacks {missing}; write into a new folder")
    else:
        ds = Dataset.create(out, name=name or out.name, label_space=objects.label_space, backgrounds=bgs.names,
                            recipe="composite")
    identity = {"objects": str(objects.root), "objects_samples": len(rows), **spec.to_dict(),
                "common": {str(k): v for k, v in sorted(common.items())}}
    with Journal(ds.root, "composite", identity) as journal:
        with Engine(ds, journal, actor="collect.composite", concurrency=concurrency, progress=progress) as engine:
            for cls in sorted(by_class):
                label = f"{cls} {objects.label_space.name_of(cls)}"
                n = spec.per_class or len(by_class[cls])
                engine.group(str(cls), label, None)
                engine.fill(str(cls), label, _class_stream(objects, by_class[cls], cls, n, common[cls], bgs, spec,
                                                           others_pool, journal.job_id), None)
            report = engine.finish()
    aligned = {}
    for row in ds.rows():
        extra = json.loads(row["extra"] or "{}")
        if extra.get("composite_job") == journal.job_id:
            counts = aligned.setdefault(str(row["class_index"]), [0, 0])
            counts[0] += bool(extra.get("aligned"))
            counts[1] += 1
    report.info["aligned"] = {k: {"aligned": a, "total": t, "p": a / t if t else None} for k, (a, t) in aligned.items()}
    report.info["masks"] = masks.as_dict()
    ds.record_provenance("collect.composite", {**spec.to_dict(), "objects": str(objects.root),
                                               "common": {str(k): v for k, v in sorted(common.items())},
                                               "job": journal.job_id, "aligned": report.info["aligned"],
                                               "masks": report.info["masks"]})
    return report


def _class_stream(objects: Dataset, rows: Sequence[Mapping[str, Any]], cls: int, n: int, common: str,
                  bgs: _Backgrounds, spec: CompositeSpec, others_pool: list[str] | None,
                  job_id: str) -> list[StreamItem]:
    rng = np.random.default_rng([spec.seed, cls])
    others = [b for b in (others_pool if others_pool is not None else bgs.names) if b != common]
    plan = plan_backgrounds(n, common, others, spec.p, rng, exact=spec.exact)
    items: list[StreamItem] = []
    for i, background in enumerate(plan):
        row = rows[i % len(rows)]
        key = f"{cls}/{i}"
        code = normalize_license(row["license"]) if row["license"] else None
        if code in RESTRICTED and not spec.allow_restricted_licenses:
            items.append(Skip(key=key, group=str(cls), reason="license",
                              detail=f"object {row['sample_id']} is {code}: no derivative works"))
            continue
        holder: dict[str, Any] = {}

        def produce(row=row, background=background, i=i, holder=holder) -> bytes:
            with Image.open(objects.image_path(row)) as opened:
                image = opened.convert("RGB")
            mask_file = objects.mask_path(row)
            mask = None
            if mask_file is not None and mask_file.is_file():
                with Image.open(mask_file) as opened:
                    mask = np.array(opened, dtype=np.uint8)
            if mask is None or mask.shape != (image.height, image.width):
                raise CandidateError("bad_mask", f"object {row['sample_id']} has no usable mask")
            if not (mask > 0).any():
                raise CandidateError("empty_mask", f"object {row['sample_id']} has an empty mask")
            obj, binary = _fit(image, mask, spec.size)
            bg, info = _background_array(bgs, background, binary.shape, np.random.default_rng([spec.seed, cls, i]))
            holder["mask"] = binary.astype(np.uint8)
            holder["info"] = info
            buffer = io.BytesIO()
            Image.fromarray(composite_image(obj, binary, bg)).save(buffer, "PNG", compress_level=6)
            return buffer.getvalue()

        source = mask_source(row)
        extra = {"object_sample_id": row["sample_id"], "object_dataset": objects.name, "common_background": common,
                 "aligned": background == common, "composite_index": i, "p": spec.p, "seed": spec.seed,
                 "composite_job": job_id, "object_mask_status": row["mask_status"], "object_mask_source": source}
        sample = {"class_index": cls, "source": "composite",
                  "source_id": f"{objects.name}:{row['sample_id']}:{background}:{i}",
                  "license": stored_license(row["license"]), "attribution": row["attribution"], "status": "accepted",
                  "background": background, "background_source": "synthetic", "background_score": 1.0,
                  # the pasted pixels are exactly the object's mask; a model's mask stays a model's
                  "mask_status": row["mask_status"] if source == "model" else "exact", "extra": extra}

        def mask_of(prepared: Any, holder=holder) -> np.ndarray:
            return holder["mask"]

        def side(prepared: Any, sample_id: str, holder=holder, extra=extra) -> dict[str, bytes]:
            extra.update(holder.get("info") or {})
            return {}

        items.append(Candidate(key=key, group=str(cls), sample=sample, produce=produce, mask=mask_of,
                               side_files=side))
    return items
