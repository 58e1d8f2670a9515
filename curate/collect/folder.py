"""Import local image folders into a dataset: ImageFolder and the released CounterAnimal layout.

Layouts (``layout=``):

- ``imagefolder``: ``SRC/<class>/**/<image>``. A class folder is named by an index (``9``,
  ``009``), a WordNet id (``n01518878``), a label name (``ostrich``, ``black_swan``, any name or
  lemma the label space resolves), or a combination as released sets write them
  (``9 ostrich``, ``009_ostrich``, ``n01518878_ostrich``, ``missile (657)``). Every folder name is checked before
  anything is imported: unknown or ambiguous names are one clear error listing them all with
  suggestions.
- ``counteranimal``: ``SRC/<class>/<group>-<background>/**/<image>``, the released CounterAnimal
  layout: ``easy-<bg>`` and ``hard-<bg>`` (also ``common-*`` = easy and ``counter-*`` = hard).
  Fills ``group`` and ``background`` (``background_source="human"``: the release's labels were
  assigned by people); a suffix that is not in the dataset's background vocabulary leaves
  ``background`` empty and is kept in ``extra.folder_background``.

An optional CSV (``licenses_csv``) gives per-file ``license`` and ``attribution`` (and optionally
``source_url``, ``source_id``): columns ``path`` (relative to SRC, ``/``-separated; also
``file``/``filename``), ``license``, ``attribution``. Files are read in sorted order through the
resumable engine (:mod:`curate.collect.engine`): re-running skips files already journaled (by
path, size and modification time) and never adds an image twice (content addressing).
Symbolic links leading outside SRC are not followed.
"""
from __future__ import annotations

import csv
import hashlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curate.collect.engine import (
    Candidate,
    CollectReport,
    Engine,
    ProgressFn,
    StreamItem,
)
from curate.collect.journal import Journal
from curate.labels import AmbiguousClassError, LabelSpace, UnknownClassError, imagenet1k
from curate.licenses import stored_license
from curate.store import DEFAULT_BACKGROUNDS, Dataset, DatasetError

log = logging.getLogger(__name__)

LAYOUTS: tuple[str, ...] = ("imagefolder", "counteranimal")
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jfif", ".jpe", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
GROUP_PREFIXES: dict[str, str] = {"easy": "easy", "common": "easy", "hard": "hard", "counter": "hard"}
_WNID = re.compile(r"^n\d{8}$")


class FolderLayoutError(ValueError):
    """A source folder that does not follow the layout; the message lists every problem."""


@dataclass(frozen=True)
class FolderItem:
    """One image file found in the source folder."""

    rel: str
    class_index: int
    class_folder: str
    group: str | None = None
    background: str | None = None
    group_folder: str | None = None
    size: int = 0
    mtime_ns: int = 0


def resolve_class_folder(name: str, label_space: LabelSpace) -> int:
    """The class index a folder name stands for (see the module docstring); raises
    :class:`~curate.labels.UnknownClassError` (with suggestions) or ``AmbiguousClassError``."""
    text = name.strip()
    attempts: list[str] = [text]
    match = re.match(r"^(\d+|n\d{8})[\s_\-.]+(.+)$", text)
    if match:
        attempts += [match.group(1), match.group(2)]
    match = re.match(r"^(.+?)\s*\((\d+|n\d{8})\)$", text)  # "missile (657)", as `curate split export` writes
    if match:
        attempts = [match.group(2)] + attempts
    if "," in text:
        attempts += [part.strip() for part in text.split(",") if part.strip()]
    first_error: UnknownClassError | None = None
    for attempt in attempts:
        try:
            return label_space.resolve(attempt)
        except AmbiguousClassError:
            raise
        except UnknownClassError as exc:
            first_error = first_error or exc
    raise UnknownClassError(str(first_error) if first_error else f"unknown class folder {name!r}")


def parse_group_folder(name: str, backgrounds: Sequence[str]) -> tuple[str, str | None, str]:
    """(group, background or None, background text) of ``easy-grass`` / ``counter-snow`` / ...;
    raises ValueError when the prefix is not easy/hard/common/counter."""
    match = re.match(r"^(easy|hard|common|counter)(?:[\s_\-]+(.*))?$", name.strip(), flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"{name!r} is not easy-<background>, hard-<background>, common-* or counter-*")
    group = GROUP_PREFIXES[match.group(1).lower()]
    rest = (match.group(2) or "").strip()
    wanted = " ".join(rest.replace("_", " ").replace("-", " ").split()).casefold()
    background = next((b for b in backgrounds if " ".join(b.replace("_", " ").split()).casefold() == wanted), None)
    return group, background, rest


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root)
    except OSError:
        return False


def _images_under(folder: Path, root: Path, skipped: list[str]) -> list[Path]:
    """Image files under ``folder`` (recursively, sorted), skipping links leading outside ``root``."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        base = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for d in list(dirnames):
            if (base / d).is_symlink() and not _inside(base / d, root):
                skipped.append(f"{(base / d).relative_to(root)} (a link outside the source folder)")
                dirnames.remove(d)
        for filename in sorted(filenames):
            path = base / filename
            if filename.startswith(".") or path.suffix.lower() not in IMAGE_EXTENSIONS:
                continue
            if path.is_symlink() and not _inside(path, root):
                skipped.append(f"{path.relative_to(root)} (a link outside the source folder)")
                continue
            out.append(path)
    return out


def scan_folder(src: str | Path, layout: str, label_space: LabelSpace, backgrounds: Sequence[str]) -> tuple[list[FolderItem], list[str]]:
    """Every image of ``src`` under ``layout`` (sorted) and the files left out (with why).

    Raises :class:`FolderLayoutError` listing every class folder (and, for CounterAnimal, every
    group folder) that does not resolve, before anything is read.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    root = Path(src).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"source folder {src} does not exist or is not a folder")
    problems: list[str] = []
    skipped: list[str] = []
    classes: list[tuple[Path, int]] = []
    for child in sorted(root.iterdir()):
        if child.name.startswith("."):
            continue
        if not child.is_dir():
            if child.suffix.lower() in IMAGE_EXTENSIONS:
                skipped.append(f"{child.name} (an image outside any class folder)")
            continue
        if child.is_symlink() and not _inside(child, root):
            skipped.append(f"{child.name} (a link outside the source folder)")
            continue
        try:
            classes.append((child, resolve_class_folder(child.name, label_space)))
        except UnknownClassError as exc:
            problems.append(f"class folder {child.name!r}: {exc}")
    if not classes and not problems:
        raise FolderLayoutError(f"{src} holds no class folders; the {layout} layout is SRC/<class>/"
                                + ("<easy|hard>-<background>/" if layout == "counteranimal" else "") + "<images>")
    items: list[FolderItem] = []
    for folder, index in classes:
        if layout == "imagefolder":
            for path in _images_under(folder, root, skipped):
                items.append(_item(path, root, index, folder.name))
            continue
        for sub in sorted(folder.iterdir()):
            if sub.name.startswith("."):
                continue
            if not sub.is_dir():
                if sub.suffix.lower() in IMAGE_EXTENSIONS:
                    skipped.append(f"{sub.relative_to(root)} (an image outside an easy-/hard- folder)")
                continue
            try:
                group, background, rest = parse_group_folder(sub.name, backgrounds)
            except ValueError as exc:
                problems.append(f"{folder.name}/{sub.name}: {exc}")
                continue
            if background is None and rest:
                log.warning("%s/%s: background %r is not in the vocabulary (%s); group set, background left empty",
                            folder.name, sub.name, rest, ", ".join(backgrounds))
            for path in _images_under(sub, root, skipped):
                items.append(_item(path, root, index, folder.name, group, background, sub.name))
    if problems:
        raise FolderLayoutError(
            f"{src} does not follow the {layout} layout ({len(problems)} problem(s)):\n  " + "\n  ".join(problems)
            + "\nRename the folders (class: index, WordNet id or label name"
            + ("; groups: easy-<background> / hard-<background>" if layout == "counteranimal" else "") + ").")
    return items, skipped


def _item(path: Path, root: Path, index: int, class_folder: str, group: str | None = None,
          background: str | None = None, group_folder: str | None = None) -> FolderItem:
    stat = path.stat()
    return FolderItem(rel=path.relative_to(root).as_posix(), class_index=index, class_folder=class_folder,
                      group=group, background=background, group_folder=group_folder,
                      size=stat.st_size, mtime_ns=stat.st_mtime_ns)


def read_licenses_csv(path: str | Path) -> dict[str, dict[str, str]]:
    """``{relative path: {license, attribution, source_url, source_id}}`` from a CSV (module docstring)."""
    path = Path(path)
    out: dict[str, dict[str, str]] = {}
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        fields = {f.strip().lower(): f for f in (reader.fieldnames or [])}
        key = next((fields[k] for k in ("path", "file", "filename", "file_name") if k in fields), None)
        if key is None:
            raise ValueError(f"{path}: the CSV needs a 'path' column (relative to the source folder), "
                             f"found {list(fields.values())}")
        for line, row in enumerate(reader, start=2):
            rel = (row.get(key) or "").strip().replace("\\", "/").lstrip("./")
            if not rel:
                raise ValueError(f"{path}, line {line}: empty path")
            entry = {}
            for column in ("license", "attribution", "source_url", "source_id"):
                original = fields.get(column)
                value = (row.get(original) or "").strip() if original else ""
                if value:
                    entry[column] = value
            out[rel] = entry
    return out


def import_folder(
    src: str | Path,
    dataset_root: str | Path,
    layout: str = "imagefolder",
    *,
    label_space: LabelSpace | None = None,
    licenses_csv: str | Path | None = None,
    license: str | None = None,
    attribution: str | None = None,
    status: str | None = None,
    name: str | None = None,
    backgrounds: Sequence[str] | None = None,
    concurrency: int = 4,
    batch_size: int = 256,
    progress: ProgressFn | None = None,
) -> CollectReport:
    """Import the images of ``src`` (``layout`` imagefolder or counteranimal) into ``dataset_root``.

    Creates the dataset when missing (``label_space`` default ImageNet-1K, ``backgrounds``
    default the CounterAnimal vocabulary); an existing dataset (one ``curate create`` made, or an
    earlier collection) keeps its own, and a ``label_space`` that differs from it or
    ``backgrounds`` it lacks raise :class:`~curate.store.DatasetError`. ``license`` /
    ``attribution`` apply to files the CSV does not cover. ``status`` defaults to "accepted"
    for the counteranimal layout (a released, curated benchmark) and "candidate" otherwise.
    Each sample: ``source="folder"``, ``source_id`` = the path relative to ``src``; for
    counteranimal also ``group``, ``background`` and ``background_source="human"``.
    Returns the run's :class:`CollectReport` (``report.info["skipped_files"]`` lists files left out).
    """
    root = Path(dataset_root)
    existing = existing_dataset(root, label_space, backgrounds)
    space = existing.label_space if existing is not None else (label_space or imagenet1k())
    vocabulary = existing.backgrounds if existing is not None else list(backgrounds or DEFAULT_BACKGROUNDS)
    # every problem of the source (names, CSV) is found before the dataset is created or touched
    items, skipped = scan_folder(src, layout, space, vocabulary)
    csv_rows = read_licenses_csv(licenses_csv) if licenses_csv is not None else {}
    # (not `existing or ...`: an empty dataset, e.g. one `curate create` made, has len() 0)
    ds = existing if existing is not None else Dataset.create(
        root, name=name or root.absolute().name, label_space=space, backgrounds=vocabulary, recipe=f"folder:{layout}")
    known = {item.rel for item in items}
    unused = sorted(set(csv_rows) - known)
    if unused:
        log.warning("%s: %d CSV row(s) name files that are not imported, e.g. %s", licenses_csv, len(unused),
                    ", ".join(unused[:3]))
    status = status or ("accepted" if layout == "counteranimal" else "candidate")
    src_root = Path(src).resolve()
    identity = {"src": str(src_root), "layout": layout, "status": status, "license": license,
                "attribution": attribution,
                "csv_sha256": hashlib.sha256(Path(licenses_csv).read_bytes()).hexdigest() if licenses_csv else None}
    by_class: dict[int, list[FolderItem]] = {}
    for item in items:
        by_class.setdefault(item.class_index, []).append(item)
    total = len(items)
    with Journal(ds.root, "folder", identity) as journal:  # ds.root is absolute (a relative root is fine)
        engine_ref: list[Engine] = []

        def tick(label: str, done: int, target: int | None) -> None:
            if progress is not None and engine_ref:
                walked = sum(sum(g.outcomes.values()) for g in engine_ref[0].report.groups.values())
                progress("importing", walked, total)

        with Engine(ds, journal, actor="collect.folder", concurrency=concurrency, batch_size=batch_size,
                    progress=tick) as engine:
            engine_ref.append(engine)
            for index in sorted(by_class):
                group = str(index)
                label = f"{index} {ds.label_space.name_of(index)}"
                engine.fill(group, label, _stream(by_class[index], src_root, csv_rows, license, attribution,
                                                  status, group), None)
            report = engine.finish()
    report.info["skipped_files"] = skipped
    report.info["files"] = total
    entry = dict(ds.provenance.get("collect.folder") or {})
    jobs = dict(entry.get("jobs") or {})
    jobs[journal.job_id] = {**identity, "licenses_csv": str(licenses_csv) if licenses_csv else None,
                            "files": total, "journal": str(journal.path.relative_to(ds.root))}
    entry["jobs"] = jobs
    ds.record_provenance("collect.folder", entry)
    return report


def existing_dataset(root: Path, label_space: LabelSpace | None, backgrounds: Sequence[str] | None) -> Dataset | None:
    """The dataset already at ``root`` (None when there is none), e.g. one ``curate create`` made.

    As the other collectors: it keeps its own label space and backgrounds; a ``label_space`` that
    is not the dataset's, or ``backgrounds`` its vocabulary lacks, is a clear error.
    """
    if not (root / "dataset.yaml").exists():
        return None
    ds = Dataset.open(root)
    if label_space is not None and ds.label_space.names != label_space.names:
        raise DatasetError(
            f"{root} has the label space {ds.label_space.name!r} ({len(ds.label_space)} classes), not "
            f"{label_space.name!r} ({len(label_space)} classes); leave out --label-space to add to it with its own "
            "label space, or collect into a new folder")
    missing = [b for b in backgrounds or () if b not in ds.backgrounds]
    if missing:
        raise DatasetError(f"{root}: backgrounds {missing} are not in the dataset's vocabulary {ds.backgrounds}; "
                           "leave out --backgrounds to use its own, or collect into a new folder")
    return ds


def _stream(items: Sequence[FolderItem], src_root: Path, csv_rows: Mapping[str, Mapping[str, str]],
            license: str | None, attribution: str | None, status: str, group: str) -> list[StreamItem]:
    out: list[StreamItem] = []
    for item in items:
        meta = csv_rows.get(item.rel, {})
        code = meta.get("license") or license
        extra: dict[str, Any] = {"folder_path": item.rel, "folder_class": item.class_folder}
        if item.group_folder is not None:
            extra["folder_group"] = item.group_folder
            if item.background is None:
                extra["folder_background"] = parse_group_folder(item.group_folder, [])[2] or None
        sample = {
            "class_index": item.class_index, "source": "folder", "source_id": meta.get("source_id") or item.rel,
            "source_url": meta.get("source_url"), "license": stored_license(code),
            "attribution": meta.get("attribution") or attribution, "status": status, "group": item.group,
            "background": item.background, "background_source": "human" if item.background else None,
            "extra": extra,
        }
        key = f"{item.rel}|{item.size}|{item.mtime_ns}"
        out.append(Candidate(key=key, group=group, sample=sample, path=src_root / item.rel, dedup_by_source=False))
    return out
