"""The Hub-native folder: parquet shards with embedded images, a dataset card, the attribution list.

Layout (exactly what the Hub serves to ``datasets`` users)::

    README.md                               dataset card: YAML metadata (licence, configs,
                                            dataset_info) + how it was built, per-class table
    ATTRIBUTION.csv                         every published image: licence, author, source URL
    data/easy-00000-of-00001.parquet        the easy group (papers/003 §2.1)
    data/hard-00000-of-00001.parquet        the hard group
    data/other-00000-of-00001.parquet       accepted images outside the split (only with
                                            include_unsplit=True)
    .curate-publish.json                    curate's manifest (not uploaded): fingerprint of the
                                            inputs, every file's size and sha256

Configs and splits: one config, ``default``, whose splits are the groups. So

    load_dataset(repo)                      -> DatasetDict {"easy", "hard"}: the whole set
    load_dataset(repo, split="hard")        -> the hard group (one argument away)
    load_dataset(repo, split="easy+hard")   -> the whole set as one Dataset

Every row carries the same columns (:data:`COLUMN_DOCS`): ``image`` and ``mask`` (``Image``,
the stored bytes embedded unchanged), ``label`` (``ClassLabel`` over the published classes),
``class_index`` (into the dataset's label space, e.g. ImageNet-1K, for 1-vs-1000 scoring),
``group`` and ``background`` (``ClassLabel``), licence, attribution and source columns.

Only accepted samples with a class are published; by default only those in the split
(``group`` easy/hard). Licences follow :mod:`curate.licenses` (ND, all rights
reserved, unlicensed and unknown licences are never published). Shards are planned by size
(``max_shard_bytes``, 500 MB by default like ``datasets``' ``push_to_hub``) and written
deterministically (same folder, same bytes), which is what lets an interrupted upload resume.
The folder is written beside ``out`` and renamed into place; a folder whose inputs did not
change (same fingerprint, files intact) is reused as it is.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curate import __version__
from curate.licenses import (
    EXCLUSION_REASONS,
    CardLicence,
    card_licence,
    classify_licence,
)
from curate.publish.layout import ATTRIBUTION_FILE, CARD_FILE, GROUP_NAMES, SPLITS, Selection, Shard
from curate.publish.layout import COLUMN_DOCS as COLUMN_DOCS  # re-exported: the names below were defined here
from curate.publish.layout import DATA_DIR as DATA_DIR
from curate.shell import suggest

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Features

    from curate.store import Dataset

log = logging.getLogger(__name__)

#: Bump when the layout or the columns change (part of the fingerprint).
FORMAT_VERSION = 1
MANIFEST = ".curate-publish.json"
DEFAULT_MAX_SHARD_BYTES = 500 * 1000 * 1000
#: Rows per parquet row group (the Hub's viewer reads image datasets 100 rows at a time).
ROW_GROUP_SIZE = 100
#: ``extra`` keys left out of the published copy: where and when an observation was made.
PRIVATE_EXTRA_KEYS: frozenset[str] = frozenset({
    "location", "place", "latitude", "longitude", "geojson", "public_location", "observed_at", "coordinates",
})

class PublishError(RuntimeError):
    """Publishing cannot go on; the message says what was wrong and what to do."""


def require_datasets() -> Any:
    """``datasets``, or a clear error naming the extra to install."""
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - the hub extra is part of curate[all]
        raise PublishError(f"publishing needs Hugging Face datasets ({exc}); install curate's extra: "
                           "pip install 'curate[hub]'") from None
    return datasets


# ----------------------------------------------------------------------------- selection
def select_rows(ds: Dataset, *, include_unsplit: bool = False) -> Selection:
    """The rows :func:`write_hub_folder` publishes, each with ``split`` and ``license_code`` added.

    Left out, counted by reason: samples not accepted (``not-accepted:candidate`` /
    ``not-accepted:rejected``), without a class (``no-class``), outside the split unless
    ``include_unsplit`` (``not-in-split``), and images whose licence forbids publishing
    (:data:`~curate.licenses.EXCLUSION_REASONS`). Order: split, class index, sample id.
    """
    rows: list[dict[str, Any]] = []
    excluded: Counter[str] = Counter()
    licences: Counter[str] = Counter()
    for row in ds.rows():
        if row["status"] != "accepted":
            excluded[f"not-accepted:{row['status']}"] += 1
            continue
        if row["class_index"] is None:
            excluded["no-class"] += 1
            continue
        split = row["group"] if row["group"] in GROUP_NAMES else ("other" if include_unsplit else None)
        if split is None:
            excluded["not-in-split"] += 1
            continue
        verdict = classify_licence(row["license"])
        if not verdict.publishable:
            excluded[str(verdict.reason)] += 1
            licences[verdict.code] += 1
            continue
        rows.append({**row, "split": split, "license_code": verdict.code})
    rows.sort(key=lambda r: (SPLITS.index(r["split"]), int(r["class_index"]), r["sample_id"]))
    selection = Selection(rows, dict(excluded), dict(licences))
    for reason, count in sorted(excluded.items()):
        log.info("not published: %d sample(s): %s", count, EXCLUSION_REASONS.get(reason, reason))
    return selection


# ----------------------------------------------------------------------------- features
def class_names(ds: Dataset, indices: Sequence[int]) -> list[str]:
    """Unique ClassLabel names for label-space indices (a name the label space repeats, like
    ImageNet's two "missile", gets its index: "missile (657)")."""
    names = ds.label_space.names
    repeated = {n for n, k in Counter(names).items() if k > 1}
    return [f"{names[i]} ({i})" if names[i] in repeated else names[i] for i in indices]


def hub_features(labels: Sequence[str], backgrounds: Sequence[str]) -> Features:
    """The explicit ``datasets.Features`` of the published rows (columns as :data:`COLUMN_DOCS`)."""
    datasets = require_datasets()
    Value, string = datasets.Value, datasets.Value("string")
    return datasets.Features({
        "image": datasets.Image(),
        "mask": datasets.Image(),
        "sample_id": string,
        "label": datasets.ClassLabel(names=list(labels)),
        "class_index": Value("int32"),
        "class_name": string,
        "group": datasets.ClassLabel(names=list(GROUP_NAMES)),
        "background": datasets.ClassLabel(names=list(backgrounds)),
        "background_source": string,
        "width": Value("int32"),
        "height": Value("int32"),
        "sha256": string,
        "source": string,
        "source_id": string,
        "source_url": string,
        "license": string,
        "license_as_stated": string,
        "attribution": string,
        "mask_status": string,
        "tags": datasets.List(string),
        "extra": string,
    })


def public_extra(text: str | None) -> str:
    """``extra`` without :data:`PRIVATE_EXTRA_KEYS` (JSON text, keys sorted)."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return "{}"
    if not isinstance(value, dict):
        return "{}"
    return json.dumps({k: v for k, v in value.items() if k not in PRIVATE_EXTRA_KEYS}, sort_keys=True,
                      ensure_ascii=False)


# ----------------------------------------------------------------------------- shards
def plan_shards(ds: Dataset, rows: Sequence[Mapping[str, Any]], max_shard_bytes: int) -> list[Shard]:
    """Group each split's rows into shards of at most ``max_shard_bytes`` of image + mask bytes
    (a single larger row gets a shard of its own). Deterministic for a given folder."""
    if max_shard_bytes <= 0:
        raise ValueError("max_shard_bytes must be positive")
    shards: list[Shard] = []
    for split in SPLITS:
        groups: list[list[int]] = []
        size = 0
        for i, row in enumerate(rows):
            if row["split"] != split:
                continue
            nbytes = ds.image_path(row).stat().st_size + 512
            mask = ds.mask_path(row)
            if mask is not None:
                nbytes += mask.stat().st_size
            if not groups or (size + nbytes > max_shard_bytes and groups[-1]):
                groups.append([])
                size = 0
            groups[-1].append(i)
            size += nbytes
        shards += [Shard(split, k, len(groups), tuple(g)) for k, g in enumerate(groups)]
    return shards


def _record(ds: Dataset, row: Mapping[str, Any], label: int, backgrounds: Mapping[str, int]) -> dict[str, Any]:
    image_path = ds.image_path(row)
    data = image_path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != row["sha256"]:
        raise PublishError(f"{image_path}: the bytes do not match sample {row['sample_id']}'s sha256 (the folder was "
                           f"changed by hand?); run `{suggest('curate check {dir}', dir=ds.root)}` and fix it before "
                           "publishing")
    mask_path = ds.mask_path(row)
    mask = None if mask_path is None else {"bytes": mask_path.read_bytes(), "path": f"{row['sample_id']}.mask.png"}
    return {
        "image": {"bytes": data, "path": f"{row['sample_id']}{image_path.suffix.lower()}"},
        "mask": mask,
        "sample_id": row["sample_id"],
        "label": label,
        "class_index": int(row["class_index"]),
        "class_name": row["class_name"],
        "group": GROUP_NAMES.index(row["group"]) if row["group"] in GROUP_NAMES else None,
        "background": backgrounds.get(row["background"]) if row["background"] is not None else None,
        "background_source": row["background_source"],
        "width": int(row["width"]),
        "height": int(row["height"]),
        "sha256": row["sha256"],
        "source": row["source"],
        "source_id": row["source_id"],
        "source_url": row["source_url"],
        "license": row["license_code"],
        "license_as_stated": row["license"],
        "attribution": row["attribution"],
        "mask_status": row["mask_status"],
        "tags": list(row["tags"] or []),
        "extra": public_extra(row["extra"]),
    }


def _write_shard(path: Path, ds: Dataset, rows: Sequence[Mapping[str, Any]], shard: Shard, features: Features,
                 label_of: Mapping[int, int], backgrounds: Mapping[str, int]) -> int:
    """Write one shard (row groups of :data:`ROW_GROUP_SIZE`); returns its in-memory (arrow) size."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = features.arrow_schema
    nbytes = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, len(shard.rows), ROW_GROUP_SIZE):
            chunk = [rows[i] for i in shard.rows[start:start + ROW_GROUP_SIZE]]
            records = [_record(ds, r, label_of[int(r["class_index"])], backgrounds) for r in chunk]
            table = pa.Table.from_pylist(records, schema=schema)
            nbytes += table.nbytes
            writer.write_table(table, row_group_size=ROW_GROUP_SIZE)
    return nbytes


def _attribution_csv(rows: Sequence[Mapping[str, Any]], file_of: Mapping[str, str]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["sample_id", "split", "file", "class_index", "class_name", "license", "license_as_stated",
                     "attribution", "source", "source_id", "source_url"])
    for r in rows:
        writer.writerow([r["sample_id"], r["split"], file_of[r["sample_id"]], r["class_index"], r["class_name"],
                         r["license_code"], r["license"], r["attribution"], r["source"], r["source_id"], r["source_url"]])
    return buffer.getvalue().encode("utf-8")


# ----------------------------------------------------------------------------- the folder
@dataclass
class HubFolder:
    """What :func:`write_hub_folder` wrote (or found up to date)."""

    path: Path
    repo_id: str | None
    splits: dict[str, int]
    #: Repo path -> {"size": bytes, "sha256": hex}, every file to upload (the manifest excluded).
    files: dict[str, dict[str, Any]]
    licence: CardLicence
    excluded: dict[str, int]
    excluded_licences: dict[str, int]
    classes: int
    fingerprint: str
    reused: bool = False

    @property
    def card_path(self) -> Path:
        return self.path / CARD_FILE

    @property
    def rows(self) -> int:
        return sum(self.splits.values())


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fingerprint(ds: Dataset, selection: Selection, settings: Mapping[str, Any]) -> str:
    """A hash of everything the folder is made from: rows, dataset.yaml, settings, tool version."""
    digest = hashlib.sha256()
    head = {"format": FORMAT_VERSION, "curate": __version__, "settings": dict(settings), "config": ds.config,
            "excluded": selection.excluded, "excluded_licences": selection.excluded_licences}
    digest.update(json.dumps(head, sort_keys=True, default=str).encode())
    for row in selection.rows:
        digest.update(json.dumps({k: v for k, v in row.items() if k != "added_at"}, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def _intact(out: Path, manifest: Mapping[str, Any]) -> bool:
    files = manifest.get("files") or {}
    return bool(files) and all((out / p).is_file() and (out / p).stat().st_size == info.get("size")
                               for p, info in files.items())


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a folder written by :func:`write_hub_folder`, or None."""
    try:
        value = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_hub_folder(
    root: str | Path,
    out_dir: str | Path,
    *,
    repo_id: str | None = None,
    include_unsplit: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> HubFolder:
    """Write the Hub layout of the dataset at ``root`` to ``out_dir`` (see the module docstring).

    ``repo_id`` (``owner/name``) only appears in the card's loading snippet. ``out_dir`` must be
    missing, empty, or a folder this function wrote before (which is replaced, or reused as it
    is when nothing changed, unless ``force``). ``progress(done, total)`` counts rows written.
    Raises :class:`PublishError` when nothing can be published.
    """
    from curate.publish.card import build_card
    from curate.store import Dataset

    ds = Dataset.open(root)
    out = Path(out_dir).absolute()
    inside = out == ds.root or (ds.root in out.parents and not out.relative_to(ds.root).parts[0].startswith("."))
    if inside:
        raise PublishError(f"{out} is inside the dataset folder; write the Hub folder elsewhere "
                           "(or under a hidden folder such as DIR/.publish/)")
    previous = read_manifest(out) if out.exists() else None
    if out.exists() and any(out.iterdir()) and previous is None:
        raise PublishError(f"{out} exists, is not empty and was not written by curate publish; "
                           "choose another --out folder or empty it")
    selection = select_rows(ds, include_unsplit=include_unsplit)
    if not selection.rows:
        hint = ("run `curate split` first, or publish the accepted images without a split (include_unsplit / "
                "--include-unsplit)") if selection.excluded.get("not-in-split") else "accept some images first"
        raise PublishError(f"{ds.root}: nothing to publish ({_describe_excluded(selection)}); {hint}")
    settings = {"repo_id": repo_id, "include_unsplit": include_unsplit, "max_shard_bytes": max_shard_bytes}
    fingerprint = _fingerprint(ds, selection, settings)
    licence = card_licence(selection.rows, attribution_file=ATTRIBUTION_FILE)
    indices = sorted({int(r["class_index"]) for r in selection.rows})
    if previous and not force and previous.get("fingerprint") == fingerprint and _intact(out, previous):
        log.info("%s is up to date (same inputs); reusing it", out)
        return HubFolder(out, repo_id, dict(previous["splits"]), dict(previous["files"]), licence,
                         selection.excluded, selection.excluded_licences, len(indices), fingerprint, reused=True)

    labels = class_names(ds, indices)
    label_of = {c: k for k, c in enumerate(indices)}
    backgrounds = {b: k for k, b in enumerate(ds.backgrounds)}
    features = hub_features(labels, ds.backgrounds)
    shards = plan_shards(ds, selection.rows, max_shard_bytes)

    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        split_bytes: Counter[str] = Counter()
        file_of: dict[str, str] = {}
        done = 0
        for shard in shards:
            split_bytes[shard.split] += _write_shard(tmp / shard.path, ds, selection.rows, shard, features, label_of,
                                                     backgrounds)
            for i in shard.rows:
                file_of[selection.rows[i]["sample_id"]] = shard.path
            done += len(shard.rows)
            if progress is not None:
                progress(done, len(selection.rows))
            log.debug("wrote %s (%d rows)", shard.path, len(shard.rows))
        (tmp / ATTRIBUTION_FILE).write_bytes(_attribution_csv(selection.rows, file_of))
        data_files = {s.path: (tmp / s.path).stat().st_size for s in shards}
        card = build_card(ds, selection, licence=licence, features=features, labels=labels, shards=shards,
                          split_bytes=dict(split_bytes), download_bytes=data_files, repo_id=repo_id)
        card.save(tmp / CARD_FILE)
        files = {}
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
            rel = path.relative_to(tmp).as_posix()
            files[rel] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
        manifest = {
            "format": FORMAT_VERSION, "curate_version": __version__, "fingerprint": fingerprint,
            "dataset": str(ds.root), "repo_id": repo_id, "splits": selection.split_counts(),
            "shards": [s.path for s in shards], "license": licence.license, "non_commercial": licence.non_commercial,
            "excluded": selection.excluded, "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote the Hub folder %s: %s, %d files, licence %s%s", out,
             ", ".join(f"{k} {v}" for k, v in selection.split_counts().items()), len(files), licence.license,
             " (non-commercial)" if licence.non_commercial else "")
    return HubFolder(out, repo_id, selection.split_counts(), files, licence, selection.excluded,
                     selection.excluded_licences, len(indices), fingerprint)


def _describe_excluded(selection: Selection) -> str:
    if not selection.excluded:
        return "the dataset is empty"
    return ", ".join(f"{n} {reason}" for reason, n in sorted(selection.excluded.items()))
