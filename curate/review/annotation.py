"""Where the review configurations live: ``annotation/`` of the source tree (data, not code).

``annotation/`` holds the tag vocabulary (``tags.yaml``), the saved views (``views.yaml``), the
reviewer guideline (``guideline.md``) and the Label Studio config template
(``labelstudio.xml``). An installed copy of curate can point elsewhere with
``CURATE_ANNOTATION_DIR``.
"""
from __future__ import annotations

from pathlib import Path

from curate.paths import source_dir

TAGS_FILE = "tags.yaml"
VIEWS_FILE = "views.yaml"
GUIDELINE_FILE = "guideline.md"
LABELSTUDIO_TEMPLATE = "labelstudio.xml"


def annotation_dir() -> Path:
    """The folder holding curate's review configurations."""
    return source_dir("annotation", "CURATE_ANNOTATION_DIR")


def annotation_file(name: str) -> Path:
    """A file of :func:`annotation_dir`, with a clear error when it is missing."""
    path = annotation_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"curate annotation file {path} is missing from {annotation_dir()}")
    return path


def guideline_text() -> str:
    """The reviewer guideline (Markdown)."""
    return annotation_file(GUIDELINE_FILE).read_text(encoding="utf-8")
