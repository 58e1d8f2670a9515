"""The report's agreement section (issue 44): how far the folder's annotators agree, from its newest
agreement run (:class:`curate.runs.agreement.AgreementRun`, read through
:func:`curate.runs.lookup.newest_run`), written into :class:`curate.report.Document` by
:func:`agreement_section` (any object with ``heading``, ``text`` and ``table`` will do).

What it shows (formulas: :mod:`curate.agreement.metrics`; rules: :mod:`curate.agreement.aggregate`):

- Krippendorff's alpha (nominal, primary backgrounds) per class and overall, alpha = 1 - D_o / D_e,
  with its percentile bootstrap interval over photos, the photos, the photos with two answers or
  more (the ones alpha uses) and the annotators;
- Cohen's kappa per pair of annotators on the photos both answered, with the share of those photos
  whose answer sets intersect;
- each annotator's answered and skipped photos, accuracy on gold photos (primary in the gold set),
  and agreement with the rest (share of photos where the annotator's primary equals the unique
  majority of the others' primaries);
- the most-confused pairs of backgrounds (count of photo x annotator-pair occurrences);
- the photos by status (agreed, adjudicated, single, disputed, unlabelled) and the first
  :data:`MAX_DISPUTED` disputed photos with each annotator's answer as the annotation table holds
  it now (:func:`curate.agreement.answers.answers_of`);
- one sentence on what alpha can and cannot show (docs/science.md#what-alpha-can-and-cannot-show).

A folder without an agreement run gets the command that makes one, nothing else.
"""
from __future__ import annotations

from typing import Any

from curate.agreement.aggregate import STATUSES
from curate.agreement.answers import answers_of, photo_classes
from curate.formatting import num
from curate.runs.lookup import newest_run
from curate.shell import suggest

__all__ = ["MAX_CONFUSED", "MAX_DISPUTED", "agreement_section", "disputed_rows"]

#: Disputed photos listed in the report (the rest are counted; all are in the run's photos.csv).
MAX_DISPUTED = 20
#: Confused pairs of backgrounds listed, most frequent first.
MAX_CONFUSED = 10
SCIENCE = "docs/science.md#what-alpha-can-and-cannot-show"


def disputed_rows(ds: Any, run: Any, limit: int = MAX_DISPUTED) -> list[list[str]]:
    """``[sample id, class, the rule's best guess, answers]`` for the first ``limit`` disputed photos of
    ``run``; answers as ``annotator: background[/second]`` (``skipped`` for an empty answer)."""
    ids = run.disputed[:limit]
    if not ids:
        return []
    classes = photo_classes(ds)
    answers = answers_of(ds)
    candidate = {d.sample_id: d.candidate for d in run.decisions}
    rows = []
    for sid in ids:
        given = [f"{who}: {'/'.join(labels)}" for who, labels in sorted(answers.labels.get(sid, {}).items())]
        given += [f"{who}: skipped" for who in sorted(answers.skipped.get(sid, set()))]
        rows.append([sid, classes.get(sid, ""), candidate.get(sid) or "tie", "; ".join(given) or "none now"])
    return rows


def agreement_section(doc: Any, ds: Any) -> None:
    """Append the agreement section for the dataset ``ds`` to ``doc`` (module docstring)."""
    doc.heading("Agreement of the annotators")
    run = newest_run(ds.root, "agreement")
    if run is None:
        doc.text("No agreement run yet: " + suggest("`curate agreement {dir}`", dir=ds.root)
                 + " measures it from the folder's annotations.")
        return
    level = int(round(run.level * 100))
    overall = run.alpha[-1] if run.alpha else None
    doc.text(f"`{run.name}`: Krippendorff's alpha (nominal, on each answer's primary background; 1 = the annotators "
             f"always agree, 0 = no more than chance) per class and overall, with its {level}% percentile bootstrap "
             f"interval over photos ({run.replicates} replicates, seed {run.seed})"
             + (f"; {overall.n_photos} photo(s) labelled by {overall.n_annotators} annotator(s)" if overall else "")
             + "; — = undefined (no two answers on one photo, or one background only, so D_e = 0)"
             + ". Alpha is agreement, not accuracy: a mistake every annotator makes leaves it high, and a class "
             "dominated by one background can have a low alpha with almost every label right; only gold photos "
             f"measure accuracy ({SCIENCE}).")
    doc.table(["class", "alpha", f"{level}% interval", "photos", "photos with 2+ answers", "annotators"],
              [[a.group, num(a.alpha), f"[{num(a.low)}, {num(a.high)}]", a.n_photos, a.n_pairable, a.n_annotators]
               for a in run.alpha])
    if run.kappa:
        doc.text("Cohen's kappa per pair of annotators on the photos both answered (chance-corrected, 1 = always "
                 "the same primary); sets agree = share of those photos whose answer sets intersect.")
        doc.table(["annotator A", "annotator B", "common photos", "Cohen's kappa", "sets agree"],
                  [[k.a, k.b, k.n_common, num(k.kappa), num(k.set_agreement)] for k in run.kappa])
    doc.text("Per annotator: gold accuracy = share of their gold photos whose primary is in the adjudicator's "
             "answer; agreement with the rest = share of photos where their primary equals the unique majority of "
             "the others' (ties left out).")
    doc.table(["annotator", "answered", "skipped", "gold accuracy", "agreement with the rest"],
              [[a.annotator, a.answered, a.skipped,
                f"{num(a.gold_accuracy)} ({a.gold_correct}/{a.gold_n})" if a.gold_n else "no gold photos",
                f"{num(a.loo_agreement)} ({a.loo_agree}/{a.loo_n})"] for a in run.annotators])
    if run.confused:
        doc.text("Most confused backgrounds (times two annotators gave the pair to one photo): "
                 + ", ".join(f"{c.first}/{c.second} {c.count}" for c in run.confused[:MAX_CONFUSED]) + ".")
    counts = run.status_counts
    doc.text(f"Photos by status, labels by `{run.rule}` (threshold {run.threshold:g}): "
             + ", ".join(f"{s} {counts.get(s, 0)}" for s in STATUSES)
             + ". The split uses agreed, adjudicated and single labels; disputed and unlabelled photos are left out.")
    rows = disputed_rows(ds, run)
    if rows:
        more = len(run.disputed) - len(rows)
        doc.text(f"Disputed photos (the first {len(rows)} of {len(run.disputed)}"
                 + (f"; all in `runs/{run.name}/photos.csv`" if more else "")
                 + "), with each annotator's answer as the annotation table holds it now:")
        doc.table(["sample id", "class", "rule's best guess", "answers"], rows)
