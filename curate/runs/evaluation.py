"""The evaluation run: one model scored on a dataset folder (``curate evaluate``).

Files (``runs/<name>/``):

- ``config.json``: ``model`` (name, pretrained, model_id, family, info), ``label_space`` (name
  and how it was built), ``prompts`` (name and templates), ``settings``, ``dataset`` (name,
  samples, ``images_encoded`` and, since issue 27, ``features``: the ``precision`` and
  ``input_path`` that made the image features the run scored, part of the feature cache's key,
  the ``device`` that encoded the ones this run encoded, ``encoded`` and ``cached``; absent in
  older runs and for LVLMs, see :attr:`EvaluationRun.features`);
- ``predictions.parquet`` (:data:`PREDICTIONS_SCHEMA`): per sample the top-k labels
  (base-space indices, within the candidate label space) with their scores, and whether top-1
  / top-5 are right;
- ``metrics.json``: ``overall``, ``groups`` (easy / hard), ``drop``, ``per_class``,
  ``per_background``, ``per_class_background``, ``excluded`` (layout in
  :func:`curate.stages.evaluate.compute_metrics`). Accuracies are fractions in [0, 1];
- ``candidate_losses.parquet`` (LVLM runs only, record version 3): per sample and candidate
  label the answer's mean and summed negative log-likelihood (papers/003 App. C.4; the mean
  ranks, docs/design.md#lvlm-scoring).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from curate.jsonio import write_json
from curate.runs.base import RunError, RunRecord, read_parquet, read_result_json, write_parquet
from curate.runs.registry import register_run_kind

__all__ = ["EvaluationRun", "GroupStats", "DropStats", "PREDICTIONS_SCHEMA", "PAPER_PROMPT"]

#: The paper's prompt for the split and Table 2 (papers/003 §2.1).
PAPER_PROMPT = "A photo of {}."


def _schema():
    import pyarrow as pa

    return pa.schema([
        ("sample_id", pa.string()), ("class_index", pa.int32()), ("group", pa.string()), ("background", pa.string()),
        ("topk_labels", pa.list_(pa.int32())), ("topk_scores", pa.list_(pa.float32())),
        ("correct1", pa.bool_()), ("correct5", pa.bool_()),
    ])


def _losses_schema():
    import pyarrow as pa

    return pa.schema([("sample_id", pa.string()), ("label", pa.int32()), ("mean_nll", pa.float64()),
                      ("sum_nll", pa.float64())])


PREDICTIONS_SCHEMA = None  # built lazily by _schema() so importing this module does not import pyarrow


def _f(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _interval(x: Any) -> tuple[float, float]:
    return (_f(x[0]), _f(x[1])) if x else (float("nan"), float("nan"))


@dataclass(frozen=True)
class GroupStats:
    """One group's (easy or hard) accuracy: balanced top-1 with its 95% interval, unbalanced, top-5."""

    acc1: float
    acc1_ci: tuple[float, float]
    acc1_unbalanced: float
    acc5: float
    n: int
    n_classes: int


@dataclass(frozen=True)
class DropStats:
    """Easy minus hard balanced top-1 (fractions), its 95% interval, top-5 and unbalanced drops."""

    acc1: float
    acc1_ci: tuple[float, float]
    acc5: float
    acc1_unbalanced: float


def legacy_family(model: dict[str, Any]) -> str:
    """The family of a run written before ``model.family`` was recorded."""
    name = str(model.get("name") or "")
    model_id = str(model.get("model_id") or "")
    if name.startswith(("timm:", "torchvision:")) or model_id.startswith(("timm:", "torchvision:")):
        return "classifier"
    return "clip"


@register_run_kind
@dataclass
class EvaluationRun(RunRecord):
    """Config and results of one evaluation (see the module docstring)."""

    KIND: ClassVar[str] = "evaluate"
    VERSION: ClassVar[int] = 3  # 2: model.family recorded; 3: optional candidate_losses.parquet (LVLMs)
    PREDICTIONS: ClassVar[str] = "predictions.parquet"
    CANDIDATE_LOSSES: ClassVar[str] = "candidate_losses.parquet"
    METRICS: ClassVar[str] = "metrics.json"

    model: dict[str, Any]
    label_space: dict[str, Any]
    prompts: dict[str, Any]
    settings: dict[str, Any]
    dataset: dict[str, Any]
    metrics: dict[str, Any]
    predictions_table: Any = field(default=None, repr=False)  # pyarrow Table; read on demand after load
    #: LVLM runs: per (sample, candidate label) the answer's mean and summed NLL (papers/003 App. C.4)
    candidate_losses_table: Any = field(default=None, repr=False)
    run_dir: Path | None = None

    # -- record protocol
    def config_dict(self) -> dict[str, Any]:
        return {"model": self.model, "label_space": self.label_space, "prompts": self.prompts,
                "settings": self.settings, "dataset": self.dataset}

    def _write_results(self, run_dir: Path) -> None:
        if self.predictions_table is None:
            raise RunError("an evaluation run needs its predictions table to be written")
        write_parquet(run_dir / self.PREDICTIONS, self.predictions_table.cast(_schema()))
        write_json(run_dir / self.METRICS, self.metrics)
        stale = run_dir / self.CANDIDATE_LOSSES
        if self.candidate_losses_table is not None:
            write_parquet(stale, self.candidate_losses_table.cast(_losses_schema()))
        elif stale.exists():  # an overwritten LVLM run's table must not outlive it
            stale.unlink()

    @classmethod
    def migrate(cls, config: dict[str, Any], version: int) -> dict[str, Any]:
        # version < 3: no candidate_losses.parquet, which is optional; nothing to migrate
        if version < 2:
            config["model"] = {**config.get("model", {}), "family": legacy_family(config.get("model", {}))}
        return config

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> EvaluationRun:
        metrics = read_result_json(run_dir, cls.METRICS)
        return cls(model=dict(config["model"]), label_space=dict(config.get("label_space") or {}),
                   prompts=dict(config.get("prompts") or {}), settings=dict(config.get("settings") or {}),
                   dataset=dict(config.get("dataset") or {}), metrics=metrics, run_dir=run_dir)

    # -- typed views
    def candidate_losses(self):
        """LVLM runs: the ``candidate_losses`` table (sample_id, label, mean_nll, sum_nll); None for
        other models and for runs written before version 3."""
        if self.candidate_losses_table is None and self.run_dir is not None \
                and (self.run_dir / self.CANDIDATE_LOSSES).exists():
            self.candidate_losses_table = read_parquet(self.run_dir / self.CANDIDATE_LOSSES)
        return self.candidate_losses_table

    def predictions(self, columns: Sequence[str] | None = None):
        """The predictions table (read from the run folder on first use)."""
        if self.predictions_table is None:
            if self.run_dir is None:
                raise RunError("this evaluation run has no predictions and no folder to read them from")
            table = read_parquet(self.run_dir / self.PREDICTIONS)
            self.predictions_table = table
        return self.predictions_table.select(list(columns)) if columns else self.predictions_table

    def correct1_by_sample(self) -> dict[str, bool]:
        """``{sample_id: top-1 correct}`` over the samples the run scored."""
        table = self.predictions(["sample_id", "correct1"]).to_pydict()
        return dict(zip(table["sample_id"], (bool(v) for v in table["correct1"])))

    @property
    def spec(self):
        from curate.models.spec import ModelSpec

        return ModelSpec(self.model["name"], self.model.get("pretrained"))

    @property
    def model_label(self) -> str:
        """How tables name the model (``name:tag``, a weights file by its file name)."""
        return self.spec.label

    @property
    def model_id(self) -> str:
        return str(self.metrics.get("model_id") or self.model.get("model_id") or "")

    @property
    def family(self) -> str:
        """``clip``, ``classifier`` or ``lvlm``: effective robustness is fitted within a family."""
        return str(self.model.get("family") or legacy_family(self.model))

    @property
    def label_space_name(self) -> str:
        return str(self.metrics.get("label_space") or self.label_space.get("name") or "")

    @property
    def prompts_name(self) -> str:
        return str(self.metrics.get("prompts") or self.prompts.get("name") or "")

    @property
    def templates(self) -> list[str]:
        return list(self.prompts.get("templates") or [])

    @classmethod
    def finished(cls, dataset_root: Path | str, name: str) -> EvaluationRun:
        """The finished evaluation run ``name`` of a dataset folder, for stages that read another run's
        predictions (``--predictions``): FileNotFoundError when there is no such folder, RunError
        naming the option when it is not a finished evaluation run."""
        from curate.runs.base import RUNS_DIR
        from curate.runs.lookup import no_such_run

        path = Path(dataset_root) / RUNS_DIR / name
        if not path.is_dir():
            raise FileNotFoundError(f"--predictions {name}: {no_such_run(dataset_root, name, cls.KIND)}")
        try:
            return cls.load(path)
        except RunError as error:
            raise RunError(f"--predictions {name}: not a finished evaluation run ({error})") from None

    @property
    def is_paper_setting(self) -> bool:
        """1 vs 1000 over ImageNet-1K with "A photo of {}." (the paper's split setting, §2.1)."""
        return self.label_space_name == "imagenet1k" and self.templates == [PAPER_PROMPT]

    @property
    def chance(self) -> float:
        """Top-1 accuracy of a uniform guess among the candidate labels (1/1000 for 1 vs 1000);
        NaN when the number of candidates is not recorded or differs by class."""
        size = self.metrics.get("candidates_per_sample")
        if size is None:
            size = {"imagenet1k": 1000, "top20": 20}.get(self.label_space_name)
        return 1.0 / float(size) if size else float("nan")

    @property
    def overall(self) -> dict[str, float]:
        return {k: _f(v) for k, v in (self.metrics.get("overall") or {}).items()}

    @property
    def has_groups(self) -> bool:
        groups = self.metrics.get("groups") or {}
        return "easy" in groups and "hard" in groups

    def group(self, name: str) -> GroupStats:
        """Stats of group ``easy`` or ``hard`` (:class:`RunError` when the run has no groups)."""
        data = (self.metrics.get("groups") or {}).get(name)
        if data is None:
            raise RunError(f"run {self.name} has no {name!r} group (it ran before a split?)")
        return GroupStats(acc1=_f(data.get("acc1_balanced")), acc1_ci=_interval(data.get("acc1_balanced_ci95")),
                          acc1_unbalanced=_f(data.get("acc1_unbalanced")), acc5=_f(data.get("acc5_balanced")),
                          n=int(data.get("n") or 0), n_classes=int(data.get("n_classes") or 0))

    @property
    def drop(self) -> DropStats | None:
        data = self.metrics.get("drop")
        if not data:
            return None
        return DropStats(acc1=_f(data.get("acc1")), acc1_ci=_interval(data.get("acc1_ci95")),
                         acc5=_f(data.get("acc5")), acc1_unbalanced=_f(data.get("acc1_unbalanced")))

    @property
    def per_class(self) -> list[dict[str, Any]]:
        return list(self.metrics.get("per_class") or [])

    @property
    def images_encoded(self) -> int:
        """Images this evaluation encoded (0 when every output came from the feature cache)."""
        return int(self.dataset.get("images_encoded") or 0)

    @property
    def features(self) -> dict[str, Any]:
        """Which precision and input path made the image features this run scored, and the
        device that encoded the ones it encoded (``{"precision", "input_path", "device",
        "encoded", "cached"}``). Runs written before these were recorded (and LVLM runs, which
        keep no features) give None for what they do not say; an older run's precision is then
        only the one it asked for (``settings.precision``), not necessarily its features'."""
        recorded = dict(self.dataset.get("features") or {})
        return {"precision": recorded.get("precision"), "input_path": recorded.get("input_path"),
                "device": recorded.get("device"), "encoded": int(recorded.get("encoded", self.images_encoded) or 0),
                "cached": int(recorded.get("cached", self.images_cached) or 0)}

    @property
    def images_cached(self) -> int:
        """Images whose outputs came from the feature cache: the samples less those encoded
        (LVLM runs keep no feature cache: 0)."""
        if self.family == "lvlm":
            return 0
        return max(0, int(self.dataset.get("samples") or 0) - self.images_encoded)

    @property
    def excluded_count(self) -> int:
        return int((self.metrics.get("excluded") or {}).get("count") or 0)

    @property
    def excluded_reasons(self) -> dict[str, int]:
        return dict((self.metrics.get("excluded") or {}).get("reasons") or {})

    @property
    def evaluated_ids(self) -> np.ndarray:
        return np.asarray(self.predictions(["sample_id"]).column(0).to_pylist(), dtype=object)
