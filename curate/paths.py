"""Where curate's data files live.

``datasets/`` (recipes, vocabularies, the model zoo) sits beside the package in the source
tree; it holds no Python so it can never shadow Hugging Face ``datasets``. An installed copy
can point elsewhere with ``CURATE_DATA_DIR``.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent


def source_dir(folder: str, env: str) -> Path:
    """A data folder of the source tree (``datasets/``, ``annotation/``), or ``$env`` when set."""
    override = os.environ.get(env)
    path = Path(override) if override else REPO_DIR / folder
    if not path.is_dir():
        raise FileNotFoundError(
            f"curate's {folder} folder {path} does not exist; install curate from its source tree "
            f"(pip install -e .) or set {env} to a copy of its {folder}/ folder"
        )
    return path


def data_dir() -> Path:
    """The folder holding curate's shipped data (``datasets/`` of the source tree)."""
    return source_dir("datasets", "CURATE_DATA_DIR")


def data_file(*parts: str) -> Path:
    """A file under :func:`data_dir`, with a clear error when it is missing."""
    path = data_dir().joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"curate data file {path} is missing from {data_dir()}")
    return path
