"""Import webdataset shards into a dataset folder (``curate collect webdataset DIR --shards ...``).

``shards`` is one brace pattern (``data/shard-{000000..000099}.tar``, expanded with
``braceexpand`` as webdataset does) or a list of paths. Every shard must exist before anything
is touched. Each shard is read as a stream with ``webdataset.tariterators.tar_file_iterator``
and its members grouped into samples by key (the part of the name before the first dot, the
webdataset convention; a sample's members must be adjacent in the archive, as webdataset writes
them):

- the image: the first member with an image extension (jpg, jpeg, png, webp, ...);
- ``json``: the sample's fields. A sample written by ``curate export --layout webdataset``
  (``curate_format`` in its JSON) is restored field by field: class, background (and who set
  it, and the score), group, status, reject reason, licence, attribution, source, source id and
  URL, tags, extra, mask status. For other shards: ``class_index`` / ``label``, ``license``,
  ``attribution`` (or ``author``), ``url`` are read, and the whole object is kept in
  ``extra.webdataset_json``;
- ``cls``: the class index (when the JSON gives none);
- ``mask.png``: the object mask.

Untrusted archives: members are read into memory, never extracted, so a name cannot write
anywhere; a name that is absolute or contains ``..`` is refused anyway (quarantined as
``bad_member``), as are a JSON that does not parse and a sample with no image. An image that
does not decode is quarantined by the store. Every quarantine record names
``<shard file>:<member>``; a shard that ends early (truncated, corrupt header) keeps the
samples read before the damage and is reported. Samples are committed through
:meth:`Dataset.add_samples` every ``batch_size`` samples; content addressing makes a re-run add
only what is missing (it re-reads the shards).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from curate.labels import LabelSpace, imagenet1k
from curate.licenses import stored_license
from curate.store import DEFAULT_BACKGROUNDS, Dataset, DatasetError, NewSample

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS: tuple[str, ...] = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "gif", "ppm")
#: Fields of a curate export's JSON restored onto the new sample as they are.
RESTORED_FIELDS: tuple[str, ...] = (
    "class_index", "class_name", "source", "source_id", "source_url", "license", "attribution", "status",
    "reject_reason", "background", "background_source", "background_score", "mask_status", "group", "tags",
)


@dataclass
class WebDatasetImport:
    """What :func:`collect_webdataset` did.

    ``added`` / ``duplicates``: sample ids; ``quarantined``: (``shard:member``, reason) for every
    member or sample refused; ``damaged_shards``: (shard, what went wrong) for shards that end
    early; ``shards`` / ``samples``: how many were read.
    """

    root: Path
    shards: int = 0
    samples: int = 0
    added: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    quarantined: list[tuple[str, str]] = field(default_factory=list)
    damaged_shards: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return (f"{self.samples} sample(s) in {self.shards} shard(s): {len(self.added)} added, "
                f"{len(self.duplicates)} duplicate(s), {len(self.quarantined)} quarantined"
                + (f", {len(self.damaged_shards)} damaged shard(s)" if self.damaged_shards else ""))


def expand_shards(shards: str | Sequence[str | Path]) -> list[Path]:
    """The shard paths of a brace pattern or a list; raises FileNotFoundError naming every missing one."""
    from braceexpand import braceexpand

    paths = [Path(p) for p in braceexpand(shards)] if isinstance(shards, str) else [Path(p) for p in shards]
    if not paths:
        raise FileNotFoundError("no shards given")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise FileNotFoundError(f"{len(missing)} of {len(paths)} shard(s) do not exist: {shown}")
    return paths


def _split_name(name: str) -> tuple[str, str]:
    """(key, extension) the webdataset way: the extension starts at the basename's first dot."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), (ext.lower() if dot else "")


def _unsafe(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return name.startswith("/") or "\\" in name or ".." in parts


@dataclass
class _Member:
    name: str
    data: bytes


def read_shard(path: Path, damaged: Callable[[str], None]) -> Iterator[tuple[str, list[_Member]]]:
    """(key, members) of one shard, in archive order; ``damaged(message)`` is called when the
    archive cannot be read to its end (what was read before is still yielded)."""
    from webdataset.tariterators import tar_file_iterator

    errors: list[str] = []

    def handler(exc: Exception) -> bool:
        errors.append(str(exc))
        return True  # skip the member, go on

    key: str | None = None
    members: list[_Member] = []
    with open(path, "rb") as handle:
        try:
            for item in tar_file_iterator(handle, skip_meta=None, handler=handler):
                name = item["fname"]
                this_key = _split_name(name)[0]
                if key is not None and this_key != key:
                    yield key, members
                    members = []
                key = this_key
                members.append(_Member(name, item["data"]))
        except (tarfile.TarError, OSError, EOFError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    if key is not None:
        yield key, members
    if errors:
        damaged("; ".join(dict.fromkeys(errors)))


def _sample_from(shard: Path, key: str, members: list[_Member]) -> tuple[NewSample | None, str | None, str]:
    """(the sample, None, origin) or (None, refusal "code: detail", origin of the bad member)."""
    origin = f"{shard.name}:{key}"
    by_ext: dict[str, _Member] = {}
    for member in members:
        if _unsafe(member.name):
            return None, f"bad_member: unsafe member name {member.name!r}", f"{shard.name}:{member.name}"
        by_ext.setdefault(_split_name(member.name)[1], member)
    image = next((by_ext[e] for e in IMAGE_EXTENSIONS if e in by_ext), None)
    if image is None:
        return None, f"bad_member: no image member among {sorted(m.name for m in members)}", origin
    meta: dict[str, Any] = {}
    if "json" in by_ext:
        try:
            meta = json.loads(by_ext["json"].data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            return None, f"bad_member: JSON does not parse ({exc})", f"{shard.name}:{by_ext['json'].name}"
        if not isinstance(meta, dict):
            return None, "bad_member: the JSON is not an object", f"{shard.name}:{by_ext['json'].name}"
    fields: dict[str, Any] = {}
    if "curate_format" in meta:
        fields = {name: meta.get(name) for name in RESTORED_FIELDS if meta.get(name) is not None}
        extra = meta.get("extra") if isinstance(meta.get("extra"), dict) else {}
        try:
            added = dt.datetime.fromisoformat(meta["added_at"]) if meta.get("added_at") else None
        except (TypeError, ValueError):
            added = None
        if added is not None and added.tzinfo is not None:
            fields["added_at"] = added
    else:
        label = meta.get("class_index", meta.get("label"))
        if label is not None:
            fields["class_index"] = label
        for ours, theirs in (("license", "license"), ("attribution", "attribution"), ("attribution", "author"),
                             ("source_url", "url")):
            if meta.get(theirs) is not None and ours not in fields:
                fields[ours] = str(meta[theirs])
        fields.update(source="webdataset", source_id=f"{shard.name}/{key}")
        extra = {"webdataset_json": meta} if meta else {}
    if "class_index" not in fields and "cls" in by_ext:
        text = by_ext["cls"].data.decode("utf-8", "replace").strip()
        if not text.lstrip("-").isdigit():
            return None, f"bad_member: class {text!r} is not an integer", f"{shard.name}:{by_ext['cls'].name}"
        fields["class_index"] = int(text)
    if fields.get("license"):
        fields["license"] = stored_license(fields["license"])
    fields.setdefault("source", "webdataset")
    mask = by_ext.get("mask.png")
    sample = NewSample(image=image.data, mask=mask.data if mask is not None else None, extra=extra,
                       origin=f"{shard.name}:{image.name}", **fields)
    return sample, None, origin


def collect_webdataset(
    dataset_root: str | Path,
    shards: str | Sequence[str | Path],
    *,
    label_space: LabelSpace | None = None,
    backgrounds: Sequence[str] | None = None,
    name: str | None = None,
    batch_size: int = 1000,
    actor: str = "collect.webdataset",
    progress: Callable[[str, int, int | None], None] | None = None,
) -> WebDatasetImport:
    """Add the samples of ``shards`` to the dataset at ``dataset_root`` (created when missing).

    A new dataset takes its label space and backgrounds from ``curate.json`` beside the first
    shard when a curate export wrote one, else from the arguments (default ImageNet-1K and the
    CounterAnimal vocabulary). Returns a :class:`WebDatasetImport`.
    """
    paths = expand_shards(shards)
    root = Path(dataset_root)
    if (root / "dataset.yaml").exists():
        ds = Dataset.open(root)
    else:
        manifest = _manifest_beside(paths[0])
        space = label_space or (LabelSpace.from_config(manifest["label_space"]) if manifest else imagenet1k())
        vocabulary = list(backgrounds or (manifest or {}).get("backgrounds") or DEFAULT_BACKGROUNDS)
        ds = Dataset.create(root, name=name or (manifest or {}).get("name") or root.name, label_space=space,
                            backgrounds=vocabulary, recipe="webdataset")
    report = WebDatasetImport(root=ds.root)
    pending: list[NewSample] = []

    def flush() -> None:
        if not pending:
            return
        added = ds.add_samples(pending, actor=actor)
        report.added.extend(added.added)
        report.duplicates.extend(sid for sid, _ in added.duplicates)
        report.quarantined.extend(added.quarantined)
        pending.clear()

    for number, path in enumerate(paths):
        report.shards += 1
        for key, members in read_shard(path, lambda message, p=path: report.damaged_shards.append((str(p), message))):
            report.samples += 1
            sample, refusal, origin = _sample_from(path, key, members)
            if sample is None:
                assert refusal is not None
                code, _, detail = refusal.partition(": ")
                data = members[0].data if members else None
                ds.quarantine_input(NewSample(image=data or b"", origin=origin, source="webdataset"), code, detail,
                                    actor=actor)
                report.quarantined.append((origin, refusal))
                continue
            pending.append(sample)
            if len(pending) >= batch_size:
                flush()
        flush()
        if progress is not None:
            progress("shards", number + 1, len(paths))
    for shard, message in report.damaged_shards:
        log.warning("%s could not be read to its end: %s", shard, message)
    ds.record_provenance("collect.webdataset", {
        "shards": [str(p) for p in paths], "samples": report.samples, "added": len(report.added),
        "quarantined": len(report.quarantined), "damaged_shards": [s for s, _ in report.damaged_shards]})
    log.info("%s: %s", ds.root, report)
    return report


def _manifest_beside(shard: Path) -> dict[str, Any] | None:
    """The ``curate.json`` a curate export wrote beside its shards, if any (and if it parses)."""
    path = shard.parent / "curate.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != "curate-webdataset":
        return None
    try:
        LabelSpace.from_config(manifest.get("label_space"))
    except (ValueError, TypeError, OSError) as exc:
        raise DatasetError(f"{path}: label_space is invalid ({exc})") from None
    return manifest
