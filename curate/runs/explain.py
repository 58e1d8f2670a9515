"""The explain run: one model's saliency maps on a dataset folder, scored with SSS and RMA (``curate explain``).

Files (``runs/<name>/``):

- ``config.json``: ``dataset``; ``model`` (``name``, ``pretrained``, ``model_id``, ``family``);
  what was explained, resolved: ``method`` (canonical name), ``layer`` (None for methods that
  read several), ``target`` (``true`` | ``predicted`` | ``topk:K``), ``threshold``,
  ``threshold_mode``, ``label_space`` (``dataset`` | ``present``), ``label_space_name``,
  ``num_classes_scored``, ``prompts`` (name and templates; None for a classifier),
  ``normalisation``, ``device``, ``precision``; ``settings`` (what was asked, the fields of
  :class:`curate.stages.explain.ExplainSettings`); ``maps`` (``saved``, ``dtype``);
- ``predictions.parquet`` (:func:`predictions_schema`): one row per (image, target):
  ``sample_id, class_index, target_rank, target_index, target_name, target_score,
  predicted_index, correct, group, background, aligned, mask_fraction, sss, rma, nan_reason``;
- ``images.parquet`` (:func:`images_schema`): per image, the mean over its predictions
  (papers/004 §3.2) and ``sss_uniform`` = 1 - mask area, the SSS of a uniform map;
- ``classes.parquet`` (:func:`classes_schema`): per target class, over all predictions and split
  by group and by correct/wrong (``subset`` column);
- ``summary.json``: ``n_images``, ``n_predictions``, ``accuracy``, ``overall`` (per prediction
  and per image), ``split`` (``group`` = easy/hard, ``aligned`` = aligned/conflicting on a
  synthetic world without a split, or None), ``by_group``, ``by_correct``, ``per_class``, ``nan``
  (``count``, ``reasons``, ``by_group``: NaN maps by reason), ``skipped`` (samples not scored,
  with reasons: ``model_mask`` = an unverified model proposal left out, ``rejected_mask`` = a mask
  reviewers marked bad, ...), ``masks`` (non-binary, resized), ``mask_sources`` (the masks the
  scored images used by source, human / exact / model, and the ones left out:
  :meth:`curate.masks.sources.MaskCounts.as_dict`), ``timing``. Means are NaN-aware: ``n``
  defined values, ``n_nan`` left out; NaN is stored as ``null``;
- ``maps/<sample_id>.npz`` (``--save-maps``): ``maps`` (K, H, W) float32, exactly the [0, 1]
  maps SSS and RMA were computed from (before thresholding, which the scores apply with the
  run's ``threshold``), ``mask`` (H, W) bool, ``targets`` (K,) class indices, on the model
  input's pixel grid. :meth:`ExplainRun.saved_maps` reads one.

Versions: 1 (before records): ``model`` was the model id and ``model_kind`` its family, the
settings were flat keys, ``summary.json`` repeated the config, NaN reasons were not counted per
group and saved maps were float16 (their SSS/RMA differ from the run's by up to ~1e-5).
Version 1 folders load (migrated); their per-group NaN reasons are counted from
``predictions.parquet`` when it is there. Runs written before mask sources were counted have no
``mask_sources``: :attr:`ExplainRun.mask_counts` is None and :attr:`ExplainRun.mask_line` says so.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from curate.jsonio import json_safe, write_json
from curate.runs.base import (
    ModelBlock,
    RunError,
    RunRecord,
    read_parquet,
    read_result_json,
    write_parquet,
)
from curate.runs.registry import register_run_kind
from curate.store.mask_sources import MaskCounts

__all__ = [
    "SPLIT_ORDER",
    "ExplainRun",
    "GroupScores",
    "SavedMaps",
    "ScoreStat",
    "classes_schema",
    "images_schema",
    "predictions_schema",
    "split_value",
]

#: The parts of each split kind, in table order.
SPLIT_ORDER: dict[str, tuple[str, str]] = {"group": ("easy", "hard"), "aligned": ("aligned", "conflicting")}
_RECORD_KEYS = ("kind", "record_version", "curate_version")


# ----------------------------------------------------------------------------- file schemas
def predictions_schema():
    import pyarrow as pa

    return pa.schema([
        ("sample_id", pa.string()), ("class_index", pa.int32()), ("target_rank", pa.int32()),
        ("target_index", pa.int32()), ("target_name", pa.string()), ("target_score", pa.float32()),
        ("predicted_index", pa.int32()), ("correct", pa.bool_()), ("group", pa.string()), ("background", pa.string()),
        ("aligned", pa.bool_()), ("mask_fraction", pa.float64()), ("sss", pa.float64()), ("rma", pa.float64()),
        ("nan_reason", pa.string()),
    ])


def images_schema():
    import pyarrow as pa

    return pa.schema([
        ("sample_id", pa.string()), ("class_index", pa.int32()), ("class_name", pa.string()), ("group", pa.string()),
        ("background", pa.string()), ("aligned", pa.bool_()), ("predicted_index", pa.int32()),
        ("correct", pa.bool_()), ("mask_fraction", pa.float64()), ("n_predictions", pa.int32()),
        ("n_nan", pa.int32()), ("sss", pa.float64()), ("rma", pa.float64()), ("sss_uniform", pa.float64()),
    ])


def classes_schema():
    import pyarrow as pa

    return pa.schema([
        ("class_index", pa.int32()), ("class_name", pa.string()), ("subset", pa.string()), ("n", pa.int32()),
        ("n_nan", pa.int32()), ("sss", pa.float64()), ("sss_std", pa.float64()), ("rma", pa.float64()),
        ("rma_std", pa.float64()),
    ])


def split_value(split: str | None, group: Any, aligned: Any) -> str | None:
    """The split part of an image: ``easy``/``hard`` (split ``group``), ``aligned``/``conflicting``
    (split ``aligned``), or None (not in the split)."""
    if split == "group":
        return group if group in SPLIT_ORDER["group"] else None
    if split == "aligned" and aligned is not None:
        return "aligned" if aligned else "conflicting"
    return None


# ----------------------------------------------------------------------------- typed views
def _f(x: Any) -> float:
    return float("nan") if x is None else float(x)


@dataclass(frozen=True)
class ScoreStat:
    """A NaN-aware mean of one score: over the ``n`` defined values (``n_nan`` left out), and the
    class-balanced mean (each class weighs the same; NaN where not computed)."""

    mean: float
    std: float
    n: int
    n_nan: int
    balanced: float = float("nan")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScoreStat:
        return cls(mean=_f(data["mean"]), std=_f(data.get("std")), n=int(data.get("n") or 0),
                   n_nan=int(data.get("n_nan") or 0), balanced=_f(data.get("balanced")))


@dataclass(frozen=True)
class GroupScores:
    """SSS and RMA of one part of the images (``easy``, ``aligned``, ``correct``, ``all``, ...): the
    per-image means, the uniform-map SSS (chance level) and the NaN maps by reason."""

    name: str
    sss: ScoreStat
    rma: ScoreStat
    sss_uniform: float
    nan_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Images with a defined SSS."""
        return self.sss.n

    @property
    def n_nan(self) -> int:
        """Images whose SSS is NaN (every map of the image undefined)."""
        return self.sss.n_nan

    @property
    def nan_maps(self) -> int:
        """Maps (predictions) with a NaN score, over all reasons."""
        return int(sum(self.nan_reasons.values()))


@dataclass(frozen=True)
class SavedMaps:
    """One sample's ``maps/<sample_id>.npz``: ``maps`` (K, H, W), ``mask`` (H, W) bool, ``targets`` (K,)."""

    sample_id: str
    maps: np.ndarray
    mask: np.ndarray
    targets: np.ndarray


# ----------------------------------------------------------------------------- the record
@register_run_kind
@dataclass
class ExplainRun(ModelBlock, RunRecord):
    """Config and results of one explain run (see the module docstring).

    ``compute_explanations`` builds one in memory (``run_dir`` None, tables held); ``explain``
    writes it; :meth:`load` reads one back (tables read on first use).
    """

    KIND: ClassVar[str] = "explain"
    VERSION: ClassVar[int] = 2  # 2: model as a dict, settings nested, float32 maps, NaN reasons per group
    PREDICTIONS: ClassVar[str] = "predictions.parquet"
    IMAGES: ClassVar[str] = "images.parquet"
    CLASSES: ClassVar[str] = "classes.parquet"
    SUMMARY: ClassVar[str] = "summary.json"
    MAPS: ClassVar[str] = "maps"
    #: dtype of the saved maps (version 2).
    MAPS_DTYPE: ClassVar[str] = "float32"

    config: dict[str, Any]
    summary: dict[str, Any]
    predictions_table: Any = field(default=None, repr=False)  # pyarrow Tables; read on demand after load
    images_table: Any = field(default=None, repr=False)
    classes_table: Any = field(default=None, repr=False)
    #: maps kept in memory by ``compute_explanations(..., keep_maps=True)``: sample id -> (K, H, W) float32
    kept_maps: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    run_dir: Path | None = None

    # -- record protocol
    def config_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.config.items() if k not in _RECORD_KEYS}

    def _write_results(self, run_dir: Path) -> None:
        tables = ((self.PREDICTIONS, self.predictions_table, predictions_schema),
                  (self.IMAGES, self.images_table, images_schema), (self.CLASSES, self.classes_table, classes_schema))
        for file_name, table, schema in tables:
            if table is None:
                raise RunError(f"an explain run needs its {file_name} table to be written")
            write_parquet(run_dir / file_name, table.cast(schema()))
        write_json(run_dir / self.SUMMARY, self.summary)

    @classmethod
    def migrate(cls, config: dict[str, Any], version: int) -> dict[str, Any]:
        if version < 2:
            model = config.get("model")
            if not isinstance(model, dict):
                config["model"] = {"name": None, "pretrained": None, "model_id": model,
                                   "family": config.pop("model_kind", None) or "clip"}
            settings = dict(config.get("settings") or {})
            for key in ("batch_size", "statuses", "limit", "sample_ids", "method_options"):
                if key in config and key not in settings:
                    settings[key] = config.pop(key)
            config["settings"] = settings
            config.setdefault("maps", {"saved": None, "dtype": "float16"})
        return config

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> ExplainRun:
        summary = read_result_json(run_dir, cls.SUMMARY)
        summary.pop("config", None)  # version 1 repeated config.json here
        maps = dict(config.get("maps") or {})
        if maps.get("saved") is None:
            maps["saved"] = (run_dir / cls.MAPS).is_dir()
        record = cls(config={**config, "maps": maps}, summary=summary, run_dir=run_dir)
        record._check()
        return record

    def _check(self) -> None:
        """Build every view once, so a summary in another shape fails at load (as a RunError)."""
        # each raises KeyError / TypeError / ValueError on a summary in another shape
        _ = (self.overall, self.by_correct, self.per_prediction)
        for entry in (self.summary.get("by_group") or {}).values():
            ScoreStat.from_dict(entry["sss"]), ScoreStat.from_dict(entry["rma"])

    # -- what was explained
    @property
    def family(self) -> str:
        """``clip`` or ``classifier``."""
        return str(self.model.get("family") or "clip")

    @property
    def model_label(self) -> str:
        """How tables name the model: ``name:tag`` (a weights file by its file name), else the model id."""
        model = self.model
        if not model.get("name"):
            return self.model_id
        from curate.models.spec import ModelSpec

        return ModelSpec(str(model["name"]), model.get("pretrained")).label

    @property
    def dataset(self) -> str:
        return str(self.config.get("dataset") or "")

    @property
    def method(self) -> str:
        return str(self.config.get("method") or "")

    @property
    def layer(self) -> str | None:
        return self.config.get("layer")

    @property
    def target(self) -> str:
        """The target's spelling (``true``, ``predicted``, ``topk:K``)."""
        return str(self.config.get("target") or "")

    @property
    def threshold(self) -> float | None:
        value = self.config.get("threshold")
        return None if value is None else float(value)

    @property
    def threshold_mode(self) -> str:
        return str(self.config.get("threshold_mode") or "soft")

    @property
    def label_space(self) -> str:
        """``dataset`` (every class of the label space) or ``present`` (the classes in the dataset)."""
        return str(self.config.get("label_space") or "")

    @property
    def label_space_name(self) -> str:
        return str(self.config.get("label_space_name") or "")

    @property
    def prompts_name(self) -> str | None:
        prompts = self.config.get("prompts")
        return prompts.get("name") if isinstance(prompts, dict) else None

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.config.get("settings") or {})

    @property
    def maps_saved(self) -> bool:
        return bool((self.config.get("maps") or {}).get("saved"))

    @property
    def maps_dtype(self) -> str:
        return str((self.config.get("maps") or {}).get("dtype") or self.MAPS_DTYPE)

    # -- results
    @property
    def split(self) -> str | None:
        """``group`` (easy / hard), ``aligned`` (aligned / conflicting) or None."""
        return self.summary.get("split")

    @property
    def n_images(self) -> int:
        return int(self.summary.get("n_images") or 0)

    @property
    def n_predictions(self) -> int:
        return int(self.summary.get("n_predictions") or 0)

    @property
    def accuracy(self) -> float:
        """Top-1 accuracy over the label space's candidates (NaN without true classes)."""
        return _f(self.summary.get("accuracy"))

    @property
    def overall(self) -> GroupScores:
        """Every scored image: per-image means, the uniform-map SSS, all NaN maps by reason."""
        overall = self.summary["overall"]
        return GroupScores("all", ScoreStat.from_dict(overall["sss"]["per_image"]),
                           ScoreStat.from_dict(overall["rma"]["per_image"]), _f(overall.get("sss_uniform")),
                           self.nan_reasons)

    @property
    def per_prediction(self) -> dict[str, ScoreStat]:
        """``{"sss": ..., "rma": ...}`` over every map (prediction), not per image."""
        overall = self.summary["overall"]
        return {m: ScoreStat.from_dict(overall[m]["per_prediction"]) for m in ("sss", "rma")}

    @property
    def groups(self) -> dict[str, GroupScores]:
        """The split's parts in table order (``easy``, ``hard`` or ``aligned``, ``conflicting``); empty without a split."""
        by_group = self.summary.get("by_group") or {}
        order = [p for p in SPLIT_ORDER.get(self.split or "", ()) if p in by_group]
        order += [p for p in by_group if p not in order]
        reasons = self.nan_reasons_by_group()
        return {part: GroupScores(part, ScoreStat.from_dict(by_group[part]["sss"]),
                                  ScoreStat.from_dict(by_group[part]["rma"]), _f(by_group[part].get("sss_uniform")),
                                  dict(reasons.get(part) or {}))
                for part in order}

    @property
    def by_correct(self) -> dict[str, GroupScores]:
        """``correct`` / ``wrong`` top-1 predictions (images without a true class left out)."""
        parts = self.summary.get("by_correct") or {}
        return {part: GroupScores(part, ScoreStat.from_dict(parts[part]["sss"]), ScoreStat.from_dict(parts[part]["rma"]),
                                  float("nan"))
                for part in ("correct", "wrong") if part in parts}

    @property
    def nan_count(self) -> int:
        """Maps (predictions) whose SSS/RMA are NaN."""
        return int((self.summary.get("nan") or {}).get("count") or 0)

    @property
    def nan_reasons(self) -> dict[str, int]:
        """``{reason: maps}`` over the run (:data:`curate.metrics.spuriousity.NAN_REASONS` and ``constant_map``)."""
        return {str(k): int(v) for k, v in ((self.summary.get("nan") or {}).get("reasons") or {}).items()}

    def nan_reasons_by_group(self) -> dict[str, dict[str, int]]:
        """``{part: {reason: maps}}`` per split part. A version 1 run counts them from its
        predictions table (empty when that file is gone)."""
        nan = self.summary.get("nan") or {}
        if "by_group" in nan:
            return {str(p): {str(k): int(v) for k, v in (r or {}).items()} for p, r in (nan["by_group"] or {}).items()}
        if not self.split or not self.nan_count:
            return {}
        try:
            table = self.predictions(["group", "aligned", "nan_reason"]).to_pydict()
        except RunError:
            return {}
        counts: dict[str, Counter] = {}
        for group, aligned, reason in zip(table["group"], table["aligned"], table["nan_reason"]):
            part = split_value(self.split, group, aligned)
            if part is not None and reason is not None:
                counts.setdefault(part, Counter())[reason] += 1
        return {p: dict(c) for p, c in counts.items()}

    @property
    def skipped_count(self) -> int:
        return int((self.summary.get("skipped") or {}).get("count") or 0)

    @property
    def skipped_reasons(self) -> dict[str, int]:
        return dict((self.summary.get("skipped") or {}).get("reasons") or {})

    @property
    def skipped_samples(self) -> list[dict[str, str]]:
        """Up to 200 ``{sample_id, reason}`` of the samples that were not scored."""
        return list((self.summary.get("skipped") or {}).get("samples") or [])

    @property
    def masks(self) -> dict[str, int]:
        """``non_binary`` (instance ids or 0/255 masks read as union) and ``resized`` mask counts."""
        return dict(self.summary.get("masks") or {})

    @property
    def mask_counts(self) -> MaskCounts | None:
        """The masks the scored images used, by source (human, exact, model), and the ones left
        out (unverified model proposals without ``allow_model_masks``, masks marked bad); None for a
        run written before mask sources were counted."""
        data = self.summary.get("mask_sources")
        return MaskCounts.from_dict(data) if isinstance(data, Mapping) else None

    @property
    def mask_line(self) -> str:
        """The one line every table of this run states its masks with (:meth:`MaskCounts.line`)."""
        counts = self.mask_counts
        if counts is None:
            return "masks: sources not recorded (a run written before curate counted them)"
        return counts.line()

    @property
    def seconds(self) -> float:
        return _f((self.summary.get("timing") or {}).get("seconds"))

    @property
    def images_per_second(self) -> float:
        return _f((self.summary.get("timing") or {}).get("images_per_second"))

    # -- tables and maps
    def _table(self, attr: str, file_name: str, columns: Sequence[str] | None):
        table = getattr(self, attr)
        if table is None:
            if self.run_dir is None:
                raise RunError(f"this explain run has no {file_name} and no folder to read it from")
            table = read_parquet(self.run_dir / file_name)
            setattr(self, attr, table)
        return table.select(list(columns)) if columns else table

    def predictions(self, columns: Sequence[str] | None = None):
        """The predictions table (one row per image and target; read on first use)."""
        return self._table("predictions_table", self.PREDICTIONS, columns)

    def images(self, columns: Sequence[str] | None = None):
        """The per-image table (read on first use)."""
        return self._table("images_table", self.IMAGES, columns)

    def classes(self, columns: Sequence[str] | None = None):
        """The per-class table (read on first use)."""
        return self._table("classes_table", self.CLASSES, columns)

    def map_ids(self) -> list[str]:
        """Sample ids with saved maps (``--save-maps``), sorted."""
        if self.run_dir is None or not (self.run_dir / self.MAPS).is_dir():
            return []
        return sorted(p.stem for p in (self.run_dir / self.MAPS).glob("*.npz"))

    def saved_maps(self, sample_id: str) -> SavedMaps:
        """One sample's saved maps (:class:`RunError` when the run saved none for it)."""
        if self.run_dir is None:
            raise RunError("this explain run has no folder to read maps from")
        path = self.run_dir / self.MAPS / f"{sample_id}.npz"
        if not path.is_file():
            raise RunError(f"run {self.name} saved no maps for {sample_id!r} (run with --save-maps)")
        with np.load(path) as data:
            return SavedMaps(sample_id, data["maps"], data["mask"].astype(bool), data["targets"])

    # -- what readers show
    def by_group(self) -> dict[str, Any]:
        """The compact entry tables and the report show for this run::

            {"run", "model" (model id), "method", "layer", "target", "split" (group | aligned | None),
             "groups": {part: {"sss", "rma", "n", "n_nan", "sss_uniform", "sss_balanced", "nan_reasons"}},
             "overall": {"sss", "rma", "n", "n_nan", "sss_uniform"},
             "nan" (NaN maps), "nan_reasons" ({reason: maps}), "accuracy", "skipped", "seconds",
             "masks" (:meth:`curate.masks.sources.MaskCounts.as_dict`, None for an older run), "mask_line"}

        ``sss`` / ``rma`` are means over images of the per-image scores (papers/004 §3.2);
        ``n`` counts the images with a defined score and ``n_nan`` those without (all their maps
        NaN); ``nan_reasons`` counts NaN *maps* by reason (a ``topk:K`` image has K maps);
        ``sss_uniform`` is the SSS of a uniform map (1 - mask area), the chance level;
        ``mask_line`` states how many masks were human, exact and model-made, and how many were
        left out. Numbers that are undefined are NaN.
        """
        groups = {}
        for part, g in self.groups.items():
            groups[part] = {"sss": g.sss.mean, "rma": g.rma.mean, "n": g.n, "n_nan": g.n_nan,
                            "sss_uniform": g.sss_uniform, "sss_balanced": g.sss.balanced,
                            "nan_reasons": dict(g.nan_reasons)}
        overall = self.overall
        return {
            "run": self.name, "model": self.model_id, "method": self.method, "layer": self.layer,
            "target": self.target, "split": self.split, "groups": groups,
            "overall": {"sss": overall.sss.mean, "rma": overall.rma.mean, "n": overall.n, "n_nan": overall.n_nan,
                        "sss_uniform": overall.sss_uniform},
            "nan": self.nan_count, "nan_reasons": self.nan_reasons, "accuracy": self.accuracy,
            "skipped": self.skipped_count, "seconds": self.seconds,
            "masks": None if self.mask_counts is None else self.mask_counts.as_dict(), "mask_line": self.mask_line,
        }

    def to_json(self) -> dict[str, Any]:
        """``{"run", "config", **summary}`` as strict-JSON-ready data (``curate explain --json``)."""
        return json_safe({"run": self.name or None, "config": self.config_dict(), **self.summary})
