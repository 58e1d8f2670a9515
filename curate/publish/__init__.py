"""Publish a dataset folder to the Hugging Face Hub (and through FiftyOne's Hub integration).

- :mod:`curate.publish.hub`: the Hub-native folder (parquet shards with embedded images and
  masks, ``ClassLabel`` columns, one split per group) — :func:`write_hub_folder`;
- :mod:`curate.publish.card`: the dataset card (``README.md`` via huggingface_hub's ``DatasetCard``);
- :mod:`curate.licenses`: which images may be published, and the card's licence;
- :mod:`curate.publish.upload`: ``HfApi`` upload in bounded, resumable batches —
  :func:`publish_to_hub`, :func:`upload_hub_folder`;
- :mod:`curate.publish.fiftyone_hub`: ``--format fiftyone`` — :func:`publish_fiftyone`.

::

    from curate.publish import write_hub_folder, publish_to_hub
    folder = write_hub_folder("world", "world-hub")          # then datasets.load_dataset("world-hub")
    publish_to_hub("world", "alice/world")                   # token from $HF_TOKEN

Hugging Face ``datasets`` and ``huggingface_hub`` are imported only when needed (curate's
``hub`` extra).
"""
from __future__ import annotations

from curate.licenses import (
    PUBLISHABLE,
    CardLicence,
    card_licence,
    classify_licence,
)
from curate.publish.fiftyone_hub import FiftyOnePublishResult, publish_fiftyone
from curate.publish.hub import (
    ATTRIBUTION_FILE,
    CARD_FILE,
    COLUMN_DOCS,
    HubFolder,
    PublishError,
    Selection,
    hub_features,
    select_rows,
    write_hub_folder,
)
from curate.publish.upload import (
    DEFAULT_TOKEN_ENV,
    PublishResult,
    UploadPlan,
    UploadResult,
    publish_to_hub,
    read_token,
    staging_paths,
    upload_hub_folder,
)

__all__ = [
    "ATTRIBUTION_FILE",
    "CARD_FILE",
    "COLUMN_DOCS",
    "CardLicence",
    "DEFAULT_TOKEN_ENV",
    "FiftyOnePublishResult",
    "HubFolder",
    "PUBLISHABLE",
    "PublishError",
    "PublishResult",
    "Selection",
    "UploadPlan",
    "UploadResult",
    "card_licence",
    "classify_licence",
    "hub_features",
    "publish_fiftyone",
    "publish_to_hub",
    "read_token",
    "select_rows",
    "staging_paths",
    "upload_hub_folder",
    "write_hub_folder",
]
