"""Collect COCO images of chosen categories with their instance masks (pycocotools).

For each chosen category, every image with at least one non-crowd instance of it becomes a
candidate (in image-id order). Its object mask, written to ``masks/`` by the store, is the
**union of the category's non-crowd instances** (0/1):

    M(x) = 1  if  x lies in any instance i of the category with iscrowd(i) = 0,  else 0

decoded with ``COCO.annToMask`` whatever the segmentation format (polygons, compressed RLE,
uncompressed RLE). Crowd regions (``iscrowd=1``: a group of objects with one RLE) are left out
of M by default (``include_crowd=True`` adds them) and recorded in ``extra`` (their annotation
ids and pixel count). Per-instance masks are available too: ``masks/instances/<sample_id>.png``
holds value k (1..254) on the pixels of the k-th non-crowd instance (annotation ids in
``extra.instance_annotation_ids[k-1]``; where instances overlap the later one wins) and 255 on
crowd pixels; :func:`instance_masks` reads them back as one binary mask per annotation.

An image with several chosen categories is taken once (the store is content-addressed): by
default for the category covering the most pixels (``multi="largest"``), or not at all
(``multi="skip"``). The label space is the annotation file's categories (all of them, ordered
by id, so indices stay stable whatever is chosen) or, with ``mapping`` (e.g.
``datasets/coco_to_imagenet.yaml``), ImageNet-1K: ``class_index`` is the category's first
mapped index and ``extra.imagenet_indices`` lists them all.

Images come from ``images_root`` (``file_name`` joined safely: no absolute paths, no ``..``,
nothing resolving outside the root) or over HTTP from ``image_url_base`` + ``file_name`` (or
each image's ``coco_url`` with ``use_image_urls``), with the same rate limits, retries, staging
and journal as every collector (:mod:`curate.collect.engine`).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import numpy as np
import yaml
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
from curate.collect.http import (
    DEFAULT_BYTE_LIMITS,
    DEFAULT_DOWNLOAD_LIMITS,
    PoliteClient,
    check_url,
    host_of,
)
from curate.collect.journal import Journal
from curate.labels import LabelSpace, imagenet1k
from curate.licenses import stored_license
from curate.paths import data_dir
from curate.store import Dataset, DatasetError, PreparedImage

log = logging.getLogger(__name__)

INSTANCE_DIR = "masks/instances"
CROWD_VALUE = 255
MAX_INSTANCES = 254
COCO_IMAGE_HOSTS = ("images.cocodataset.org", "*.staticflickr.com")


def load_coco(annotations: str | Path) -> Any:
    """A ``pycocotools.coco.COCO`` index of ``annotations`` (its prints silenced), with checks."""
    try:
        from pycocotools.coco import COCO
    except ImportError:
        raise ImportError("collecting COCO needs pycocotools: pip install 'curate[coco]'") from None

    path = Path(annotations)
    if not path.is_file():
        raise FileNotFoundError(f"COCO annotation file {path} does not exist")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            coco = COCO(str(path))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a COCO instances file ({type(exc).__name__}: {exc})") from None
    if not coco.dataset.get("categories"):
        raise ValueError(f"{path} has no 'categories'; give a COCO *instances* annotation file")
    return coco


def coco_label_space(coco: Any, name: str = "coco") -> LabelSpace:
    """The annotation file's categories ordered by id (names; ids kept as the external ids)."""
    cats = sorted(coco.dataset["categories"], key=lambda c: int(c["id"]))
    return LabelSpace(name=name, names=tuple(str(c["name"]) for c in cats), ids=tuple(str(c["id"]) for c in cats))


def load_mapping(mapping: str | Path) -> dict[str, list[int]]:
    """A COCO -> ImageNet-1K mapping (``mapping: {coco name: [indices]}``): a path or a name in ``datasets/``."""
    path = Path(mapping)
    if not path.is_file():
        for candidate in (data_dir() / path.name, data_dir() / f"{path.name}.yaml"):
            if candidate.is_file():
                path = candidate
                break
        else:
            raise FileNotFoundError(f"mapping {mapping} not found (as a file or in {data_dir()}); "
                                    "try datasets/coco_to_imagenet.yaml")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    table = data.get("mapping") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise ValueError(f"{path}: expected 'mapping: {{coco category name: [ImageNet-1K indices]}}'")
    space = imagenet1k()
    out: dict[str, list[int]] = {}
    for key, value in table.items():
        values = value if isinstance(value, list) else [value]
        try:
            out[str(key)] = [space.resolve(v) for v in values if v is not None]
        except KeyError as exc:
            raise ValueError(f"{path}: category {key!r}: {exc}") from None
    return out


def safe_member(root: Path, name: Any) -> Path:
    """``root / name`` for a relative POSIX ``name`` that stays inside ``root``; else ValueError."""
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        raise ValueError(f"bad file name {name!r}")
    pure = PurePosixPath(name)
    if pure.is_absolute() or any(part in ("..", "") for part in pure.parts) or (len(name) > 1 and name[1] == ":"):
        raise ValueError(f"file name {name!r} is absolute or climbs out of the images folder")
    path = root / Path(*pure.parts)
    if not path.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"file name {name!r} resolves outside {root} (a symlink?)")
    return path


@dataclass
class CategoryMasks:
    """The masks of one category in one image (see the module docstring)."""

    union: np.ndarray
    instances: np.ndarray
    instance_ids: list[int]
    crowd_ids: list[int]
    crowd_pixels: int
    truncated: bool = False


def category_masks(coco: Any, anns: Sequence[Mapping[str, Any]], height: int, width: int, *,
                   include_crowd: bool = False) -> CategoryMasks:
    """Union and instance masks of ``anns`` (one category, one image) at ``height`` x ``width``."""
    union = np.zeros((height, width), dtype=np.uint8)
    instances = np.zeros((height, width), dtype=np.uint8)
    crowd = np.zeros((height, width), dtype=bool)
    instance_ids: list[int] = []
    crowd_ids: list[int] = []
    truncated = False
    for ann in sorted(anns, key=lambda a: int(a["id"])):
        binary = coco.annToMask(dict(ann)).astype(bool)
        if binary.shape != (height, width):
            raise CandidateError("bad_annotation", f"annotation {ann['id']} decodes to {binary.shape[::-1]}, "
                                 f"the image is {width}x{height}")
        if ann.get("iscrowd"):
            crowd |= binary
            crowd_ids.append(int(ann["id"]))
            if include_crowd:
                union[binary] = 1
            continue
        union[binary] = 1
        if len(instance_ids) >= MAX_INSTANCES:
            truncated = True
            continue
        instance_ids.append(int(ann["id"]))
        instances[binary] = len(instance_ids)
    instances[crowd & (instances == 0)] = CROWD_VALUE
    return CategoryMasks(union=union, instances=instances, instance_ids=instance_ids, crowd_ids=crowd_ids,
                         crowd_pixels=int(crowd.sum()), truncated=truncated)


def instance_masks(ds: Dataset, sample_id: str) -> dict[int, np.ndarray]:
    """{COCO annotation id: H x W bool mask} of a sample collected by :func:`collect_coco`."""
    import json

    row = ds.row(sample_id)
    extra = json.loads(row["extra"] or "{}")
    rel = extra.get("instance_mask_path")
    if not rel:
        raise DatasetError(f"sample {sample_id} has no per-instance masks (not from `collect coco`, or "
                           "collected with instance masks off)")
    path = ds.root / rel
    if not path.resolve().is_relative_to((ds.root / INSTANCE_DIR).resolve()):
        raise DatasetError(f"instance mask path {rel!r} of {sample_id} points outside {INSTANCE_DIR}/")
    with Image.open(path) as img:
        values = np.array(img, dtype=np.uint8)
    return {int(ann_id): values == k for k, ann_id in enumerate(extra.get("instance_annotation_ids") or [], start=1)}


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode="L").save(buffer, "PNG", compress_level=6)
    return buffer.getvalue()


@dataclass
class _Plan:
    """Which category each image is collected for, in order."""

    by_category: dict[int, list[int]] = field(default_factory=dict)
    skipped: dict[int, list[tuple[int, str, str]]] = field(default_factory=dict)


def plan_images(coco: Any, category_ids: Sequence[int], *, multi: str = "largest", min_area: float = 0.0) -> _Plan:
    """Assign each image with non-crowd instances of the chosen categories to one of them."""
    if multi not in ("largest", "skip"):
        raise ValueError(f"multi must be 'largest' or 'skip', got {multi!r}")
    chosen = set(category_ids)
    area: dict[int, dict[int, float]] = {}
    for ann in coco.dataset.get("annotations", []):
        cat = int(ann["category_id"])
        if cat in chosen and not ann.get("iscrowd"):
            per_image = area.setdefault(int(ann["image_id"]), {})
            per_image[cat] = per_image.get(cat, 0.0) + float(ann.get("area") or 0.0)
    plan = _Plan(by_category={c: [] for c in category_ids}, skipped={c: [] for c in category_ids})
    for image_id in sorted(area):
        cats = area[image_id]
        best = max(sorted(cats), key=lambda c: cats[c])
        info = coco.imgs.get(image_id)
        if info is None:
            continue
        if multi == "skip" and len(cats) > 1:
            names = ", ".join(coco.cats[c]["name"] for c in sorted(cats))
            plan.skipped[best].append((image_id, "multiple_categories", f"holds {names}"))
            continue
        total = float(info.get("width") or 0) * float(info.get("height") or 0)
        if min_area > 0 and total > 0 and cats[best] / total < min_area:
            plan.skipped[best].append((image_id, "small_object",
                                       f"objects cover {cats[best] / total:.1%} < {min_area:.1%} of the image"))
            continue
        plan.by_category[best].append(image_id)
    return plan


def collect_coco(
    dataset_root: str | Path,
    annotations: str | Path,
    *,
    images_root: str | Path | None = None,
    image_url_base: str | None = None,
    use_image_urls: bool = False,
    categories: Sequence[str | int] | None = None,
    mapping: str | Path | None = None,
    include_crowd: bool = False,
    write_instance_masks: bool = True,
    per_category: int | None = None,
    multi: str = "largest",
    min_area: float = 0.0,
    client: PoliteClient | None = None,
    image_hosts: Sequence[str] = (),
    download_rate: str | None = DEFAULT_DOWNLOAD_LIMITS,
    byte_rate: str | None = DEFAULT_BYTE_LIMITS,
    concurrency: int = 4,
    batch_size: int = 64,
    name: str | None = None,
    backgrounds: Sequence[str] | None = None,
    progress: ProgressFn | None = None,
) -> CollectReport:
    """Collect COCO images of ``categories`` (names or ids; default all) with masks (module docstring).

    Resumable like every collector (journal in ``.collect/coco-<job>.jsonl``). Raises
    ValueError for unknown categories, categories the mapping cannot map, or a dataset whose
    label space differs.
    """
    sources = sum(x is not None and x is not False for x in (images_root, image_url_base, use_image_urls or None))
    if sources != 1:
        raise ValueError("give exactly one image source: images_root (--images-root), image_url_base "
                         "(--image-url-base) or use_image_urls (--use-image-urls)")
    if image_url_base is not None:
        check_url(image_url_base)
        image_url_base = image_url_base.rstrip("/") + "/"
    if not 0.0 <= min_area < 1.0:
        raise ValueError(f"min_area is a fraction of the image in [0, 1), got {min_area}")
    ann_path = Path(annotations)
    coco = load_coco(ann_path)
    space_coco = coco_label_space(coco)
    cat_by_name = {str(c["name"]).casefold(): int(c["id"]) for c in coco.dataset["categories"]}
    if categories:
        chosen: list[int] = []
        unknown: list[str] = []
        for key in categories:
            text = str(key).strip()
            if text.isdigit() and int(text) in coco.cats:
                cid = int(text)
            elif text.casefold() in cat_by_name:
                cid = cat_by_name[text.casefold()]
            else:
                unknown.append(text)
                continue
            if cid not in chosen:
                chosen.append(cid)
        if unknown:
            raise ValueError(f"unknown COCO categor{'y' if len(unknown) == 1 else 'ies'} {unknown}; "
                             f"this file has: {', '.join(space_coco.names)}")
    else:
        chosen = sorted(int(c) for c in coco.cats)
    table = load_mapping(mapping) if mapping is not None else None
    if table is not None:
        missing = [coco.cats[c]["name"] for c in chosen if not table.get(coco.cats[c]["name"])]
        if missing:
            raise ValueError(f"the mapping has no ImageNet-1K class for {missing}; choose other categories or "
                             "collect without --mapping (COCO label space)")
        label_space = imagenet1k()
    else:
        label_space = space_coco

    root = Path(dataset_root)
    if (root / "dataset.yaml").exists():
        ds = Dataset.open(root)
        if ds.label_space.names != label_space.names:
            raise DatasetError(f"{root} has the label space {ds.label_space.name!r} ({len(ds.label_space)} classes), "
                               f"not {label_space.name!r}; collect into a new folder"
                               + ("" if table else " or pass --mapping for ImageNet-1K"))
    else:
        ds = Dataset.create(root, name=name or root.name, label_space=label_space, backgrounds=backgrounds,
                            recipe="coco")

    digest = hashlib.sha256()
    with open(ann_path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    identity = {
        "annotations_sha256": digest.hexdigest(),
        "images": str(Path(images_root).resolve()) if images_root is not None else (image_url_base or "coco_url"),
        "mapping": table, "include_crowd": include_crowd, "instance_masks": write_instance_masks,
        "multi": multi, "min_area": min_area,
    }
    own_client = False
    if images_root is None and client is None:
        hosts = {host_of(image_url_base)} if image_url_base else set(COCO_IMAGE_HOSTS)
        hosts |= {h.lower() for h in image_hosts}
        client = PoliteClient(api_limits=None, download_limits=download_rate, byte_limits=byte_rate,
                              allowed_download_hosts=None if "*" in hosts else hosts)
        own_client = True
    plan = plan_images(coco, chosen, multi=multi, min_area=min_area)
    licenses = {int(lic["id"]): lic for lic in coco.dataset.get("licenses", []) if "id" in lic}
    try:
        with Journal(ds.root, "coco", identity) as journal:  # ds.root is absolute (a relative root is fine)
            with Engine(ds, journal, client=client, actor="collect.coco", concurrency=concurrency,
                        batch_size=batch_size, progress=progress) as engine:
                for cid in chosen:
                    label = f"{cid} {coco.cats[cid]['name']}"
                    engine.group(str(cid), label, per_category)
                for cid in chosen:
                    label = f"{cid} {coco.cats[cid]['name']}"
                    stream = _category_stream(coco, cid, plan, table, ds.label_space, licenses,
                                              images_root=Path(images_root) if images_root is not None else None,
                                              image_url_base=image_url_base, include_crowd=include_crowd,
                                              write_instances=write_instance_masks)
                    engine.fill(str(cid), label, stream, per_category)
                report = engine.finish()
            report.info["categories"] = [coco.cats[c]["name"] for c in chosen]
            entry = dict(ds.provenance.get("collect.coco") or {})
            jobs = dict(entry.get("jobs") or {})
            jobs[journal.job_id] = {
                "annotations": str(ann_path), **{k: v for k, v in identity.items() if k != "mapping"},
                "mapping": str(mapping) if mapping is not None else None,
                "categories": report.info["categories"], "per_category": per_category,
                "journal": str(journal.path.relative_to(ds.root)),
                "have": {g.label: g.have for g in report.groups.values()},
            }
            entry["jobs"] = jobs
            ds.record_provenance("collect.coco", entry)
    finally:
        if own_client and client is not None:
            client.close()
    return report


def _category_stream(coco: Any, cid: int, plan: _Plan, table: Mapping[str, list[int]] | None,
                     label_space: LabelSpace, licenses: Mapping[int, Mapping[str, Any]], *,
                     images_root: Path | None, image_url_base: str | None, include_crowd: bool,
                     write_instances: bool) -> Iterator[StreamItem]:
    group = str(cid)
    cat_name = str(coco.cats[cid]["name"])
    for image_id, reason, detail in plan.skipped.get(cid, []):
        yield Skip(key=f"{group}/{image_id}", group=group, reason=reason, detail=detail)
    for image_id in plan.by_category.get(cid, []):
        info = coco.imgs[image_id]
        key = f"{group}/{image_id}"
        file_name = info.get("file_name")
        url: str | None = None
        path: Path | None = None
        try:
            if images_root is not None:
                path = safe_member(images_root, file_name)
            elif image_url_base is not None:
                _check_name(file_name)
                url = image_url_base + quote(str(file_name), safe="/")
            else:
                url = str(info.get("coco_url") or info.get("flickr_url") or "")
                check_url(url)
        except ValueError as exc:
            yield Skip(key=key, group=group, reason="unsafe_name", detail=str(exc))
            continue
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[int(image_id)], catIds=[int(cid)], iscrowd=None))
        others = sorted({coco.cats[int(a["category_id"])]["name"]
                         for a in coco.loadAnns(coco.getAnnIds(imgIds=[int(image_id)]))
                         if int(a["category_id"]) != cid})
        lic = licenses.get(int(info.get("license", -1)) if str(info.get("license", "")).lstrip("-").isdigit() else -1)
        code = stored_license((lic or {}).get("url") or (lic or {}).get("name")) if lic else None
        flickr = info.get("flickr_url")
        extra: dict[str, Any] = {
            "coco_image_id": int(image_id), "coco_file_name": str(file_name)[:300],
            "coco_category_id": cid, "coco_category": cat_name,
            "other_categories": others, "coco_url": info.get("coco_url"), "flickr_url": flickr,
            "date_captured": info.get("date_captured"),
            "coco_license": (lic or {}).get("name"),
        }
        if table is not None:
            extra["imagenet_indices"] = list(table[cat_name])
        class_index = table[cat_name][0] if table is not None else label_space.names.index(cat_name)
        sample = {
            "class_index": class_index, "source": "coco", "source_id": str(image_id),
            "source_url": url or info.get("coco_url") or flickr, "license": code,
            "attribution": f"COCO image {image_id}" + (f", Flickr {flickr}" if flickr else ""),
            "mask_status": "coco", "extra": extra,
        }
        holder: dict[str, CategoryMasks] = {}
        height, width = int(info["height"]), int(info["width"])

        def mask(prepared: PreparedImage, anns=anns, height=height, width=width, holder=holder) -> np.ndarray:
            if (prepared.width, prepared.height) != (width, height):
                raise CandidateError("size_mismatch", f"the image is {prepared.width}x{prepared.height} but its "
                                     f"annotation says {width}x{height} (EXIF-rotated, or the wrong file)")
            masks = category_masks(coco, anns, height, width, include_crowd=include_crowd)
            holder["masks"] = masks
            return masks.union

        def side_files(prepared: PreparedImage, sample_id: str, holder=holder, extra=extra) -> dict[str, bytes]:
            masks = holder["masks"]
            extra.update(instance_annotation_ids=masks.instance_ids, crowd_annotation_ids=masks.crowd_ids,
                         crowd_pixels=masks.crowd_pixels, crowd_in_mask=include_crowd)
            if masks.truncated:
                extra["instances_truncated"] = True
            if not write_instances:
                return {}
            rel = f"{INSTANCE_DIR}/{sample_id}.png"
            extra["instance_mask_path"] = rel
            return {rel: _png(masks.instances)}

        yield Candidate(key=key, group=group, sample=sample, url=url, path=path, mask=mask, side_files=side_files)


def _check_name(name: Any) -> None:
    """Refuse file names that are absolute, climb (``..``) or carry control characters."""
    if not isinstance(name, str) or not name or any(ord(ch) < 32 for ch in name) or "\\" in name:
        raise ValueError(f"bad file name {name!r}")
    pure = PurePosixPath(name)
    if pure.is_absolute() or any(part in ("..", "") for part in pure.parts) or "://" in name:
        raise ValueError(f"file name {name!r} is absolute or climbs out of the image URL base")
