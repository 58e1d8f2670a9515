"""What a pull of several annotators' answers found: counts per annotator, gold answered wrongly,
photos nobody labelled (issue 44). Shared by the Label Studio and FiftyOne team pulls
(:mod:`curate.review.labelstudio_team`, :mod:`curate.review.fiftyone_team`).

Gold (:func:`curate.store.annotations.gold_answers`): an annotator's answer on a gold photo is
wrong when its primary background differs from the gold answer's primary.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from curate.review.overlap import OverlapPlan
from curate.store import Dataset
from curate.store.annotations import Annotation, AnnotationUpsert, current_annotations, gold_answers


@dataclass
class TeamPullReport:
    """What a team pull stored and what it found wrong (``problems``: one line each)."""

    upsert: AnnotationUpsert
    problems: list[str] = field(default_factory=list)
    answered: dict[str, int] = field(default_factory=dict)  # annotator -> photos answered (not skipped)
    skipped: dict[str, int] = field(default_factory=dict)
    unlabelled: list[str] = field(default_factory=list)  # regular photos nobody has answered
    gold_wrong: dict[str, list[str]] = field(default_factory=dict)  # annotator -> "sample: said x, gold y"
    gold_seen: dict[str, int] = field(default_factory=dict)
    adjudicated: int = 0

    def summary(self) -> str:
        per = ", ".join(f"{a}: {self.answered.get(a, 0)} answered, {self.skipped.get(a, 0)} skipped"
                        for a in sorted(set(self.answered) | set(self.skipped)))
        gold = ", ".join(f"{a}: {len(self.gold_wrong.get(a, []))} of {n} wrong" for a, n in sorted(self.gold_seen.items()))
        return (f"annotations: {self.upsert}; {per or 'nothing answered yet'}"
                + (f"; gold: {gold}" if gold else "") + f"; {len(self.unlabelled)} photo(s) nobody labelled"
                + (f"; {self.adjudicated} adjudicated" if self.adjudicated else ""))


def judge(ds: Dataset, plan: OverlapPlan, rows: Sequence[Annotation], report: TeamPullReport) -> None:
    """Per annotator: answered, skipped, skipped everything, gold answered wrongly; photos nobody labelled."""
    answered: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    labelled: set[str] = set()
    truth = gold_answers(current_annotations(ds))
    for row in rows:
        if row.role == "adjudicator":
            report.adjudicated += not row.skipped
            continue
        (skipped if row.skipped else answered)[row.annotator] += 1
        if not row.skipped:
            labelled.add(row.sample_id)
        if row.is_gold and not row.skipped and row.sample_id in truth:
            report.gold_seen[row.annotator] = report.gold_seen.get(row.annotator, 0) + 1
            if row.primary != truth[row.sample_id][0]:
                report.gold_wrong.setdefault(row.annotator, []).append(
                    f"{row.sample_id}: said {' + '.join(row.backgrounds)}, gold {' + '.join(truth[row.sample_id])}")
    report.answered, report.skipped = dict(answered), dict(skipped)
    for name in plan.annotators:
        if skipped[name] and not answered[name]:
            report.problems.append(f"{name} skipped every task they opened ({skipped[name]}); none of their "
                                   "answers counts")
    for name, wrong in sorted(report.gold_wrong.items()):
        report.problems.append(f"{name} answered {len(wrong)} of {report.gold_seen[name]} gold photo(s) wrongly: "
                               + "; ".join(wrong))
    regular = plan.assignees()
    report.unlabelled = sorted(sid for sid in regular if sid not in labelled)
