"""The split's tables as text (papers/003 Tables 1 and 5): ``split.md``, ``split.csv``, ``cells.csv``.

No figure code and no run records here (standard library and :mod:`curate.formatting` only), so
the run record (:mod:`curate.runs.split`) writes its tables with this module and imports neither
matplotlib nor anything that imports it back; the figures are :mod:`curate.split.tables`'.

Rows are anything shaped like :class:`curate.runs.split.SplitClass` (``class_index``,
``class_name``, ``easy``, ``easy_ties``, ``drop``, ``crossfit_drop``, ``p_value``, ``cells``, ...);
``to_markdown`` takes the run (``kept``, ``dropped``, ``classes``, ``rule``, ``noise_summary``, ...).
"""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from typing import Any

from curate.formatting import num, pct, pct_ci
from curate.metrics.split_rule import TIE_RULE

__all__ = ["cells_csv", "rule_text", "significance_advice", "tie_notes", "to_csv", "to_markdown"]


def significance_advice(rule: Any) -> str:
    """When to use ``--require-significant`` (stated with every rule)."""
    if rule.require_significant:
        return (f"`--require-significant` is on: a class is kept only when its drop's 95% bootstrap interval is above "
                f"0 and the permutation p-value of the max-min gap is below {rule.alpha:g}; this is stricter than "
                "the paper.")
    return ("This is the paper's rule, which keeps noise too (see the p-values); pass `--require-significant` "
            "when the kept classes will be reported as having a background effect, or when backgrounds have few "
            "images.")


def rule_text(rule: Any) -> str:
    """The rule in words, with curate's departures from the paper stated (the tie-break among them)."""
    return (f"Rule (papers/003 §2.1): for each class, the reference model's accuracy on each background with at least "
            f"{rule.min_per_background} accepted images (`--min-per-background` is a curate addition: the paper "
            f"states no minimum); easy = the background with the highest accuracy, hard = the lowest; keep the class "
            f"when the drop exceeds {rule.min_drop:g} points. Ties (a curate decision, the paper has none): the higher "
            "accuracy for easy (lower for hard), then more images, then name order; every tie is listed. "
            + significance_advice(rule))


def tie_notes(row: Any) -> list[str]:
    """One sentence per tied side of a class, e.g. ``"tie: easy chosen among sand (n 40), water (n 40),
    all at 100.00%: sand, by name order (equal n: the data do not separate them)"``; ``[]`` without a tie."""
    cells = {c.background: c for c in getattr(row, "cells", ())}
    notes = []
    for side, chosen, ties in (("easy", row.easy, getattr(row, "easy_ties", ())),
                               ("hard", row.hard, getattr(row, "hard_ties", ()))):
        if len(ties) < 2 or chosen not in cells:
            continue
        n = {b: cells[b].n if b in cells else 0 for b in ties}
        others = [b for b in ties if b != chosen]
        if all(n[chosen] > n[b] for b in others):
            how = "more images"
        elif all(n[chosen] == n[b] for b in others):
            how = "name order (equal n: the data do not separate them)"
        else:
            how = "more images, then name order"
        members = ", ".join(f"{b} (n {n[b]})" for b in ties)
        notes.append(f"tie: {side} chosen among {members}, all at {pct(cells[chosen].accuracy, 2)}%: {chosen}, by {how}")
    return notes


def _label(s: Any) -> str:
    return f"{s.class_index} {s.class_name}" + (" (pinned)" if s.pinned else "")


def _chosen(background: Any, ties: Sequence[str]) -> str:
    """A table cell for the chosen background: ``"sand (tie)"`` when others had its accuracy."""
    return f"{background} (tie)" if len(ties) > 1 else f"{background}"


def to_markdown(run: Any) -> str:
    """``split.md``: the rule, the noise summary, the label sources, kept and dropped classes, ties."""
    kept = sorted(run.kept, key=lambda s: -s.drop if math.isfinite(s.drop) else math.inf)
    dropped = run.dropped
    drop = run.reference_drop()
    lines = [f"# Spurious discovery: {len(kept)} classes kept, {len(dropped)} dropped", "",
             rule_text(run.rule), "",
             (f"**{run.noise_summary.text}.** Selection-corrected drop: {run.rule.crossfit_scheme}. The in-sample drop "
             "is measured on the images that chose easy and hard, as in the paper; choosing the best and the worst of "
             "several noisy backgrounds inflates it."), ""]
    if run.label_sources is not None:
        text = run.label_sources.text
        lines.append(f"{text[0].upper()}{text[1:]}.")
    if run.references:
        text = ("Reference model(s): " + ", ".join(f"`{label}`" for label in run.reference_labels)
                + (" (the accuracy of a cell is the mean over them)" if len(run.references) > 1 else ""))
        if math.isfinite(drop.in_sample):
            text += f"; mean drop over the kept classes: {run.reference_drop_text()}"
        lines.append(text + ".")
    lines += ["", ("| class | easy bkg | easy acc | hard bkg | hard acc | drop [95% CI] | cross-fitted drop "
                  "| p (permutation) | n easy | n hard |"),
              "|---|---|---|---|---|---|---|---|---|---|"]
    for s in kept:
        lines.append(f"| {_label(s)} | {_chosen(s.easy, s.easy_ties)} | {pct(s.easy_acc, 2)} | "
                     f"{_chosen(s.hard, s.hard_ties)} | {pct(s.hard_acc, 2)} | "
                     f"{pct(s.drop, 2)}{pct_ci(s.drop_ci, 2)} | {pct(s.crossfit_drop, 2)} | {num(s.p_value, 3)} | "
                     f"{s.n_easy} | {s.n_hard} |")
    tied = [(s, tie_notes(s)) for s in kept]
    tied = [(s, notes) for s, notes in tied if notes]
    if tied:
        lines += ["", f"Ties among the kept classes ({TIE_RULE}). The reference model is as accurate on a tied "
                  "background as on the chosen one, so either could be the class's easy (or hard) background; a tie "
                  "decided by name order is arbitrary:", ""]
        lines += [f"- {_label(s)}: {'; '.join(notes)}" for s, notes in tied]
    if dropped:
        lines += ["", "## Dropped classes", "", "| class | reason | drop | cross-fitted drop | p (permutation) |",
                  "|---|---|---|---|---|"]
        for s in dropped:
            lines.append(f"| {_label(s)} | {s.reason} | {pct(s.drop, 2)} | {pct(s.crossfit_drop, 2)} | "
                         f"{num(s.p_value, 3)} |")
    notes = [s for s in run.classes if s.crossfit_note and not s.pinned]
    if notes:
        lines += ["", "Cross-fitting notes: " + "; ".join(f"{_label(s)}: {s.crossfit_note}" for s in notes) + "."]
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[Any]) -> str:
    """``split.csv``: one row per class, fractions as numbers; ``easy_ties`` / ``hard_ties`` (tied
    backgrounds, the chosen first, ``;``-separated, empty without a tie) and ``tie_note`` last."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["class_index", "class_name", "kept", "reason", "pinned", "easy_background", "easy_acc",
                     "hard_background", "hard_acc", "drop", "drop_ci_low", "drop_ci_high", "p_value", "crossfit_drop",
                     "crossfit_note", "n_easy", "n_hard", "easy_ties", "hard_ties", "tie_note"])
    for s in rows:
        writer.writerow([s.class_index, s.class_name, s.kept, s.reason, s.pinned, s.easy, s.easy_acc, s.hard,
                         s.hard_acc, s.drop, *s.drop_ci, s.p_value, s.crossfit_drop, s.crossfit_note, s.n_easy, s.n_hard,
                         ";".join(getattr(s, "easy_ties", ())), ";".join(getattr(s, "hard_ties", ())),
                         "; ".join(tie_notes(s))])
    return buffer.getvalue()


def cells_csv(rows: Sequence[Any]) -> str:
    """``cells.csv``: every (class, background) accuracy."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["class_index", "class_name", "background", "n", "accuracy", "ci_low", "ci_high", "eligible"])
    for s in rows:
        for cell in s.cells:
            writer.writerow([s.class_index, s.class_name, cell.background, cell.n, cell.accuracy, *cell.ci, cell.eligible])
    return buffer.getvalue()
