"""A simulated team of three on a small world, measured against the truth: the demo's agreement table (issue 44).

:func:`team_agreement` builds a small synthetic world (lion, cicada, polar bear, black swan on
grass, tree, snow, water; no model, no training), labels it with the default team of
:mod:`curate.collect.annotator_sim` (careful 5 % wrong, confuses grass/tree 30 %, random 10 %;
10 % gold photos) and measures it with :mod:`curate.agreement` exactly as ``curate agreement``
would: Krippendorff's alpha per class and overall with its bootstrap interval, Cohen's kappa per
pair, each annotator's gold accuracy and leave-one-out agreement, the Dawid-Skene labels; and,
because the truth is known, each annotator's and the aggregated labels' accuracy against it.
Seconds on 2 cores (measured in docs/results.md's demo section).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from curate.formatting import MISSING, md_table, pct

__all__ = ["TeamAgreement", "team_agreement"]

#: The demo world's classes (their common backgrounds include the confused pair grass/tree).
CLASSES = ("lion", "cicada", "polar bear", "black swan")


@dataclass
class TeamAgreement:
    """What :func:`team_agreement` measured, as text tables."""

    photos: int
    annotators: str  # Markdown: one row per annotator and the aggregated labels
    alpha: str  # Markdown: alpha per class and overall
    kappa: str  # one line: kappa per pair

    def lines(self) -> list[str]:
        return [*self.annotators.splitlines(), "", *self.alpha.splitlines(), "", self.kappa]


def _n(x: float) -> str:
    return MISSING if x != x else f"{x:.2f}"


def team_agreement(root: Path, *, per_class: int = 30, seed: int = 0, replicates: int = 200) -> TeamAgreement:
    """Build the world in ``root`` (re-used when it exists), simulate the team, measure it (module docstring)."""
    import warnings

    from curate.agreement import aggregate_labels, alpha_table, annotator_quality, answers_of, pairwise_kappa
    from curate.collect.annotator_sim import DEFAULT_TEAM, simulate_annotators
    from curate.collect.synthetic import WorldSpec, classes_by_name, collect_synthetic

    ds = collect_synthetic(Path(root), WorldSpec(classes=classes_by_name(CLASSES), per_class=per_class, image_size=16,
                                                 p=0.5, seed=seed))
    team = simulate_annotators(ds, DEFAULT_TEAM, seed=seed, gold=0.1)
    answers = answers_of(ds)
    quality = {q.annotator: q for q in annotator_quality(answers)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decisions = aggregate_labels(answers, "dawid-skene")
    photos = [s for s in team.truth if s not in set(team.gold)]
    rows = []
    for m in team.team:
        q = quality[m.name]
        rows.append([m.name, m.text, pct(team.accuracy(m.name), 1), f"{q.gold_correct}/{q.gold_n}",
                     pct(q.loo_agreement, 1), MISSING])
    agreed = [s for s in photos if decisions[s].status == "agreed"]
    right = sum(decisions[s].background == team.truth[s] for s in agreed)
    disputed = sum(decisions[s].status == "disputed" for s in photos)
    rows.append(["Dawid-Skene (agreed)", "posterior >= 0.9", pct(right / len(agreed) if agreed else float("nan"), 1),
                 MISSING, MISSING, f"{disputed} of {len(photos)}"])
    annotators = md_table(["annotator", "confusion", "accuracy vs truth %", "gold", "agrees with the rest %",
                           "disputed"], rows)
    classes = {r["sample_id"]: str(r["class_name"]) for r in ds.rows()}
    alpha = md_table(["class", "Krippendorff's alpha", "95% interval", "photos"],
                     [[a.group, _n(a.alpha), f"[{_n(a.low)}, {_n(a.high)}]", str(a.n_photos)]
                      for a in alpha_table(answers, classes, replicates=replicates, seed=seed)])
    kappa = "Cohen's kappa: " + ", ".join(f"{k.a}-{k.b} {_n(k.kappa)}" for k in pairwise_kappa(answers))
    return TeamAgreement(len(team.truth), annotators, alpha, kappa)
