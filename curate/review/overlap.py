"""Which annotator labels which photo: a balanced, seeded overlap with gold photos mixed in.

Several people label each photo so their agreement can be measured
(docs/recipes.md#several-annotators; the table: docs/design.md#dataset-folder;
issue 44). :func:`assign_overlap` gives every photo in scope to exactly ``overlap`` (k) of the
``n`` named annotators and, where ``gold_share`` > 0, mixes gold photos (photos whose background
an adjudicator has fixed) into every queue, unannounced: a gold task looks like any other.

The rule (stated, so a plan can be rebuilt from its inputs):

1. The photos in scope, less the gold photos (their answer is fixed already), are put in a
   seeded random order (``numpy.random.default_rng(seed)``).
2. Photo by photo, the k annotators with the smallest load so far are chosen; among equally
   loaded ones, the set whose pairs have labelled together least often so far (sum of the pair
   counts), then a seeded random key. Choosing k of the least loaded keeps
   ``max(load) - min(load) <= 1`` after every photo (a photo raises the k lowest by one), so
   every annotator's load is ``floor(N k / n)`` or ``ceil(N k / n)``; preferring rare pairs
   spreads the pairs, so every pair of annotators shares photos once ``N k (k - 1) / 2`` reaches
   the number of pairs (Cohen's kappa needs shared photos for each pair).
3. Gold: each annotator gets ``g = min(G, max(1, round(s L / (1 - s))))`` gold photos, where ``s``
   is ``gold_share``, ``L`` their regular load and ``G`` the number of gold photos, so that gold
   makes about ``s`` of the queue; they are taken in turn from a seeded order of the gold photos
   (annotator i starts at ``i g``), so different annotators answer different gold photos where
   there are enough of them.
4. Each queue (regular and gold photos together) is shuffled with its own seeded generator, so
   gold photos sit anywhere in it.

Pure: no server, no folder. :mod:`curate.review.labelstudio` turns a plan into one project per
annotator (Label Studio's open-source edition has no per-user task assignment).
"""
from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: combinations of equally loaded annotators examined per photo before falling back to one at a time
MAX_COMBINATIONS = 2000


class OverlapError(ValueError):
    """An overlap that cannot be planned (the message says why and what to pass instead)."""


@dataclass(frozen=True)
class OverlapPlan:
    """Who labels what: ``queues[annotator]`` in task order (gold mixed in), ``gold[annotator]``
    the gold photos among them, and the inputs that rebuild the plan."""

    annotators: tuple[str, ...]
    overlap: int
    seed: int
    gold_share: float
    queues: Mapping[str, tuple[str, ...]]
    gold: Mapping[str, tuple[str, ...]]

    def load(self, annotator: str) -> int:
        """Regular (non-gold) photos in ``annotator``'s queue."""
        return len(self.queues[annotator]) - len(self.gold[annotator])

    def assignees(self) -> dict[str, tuple[str, ...]]:
        """``{sample_id: annotators}`` of the regular photos (each has exactly ``overlap``)."""
        out: dict[str, list[str]] = {}
        for name in self.annotators:
            gold = set(self.gold[name])
            for sid in self.queues[name]:
                if sid not in gold:
                    out.setdefault(sid, []).append(name)
        return {sid: tuple(names) for sid, names in out.items()}

    def to_json(self) -> dict[str, Any]:
        return {"annotators": list(self.annotators), "overlap": self.overlap, "seed": self.seed,
                "gold_share": self.gold_share, "queues": {a: list(q) for a, q in self.queues.items()},
                "gold": {a: list(g) for a, g in self.gold.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OverlapPlan:
        return cls(tuple(data["annotators"]), int(data["overlap"]), int(data["seed"]), float(data["gold_share"]),
                   {a: tuple(q) for a, q in data["queues"].items()}, {a: tuple(g) for a, g in data["gold"].items()})


def parse_annotators(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"a,b,c"`` (or a list) -> ``("a", "b", "c")``: stripped, none empty, none twice."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text)]
    if not names or any(not n for n in names):
        raise OverlapError(f"--annotators takes comma-separated names (e-mails on the server), got {text!r}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise OverlapError(f"annotator(s) named twice in --annotators: {', '.join(twice)}")
    return tuple(names)


def _stream(seed: int, *parts: str) -> np.random.Generator:
    """A generator seeded by ``seed`` and names (stable across runs and Python's hash seed)."""
    digest = hashlib.sha256("\x1f".join([str(seed), *parts]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _pick(candidates: Sequence[int], need: int, fixed: Sequence[int], pairs: np.ndarray,
          keys: np.ndarray) -> list[int]:
    """``need`` of ``candidates`` with the least pair count among themselves and with ``fixed``
    (ties: the smallest sum of random keys)."""
    if need == len(candidates):
        return list(candidates)
    combos = itertools.combinations(candidates, need)

    def cost(group: Sequence[int]) -> tuple[int, float]:
        members = [*fixed, *group]
        return (int(sum(pairs[a, b] for a, b in itertools.combinations(members, 2))),
                float(sum(keys[g] for g in group)))

    first = list(itertools.islice(combos, MAX_COMBINATIONS + 1))
    if len(first) <= MAX_COMBINATIONS:
        return list(min(first, key=cost))
    chosen: list[int] = []  # too many sets to compare: one at a time, each the cheapest next
    rest = list(candidates)
    for _ in range(need):
        best = min(rest, key=lambda c: cost([*chosen, c]))
        chosen.append(best)
        rest.remove(best)
    return chosen


def assign_overlap(samples: Sequence[str], annotators: Sequence[str], overlap: int, *, seed: int = 0,
                   gold: Sequence[str] = (), gold_share: float = 0.0) -> OverlapPlan:
    """The balanced overlap plan (the rule is in the module docstring)."""
    names = parse_annotators(annotators)
    n = len(names)
    if not 1 <= overlap <= n:
        raise OverlapError(f"--overlap {overlap} needs 1 <= overlap <= the number of annotators ({n})")
    if not 0.0 <= gold_share < 1.0:
        raise OverlapError(f"--gold-share {gold_share} must be in [0, 1)")
    gold_ids = list(dict.fromkeys(str(s) for s in gold))
    if gold_share > 0 and not gold_ids:
        raise OverlapError("--gold-share needs gold photos (photos an adjudicator has fixed); there are none yet: "
                           "adjudicate some disputes first, or leave --gold-share out")
    gold_set = set(gold_ids)
    regular = [s for s in dict.fromkeys(str(s) for s in samples) if s not in gold_set]
    order = [regular[i] for i in _stream(seed, "photos").permutation(len(regular))]
    loads = np.zeros(n, dtype=np.int64)
    pairs = np.zeros((n, n), dtype=np.int64)
    queues: dict[str, list[str]] = {name: [] for name in names}
    rng = _stream(seed, "ties")
    for sid in order:
        keys = rng.random(n)
        low = int(loads.min())
        tier0 = [i for i in range(n) if loads[i] == low]
        if len(tier0) >= overlap:
            chosen = _pick(tier0, overlap, [], pairs, keys)
        else:
            tier1 = [i for i in range(n) if loads[i] == low + 1]
            chosen = tier0 + _pick(tier1, overlap - len(tier0), tier0, pairs, keys)
        for a, b in itertools.combinations(chosen, 2):
            pairs[a, b] += 1
            pairs[b, a] += 1
        for i in chosen:
            loads[i] += 1
            queues[names[i]].append(sid)
    gold_queue: dict[str, tuple[str, ...]] = {name: () for name in names}
    if gold_share > 0:
        pool = [gold_ids[i] for i in _stream(seed, "gold").permutation(len(gold_ids))]
        for i, name in enumerate(names):
            load = len(queues[name])
            g = min(len(pool), max(1, round(gold_share * load / (1.0 - gold_share))))
            gold_queue[name] = tuple(pool[(i * g + j) % len(pool)] for j in range(g))
    final: dict[str, tuple[str, ...]] = {}
    for name in names:
        items = queues[name] + list(gold_queue[name])
        final[name] = tuple(items[i] for i in _stream(seed, "queue", name).permutation(len(items)))
    return OverlapPlan(names, overlap, seed, float(gold_share), final, gold_queue)
