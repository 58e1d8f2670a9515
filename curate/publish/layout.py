"""What the published Hub folder holds, shared by the folder writer and the dataset card.

The floor below :mod:`curate.publish.hub` (which writes the folder and builds the card) and
:mod:`curate.publish.card` (which describes it): file names, the ``default`` config's splits,
the published columns (:data:`COLUMN_DOCS`), and the two records both read: :class:`Selection`
(the rows to publish) and :class:`Shard` (one parquet file). It imports neither module; both
import it (``curate.publish.hub`` re-exports every name, as before).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ATTRIBUTION_FILE", "CARD_FILE", "COLUMN_DOCS", "DATA_DIR", "GROUP_NAMES", "SPLITS", "Selection", "Shard"]

ATTRIBUTION_FILE = "ATTRIBUTION.csv"
CARD_FILE = "README.md"
DATA_DIR = "data"
#: The splits of the ``default`` config, in order.
SPLITS: tuple[str, ...] = ("easy", "hard", "other")
GROUP_NAMES: tuple[str, ...] = ("easy", "hard")

#: The published columns, in order, with what each holds (the card's field table).
COLUMN_DOCS: dict[str, str] = {
    "image": "The image, its stored bytes embedded unchanged (JPEG or PNG, upright 8-bit RGB).",
    "mask": "Object mask (PNG, 0 = background, 1..255 = object / instance ids, image size), or null.",
    "sample_id": "curate's stable id: the first 16 hex digits of the image's sha256.",
    "label": "The class (ClassLabel over the published classes).",
    "class_index": "The class's index in the dataset's label space (see the card), e.g. ImageNet-1K for 1-vs-1000.",
    "class_name": "The label space's name for `class_index`.",
    "group": "easy | hard (the split, papers/003 §2.1); null in the `other` split.",
    "background": "The background label (ClassLabel over the background vocabulary), or null.",
    "background_source": "Who labelled the background: human | model | synthetic.",
    "width": "Image width in pixels.",
    "height": "Image height in pixels.",
    "sha256": "sha256 of the image bytes.",
    "source": "Where the image came from: inat | coco | folder | synthetic | ...",
    "source_id": "The image's id at its source.",
    "source_url": "URL of the original image, when there is one.",
    "license": "The image's licence (normalised code, e.g. cc-by-nc).",
    "license_as_stated": "The licence as the source states it (with its version, when given).",
    "attribution": "Who to credit, as the source states it.",
    "mask_status": "State of the mask (synthetic, coco, model, reviewed, ...).",
    "tags": "Free tags given during curation.",
    "extra": "Further per-sample fields (JSON object; location fields removed).",
}


@dataclass
class Selection:
    """The rows to publish (publication order) and what was left out, and why."""

    rows: list[dict[str, Any]]
    #: Reason -> count of rows not published (see :func:`select_rows`).
    excluded: dict[str, int] = field(default_factory=dict)
    #: Licence code -> count of rows left out for their licence.
    excluded_licences: dict[str, int] = field(default_factory=dict)

    def split_counts(self) -> dict[str, int]:
        counts = Counter(r["split"] for r in self.rows)
        return {s: counts[s] for s in SPLITS if counts[s]}


@dataclass(frozen=True)
class Shard:
    """One parquet file of a split: its rows (indices into the selection) and its repo path."""

    split: str
    index: int
    count: int
    rows: tuple[int, ...]

    @property
    def path(self) -> str:
        return f"{DATA_DIR}/{self.split}-{self.index:05d}-of-{self.count:05d}.parquet"
