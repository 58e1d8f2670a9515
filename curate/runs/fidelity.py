"""The fidelity run: saliency methods scored by Fid, R-Fid and F-Fid on a dataset (``curate fidelity``).

Written by :func:`curate.stages.fidelity.fidelity`; the formulas, the verdict against a random
map and its interval are in :mod:`curate.metrics.fidelity`. Files (``runs/<name>/``, names in
the class constants of :class:`FidelityRun`):

- ``config.json``: dataset, model (``model`` = its id, ``model_kind``), ``methods``,
  ``sparsities``, ``alpha``, ``beta``, ``samples``, ``score``, ``families``, ``seed``, ``seeds``
  (the replicate seeds), ``marginal`` (the marginal rule's fraction), ``images``, ``finetune``
  (``epochs``, ``images``, ``lr``, ``copies``: per seed its cache ``key``, ``path``, ``cached``),
  ``label_columns``, ``skipped`` (samples not scored by reason: unreadable, or left out of the
  ``mask`` reference, ``model_mask`` / ``rejected_mask``), ``masks`` (the masks the ``mask``
  reference used by source and the ones left out, :meth:`curate.masks.sources.MaskCounts.as_dict`;
  null when no ``mask`` method was scored, or in a run written before mask sources were counted),
  ``baseline``, ``elements``;
- ``curves.csv``: ``method, metric, sparsity, value`` (mean over seeds and images);
- ``curves.json``: per method ``sparsities``, ``curves`` (the same means), ``images`` and
  ``by_seed`` (``{seed: {metric: values}}``);
- ``aucs.json``: ``{method: {metric: AUC}}`` (mean over seeds);
- ``ranking.csv``: one row per method, by the ranking family's + AUC (higher first), then its
  - AUC (lower first): ``rank, method, by``, the AUCs, ``vs_random_{morf,lerf}`` with
  ``_low`` / ``_high`` (95 % interval over seeds x images) and ``_marginal``, ``verdict``;
- ``correlations.json``: degraded series only, ``{base: {metric: {macro, micro}}}``;
- ``curves.png``: the curves over sparsity, one line per method;
- ``summary.json``: ``config``, ``aucs``, ``aucs_by_seed``, ``ranking`` (the rows with the
  per-seed effects ``vs_random_{morf,lerf}_by_seed``), ``correlations``, ``timings``.

Versions: 1 (before issue 14 §4: one fine-tuning seed, verdicts from a bootstrap over images
only, no marginal rule) loads as ``seeds = [seed]``, ``marginal = None``, its verdicts as
written; 2 adds ``seeds``, ``marginal``, the per-seed curves, AUCs and effects.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from curate.formatting import num
from curate.jsonio import write_json
from curate.runs.base import RunError, RunRecord, read_result_json, write_bytes
from curate.runs.registry import register_run_kind
from curate.store.mask_sources import MaskCounts

__all__ = [
    "FAMILY_LABELS",
    "METRIC_KEYS",
    "CurveSet",
    "FidelityConfig",
    "FidelityRow",
    "FidelityRun",
    "FinetuneCopy",
    "FinetuneInfo",
    "VsRandom",
    "plot_curves",
]

#: Metric keys in display order (:data:`curate.metrics.fidelity.METRICS`, repeated here so this
#: module does not import torch).
METRIC_KEYS = ("fid_plus", "fid_minus", "rfid_plus", "rfid_minus", "ffid_plus", "ffid_minus")
FAMILY_LABELS = {"ffid": "F-Fid", "rfid": "R-Fid", "fid": "Fid"}
MARGINAL_SUFFIX = " (marginal)"


def _f(x: Any) -> float:
    return float("nan") if x is None or x == "" else float(x)


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class FinetuneCopy:
    """One fine-tuned copy (one replicate seed) in ``<dataset>/features/fidelity/``."""

    seed: int
    key: str
    path: str
    cached: bool  # read from the cache by this run (False: fine-tuned by it)


@dataclass(frozen=True)
class FinetuneInfo:
    """F-Fidelity's fine-tuning (papers/002 eq. 5): epochs (0 = not done), images, lr, copies."""

    epochs: int = 0
    images: int = 0
    lr: float = float("nan")
    copies: tuple[FinetuneCopy, ...] = ()

    @property
    def all_cached(self) -> bool:
        """Every copy came from the cache (nothing was fine-tuned by this run)."""
        return bool(self.copies) and all(c.cached for c in self.copies)

    def to_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "images": self.images, "lr": self.lr,
                "copies": [{"seed": c.seed, "key": c.key, "path": c.path, "cached": c.cached} for c in self.copies]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> FinetuneInfo:
        data = data or {}
        copies = tuple(FinetuneCopy(int(c["seed"]), str(c["key"]), str(c["path"]), bool(c.get("cached")))
                       for c in data.get("copies") or [])
        return cls(int(data.get("epochs") or 0), int(data.get("images") or 0), _f(data.get("lr")), copies)


@dataclass(frozen=True)
class FidelityConfig:
    """What a fidelity run was asked and scored on (``config.json`` without kind and versions)."""

    dataset: str
    model: str  # the model id
    model_kind: str
    methods: tuple[str, ...]
    sparsities: tuple[float, ...]
    alpha: float
    beta: float
    samples: int
    score: str
    families: tuple[str, ...]
    seed: int
    seeds: tuple[int, ...]
    marginal: float | None  # None: a version-1 run (no marginal rule)
    images: int
    finetune: FinetuneInfo
    label_columns: int = 0
    skipped: Mapping[str, int] = field(default_factory=dict)
    baseline: str = ""
    elements: str = ""
    #: :meth:`MaskCounts.as_dict` of the ``mask`` reference's masks; None: no mask method, or an older run
    masks: Mapping[str, Any] | None = None
    #: what was passed (:func:`curate.stages.common.model_identity`: name, pretrained, model_id, passed =
    #: spec | loaded); None: an older run, or a run computed without the stage (compute_fidelity alone)
    model_identity: Mapping[str, Any] | None = None

    @property
    def n_seeds(self) -> int:
        return len(self.seeds)

    @property
    def mask_counts(self) -> MaskCounts | None:
        """The masks the ``mask`` reference used by source (human, exact, model) and the ones left
        out; None when the run scored no ``mask`` method (or predates the counts)."""
        return None if self.masks is None else MaskCounts.from_dict(self.masks)

    def to_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "model": self.model, "model_kind": self.model_kind,
                "methods": list(self.methods), "sparsities": list(self.sparsities), "alpha": self.alpha,
                "beta": self.beta, "samples": self.samples, "score": self.score, "families": list(self.families),
                "seed": self.seed, "seeds": list(self.seeds), "marginal": self.marginal, "images": self.images,
                "finetune": self.finetune.to_dict(), "label_columns": self.label_columns,
                "skipped": dict(self.skipped), "baseline": self.baseline, "elements": self.elements,
                "masks": None if self.masks is None else dict(self.masks),
                **({"model_identity": dict(self.model_identity)} if self.model_identity is not None else {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FidelityConfig:
        marginal = data.get("marginal")
        return cls(
            dataset=str(data.get("dataset") or ""), model=str(data["model"]), model_kind=str(data.get("model_kind") or ""),
            methods=tuple(data.get("methods") or ()), sparsities=tuple(float(s) for s in data.get("sparsities") or ()),
            alpha=_f(data.get("alpha")), beta=_f(data.get("beta")), samples=int(data.get("samples") or 0),
            score=str(data.get("score") or ""), families=tuple(data.get("families") or ()),
            seed=int(data.get("seed") or 0), seeds=tuple(int(s) for s in data.get("seeds") or ()),
            marginal=None if marginal is None else float(marginal), images=int(data.get("images") or 0),
            finetune=FinetuneInfo.from_dict(data.get("finetune")), label_columns=int(data.get("label_columns") or 0),
            skipped={str(k): int(v) for k, v in (data.get("skipped") or {}).items()},
            baseline=str(data.get("baseline") or ""), elements=str(data.get("elements") or ""),
            masks=dict(data["masks"]) if isinstance(data.get("masks"), Mapping) else None,
            model_identity=dict(data["model_identity"]) if isinstance(data.get("model_identity"), Mapping) else None)


# ----------------------------------------------------------------------------- ranking rows
@dataclass(frozen=True)
class VsRandom:
    """A method minus the random map for one order, as a run stores it. It mirrors
    :class:`curate.metrics.fidelity.VsReference` without importing it: records stay torch-free, so
    readers (report, compare, CLI tables) load no deep-learning stack."""

    effect: float
    low: float
    high: float
    by_seed: tuple[float, ...] = ()
    marginal: bool = False

    @property
    def above(self) -> bool:
        return bool(self.low > 0)

    def text(self, digits: int = 3) -> str:
        """``+0.012 [+0.004, +0.020]`` (the em dash when missing)."""
        return (f"{num(self.effect, digits, signed=True)} "
                f"[{num(self.low, digits, signed=True)}, {num(self.high, digits, signed=True)}]")


@dataclass(frozen=True)
class FidelityRow:
    """One method of the ranking: its AUCs, and its verdict against the random map with the intervals."""

    rank: int
    method: str
    family: str  # the family ranked by: ffid, rfid or fid
    aucs: Mapping[str, float]
    verdict: str = ""  # faithful | MoRF only | LeRF only | not above random (+ " (marginal)") | reference | ""
    morf: VsRandom | None = None
    lerf: VsRandom | None = None

    @property
    def plus(self) -> float:
        """AUC of the ranking family's + metric (higher = more faithful)."""
        return _f(self.aucs.get(f"{self.family}_plus"))

    @property
    def minus(self) -> float:
        """AUC of the ranking family's - metric (lower = more faithful)."""
        return _f(self.aucs.get(f"{self.family}_minus"))

    @property
    def ffid_plus(self) -> float:
        return _f(self.aucs.get("ffid_plus"))

    @property
    def ffid_minus(self) -> float:
        return _f(self.aucs.get("ffid_minus"))

    @property
    def is_reference(self) -> bool:
        return self.verdict == "reference"

    @property
    def marginal(self) -> bool:
        """The verdict rests on an interval whose lower bound nearly touches 0."""
        return self.verdict.endswith(MARGINAL_SUFFIX)

    @property
    def verdict_base(self) -> str:
        """The verdict without the ``(marginal)`` suffix."""
        return self.verdict[: -len(MARGINAL_SUFFIX)] if self.marginal else self.verdict

    def vs_random_text(self, order: str) -> str:
        """``+0.012 [+0.004, +0.020]`` for ``morf`` or ``lerf``; empty when there is none (the reference)."""
        vs = {"morf": self.morf, "lerf": self.lerf}[order]
        return vs.text() if vs is not None else ""

    def to_dict(self) -> dict[str, Any]:
        """The flat row of ``ranking.csv`` / ``summary.json`` (version-1 keys, plus the version-2 ones)."""
        row: dict[str, Any] = {"rank": self.rank, "method": self.method, "by": self.family, **dict(self.aucs)}
        for order, vs in (("morf", self.morf), ("lerf", self.lerf)):
            if vs is not None:
                row.update({f"vs_random_{order}": vs.effect, f"vs_random_{order}_low": vs.low,
                            f"vs_random_{order}_high": vs.high, f"vs_random_{order}_marginal": vs.marginal,
                            f"vs_random_{order}_by_seed": list(vs.by_seed)})
        if self.verdict:
            row["verdict"] = self.verdict
        return row

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FidelityRow:
        aucs = {k: _f(data[k]) for k in METRIC_KEYS if k in data}
        sides = {}
        for order in ("morf", "lerf"):
            key = f"vs_random_{order}"
            sides[order] = None if data.get(key) is None else VsRandom(
                _f(data[key]), _f(data.get(key + "_low")), _f(data.get(key + "_high")),
                tuple(_f(x) for x in data.get(key + "_by_seed") or ()), bool(data.get(key + "_marginal") or False))
        family = str(data.get("by") or next((f for f in ("ffid", "rfid", "fid") if f"{f}_plus" in aucs), "fid"))
        return cls(int(data["rank"]), str(data["method"]), family, aucs, str(data.get("verdict") or ""),
                   sides["morf"], sides["lerf"])


# ----------------------------------------------------------------------------- curves
@dataclass(frozen=True)
class CurveSet:
    """One method's curves over sparsity: the mean over seeds and images, and per seed."""

    sparsities: tuple[float, ...]
    values: Mapping[str, list[float]]  # metric -> one value per sparsity
    images: int
    by_seed: Mapping[int, Mapping[str, list[float]]] = field(default_factory=dict)

    def __getitem__(self, metric: str) -> list[float]:
        return list(self.values[metric])

    @property
    def metrics(self) -> list[str]:
        return [m for m in METRIC_KEYS if m in self.values]

    def auc(self, metric: str, seed: int | None = None) -> float:
        """Trapezoid AUC divided by the sparsity range (the curve's mean), of the mean or one seed."""
        y = self.values[metric] if seed is None else self.by_seed[seed][metric]
        x = self.sparsities
        if len(x) == 1:
            return float(y[0])
        area = sum((x[i + 1] - x[i]) * (y[i + 1] + y[i]) / 2 for i in range(len(x) - 1))
        return area / (x[-1] - x[0])


def plot_curves(curves: Mapping[str, CurveSet]) -> bytes:
    """PNG of each metric's mean curve over sparsity, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = next(iter(curves.values())).metrics
    nrows = (len(metrics) + 1) // 2
    fig, axes = plt.subplots(nrows, 2, figsize=(10, 3.2 * nrows), squeeze=False)
    for ax, metric in zip(axes.ravel(), metrics):
        for method, c in curves.items():
            ax.plot(c.sparsities, c.values[metric], marker=".", label=method)
        ax.set_title(metric.replace("_plus", "+ (MoRF)").replace("_minus", "- (LeRF)"))
        ax.set_xlabel("sparsity")
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(metrics):]:
        ax.axis("off")
    axes.ravel()[0].legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _csv(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields), restval="", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


# ----------------------------------------------------------------------------- the record
@register_run_kind
@dataclass
class FidelityRun(RunRecord):
    """Config and results of one fidelity run (see the module docstring)."""

    KIND: ClassVar[str] = "fidelity"
    VERSION: ClassVar[int] = 2  # 2: several seeds, intervals over seeds x images, the marginal rule
    CURVES_CSV: ClassVar[str] = "curves.csv"
    CURVES_JSON: ClassVar[str] = "curves.json"
    AUCS: ClassVar[str] = "aucs.json"
    RANKING: ClassVar[str] = "ranking.csv"
    CORRELATIONS: ClassVar[str] = "correlations.json"
    PLOT: ClassVar[str] = "curves.png"
    SUMMARY: ClassVar[str] = "summary.json"

    config: FidelityConfig
    curves: dict[str, CurveSet]
    aucs: dict[str, dict[str, float]]
    ranking: list[FidelityRow]
    correlations: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    aucs_by_seed: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    run_dir: Path | None = None

    # -- record protocol
    def config_dict(self) -> dict[str, Any]:
        return self.config.to_dict()

    def _write_results(self, run_dir: Path) -> None:
        rows = [{"method": m, "metric": metric, "sparsity": s, "value": v} for m, c in self.curves.items()
                for metric in c.metrics for s, v in zip(c.sparsities, c.values[metric])]
        write_bytes(run_dir / self.CURVES_CSV, _csv(rows, ["method", "metric", "sparsity", "value"]))
        write_json(run_dir / self.CURVES_JSON, {
            m: {"sparsities": list(c.sparsities), "curves": {k: list(v) for k, v in c.values.items()},
                "images": c.images, "by_seed": {str(s): dict(v) for s, v in c.by_seed.items()}}
            for m, c in self.curves.items()})
        write_json(run_dir / self.AUCS, self.aucs)
        ranking = [r.to_dict() for r in self.ranking]
        fields = list(dict.fromkeys(k for row in ranking for k in row if not k.endswith("_by_seed")))
        write_bytes(run_dir / self.RANKING, _csv(ranking, fields) if ranking else b"")
        if self.correlations:
            write_json(run_dir / self.CORRELATIONS, self.correlations)
        else:  # an overwritten run may hold one from before
            (run_dir / self.CORRELATIONS).unlink(missing_ok=True)
        if self.curves:
            write_bytes(run_dir / self.PLOT, plot_curves(self.curves))
        write_json(run_dir / self.SUMMARY, {
            "config": {"kind": self.KIND, **self.config.to_dict()}, "aucs": self.aucs,
            "aucs_by_seed": {m: {str(s): a for s, a in v.items()} for m, v in self.aucs_by_seed.items()},
            "ranking": ranking, "correlations": self.correlations, "timings": self.timings})

    @classmethod
    def migrate(cls, config: dict[str, Any], version: int) -> dict[str, Any]:
        if version < 2:  # one fine-tuning seed; finetune held one copy's key, path and cached flag
            config["seeds"] = [int(config.get("seed") or 0)]
            config["marginal"] = None
            ft = dict(config.get("finetune") or {})
            copies = ([{"seed": config["seeds"][0], "key": ft["key"], "path": ft.get("path", ""),
                        "cached": bool(ft.get("cached"))}] if ft.get("key") else [])
            config["finetune"] = {"epochs": ft.get("epochs", 0), "images": ft.get("images", 0), "lr": ft.get("lr"),
                                  "copies": copies}
        return config

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> FidelityRun:
        def read(name: str, required: bool = True) -> Any:
            return read_result_json(run_dir, name, required=required, mapping=False)

        summary = read(cls.SUMMARY)
        if not isinstance(summary, dict) or not isinstance(summary.get("ranking"), list):
            raise RunError(f"run {run_dir.name}: {cls.SUMMARY} has no ranking")
        curves_data = read(cls.CURVES_JSON, required=False) or {}
        curves = {m: CurveSet(tuple(float(s) for s in c["sparsities"]), {k: list(v) for k, v in c["curves"].items()},
                              int(c.get("images") or 0),
                              {int(s): dict(v) for s, v in (c.get("by_seed") or {}).items()})
                  for m, c in curves_data.items()}
        aucs = read(cls.AUCS, required=False) or summary.get("aucs") or {}
        correlations = summary.get("correlations") or read(cls.CORRELATIONS, required=False) or {}
        by_seed = {m: {int(s): dict(a) for s, a in v.items()} for m, v in (summary.get("aucs_by_seed") or {}).items()}
        return cls(config=FidelityConfig.from_dict(config), curves=curves,
                   aucs={m: {k: _f(v) for k, v in a.items()} for m, a in aucs.items()},
                   ranking=[FidelityRow.from_dict(r) for r in summary["ranking"]], correlations=correlations,
                   aucs_by_seed=by_seed, timings=dict(summary.get("timings") or {}), run_dir=run_dir)

    # -- typed views
    @property
    def methods(self) -> list[str]:
        return [r.method for r in self.ranking]

    @property
    def family(self) -> str:
        """The family the ranking uses: ``ffid``, ``rfid`` or ``fid``."""
        return self.ranking[0].family if self.ranking else "ffid"

    @property
    def family_label(self) -> str:
        """``F-Fid``, ``R-Fid`` or ``Fid``."""
        return FAMILY_LABELS.get(self.family, self.family)

    @property
    def metrics(self) -> list[str]:
        """The metric keys this run computed, in display order."""
        present = {k for a in self.aucs.values() for k in a}
        return [m for m in METRIC_KEYS if m in present]

    @property
    def has_verdicts(self) -> bool:
        """The random reference was scored, so the rows carry verdicts."""
        return any(r.verdict for r in self.ranking)

    @property
    def verdicts(self) -> dict[str, str]:
        return {r.method: r.verdict for r in self.ranking}

    def row(self, method: str) -> FidelityRow:
        for r in self.ranking:
            if r.method == method:
                return r
        raise KeyError(f"run {self.name} did not score {method!r}; it scored {', '.join(self.methods)}")

    def macro_correlations(self, base: str) -> dict[str, float]:
        """``{metric: macro Spearman with the noise ratio}`` of a degraded series (papers/002 §5)."""
        return {m: _f(v.get("macro")) for m, v in (self.correlations.get(base) or {}).items() if "macro" in v}

    @property
    def plot_path(self) -> Path | None:
        """``curves.png`` of a written run, when it exists."""
        if self.run_dir is None:
            return None
        path = self.run_dir / self.PLOT
        return path if path.is_file() else None

    @property
    def mask_line(self) -> str:
        """How many masks of each source the ``mask`` reference used (:meth:`MaskCounts.line`); empty
        when the run used no mask (no ``mask`` method), or predates the counts and scored one."""
        counts = self.config.mask_counts
        if counts is not None:
            return counts.line()
        if any(m == "mask" or m.startswith("mask~") for m in self.config.methods):
            return "masks: sources not recorded (a run written before curate counted them)"
        return ""

    @property
    def interval_note(self) -> str:
        """How the verdicts' intervals were obtained, for table captions."""
        n = self.config.n_seeds
        if self.config.marginal is None:
            return "paired 95% bootstrap over images (one fine-tuning seed)"
        rule = (f"; marginal = lower bound below {self.config.marginal:g} x the effect"
                if self.config.marginal else "")
        return f"paired 95% bootstrap over {n} seed{'s' if n != 1 else ''} x images{rule}"
