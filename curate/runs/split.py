"""The split run: spurious discovery on a dataset folder (``curate split``, papers/003 §2.1).

Files (``runs/<name>/``):

- ``config.json``: ``rule`` (the :class:`curate.split.discovery.SplitRule` fields), ``references``
  (one entry per reference evaluation run: run, name, pretrained, model_id, label_space,
  prompts, and ``passed``: what the caller gave -- "spec" (a ModelSpec, a name or a weights
  file), "loaded" (an already loaded model; name and pretrained are then what it records of its
  own origin, :func:`curate.stages.common.model_identity`) or "predictions" (a finished evaluation
  run)), ``reference`` (the first of them), ``prompt``, ``pins``, ``label_sources`` (how many
  of the background labels the rule used came from people, the synthetic world, or a model),
  the counts (``kept_classes``, ``dropped_classes``, ``easy_samples``, ``hard_samples``),
  ``changed`` (samples whose group this run changed) and ``label_use`` (:class:`LabelUse`: which
  labels it split on, and the photos left out as disputed or unlabelled; absent before issue 44);
- ``split.json``: ``classes`` (one row per class: the decision, easy/hard backgrounds and
  accuracies, the backgrounds tied with them (``easy_ties`` / ``hard_ties``), the in-sample drop
  and its interval, the permutation p-value, the cross-fitted drop, counts and every
  (class, background) cell), plus the noise summary, the reference drop and the config again for
  readers outside curate;
- ``split.md`` / ``split.csv`` (the paper's Tables 1 and 5 with curate's columns; ties marked and
  explained), ``cells.csv`` (every class x background accuracy): written by the record, from
  :mod:`curate.runs.split_tables` (no figure code);
- ``fig3_counts.png`` and ``fig4_drops.png``: written by the split stage
  (:func:`curate.split.tables.write_figures`) before the record, so the record imports no
  matplotlib; a record written on its own has no figures.

Version 1 (before cross-fitting and label sources) has the same files; it loads with
``rule.crossfit_folds = 0``, NaN cross-fitted drops and unknown label sources. Versions 1 and 2
(before ties were recorded) load with each class's ties derived from its cells (the cells hold
every accuracy, n and eligibility the rule saw, so the derivation is exact) and references with
``passed = None``.

Accuracies and drops are fractions in [0, 1]; tables print them as points.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from curate.jsonio import write_json
from curate.metrics.split_rule import ClassSplit, NoiseSummary, SplitRule, noise_summary, tied_backgrounds
from curate.runs import split_tables
from curate.runs.base import RunRecord, read_result_json, write_bytes
from curate.runs.registry import register_run_kind

__all__ = ["PAPER_PROMPT", "LabelSources", "LabelUse", "ReferenceDrop", "SplitCell", "SplitClass", "SplitReference", "SplitRun"]

#: The prompt of the paper's split (papers/003 §2.1).
PAPER_PROMPT = "A photo of {}."


def _f(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _pair(x: Any) -> tuple[float, float]:
    return (_f(x[0]), _f(x[1])) if x else (float("nan"), float("nan"))


@dataclass(frozen=True)
class SplitCell:
    """One (class, background) cell: the reference accuracy (fraction), n, interval, eligibility."""

    background: str
    n: int
    accuracy: float
    ci: tuple[float, float]
    eligible: bool

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SplitCell:
        return cls(str(d["background"]), int(d["n"]), _f(d.get("accuracy")), _pair(d.get("ci")), bool(d.get("eligible")))


@dataclass(frozen=True)
class SplitClass:
    """The decision for one class (accuracies and drops are fractions)."""

    class_index: int
    class_name: str
    kept: bool
    reason: str
    pinned: bool = False
    easy: str | None = None
    hard: str | None = None
    easy_acc: float = float("nan")
    hard_acc: float = float("nan")
    drop: float = float("nan")  # in-sample: measured on the samples that chose easy and hard
    drop_ci: tuple[float, float] = (float("nan"), float("nan"))
    p_value: float = float("nan")  # permutation test of max - min over the eligible backgrounds
    crossfit_drop: float = float("nan")  # selection-corrected (cross-fitted) drop
    crossfit_note: str = ""
    n_easy: int = 0
    n_hard: int = 0
    cells: tuple[SplitCell, ...] = ()
    easy_ties: tuple[str, ...] = ()  # backgrounds as accurate as easy (easy first; empty: no tie)
    hard_ties: tuple[str, ...] = ()  # backgrounds as accurate as hard (hard first; empty: no tie)

    @classmethod
    def from_split(cls, split: ClassSplit, class_name: str) -> SplitClass:
        """The record row of a :class:`curate.split.discovery.ClassSplit`."""
        values = {f.name: getattr(split, f.name) for f in fields(ClassSplit) if f.name != "cells"}
        cells = tuple(SplitCell(c.background, c.n, c.accuracy, tuple(c.ci), c.eligible) for c in split.cells)
        values["easy_ties"], values["hard_ties"] = tuple(split.easy_ties), tuple(split.hard_ties)
        return cls(class_name=class_name, cells=cells, **{k: v for k, v in values.items() if k in _ROW_FIELDS})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SplitClass:
        return cls(
            class_index=int(d["class_index"]), class_name=str(d.get("class_name") or ""), kept=bool(d["kept"]),
            reason=str(d.get("reason") or ""), pinned=bool(d.get("pinned")), easy=d.get("easy"), hard=d.get("hard"),
            easy_acc=_f(d.get("easy_acc")), hard_acc=_f(d.get("hard_acc")), drop=_f(d.get("drop")),
            drop_ci=_pair(d.get("drop_ci")), p_value=_f(d.get("p_value")), crossfit_drop=_f(d.get("crossfit_drop")),
            crossfit_note=str(d.get("crossfit_note") or ""), n_easy=int(d.get("n_easy") or 0),
            n_hard=int(d.get("n_hard") or 0), cells=tuple(SplitCell.from_dict(c) for c in d.get("cells") or ()),
            easy_ties=tuple(str(b) for b in d.get("easy_ties") or ()),
            hard_ties=tuple(str(b) for b in d.get("hard_ties") or ()),
        )

    def with_derived_ties(self) -> SplitClass:
        """This row with ``easy_ties`` / ``hard_ties`` derived from its cells (a run written before
        ties were recorded; a pinned class has none)."""
        if self.pinned or self.easy is None or self.hard is None:
            return replace(self, easy_ties=(), hard_ties=())
        return replace(self, easy_ties=tied_backgrounds(self.cells, self.easy, highest=True),
                       hard_ties=tied_backgrounds(self.cells, self.hard, highest=False, exclude=self.easy))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        """``"<index> <name>"`` (and `` (pinned)``), as tables show the class."""
        return f"{self.class_index} {self.class_name}" + (" (pinned)" if self.pinned else "")

    @property
    def tie_notes(self) -> list[str]:
        """``["tie: easy chosen among sand (n 40), water (n 40), all at 100.00%: sand, by name order ..."]``
        (one per tied side; ``[]`` without a tie), as the tables show it."""
        return split_tables.tie_notes(self)

    def distinguishable(self, alpha: float = 0.05) -> bool:
        """The permutation test rejects "background does not matter" at ``alpha``."""
        return math.isfinite(self.p_value) and self.p_value < alpha


_ROW_FIELDS = {f.name for f in fields(SplitClass)}


@dataclass(frozen=True)
class SplitReference:
    """One reference evaluation run whose correctness the rule used."""

    run: str
    name: str | None
    pretrained: str | None
    model_id: str | None
    label_space: str | None
    prompts: tuple[str, ...] | None
    #: what the split was given: "spec" (a ModelSpec, a model name or a weights file), "loaded" (an
    #: already loaded model: name and pretrained are what it records of its origin), "predictions" (a
    #: finished evaluation run); None: not recorded (a run written before record version 3)
    passed: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SplitReference:
        prompts = d.get("prompts")
        return cls(str(d.get("run") or ""), d.get("name"), d.get("pretrained"), d.get("model_id"), d.get("label_space"),
                   tuple(prompts) if prompts is not None else None, d.get("passed"))

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "name": self.name, "pretrained": self.pretrained, "model_id": self.model_id,
                "label_space": self.label_space, "prompts": list(self.prompts) if self.prompts is not None else None,
                "passed": self.passed}

    @property
    def is_paper_setting(self) -> bool:
        """1 vs 1000 over ImageNet-1K with "A photo of {}." (papers/003 §2.1)."""
        return self.label_space == "imagenet1k" and tuple(self.prompts or ()) == (PAPER_PROMPT,)


@dataclass(frozen=True)
class LabelSources:
    """Where the background labels the rule used came from (counts of samples)."""

    human: int = 0
    synthetic: int = 0
    model: int = 0
    other: int = 0  # a label with no recorded source

    @classmethod
    def count(cls, sources: Sequence[str | None]) -> LabelSources:
        values = {"human": 0, "synthetic": 0, "model": 0, "other": 0}
        for s in sources:
            values[s if s in ("human", "synthetic", "model") else "other"] += 1
        return cls(**values)

    @property
    def total(self) -> int:
        return self.human + self.synthetic + self.model + self.other

    @property
    def text(self) -> str:
        """``"background labels: 120 human, 0 synthetic, 0 model"`` (``other`` only when present)."""
        parts = [f"{self.human} human", f"{self.synthetic} synthetic", f"{self.model} model"]
        parts += [f"{self.other} without a source"] if self.other else []
        return "background labels used: " + ", ".join(parts)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class LabelUse:
    """Which labels the rule split on, and which photos it left out for their label (issue 44).

    ``labels``: "folder" (the folder's backgrounds: agreed, adjudicated and single labels where the
    annotations were derived, ``curate agreement``) or "annotator:<name>" (that annotator's answers
    alone, ``--annotator``). ``used``: per label status (``label_status.parquet``; "no status" for a
    photo never derived, as in every folder from before issue 44) the accepted photos with a class
    the rule used; ``left_out``: those it left out: "disputed" and "unlabelled" (no agreed label;
    the paper's "photos challenging to be labeled", now counted), "not answered" (``--annotator``:
    photos that annotator did not label)."""

    labels: str = "folder"
    used: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """``"labels: folder; left out: disputed 3, unlabelled 1"``."""
        out = ", ".join(f"{k} {v}" for k, v in sorted(self.left_out.items()) if v) or "none"
        return f"labels: {self.labels}; photos left out for their label: {out}"

    def to_dict(self) -> dict[str, Any]:
        return {"labels": self.labels, "used": dict(self.used), "left_out": dict(self.left_out)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LabelUse:
        return cls(str(d.get("labels") or "folder"), {str(k): int(v) for k, v in (d.get("used") or {}).items()},
                   {str(k): int(v) for k, v in (d.get("left_out") or {}).items()})


class ReferenceDrop(NamedTuple):
    """The reference model's mean drop over the kept classes (fractions)."""

    in_sample: float  # on the samples that chose easy and hard (how the paper reports it)
    corrected: float  # cross-fitted (selection-corrected)


@register_run_kind
@dataclass
class SplitRun(RunRecord):
    """Config and results of one split (see the module docstring)."""

    KIND: ClassVar[str] = "split"
    VERSION: ClassVar[int] = 3  # 2: cross-fitted drops, label sources, noise summary; 3: ties, references' passed
    MARKDOWN: ClassVar[str] = "split.md"
    CSV: ClassVar[str] = "split.csv"
    CELLS: ClassVar[str] = "cells.csv"
    SUMMARY: ClassVar[str] = "split.json"
    FIG_COUNTS: ClassVar[str] = "fig3_counts.png"  # written by the stage (curate.split.tables.write_figures)
    FIG_DROPS: ClassVar[str] = "fig4_drops.png"  # idem

    rule: SplitRule
    references: list[SplitReference]
    classes: list[SplitClass]
    label_sources: LabelSources | None = None  # None: a version 1 run (not recorded)
    pins: dict[int, tuple[str, str]] = field(default_factory=dict)
    changed: int | None = None  # samples whose group this run changed (None: not recorded)
    prompt: str = PAPER_PROMPT
    label_use: LabelUse | None = None  # None: written before issue 44 (not recorded)
    run_dir: Path | None = None

    # -- record protocol
    def config_dict(self) -> dict[str, Any]:
        kept = self.kept
        return {
            "rule": asdict(self.rule), "references": [r.to_dict() for r in self.references],
            "reference": self._reference_dict(), "prompt": self.prompt,
            "pins": {str(c): list(v) for c, v in sorted(self.pins.items())},
            "label_sources": self.label_sources.to_dict() if self.label_sources else None,
            "kept_classes": len(kept), "dropped_classes": len(self.classes) - len(kept),
            "easy_samples": sum(s.n_easy for s in kept), "hard_samples": sum(s.n_hard for s in kept),
            "changed": self.changed,
            "label_use": self.label_use.to_dict() if self.label_use else None,
        }

    def _reference_dict(self) -> dict[str, Any] | None:
        if not self.references:
            return None
        first = self.references[0]
        return {"name": first.name, "pretrained": first.pretrained, "model_id": first.model_id}

    def summary_dict(self) -> dict[str, Any]:
        """What ``split.json`` holds besides the classes (also what ``dataset.yaml`` records)."""
        drop = self.reference_drop()
        noise = self.noise_summary
        return {**self.config_dict(), "crossfit_scheme": self.rule.crossfit_scheme,
                "noise_summary": {"k": noise.k, "n": noise.n, "alpha": noise.alpha, "untested": noise.untested,
                                  "text": noise.text},
                "reference_drop": {"in_sample": drop.in_sample, "corrected": drop.corrected}}

    def _write_results(self, run_dir: Path) -> None:
        """The JSON and the text tables (the figures are the stage's: module docstring)."""
        write_json(run_dir / self.SUMMARY, {"classes": [c.to_dict() for c in self.classes], **self.summary_dict()})
        write_bytes(run_dir / self.CSV, split_tables.to_csv(self.classes).encode())
        write_bytes(run_dir / self.CELLS, split_tables.cells_csv(self.classes).encode())
        write_bytes(run_dir / self.MARKDOWN, split_tables.to_markdown(self).encode())

    #: set by :meth:`migrate` on a run written before ties were recorded (never written back)
    _DERIVE_TIES: ClassVar[str] = "_ties_from_cells"

    @classmethod
    def migrate(cls, config: dict[str, Any], version: int) -> dict[str, Any]:
        if version < 2:  # before cross-fitting: no crossfit settings, no label sources
            config["rule"] = {**(config.get("rule") or {}), "crossfit_folds": 0, "crossfit_repeats": 0}
            config["label_sources"] = None
        if version < 3:  # before ties: derived from the cells on reading (references' passed stays None)
            config[cls._DERIVE_TIES] = True
        return config

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> SplitRun:
        summary = read_result_json(run_dir, cls.SUMMARY)
        known = {f.name for f in fields(SplitRule)}
        rule = SplitRule(**{k: v for k, v in (config.get("rule") or {}).items() if k in known})
        sources = config.get("label_sources")
        pins = {int(c): (str(v[0]), str(v[1])) for c, v in (config.get("pins") or {}).items()}
        changed = config.get("changed")
        classes = [SplitClass.from_dict(c) for c in summary.get("classes") or [] if "class_index" in c]
        if config.get(cls._DERIVE_TIES):
            classes = [c.with_derived_ties() for c in classes]
        return cls(rule=rule, references=[SplitReference.from_dict(r) for r in config.get("references") or []],
                   classes=classes,
                   label_sources=LabelSources(**{k: int(v) for k, v in sources.items()}) if sources else None,
                   pins=pins, changed=int(changed) if changed is not None else None,
                   prompt=str(config.get("prompt") or PAPER_PROMPT),
                   label_use=LabelUse.from_dict(config["label_use"]) if config.get("label_use") else None,
                   run_dir=run_dir)

    # -- typed views
    @property
    def kept(self) -> list[SplitClass]:
        """The kept classes, in class order."""
        return [c for c in self.classes if c.kept]

    @property
    def dropped(self) -> list[SplitClass]:
        return [c for c in self.classes if not c.kept]

    def by_class(self) -> dict[int, SplitClass]:
        """``{class_index: row}``."""
        return {c.class_index: c for c in self.classes}

    @property
    def noise_summary(self) -> NoiseSummary:
        """"k of n kept classes are not distinguishable from noise (p >= alpha)"."""
        return noise_summary(self.classes, self.rule.alpha)

    def reference_drop(self) -> ReferenceDrop:
        """The reference's mean drop over the kept classes: in-sample and cross-fitted (NaN when none)."""
        kept = self.kept
        drops = [c.drop for c in kept if math.isfinite(c.drop)]
        corrected = [c.crossfit_drop for c in kept if math.isfinite(c.crossfit_drop)]
        return ReferenceDrop(sum(drops) / len(drops) if drops else float("nan"),
                             sum(corrected) / len(corrected) if corrected else float("nan"))

    def reference_drop_text(self) -> str:
        """``"in-sample 84.1 (selection-corrected 78.7) points"``, as compare and the report show it."""
        from curate.formatting import pct

        drop = self.reference_drop()
        return f"in-sample {pct(drop.in_sample)} (selection-corrected {pct(drop.corrected)}) points"

    @property
    def in_sample_note(self) -> str:
        """The sentence that flags the reference model's drop as in-sample, with the scheme."""
        return ("The reference model chose the easy and hard backgrounds, so its drop on them is measured on the "
                "samples that chose them (in-sample), as the paper reports it; the selection-corrected figure is "
                f"cross-fitted ({self.rule.crossfit_scheme}).")

    def is_reference(self, model_id: str | None = None, run: str | None = None) -> bool:
        """True when an evaluation run (by model id or run name) is one of this split's references."""
        return any((model_id and r.model_id == model_id) or (run and r.run == run) for r in self.references)

    @property
    def reference_labels(self) -> list[str]:
        """How tables name the reference models."""
        from curate.models.spec import ModelSpec

        return [ModelSpec(r.name or "?", r.pretrained).label for r in self.references]
