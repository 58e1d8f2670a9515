"""Import a Hugging Face dataset into a dataset folder (``curate collect hub SOURCE DIR``).

Why it is long (one job): one importer of the Hugging Face layout: sources, the card's checks,
curate-published folders row for row and other datasets mapped by label, resumable.

SOURCE is one of:

- a repo id (``owner/name``), with ``revision`` (branch, tag or commit; default ``main``):
  fetched with ``huggingface_hub.snapshot_download`` (``repo_type="dataset"``, ``endpoint`` a
  parameter, so tests point it at a loopback stand-in). **Offline by default**: only the local
  cache is read; ``online=True`` (``--online``) lets it download, and ``HF_HUB_OFFLINE=1`` still
  wins. The revision is resolved to its commit, which is recorded in the provenance and in the
  job's identity (another commit is another job). The token comes from the environment only
  (``token_env``, ``HF_TOKEN`` by default) and is never logged or shown (errors pass through
  :func:`curate.publish.upload.scrub`);
- a local Hub folder (parquet files, e.g. what ``curate publish --out`` wrote, or a clone);
- a local ``datasets`` save (``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``).

The dataset card (``README.md`` YAML) is checked before anything is imported: the data files
are those of one config's ``data_files`` (``config``; default the one marked default), each
file's columns must be the card's ``dataset_info.features`` and each split must hold the rows
the card counts (a missing or cut shard), else :class:`HubImportError`. Without a card, every
parquet file is read, its split taken from its name (:func:`split_of`).

Two kinds of rows:

1. **A folder curate published** (its parquet has every column of
   :data:`curate.publish.layout.COLUMN_DOCS`): every row comes back as it was: class, group
   (the split), background and who labelled it, the mask and its status, licence (as stated),
   attribution, source, source id and URL, tags, ``extra``; status ``accepted``. The
   background vocabulary is the parquet's ``background`` ClassLabel. Publishing the imported
   folder again gives byte-identical parquet shards and ``ATTRIBUTION.csv``; the card
   (``README.md``) differs where it describes what a Hub folder does not carry (the recipe,
   the stages recorded in ``dataset.yaml``, the split run's per-class decisions), and the rows'
   ``added_at`` and ``background_score`` are not published, so they are not restored.
   Every row's ``(class_index, class_name)`` is checked against the label space before anything
   is imported (a folder made with another label space is one clear error: pass
   ``label_space``).
2. **Any image-classification dataset**: ``image_column`` (an ``Image`` feature, or bytes) and
   ``label_column`` (``ClassLabel`` names, strings, or integers), mapped to the label space by
   the rules of ``collect folder`` (:func:`curate.collect.folder.resolve_class_folder`:
   indices, WordNet ids, names, lemmas, a label-space file), or, with ``label_space="hub"``, to
   the dataset's own class names. Every distinct label is mapped before anything is imported:
   labels that do not map are one error naming them (with suggestions), or, with
   ``skip_unknown``, their rows are skipped, counted by label (``report.info["unmapped"]``), as
   ``collect fiftyone`` does. ``splits`` imports only those splits. Optional ``mask_column``,
   ``license_column`` and ``attribution_column`` (a mask gets ``mask_status`` ``hub``: a mask
   from the dataset, counted as a human one by :mod:`curate.masks.sources`); ``source="hub"``,
   ``source_id`` = ``<split>/<row>``, the row as ``load_dataset(...)[split][row]`` counts it: across the
   split's shards, in path order (``train-00000-of-00002`` then ``train-00001-of-00002``).

Licences: a row whose stated licence forbids redistribution (ND, all rights reserved) is
skipped (``license``) unless ``allow_restricted``; a row with no licence keeps none, as
``collect folder`` does. Rows are streamed (parquet row groups / arrow record batches, never
the whole table) through the resumable engine (:mod:`curate.collect.engine`): each row's
journal key is ``<file>#<row>``, so a re-run (after Ctrl-C or SIGKILL) continues where the last
commit ended. A row whose image does not decode is quarantined by the store; a row whose
image's sha256 is not the one the row states, or whose mask is not the image's size, fails with
that reason; nothing is half-imported.

Nothing from the network is trusted as a path: data files are found by walking the snapshot,
each must resolve inside it (or inside its cache entry, whose blobs the snapshot links to), and
image ``path`` fields in rows are never opened.
"""
from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from curate.collect.engine import Candidate, CandidateError, CollectReport, Engine, ProgressFn, Skip, StreamItem
from curate.collect.folder import existing_dataset, resolve_class_folder
from curate.collect.journal import Journal
from curate.labels import AmbiguousClassError, LabelSpace, UnknownClassError, imagenet1k, unknown_labels_message
from curate.licenses import classify_licence, stored_license
from curate.publish.layout import CARD_FILE, COLUMN_DOCS, GROUP_NAMES
from curate.publish.upload import DEFAULT_TOKEN_ENV, REPO_ID, scrub
from curate.store import DEFAULT_BACKGROUNDS, Dataset, PreparedImage

log = logging.getLogger(__name__)

#: Rows read at a time from a parquet file or an arrow table.
READ_BATCH = 64
#: A shard's split from its name: ``easy-00000-of-00001.parquet``, ``train-00003-of-00010.parquet``.
_SHARD_NAME = re.compile(r"^(?P<split>[A-Za-z0-9_.]+?)-\d{5}-of-\d{5}$")
#: ``label_space`` value: a new folder's label space is the dataset's own class names (:func:`hub_label_space`).
FROM_DATASET = "hub"
#: Licence verdicts that forbid taking an image (a missing licence does not: see the module docstring).
RESTRICTED_REASONS = frozenset({"no-derivatives", "all-rights-reserved"})


class HubImportError(RuntimeError):
    """The source cannot be imported; the message says what was wrong and what to do."""


@dataclass(frozen=True)
class HubSource:
    """Where the rows come from: a local folder (``kind`` "parquet" or "saved")."""

    root: Path
    kind: str
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    #: The folder data files may resolve into (the snapshot, or its cache entry holding the blobs).
    trusted_root: Path | None = None

    def describe(self) -> str:
        if self.repo_id:
            return f"{self.repo_id}@{self.commit or self.revision or 'main'}"
        return str(self.root)


@dataclass(frozen=True)
class DataFile:
    """One data file of the source: its path relative to the source root, and its split."""

    rel: str
    split: str
    path: Path


def _token(token_env: str) -> str | bool:
    """The token in ``$token_env``, else False (huggingface_hub then sends none: a token file on
    disk is never read)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token_env or ""):
        raise HubImportError(f"--token-env {token_env!r} is not an environment variable name")
    return os.environ.get(token_env, "").strip() or False


def resolve_source(source: str | Path, *, revision: str | None = None, endpoint: str | None = None,
                   online: bool = False, token_env: str = DEFAULT_TOKEN_ENV,
                   cache_dir: str | Path | None = None) -> HubSource:
    """The local folder ``source`` names (see the module docstring); a repo is fetched into the
    cache (``online``) or found there. Raises :class:`HubImportError` with the command to run."""
    local = Path(source).expanduser()
    if local.exists():
        if not local.is_dir():
            raise HubImportError(f"{source} is a file; SOURCE is a repo id, a Hub folder or a `datasets` save folder")
        if revision:
            raise HubImportError(f"--revision applies to a repo id, not to the local folder {source}")
        root = local.resolve()
        return HubSource(root, _kind(root), trusted_root=root)
    text = str(source)
    if not REPO_ID.match(text) or ".." in text:
        raise HubImportError(f"{source} is neither a folder nor a repo id (OWNER/NAME)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    token = _token(token_env)
    try:
        path = snapshot_download(text, repo_type="dataset", revision=revision, endpoint=endpoint,
                                 cache_dir=cache_dir, local_files_only=not online, token=token,
                                 allow_patterns=["*.parquet", "*.arrow", "*.json", CARD_FILE, "*.csv"])
    except LocalEntryNotFoundError:
        where = f"{text}@{revision or 'main'}"
        if online:
            raise HubImportError(f"{where} is not in the local cache and could not be downloaded (HF_HUB_OFFLINE=1 "
                                 "is set, or the Hub cannot be reached); unset HF_HUB_OFFLINE or check the network, "
                                 "then run again") from None
        raise HubImportError(f"{where} is not in the local Hugging Face cache; add --online to download it "
                             "(curate reads only the cache unless told)") from None
    except Exception as exc:  # noqa: BLE001 - the Hub boundary: one clear, token-free line
        raise HubImportError(f"fetching {text}@{revision or 'main'} failed: {type(exc).__name__}: "
                             f"{scrub(str(exc), [token or None])}") from None
    root = Path(path)
    # a cache snapshot: <cache>/datasets--o--n/snapshots/<commit>/ whose files link to ../../blobs/
    return HubSource(root, _kind(root), repo_id=text, revision=revision or "main", commit=root.name,
                     trusted_root=root.parent.parent.resolve())


def _kind(root: Path) -> str:
    """"saved" for a ``save_to_disk`` folder (``dataset_dict.json`` or ``state.json``), else "parquet"."""
    return "saved" if (root / "dataset_dict.json").is_file() or (root / "state.json").is_file() else "parquet"


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root)
    except OSError:
        return False


def split_of(rel: str) -> str:
    """The split a data file holds: ``data/easy-00000-of-00001.parquet`` -> easy,
    ``default/train/0000.parquet`` -> train, ``data/train.parquet`` -> train."""
    path = PurePosixPath(rel)
    match = _SHARD_NAME.match(path.stem)
    if match:
        return match.group("split")
    if path.stem.isdigit() and len(path.parts) > 1:
        return path.parts[-2]
    return path.stem


@dataclass(frozen=True)
class CardInfo:
    """What a dataset card's YAML states about the data files of one config."""

    #: The config (None: the card names none).
    config: str | None = None
    #: Column names of ``dataset_info.features`` (None: not listed).
    features: list[str] | None = None
    #: Split -> ``num_examples`` (empty: not listed).
    splits: dict[str, int] = field(default_factory=dict)
    #: (split, path pattern) of the config's ``data_files`` (empty: not listed).
    patterns: tuple[tuple[str, str], ...] = ()


def _card_yaml(root: Path) -> dict[str, Any]:
    try:
        text = (root / CARD_FILE).read_text(encoding="utf-8")
    except OSError:
        return {}
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, flags=re.DOTALL)
    if not match:
        return {}
    import yaml

    try:
        meta = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as exc:
        raise HubImportError(f"{root / CARD_FILE}: the card's YAML does not parse ({exc})") from None
    return meta if isinstance(meta, dict) else {}


def _patterns(data_files: Any) -> tuple[tuple[str, str], ...]:
    """A config's ``data_files`` (a pattern, a list, or ``[{split, path}]``) as (split, pattern) pairs."""
    if isinstance(data_files, str):
        return (("train", data_files),)
    out: list[tuple[str, str]] = []
    for entry in data_files if isinstance(data_files, list) else []:
        if isinstance(entry, str):
            out.append(("train", entry))
        elif isinstance(entry, dict) and entry.get("path"):
            paths = entry["path"] if isinstance(entry["path"], list) else [entry["path"]]
            out += [(str(entry.get("split") or "train"), str(p)) for p in paths]
    return tuple(out)


def read_card(root: Path, config: str | None = None) -> CardInfo:
    """What the card (``README.md`` YAML) says about ``config`` (default: the config marked
    ``default``, else the one named so, else the only one); empty when there is no card. A card
    with several configs and none chosen, or without ``config``, is a :class:`HubImportError`
    naming them (``--config``)."""
    meta = _card_yaml(root)
    configs = [c for c in meta.get("configs") or [] if isinstance(c, dict) and c.get("config_name")]
    names = [str(c["config_name"]) for c in configs]
    chosen: dict[str, Any] | None = None
    if config is not None:
        chosen = next((c for c in configs if str(c["config_name"]) == config), None)
        if chosen is None:
            raise HubImportError(f"{root}: no config {config!r}; the card lists "
                                 + (", ".join(names) if names else "none (leave out --config)"))
    elif configs:
        chosen = next((c for c in configs if c.get("default")), None) \
            or next((c for c in configs if c["config_name"] == "default"), None) \
            or (configs[0] if len(configs) == 1 else None)
        if chosen is None:
            raise HubImportError(f"{root}: the card lists {len(configs)} configs ({', '.join(names)}) and marks none "
                                 "default; choose one with --config")
    name = str(chosen["config_name"]) if chosen is not None else None
    info = meta.get("dataset_info")
    if isinstance(info, list):
        info = next((i for i in info if isinstance(i, dict) and i.get("config_name", "default") == (name or "default")),
                    None)
    info = info if isinstance(info, dict) else {}
    features = info.get("features")
    columns = [str(f.get("name")) for f in features if isinstance(f, dict)] if isinstance(features, list) else None
    splits = {str(s["name"]): int(s["num_examples"]) for s in info.get("splits") or []
              if isinstance(s, dict) and s.get("name") is not None and isinstance(s.get("num_examples"), int)}
    return CardInfo(name, columns, splits, _patterns(chosen.get("data_files")) if chosen is not None else ())


def data_files(source: HubSource, card: CardInfo | None = None) -> list[DataFile]:
    """The source's parquet files, sorted by split, then path. With the card's ``data_files``
    patterns (``card``), only the files they match, each in its pattern's split; else every
    parquet file, its split from its name (:func:`split_of`). Files that lead outside the source
    are left out."""
    root, trusted = source.root, source.trusted_root or source.root
    patterns = card.patterns if card is not None else ()
    found: list[DataFile] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.startswith(".") or not name.endswith(".parquet"):
                continue
            rel = path.relative_to(root).as_posix()
            if not _inside(path, trusted):
                log.warning("%s leads outside %s; left out", rel, root)
                continue
            if patterns:
                split = next((sp for sp, pattern in patterns if fnmatch.fnmatchcase(rel, pattern)), None)
                if split is not None:
                    found.append(DataFile(rel, split, path))
            else:
                found.append(DataFile(rel, split_of(rel), path))
    order = {s: k for k, s in enumerate(("easy", "hard", "other", "train", "validation", "test"))}
    found.sort(key=lambda f: (order.get(f.split, len(order)), f.split, f.rel))
    return found


# ----------------------------------------------------------------------------- reading rows
@dataclass
class _Table:
    """One readable table of the source (a parquet file, or one split of a ``datasets`` save)."""

    rel: str
    split: str
    features: Any  # datasets.Features
    columns: list[str]
    parquet: Path | None = None
    arrow: Any = None  # pyarrow.Table (memory-mapped)
    #: The split's row number of this table's first row: the rows of the split's earlier shards
    #: (``load_dataset(...)[split][first_row + k]`` is this table's row ``k``).
    first_row: int = 0

    def num_rows(self) -> int:
        if self.parquet is not None:
            import pyarrow.parquet as pq

            return int(pq.read_metadata(self.parquet).num_rows)
        return int(self.arrow.num_rows)

    def batches(self, columns: Sequence[str] | None = None) -> Iterator[list[dict[str, Any]]]:
        """The rows, :data:`READ_BATCH` at a time; a file that breaks off mid-way is a
        :class:`HubImportError` (what was read before it stays imported)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        read = 0
        try:
            if self.parquet is not None:
                with pq.ParquetFile(self.parquet) as handle:
                    for batch in handle.iter_batches(batch_size=READ_BATCH, columns=list(columns) if columns else None):
                        read += batch.num_rows
                        yield batch.to_pylist()
                return
            table = self.arrow.select(list(columns)) if columns else self.arrow
            for batch in table.to_batches(max_chunksize=READ_BATCH):
                read += batch.num_rows
                yield batch.to_pylist()
        except (OSError, pa.ArrowException) as exc:
            raise HubImportError(f"{self.rel} cannot be read past row {read} ({type(exc).__name__}: {exc}); fetch it "
                                 "again and run the same command: the rows imported so far are kept") from None


def _tables(source: HubSource, card: CardInfo) -> list[_Table]:
    import datasets

    if source.kind == "saved":
        try:
            loaded = datasets.load_from_disk(str(source.root))
        except Exception as exc:  # noqa: BLE001 - a damaged save: one line
            raise HubImportError(f"{source.root}: not a readable `datasets` save ({type(exc).__name__}: {exc})") from None
        splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [("train", loaded)]
        return [_Table(f"{name}", name, d.features, list(d.column_names), arrow=d.data.table) for name, d in splits]
    import pyarrow.parquet as pq

    tables = []
    for f in data_files(source, card):
        try:
            schema = pq.read_schema(f.path)
        except Exception as exc:  # noqa: BLE001
            raise HubImportError(f"{f.rel}: not a readable parquet file ({type(exc).__name__}: {exc})") from None
        tables.append(_Table(f.rel, f.split, datasets.Features.from_arrow_schema(schema), list(schema.names),
                             parquet=f.path))
    if not tables:
        raise HubImportError(f"{source.describe()} holds no parquet files and is not a `datasets` save")
    before: Counter[str] = Counter()
    for table in tables:  # in data_files' order: a split's shards by path, as `load_dataset` concatenates them
        table.first_row = before[table.split]
        before[table.split] += table.num_rows()
    return tables


def _check_against_card(card: CardInfo, source: HubSource, tables: Sequence[_Table]) -> None:
    """Every table has the same columns, and those of the card when it lists them; each split
    has the rows the card counts (a missing or cut shard is an error before anything is read)."""
    listed = card.features
    expected = listed if listed is not None else tables[0].columns
    for table in tables:
        if sorted(table.columns) != sorted(expected):
            missing = sorted(set(expected) - set(table.columns))
            unexpected = sorted(set(table.columns) - set(expected))
            what = "the dataset card's features" if listed is not None else f"those of {tables[0].rel}"
            raise HubImportError(f"{table.rel}: its columns do not match {what} (missing {missing}, unexpected "
                                 f"{unexpected}); the folder is damaged or was edited by hand: fetch it again")
    if card.splits and {t.split for t in tables} <= set(card.splits):
        rows = Counter[str]()
        for table in tables:
            rows[table.split] += table.num_rows()
        for split, stated in card.splits.items():
            if rows[split] != stated:
                raise HubImportError(f"{source.describe()}: split {split!r} has {rows[split]} row(s) in its parquet "
                                     f"files, the dataset card says {stated}; a data file is missing or damaged: "
                                     "fetch it again")


def is_curate_folder(tables: Sequence[_Table]) -> bool:
    """Whether the rows are the columns ``curate publish`` writes."""
    return bool(tables) and set(COLUMN_DOCS) <= set(tables[0].columns)


def _image_bytes(value: Any, column: str) -> bytes:
    if isinstance(value, dict):
        data = value.get("bytes")
        if data is None:
            raise CandidateError("no_image_bytes", f"{column} holds a path, not the image bytes (paths in rows are "
                                                   "never opened)")
        return bytes(data)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise CandidateError("no_image", f"{column} is {type(value).__name__}, not an image")


def _mask_reader(value: Any, column: str) -> Any:
    """``mask(prepared)`` for the engine: the mask decoded, at the image's size (or a failure)."""
    if value is None:
        return None

    def mask(prepared: PreparedImage) -> np.ndarray | None:
        from PIL import Image

        data = _image_bytes(value, column)
        try:
            with Image.open(io.BytesIO(data)) as img:
                array = np.asarray(img.convert("L") if img.mode not in ("L", "P", "1") else img)
        except Exception as exc:  # noqa: BLE001 - an undecodable mask fails its row, with why
            raise CandidateError("bad_mask", f"the mask does not decode ({type(exc).__name__}: {exc})") from None
        if array.shape != (prepared.height, prepared.width):
            raise CandidateError("mask_size", f"the mask is {array.shape[1]}x{array.shape[0]}, the image "
                                              f"{prepared.width}x{prepared.height}")
        return array.astype(np.uint8)

    return mask


def _checked_image(data: bytes, sha256: str | None) -> Any:
    def produce() -> bytes:
        if sha256 and hashlib.sha256(data).hexdigest() != sha256:
            raise CandidateError("sha256_mismatch", f"the image bytes do not have the row's sha256 {sha256[:16]}...")
        return data

    return produce


def _class_label_names(features: Any, column: str) -> list[str] | None:
    feature = features.get(column) if features is not None else None
    names = getattr(feature, "names", None)
    return list(names) if names else None


def check_classes(tables: Sequence[_Table], space: LabelSpace) -> None:
    """Every published row's ``(class_index, class_name)`` is the label space's; one clear error otherwise."""
    for table in tables:
        for batch in table.batches(["class_index", "class_name"]):
            for row in batch:
                index, name = row["class_index"], row["class_name"]
                if index is None or not 0 <= int(index) < len(space) or space.names[int(index)] != name:
                    have = space.names[int(index)] if index is not None and 0 <= int(index) < len(space) else None
                    raise HubImportError(
                        f"{table.rel}: class {index} {name!r} is not in the label space {space.name!r} "
                        f"({'it names it ' + repr(have) if have else 'no such index'}); pass the folder's label space "
                        "(--label-space FILE, one class name per line)")


# ----------------------------------------------------------------------------- the streams
@dataclass
class _Settings:
    image_column: str
    label_column: str
    mask_column: str | None
    license_column: str | None
    attribution_column: str | None
    license: str | None
    attribution: str | None
    status: str | None
    allow_restricted: bool
    #: Every label of the rows -> its class index, or why it has none (:func:`map_labels`).
    mapping: dict[str, int | str] = field(default_factory=dict)
    unmapped: Counter = field(default_factory=Counter)


def _licence_skip(key: str, group: str, licence: str | None, allow: bool) -> Skip | None:
    if licence is None or allow:
        return None
    verdict = classify_licence(licence)
    if verdict.reason in RESTRICTED_REASONS:
        return Skip(key, group, "license", f"licence {verdict.code} forbids redistribution (--allow-restricted-licenses)")
    return None


def _published_stream(table: _Table, settings: _Settings) -> Iterator[StreamItem]:
    groups = _class_label_names(table.features, "group") or list(GROUP_NAMES)
    backgrounds = _class_label_names(table.features, "background") or []
    position = 0
    for batch in table.batches():
        for row in batch:
            key, position = f"{table.rel}#{position}", position + 1
            licence = row["license_as_stated"] or row["license"]
            skip = _licence_skip(key, table.split, licence, settings.allow_restricted)
            if skip is not None:
                yield skip
                continue
            try:
                data = _image_bytes(row["image"], "image")
            except CandidateError as exc:
                yield Skip(key, table.split, exc.code, exc.detail)
                continue
            try:
                extra = json.loads(row["extra"] or "{}")
            except ValueError:
                extra = {}
            group = row["group"]
            background = row["background"]
            sample = {
                "class_index": int(row["class_index"]), "source": row["source"] or "hub",
                "source_id": row["source_id"], "source_url": row["source_url"], "license": licence,
                "attribution": row["attribution"], "status": "accepted",
                "group": groups[group] if isinstance(group, int) and 0 <= group < len(groups) else None,
                "background": backgrounds[background] if isinstance(background, int)
                and 0 <= background < len(backgrounds) else None,
                "background_source": row["background_source"], "mask_status": row["mask_status"],
                "tags": list(row["tags"] or []), "extra": extra if isinstance(extra, dict) else {},
            }
            yield Candidate(key=key, group=table.split, sample=sample, produce=_checked_image(data, row["sha256"]),
                            mask=_mask_reader(row["mask"], "mask"), dedup_by_source=False)


def _row_label(value: Any, names: list[str] | None) -> Any:
    """A label cell as text: a ClassLabel integer as its name, anything else as it is (None stays None)."""
    return names[value] if names and isinstance(value, int) and 0 <= value < len(names) else value


def label_counts(tables: Sequence[_Table], column: str) -> Counter[str]:
    """Rows per label of ``column`` over ``tables`` (ClassLabel integers as their names; empty cells left out);
    only that column is read."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    counts: Counter[str] = Counter()
    for table in tables:
        names = _class_label_names(table.features, column)
        values = pq.read_table(table.parquet, columns=[column]).column(0) if table.parquet is not None \
            else table.arrow.column(column)
        for entry in pc.value_counts(values).to_pylist():
            label = _row_label(entry["values"], names)
            if label is not None:
                counts[str(label)] += int(entry["counts"])
    return counts


def hub_label_space(tables: Sequence[_Table], column: str, name: str) -> LabelSpace:
    """The dataset's own class names as a label space (``label_space="hub"``): the ClassLabel
    names of ``column`` in their order (a row's class index is then its label id), else its
    distinct text labels, sorted; integers without names are a :class:`HubImportError`."""
    names = _class_label_names(tables[0].features, column)
    if names is None:
        labels = label_counts(tables, column)
        if any(_is_integer_text(label) for label in labels):
            raise HubImportError(f"{column!r} holds integers without class names (no ClassLabel feature); "
                                 "--label-space hub needs names: give --label-space FILE (one name per line, in "
                                 "label order)")
        names = sorted(labels)
    if not names:
        raise HubImportError(f"{column!r} holds no labels; nothing to make a label space of")
    return LabelSpace.from_names(name, [str(n) for n in names])


def _is_integer_text(text: str) -> bool:
    return text.strip().lstrip("-").isdigit()


def map_labels(labels: Sequence[str], space: LabelSpace, *, own_names: bool = False) -> dict[str, int | str]:
    """Each label -> its class index in ``space``, or the reason it has none (with suggestions).

    ``own_names`` (``label_space="hub"``): a label is its class name exactly; otherwise labels are
    resolved as ``collect folder`` resolves folder names (:func:`resolve_class_folder`)."""
    mapping: dict[str, int | str] = {}
    position = {n: i for i, n in enumerate(space.names)} if own_names else {}
    for label in labels:
        if own_names:
            mapping[label] = position.get(label, f"{label!r} is not a class of the label space {space.name!r}")
            continue
        try:
            mapping[label] = resolve_class_folder(label, space)
        except AmbiguousClassError as exc:
            mapping[label] = f"ambiguous: {exc}"
        except UnknownClassError as exc:
            mapping[label] = str(exc)
    return mapping


def _generic_stream(table: _Table, space: LabelSpace, settings: _Settings, origin: str) -> Iterator[StreamItem]:
    names = _class_label_names(table.features, settings.label_column)
    position = 0
    for batch in table.batches():
        for row in batch:
            index, position = position, position + 1
            key, row_number = f"{table.rel}#{index}", table.first_row + index
            value = row.get(settings.label_column)
            label = _row_label(value, names)
            if label is None:
                yield Skip(key, table.split, "no_label", f"{settings.label_column} is empty")
                continue
            resolved = settings.mapping.get(str(label), f"{label!r} was not read before the import")
            if isinstance(resolved, str):
                settings.unmapped[str(label)] += 1
                yield Skip(key, table.split, "unmapped_label", f"{label!r}: {resolved}"[:300])
                continue
            licence = row.get(settings.license_column) if settings.license_column else None
            licence = licence or settings.license
            skip = _licence_skip(key, table.split, licence, settings.allow_restricted)
            if skip is not None:
                yield skip
                continue
            try:
                data = _image_bytes(row.get(settings.image_column), settings.image_column)
            except CandidateError as exc:
                yield Skip(key, table.split, exc.code, exc.detail)
                continue
            attribution = row.get(settings.attribution_column) if settings.attribution_column else None
            sample = {
                "class_index": resolved, "source": "hub", "source_id": f"{table.split}/{row_number}",
                "license": stored_license(licence),
                "attribution": str(attribution) if attribution else settings.attribution,
                "status": settings.status or "candidate",
                "extra": {"hub_source": origin, "hub_file": table.rel, "hub_file_row": index, "hub_row": row_number,
                          "hub_label": str(label)},
            }
            mask = _mask_reader(row.get(settings.mask_column), settings.mask_column) if settings.mask_column else None
            if mask is not None:  # counted as a human mask (docs/design.md#masks), named by where it came from
                sample["mask_status"] = "hub"
            yield Candidate(key=key, group=table.split, sample=sample, produce=_checked_image(data, None), mask=mask,
                            dedup_by_source=False)


# ----------------------------------------------------------------------------- the import
def collect_hub(
    source: str | Path,
    dataset_root: str | Path,
    *,
    revision: str | None = None,
    endpoint: str | None = None,
    online: bool = False,
    token_env: str = DEFAULT_TOKEN_ENV,
    cache_dir: str | Path | None = None,
    config: str | None = None,
    image_column: str = "image",
    label_column: str = "label",
    mask_column: str | None = None,
    license_column: str | None = None,
    attribution_column: str | None = None,
    license: str | None = None,
    attribution: str | None = None,
    status: str | None = None,
    allow_restricted: bool = False,
    label_space: LabelSpace | str | None = None,
    splits: Sequence[str] | None = None,
    skip_unknown: bool = False,
    backgrounds: Sequence[str] | None = None,
    name: str | None = None,
    concurrency: int = 4,
    batch_size: int = 256,
    progress: ProgressFn | None = None,
) -> CollectReport:
    """Import ``source`` (see the module docstring) into the dataset at ``dataset_root``.

    ``splits``: only these splits (default: every split of the source; an unknown one is an
    error naming those it has). A new dataset takes ``label_space`` (default ImageNet-1K; ``"hub"``
    (:data:`FROM_DATASET`): the dataset's own class names, :func:`hub_label_space`) and, for a
    curate-published folder, the background vocabulary of its rows (else ``backgrounds``,
    default the CounterAnimal 14); an existing one keeps its own (a ``label_space`` that differs,
    or backgrounds it lacks, are an error). Labels outside the label space are one error naming
    them all, with suggestions, unless ``skip_unknown``: then their rows are skipped and counted
    (``collect fiftyone`` does the same). Every problem found before the first row (the source,
    the card, the columns, the splits, the classes, the labels) is raised as
    :class:`HubImportError` before the dataset is created or touched. Returns the run's
    :class:`CollectReport`; ``report.info`` holds ``source``, ``commit``, ``curate_folder``,
    ``splits`` (those imported), ``unmapped`` (label -> rows skipped) and ``unmapped_hints``
    (label -> the classes it may mean, :meth:`~curate.labels.LabelSpace.hint`).
    """
    src = resolve_source(source, revision=revision, endpoint=endpoint, online=online, token_env=token_env,
                         cache_dir=cache_dir)
    if config is not None and src.kind == "saved":
        raise HubImportError(f"--config applies to a Hub folder or repo, not to the `datasets` save {src.root}")
    card = read_card(src.root, config) if src.kind == "parquet" else CardInfo()
    tables = _tables(src, card)
    _check_against_card(card, src, tables)
    tables = _chosen_splits(tables, splits, src)
    published = is_curate_folder(tables)
    own_names = label_space == FROM_DATASET
    if isinstance(label_space, str) and not own_names:
        raise HubImportError(f"label_space {label_space!r} is neither a LabelSpace nor {FROM_DATASET!r}")
    if own_names and published:
        raise HubImportError(f"{src.describe()} is a curate-published folder: its rows carry their label space's "
                             "indices; give that label space (--label-space FILE or imagenet1k), not hub")
    if not published:
        for column in [image_column, label_column, mask_column, license_column, attribution_column]:
            if column is not None and column not in tables[0].columns:
                raise HubImportError(f"{src.describe()} has no column {column!r}; its columns: "
                                     f"{', '.join(tables[0].columns)} (name them with --image-column / --label-column "
                                     "/ --mask-column / --license-column / --attribution-column)")
    root = Path(dataset_root)
    vocabulary = backgrounds
    if published and vocabulary is None:
        vocabulary = _class_label_names(tables[0].features, "background")
    wanted = hub_label_space(tables, label_column, name or _default_name(src)) if own_names else label_space
    assert not isinstance(wanted, str)
    existing = existing_dataset(root, wanted, vocabulary)
    space = existing.label_space if existing is not None else (wanted or imagenet1k())
    mapping: dict[str, int | str] = {}
    if published:
        check_classes(tables, space)
    else:
        mapping = map_labels(sorted(label_counts(tables, label_column)), space, own_names=own_names)
        unknown = {label: why for label, why in mapping.items() if isinstance(why, str)}
        if unknown and not skip_unknown:
            raise HubImportError(unknown_labels_message(unknown, label_column, space.name, "rows",
                                                        "--label-space hub (the dataset's own class names)"))
    ds = existing if existing is not None else Dataset.create(
        root, name=name or _default_name(src), label_space=space,
        backgrounds=list(vocabulary or DEFAULT_BACKGROUNDS), recipe="hub")
    settings = _Settings(image_column, label_column, mask_column, license_column, attribution_column, license,
                         attribution, status, allow_restricted, mapping)
    identity = {"source": src.repo_id or str(src.root), "commit": src.commit, "config": card.config,
                "curate_folder": published,
                "columns": None if published else [image_column, label_column, mask_column, license_column,
                                                   attribution_column],
                "license": license, "attribution": attribution, "status": status, "allow_restricted": allow_restricted}
    # named only when used, so a job begun before these options existed keeps its identity (and resumes)
    identity.update({k: v for k, v in (("splits", sorted({t.split for t in tables}) if splits else None),
                                       ("label_space", FROM_DATASET if own_names else None),
                                       ("skip_unknown", True if skip_unknown else None)) if v is not None})
    by_split: dict[str, list[_Table]] = {}
    for table in tables:
        by_split.setdefault(table.split, []).append(table)
    with Journal(ds.root, "hub", identity) as journal:
        with Engine(ds, journal, actor="collect.hub", concurrency=concurrency, batch_size=batch_size,
                    progress=progress) as engine:
            for split, group in by_split.items():
                engine.fill(split, split, _split_stream(group, space, settings, published, src.describe()), None)
            report = engine.finish()
    report.info.update({"source": src.describe(), "commit": src.commit, "curate_folder": published,
                        "splits": list(by_split), "unmapped": dict(settings.unmapped.most_common()),
                        "unmapped_hints": {k: space.hint(k) for k in settings.unmapped}})
    entry = dict(ds.provenance.get("collect.hub") or {})
    jobs = dict(entry.get("jobs") or {})
    jobs[journal.job_id] = {**identity, "revision": src.revision, "endpoint": endpoint,
                            "journal": str(journal.path.relative_to(ds.root))}
    entry["jobs"] = jobs
    ds.record_provenance("collect.hub", entry)
    if settings.unmapped:
        log.info("%d row(s) with labels outside the label space %s skipped: %s", sum(settings.unmapped.values()),
                 space.name, ", ".join(f"{k!r} ({v})" for k, v in settings.unmapped.most_common(5)))
    return report


def _chosen_splits(tables: list[_Table], splits: Sequence[str] | None, src: HubSource) -> list[_Table]:
    """The tables of ``splits`` (all when None); a split the source lacks is a :class:`HubImportError`."""
    if not splits:
        return tables
    have = list(dict.fromkeys(t.split for t in tables))
    missing = [s for s in splits if s not in have]
    if missing:
        raise HubImportError(f"{src.describe()} has no split {', '.join(repr(s) for s in missing)}; its splits: "
                             f"{', '.join(have)}")
    return [t for t in tables if t.split in set(splits)]


def _split_stream(tables: Sequence[_Table], space: LabelSpace, settings: _Settings, published: bool,
                  origin: str) -> Iterator[StreamItem]:
    for table in tables:
        yield from (_published_stream(table, settings) if published
                    else _generic_stream(table, space, settings, origin))


def _default_name(src: HubSource) -> str:
    if src.repo_id:
        return src.repo_id.split("/", 1)[1]
    return src.root.name
