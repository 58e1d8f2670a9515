"""Ranks and pre-tags: from each check's scores to the ``suspect:<check>`` tags (docs/design.md#audit).

- rank: 1 = most suspect; descending score, ties by sample order; NaN (not scored) last, with
  no rank (``-1``).
- one check, several scales (clarity: a mask share or a GradCAM proxy):
  :func:`within_group_percentiles` puts each source's raw scores on one scale, their rank
  percentile within the source, before the ranking above.
- candidates: the top ``ceil(tag_fraction x scored)`` samples of each check among those not
  already rejected, tagged ``suspect:<check>`` in the folder's ``tags`` column. A tag is a
  pointer for a reviewer, never a decision: status and reject_reason are not touched. A new
  audit of a check replaces that check's old tags.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

SUSPECT_PREFIX = "suspect:"


def suspect_tag(check: str) -> str:
    return f"{SUSPECT_PREFIX}{check}"


def ranks(scores: np.ndarray) -> np.ndarray:
    """1-based rank by descending score (stable), ``-1`` for NaN."""
    scores = np.asarray(scores, dtype=np.float64)
    out = np.full(len(scores), -1, dtype=np.int64)
    ok = np.flatnonzero(np.isfinite(scores))
    order = ok[np.argsort(-scores[ok], kind="stable")]
    out[order] = np.arange(1, len(order) + 1)
    return out


def within_group_percentiles(scores: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each finite score's rank percentile within its group: ``(r - 0.5) / n_g``.

    ``r`` is the score's ascending rank among the ``n_g`` finite scores of its group (ties share
    their average rank), so within a group the percentile is a strictly increasing function of
    the score (equal scores, equal percentiles) and a one-group ranking is exactly the raw
    scores' (:func:`ranks`, :func:`top_candidates` and their tie order included). Across groups,
    a top ``k`` by percentile holds each group in proportion to its size (two groups without tied
    scores: each within half a sample of ``k x n_g / n``, for every ``k``). NaN stays NaN and
    counts in no group.
    """
    scores = np.asarray(scores, dtype=np.float64)
    groups = np.asarray(groups)
    if groups.shape != scores.shape:
        raise ValueError(f"within_group_percentiles: {groups.shape} groups for {scores.shape} scores")
    out = np.full(len(scores), np.nan)
    finite = np.isfinite(scores)
    for group in dict.fromkeys(groups[finite].tolist()):
        members = np.flatnonzero(finite & (groups == group))
        values = scores[members]
        _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
        below = np.cumsum(counts) - counts  # how many scores of the group are lower
        rank = (below + (counts + 1) / 2)[inverse]  # ties share their average 1-based rank
        out[members] = (rank - 0.5) / len(values)
    return out


def top_candidates(scores: np.ndarray, fraction: float, eligible: np.ndarray | None = None) -> np.ndarray:
    """Positions of the top ``ceil(fraction x scored eligible)`` samples by score."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"tag fraction must be in [0, 1], got {fraction}")
    scores = np.asarray(scores, dtype=np.float64)
    ok = np.isfinite(scores) if eligible is None else np.isfinite(scores) & eligible
    positions = np.flatnonzero(ok)
    k = math.ceil(fraction * len(positions))
    return positions[np.argsort(-scores[positions], kind="stable")[:k]]


def retag(current: Mapping[str, Sequence[str]], suspects: Mapping[str, set[str]], checks: Sequence[str]
          ) -> dict[str, list[str]]:
    """New ``tags`` per sample whose tags change: the ``suspect:<check>`` tags of ``checks``
    are replaced by ``suspects[sample]`` (a set of checks); other tags are kept in order."""
    replaced = {suspect_tag(c) for c in checks}
    out: dict[str, list[str]] = {}
    for sid, tags in current.items():
        kept = [t for t in (tags or []) if t not in replaced]
        new = kept + [suspect_tag(c) for c in checks if c in suspects.get(sid, set())]
        if new != list(tags or []):
            out[sid] = new
    return out
