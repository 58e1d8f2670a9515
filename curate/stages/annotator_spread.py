"""The annotator-spread stage: each class's drop under each labelling, for every model (issue 44).

``annotator_spread(dataset, None, settings)`` reads, each through its record class:

- the split run (``settings.split_run``, default the folder's current split): its rule, pins and
  reference evaluation runs, whose per-sample correctness re-derives easy/hard per labelling;
- the evaluation runs (``settings.runs``, default the newest run of each model and setup, the
  rule ``curate compare`` uses): their per-sample top-1 correctness;
- the labellings of the annotation table (:mod:`curate.store.annotations`): each annotator's own
  answers (the primary background, :mod:`curate.agreement.answers`), and the agreed labels with the
  disputed photos from :func:`curate.agreement.aggregate_labels` (``settings.rule`` and
  ``threshold``, by default those of the folder's last ``curate agreement``; photos labelled by one
  annotator or adjudicated keep that label).

and writes a :class:`curate.runs.annotator_spread.AnnotatorSpreadRun` (formulas:
:mod:`curate.metrics.annotator_spread`). Photos: the accepted samples with a class that every
reference run scored. Nothing in the dataset folder changes.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from curate.metrics.annotator_spread import AGREED
from curate.metrics.annotator_spread import annotator_spread as measure_spread
from curate.progress import Progress
from curate.runs.annotator_spread import AnnotatorSpreadRun, SpreadModel
from curate.runs.base import RUNS_DIR, discard_if_empty, iter_runs
from curate.runs.evaluation import EvaluationRun
from curate.runs.split import SplitRun
from curate.stages.common import claim_run_dir, open_dataset, run_stage

__all__ = ["SpreadSettings", "Labellings", "agreement_rule", "folder_labellings", "annotator_spread"]

logger = logging.getLogger(__name__)


@dataclass
class SpreadSettings:
    """Which runs the spread reads (CLI options map one to one)."""

    runs: tuple[str, ...] = ()  # evaluation runs (default: the newest of each model and setup)
    split_run: str | None = None  # default: the folder's current split (dataset.yaml provenance.split.run)
    rule: str | None = None  # the agreed labels' rule (None: the folder's last `curate agreement`, else dawid-skene)
    threshold: float | None = None  # its threshold (None: that agreement's, else the rule's default)


@dataclass
class Labellings:
    """The labellings of a folder: agreed (disputed photos None), the disputes' answers, each annotator's."""

    agreed: dict[str, str | None]
    disputed: dict[str, tuple[str, ...]]
    annotators: dict[str, dict[str, str]]

    def as_mapping(self) -> dict[str, Mapping[str, str | None]]:
        """``{"agreed": ..., <annotator>: ...}`` as :func:`curate.metrics.annotator_spread.annotator_spread` takes them."""
        clash = [a for a in self.annotators if a == AGREED]
        if clash:
            raise ValueError(f"an annotator is named {AGREED!r}, the agreed labelling's name; rename them in the tool")
        return {AGREED: self.agreed, **self.annotators}


def folder_labellings(ds: Any, rule: str = "dawid-skene", threshold: float | None = None) -> Labellings:
    """The folder's labellings from its annotation table (module docstring): the agreed label of every
    photo whose status is agreed, adjudicated or single (:func:`curate.agreement.aggregate_labels` with
    ``rule`` and ``threshold``), the primaries given to each disputed photo, each annotator's
    primaries. ValueError when the table holds no annotator's answer."""
    from curate.agreement import aggregate_labels, answers_of

    answers = answers_of(ds)
    if not answers.labels:
        raise ValueError(f"{ds.root}: the annotation table holds no annotator's answer; pull the annotations "
                         "first (curate review pull) or simulate a team (curate.collect.annotator_sim)")
    decisions = aggregate_labels(answers, rule, threshold)
    agreed = {sid: d.background for sid, d in decisions.items() if d.status in ("agreed", "adjudicated", "single")}
    disputed = {sid: tuple(sorted({b for b in answers.primary(sid).values()})) for sid, d in decisions.items()
                if d.status == "disputed"}
    annotators = {who: {sid: b[0] for sid, b in answers.of(who).items()} for who in answers.annotators}
    return Labellings(agreed, disputed, {who: labels for who, labels in annotators.items() if labels})


def agreement_rule(ds: Any, settings: SpreadSettings) -> tuple[str, float | None]:
    """The rule and threshold of the agreed labels: the settings', else those the folder's last
    ``curate agreement`` recorded (``dataset.yaml`` provenance ``agreement``), else Dawid-Skene's, so
    the spread's agreed labels are the ones the folder's backgrounds were derived from."""
    recorded = ds.provenance.get("agreement") or {}
    rule = settings.rule or str(recorded.get("rule") or "dawid-skene")
    threshold = settings.threshold
    if threshold is None and recorded.get("rule") == rule and recorded.get("threshold") is not None:
        threshold = float(recorded["threshold"])
    return rule, threshold


def _newest_runs(root: Path, names: tuple[str, ...]) -> list[EvaluationRun]:
    """The named evaluation runs, or the newest finished one of each (model id, label space, prompts)."""
    found: dict[Any, EvaluationRun] = {}
    for path, run in iter_runs(root, "evaluate"):
        if names and path.name not in names:
            continue
        if not isinstance(run, EvaluationRun):
            logger.warning("%s", run)
            continue
        key = path.name if names else (run.model_id, run.label_space_name, run.prompts_name)
        found[key] = run  # oldest first: the newest wins
    missing = sorted(set(names) - {r.name for r in found.values()})
    if missing:
        raise ValueError(f"no finished evaluation run named {', '.join(missing)} in {root}/{RUNS_DIR}")
    if not found:
        raise ValueError(f"{root} has no evaluation run to measure the spread on (run `curate evaluate` first)")
    return list(found.values())


def _model_names(runs: list[EvaluationRun]) -> list[str]:
    """How the tables name each run's model: its label, with the label space where two runs share one."""
    labels = [r.model_label for r in runs]
    return [f"{label} · {r.label_space_name}" if labels.count(label) > 1 else label for label, r in zip(labels, runs)]


@run_stage("annotator-spread")
def annotator_spread(dataset: Any, model: None = None, settings: SpreadSettings | None = None, *,
                     run_name: str | None = None, overwrite: bool = False,
                     progress: Progress | None = None) -> AnnotatorSpreadRun:
    """Measure the spread and write the run (module docstring). ``model`` must be None (the models
    are the evaluation runs'). ValueError: no split, no annotations, no evaluation run, a named run
    missing."""
    if model is not None:
        raise ValueError("the spread reads the models' evaluation runs (settings.runs); pass model=None")
    settings = settings or SpreadSettings()
    ds = open_dataset(dataset)
    split_name = settings.split_run or (ds.provenance.get("split") or {}).get("run")
    if not split_name:
        raise ValueError(f"{ds.root} has no split yet; run `curate split` first (the spread re-derives its easy/hard)")
    split = SplitRun.load(ds.root / RUNS_DIR / str(split_name))
    references = [EvaluationRun.finished(ds.root, r.run).correct1_by_sample() for r in split.references]
    if not references:
        raise ValueError(f"split run {split_name} names no reference evaluation run to re-derive easy/hard with")
    rule, threshold = agreement_rule(ds, settings)
    labellings = folder_labellings(ds, rule, threshold)
    runs = _newest_runs(ds.root, tuple(settings.runs))
    rows = [r for r in ds.rows(status="accepted") if r["class_index"] is not None
            and all(r["sample_id"] in ref for ref in references)]
    if not rows:
        raise ValueError(f"{ds.root}: no accepted sample with a class that the split's reference runs scored")
    ids = [r["sample_id"] for r in rows]
    reference = np.array([[ref[s] for s in ids] for ref in references], dtype=np.float64)
    names = _model_names(runs)
    models = {}
    for name, run in zip(names, runs):
        by_id = run.correct1_by_sample()
        models[name] = np.array([float(by_id[s]) if s in by_id else np.nan for s in ids])
    spread = measure_spread(ids, [int(r["class_index"]) for r in rows], labellings.as_mapping(), reference, models,
                            split.rule, split.pins, disputed=labellings.disputed)
    record = AnnotatorSpreadRun(split_run=str(split_name), spread=spread,
                                models=[SpreadModel(n, r.name) for n, r in zip(names, runs)],
                                class_names={c.class_index: c.class_name for c in split.classes}, photos=len(ids),
                                rule=rule, threshold=threshold)
    run_dir = claim_run_dir(ds.root, run_name, "annotator-spread", str(split_name), overwrite=overwrite)
    try:
        record.write(run_dir)
    except BaseException:
        discard_if_empty(run_dir)
        raise
    logger.info("annotator spread: %d model(s), %d labelling(s), %d flagged class(es) -> %s", len(runs),
                len(spread.labellings), len(record.flagged()), run_dir)
    return record
