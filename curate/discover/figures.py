"""What a table of discovered groups says beside its numbers (docs/design.md#discover).

The groups' accuracies are only readable against chance, the uniform guess among the labels the
reference chose from (1 in 1000 for the paper's 1 vs 1000, 1 in 4 for a dataset's own four
classes); a group's bootstrap interval only when the group was large enough to resample.
Both are read from the run here, for ``curate groups`` / ``curate discover`` and the review tools.
"""
from __future__ import annotations

import math

from curate.discover.groups import MIN_BOOT
from curate.runs.discovery import DiscoveredGroup, DiscoveryRun

__all__ = ["bootstrap_minimum", "has_interval", "reference_chances", "chance_text"]


def bootstrap_minimum(run: DiscoveryRun) -> int:
    """The fewest photos a group of ``run`` needed for an interval (its ``min_boot`` setting,
    :data:`curate.discover.groups.MIN_BOOT` for runs that recorded none)."""
    value = run.settings.get("min_boot")
    return MIN_BOOT if value is None else int(value)


def has_interval(run: DiscoveryRun, group: DiscoveredGroup) -> bool:
    """Whether ``group`` has bootstrap intervals worth printing: it holds at least
    :func:`bootstrap_minimum` photos and its intervals are finite (runs made before the minimum
    existed may carry intervals of a one-photo group: they are not shown)."""
    bounds = (group.accuracy_low, group.accuracy_high, group.gap_low, group.gap_high)
    return group.size >= bootstrap_minimum(run) and all(math.isfinite(float(v)) for v in bounds)


def reference_chances(run: DiscoveryRun) -> list[tuple[str, str, float | None]]:
    """``(reference run, label space, chance)`` per reference of ``run``: top-1 accuracy of a
    uniform guess among its candidate labels, as recorded by the run, else read from the
    reference evaluation run beside it (None when neither says)."""
    from curate.runs.base import RUNS_DIR, RunError
    from curate.runs.evaluation import EvaluationRun

    out: list[tuple[str, str, float | None]] = []
    for ref in run.config.get("references") or []:
        name, space, chance = str(ref.get("run") or ""), str(ref.get("label_space") or "?"), ref.get("chance")
        if chance is None and name and run.run_dir is not None:
            try:
                chance = EvaluationRun.load(run.run_dir.parent.parent / RUNS_DIR / name).chance
            except (OSError, RunError, ValueError):
                chance = None
        chance = float(chance) if chance is not None and math.isfinite(float(chance)) and chance > 0 else None
        out.append((name, space, chance))
    return out


def chance_text(run: DiscoveryRun) -> str:
    """``Chance, a uniform guess among the reference's labels: 25% (dataset, 4 labels).``, one
    entry per distinct label space of the references."""
    seen: dict[tuple[str, float | None], None] = {}
    for _, space, chance in reference_chances(run):
        seen.setdefault((space, chance), None)
    if not seen:
        return "Chance: not recorded (no reference run)."
    parts = [f"{100 * chance:.3g}% ({space}, {round(1 / chance)} labels)" if chance is not None
             else f"not recorded ({space})" for space, chance in seen]
    return f"Chance, a uniform guess among the reference's labels: {'; '.join(parts)}."
