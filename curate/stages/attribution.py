"""The attribution stage: does the background cause the drop? (``curate attribution``).

``attribution(dataset, runs, settings)`` reads the :class:`curate.runs.InterventionRun` of an
intervention folder (``curate intervene``) and the :class:`curate.runs.EvaluationRun` of each model
scored on it (``curate evaluate``), and writes an :class:`curate.runs.AttributionRun`: per model,
class and overall, the observed drop D, its background part B and the rest, the paste control,
and the anchors' numbers (only-FG, no-FG, only-BG, mixed-same / rand / next, BG-gap, RFS,
adversarial-background accuracy), each with a paired bootstrap interval
(:mod:`curate.interventions.attribution`, docs/design.md#interventions).

A class whose paste control loses more than ``control_threshold`` (original minus the object
pasted back on its own filled background) is flagged: its B and rest mix the background's effect
with what pasting costs. So is a class whose ghost control moves B by more than the threshold (B
against B on the same donors with their holes' bounding boxes filled, no outline of the donor's
object left): its B holds class evidence the filled hole carries. And so is a class whose fill
control (each hard photo with what its swaps show of the donors' filled holes filled the same way
from its own background, against the photo itself) is beyond the threshold with its interval clear
of 0: the visible fill, whichever it is, moves its B. And so is a class whose fill effect (B over the
swaps minus B over the same hard objects on photos of the easy backgrounds alone, paired; only where
the intervention was given such photos) moves B by more than the threshold with its interval clear of
0; that interval resamples the background-alone photos too (a crossed bootstrap,
:mod:`curate.interventions.attribution`), as two sets of photos of one background differ by chance
(docs/results.md#the-fill-control-where-the-fill-acts).
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from curate.interventions.attribution import attribute, photo_table
from curate.progress import Progress, phase
from curate.runs.attribution import FILL_EFFECT_FLAG, GHOST_FLAG, AttributionRun, ClassRow, ModelAttribution
from curate.runs.base import RunError, iter_runs, write_bytes
from curate.runs.evaluation import EvaluationRun
from curate.runs.interventions import InterventionRun
from curate.runs.lookup import named_run
from curate.shell import suggest
from curate.stages.common import claim_run_dir, open_dataset, run_stage

__all__ = ["AttributionSettings", "attribution", "class_flag"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttributionSettings:
    """``intervention``: the intervention record's run name (None: the folder's only or latest one).
    ``n_boot``, ``seed``, ``level``: the paired bootstrap. ``control_threshold``: a class whose paste
    control loses more than this (a fraction: 0.05 = 5 points) is flagged, and so is one whose ghost
    control, or whose fill control with its interval clear of 0, moves B by more."""

    intervention: str | None = None
    n_boot: int = 1000
    seed: int = 0
    level: float = 0.95
    control_threshold: float = 0.05

    def __post_init__(self) -> None:
        if self.n_boot < 10:
            raise ValueError(f"--bootstrap must be >= 10 replicates, got {self.n_boot}")
        if not 0.5 <= self.level < 1.0:
            raise ValueError(f"--level must be in [0.5, 1), got {self.level}")
        if not 0.0 <= self.control_threshold <= 1.0:
            raise ValueError(f"--control-threshold is a fraction in [0, 1], got {self.control_threshold}")


def _evaluations(root: Path, runs: Any) -> list[EvaluationRun]:
    if runs:
        names = [runs] if isinstance(runs, str) else list(runs)
        out = []
        for name in names:
            if isinstance(name, EvaluationRun):
                out.append(name)
                continue
            out.append(named_run(root, str(name), EvaluationRun))  # a missing run is said so (curate.runs.lookup)
        return out
    loaded = []
    for path, record in iter_runs(root, EvaluationRun.KIND):
        if isinstance(record, RunError):
            logger.warning("skipping %s: %s", path.name, record)
        else:
            loaded.append(record)
    if not loaded:
        raise RunError(f"{root} has no evaluation runs: score the folder first, e.g. "
                       f"`{suggest('curate evaluate {dir} --model NAME', dir=root)}`")
    return loaded


@run_stage("attribution")
def attribution(dataset: Any, runs: Any = None, settings: AttributionSettings | None = None, *,
                run_name: str | None = None, overwrite: bool = False,
                progress: Progress | None = None) -> AttributionRun:
    """Decompose each model's drop on an intervention folder (see the module docstring).

    Args:
        dataset: the intervention folder (``curate intervene --out``) or its :class:`Dataset`.
        runs: evaluation run names (or records) on that folder; None: every evaluation run there.
        settings: :class:`AttributionSettings`.
        run_name: the run folder (default ``attribution-<intervention>-<UTC time>``); a finished one
            is refused before any work unless ``overwrite``, an unfinished one (killed) replaced
            (:func:`curate.stages.common.run_stage`).
        overwrite: replace a finished run of that name.
        progress: :class:`curate.progress.Progress`: the replicates drawn, ``n_boot`` per model (phase
            "bootstrapping replicates", ", model i of n" when there are several).
    """
    settings = settings or AttributionSettings()
    ds = open_dataset(dataset)
    intervention = InterventionRun.of_folder(ds.root, settings.intervention)
    evaluations = _evaluations(ds.root, runs)
    variant_rows = intervention.rows()
    names = ds.label_space.names
    models = []
    for i, run in enumerate(evaluations):
        counted = phase(progress, "bootstrapping replicates" + (f", model {i + 1} of {len(evaluations)}"
                                                                if len(evaluations) > 1 else ""))
        correct = run.correct1_by_sample()
        table = photo_table(variant_rows, correct)
        if not table.photo_ids:
            raise ValueError(f"evaluation run {run.name} scored none of the originals of intervention "
                             f"{intervention.name}: evaluate this folder ({ds.root}), not another")
        classes, overall, overall_ci, used = attribute(table, n_boot=settings.n_boot, seed=settings.seed,
                                                       level=settings.level, progress=counted)
        rows = tuple(ClassRow(c.class_index, names[c.class_index], c.n_easy, c.n_hard, c.values, c.intervals,
                              c.reason, class_flag(c.values, c.intervals, settings), c.n_refills, c.n_bgonly)
                     for c in classes)
        models.append(ModelAttribution(run.name, run.model_label, run.model_id, run.family, run.label_space_name,
                                       run.chance, overall, overall_ci, used, rows))
    record = AttributionRun(intervention={
        "run": intervention.name, "source_name": intervention.source.get("name"),
        "source_root": intervention.source.get("root"), "split": intervention.source.get("split"),
        "sigma": intervention.sigma, "truth": intervention.is_truth, "masks": intervention.masks,
        "variants": intervention.variant_counts()}, settings=asdict(settings), models=models)
    from curate.interventions.figures import decomposition_png

    figure = decomposition_png(models)  # drawn before the folder is made: an interrupted draw leaves none
    run_dir = claim_run_dir(ds.root, run_name, "attribution", intervention.name, overwrite=overwrite)
    write_bytes(run_dir / AttributionRun.FIGURE, figure)
    record.write(run_dir)  # config.json last: the commit marker
    return record


def class_flag(values: dict[str, float], intervals: dict[str, tuple[float, float]], settings: AttributionSettings) -> str:
    """Why a class's B is not to be trusted as it is: the paste control, the ghost control, the fill control
    (beyond the threshold with its interval clear of 0: a few covered swaps move it by chance), the fill effect
    (the same rule, its interval crossed over the hard photos and the background-alone photos, which are other
    texture draws than the donors': tests/test_fill_control_world.py), or several."""
    threshold = settings.control_threshold
    flags = []
    paste_cost = values.get("paste_cost", math.nan)
    if math.isfinite(paste_cost) and paste_cost > threshold:
        flags.append(f"paste control loses {100 * paste_cost:.1f} points (> {100 * threshold:.0f}): B and the rest "
                     "include paste artefacts")
    ghost_bias = values.get("ghost_bias", math.nan)
    if math.isfinite(ghost_bias) and abs(ghost_bias) > threshold:
        flags.append(f"{GHOST_FLAG} the donors' filled holes move B by {100 * ghost_bias:+.1f} points (> "
                     f"{100 * threshold:.0f}); B without the ghost is "
                     f"{100 * values.get('background_part_unghosted', math.nan):+.1f}")
    fill = _beyond_with_interval_clear_of_0(values, intervals, "fill_bias", threshold)
    if fill is not None:
        fill_bias, low, high = fill
        flags.append(f"fill control: filling what the swaps show of the donors' holes moves a hard photo's accuracy "
                     f"by {100 * fill_bias:+.1f} points (> {100 * threshold:.0f}, interval {100 * low:+.1f} to "
                     f"{100 * high:+.1f}); B fill-corrected is "
                     f"{100 * values.get('background_part_fill_corrected', math.nan):+.1f}")
    effect = _beyond_with_interval_clear_of_0(values, intervals, "fill_effect", threshold)
    if effect is not None:
        fill_effect, low, high = effect
        flags.append(f"{FILL_EFFECT_FLAG} the donors' filled backgrounds move B by {100 * fill_effect:+.1f} points "
                     f"against photos of the same backgrounds alone (> {100 * threshold:.0f}, interval "
                     f"{100 * low:+.1f} to {100 * high:+.1f}); B on those photos is "
                     f"{100 * values.get('background_part_bgonly', math.nan):+.1f}")
    return "; ".join(flags)


def _beyond_with_interval_clear_of_0(values: dict[str, float], intervals: dict[str, tuple[float, float]], key: str,
                                     threshold: float) -> tuple[float, float, float] | None:
    """``(value, low, high)`` of statistic ``key`` where ``|value| > threshold`` and its interval excludes 0, else
    None (the fill controls' rule: a few swaps can move them by chance)."""
    value = values.get(key, math.nan)
    low, high = intervals.get(key, (math.nan, math.nan))
    if math.isfinite(value) and abs(value) > threshold and (low > 0 or high < 0):
        return value, low, high
    return None
