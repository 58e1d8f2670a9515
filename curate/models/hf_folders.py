"""Hugging Face model folders on this machine: find them, check them, fingerprint them (offline).

Every ``transformers``-backed model curate loads (``lvlm:`` models, the mask proposers of
:mod:`curate.masks.backends`) is named by a local folder that ``save_pretrained`` wrote or by a
repo id that is already in the local Hugging Face cache. Nothing is ever downloaded: a name that
is neither is a :class:`~curate.models.base.WeightsNotFoundError` saying what to run on a machine
with internet (``hf download <repo>``).

- :func:`resolve_hf_source`: ``(folder, name, revision)`` of a folder or a cached repo;
- :func:`weights_fingerprint`: a 12-hex-digit id of a folder's config and weights files, cheap
  for gigabyte folders (first and last MiB of each weights file);
- :func:`missing_files` / :func:`require_files`: which of the files a loader needs are absent
  (processor and tokenizer files, ...), and the error naming them;
- :func:`read_config`: ``config.json`` as a dict;
- :func:`quiet_transformers`: no "Loading weights" progress bars while loading;
- :func:`precision_dtype`: the torch dtype weights are cast to for a precision.

This module imports torch and transformers only inside the functions that need them.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from curate.models.base import WeightsNotFoundError

__all__ = ["WEIGHT_GLOBS", "resolve_hf_source", "weights_fingerprint", "missing_files", "require_files",
           "read_config", "quiet_transformers", "precision_dtype"]

#: The weights files a folder may hold (safetensors or PyTorch pickles, whole or sharded).
WEIGHT_GLOBS: tuple[str, ...] = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


def resolve_hf_source(path_or_repo: str | Path, *, flag: str = "--model lvlm:PATH") -> tuple[Path, str, str | None]:
    """``(folder, name, revision)`` of a local folder or of a repo in the local HF cache.

    ``name`` is the folder's name or the repo id; ``revision`` the cache snapshot's commit (None
    for a local folder). ``flag`` is how the user names such a folder (used in the messages).

    Raises:
        WeightsNotFoundError: the path is not a folder with a ``config.json``, or the repo id is
            not in the local cache; the message says where curate looked and what to do.
    """
    text = str(path_or_repo)
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise WeightsNotFoundError(f"{path} is not a Hugging Face model folder (no config.json in it); point "
                                       f"{flag} at the folder save_pretrained wrote (or `hf download` made)",
                                       missing=["config.json"], searched=[str(path)])
        return path, path.name, None
    looks_local = text.startswith((".", "/", "~")) or text.count("/") != 1
    from huggingface_hub import constants

    if looks_local:
        raise WeightsNotFoundError(f"no model folder at {path}; curate never downloads weights: copy the model "
                                   f"folder there, or give a Hugging Face repo id (org/name) that is in the local "
                                   f"cache ({constants.HF_HUB_CACHE})", missing=[str(path)], searched=[str(path)])
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(text, "config.json")
    if not isinstance(found, str):
        raise WeightsNotFoundError(
            f"{text!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and curate never downloads "
            f"weights: on a machine with internet run `hf download {text}` (set HF_HOME to choose the cache), "
            f"or pass {flag.replace('PATH', '/path/to/the/model/folder')}", missing=[f"{text}/config.json"],
            searched=[constants.HF_HUB_CACHE])
    folder = Path(found).parent
    return folder, text, folder.name  # snapshots/<commit sha>/


def weights_fingerprint(folder: Path) -> str:
    """A stable id of a local folder's weights without reading gigabytes: sha256 over config.json and,
    per weights file, its name, size and first and last MiB (sha256 prefix, 12 hex digits).

    Raises:
        WeightsNotFoundError: the folder has a config.json but no weights file.
    """
    folder = Path(folder)
    digest = hashlib.sha256((folder / "config.json").read_bytes())
    files = sorted({p for pattern in WEIGHT_GLOBS for p in folder.glob(pattern)})
    if not files:
        raise WeightsNotFoundError(f"{folder} has a config.json but no weights (*.safetensors / *.bin); copy the "
                                   "whole model folder", missing=["model.safetensors"], searched=[str(folder)])
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with open(file, "rb") as fh:
            digest.update(fh.read(1 << 20))
            if size > 2 << 20:
                fh.seek(-(1 << 20), 2)
                digest.update(fh.read())
    return digest.hexdigest()[:12]


def missing_files(folder: Path, groups: Sequence[Sequence[str]]) -> list[str]:
    """The groups of ``groups`` none of whose files is in ``folder``, each written ``a or b``.

    A group lists alternatives: ``[("preprocessor_config.json", "processor_config.json")]`` is
    satisfied by either file.
    """
    folder = Path(folder)
    return [" or ".join(group) for group in groups if not any((folder / name).is_file() for name in group)]


def require_files(folder: Path, groups: Sequence[Sequence[str]], *, what: str, flag: str) -> None:
    """Raise :class:`WeightsNotFoundError` naming every group of :func:`missing_files`.

    ``what`` says what the files are for (``"the CLIPSeg processor and tokenizer"``), ``flag`` how the
    user names the folder.
    """
    missing = missing_files(folder, groups)
    if missing:
        raise WeightsNotFoundError(
            f"{folder} lacks {what}: missing {'; '.join(missing)}. Copy the whole model folder (config, weights, "
            f"processor and tokenizer files, as `hf download` or save_pretrained of both the model and its processor "
            f"write them) and point {flag} at it", missing=missing, searched=[str(folder)])


def read_config(folder: Path) -> dict[str, Any]:
    """``config.json`` of a model folder as a dict (``{}`` when it is not a JSON object)."""
    try:
        data = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No "Loading weights" progress bars from transformers while we load (state restored)."""
    from transformers.utils import logging as tlog

    enabled = tlog.is_progress_bar_enabled()
    tlog.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            tlog.enable_progress_bar()


def precision_dtype(precision: str) -> Any:
    """The torch dtype weights load in: ``fp16`` -> float16, ``bf16`` -> bfloat16, else float32
    (``amp`` / ``amp_bf16`` keep float32 weights and run under autocast)."""
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
