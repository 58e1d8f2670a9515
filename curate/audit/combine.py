"""Ranks and pre-tags: from each check's scores to the ``suspect:<check>`` tags (docs/design.md#audit).

- rank: 1 = most suspect; descending score, ties by sample order; NaN (not scored) last, with
  no rank (``-1``).
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
