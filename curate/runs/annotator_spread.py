"""The annotator-spread run: how much each class's drop depends on who labelled (issue 44).

Written by :func:`curate.stages.annotator_spread.annotator_spread` from the evaluation runs'
per-sample predictions, the split's rule, references and pins, and the labellings of the
annotation table (formulas: :mod:`curate.metrics.annotator_spread`).

Files (``runs/<name>/``):

- ``config.json``: ``split_run`` (the split whose rule and references re-derived easy/hard),
  ``base`` (the labelling flips are measured against: ``agreed``), ``labellings`` (re-derived,
  the base first), ``models`` (one entry per model: ``model`` label, ``run`` = its evaluation
  run), ``class_names``, ``disputed`` (disputed photos), ``photos`` (photos considered), ``rule``
  and ``threshold`` (how the agreed labels were decided; a run without them loads with "" and None);
- ``spread.json``: ``splits`` (one row per labelling and class: kept, easy, hard) and ``cells``
  (one row per model, labelling and class: easy/hard accuracy, drop, counts; fractions);
- ``spread.csv``: the cells; ``spread.md``: per model, a class x labelling table of drops in
  points with the spread and the flag.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from curate.formatting import pct
from curate.jsonio import write_json
from curate.metrics.annotator_spread import LabellingSplit, Spread, SpreadCell
from curate.runs.base import RunRecord, read_result_json, write_bytes
from curate.runs.registry import register_run_kind

__all__ = ["AnnotatorSpreadRun", "SpreadModel", "SpreadRow"]


def _f(x: Any) -> float:
    return float("nan") if x is None else float(x)


@dataclass(frozen=True)
class SpreadModel:
    """One model the spread measured: how tables name it and the evaluation run it read."""

    model: str
    run: str


@dataclass(frozen=True)
class SpreadRow:
    """One (model, class) line: the drop under each labelling (fractions), the spread and the flag."""

    model: str
    class_index: int
    class_name: str
    drops: dict[str, float]  # labelling -> drop (NaN: not kept there, or a group empty)
    spread: float
    flagged: bool


@register_run_kind
@dataclass
class AnnotatorSpreadRun(RunRecord):
    """Config and results of one annotator-spread measurement (module docstring)."""

    KIND: ClassVar[str] = "annotator-spread"
    VERSION: ClassVar[int] = 1
    SUMMARY: ClassVar[str] = "spread.json"
    CSV: ClassVar[str] = "spread.csv"
    MARKDOWN: ClassVar[str] = "spread.md"

    split_run: str
    spread: Spread
    models: list[SpreadModel]
    class_names: dict[int, str] = field(default_factory=dict)
    photos: int = 0
    rule: str = ""  # the agreed labels' rule (curate.agreement.aggregate)
    threshold: float | None = None  # its threshold (None: the rule's default)
    run_dir: Path | None = None

    # -- record protocol
    def config_dict(self) -> dict[str, Any]:
        return {"split_run": self.split_run, "base": self.spread.base, "labellings": list(self.spread.labellings),
                "models": [asdict(m) for m in self.models],
                "class_names": {str(c): n for c, n in sorted(self.class_names.items())},
                "disputed": self.spread.disputed, "photos": self.photos, "rule": self.rule,
                "threshold": self.threshold}

    def _write_results(self, run_dir: Path) -> None:
        splits = [asdict(s) for by_class in self.spread.splits.values() for s in by_class.values()]
        write_json(run_dir / self.SUMMARY, {"splits": splits, "cells": [asdict(c) for c in self.spread.cells]})
        write_bytes(run_dir / self.CSV, self.to_csv().encode())
        write_bytes(run_dir / self.MARKDOWN, self.to_markdown().encode())

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> AnnotatorSpreadRun:
        summary = read_result_json(run_dir, cls.SUMMARY)
        labellings = [str(n) for n in config["labellings"]]
        splits: dict[str, dict[int, LabellingSplit]] = {n: {} for n in labellings}
        for s in summary.get("splits") or []:
            row = LabellingSplit(str(s["labelling"]), int(s["class_index"]), bool(s["kept"]), s.get("easy"),
                                 s.get("hard"))
            splits.setdefault(row.labelling, {})[row.class_index] = row
        cells = [SpreadCell(str(c["model"]), str(c["labelling"]), int(c["class_index"]), bool(c["kept"]), c.get("easy"),
                            c.get("hard"), _f(c.get("easy_acc")), _f(c.get("hard_acc")), _f(c.get("drop")),
                            int(c.get("n_easy") or 0), int(c.get("n_hard") or 0)) for c in summary.get("cells") or []]
        spread = Spread(str(config["base"]), labellings, splits, cells, int(config.get("disputed") or 0))
        return cls(split_run=str(config["split_run"]), spread=spread,
                   models=[SpreadModel(str(m["model"]), str(m["run"])) for m in config.get("models") or []],
                   class_names={int(c): str(n) for c, n in (config.get("class_names") or {}).items()},
                   photos=int(config.get("photos") or 0), rule=str(config.get("rule") or ""),
                   threshold=None if config.get("threshold") is None else float(config["threshold"]), run_dir=run_dir)

    # -- typed views
    @property
    def columns(self) -> list[str]:
        """The labellings a row shows, in order: the re-derived ones, then the disputed bounds present."""
        extra = [n for n in dict.fromkeys(c.labelling for c in self.spread.cells) if n not in self.spread.labellings]
        return list(self.spread.labellings) + extra

    def flagged(self) -> dict[int, list[LabellingSplit]]:
        """class -> the labellings whose easy/hard assignment differs from the base's."""
        return self.spread.flips()

    def rows(self) -> list[SpreadRow]:
        """One row per model and class present, in the models' then the classes' order."""
        flagged = self.flagged()
        out = []
        for m in self.models:
            mine = [c for c in self.spread.cells if c.model == m.model]
            for c in sorted({x.class_index for x in mine}):
                drops = {x.labelling: (x.drop if x.kept else float("nan")) for x in mine if x.class_index == c}
                out.append(SpreadRow(m.model, c, self.class_names.get(c, str(c)), drops,
                                     self.spread.spread(m.model, c), c in flagged))
        return out

    def flag_text(self, class_index: int) -> str:
        """``"flips: careful a/b -> a/c, random not kept"`` ("" when the class is not flagged)."""
        flips = self.flagged().get(class_index)
        if not flips:
            return ""
        base = self.spread.splits[self.spread.base].get(class_index)

        def pair(s: LabellingSplit | None) -> str:
            return f"{s.easy}/{s.hard}" if s is not None and s.kept else "not kept"

        return "flips: " + ", ".join(f"{s.labelling} {pair(base)} -> {pair(s)}" for s in flips)

    def to_markdown(self) -> str:
        """Per model, a class x labelling table of drops (points), the spread and the flips."""
        cols = self.columns
        lines = [f"Drop (easy - hard, points) of each class under each labelling; easy/hard re-derived per labelling "
                 f"by the rule of split `{self.split_run}`; `{self.spread.base}` = the aggregated labels "
                 f"({self.spread.disputed} disputed photo(s) left out, then put in either group); spread = max - min "
                 "over the labellings that keep the class. In-sample and per model (docs/science.md#annotator-spread).",
                 ""]
        for m in self.models:
            lines += [f"### {m.model} (`{m.run}`)", "", "| class | " + " | ".join(cols) + " | spread | flag |",
                      "|" + "---|" * (len(cols) + 3)]
            for r in (r for r in self.rows() if r.model == m.model):
                lines.append(f"| {r.class_index} {r.class_name} | " + " | ".join(pct(r.drops.get(n, math.nan), 1)
                                                                              for n in cols)
                             + f" | {pct(r.spread, 1)} | {self.flag_text(r.class_index)} |")
            lines.append("")
        return "\n".join(lines)

    def to_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["model", "labelling", "class_index", "class_name", "kept", "easy", "hard", "easy_acc1",
                         "hard_acc1", "drop", "n_easy", "n_hard"])
        for c in self.spread.cells:
            writer.writerow([c.model, c.labelling, c.class_index, self.class_names.get(c.class_index, ""), c.kept,
                             c.easy, c.hard, c.easy_acc, c.hard_acc, c.drop, c.n_easy, c.n_hard])
        return buffer.getvalue()
