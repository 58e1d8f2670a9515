"""Simulated annotators with known confusion matrices over the synthetic world (issue 44).

Where the truth is known, the agreement measures can be checked: the synthetic world
(:mod:`curate.collect.synthetic`) knows every photo's true background and exact mask, and a
simulated annotator answers from a confusion matrix stated in advance, so the estimated quality
of each annotator, the aggregated labels and the drop under them can be held against the truth.

An annotator is one of three kinds (:class:`SimulatedAnnotator`, and the team text of
:func:`parse_team`: ``careful:0.05,confuse:grass-tree:0.3,random:0.1``):

- ``careful:e``: right with probability ``1 - e``; otherwise one of the other ``B - 1``
  backgrounds uniformly. ``C[t, t] = 1 - e``, ``C[t, j] = e / (B - 1)`` for ``j != t``;
- ``confuse:a-b:r``: on a photo whose true background is ``a`` answers ``b`` with probability
  ``r`` (and ``a`` for ``b`` likewise); right on every other photo. ``C[a, b] = C[b, a] = r``;
- ``random:r``: with probability ``r`` answers a background drawn uniformly from all ``B``
  (which can be the right one), otherwise right. ``C[t, t] = 1 - r + r / B``, ``C[t, j] = r / B``.

``C`` is the row-stochastic confusion matrix (rows: true background, columns: the answer), in
the vocabulary's order; :func:`confusion_matrix` builds it and every draw samples its row.

The similar pair: the paper names shrub/tree and earth/ground as labels its vocabulary does not
keep apart (papers/003 §2.1, "not entirely orthogonal"); the synthetic world draws neither shrub
nor ground, and curate's vocabulary files list no similarity, so the default team confuses
**grass and tree**, the world's two green vegetation textures
(:func:`curate.collect.world_draw.background_texture`), its nearest analogue of shrub/tree.

Masks (:class:`MaskNoise`): each annotator's mask is the true mask grown (``grow > 0``, binary
dilation by a 3x3 square ``grow`` times) or shrunk (``grow < 0``, erosion), shifted by
``(dy, dx)`` pixels (zero fill), and on a share ``miss`` of the photos missing one quarter of the
object (the pixels on one side of both axes through its centroid, the quadrant drawn at random).

Writing (:func:`simulate_annotators`): each annotator's answer and mask on each photo of a folder
made by ``curate collect synthetic`` goes into the folder's annotation table
(:func:`curate.store.annotations.upsert_annotations`, backend ``simulated``, id
``simulated:<annotator>:<sample>``, source :data:`SOURCE`), with ``overlap`` annotators per photo
(all of them by default) assigned by the review's balanced plan
(:func:`curate.review.overlap.assign_overlap`, the one ``curate review labelstudio --overlap``
uses), and an optional share of gold photos whose true background is written as an adjudicator's
gold answer (:func:`curate.store.annotations.write_gold`), mixed into the queues by that plan and
flagged ``is_gold`` there. The truth is regenerated from the world's recorded spec
(:func:`world_truth`), never read from the folder's ``background``, which the agreement stage may
have derived since.

Reproducible: the answer of annotator ``k`` (its position in the team) on a photo is drawn from
``numpy.random.default_rng([seed, k, crc32(sample_id)])``, so it does not depend on which other
photos or annotators are simulated, nor on their order.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from curate.agreement.metrics import mask_iou
from curate.collect.world_draw import dilated, eroded

__all__ = ["KINDS", "DEFAULT_TEAM", "MaskNoise", "SimulatedAnnotator", "SimulatedTeam", "WorldTruth", "confusion_matrix",
           "parse_team", "draw_label", "noisy_mask", "sample_rng", "world_truth", "simulate_annotators", "SOURCE"]

#: The annotator kinds (module docstring).
KINDS: tuple[str, ...] = ("careful", "confuse", "random")

#: The default team of three (issue 44): careful (5% wrong), confuses grass/tree 30% of the time,
#: answers at random 10% of the time; masks grown 1 px, shrunk 1 px, shifted 2 px with a quarter
#: missed on 20% of the photos.
DEFAULT_TEAM = "careful:0.05,confuse:grass-tree:0.3,random:0.1"


@dataclass(frozen=True)
class MaskNoise:
    """How an annotator's mask departs from the true one (module docstring)."""

    grow: int = 0  # pixels of dilation (> 0) or erosion (< 0), 3x3 square each
    shift: tuple[int, int] = (0, 0)  # (dy, dx) pixels
    miss: float = 0.0  # share of photos on which one quarter of the object is missed

    def __post_init__(self) -> None:
        if not 0.0 <= self.miss <= 1.0:
            raise ValueError(f"mask miss share must be in [0, 1], got {self.miss}")


#: The masks of the default team, by kind (module docstring).
DEFAULT_MASKS: dict[str, MaskNoise] = {
    "careful": MaskNoise(grow=1),
    "confuse": MaskNoise(grow=-1),
    "random": MaskNoise(shift=(0, 2), miss=0.2),
}


@dataclass(frozen=True)
class SimulatedAnnotator:
    """One simulated annotator: its name, kind, rate, confused pair and mask noise."""

    name: str
    kind: str
    rate: float
    pair: tuple[str, str] | None = None  # kind "confuse" only
    masks: MaskNoise = field(default_factory=MaskNoise)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"annotator {self.name!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"annotator {self.name!r}: rate must be in [0, 1], got {self.rate}")
        if (self.kind == "confuse") != (self.pair is not None):
            raise ValueError(f"annotator {self.name!r}: a confused pair is given with kind 'confuse' and only then")
        if self.pair is not None and self.pair[0] == self.pair[1]:
            raise ValueError(f"annotator {self.name!r}: the confused pair needs two different backgrounds")

    @property
    def text(self) -> str:
        """The team-text form (``confuse:grass-tree:0.3``)."""
        middle = f":{self.pair[0]}-{self.pair[1]}" if self.pair else ""
        return f"{self.kind}{middle}:{self.rate:g}"


def confusion_matrix(annotator: SimulatedAnnotator, backgrounds: Sequence[str]) -> np.ndarray:
    """The (B, B) row-stochastic confusion matrix ``C[true, answer]`` of ``annotator`` over
    ``backgrounds`` (module docstring); ValueError when its confused pair is not in them."""
    names = list(backgrounds)
    b = len(names)
    if b < 2:
        raise ValueError("a confusion matrix needs at least two backgrounds")
    r = annotator.rate
    if annotator.kind == "careful":
        matrix = np.full((b, b), r / (b - 1))
        np.fill_diagonal(matrix, 1.0 - r)
    elif annotator.kind == "random":
        matrix = np.full((b, b), r / b)
        np.fill_diagonal(matrix, 1.0 - r + r / b)
    else:
        missing = [x for x in annotator.pair or () if x not in names]
        if missing:
            raise ValueError(f"annotator {annotator.name!r} confuses {missing}, not in the backgrounds "
                             f"({', '.join(names)})")
        i, j = (names.index(x) for x in annotator.pair or ())
        matrix = np.eye(b)
        matrix[i, i] = matrix[j, j] = 1.0 - r
        matrix[i, j] = matrix[j, i] = r
    return matrix


def parse_team(text: str, masks: Mapping[str, MaskNoise] | None = None) -> list[SimulatedAnnotator]:
    """Annotators from ``careful:0.05,confuse:grass-tree:0.3,random:0.1`` (``careful`` alone = rate
    0). Names are ``<kind>`` (``<kind>-2``, ... when a kind repeats); masks by kind from ``masks``
    (default :data:`DEFAULT_MASKS`). ValueError naming the bad item otherwise."""
    masks = DEFAULT_MASKS if masks is None else masks
    team: list[SimulatedAnnotator] = []
    seen: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        kind = parts[0]
        try:
            if kind == "confuse":
                if len(parts) != 3 or parts[1].count("-") != 1:
                    raise ValueError("write it confuse:<background>-<background>:<rate>")
                a, b = parts[1].split("-")
                pair: tuple[str, str] | None = (a, b)
                rate = float(parts[2])
            elif kind in KINDS:
                if len(parts) > 2:
                    raise ValueError(f"write it {kind}:<rate>")
                pair, rate = None, float(parts[1]) if len(parts) == 2 else 0.0
            else:
                raise ValueError(f"the kind must be one of {', '.join(KINDS)}")
            seen[kind] = seen.get(kind, 0) + 1
            name = kind if seen[kind] == 1 else f"{kind}-{seen[kind]}"
            team.append(SimulatedAnnotator(name, kind, rate, pair, masks.get(kind, MaskNoise())))
        except ValueError as error:
            raise ValueError(f"team member {item!r}: {error}") from None
    if not team:
        raise ValueError(f"no annotator in team {text!r}")
    return team


def sample_rng(seed: int, position: int, sample_id: str) -> np.random.Generator:
    """The generator of annotator ``position``'s answer on ``sample_id`` (module docstring)."""
    return np.random.default_rng([seed, position, zlib.crc32(sample_id.encode())])


def draw_label(matrix: np.ndarray, truth: int, rng: np.random.Generator) -> int:
    """One answer (a column index) drawn from row ``truth`` of the confusion matrix."""
    row = matrix[truth]
    return int(min(np.searchsorted(np.cumsum(row), rng.random(), side="right"), len(row) - 1))


def _grown(mask: np.ndarray, steps: int) -> np.ndarray:
    out = mask.astype(bool)
    for _ in range(abs(steps)):
        out = dilated(out) if steps > 0 else eroded(out)
    return out


def _shifted(mask: np.ndarray, dy: int, dx: int) -> np.ndarray:
    out = np.zeros_like(mask)
    h, w = mask.shape
    ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
    xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
    out[yd, xd] = mask[ys, xs]
    return out


def noisy_mask(mask: np.ndarray, noise: MaskNoise, rng: np.random.Generator) -> np.ndarray:
    """The annotator's (H, W) uint8 {0, 1} mask: ``mask`` grown or shrunk, shifted, and on a share
    ``noise.miss`` of photos one quarter missed (module docstring). Draws two numbers from ``rng``
    whatever the noise, so the stream is the same for every setting."""
    missed, quadrant = rng.random() < noise.miss, int(rng.integers(4))
    out = _shifted(_grown(mask, noise.grow), *noise.shift)
    if missed and out.any():
        ys, xs = np.nonzero(out)
        cy, cx = ys.mean(), xs.mean()
        yy, xx = np.mgrid[0:out.shape[0], 0:out.shape[1]]
        below, right = quadrant // 2, quadrant % 2
        part = ((yy >= cy) if below else (yy < cy)) & ((xx >= cx) if right else (xx < cx))
        out = out & ~part
    return out.astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# The team on a dataset folder
# ---------------------------------------------------------------------------------------------

#: The annotation table's ``source`` of every simulated answer (a re-run replaces the team's rows).
SOURCE = "simulated"


@dataclass(frozen=True)
class WorldTruth:
    """A photo's true background and exact mask, regenerated from the world's spec."""

    background: str
    mask: np.ndarray


def world_truth(ds: Any) -> dict[str, WorldTruth]:
    """``{sample_id: WorldTruth}`` of every sample of a synthetic folder (``source_id`` =
    ``"<seed>:<index>"``), regenerated with :func:`curate.collect.synthetic.generate_sample` from the
    spec ``dataset.yaml`` records; ValueError for a folder the synthetic world did not make."""
    from curate.collect.synthetic import generate_sample, world_spec_of

    spec = world_spec_of(ds)
    out: dict[str, WorldTruth] = {}
    for row in ds.rows(source="synthetic"):
        seed, _, index = str(row["source_id"]).partition(":")
        if int(seed) != spec.seed:
            continue
        sample = generate_sample(spec, int(index))
        out[row["sample_id"]] = WorldTruth(sample.background, sample.mask)
    if not out:
        raise ValueError(f"{ds.root}: no sample of the recorded synthetic world (seed {spec.seed}) to annotate")
    return out


@dataclass
class SimulatedTeam:
    """What :func:`simulate_annotators` drew and wrote (the truth kept beside the answers)."""

    team: list[SimulatedAnnotator]
    backgrounds: tuple[str, ...]
    matrices: dict[str, np.ndarray]  # annotator -> C[true, answer] in ``backgrounds`` order
    truth: dict[str, str]  # sample_id -> true background
    labels: dict[str, dict[str, str]]  # annotator -> {sample_id: answer}
    mask_iou: dict[str, dict[str, float]]  # annotator -> {sample_id: IoU of its mask with the true mask}
    gold: tuple[str, ...] = ()  # the gold photos' sample ids
    outcome: Any = None  # the annotation table's AnnotationUpsert

    def accuracy(self, annotator: str) -> float:
        """The share of ``annotator``'s answers that are the true background."""
        answers = self.labels[annotator]
        return sum(self.truth[s] == b for s, b in answers.items()) / max(len(answers), 1)

    def true_accuracy(self, annotator: str) -> float:
        """The accuracy the matrix gives on this folder's photos: mean over photos of ``C[t, t]``."""
        index = {b: i for i, b in enumerate(self.backgrounds)}
        diag = np.diag(self.matrices[annotator])
        answered = self.labels[annotator]
        return float(np.mean([diag[index[self.truth[s]]] for s in answered])) if answered else float("nan")


def simulate_annotators(ds: Any, team: Sequence[SimulatedAnnotator] | str = DEFAULT_TEAM, *, seed: int = 0,
                        overlap: int | None = None, gold: float = 0.0,
                        actor: str = "simulate-annotators") -> SimulatedTeam:
    """Draw every team member's answers and masks on a synthetic folder and write them into its
    annotation table (module docstring). ``team``: annotators or the team text of :func:`parse_team`;
    ``overlap``: annotators per photo (default: the whole team); ``gold``: the share of photos
    (rounded up, the first in ``crc32(sample_id)`` order) whose truth is written as gold, also the
    plan's gold share of each queue (with the whole team, every member answers every gold photo).
    ValueError for a folder the world did not make, a team member whose confused pair is not in
    the folder's backgrounds, two members of one name, or an overlap outside 1..team size."""
    from curate.review.overlap import assign_overlap
    from curate.store.annotations import Annotation, upsert_annotations, write_gold

    members = parse_team(team) if isinstance(team, str) else list(team)
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ValueError(f"two team members share a name: {names}")
    overlap = len(members) if overlap is None else int(overlap)
    if not 1 <= overlap <= len(members):
        raise ValueError(f"overlap must be 1 to {len(members)} (the team's size), got {overlap}")
    if not 0.0 <= gold < 1.0:
        raise ValueError(f"the gold share must be in [0, 1), got {gold}")
    backgrounds = tuple(ds.backgrounds)
    matrices = {m.name: confusion_matrix(m, backgrounds) for m in members}
    truths = world_truth(ds)
    order = sorted(truths, key=lambda s: (zlib.crc32(s.encode()), s))
    gold_ids = tuple(order[:math.ceil(gold * len(order))]) if gold else ()
    plan = assign_overlap(order, names, overlap, seed=seed, gold=gold_ids, gold_share=gold)
    position = {name: k for k, name in enumerate(names)}
    queues: dict[str, list[int]] = {sid: [] for sid in order}
    for name in names:
        for sid in plan.queues[name]:
            queues[sid].append(position[name])
    index = {b: i for i, b in enumerate(backgrounds)}
    labels: dict[str, dict[str, str]] = {m.name: {} for m in members}
    ious: dict[str, dict[str, float]] = {m.name: {} for m in members}
    rows, masks = [], {}
    for sid in order:
        truth = truths[sid]
        for k in sorted(queues[sid]):
            member = members[k]
            rng = sample_rng(seed, k, sid)
            answer = backgrounds[draw_label(matrices[member.name], index[truth.background], rng)]
            drawn = noisy_mask(truth.mask, member.masks, rng)
            aid = f"{SOURCE}:{member.name}:{sid}"
            rows.append(Annotation(annotation_id=aid, sample_id=sid, annotator=member.name, backend="simulated",
                                   backgrounds=(answer,), is_gold=sid in gold_ids))
            masks[aid] = drawn
            labels[member.name][sid] = answer
            ious[member.name][sid] = mask_iou(drawn, truth.mask)
    outcome = upsert_annotations(ds, rows, source=SOURCE, actor=actor, present_ids={r.annotation_id for r in rows},
                                 masks=masks)
    if gold_ids:
        write_gold(ds, {sid: truths[sid].background for sid in gold_ids}, actor)
    return SimulatedTeam(members, backgrounds, matrices, {s: t.background for s, t in truths.items()}, labels, ious,
                         gold_ids, outcome)
