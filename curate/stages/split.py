"""The split stage: spurious discovery on a dataset folder (``curate split``, papers/003 §2.1).

``split(dataset, model, settings)`` runs the rule of :mod:`curate.split.discovery` and writes a
:class:`curate.runs.SplitRun` (layout in :mod:`curate.runs.split`).

Where the correctness comes from:

- ``model``: reference model(s) evaluated now with the paper's setting (1 vs 1000 over
  ImageNet-1K, or the dataset's own label space when it is not ImageNet; prompt
  "A photo of {}."), each as an ordinary evaluation run (``runs/<split run>-reference``) through
  :func:`curate.stages.evaluate.evaluate` (image embeddings from the cache); several models ->
  a cell's accuracy is the mean of theirs. A reference is a :class:`ModelSpec`, a model name or
  weights file, or an already loaded model (``curate.load_model(...)``); the run records what
  was passed (``SplitReference.passed``: "spec" or "loaded", with the model id and the name and
  pretrained the model records of itself, :func:`curate.stages.common.model_identity`);
- ``settings.predictions``: finished evaluation runs (any model, e.g. an ImageNet classifier
  for the paper's CounterAnimal-I, App. E), read through :class:`curate.runs.EvaluationRun`:
  the split then costs no inference. Both may be given.

Which samples: accepted samples with a class and a background label (when there are none, the
error says which of the three is missing and how to get it). Labels made by a model
(``background_source = "model"``, from ``curate label-backgrounds``) are refused unless
``allow_model_backgrounds``: a split on unchecked CLIP pre-labels measures the labeller as
much as the reference. The run records how many labels were human, synthetic or model.

Several annotators (issue 44): where ``curate agreement`` derived the folder's backgrounds, a
disputed or unlabelled photo has none, so the rule leaves it out, and the run counts it
(``SplitRun.label_use``: the paper's "photos challenging to be labeled", now measured).
``settings.annotator`` splits on one annotator's answers alone instead, for comparison: the run
is written, but the folder's ``group`` and ``provenance.split`` are left as they are.

What it writes: the run folder (the figures, written here, then the record: tables and
``config.json`` last); ``group`` (easy | hard) for the
kept classes' accepted samples in their two backgrounds and ``None`` for every other sample (so
a re-run after new labels updates the split; only changed rows are written, each change in
``changes.jsonl``); and ``provenance.split`` in ``dataset.yaml`` (the rule, the references,
the counts, the noise summary, the run's name).
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from curate.agreement.answers import answers_of
from curate.jsonio import json_safe
from curate.models.spec import ModelSpec
from curate.progress import Progress, report
from curate.runs.base import discard_if_empty, unique_run_name
from curate.runs.evaluation import EvaluationRun
from curate.runs.split import LabelSources, LabelUse, SplitClass, SplitReference, SplitRun
from curate.shell import suggest
from curate.split.discovery import SplitRule, discover, group_assignments
from curate.split.pins import load_pins
from curate.split.tables import write_figures
from curate.stages.common import (
    check_device,
    claim_run_dir,
    identity_label,
    model_identity,
    open_dataset,
    run_stage,
    spec_of,
)
from curate.store.annotations import load_label_status

__all__ = ["SplitSettings", "split"]

logger = logging.getLogger(__name__)


@dataclass
class SplitSettings:
    """How to split (CLI options of ``curate split`` map one to one)."""

    min_per_background: int = 10  # a curate addition: the paper states no minimum
    min_drop: float = 5.0  # points; the paper's rule keeps a class when the drop exceeds it
    require_significant: bool = False  # also ask for permutation p < alpha and a bootstrap interval above 0
    alpha: float = 0.05
    n_perm: int = 2000
    n_boot: int = 1000
    seed: int = 0
    crossfit_folds: int = 2
    crossfit_repeats: int = 10
    predictions: tuple[str, ...] = ()  # finished evaluation run names
    allow_model_backgrounds: bool = False
    annotator: str | None = None  # split on this annotator's answers alone (issue 44; the folder's groups stay)
    device: str = "auto"
    precision: str = "fp32"
    batch_size: int = 256

    @property
    def rule(self) -> SplitRule:
        """The rule's settings (validated)."""
        return SplitRule(min_per_background=self.min_per_background, min_drop=self.min_drop,
                         require_significant=self.require_significant, n_boot=self.n_boot, n_perm=self.n_perm,
                         alpha=self.alpha, seed=self.seed, crossfit_folds=self.crossfit_folds,
                         crossfit_repeats=self.crossfit_repeats)


def _one(model: Any) -> ModelSpec | Any:
    """A reference as evaluate takes it: the spec a name or file names, or the loaded model itself
    (checked now: a model without a model id fails before any work)."""
    spec = spec_of(model)
    if spec is not None:
        return spec
    model_identity(model, model)  # TypeError for an object that is not a loaded model
    return model


def _references(model: Any) -> list[ModelSpec | Any]:
    """The reference models: ``None`` -> none; a spec, a name, a weights file or a loaded model -> one;
    a list, tuple or other iterable of them -> each."""
    if model is None:
        return []
    if spec_of(model) is None and not hasattr(model, "model_id") and isinstance(model, Iterable):
        return [_one(m) for m in model]
    return [_one(model)]


def _passed(model: ModelSpec | Any) -> str:
    """What ``SplitReference.passed`` records for a reference evaluated now ("spec" or "loaded")."""
    return "spec" if isinstance(model, ModelSpec) else "loaded"


def _label(model: ModelSpec | Any) -> str:
    """How run names show a reference (the spec's label; a loaded model's recorded identity)."""
    return model.label if isinstance(model, ModelSpec) else identity_label(model_identity(model, model))


def _nothing_to_split(ds) -> str:
    """Why no sample is usable (accepted, with a class and a background label), and how to fix it."""
    rows = ds.rows()
    root = ds.root
    head = f"{root}: no accepted samples with a background label to split: "
    if not rows:
        return head + "the dataset has no samples; collect some first (curate collect ...)"
    labelled = [r for r in rows if r["background"] is not None]
    accepted = sum(1 for r in rows if r["status"] == "accepted")
    review, tags, pull, studio = (suggest("curate review {verb} {dir}", verb=verb, dir=root)
                                  for verb in ("fiftyone", "tags", "pull", "labelstudio"))
    if not labelled:
        return head + (f"no sample has a background label ({len(rows)} sample(s), {accepted} accepted); label "
                       f"backgrounds first: `{suggest('curate label-backgrounds {dir} --model ...', dir=root)}` "
                       f"proposes labels for people to check in review ({review}), where backgrounds can also be set "
                       "by hand")
    ready = [r for r in labelled if r["status"] == "accepted"]
    if not ready:
        statuses = Counter(r["status"] for r in labelled)
        made = sum(1 for r in labelled if r["background_source"] == "model")
        text = head + (f"{len(labelled)} sample(s) have a background label but none is accepted "
                       f"({', '.join(f'{n} {status}' for status, n in statuses.most_common())}); the split uses "
                       "accepted samples only (papers/003 §2.1; it has no option to include candidates). Accept them "
                       f"in review: `{review}`, tag them `accept` (`{tags}` lists the tags), then `{pull}`; or "
                       f"`{studio} --url ...`; "
                       "or in Python ds.update(sample_ids, {'status': 'accepted'}, actor=..., reason=...)")
        if made:
            text += (f". {made} of these labels were made by a model (curate label-backgrounds): check them in the "
                     "same review, or the split will refuse them unless --allow-model-backgrounds")
        return text
    return head + (f"{len(ready)} accepted sample(s) have a background label but none has a class; set their class "
                   "in review (curate review fiftyone)")


def _reference_runs(ds, models: Sequence[ModelSpec | Any], settings: SplitSettings, progress: Progress | None,
                    images: int, split_run: str) -> list[EvaluationRun]:
    """Evaluate each reference (a spec or a loaded model) with the paper's setting.

    Progress: one phase per reference, "reference model" ("reference model k of n" for several),
    counting the split's ``images``: 0 before its evaluation (whose own phases, "encoding images"
    when some image is not in the feature cache, come inside it), ``images`` after it (the split
    then checks that each of them has a prediction)."""
    from curate.stages.evaluate import EvalSettings, evaluate

    label_space = "imagenet1k" if ds.label_space.is_builtin else "dataset"
    runs = []
    for number, model in enumerate(models, 1):
        message = "reference model" if len(models) == 1 else f"reference model {number} of {len(models)}"
        report(progress, 0, images, message)
        eval_settings = EvalSettings(label_space=label_space, prompts="simple", statuses=("accepted",),
                                     device=settings.device, precision=settings.precision,
                                     batch_size=settings.batch_size, seed=settings.seed)
        # named after the split run, so the two do not differ by a near-identical prefix (issue 46)
        name = unique_run_name(ds.root, f"{split_run}-reference" + (f"-{number}" if len(models) > 1 else ""))
        runs.append(evaluate(ds, model, eval_settings, run_name=name, progress=progress))
        report(progress, images, images, message)
    return runs


def _correctness(runs: Sequence[EvaluationRun], sample_ids: list[str],
                 passed: Sequence[str]) -> tuple[np.ndarray, list[SplitReference]]:
    """(M, N) correctness of each run on ``sample_ids``; a sample missing from a run is an error.
    ``passed[i]``: how run i came ("predictions": a finished run named by the caller; "spec" /
    "loaded": evaluated now from what the caller passed)."""
    rows, info = [], []
    for run, how in zip(runs, passed, strict=True):
        by_id = run.correct1_by_sample()
        missing = [s for s in sample_ids if s not in by_id]
        if missing:
            raise ValueError(f"run {run.name} has no prediction for {len(missing)} accepted sample(s) with a "
                             f"background (e.g. {missing[0]}); re-run the evaluation on the current dataset")
        if not run.is_paper_setting:
            logger.warning("run %s used label space %s and prompts %s, not the paper's 1 vs 1000 with 'A photo of {}.'",
                           run.name, run.label_space_name, run.templates)
        rows.append([by_id[s] for s in sample_ids])
        info.append(SplitReference(run=run.name, name=run.model.get("name"), pretrained=run.model.get("pretrained"),
                                   model_id=run.model_id or None, label_space=run.label_space_name or None,
                                   prompts=tuple(run.templates),
                                   passed=how))
    return np.array(rows, dtype=np.float64), info


def _labelled_rows(ds: Any, annotator: str | None) -> tuple[list[dict[str, Any]], LabelUse]:
    """The accepted rows with a class the rule splits on, with their background, and what was left out
    (:class:`curate.runs.split.LabelUse`). ``annotator`` None: the folder's backgrounds (derived from
    agreed, adjudicated and single labels where ``curate agreement`` ran; a disputed or unlabelled
    photo has none and is counted as left out). Else that annotator's primary answers alone."""
    statuses = {sid: s.status for sid, s in load_label_status(ds).items()}
    candidates = [r for r in ds.rows(status="accepted") if r["class_index"] is not None]
    left_out: Counter[str] = Counter()
    if annotator is None:
        rows = [r for r in candidates if r["background"] is not None]
        for r in candidates:
            if r["background"] is None and statuses.get(r["sample_id"]) in ("disputed", "unlabelled"):
                left_out[statuses[r["sample_id"]]] += 1
        labels = "folder"
    else:
        answers = answers_of(ds)
        if annotator not in answers.annotators:
            known = ", ".join(answers.annotators) or "none: the folder has no annotations"
            raise ValueError(f"no annotator {annotator!r} in {ds.root}'s annotation table (annotators: {known})")
        mine = answers.of(annotator)
        rows = [{**r, "background": mine[r["sample_id"]][0], "background_source": "human"} for r in candidates
                if r["sample_id"] in mine]
        left_out["not answered"] = len(candidates) - len(rows)
        labels = f"annotator:{annotator}"
        statuses = {}
    used = Counter(statuses.get(r["sample_id"], "no status") for r in rows)
    return rows, LabelUse(labels, dict(sorted(used.items())), dict(sorted(left_out.items())))


@run_stage("split")
def split(
    dataset: Any, model: ModelSpec | Any | Sequence[ModelSpec | Any] | None, settings: SplitSettings | None = None, *,
    run_name: str | None = None, overwrite: bool = False, progress: Progress | None = None,
) -> SplitRun:
    """Discover easy/hard backgrounds, write the groups and the :class:`SplitRun` (module docstring).

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        model: the reference: a :class:`ModelSpec`, a model name or weights file, an already loaded
            model (``curate.load_model(...)``), a list of them (mean accuracy), or ``None`` when
            ``settings.predictions`` name finished evaluation runs.
        settings: :class:`SplitSettings` (default: the paper's rule, 10 images per background).
        run_name: the run folder (default ``split-<references>-<UTC time>``); a finished one is
            refused before any work unless ``overwrite``, an unfinished one (killed) replaced
            (:func:`curate.stages.common.run_stage`).
        progress: :class:`curate.progress.Progress`: per reference evaluated now, a phase "reference
            model" counting the split's images it scored (ends at n/n), with the evaluation's own
            phases inside it.
    Raises:
        TypeError: a reference that is neither a spec, a name, a file nor a loaded model (no model id).
        ValueError: no reference, no usable sample (the message says whether the background labels,
            the accepted status or the class is missing), model-made background labels without
            ``allow_model_backgrounds``, or a prediction run that misses samples.
        FileNotFoundError / RunError: a ``predictions`` name that is not a finished evaluation run.
        FileExistsError: ``run_name`` is a finished run and ``overwrite`` is not set.
    """
    settings = settings or SplitSettings()
    rule = settings.rule
    specs = _references(model)
    if not specs and not settings.predictions:
        raise ValueError("give a reference model (--reference) or finished evaluation runs (--predictions)")
    if specs:
        check_device(settings.device)
    ds = open_dataset(dataset)
    rows, label_use = _labelled_rows(ds, settings.annotator)
    if not rows:
        raise ValueError(_nothing_to_split(ds) if settings.annotator is None else
                         f"{ds.root}: annotator {settings.annotator!r} labelled none of the accepted photos with a class")
    sources = LabelSources.count([r["background_source"] for r in rows])
    if sources.model and not settings.allow_model_backgrounds:
        raise ValueError(
            f"{sources.model} of the {sources.total} background labels the split would use were made by a model "
            "(background_source = model, from curate label-backgrounds) and not checked by a person; review them "
            "(curate review) or pass --allow-model-backgrounds (allow_model_backgrounds=True) to split on them anyway")
    runs = [EvaluationRun.finished(ds.root, name) for name in settings.predictions]
    label = "-".join([_label(s) for s in specs] + [r.model_label for r in runs])[:40] or "run"
    if settings.annotator is not None:
        label = f"{label}-{settings.annotator}"[:60]
    run_dir = claim_run_dir(ds.root, run_name, "split", label, overwrite=overwrite)
    try:
        runs += _reference_runs(ds, specs, settings, progress, len(rows), run_dir.name)
        ids = [r["sample_id"] for r in rows]
        classes = [int(r["class_index"]) for r in rows]
        backgrounds = [r["background"] for r in rows]
        passed = ["predictions"] * len(settings.predictions) + [_passed(s) for s in specs]
        correct, references = _correctness(runs, ids, passed)
        pins = load_pins(ds)
        decisions = discover(classes, backgrounds, correct, rule, pins)
        # every sample gets its group recomputed: kept classes' easy/hard accepted samples, None otherwise
        assigned = group_assignments(ids, classes, backgrounds, decisions)
        per_sample = {row["sample_id"]: {"group": assigned.get(row["sample_id"])} for row in ds.rows()
                      if row["group"] != assigned.get(row["sample_id"])} if settings.annotator is None else {}
        names = ds.label_space.names
        record = SplitRun(rule=rule, references=references,
                          classes=[SplitClass.from_split(d, names[d.class_index]) for d in decisions],
                          label_sources=sources, pins=pins, changed=len(per_sample), label_use=label_use)
        write_figures(run_dir, record.kept)  # the stage's: the record imports no figure code
        record.write(run_dir)  # the tables, then config.json (the commit marker) last
    except BaseException:
        discard_if_empty(run_dir)  # nothing was written: leave no folder
        raise
    if per_sample:
        ds.update(list(per_sample), per_sample=per_sample, actor="split", reason="spurious discovery (papers/003 §2.1)")
    if settings.annotator is None:  # a comparison on one annotator's labels is a run, not the folder's split
        ds.record_provenance("split", json_safe({**record.summary_dict(), "run": run_dir.name}))
    logger.info("split: %d kept, %d dropped, %d samples changed group; %s -> %s", len(record.kept),
                len(record.dropped), len(per_sample), record.noise_summary.text, run_dir)
    return record
