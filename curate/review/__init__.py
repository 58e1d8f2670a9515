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
- :mod:`curate.review.database`: at run time, the database FiftyOne talks to (its bundled one, or
  the offline MongoDB) and the Label Studio server, started and stopped on 127.0.0.1;
- :mod:`curate.review.provision`: for tests and CI, the offline MongoDB binaries, Label Studio's own
  virtual environment and headless Chromium, provisioned into ``.services/``.

Importing this package imports neither FiftyOne nor the Label Studio SDK; they load when a
function that needs them runs.
"""
from __future__ import annotations

from curate.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
