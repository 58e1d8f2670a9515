"""Finding pretrained weights on disk, offline, and reading weight files.

curate never downloads weights (DESIGN.md, "Models"). A pretrained tag resolves to the file
open_clip or timm *would* download, looked up where those libraries keep it:

1. the Hugging Face hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
   ``~/.cache/huggingface/hub``), through ``huggingface_hub.try_to_load_from_cache`` (the
   ``.safetensors`` alternative first, as open_clip and timm prefer it);
2. curate's own weights folder (``CURATE_WEIGHTS_DIR``, else ``~/.cache/curate/weights``), laid
   out as ``<hf repo id>/<filename>`` (what ``hf download REPO FILE --local-dir
   <dir>/<REPO>`` writes) or ``<url basename>``;
3. the library's URL cache: ``~/.cache/clip/<url basename>`` for open_clip,
   ``<torch hub dir>/checkpoints/<url basename>`` for timm.

If none holds the file, :class:`WeightsNotFoundError` says which file is missing and where to
put it, immediately: no network call is ever made (``hf_hub_download`` is never called, and
:func:`hub_offline` forces ``HF_HUB_OFFLINE`` while models are built, so library code that
would reach the Hub fails fast instead of hanging).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickle
import warnings
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from curate.models.base import ModelError, WeightsNotFoundError

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)

#: Suffixes of weight files a ``pretrained`` string may name.
WEIGHT_SUFFIXES: tuple[str, ...] = (".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".npz")


# ----------------------------------------------------------------------------- offline mode
@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Force Hugging Face hub offline mode (env var and the already-imported constant).

    ``huggingface_hub`` reads ``HF_HUB_OFFLINE`` once at import, so the module constant is set
    too; both are restored on exit (curate's publish stage talks to the Hub legitimately).
    """
    old_env = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants: Any = None
    old_const = None
    try:
        import huggingface_hub.constants as constants

        old_const = constants.HF_HUB_OFFLINE
        constants.HF_HUB_OFFLINE = True
    except ImportError:  # pragma: no cover - huggingface_hub is an open_clip dependency
        constants = None
    try:
        yield
    finally:
        if constants is not None:
            constants.HF_HUB_OFFLINE = old_const
        if old_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old_env


# ----------------------------------------------------------------------------- where to look
def hf_hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    try:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover
        return Path("~/.cache/huggingface/hub").expanduser()


def curate_weights_dir() -> Path:
    """curate's own weights folder: ``CURATE_WEIGHTS_DIR`` or ``~/.cache/curate/weights``."""
    return Path(os.environ.get("CURATE_WEIGHTS_DIR") or "~/.cache/curate/weights").expanduser()


def open_clip_url_cache_dir() -> Path:
    """Where ``open_clip.download_pretrained_from_url`` saves files (its default cache_dir)."""
    return Path("~/.cache/clip").expanduser()


def torch_hub_checkpoints_dir() -> Path:
    """Where timm's URL weights go: ``torch.hub.get_dir()/checkpoints`` (honours TORCH_HOME)."""
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints"


def looks_like_path(value: str) -> bool:
    """Whether a ``pretrained`` string names a file rather than a tag."""
    return (
        os.sep in value
        or "/" in value
        or value.startswith(("~", "."))
        or value.lower().endswith(WEIGHT_SUFFIXES)
    )


def safe_alternatives(filename: str, default_bin: str, default_safe: str) -> list[str]:
    """``filename`` preceded by its ``.safetensors`` twin, the order open_clip and timm use."""
    if filename == default_bin:
        return [default_safe, filename]
    if filename.endswith((".bin", ".pth")):
        return [filename[:-4] + ".safetensors", filename]
    return [filename]


@dataclass
class WeightsSource:
    """Where a pretrained tag's file comes from: a Hub repo and/or a URL.

    ``hf_filenames`` are tried in order (safetensors first); ``url_dirs`` are the folders in
    which a URL download would have been saved.
    """

    label: str
    hf_repo: str = ""
    hf_revision: str | None = None
    hf_filenames: list[str] = field(default_factory=list)
    url: str = ""
    url_dirs: list[Path] = field(default_factory=list)

    @property
    def url_filename(self) -> str:
        return os.path.basename(urlparse(self.url).path) if self.url else ""


def _find_in_hf_cache(repo: str, filename: str, revision: str | None) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    cache = hf_hub_cache_dir()
    hit = try_to_load_from_cache(repo, filename, cache_dir=str(cache), revision=revision)
    if isinstance(hit, str) and os.path.isfile(hit):
        return Path(hit)
    if revision is None:
        # a copied cache may lack refs/main: accept the newest snapshot holding the file
        snapshots = cache / f"models--{repo.replace('/', '--')}" / "snapshots"
        if snapshots.is_dir():
            files = [p / filename for p in snapshots.iterdir() if (p / filename).is_file()]
            if files:
                return max(files, key=lambda p: p.stat().st_mtime)
    return None


def find_weights(source: WeightsSource) -> tuple[Path | None, list[str]]:
    """Look for ``source`` on disk. Returns (path or None, descriptions of places searched)."""
    searched: list[str] = []
    local = curate_weights_dir()
    if source.hf_repo:
        searched.append(
            f"Hugging Face cache {hf_hub_cache_dir()}: repo {source.hf_repo}, file "
            + " or ".join(source.hf_filenames)
        )
        for fn in source.hf_filenames:
            hit = _find_in_hf_cache(source.hf_repo, fn, source.hf_revision)
            if hit is not None:
                return hit, searched
        for fn in source.hf_filenames:
            cand = local / source.hf_repo / fn
            searched.append(str(cand))
            if cand.is_file():
                return cand, searched
    if source.url:
        for folder in [local, *source.url_dirs]:
            cand = folder / source.url_filename
            searched.append(str(cand))
            if cand.is_file():
                return cand, searched
    return None, searched


def resolve_weights(source: WeightsSource) -> Path:
    """The file on disk for ``source``, or :class:`WeightsNotFoundError` at once (no network)."""
    path, searched = find_weights(source)
    if path is not None:
        log.info("weights for %s: %s", source.label, path)
        return path
    missing = list(source.hf_filenames[-1:]) if source.hf_repo else []
    if source.url:
        missing.append(source.url_filename)
    local = curate_weights_dir()
    fixes: list[str] = []
    if source.hf_repo:
        fn = source.hf_filenames[-1]
        fixes.append(f"hf download {source.hf_repo} {fn} --local-dir {local / source.hf_repo}")
        fixes.append(f"copy a Hugging Face cache that holds it to {hf_hub_cache_dir()}")
    if source.url:
        where = source.url_dirs[0] if source.url_dirs else local
        fixes.append(f"download {source.url} into {where}/ (or {local}/)")
    fixes.append('pass the file itself: load_model(name, pretrained="/path/to/weights")')
    headline = (f"weights for {source.label} are not on this machine ({' / '.join(missing) or 'no file'} missing); "
                "curate never downloads weights")
    details = ["looked in:", *(f"  - {place}" for place in searched),
               "to fix, on a machine with internet, either:", *(f"  - {fix}" for fix in fixes)]
    raise WeightsNotFoundError(headline, missing=missing, searched=searched, details=details)


def open_clip_weights_source(arch: str, tag: str, cfg: Mapping[str, Any]) -> WeightsSource:
    """The file ``open_clip.download_pretrained`` would fetch for ``(arch, tag)``.

    open_clip prefers ``hf_hub`` (``"org/repo/"`` -> ``open_clip_pytorch_model.bin``, or
    ``"org/repo/file"``; a ``.safetensors`` twin first) and falls back to ``url``.
    """
    from open_clip.constants import HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME

    src = WeightsSource(label=f"open_clip {arch}:{tag}", url_dirs=[open_clip_url_cache_dir()])
    hub = cfg.get("hf_hub") or ""
    if hub:
        repo, filename = os.path.split(hub)
        src.hf_repo = repo
        src.hf_filenames = safe_alternatives(
            filename or HF_WEIGHTS_NAME, HF_WEIGHTS_NAME, HF_SAFE_WEIGHTS_NAME
        )
    src.url = cfg.get("url") or ""
    return src


def timm_weights_source(name: str, cfg: Mapping[str, Any]) -> WeightsSource:
    """The file timm's ``load_pretrained`` would fetch for a pretrained cfg (hub, then URL)."""
    from timm.models._hub import HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME

    src = WeightsSource(label=f"timm {name}", url_dirs=[torch_hub_checkpoints_dir()])
    hub = cfg.get("hf_hub_id") or ""
    if hub:
        repo, _, revision = hub.partition("@")
        src.hf_repo, src.hf_revision = repo, revision or None
        src.hf_filenames = safe_alternatives(
            cfg.get("hf_hub_filename") or HF_WEIGHTS_NAME, HF_WEIGHTS_NAME, HF_SAFE_WEIGHTS_NAME
        )
    src.url = cfg.get("url") or ""
    return src


# ----------------------------------------------------------------------------- weight files
_SHA_MEMO: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes (memoised per process by path, size and mtime)."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA_MEMO:
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(4 << 20), b""):
                h.update(chunk)
        _SHA_MEMO[key] = h.hexdigest()
    return _SHA_MEMO[key]


def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        return any(n == "constants.pkl" or n.endswith("/constants.pkl") for n in zf.namelist())


class Checkpoint:
    """A local weights file: its sha256, its state dict and curate's metadata, read lazily.

    Formats: ``.safetensors`` (metadata key ``"curate"`` holds a JSON string), ``torch.save``
    files read with ``weights_only=True`` (a bare state dict, ``{"state_dict": ...}``,
    ``{"model": ...}``, optionally with ``"curate": {"arch": ..., ...}`` beside it, as
    ``curate train-reference`` writes), OpenAI's TorchScript archives (their state dict), and
    big_vision ``.npz`` (left to open_clip). A ``module.`` prefix (DataParallel) is removed.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise WeightsNotFoundError(
                f"weights file {self.path.absolute()} does not exist (or is not a file); check the path",
                missing=[str(self.path)],
                searched=[str(self.path)],
            )
        self._state_dict: dict[str, Any] | None = None
        self._metadata: dict[str, Any] | None = None

    @property
    def sha256(self) -> str:
        return file_sha256(self.path)

    @property
    def is_npz(self) -> bool:
        return self.path.suffix.lower() in (".npz", ".npy")

    @property
    def metadata(self) -> dict[str, Any]:
        """curate's metadata stored with the weights (``{}`` when there is none)."""
        if self._metadata is None:
            if self.is_npz:
                self._metadata = {}
            else:
                self._read()
        return dict(self._metadata or {})

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights as a flat ``name -> tensor`` mapping."""
        if self.is_npz:
            raise ModelError(f"{self.path} is a big_vision .npz file; only open_clip can load it")
        if self._state_dict is None:
            self._read()
        assert self._state_dict is not None
        return self._state_dict

    def release(self) -> None:
        """Drop the cached state dict (and the memory map behind it)."""
        self._state_dict = None

    def _read(self) -> None:
        import torch

        path = self.path
        meta: Any = None
        try:
            if path.suffix.lower() == ".safetensors":
                from safetensors import safe_open

                with safe_open(str(path), framework="pt", device="cpu") as fh:
                    raw_meta = fh.metadata() or {}
                    obj: Any = {k: fh.get_tensor(k) for k in fh.keys()}
                if "curate" in raw_meta:
                    meta = json.loads(raw_meta["curate"])
            elif _is_torchscript(path):
                with warnings.catch_warnings():  # torch 2.x deprecates TorchScript; OpenAI ships it
                    warnings.simplefilter("ignore", DeprecationWarning)
                    warnings.simplefilter("ignore", FutureWarning)
                    obj = torch.jit.load(str(path), map_location="cpu").state_dict()
                for key in ("input_resolution", "context_length", "vocab_size"):
                    obj.pop(key, None)
            else:
                obj = torch.load(
                    str(path), map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path)
                )
        except pickle.UnpicklingError as exc:
            raise ModelError(
                f"{path} holds Python objects beyond tensors and plain data; curate loads weights "
                f"with torch.load(weights_only=True) only. Re-save just the state dict. ({exc})"
            ) from exc
        except Exception as exc:  # torch raises many types on junk (IndexError, RuntimeError, ...)
            reason = " ".join(str(exc).split()).split(". ")[0].rstrip(". ") or type(exc).__name__  # its first sentence
            raise ModelError(
                f"could not read weights file {path} (truncated or not a weights file?): {reason}; "
                "delete it and fetch it again, or check the path"
            ) from exc
        state: Any = obj
        if isinstance(obj, Mapping):
            if meta is None and isinstance(obj.get("curate"), Mapping):
                meta = obj["curate"]
            for key in ("state_dict", "model"):
                if isinstance(obj.get(key), Mapping):
                    state = obj[key]
                    break
        if not isinstance(state, Mapping) or not state:
            raise ModelError(f"{path} does not hold a state dict (got {type(state).__name__})")
        tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
        if not tensors:
            raise ModelError(f"{path} holds no tensors; is it a weights file?")
        if all(k.startswith("module.") for k in tensors):
            tensors = {k[len("module.") :]: v for k, v in tensors.items()}
        self._state_dict = tensors
        self._metadata = dict(meta) if isinstance(meta, Mapping) else {}


def checkpoint_arch(checkpoint: Checkpoint) -> str | None:
    """The architecture a weights file says it belongs to (``curate.arch``), if any."""
    arch = checkpoint.metadata.get("arch")
    return str(arch) if arch else None


def _prefixes(keys: Sequence[str], limit: int = 5) -> str:
    """The first dotted parts of ``keys``, in order of first use, at most ``limit`` (then ``...``)."""
    seen = list(dict.fromkeys(k.split(".")[0] for k in keys))
    return ", ".join(seen[:limit]) + (", ..." if len(seen) > limit else "")


def state_mismatch(file_state: Mapping[str, Any], model_state: Mapping[str, Any]) -> str:
    """One line saying how a weights file's tensors differ from what a model expects.

    Names: the file's count and prefixes (first dotted parts) and two sample keys beside the
    model's, when their names differ (another library's keys, e.g. EfficientNet-PyTorch's
    ``_conv_stem`` for timm's ``conv_stem``); else the first tensor whose shape differs."""
    file_keys, model_keys = list(file_state), list(model_state)
    missing = [k for k in model_keys if k not in file_state]
    unexpected = [k for k in file_keys if k not in model_state]
    if missing or unexpected:
        shared = len(file_keys) - len(unexpected)
        return (f"the file's {len(file_keys)} tensors are named {_prefixes(file_keys)} (e.g. {file_keys[0]}), the "
                f"model's {len(model_keys)} {_prefixes(model_keys)} (e.g. {model_keys[0]}); {shared} names match")
    for key in model_keys:
        want, got = tuple(getattr(model_state[key], "shape", ())), tuple(getattr(file_state[key], "shape", ()))
        if want != got:
            return f"the names match but {key} is {list(got)} in the file and {list(want)} in the model"
    return "the file's tensors match the model's names and shapes"
