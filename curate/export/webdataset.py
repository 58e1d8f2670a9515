"""Export a dataset folder as webdataset shards (``curate export DIR OUT --layout webdataset``).

Layout (the `webdataset` library's convention: the members of one sample share a key, the
part of the name before the first dot)::

    OUT/shard-000000.tar ... shard-NNNNNN.tar     at most ``shard_size`` samples each
        <sample_id>.<jpg|png>   the stored image bytes, verbatim (so the sha256 and sample_id
                                of an image are the same after a round trip)
        <sample_id>.json        every column of the row but the derived paths: class_index,
                                class_name, background, background_source, background_score,
                                group, status, reject_reason, license, attribution, source,
                                source_id, source_url, tags, extra (an object), mask_status,
                                sha256, width, height, added_at
        <sample_id>.cls         the class index as text (what training loaders read), when set
        <sample_id>.mask.png    the object mask, when there is one
    OUT/curate.json             name, label space, background vocabulary, shard list and counts,
                                so ``curate collect webdataset`` can rebuild the dataset as it was

Images whose licence forbids redistribution or derivatives, or that carry none
(:data:`curate.licenses.RESTRICTED`), are left out unless ``include_restricted``; the count is
reported, as for the CounterAnimal layout (curate/split/export.py). The shards are written with
``webdataset.ShardWriter`` into a temporary sibling of OUT that is renamed into place, so an
interrupted export never leaves a half-written OUT.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from curate import __version__
from curate.licenses import RESTRICTED, normalize_license

#: Version of the sample JSON and of curate.json.
FORMAT_VERSION = 1
MANIFEST = "curate.json"
SHARD_PATTERN = "shard-%06d.tar"
#: Row columns written to each sample's JSON (filepath and mask_path are the folder's own paths).
JSON_COLUMNS: tuple[str, ...] = (
    "sample_id", "sha256", "width", "height", "source", "source_id", "source_url", "license", "attribution",
    "class_index", "class_name", "status", "reject_reason", "background", "background_source",
    "background_score", "mask_status", "group", "tags", "extra", "added_at",
)


@dataclass
class WebDatasetExport:
    """What :func:`export_webdataset` wrote: ``out``, the shard files, samples written and left out."""

    out: Path
    shards: list[Path] = field(default_factory=list)
    samples: int = 0
    excluded_licence: int = 0


def sample_json(row: dict[str, Any]) -> dict[str, Any]:
    """The JSON object of one row (``extra`` as an object, ``added_at`` as ISO text)."""
    out = {column: row[column] for column in JSON_COLUMNS}
    out["extra"] = json.loads(row["extra"]) if row["extra"] else {}
    out["added_at"] = row["added_at"].isoformat() if row["added_at"] is not None else None
    out["curate_format"] = FORMAT_VERSION
    return out


def export_webdataset(dataset: Any, out: str | Path, *, shard_size: int = 1000, include_restricted: bool = False,
                      overwrite: bool = False) -> WebDatasetExport:
    """Write every sample of ``dataset`` (a :class:`~curate.store.Dataset` or its folder) as
    webdataset shards under ``out`` (see the module docstring)."""
    import webdataset as wds

    from curate.store import Dataset

    ds = dataset if isinstance(dataset, Dataset) else Dataset.open(dataset)
    if shard_size < 1:
        raise ValueError(f"shard_size must be at least 1, got {shard_size}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty; choose another folder or pass --overwrite")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    report = WebDatasetExport(out=out)
    try:
        with wds.ShardWriter(str(tmp / SHARD_PATTERN), maxcount=shard_size, verbose=0, encoder=False,
                             mtime=0.0) as writer:
            for row in ds.table().to_pylist():
                licence = normalize_license(row["license"]) if row["license"] else None
                if not include_restricted and (licence is None or licence in RESTRICTED):
                    report.excluded_licence += 1
                    continue
                image = ds.image_path(row["sample_id"])
                sample: dict[str, Any] = {
                    "__key__": row["sample_id"],
                    image.suffix.lstrip(".").lower(): image.read_bytes(),
                    "json": json.dumps(sample_json(row), sort_keys=True, ensure_ascii=False).encode("utf-8"),
                }
                if row["class_index"] is not None:
                    sample["cls"] = str(row["class_index"]).encode("ascii")
                mask = ds.mask_path(row["sample_id"])
                if mask is not None:
                    sample["mask.png"] = mask.read_bytes()
                writer.write(sample)
                report.samples += 1
        names = sorted(p.name for p in tmp.glob("shard-*.tar"))
        manifest = {
            "format": "curate-webdataset", "format_version": FORMAT_VERSION, "curate_version": __version__,
            "name": ds.name, "label_space": ds.label_space.to_config(), "backgrounds": ds.backgrounds,
            "shards": names, "samples": report.samples, "shard_size": shard_size,
            "excluded_licence": report.excluded_licence, "include_restricted": include_restricted,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    report.shards = [out / name for name in names]
    return report
