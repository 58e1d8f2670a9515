"""What every stage does first: open the dataset, resolve the model, name the run."""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from curate.runs.base import RUNS_DIR, check_run_name, discard_if_empty, prepare_run_dir, unique_run_name
from curate.runs.base import run_name as default_run_name
from curate.runs.lock import run_lock

if TYPE_CHECKING:  # pragma: no cover
    from curate.models.base import LoadedModel
    from curate.models.spec import ModelSpec
    from curate.store import Dataset

__all__ = ["open_dataset", "load_spec", "spec_of", "model_identity", "identity_label", "check_device",
           "claim_run_dir", "run_stage"]

S = TypeVar("S", bound=Callable[..., Any])

DatasetLike = "Dataset | str | Path"


def open_dataset(dataset: Any) -> Dataset:
    """A :class:`curate.store.Dataset` from a dataset or its folder."""
    from curate.store import Dataset

    return dataset if isinstance(dataset, Dataset) else Dataset.open(Path(dataset))


def check_device(device: str) -> str:
    """Validate a device name; asking for CUDA without one is a clear error, not a crash later.

    Imports torch only for a CUDA device (a re-score from the cache imports no torch)."""
    device = str(device)
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    if not device.startswith("cuda"):
        return device
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA was requested (--device cuda) but torch sees no CUDA device on this machine; "
                           "use --device cpu or auto")
    return device


def spec_of(model: Any) -> ModelSpec | None:
    """The :class:`ModelSpec` a model argument names; None for an already loaded model.

    A spec is itself; a ``Path``, or a string that looks like a path, is a curate weights file
    (``ModelSpec("auto", file)``), unless the string starts with a backend prefix
    (``lvlm:``, ``endpoint:``, ``timm:``, ...) or a role scheme (``hf:``), which names a model;
    any other string is a model name. Anything else is a loaded model."""
    from curate.models.registry import backends
    from curate.models.spec import ModelSpec
    from curate.models.weights import looks_like_path

    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Path):
        return ModelSpec("auto", str(model))
    if isinstance(model, str):
        if model.partition(":")[0] in (*backends(), "hf") and ":" in model:
            return ModelSpec(model, None)
        return ModelSpec("auto", model) if looks_like_path(model) else ModelSpec(model, None)
    return None


def load_spec(model: ModelSpec | LoadedModel | str | Path, *, device: str = "auto",
              precision: str = "fp32") -> LoadedModel:
    """A loaded model from a spec, a loaded model (returned as is), a name, or a curate weights file."""
    from curate.models import load_model

    spec = spec_of(model)
    if spec is None:
        if not getattr(model, "model_id", None) or not getattr(model, "kind", None):
            raise TypeError(f"a model is a ModelSpec, a name, a weights file or a loaded model (with kind and "
                            f"model_id), not {type(model).__name__}")
        return model
    return load_model(spec.name, spec.pretrained, device=device, precision=precision)


def _recorded_origin(loaded: Any) -> tuple[str | None, str | None]:
    """``(name, pretrained)`` as a loaded model records its own origin, ``(None, None)`` when it
    records none: a ``spec`` attribute (a :class:`ModelSpec`, or a role spec's ``text``), else its
    loader's ``info`` (curate.models.clip / classifier, curate.lvlm.hf / endpoint, curate.vlm_quality.nli)."""
    from curate.models.spec import ModelSpec

    spec = getattr(loaded, "spec", None)
    if isinstance(spec, ModelSpec):
        return spec.name, spec.pretrained
    if isinstance(getattr(spec, "text", None), str):
        return spec.text, None
    info = getattr(loaded, "info", None)
    if not isinstance(info, dict):
        return None, None
    backend = info.get("backend")
    weights = info.get("weights_file") or info.get("pretrained")
    if backend == "open_clip" and info.get("arch"):
        return str(info.get("zoo_name") or info["arch"]), weights
    if backend == "timm" and info.get("arch"):
        return f"timm:{info['arch']}", weights
    if backend == "lvlm" and info.get("source"):
        return f"lvlm:{info['source']}", None
    if backend == "endpoint" and info.get("base_url") and info.get("model"):
        return f"endpoint:{info['base_url']}#{info['model']}", None
    if str(getattr(loaded, "model_id", "")).startswith("hf:") and info.get("folder"):  # an entailment model
        return f"hf:{info['folder']}", None
    return None, None


def model_identity(model: Any, loaded: Any) -> dict[str, Any]:
    """What a run records about the model it was given (issue 28; one rule for every stage).

    ``model`` is the stage's model argument, ``loaded`` the model it scored with (the same object
    when a loaded model was passed, or the backend it was wrapped in). Returns
    ``{"name", "pretrained", "model_id", "passed"}``:

    - ``passed``: ``"spec"`` when the argument named the model (a :class:`ModelSpec`, a name, a
      weights file; :func:`spec_of`), ``"loaded"`` when it was an already loaded model;
    - ``name`` / ``pretrained``: the spec's as given; for a loaded model, what it records of its
      own origin (a ``spec`` attribute, else its loader's ``info``: the architecture or source and
      the weights tag or file), so the same weights read the same whichever way they came. A
      loaded model that records no origin is named by its ``model_id`` (``pretrained`` None);
    - ``model_id``: ``loaded.model_id`` (names the weights; the cache key), always.

    Raises ``TypeError`` for a model without a ``model_id``: a run could not say what it scored.
    Call it before any work, so a bad model fails before anything is scored."""
    model_id = getattr(loaded, "model_id", None)
    if not isinstance(model_id, str) or not model_id:
        raise TypeError(f"{type(loaded).__name__} is not a loaded model curate can record: it has no model_id "
                        "(pass a ModelSpec, a model name, or a model from curate.load_model)")
    spec = spec_of(model)
    if spec is not None:
        name, pretrained, passed = spec.name, spec.pretrained, "spec"
    else:
        name, pretrained = _recorded_origin(model)
        if not name and loaded is not model:  # the backend a loaded model was wrapped in
            name, pretrained = _recorded_origin(loaded)
        name, pretrained = (name, pretrained) if name else (model_id, None)
        passed = "loaded"
    return {"name": name, "pretrained": pretrained, "model_id": model_id, "passed": passed}


def identity_label(identity: dict[str, Any]) -> str:
    """How run names and tables show a recorded identity (``name:tag``; :attr:`ModelSpec.label`)."""
    from curate.models.spec import ModelSpec

    return ModelSpec(str(identity["name"]), identity.get("pretrained")).label


def claim_run_dir(dataset_root: Path, run_name: str | None, kind: str, label: str, *, overwrite: bool = False) -> Path:
    """The run folder for a stage: ``run_name`` (:func:`curate.runs.base.prepare_run_dir`: a finished
    run is refused unless ``overwrite``, an unfinished one replaced) or a fresh
    ``<kind>-<label>-<UTC time>`` name, made at once so that two runs never share one."""
    if run_name:
        return prepare_run_dir(dataset_root, run_name, overwrite=overwrite)
    while True:
        path = Path(dataset_root) / RUNS_DIR / unique_run_name(dataset_root, default_run_name(kind, label))
        try:
            path.mkdir(parents=True)
        except FileExistsError:  # another run took that name between the look and the mkdir
            continue
        return path


def _dataset_root(dataset: Any) -> Path | None:
    """The folder of a stage's ``dataset`` argument when it is a dataset folder (else None: the
    stage reports what is wrong with it)."""
    from curate.store.validate import CONFIG_FILE as DATASET_FILE

    root = dataset if isinstance(dataset, (str, os.PathLike)) else getattr(dataset, "root", None)
    return Path(root) if root is not None and (Path(root) / DATASET_FILE).is_file() else None


def run_stage(purpose: str) -> Callable[[S], S]:
    """The run lifecycle every stage shares (docs/design.md#run-folders), as a decorator of
    ``stage(dataset, model, settings, *, run_name, overwrite, progress)``.

    With an explicit ``run_name``, before the stage does any work, the name is checked
    (:func:`curate.runs.base.check_run_name`: a finished run of that name is refused unless
    ``overwrite``; an unfinished one, without ``config.json``, is not, and the stage replaces it
    when it claims its folder, saying so) and the run's lock taken (:func:`curate.runs.lock.run_lock`:
    a run that a live process writes is refused, naming that process). The lock is held until the
    stage returns; a stage that fails or is interrupted before writing a file leaves no folder.
    ``purpose`` (the verb, e.g. ``"evaluate"``) is what a refused second writer is told.
    Without ``run_name`` the stage names its run when it claims the folder (:func:`claim_run_dir`)."""

    def decorate(stage: S) -> S:
        @functools.wraps(stage)
        def run(dataset: Any, *args: Any, run_name: str | None = None, overwrite: bool = False, **kwargs: Any) -> Any:
            root = _dataset_root(dataset) if run_name is not None else None
            if root is None:
                return stage(dataset, *args, run_name=run_name, overwrite=overwrite, **kwargs)
            check_run_name(root, str(run_name), overwrite=overwrite)  # refused before even a lock file is made
            with run_lock(root, str(run_name), purpose=purpose):
                check_run_name(root, str(run_name), overwrite=overwrite)  # a writer may have finished meanwhile
                try:
                    return stage(dataset, *args, run_name=run_name, overwrite=overwrite, **kwargs)
                except BaseException:
                    discard_if_empty(root / RUNS_DIR / str(run_name))
                    raise

        return cast(S, run)

    return decorate
