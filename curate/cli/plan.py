"""``curate plan DIR``: the drop's interval per class now and the photos each group still needs
(docs/design.md#collection-plan)."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from curate.cli import main, out, shown
from curate.cli.options import UserPath
from curate.formatting import num


@main.command("plan")
@click.argument("directory", type=UserPath(exists=True, file_okay=False, path_type=Path))
@click.option("--split", "split_run", default=None, help="Split run to plan from (default: the folder's split).")
@click.option("--half-width", type=float, default=5.0, show_default=True,
              help="Target half-width of each class's drop interval, in points.")
@click.option("--class", "classes", multiple=True,
              help="Only these classes, by index or name (repeatable).")
@click.option("--out", "out_dir", type=UserPath(path_type=Path, file_okay=False),
              help="Folder for plan.csv / plan.json / plan.png (default DIR/runs/plan).")
def plan_cmd(directory: Path, split_run: str | None, half_width: float, classes: tuple[str, ...],
             out_dir: Path | None) -> None:
    """How many more photos each class's easy and hard groups need for a drop interval of +-HALF-WIDTH points."""
    from curate.runs.base import RUNS_DIR
    from curate.split.plan import plan_dataset, write_plan
    from curate.split.plan_text import next_command, plan_notes

    plan = plan_dataset(directory, split=split_run, half_width=half_width / 100, classes=list(classes) or None)
    files = write_plan(plan, out_dir or directory / RUNS_DIR / "plan")
    table = Table(title=f"collection plan for +-{half_width:g} points (split {plan.split_run})", title_justify="left")
    for col in ("class", "easy", "hard", "half-width now (bootstrap)", "need easy", "need hard", "after (range)",
                "to review"):
        table.add_column(col, justify="left" if col == "class" else "right")
    for c in plan.classes:
        low, high = c.half_width_after_range
        table.add_row(f"{c.class_index} {c.class_name}", str(c.n_easy), str(c.n_hard),
                      f"{num(c.half_width_now, 1, 100)} ({num(c.half_width_bootstrap, 1, 100)})", str(c.need_easy),
                      str(c.need_hard), f"{num(c.half_width_after, 1, 100)} ({num(low, 1, 100)}-{num(high, 1, 100)})",
                      num(c.review_photos, 0))
    table.add_row("all (mean drop)", str(sum(c.n_easy for c in plan.classes)), str(sum(c.n_hard for c in plan.classes)),
                  num(plan.overall_now, 1, 100), str(plan.need_easy), str(plan.need_hard),
                  num(plan.overall_after, 1, 100), num(plan.review_photos, 0))
    out().print(table)
    for line in plan_notes(plan):
        out().print(line, markup=False)
    cost = (f"{plan.review_cost:.2f} photos reviewed per accepted photo ({plan.accepted} accepted, {plan.rejected} "
            "rejected so far)" if plan.accepted else "no review history yet: review cost unknown")
    out().print(f"Review cost: {cost}.")
    out().print(f"wrote {', '.join(str(shown(f)) for f in files)}")
    command = next_command(plan, shown(directory))
    out().print(f"next: {command}" if command else "every class already meets the target: nothing to collect",
                markup=False, soft_wrap=True)
