"""Where the review configurations live: ``annotation/`` of the source tree (data, not code).

``annotation/`` holds the tag vocabulary (``tags.yaml``), the saved views (``views.yaml``), the
reviewer guideline (``guideline.md``) and the Label Studio config template
(``labelstudio.xml``). An installed copy of curate can point elsewhere with
``CURATE_ANNOTATION_DIR``.
"""
from __future__ import annotations

import os
from pathlib import Path

from curate.paths import REPO_DIR

TAGS_FILE = "tags.yaml"
VIEWS_FILE = "views.yaml"
GUIDELINE_FILE = "guideline.md"
LABELSTUDIO_TEMPLATE = "labelstudio.xml"


def annotation_dir() -> Path:
    """The folder holding curate's review configurations."""
    override = os.environ.get("CURATE_ANNOTATION_DIR")
    path = Path(override) if override else REPO_DIR / "annotation"
    if not path.is_dir():
        raise FileNotFoundError(
            f"curate's annotation folder {path} does not exist; install curate from its source tree "
            "(pip install -e .) or set CURATE_ANNOTATION_DIR to a copy of its annotation/ folder"
        )
    return path


def annotation_file(name: str) -> Path:
    """A file of :func:`annotation_dir`, with a clear error when it is missing."""
    path = annotation_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"curate annotation file {path} is missing from {annotation_dir()}")
    return path


def guideline_text() -> str:
    """The reviewer guideline (Markdown)."""
    return annotation_file(GUIDELINE_FILE).read_text(encoding="utf-8")
