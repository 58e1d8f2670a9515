"""Where curate's data files live.

Two folders of the repository hold data, not code: ``datasets/`` (recipes, vocabularies, the
model zoo, the ImageNet-1K label names) and ``annotation/`` (the review configurations). They
stay at the top of the source tree, which is their one source of truth (``datasets/`` holds no
Python, so it can never shadow Hugging Face ``datasets``). A built wheel carries a copy of both,
made at build time by ``setup.py``, as package data under ``curate/_data/<folder>/``.

A lookup of ``<folder>`` takes, in order:

1. the environment override (``CURATE_DATA_DIR`` for ``datasets/``, ``CURATE_ANNOTATION_DIR``
   for ``annotation/``), when set;
2. the installed package data, ``importlib.resources.files("curate") / "_data" / <folder>``
   (a wheel or ``pip install .``);
3. the source tree, ``<repo>/<folder>`` beside the package, recognised by the
   ``pyproject.toml`` beside it (an editable install, or running from a checkout). The check
   matters: in an installed copy the folder beside the package is ``site-packages`` itself,
   where ``datasets/`` is Hugging Face's package.

All of them return a real :class:`pathlib.Path`. curate does not run from a zip archive: a
zipped install gets an error that says so and names the override.
"""
from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
PACKAGE_DATA = "_data"
"""The folder of the installed package that holds the build-time copies (``curate/_data/``)."""
DATA_FOLDERS = ("datasets", "annotation")
"""The top-level folders of the source tree that are shipped in the wheel."""


def packaged_dir(folder: str) -> Path | None:
    """``curate/_data/<folder>`` of the installed package, or None when it has no such copy.

    Raises :class:`RuntimeError` when curate is imported from a zip archive, where package data
    are not files on disk.
    """
    root = files("curate")
    if isinstance(root, Path):  # a normal install: the package is a folder on disk
        path = root / PACKAGE_DATA / folder
        return path if path.is_dir() else None
    raise RuntimeError(
        f"curate is installed as a zip archive ({root}); its data files must be real files. "
        "Install it unzipped (pip install curate), or set CURATE_DATA_DIR / "
        "CURATE_ANNOTATION_DIR to copies of its datasets/ and annotation/ folders"
    )


def source_tree_dir(folder: str) -> Path | None:
    """``<repo>/<folder>`` when curate runs from its source tree, else None."""
    path = REPO_DIR / folder
    return path if (REPO_DIR / "pyproject.toml").is_file() and path.is_dir() else None


def source_dir(folder: str, env: str) -> Path:
    """A data folder of curate (``datasets``, ``annotation``): ``$env``, the package's copy, or the source tree.

    Args:
        folder: the folder's name at the top of the source tree.
        env: the environment variable that overrides it (a folder path).

    Raises :class:`FileNotFoundError` naming every place looked at when none has it.
    """
    override = os.environ.get(env)
    if override:
        path = Path(override).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"{env}={override} is not a folder; point it to a copy of curate's {folder}/ "
                                    f"folder, or unset it to use the copy installed with curate")
        return path
    path = packaged_dir(folder) or source_tree_dir(folder)
    if path is None:
        raise FileNotFoundError(
            f"curate's {folder} folder is missing: neither the installed package "
            f"({PACKAGE_DIR / PACKAGE_DATA / folder}) nor a source tree ({REPO_DIR / folder}) has it. "
            f"Reinstall curate from a wheel or its source tree (pip install . or pip install -e .), "
            f"or set {env} to a copy of its {folder}/ folder"
        )
    return path


def data_dir() -> Path:
    """The folder holding curate's shipped data (``datasets/``; ``CURATE_DATA_DIR`` overrides it)."""
    return source_dir("datasets", "CURATE_DATA_DIR")


def data_file(*parts: str) -> Path:
    """A file under :func:`data_dir`, with a clear error when it is missing."""
    folder = data_dir()
    path = folder.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"curate data file {path} is missing from {folder}")
    return path
