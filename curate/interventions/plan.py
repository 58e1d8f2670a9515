"""Which variants each photo gets and whose background it is pasted on (docs/design.md#interventions).

The variants (names as the CLI writes them; anchors: Xiao et al. 2020, the Backgrounds Challenge
and its ImageNet-9 variants; Singla & Feizi 2022 and Moayeri et al. 2022 for the noise pair):

================  ==========================================================================
``original``      the photo as it is (always written: every difference is taken against it)
``only-fg``       the object on black (Xiao's Only-FG)
``no-fg``         the object's hole blacked out (Xiao's No-FG)
``only-bg``       the hole filled with tiles of the photo's own background (Xiao's Only-BG-T)
``mixed-same``    the object on the only-bg of another photo of its class (Mixed-Same)
``mixed-rand``    ... of a photo of a random other class (Mixed-Rand; the class is drawn
                  uniformly, then the photo within it)
``mixed-next``    ... of a photo of the next class in index order (Mixed-Next)
``swap``          CounterAnimal's swap: a hard photo's object on the only-bg of an easy photo
                  of its class, an easy photo's object on a hard one (``swaps`` donors each)
``paste``         the paste control: the object on its own only-bg (what cutting and pasting
                  costs when the background does not change)
``noise-fg``      Gaussian noise of ``sigma`` on the object's pixels (Hard ImageNet's RFS)
``noise-bg``      the same noise field on every other pixel
``adversarial``   the object on each of a fixed set of ``adversarial_backgrounds`` only-bgs
================  ==========================================================================

Donors are chosen by size: among the candidates (the variant's class / group rule, not the photo
itself, with a licence that may be combined with the photo's, :func:`curate.licenses.derivative_licence`),
the ``match_pool`` whose object covers the share of its image closest to the photo's (in log
ratio) are kept and the donor is drawn from them. A donor whose object was about as large as the
photo's leaves a hole that the pasted object mostly covers, and a background seen from a similar
distance. Every draw comes from ``numpy.random.default_rng([seed, <photo id>, <variant code>])``,
so the plan of one photo does not depend on the order of the others, and a re-run with the same
seed, sources and settings plans the same images.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from curate.licenses import derivative_licence

__all__ = ["VARIANTS", "DONOR_VARIANTS", "VARIANT_CODES", "Source", "Assignment", "parse_variants", "plan_donors", "describe",
           "adversarial_set", "variant_rng"]

VARIANTS: tuple[str, ...] = ("original", "only-fg", "no-fg", "only-bg", "mixed-same", "mixed-rand", "mixed-next",
                             "swap", "paste", "noise-fg", "noise-bg", "adversarial")
#: Variants whose background comes from another photo (a donor).
DONOR_VARIANTS: tuple[str, ...] = ("mixed-same", "mixed-rand", "mixed-next", "swap", "adversarial")
#: A fixed code per variant for the seeded draws (never renumber: plans would change).
VARIANT_CODES: dict[str, int] = {name: i for i, name in enumerate(VARIANTS)}


def parse_variants(names: Sequence[str] | str | None) -> tuple[str, ...]:
    """The variants asked for, in :data:`VARIANTS` order, ``original`` always included.

    Accepts a comma-separated string or a sequence; ``all`` (or None) is every variant; unknown
    names are a ValueError listing the known ones."""
    if names is None:
        return VARIANTS
    items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n and n.strip()]
    if not items or "all" in items:
        return VARIANTS
    unknown = [n for n in items if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)} (or all)")
    asked = set(items) | {"original"}
    return tuple(v for v in VARIANTS if v in asked)


@dataclass(frozen=True)
class Source:
    """One masked photo of the source folder as the planner sees it."""

    sample_id: str
    class_index: int
    group: str  # easy | hard
    license: str
    area: float  # the object's share of the image (mask pixels / all pixels)
    can_donate: bool = True  # its background can be filled in (the object does not cover the whole image)


@dataclass(frozen=True)
class Assignment:
    """One planned donor image: ``variant`` of ``source`` on ``donor``'s background (rank ``k``)."""

    source: Source
    variant: str
    k: int
    donor: Source
    license: str


def variant_rng(seed: int, sample_id: str, variant: str) -> np.random.Generator:
    """The generator of one photo's draws for one variant (independent of every other photo)."""
    return np.random.default_rng([int(seed), int(sample_id[:15], 16), VARIANT_CODES[variant]])


def _size_matched(source: Source, candidates: Sequence[Source], n: int, pool: int, rng: np.random.Generator,
                  refused: dict[str, int]) -> list[tuple[Source, str]]:
    """Up to ``n`` distinct donors drawn from the ``max(pool, n)`` candidates closest in object size."""
    usable: list[tuple[float, str, Source, str]] = []
    for cand in candidates:
        if cand.sample_id == source.sample_id or not cand.can_donate:
            continue
        licence = derivative_licence((source.license, cand.license))
        if licence is None:
            refused["licence_incompatible"] = refused.get("licence_incompatible", 0) + 1
            continue
        distance = abs(math.log(max(source.area, 1e-6) / max(cand.area, 1e-6)))
        usable.append((distance, cand.sample_id, cand, licence))
    if not usable:
        return []
    usable.sort(key=lambda item: (item[0], item[1]))
    nearest = usable[:max(pool, n)]
    picks = rng.choice(len(nearest), size=min(n, len(nearest)), replace=False)
    return [(nearest[int(i)][2], nearest[int(i)][3]) for i in sorted(picks)]


def plan_donors(sources: Sequence[Source], variants: Sequence[str], *, seed: int, swaps: int = 1, match_pool: int = 5,
                adversarial: Sequence[Source] = ()) -> tuple[list[Assignment], dict[str, int]]:
    """Every donor image to make, and the counts of what could not be planned (by reason).

    Reasons: ``no_donor:<variant>`` (no candidate of the right class / group), and
    ``licence_incompatible`` (a candidate whose licence cannot be combined with the photo's).
    """
    by_class: dict[int, list[Source]] = {}
    for s in sorted(sources, key=lambda s: s.sample_id):
        by_class.setdefault(s.class_index, []).append(s)
    classes = sorted(by_class)
    missing: dict[str, int] = {}
    plan: list[Assignment] = []
    for source in sorted(sources, key=lambda s: s.sample_id):
        for variant in variants:
            if variant not in DONOR_VARIANTS:
                continue
            rng = variant_rng(seed, source.sample_id, variant)
            count = swaps if variant == "swap" else 1
            if variant == "adversarial":
                chosen = []
                for donor in adversarial:
                    if donor.sample_id == source.sample_id:
                        continue
                    licence = derivative_licence((source.license, donor.license))
                    if licence is None:
                        missing["licence_incompatible"] = missing.get("licence_incompatible", 0) + 1
                        continue
                    chosen.append((donor, licence))
            else:
                candidates = _candidates(variant, source, by_class, classes, rng)
                chosen = _size_matched(source, candidates, count, match_pool, rng, missing)
            if not chosen:
                missing[f"no_donor:{variant}"] = missing.get(f"no_donor:{variant}", 0) + 1
            for k, (donor, licence) in enumerate(chosen):
                plan.append(Assignment(source, variant, k, donor, licence))
    return plan, missing


def _candidates(variant: str, source: Source, by_class: dict[int, list[Source]], classes: list[int],
                rng: np.random.Generator) -> list[Source]:
    own = by_class.get(source.class_index, [])
    if variant == "mixed-same":
        return own
    if variant == "swap":
        other_group = "hard" if source.group == "easy" else "easy"
        return [s for s in own if s.group == other_group]
    others = [c for c in classes if c != source.class_index and any(s.can_donate for s in by_class[c])]
    if not others:
        return []
    if variant == "mixed-rand":
        return by_class[others[int(rng.integers(len(others)))]]
    if variant == "mixed-next":
        later = [c for c in others if c > source.class_index]
        return by_class[later[0] if later else others[0]]
    raise ValueError(f"variant {variant!r} has no donor rule")


def adversarial_set(sources: Sequence[Source], k: int, seed: int) -> list[Source]:
    """The ``k`` photos whose backgrounds every object is tried on (Xiao et al.'s adversarial
    backgrounds, bounded): taken in turn from each (class, group) cell, in class order, each
    cell's photos in a seeded order, so the set spans the classes and both groups."""
    if k <= 0:
        return []
    cells: dict[tuple[int, str], list[Source]] = {}
    for s in sorted(sources, key=lambda s: s.sample_id):
        if s.can_donate:
            cells.setdefault((s.class_index, s.group), []).append(s)
    rng = np.random.default_rng([int(seed), VARIANT_CODES["adversarial"]])
    queues = {key: [members[int(i)] for i in rng.permutation(len(members))] for key, members in sorted(cells.items())}
    chosen: list[Source] = []
    while len(chosen) < k and any(queues.values()):
        for key in sorted(queues):
            if queues[key] and len(chosen) < k:
                chosen.append(queues[key].pop(0))
    return chosen


def describe(assignment: Assignment) -> dict[str, Any]:
    """The donor columns of a variants-table row."""
    return {"donor_sample_id": assignment.donor.sample_id, "donor_class_index": assignment.donor.class_index,
            "donor_group": assignment.donor.group, "k": assignment.k, "license": assignment.license}
