"""The agreement run: how far a team of annotators agrees, and the label each photo gets (issue 44).

Written by :func:`curate.stages.agreement.agreement` (formulas: :mod:`curate.agreement.metrics`,
rules: :mod:`curate.agreement.aggregate`).

Files (``runs/<name>/``):

- ``config.json``: ``rule``, ``threshold``, ``replicates``, ``seed``, ``level`` (the bootstrap),
  ``mask_method``, ``derived`` (whether the folder's backgrounds were derived), the counts
  (``photos``, ``annotators``, ``status_counts``, ``changed`` samples, ``replaced`` answers);
- ``agreement.json``: ``alpha`` (one row per class, then the overall row ``(all)``), ``kappa``
  (one row per pair of annotators), ``confused`` (pairs of backgrounds given to one photo),
  ``annotators`` (gold accuracy, leave-one-out agreement, their wrong gold answers), ``mask_iou``
  (per photo and pair), ``mask_iou_by_class``, ``aggregated_mask_iou`` (each annotator's mask
  against the aggregated one, mean per annotator);
- ``photos.csv``: per photo: status, background (and the full answer set), candidate, confidence,
  the number of answers (who answered what stays in the folder's annotation table);
- ``agreement.md``: the tables the CLI prints.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from curate.agreement.aggregate import Decision
from curate.agreement.metrics import (
    AlphaEstimate,
    AnnotatorQuality,
    ConfusedPair,
    GoldMistake,
    KappaPair,
    MaskIoU,
)
from curate.formatting import num
from curate.jsonio import write_json
from curate.runs.base import RunRecord, read_result_json, write_bytes
from curate.runs.registry import register_run_kind

__all__ = ["AgreementRun"]


def _f(x: Any) -> float:
    return float("nan") if x is None else float(x)


@register_run_kind
@dataclass
class AgreementRun(RunRecord):
    """Config and results of one agreement measurement (module docstring)."""

    KIND: ClassVar[str] = "agreement"
    VERSION: ClassVar[int] = 1
    SUMMARY: ClassVar[str] = "agreement.json"
    PHOTOS: ClassVar[str] = "photos.csv"
    MARKDOWN: ClassVar[str] = "agreement.md"

    rule: str
    threshold: float
    replicates: int
    seed: int
    level: float
    alpha: list[AlphaEstimate]
    kappa: list[KappaPair]
    confused: list[ConfusedPair]
    annotators: list[AnnotatorQuality]
    decisions: list[Decision]
    mask_iou: list[MaskIoU] = field(default_factory=list)
    aggregated_mask_iou: dict[str, float] = field(default_factory=dict)
    mask_method: str = "majority"
    derived: bool = True
    changed: int = 0
    replaced: int = 0
    run_dir: Path | None = None

    # -- views
    @property
    def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for d in self.decisions:
            counts[d.status] = counts.get(d.status, 0) + 1
        return counts

    @property
    def disputed(self) -> list[str]:
        """The disputed photos (an adjudicator's queue)."""
        return [d.sample_id for d in self.decisions if d.status == "disputed"]

    @property
    def gold_mistakes(self) -> list[GoldMistake]:
        return [m for a in self.annotators for m in a.mistakes]

    def mask_iou_by_class(self) -> dict[str, tuple[float, int]]:
        """class -> (mean IoU between annotators, number of pairs)."""
        sums: dict[str, list[float]] = {}
        for row in self.mask_iou:
            sums.setdefault(row.group, []).append(row.iou)
        return {g: (sum(v) / len(v), len(v)) for g, v in sorted(sums.items())}

    def disputed_by_class(self, classes: dict[str, str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for sid in self.disputed:
            out[classes.get(sid, "")] = out.get(classes.get(sid, ""), 0) + 1
        return out

    # -- record protocol
    def config_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "threshold": self.threshold, "replicates": self.replicates, "seed": self.seed,
                "level": self.level, "mask_method": self.mask_method, "derived": self.derived,
                "photos": len(self.decisions), "annotators": len(self.annotators),
                "status_counts": self.status_counts, "changed": self.changed, "replaced": self.replaced}

    def _write_results(self, run_dir: Path) -> None:
        write_json(run_dir / self.SUMMARY, {
            "alpha": [asdict(a) for a in self.alpha], "kappa": [asdict(k) for k in self.kappa],
            "confused": [asdict(c) for c in self.confused], "annotators": [asdict(a) for a in self.annotators],
            "mask_iou": [asdict(m) for m in self.mask_iou],
            "mask_iou_by_class": {g: {"mean": m, "pairs": n} for g, (m, n) in self.mask_iou_by_class().items()},
            "aggregated_mask_iou": self.aggregated_mask_iou})
        write_bytes(run_dir / self.PHOTOS, self.photos_csv().encode())
        write_bytes(run_dir / self.MARKDOWN, self.to_markdown().encode())

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> AgreementRun:
        summary = read_result_json(run_dir, cls.SUMMARY)
        alpha = [AlphaEstimate(str(a["group"]), _f(a["alpha"]), _f(a["low"]), _f(a["high"]), int(a["n_photos"]),
                               int(a["n_pairable"]), int(a["n_annotators"]), int(a["replicates"]), int(a["seed"]),
                               float(a["level"]), int(a.get("undefined") or 0)) for a in summary.get("alpha") or []]
        kappa = [KappaPair(str(k["a"]), str(k["b"]), int(k["n_common"]), _f(k["kappa"]), _f(k["set_agreement"]))
                 for k in summary.get("kappa") or []]
        confused = [ConfusedPair(str(c["first"]), str(c["second"]), int(c["count"]))
                    for c in summary.get("confused") or []]
        annotators = [AnnotatorQuality(
            str(a["annotator"]), int(a["answered"]), int(a["skipped"]), int(a["gold_n"]), int(a["gold_correct"]),
            _f(a["gold_accuracy"]), int(a["loo_n"]), int(a["loo_agree"]), _f(a["loo_agreement"]),
            _f(a["loo_set_agreement"]), int(a["loo_ties"]),
            [GoldMistake(str(m["annotator"]), str(m["sample_id"]), tuple(m["answered"]), tuple(m["gold"]))
             for m in a.get("mistakes") or []]) for a in summary.get("annotators") or []]
        masks = [MaskIoU(str(m["sample_id"]), str(m["group"]), str(m["a"]), str(m["b"]), _f(m["iou"]))
                 for m in summary.get("mask_iou") or []]
        return cls(rule=str(config["rule"]), threshold=float(config["threshold"]),
                   replicates=int(config["replicates"]), seed=int(config["seed"]), level=float(config["level"]),
                   alpha=alpha, kappa=kappa, confused=confused, annotators=annotators,
                   decisions=_read_photos(run_dir / cls.PHOTOS), mask_iou=masks,
                   aggregated_mask_iou={str(k): _f(v) for k, v in (summary.get("aggregated_mask_iou") or {}).items()},
                   mask_method=str(config.get("mask_method", "majority")), derived=bool(config.get("derived", True)),
                   changed=int(config.get("changed") or 0), replaced=int(config.get("replaced") or 0),
                   run_dir=run_dir)

    # -- tables
    def photos_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["sample_id", "status", "background", "backgrounds", "candidate", "confidence", "n_answers"])
        for d in self.decisions:
            writer.writerow([d.sample_id, d.status, d.background or "", "|".join(d.backgrounds), d.candidate or "",
                             "" if math.isnan(d.confidence) else repr(float(d.confidence)), d.n_answers])
        return buffer.getvalue()

    def alpha_lines(self) -> list[list[str]]:
        """Rows of the per-class agreement table: class, alpha [interval], photos, pairable, annotators."""
        return [[a.group, f"{num(a.alpha)} [{num(a.low)}, {num(a.high)}]", str(a.n_photos), str(a.n_pairable),
                 str(a.n_annotators)] for a in self.alpha]

    def to_markdown(self) -> str:
        level = int(round(self.level * 100))
        lines = [f"Agreement of the team: Krippendorff's alpha (nominal, primary backgrounds) with a {level} % "
                 f"percentile bootstrap interval over photos ({self.replicates} replicates, seed {self.seed}); "
                 f"labels by `{self.rule}` (threshold {self.threshold:g}).", "",
                 "| class | alpha [interval] | photos | photos with 2+ answers | annotators |",
                 "| --- | --- | --- | --- | --- |"]
        lines += ["| " + " | ".join(row) + " |" for row in self.alpha_lines()]
        counts = self.status_counts
        lines += ["", "Photos by status: " + ", ".join(f"{s} {n}" for s, n in sorted(counts.items())), "",
                  "| annotator A | annotator B | common photos | Cohen's kappa | sets agree |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {k.a} | {k.b} | {k.n_common} | {num(k.kappa)} | {num(k.set_agreement)} |" for k in self.kappa]
        lines += ["", "| annotator | answered | skipped | gold accuracy | gold photos | agreement with the rest |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {a.annotator} | {a.answered} | {a.skipped} | {num(a.gold_accuracy)} | {a.gold_n} | "
                  f"{num(a.loo_agreement)} ({a.loo_n} photos) |" for a in self.annotators]
        if self.confused:
            lines += ["", "Backgrounds confused (pairs of annotators on one photo): "
                      + ", ".join(f"{c.first}/{c.second} {c.count}" for c in self.confused[:10])]
        if self.mask_iou:
            lines += ["", "Mask IoU between annotators, per class: " + ", ".join(
                f"{g} {m:.3f} ({n} pairs)" for g, (m, n) in self.mask_iou_by_class().items())]
        return "\n".join(lines) + "\n"


def _read_photos(path: Path) -> list[Decision]:
    if not path.is_file():
        return []
    out = []
    with path.open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            out.append(Decision(row["sample_id"], row["status"], row["background"] or None,
                                tuple(b for b in row["backgrounds"].split("|") if b), _f(row["confidence"] or None),
                                int(row["n_answers"]), row["candidate"] or None))
    return out
