"""The layout of a dataset folder's annotation table and its checks (issue 44; the table's
reader and writer: :mod:`curate.store.annotations`, whose docstring says what each field means).

Kept apart from the writer so that :mod:`curate.store.validate` can check the table without
importing the writer (which imports the change log, which imports validate).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from curate.store.images import ImageRejected, decode

#: The table's file name in the dataset folder.
ANNOTATIONS_FILE = "annotations.parquet"
#: Where annotation masks live (relative to the folder).
ANNOTATION_MASKS_DIR = "annotations/masks"
#: Version of the table's layout (parquet metadata key ``curate.annotations_version``).
ANNOTATIONS_VERSION = 1
VERSION_KEY = b"curate.annotations_version"

BACKENDS: tuple[str, ...] = ("labelstudio", "fiftyone", "simulated", "import")
ROLES: tuple[str, ...] = ("annotator", "adjudicator")
STATES: tuple[str, ...] = ("current", "changed", "deleted")
#: At most this many backgrounds per answer (a photo that shows two).
MAX_BACKGROUNDS = 2

ANNOTATION_SCHEMA = pa.schema([
    pa.field("annotation_id", pa.string(), nullable=False),
    pa.field("version", pa.int32(), nullable=False),
    pa.field("state", pa.string(), nullable=False),
    pa.field("sample_id", pa.string(), nullable=False),
    pa.field("annotator", pa.string(), nullable=False),
    pa.field("backend", pa.string(), nullable=False),
    pa.field("backgrounds", pa.list_(pa.string()), nullable=False),
    pa.field("mask", pa.string(), nullable=True),
    pa.field("mask_sha256", pa.string(), nullable=True),
    pa.field("created_at", pa.string(), nullable=False),
    pa.field("updated_at", pa.string(), nullable=False),
    pa.field("role", pa.string(), nullable=False),
    pa.field("is_gold", pa.bool_(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("recorded_at", pa.string(), nullable=False),
    pa.field("actor", pa.string(), nullable=False),
], metadata={VERSION_KEY: str(ANNOTATIONS_VERSION).encode()})

#: A stored mask's name: ``<safe id>.v<version>.png`` (no path, no run of dots).
MASK_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*\.v[0-9]+\.png$")


def annotation_problems(root: Path, backgrounds: Sequence[str] | None, sample_ids: Iterable[str], *,
                        deep: bool = False) -> list[tuple[str, str]]:
    """(severity, message) of everything wrong with the folder's annotation table ([] when absent).

    Errors: unreadable file; a column missing or of another type; an empty id, annotator or
    source; (annotation_id, version) repeated; more than one "current" version of an id; a
    state, role or backend outside its list; a background outside the vocabulary or more than
    :data:`MAX_BACKGROUNDS`; an unknown sample id; a mask path outside ``annotations/masks/`` or
    missing (``deep``: one that does not decode). Warning: a mask file no row names (an upsert
    killed before its commit leaves one; harmless)."""
    path = Path(root) / ANNOTATIONS_FILE
    if not path.is_file():
        return []
    out: list[tuple[str, str]] = []
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - arrow raises several types for bad files
        return [("error", f"{ANNOTATIONS_FILE} cannot be read as parquet: {exc}")]
    for spec in ANNOTATION_SCHEMA:
        if spec.name not in table.column_names:
            out.append(("error", f"{ANNOTATIONS_FILE}: column '{spec.name}' ({spec.type}) is missing"))
        elif not table.schema.field(spec.name).type.equals(spec.type) and not (
                pa.types.is_large_string(table.schema.field(spec.name).type) and pa.types.is_string(spec.type)):
            out.append(("error", f"{ANNOTATIONS_FILE}: column '{spec.name}' has type "
                                 f"{table.schema.field(spec.name).type}, expected {spec.type}"))
    if out:
        return out
    vocabulary = set(backgrounds) if backgrounds is not None else None
    known = set(sample_ids)
    seen: set[tuple[str, int]] = set()
    current: set[str] = set()
    named_masks: set[str] = set()
    for number, row in enumerate(_rows(table)):
        aid = row["annotation_id"]
        where = f"{ANNOTATIONS_FILE} row {number} ({aid!r})"
        for name in ("annotation_id", "annotator", "source", "sample_id"):
            if not row[name]:
                out.append(("error", f"{where}: {name} is empty"))
        key = (aid, row["version"])
        if key in seen:
            out.append(("error", f"{where}: version {row['version']} repeats"))
        seen.add(key)
        if row["state"] == "current":
            if aid in current:
                out.append(("error", f"{where}: a second 'current' version"))
            current.add(aid)
        for name, allowed in (("state", STATES), ("role", ROLES), ("backend", BACKENDS)):
            if row[name] not in allowed:
                out.append(("error", f"{where}: {name} {row[name]!r} is not one of {', '.join(allowed)}"))
        chosen = row["backgrounds"] or []
        bad = [b for b in chosen if vocabulary is not None and b not in vocabulary]
        if bad:
            out.append(("error", f"{where}: background(s) {', '.join(map(repr, bad))} not in the vocabulary"))
        if len(chosen) > MAX_BACKGROUNDS or len(set(chosen)) != len(chosen):
            out.append(("error", f"{where}: backgrounds {chosen} must be 0 to {MAX_BACKGROUNDS} distinct labels"))
        if row["sample_id"] and row["sample_id"] not in known:
            out.append(("error", f"{where}: unknown sample id {row['sample_id']!r}"))
        if row["mask"] is not None:
            out.extend(_mask_problems(Path(root), row["mask"], where, deep))
            named_masks.add(row["mask"])
    masks_dir = Path(root) / ANNOTATION_MASKS_DIR
    if masks_dir.is_dir():
        orphans = sorted(p.name for p in masks_dir.iterdir() if f"{ANNOTATION_MASKS_DIR}/{p.name}" not in named_masks)
        if orphans:
            out.append(("warning", f"{ANNOTATION_MASKS_DIR}: {len(orphans)} mask file(s) no annotation names "
                                   f"(an interrupted write?), e.g. {orphans[0]}"))
    return out


def _rows(table: pa.Table) -> Iterable[dict]:
    """The table's rows as dicts, built column-wise (``Table.to_pylist`` costs about twice as much)."""
    names = table.column_names
    for values in zip(*(table.column(n).to_pylist() for n in names)):
        yield dict(zip(names, values))


def _mask_problems(root: Path, rel: str, where: str, deep: bool) -> list[tuple[str, str]]:
    folder, _, name = rel.rpartition("/")
    if folder != ANNOTATION_MASKS_DIR or not MASK_NAME.match(name):
        return [("error", f"{where}: mask {rel!r} is not a file name under {ANNOTATION_MASKS_DIR}/")]
    if not (root / rel).is_file():
        return [("error", f"{where}: mask file {rel} is missing")]
    if deep:
        try:
            decode((root / rel).read_bytes())
        except (OSError, ImageRejected) as exc:
            return [("error", f"{where}: mask file {rel} does not decode: {exc}")]
    return []


#: Where each photo's background came from, once derived from the annotations (issue 44):
#: ``label_status.parquet``, one row per photo of the annotation table. A folder without it (every
#: folder from before issue 44, and any never labelled by several people) has one person's or a
#: collector's label per photo, as before: readers treat it as "no status recorded".
LABEL_STATUS_FILE = "label_status.parquet"
#: agreed (the rule's label, two answers or more), adjudicated (an adjudicator's answer), disputed
#: (below the rule's threshold, or a tie: no label), single (one answer: that answer), unlabelled
#: (every answer skipped: no label). See curate.agreement.aggregate.
LABEL_STATUSES: tuple[str, ...] = ("agreed", "adjudicated", "disputed", "single", "unlabelled")
#: The statuses whose photos carry a background (the others leave ``background`` null).
LABELLED_STATUSES: tuple[str, ...] = ("agreed", "adjudicated", "single")

LABEL_STATUS_SCHEMA = pa.schema([
    pa.field("sample_id", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("background", pa.string(), nullable=True),
    pa.field("candidate", pa.string(), nullable=True),  # the rule's best guess on a disputed photo
    pa.field("confidence", pa.float64(), nullable=True),
    pa.field("n_answers", pa.int32(), nullable=False),
    pa.field("rule", pa.string(), nullable=False),
    pa.field("threshold", pa.float64(), nullable=False),
    pa.field("derived_at", pa.string(), nullable=False),
])


def label_status_problems(root: Path, backgrounds: Sequence[str] | None, sample_background: dict[str, str | None]
                          ) -> list[tuple[str, str]]:
    """(severity, message) of what is wrong with ``label_status.parquet`` ([] when absent).

    Errors: unreadable; a column missing or mistyped; a sample id repeated or unknown (not a key of
    ``sample_background``: sample_id -> the folder's background); a status outside
    :data:`LABEL_STATUSES`; a background outside the vocabulary, or set on a disputed/unlabelled
    photo, or missing on a labelled one. Warning: a labelled photo whose folder background differs
    (a derivation interrupted between its two writes, or a hand edit since: ``curate agreement``
    derives it again)."""
    path = Path(root) / LABEL_STATUS_FILE
    if not path.is_file():
        return []
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - arrow raises several types for bad files
        return [("error", f"{LABEL_STATUS_FILE} cannot be read as parquet: {exc}")]
    missing = [f"'{f.name}' ({f.type})" for f in LABEL_STATUS_SCHEMA
               if f.name not in table.column_names or not table.schema.field(f.name).type.equals(f.type)]
    if missing:
        return [("error", f"{LABEL_STATUS_FILE}: column(s) {', '.join(missing)} missing or of another type")]
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    differ: list[str] = []
    vocabulary = set(backgrounds) if backgrounds is not None else None
    for number, row in enumerate(table.to_pylist()):
        sid, status, background = row["sample_id"], row["status"], row["background"]
        where = f"{LABEL_STATUS_FILE} row {number} (sample {sid})"
        if sid in seen:
            out.append(("error", f"{where}: the sample repeats"))
        seen.add(sid)
        if sid not in sample_background:
            out.append(("error", f"{where}: unknown sample id"))
        if status not in LABEL_STATUSES:
            out.append(("error", f"{where}: status {status!r} is not one of {', '.join(LABEL_STATUSES)}"))
            continue
        if status in LABELLED_STATUSES and background is None:
            out.append(("error", f"{where}: status {status} without a background"))
        elif status not in LABELLED_STATUSES and background is not None:
            out.append(("error", f"{where}: status {status} but background {background!r} (it has none)"))
        if background is not None and vocabulary is not None and background not in vocabulary:
            out.append(("error", f"{where}: background {background!r} is not in the vocabulary"))
        if sid in sample_background and sample_background[sid] != background:
            differ.append(sid)
    if differ:
        out.append(("warning", f"{LABEL_STATUS_FILE}: {len(differ)} photo(s) whose background in samples.parquet "
                               f"differs from the derived one (e.g. {differ[0]}); run `curate agreement` again"))
    return out
