"""The model zoo: the CounterAnimal paper's checkpoint names -> open_clip (model, pretrained tag).

Read from ``datasets/zoo.yaml`` (Table 6 and App. C.5 of the paper; QuickGELU weights map to
the ``-quickgelu`` architectures, see the comments in that file). Names match exactly first,
then case-insensitively; ``/`` and ``-`` are kept as written (``"CLIP-OpenAI-ViT-B/32"``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from curate.models.base import ModelNotFoundError, close_matches
from curate.paths import data_file

ZOO_FILE = "zoo.yaml"


class ZooEntry(NamedTuple):
    """An open_clip (architecture, pretrained tag) pair; unpacks as ``model, pretrained``."""

    model: str
    pretrained: str


@functools.lru_cache(maxsize=8)
def _read_zoo(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise ValueError(
            f"{path}: expected a mapping with a 'models:' mapping of name -> {{model, pretrained}}"
        )
    if doc.get("kind", "open_clip") != "open_clip":
        raise ValueError(f"{path}: kind {doc.get('kind')!r} is not supported (only 'open_clip')")
    for name, entry in doc["models"].items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("model"), str)
            or not isinstance(entry.get("pretrained"), str)
        ):
            raise ValueError(
                f"{path}: zoo entry {name!r} must be {{model: <arch>, pretrained: <tag>}}, got {entry!r}"
            )
    return doc


def _zoo_doc(path: str | Path | None = None) -> dict[str, Any]:
    return _read_zoo(str(Path(path) if path is not None else data_file(ZOO_FILE)))


def load_zoo(path: str | Path | None = None) -> dict[str, ZooEntry]:
    """All zoo entries, paper name -> :class:`ZooEntry`, in file order."""
    return {name: ZooEntry(e["model"], e["pretrained"]) for name, e in _zoo_doc(path)["models"].items()}


def zoo_names(path: str | Path | None = None) -> list[str]:
    """The paper's checkpoint names known to the zoo."""
    return list(load_zoo(path))


def find_zoo_entry(name: str, path: str | Path | None = None) -> ZooEntry | None:
    """The entry for ``name`` (exact, then case-insensitive match), or ``None``."""
    zoo = load_zoo(path)
    if name in zoo:
        return zoo[name]
    lowered = {k.lower(): v for k, v in zoo.items()}
    return lowered.get(name.lower())


def resolve_zoo_name(name: str, path: str | Path | None = None) -> ZooEntry:
    """Map a paper name (``"CLIP-LAION400M-ViT-B/32"``) to open_clip ``(model, pretrained)``.

    Raises:
        ModelNotFoundError: the name is not in the zoo (close matches are suggested).
    """
    entry = find_zoo_entry(name, path)
    if entry is None:
        raise ModelNotFoundError(
            f"{name!r} is not in curate's model zoo ({data_file(ZOO_FILE) if path is None else path})",
            close_matches(name, load_zoo(path)),
        )
    return entry


def paper_name(model: str, pretrained: str, path: str | Path | None = None) -> str | None:
    """The zoo's paper name for an open_clip ``(model, pretrained)`` pair, if it has one."""
    for name, entry in load_zoo(path).items():
        if entry.model == model and entry.pretrained == pretrained:
            return name
    return None


def reference_results(path: str | Path | None = None) -> dict[str, dict[str, float]]:
    """The paper's Table 2 numbers (1-vs-1000 balanced accuracy %: easy, hard, drop) by zoo name."""
    return dict(_zoo_doc(path).get("reference_results_1v1000") or {})
