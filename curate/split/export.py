"""Export a split dataset in the released CounterAnimal layout (papers/003 App. B):

    OUT/<class name>/easy-<background>/<file>
    OUT/<class name>/hard-<background>/<file>

plus ``OUT/metadata.csv`` (one row per file: path, class index and name, group, background,
licence, attribution, source URL, sample id), so licences travel with every image. Only the
kept classes' easy/hard samples are exported. Images whose licence forbids redistribution or
derivatives (ND, all rights reserved; :data:`curate.licenses.RESTRICTED`) or that
carry no licence are left out unless ``include_restricted``; the count is reported.
A class name shared by several classes (ImageNet's two "missile") gets its index appended.
The folder is written to a temporary sibling and renamed into place, so an interrupted
export never leaves a half-written OUT.
"""
from __future__ import annotations

import csv
import io
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from curate.licenses import RESTRICTED, normalize_license
from curate.runs import slug


@dataclass
class ExportReport:
    out: Path
    files: int
    classes: int
    excluded_licence: int


def _class_folders(ds, classes: list[int]) -> dict[int, str]:
    names = {c: ds.label_space.names[c].replace("/", "-").replace("\\", "-").strip() or str(c) for c in classes}
    counts = Counter(names.values())
    return {c: (n if counts[n] == 1 else f"{n} ({c})") for c, n in names.items()}


def export_counteranimal(dataset_root: Path, out: Path, *, include_restricted: bool = False, overwrite: bool = False) -> ExportReport:
    """Write the layout described in the module docstring."""
    from curate.store import Dataset

    ds = Dataset.open(dataset_root)
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty; choose another folder or pass --overwrite")
    rows = [r for r in ds.rows(group=["easy", "hard"]) if r["class_index"] is not None and r["background"]]
    if not rows:
        raise ValueError(f"{ds.root} has no easy/hard samples; run `curate split` first")
    folders = _class_folders(ds, sorted({int(r["class_index"]) for r in rows}))
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    meta = io.StringIO()
    writer = csv.writer(meta)
    writer.writerow(["path", "class_index", "class_name", "group", "background", "license", "attribution", "source_url", "sample_id"])
    excluded = files = 0
    for r in sorted(rows, key=lambda r: (r["class_index"], r["group"], r["sample_id"])):
        licence = normalize_license(r["license"]) if r["license"] else None
        if not include_restricted and (licence is None or licence in RESTRICTED):
            excluded += 1
            continue
        source = ds.image_path(r["sample_id"])
        rel = Path(folders[int(r["class_index"])]) / f"{r['group']}-{slug(r['background'])}" / f"{r['sample_id']}{source.suffix}"
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        writer.writerow([rel.as_posix(), r["class_index"], ds.label_space.names[r["class_index"]], r["group"], r["background"],
                         licence, r["attribution"], r["source_url"], r["sample_id"]])
        files += 1
    (tmp / "metadata.csv").write_text(meta.getvalue(), encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return ExportReport(out, files, len(folders), excluded)
