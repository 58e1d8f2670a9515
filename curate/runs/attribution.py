"""The attribution run: the observed drop split into the background's part and the rest (``curate attribution``).

Files (``runs/<name>/`` of the intervention folder; docs/design.md#interventions):

- ``config.json``: ``intervention`` (the :class:`curate.runs.InterventionRun` it read: run name,
  source folder, split, sigma, whether it holds exact counterfactuals), ``settings`` (bootstrap
  replicates, seed, level, the paste-control threshold), ``models`` (one entry per evaluation run:
  run, model label and id, family, label space, chance);
- ``attribution.json``: per model ``overall`` (each statistic of
  :data:`STATISTICS` with its interval), ``classes_used`` (classes
  in the overall decomposition) and ``classes`` (per class: photo counts, values, intervals,
  ``n_refills`` (scored refills, the fill control), ``n_bgonly`` (scored swap-bgonly images, the fill
  control that needs no fill; null in a record older than version 3), ``reason`` when the decomposition is undefined,
  ``flag`` when a control is beyond the threshold);
- ``attribution.md`` / ``attribution.csv``: the tables people read (points, 95% intervals).

Values are fractions in [0, 1] (differences in [-1, 1]); tables print them as points.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from curate.formatting import ci, md_table, num, pct, pct_ci
from curate.jsonio import write_json
from curate.runs.base import RunRecord, read_result_json, write_bytes
from curate.runs.registry import register_run_kind

__all__ = ["STATISTICS", "AttributionRun", "ModelAttribution", "ClassRow", "DECOMPOSITION_NOTE", "GHOST_NOTE",
           "GHOST_FLAG", "FILL_EFFECT_FLAG", "DECOMPOSITION_COLUMNS", "CLASS_COLUMNS"]

#: The statistics of a class and of the whole set, in the order tables show them (computed by
#: :func:`curate.interventions.attribution.attribute`; defined here, below it, since the record stores them).
STATISTICS: tuple[str, ...] = ("easy", "hard", "drop", "hard_on_easy", "background_part", "rest", "easy_on_hard",
                               "background_part_reverse", "paste_cost", "only_fg", "no_fg", "only_bg", "mixed_same",
                               "mixed_rand", "mixed_next", "bg_gap", "noisy_fg", "noisy_bg", "rfs", "adversarial",
                               "ghost", "ghost_neutral", "hard_on_easy_unghosted", "background_part_unghosted",
                               "ghost_bias", "hard_refilled", "fill_bias", "background_part_fill_corrected",
                               "hard_on_easy_bgonly", "background_part_bgonly", "fill_effect")
#: The fill control's statistics of a version 1 record (B over all swaps - B over covered swaps): another
#: statistic under the same name, so a version 1 record is read with the fill control undefined.
OLD_FILL_STATISTICS: tuple[str, ...] = ("hard_on_easy_covered", "background_part_covered", "fill_bias")
#: What the decomposition can and cannot show (tables and the report print it).
DECOMPOSITION_NOTE = (
    "drop D = easy - hard on the masked photos; background part B = accuracy of the hard objects pasted on easy "
    "backgrounds of their class - hard; rest = D - B (object scale, pose, light, occlusion... and paste artefacts). "
    "Intervals: paired bootstrap over photos within (class, group). In-sample for the split's reference model (it "
    "chose easy and hard to maximise its own drop). B assumes the mask carries the object and the filled-in hole "
    "carries no class evidence; the paste control (original - object pasted back on its own filled background) "
    "says what cutting and pasting alone costs, the ghost control (B - B unghosted: B against B on the same donors "
    "with each hole's bounding box filled, no outline of the donor's object left) what the filled hole adds to B; "
    "ghost / ghost-neutral: how often the model names the class from the donor's filled background alone / with the "
    "object's mask in the mean colour, against chance. The fill control (refill - original) needs no truth: each "
    "hard photo with the part of its swap donor's hole that the object leaves showing filled the same way from its "
    "own background, against the photo itself, paired: what the visible fill adds to B, whichever fill; B "
    "fill-corrected = B - fill control; refills n counts the scored refills. The fill effect (B - B bg-alone) needs "
    "photos of the easy backgrounds alone (curate intervene --background-photos): each hard object also pasted on "
    "such a photo, no hole and nothing filled, paired per photo: what the donors' filled backgrounds add to B; "
    "bg-alone n counts those images.")
#: The decomposition table's columns (CLI, attribution.md, the report).
DECOMPOSITION_COLUMNS: tuple[str, ...] = ("model", "label space", "drop D", "background B", "rest D - B",
                                          "paste control", "ghost control", "B unghosted", "fill control",
                                          "B fill-corrected", "refills n", "fill effect", "B bg-alone",
                                          "bg-alone n", "classes", "flagged")
#: The per-class table's columns (CLI ``--classes``, attribution.md, the report).
CLASS_COLUMNS: tuple[str, ...] = ("class", "easy n", "hard n", "easy", "hard", "D", "B", "rest", "paste control",
                                  "ghost control", "B unghosted", "fill control", "B fill-corrected", "refills n",
                                  "fill effect", "B bg-alone", "bg-alone n", "note")
#: One line under the anchors' table (docs/interventions.md#the-ghost-control).
GHOST_NOTE = ("ghost / ghost-neutral beside chance mean little for a model that reads the background: an easy "
              "background of the class names the class with no outline at all, so a high ghost accuracy can be the "
              "background and a low one does not clear the hole; read the ghost control (B - B unghosted), not them.")
#: What a class's flag starts with when the ghost control flagged it (:func:`curate.stages.attribution`).
GHOST_FLAG = "ghost control:"
#: What a class's flag starts with when the fill control that needs no fill flagged it.
FILL_EFFECT_FLAG = "fill effect:"


def _f(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _pair(x: Any) -> tuple[float, float]:
    return (_f(x[0]), _f(x[1])) if x else (float("nan"), float("nan"))


def _clean(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


@dataclass(frozen=True)
class ClassRow:
    """One class of one model: counts, values (fractions), intervals, why undefined, control flag."""

    class_index: int
    class_name: str
    n_easy: int
    n_hard: int
    values: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    reason: str = ""
    flag: str = ""
    n_refills: int = 0  # scored refills of its hard photos (the fill control)
    n_bgonly: int | None = None  # scored swap-bgonly images (the fill control that needs no fill; None: not measured)

    def to_dict(self) -> dict[str, Any]:
        return {"class_index": self.class_index, "class_name": self.class_name, "n_easy": self.n_easy,
                "n_hard": self.n_hard, "n_refills": self.n_refills, "n_bgonly": self.n_bgonly, "reason": self.reason,
                "flag": self.flag,
                "values": {k: _clean(v) for k, v in self.values.items()},
                "intervals": {k: [_clean(a), _clean(b)] for k, (a, b) in self.intervals.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClassRow:
        return cls(int(d["class_index"]), str(d.get("class_name") or ""), int(d.get("n_easy") or 0),
                   int(d.get("n_hard") or 0), {k: _f(v) for k, v in (d.get("values") or {}).items()},
                   {k: _pair(v) for k, v in (d.get("intervals") or {}).items()}, str(d.get("reason") or ""),
                   str(d.get("flag") or ""), int(d.get("n_refills") or 0),
                   None if d.get("n_bgonly") is None else int(d["n_bgonly"]))

    @property
    def label(self) -> str:
        return f"{self.class_index} {self.class_name}"


@dataclass(frozen=True)
class ModelAttribution:
    """One model's decomposition: overall values and intervals, and its classes."""

    run: str
    model: str
    model_id: str
    family: str
    label_space: str
    chance: float
    overall: dict[str, float]
    overall_ci: dict[str, tuple[float, float]]
    classes_used: int
    classes: tuple[ClassRow, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "model": self.model, "model_id": self.model_id, "family": self.family,
                "label_space": self.label_space, "chance": _clean(self.chance), "classes_used": self.classes_used,
                "overall": {k: {"value": _clean(self.overall.get(k, math.nan)),
                                "ci": [_clean(self.overall_ci.get(k, (math.nan, math.nan))[0]),
                                       _clean(self.overall_ci.get(k, (math.nan, math.nan))[1])]}
                            for k in STATISTICS},
                "classes": [c.to_dict() for c in self.classes]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelAttribution:
        overall = d.get("overall") or {}
        return cls(str(d["run"]), str(d.get("model") or ""), str(d.get("model_id") or ""), str(d.get("family") or ""),
                   str(d.get("label_space") or ""), _f(d.get("chance")),
                   {k: _f((v or {}).get("value")) for k, v in overall.items()},
                   {k: _pair((v or {}).get("ci")) for k, v in overall.items()}, int(d.get("classes_used") or 0),
                   tuple(ClassRow.from_dict(c) for c in d.get("classes") or ()))

    def value(self, statistic: str) -> float:
        return self.overall.get(statistic, math.nan)

    def interval(self, statistic: str) -> tuple[float, float]:
        return self.overall_ci.get(statistic, (math.nan, math.nan))

    @property
    def n_refills(self) -> int:
        """Scored refills over every class (the fill control)."""
        return sum(c.n_refills for c in self.classes)

    @property
    def n_bgonly(self) -> int | None:
        """Scored swap-bgonly images over every class (None: a record older than version 3)."""
        counts = [c.n_bgonly for c in self.classes if c.n_bgonly is not None]
        return sum(counts) if counts else None

    @property
    def flagged(self) -> list[ClassRow]:
        """Classes whose paste control loses more than the threshold."""
        return [c for c in self.classes if c.flag]


def _cell(value: float, interval: tuple[float, float]) -> str:
    """A fraction as points with its interval: ``-12.3 [-15.0, -9.1]``."""
    return pct(value, signed=True) + pct_ci(interval)


@register_run_kind
@dataclass
class AttributionRun(RunRecord):
    """Config and results of one ``curate attribution`` (see the module docstring)."""

    KIND: ClassVar[str] = "attribution"
    # 2: the fill control is refill - original (was B - B over covered swaps); 3: the fill effect (B - B on
    # photos of the backgrounds alone), its B and counts (undefined in older records)
    VERSION: ClassVar[int] = 3
    RESULTS: ClassVar[str] = "attribution.json"
    MARKDOWN: ClassVar[str] = "attribution.md"
    CSV: ClassVar[str] = "attribution.csv"
    FIGURE: ClassVar[str] = "decomposition.png"

    intervention: dict[str, Any]
    settings: dict[str, Any]
    models: list[ModelAttribution] = field(default_factory=list)
    run_dir: Path | None = None

    def config_dict(self) -> dict[str, Any]:
        return {"intervention": self.intervention, "settings": self.settings,
                "models": [{"run": m.run, "model": m.model, "model_id": m.model_id, "family": m.family,
                            "label_space": m.label_space, "chance": _clean(m.chance)} for m in self.models]}

    def _write_results(self, run_dir: Path) -> None:
        write_json(run_dir / self.RESULTS, {"models": [m.to_dict() for m in self.models],
                                            "definition": DECOMPOSITION_NOTE})
        write_bytes(run_dir / self.MARKDOWN, self.markdown().encode())
        write_bytes(run_dir / self.CSV, self.csv().encode())

    @classmethod
    def migrate(cls, config: dict[str, Any], version: int) -> dict[str, Any]:
        """Version 1 measured its fill control otherwise (B over covered swaps, ``covered_below``): that
        setting goes, and :meth:`_read` leaves the old statistics out (the fill control reads undefined).
        Versions 1 and 2 have no fill effect: its statistics read NaN and its counts None."""
        settings = dict(config.get("settings") or {})
        settings.pop("covered_below", None)
        return {**config, "settings": settings, "migrated_from": version}

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> AttributionRun:
        results = read_result_json(run_dir, cls.RESULTS)
        models = [ModelAttribution.from_dict(m) for m in results.get("models") or ()]
        if config.get("migrated_from") == 1:
            models = [_without_old_fill(m) for m in models]
        return cls(intervention=dict(config.get("intervention") or {}), settings=dict(config.get("settings") or {}),
                   models=models, run_dir=run_dir)

    # -- views
    @property
    def threshold(self) -> float:
        return float(self.settings.get("control_threshold", 0.05))

    def model(self, run_or_label: str) -> ModelAttribution:
        """The model whose evaluation run or model label is ``run_or_label`` (KeyError otherwise)."""
        for m in self.models:
            if run_or_label in (m.run, m.model, m.model_id):
                return m
        raise KeyError(f"{run_or_label!r} is not among {[m.run for m in self.models]}")

    def ghost_advice(self) -> str:
        """What to do when the ghost control flagged a class ('' when it flagged none): report B unghosted,
        or make the intervention again with a fill that leaves no outline, or with covered donors only."""
        flagged = sorted({f"{m.model} {c.label}" for m in self.models for c in m.classes if GHOST_FLAG in c.flag})
        if not flagged:
            return ""
        from curate.shell import suggest

        source = self.intervention.get("source_root") or "DIR"
        split = self.intervention.get("split")
        again = suggest("curate intervene {src} --out NEW" + (" --split {split}" if split else ""), src=source,
                        split=split or "")
        return (f"ghost control flagged {len(flagged)} class(es) ({', '.join(flagged)}): report their B unghosted, "
                f"or re-run `{again} --fill box-tile` (no outline of the donor's object left) or "
                f"`{again} --max-uncovered 0.5` (only donors whose hole the object leaves at most half of), then "
                "evaluate and attribute NEW")

    def decomposition_rows(self) -> list[list[str]]:
        """Per model: D, B, rest (points with 95% intervals), the paste control, the ghost control (B - B
        unghosted) and B unghosted, the fill control (refill - original), B fill-corrected and the refills, classes
        used and flagged (:data:`DECOMPOSITION_COLUMNS`)."""
        rows = []
        for m in self.models:
            rows.append([m.model, m.label_space, *(_cell(m.value(k), m.interval(k))
                                                   for k in ("drop", "background_part", "rest", "paste_cost",
                                                             "ghost_bias", "background_part_unghosted", "fill_bias",
                                                             "background_part_fill_corrected")),
                         str(m.n_refills), *(_cell(m.value(k), m.interval(k))
                                             for k in ("fill_effect", "background_part_bgonly")),
                         _count(m.n_bgonly), str(m.classes_used), str(len(m.flagged))])
        return rows

    def anchor_rows(self) -> list[list[str]]:
        """Per model: only-FG, no-FG, only-BG, mixed-same, mixed-rand, BG-gap, RFS, adversarial, the ghost
        alone and with a neutral object (accuracy), chance."""
        rows = []
        for m in self.models:
            cells = [pct(m.value(k)) + pct_ci(m.interval(k)) for k in ("only_fg", "no_fg", "only_bg", "mixed_same",
                                                                         "mixed_rand")]
            cells.append(_cell(m.value("bg_gap"), m.interval("bg_gap")))
            cells.append(num(m.value("rfs"), 2, signed=True) + ci(m.interval("rfs"), 2))
            cells.append(pct(m.value("adversarial")) + pct_ci(m.interval("adversarial")))
            cells += [pct(m.value(k)) + pct_ci(m.interval(k)) for k in ("ghost", "ghost_neutral")]
            cells.append(pct(m.chance, 2))
            rows.append([m.model, *cells])
        return rows

    def class_rows(self, model: ModelAttribution) -> list[list[str]]:
        """Per class of one model: easy, hard, D, B, rest, the paste control, the ghost control, B unghosted,
        the fill control, B fill-corrected, the refills and the flag or reason (:data:`CLASS_COLUMNS`)."""
        rows = []
        for c in model.classes:
            def cell(k: str, c: ClassRow = c) -> str:
                return _cell(c.values.get(k, math.nan), c.intervals.get(k, (math.nan, math.nan)))

            rows.append([c.label, str(c.n_easy), str(c.n_hard), pct(c.values.get("easy", math.nan)),
                         pct(c.values.get("hard", math.nan)), cell("drop"), cell("background_part"), cell("rest"),
                         pct(c.values.get("paste_cost", math.nan), signed=True), cell("ghost_bias"),
                         cell("background_part_unghosted"), cell("fill_bias"), cell("background_part_fill_corrected"),
                         str(c.n_refills), cell("fill_effect"), cell("background_part_bgonly"), _count(c.n_bgonly),
                         c.flag or c.reason or ""])
        return rows

    def markdown(self) -> str:
        """``attribution.md``: the decomposition, the anchors' numbers and the per-class tables."""
        parts = ["# Does the background cause the drop?", "", DECOMPOSITION_NOTE, "",
                 f"Intervention: `{self.intervention.get('run')}` of `{self.intervention.get('source_name')}` "
                 f"(noise sigma {self.intervention.get('sigma')} on the [0, 1] scale). Points (percentage points, 95% "
                 f"paired bootstrap intervals, {self.settings.get('n_boot')} replicates). A class is flagged when the "
                 f"paste control loses, or the ghost control moves B by, more than {100 * self.threshold:.0f} "
                 "points, or the fill control or the fill effect does and its interval excludes 0.", "",
                 md_table(list(DECOMPOSITION_COLUMNS), self.decomposition_rows()), "",
                 "Backgrounds Challenge and Hard ImageNet numbers (accuracy in %, RFS in [-1, 1]; chance = one "
                 "guess among the candidate labels):", "",
                 md_table(["model", "only-FG", "no-FG", "only-BG", "mixed-same", "mixed-rand", "BG-gap", "RFS",
                           "adversarial", "ghost", "ghost-neutral", "chance"], self.anchor_rows()), "", GHOST_NOTE]
        if self.ghost_advice():
            parts += ["", self.ghost_advice()]
        for m in self.models:
            parts += ["", f"## {m.model} ({m.label_space})", "",
                      md_table(list(CLASS_COLUMNS), self.class_rows(m))]
        return "\n".join(parts) + "\n"

    def csv(self) -> str:
        """``attribution.csv``: one row per (model, class) and an ``all`` row per model, every statistic."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        header = ["run", "model", "class_index", "class_name", "n_easy", "n_hard", "n_refills", "n_bgonly"]
        for k in STATISTICS:
            header += [k, f"{k}_low", f"{k}_high"]
        writer.writerow(header + ["reason", "flag"])
        for m in self.models:
            def values(vals: dict[str, float], cis: dict[str, tuple[float, float]]) -> list[str]:
                out = []
                for k in STATISTICS:
                    low, high = cis.get(k, (math.nan, math.nan))
                    out += [_num(vals.get(k, math.nan)), _num(low), _num(high)]
                return out

            writer.writerow([m.run, m.model, "all", "", sum(c.n_easy for c in m.classes),
                             sum(c.n_hard for c in m.classes), m.n_refills, _count(m.n_bgonly),
                             *values(m.overall, m.overall_ci), "", ""])
            for c in m.classes:
                writer.writerow([m.run, m.model, c.class_index, c.class_name, c.n_easy, c.n_hard, c.n_refills,
                                 _count(c.n_bgonly), *values(c.values, c.intervals), c.reason, c.flag])
        return buffer.getvalue()


def _without_old_fill(model: ModelAttribution) -> ModelAttribution:
    """A version 1 model with its fill control (:data:`OLD_FILL_STATISTICS` and its part of a flag) left out."""
    def keep(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k not in OLD_FILL_STATISTICS}

    def flag(text: str) -> str:
        return "; ".join(p for p in text.split("; ") if p and not p.startswith(("fill control:", "B covered")))

    return replace(model, overall=keep(model.overall), overall_ci=keep(model.overall_ci),
                   classes=tuple(replace(c, values=keep(c.values), intervals=keep(c.intervals), flag=flag(c.flag))
                                 for c in model.classes))


def _count(n: int | None) -> str:
    """A count, or '' where it was not measured (a record older than the statistic)."""
    return "" if n is None else str(n)


def _num(x: float) -> str:
    return "" if not math.isfinite(x) else f"{x:.6f}"
