"""What ``curate plan`` says under its table: what each number is, why a class under the target
still gets photos, the bootstrap's own noise, and the next command (docs/design.md#collection-plan)."""
from __future__ import annotations

from pathlib import Path

from curate.shell import suggest
from curate.split.plan import ClassPlan, CollectionPlan

__all__ = ["plan_notes", "next_command", "thinnest"]


def thinnest(plan: CollectionPlan) -> ClassPlan | None:
    """The class whose planned-from half-width is widest among those that need photos (None: none does)."""
    needing = [c for c in plan.classes if c.need]
    return max(needing, key=lambda c: c.half_width_now) if needing else None


def next_command(plan: CollectionPlan, directory: str | Path) -> str | None:
    """The steered fill for the thinnest class's group that needs more photos, quoted for a shell."""
    c = thinnest(plan)
    if c is None:
        return None
    group, n = ("hard", c.need_hard) if c.need_hard >= c.need_easy else ("easy", c.need_easy)
    return suggest("curate collect inat {dir} --fill {run} --class {cls} --group {group} --n {n}", dir=directory,
                   run=plan.split_run, cls=c.class_index, group=group, n=n)


def plan_notes(plan: CollectionPlan) -> list[str]:
    """The lines printed under the plan's table (half-widths in points)."""
    lines = [f"half-width now: the value the target is applied to, the split's bootstrap in brackets (— where a "
             f"group has under 2 photos). The plan {plan.assumption}."]
    whys = [w for w in (c.why(plan.target) for c in plan.classes) if w]
    if whys:
        lines.append("under the target by the bootstrap, yet given photos: " + "; ".join(whys) + ".")
    per_class = sum(c.need_easy for c in plan.classes), sum(c.need_hard for c in plan.classes)
    lines.append(f"the 'all (mean drop)' row is planned for the mean drop itself (the fewest photos over all classes "
                 f"that bring its half-width to the target), not the sum of the rows above ({per_class[0]} easy + "
                 f"{per_class[1]} hard).")
    lines.append(f"a bootstrap half-width measured after collecting also varies by about {100 * plan.noise:.1f} % "
                 f"({plan.n_boot:,} replicates) around the predicted one; the stated range leaves that out.")
    return lines
