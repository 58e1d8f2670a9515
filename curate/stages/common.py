"""What every stage does first: open the dataset, resolve the model, name the run."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from curate.runs.base import prepare_run_dir, unique_run_name
from curate.runs.base import run_name as default_run_name

if TYPE_CHECKING:  # pragma: no cover
    from curate.models.base import LoadedModel
    from curate.models.spec import ModelSpec
    from curate.store import Dataset

__all__ = ["open_dataset", "load_spec", "check_device", "claim_run_dir"]

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


def load_spec(model: ModelSpec | LoadedModel | str | Path, *, device: str = "auto",
              precision: str = "fp32") -> LoadedModel:
    """A loaded model from a spec, a loaded model (returned as is), a name, or a curate weights file."""
    from curate.models import load_model
    from curate.models.base import LoadedModel
    from curate.models.spec import ModelSpec
    from curate.models.weights import looks_like_path

    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, ModelSpec):
        return load_model(model.name, model.pretrained, device=device, precision=precision)
    if isinstance(model, Path) or (isinstance(model, str) and looks_like_path(model)):
        return load_model("auto", Path(model), device=device, precision=precision)
    return load_model(str(model), None, device=device, precision=precision)


def claim_run_dir(dataset_root: Path, run_name: str | None, kind: str, label: str, *, overwrite: bool = False) -> Path:
    """The run folder for a stage: ``run_name`` (refused when it exists, unless ``overwrite``) or
    a fresh ``<kind>-<label>-<UTC time>`` name."""
    if run_name:
        return prepare_run_dir(dataset_root, run_name, overwrite=overwrite)
    return prepare_run_dir(dataset_root, unique_run_name(dataset_root, default_run_name(kind, label)))
