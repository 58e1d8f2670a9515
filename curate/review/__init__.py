"""People in the loop: FiftyOne views and Label Studio projects of a dataset folder.

The dataset folder stays the single source of truth (DESIGN.md); FiftyOne and Label Studio are
views of it that sync both ways:

- :mod:`curate.review.fiftyone`: push a folder into a persistent FiftyOne dataset with saved
  views for the review tasks, launch the App, pull the reviewer's tags and label edits back;
- :mod:`curate.review.labelstudio`: create a Label Studio project whose labelling config is
  generated from ``annotation/``, import tasks with model pre-labels and masks (brush RLE),
  pull annotations back (backgrounds, statuses, masks);
- :mod:`curate.review.sync`: the push snapshot (``DIR/.review/``) and the three-way pull that
  changes only edited fields, logs each change to ``changes.jsonl`` and reports conflicts;
- :mod:`curate.review.vocabulary` / :mod:`curate.review.views`: the reviewer's tag vocabulary
  and the saved views, read from ``annotation/`` (data, not code);
- :mod:`curate.review.rle`: Label Studio's brush RLE, encoded and decoded with numpy;
- :mod:`curate.review.services`: the offline MongoDB, the Label Studio server in its own virtual
  environment, headless Chromium (provisioned into a cache folder, started on 127.0.0.1).

Importing this package imports neither FiftyOne nor the Label Studio SDK; they load when a
function that needs them runs.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "TagVocabulary": "curate.review.vocabulary",
    "TagReading": "curate.review.vocabulary",
    "ViewSpec": "curate.review.views",
    "load_views": "curate.review.views",
    "PullReport": "curate.review.sync",
    "Conflict": "curate.review.sync",
    "Snapshot": "curate.review.sync",
    "ReviewError": "curate.review.sync",
    "push_fiftyone": "curate.review.fiftyone",
    "pull_fiftyone": "curate.review.fiftyone",
    "launch_app": "curate.review.fiftyone",
    "push_labelstudio": "curate.review.labelstudio",
    "pull_labelstudio": "curate.review.labelstudio",
    "labelstudio_config": "curate.review.labelstudio",
}

__all__ = [
    "Conflict",
    "PullReport",
    "ReviewError",
    "Snapshot",
    "TagReading",
    "TagVocabulary",
    "ViewSpec",
    "labelstudio_config",
    "launch_app",
    "load_views",
    "pull_fiftyone",
    "pull_labelstudio",
    "push_fiftyone",
    "push_labelstudio",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'curate.review' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
