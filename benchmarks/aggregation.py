"""Dawid-Skene against majority vote (and each annotator alone) on worlds whose truth is known (issue 44).

Accuracy, not speed. For each seed: a synthetic world (``curate collect synthetic``: lion, cicada,
polar bear, black swan on grass, tree, snow, water; ``--per-class`` photos each, p = 0.5) labelled
by a simulated team (:mod:`curate.collect.annotator_sim`, every member on every photo), the answers
read back from the folder's annotation table and aggregated by curate's rules
(:func:`curate.agreement.aggregate_labels`): ``majority`` (ties disputed) and ``dawid-skene``
(crowd-kit's DawidSkene, disputed below the posterior threshold, default 0.9). Three teams:

- ``default``: careful (5 % wrong), confuses grass/tree 30 %, random 10 % (the issue's team);
- ``two noisy``: careful (5 %), and two who answer at random half the time: a majority of two
  noisy voices can outvote the careful one, and three different answers tie;
- ``shared confusion``: careful (5 %), and two who confuse grass/tree 40 % each, independently: on
  a grass or tree photo both are wrong together 16 % of the time, and then outvote the careful one.

Per team and rule, over the seeds (mean and range): ``accuracy`` = share of photos whose label
(the agreed one, or the rule's best guess where it disputes; a tie is wrong) is the true
background; ``agreed acc`` = accuracy on the photos the rule agrees on; ``disputed`` = share of
photos it sends to an adjudicator. Each annotator alone: its accuracy.

Run: ``.venv/bin/python benchmarks/aggregation.py`` (default 5 seeds x 60 photos a class; about a
minute of CPU). What it can and cannot show is printed under the table.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

TEAMS = {
    "default": "careful:0.05,confuse:grass-tree:0.3,random:0.1",
    "two noisy": "careful:0.05,random:0.5,random:0.5",
    "shared confusion": "careful:0.05,confuse:grass-tree:0.4,confuse:grass-tree:0.4",
}
CLASSES = ("lion", "cicada", "polar bear", "black swan")
RULES = ("majority", "dawid-skene")

CAVEATS = """What this can show: on photos whose truth is known, how often each rule's label is right, how
many photos it leaves to an adjudicator, and where a rule beats the best single annotator.
What it cannot show: (1) the errors here are independent draws from fixed confusion matrices;
real annotators' errors depend on the photo (a hard photo fools everyone), which no rule can undo
and which makes every figure here optimistic; (2) three annotators on every photo, with no skips;
with overlap 2 a disagreement is a tie that no vote breaks; (3) 'shared confusion' is where the
truth is not recoverable from the answers alone: two independent confusers outvote the careful
one on the same photos, and Dawid-Skene, which only sees the answers, cannot tell who is right
there; gold photos (an adjudicator's answers) are what measure it; (4) a rule beats the best
single annotator only when most of the team is good and errs independently ('default'); with two
noisy members of three ('two noisy') a rule can do worse than the careful one alone, and then the
remedy is another careful annotator or an adjudicator, not another rule; (5) synthetic backgrounds
at 16 px, four classes: the figures are about the rules, not about any real dataset."""


def _world(root: Path, per_class: int, seed: int):
    from curate.collect.synthetic import WorldSpec, classes_by_name, collect_synthetic

    return collect_synthetic(root, WorldSpec(classes=classes_by_name(CLASSES), per_class=per_class, image_size=16,
                                             p=0.5, seed=seed))


def measure(team: str, world: Path, scratch: Path, seed: int) -> dict[str, dict[str, float]]:
    """One team on a copy of ``world``: ``{method: {"accuracy", "agreed_acc", "disputed"}}``."""
    from curate.agreement import aggregate_labels, answers_of
    from curate.collect.annotator_sim import simulate_annotators
    from curate.store import Dataset

    folder = scratch / f"{seed}-{team.replace(' ', '-')}"
    shutil.copytree(world, folder)
    ds = Dataset.open(folder)
    simulated = simulate_annotators(ds, TEAMS[team], seed=seed)
    answers = answers_of(ds)
    photos = sorted(simulated.truth)
    out: dict[str, dict[str, float]] = {}
    for member in simulated.team:
        out[member.name] = {"accuracy": simulated.accuracy(member.name), "agreed_acc": float("nan"),
                            "disputed": float("nan")}
    for rule in RULES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            decisions = aggregate_labels(answers, rule)
        guess = {s: d.background if d.background is not None else d.candidate for s, d in decisions.items()}
        agreed = [s for s in photos if decisions[s].status == "agreed"]
        out[rule] = {
            "accuracy": float(np.mean([guess[s] == simulated.truth[s] for s in photos])),
            "agreed_acc": float(np.mean([decisions[s].background == simulated.truth[s] for s in agreed])),
            "disputed": float(np.mean([decisions[s].status == "disputed" for s in photos])),
        }
    shutil.rmtree(folder)
    return out


def _cell(values: list[float]) -> str:
    finite = [v for v in values if v == v]
    if not finite:
        return "—"
    return f"{100 * np.mean(finite):.1f} [{100 * min(finite):.1f}, {100 * max(finite):.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="worlds and teams drawn (seeds 0..n-1)")
    parser.add_argument("--per-class", type=int, default=60, help="photos per class (4 classes)")
    args = parser.parse_args()
    started, cpu = time.perf_counter(), time.process_time()
    results: dict[str, dict[str, list[dict[str, float]]]] = {t: {} for t in TEAMS}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for seed in range(args.seeds):
            world = scratch / f"world-{seed}"
            _world(world, args.per_class, seed)
            for team in TEAMS:
                for method, row in measure(team, world, scratch, seed).items():
                    results[team].setdefault(method, []).append(row)
    print(f"{args.seeds} seeds x {4 * args.per_class} photos; % mean [min, max] over seeds; "
          "accuracy counts a tie or a disputed photo by the rule's best guess")
    print("| team | method | accuracy | agreed acc | disputed |\n|---|---|---|---|---|")
    for team, methods in results.items():
        for method, rows in methods.items():
            print(f"| {team} | {method} | " + " | ".join(_cell([r[k] for r in rows])
                                                      for k in ("accuracy", "agreed_acc", "disputed")) + " |")
    print()
    print(CAVEATS)
    print(f"\n{time.perf_counter() - started:.0f} s wall, {time.process_time() - cpu:.0f} s CPU")


if __name__ == "__main__":
    main()
