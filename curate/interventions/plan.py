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
``ghost``         a hard photo's swap donor's only-bg as it enters the swap, nothing pasted
``ghost-neutral`` ... with the hard object's mask filled with the background's mean colour
``swap-unghosted`` the swap with the donor's hole's bounding box filled instead of its hole (no
                  outline of the donor's object is left)
``refill``        the fill control: a hard photo itself, with the part of its swap donor's filled
                  hole that the object leaves showing filled the same way from its own background
================  ==========================================================================

Donors are chosen by cover (``match="cover"``, the default): among the candidates (the variant's
class / group rule, not the photo itself, with a licence that may be combined with the photo's,
:func:`curate.licenses.derivative_licence`), the ``match_pool`` whose hole the photo's object
covers best are kept (the smallest *uncovered* share ``|hole_d & ~mask_p| / |hole_d|``, measured
on a :data:`COVER_GRID` square grid; ties by object size, then id) and the donor is drawn from
them. What the object leaves of a donor's hole keeps the outline of the donor's own object, an
object of the same class for a swap: a ghost a shape-reading model can take for the class
(docs/interventions.md#the-ghost-control). ``max_uncovered`` refuses donors that leave more than
that share uncovered (counted ``uncovered_over_cap:<variant>``). ``match="size"`` is the older
rule: the ``match_pool`` whose object covers the share of its image closest to the photo's (in
log ratio). Every draw comes from ``numpy.random.default_rng([seed, <photo id>, <variant code>])``,
so the plan of one photo does not depend on the order of the others, and a re-run with the same
seed, sources and settings plans the same images.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from curate.licenses import derivative_licence

__all__ = ["VARIANTS", "DONOR_VARIANTS", "VARIANT_CODES", "GHOST_VARIANTS", "FILL_VARIANTS", "SWAP_CONTROLS",
           "MATCHES", "COVER_GRID", "Source",
           "Assignment", "parse_variants", "plan_donors", "describe", "adversarial_set", "variant_rng", "grid_mask",
           "grid_uncovered"]

VARIANTS: tuple[str, ...] = ("original", "only-fg", "no-fg", "only-bg", "mixed-same", "mixed-rand", "mixed-next",
                             "swap", "paste", "noise-fg", "noise-bg", "adversarial", "ghost", "ghost-neutral",
                             "swap-unghosted", "refill")
#: The ghost control, made beside each swap of a hard photo, on the same donor (docs/interventions.md).
GHOST_VARIANTS: tuple[str, ...] = ("ghost", "ghost-neutral", "swap-unghosted")
#: The fill control, made beside each swap of a hard photo, on the same donor's hole (docs/interventions.md).
FILL_VARIANTS: tuple[str, ...] = ("refill",)
#: The controls every hard swap brings with it (:func:`parse_variants`).
SWAP_CONTROLS: tuple[str, ...] = GHOST_VARIANTS + FILL_VARIANTS
#: Donor rules of :func:`plan_donors`.
MATCHES: tuple[str, ...] = ("cover", "size")
#: Side of the square grid the planner measures cover on (the image records the exact share).
COVER_GRID = 32
#: Variants whose background comes from another photo (a donor).
DONOR_VARIANTS: tuple[str, ...] = ("mixed-same", "mixed-rand", "mixed-next", "swap", "adversarial")
#: A fixed code per variant for the seeded draws (never renumber: plans would change).
VARIANT_CODES: dict[str, int] = {name: i for i, name in enumerate(VARIANTS)}
#: ``swap-bgonly`` (a hard object on a photo of its swap donor's background alone) is made only when
#: background-alone photos are given (:mod:`curate.interventions.background_photos`), so it is no name of
#: :data:`VARIANTS`; its seeded draws have a code of their own after theirs.
VARIANT_CODES["swap-bgonly"] = len(VARIANTS)


def parse_variants(names: Sequence[str] | str | None) -> tuple[str, ...]:
    """The variants asked for, in :data:`VARIANTS` order, ``original`` always included, and the
    ghost and fill controls (:data:`SWAP_CONTROLS`) whenever ``swap`` is: every B gets its controls.

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
    asked = set(items) | {"original"} | (set(SWAP_CONTROLS) if "swap" in items else set())
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
    grid_mask: np.ndarray | None = field(default=None, compare=False, repr=False)  # the mask on the cover grid
    grid_hole: np.ndarray | None = field(default=None, compare=False, repr=False)  # the hole on the cover grid


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


def grid_mask(mask: np.ndarray) -> np.ndarray:
    """A bool mask on the :data:`COVER_GRID` square grid (nearest neighbour: pixel centres sampled)."""
    m = np.asarray(mask, dtype=bool)
    rows = ((np.arange(COVER_GRID) + 0.5) * m.shape[0] / COVER_GRID).astype(int)
    cols = ((np.arange(COVER_GRID) + 0.5) * m.shape[1] / COVER_GRID).astype(int)
    return m[np.ix_(rows, cols)]


def grid_uncovered(source: Source, donor: Source) -> float:
    """The share of ``donor``'s hole that ``source``'s object leaves showing, on the cover grid
    (``|hole_d & ~mask_s| / |hole_d|``; 0.0 when either has no grid masks or the hole is empty)."""
    if source.grid_mask is None or donor.grid_hole is None:
        return 0.0
    total = int(donor.grid_hole.sum())
    return 0.0 if total == 0 else float((donor.grid_hole & ~source.grid_mask).sum() / total)


def _matched(source: Source, candidates: Sequence[Source], n: int, pool: int, rng: np.random.Generator,
             refused: dict[str, int], variant: str, match: str = "cover",
             max_uncovered: float | None = None) -> list[tuple[Source, str]]:
    """Up to ``n`` distinct donors drawn from the ``max(pool, n)`` best candidates (module docstring)."""
    usable: list[tuple[float, float, str, Source, str]] = []
    for cand in candidates:
        if cand.sample_id == source.sample_id or not cand.can_donate:
            continue
        licence = derivative_licence((source.license, cand.license))
        if licence is None:
            refused["licence_incompatible"] = refused.get("licence_incompatible", 0) + 1
            continue
        uncovered = grid_uncovered(source, cand)
        if max_uncovered is not None and uncovered > max_uncovered:
            refused[f"uncovered_over_cap:{variant}"] = refused.get(f"uncovered_over_cap:{variant}", 0) + 1
            continue
        distance = abs(math.log(max(source.area, 1e-6) / max(cand.area, 1e-6)))
        usable.append((uncovered if match == "cover" else 0.0, distance, cand.sample_id, cand, licence))
    if not usable:
        return []
    usable.sort(key=lambda item: (round(item[0], 6), item[1], item[2]))
    nearest = usable[:max(pool, n)]
    picks = rng.choice(len(nearest), size=min(n, len(nearest)), replace=False)
    return [(nearest[int(i)][3], nearest[int(i)][4]) for i in sorted(picks)]


def plan_donors(sources: Sequence[Source], variants: Sequence[str], *, seed: int, swaps: int = 1, match_pool: int = 5,
                adversarial: Sequence[Source] = (), match: str = "cover", max_uncovered: float | None = None
                ) -> tuple[list[Assignment], dict[str, int]]:
    """Every donor image to make, and the counts of what could not be planned (by reason).

    Reasons: ``no_donor:<variant>`` (no candidate of the right class / group, or none under the
    cap), ``licence_incompatible`` (a candidate whose licence cannot be combined with the photo's)
    and ``uncovered_over_cap:<variant>`` (a candidate whose hole the object leaves more than
    ``max_uncovered`` of; counted per candidate). The ghost variants ride on the swaps (the stage
    makes them beside each swap of a hard photo), so they are planned here as nothing of their own.
    """
    if match not in MATCHES:
        raise ValueError(f"unknown donor rule {match!r}; known: {', '.join(MATCHES)}")
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
                chosen = _matched(source, candidates, count, match_pool, rng, missing, variant, match, max_uncovered)
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
