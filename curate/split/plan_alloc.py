"""The fewest photos that bring a sum of ``variance / count`` terms under a limit (``curate plan``,
docs/design.md#collection-plan).

A class's drop has bootstrap variance ``a / N_e + b / N_h``; the dataset's mean drop over K classes
``(1 / K^2) sum_c (a_c / N_e,c + b_c / N_h,c)``. Both are a sum over cells ``i`` of ``v_i / N_i``,
and the question is the same: the fewest photos ``m_i >= 0`` to add so that
``sum_i v_i / (n_i + m_i) <= L``.

Adding a photo to cell ``i`` at size ``N`` removes ``v_i / (N (N + 1))`` from the sum, a gain
that shrinks with every photo added. With gains that shrink in every cell, taking the largest
gains first (greedy) removes the most for every number of photos added, so the first number at
which the greedy allocation meets the limit is the true minimum total (not each cell's continuous
optimum rounded up on its own, which can cost a photo more).

For speed the greedy walk starts from a state it passes through: every gain at least ``lam``
taken, with ``lam`` a little above the continuous optimum's marginal ``1 / mu^2`` (the continuous
optimum is ``N_i = max(n_i, sqrt(v_i) mu)``), so that state has fewer photos than any allocation
meeting the limit.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

__all__ = ["fewest_photos", "variance_sum"]


def variance_sum(variances: Sequence[float], sizes: Sequence[float]) -> float:
    """``sum_i v_i / N_i`` (infinite when a cell with a variance has no photo)."""
    total = 0.0
    for v, n in zip(variances, sizes):
        if v > 0:
            if n <= 0:
                return math.inf
            total += v / n
    return total


def _continuous_mu(variances: Sequence[float], counts: Sequence[int], limit: float) -> float:
    """``mu`` with ``sum_i v_i / max(n_i, sqrt(v_i) mu) = limit`` (bisection; the sum falls as mu grows)."""
    def total(mu: float) -> float:
        return sum(v / max(n, math.sqrt(v) * mu) for v, n in zip(variances, counts) if v > 0)

    low, high = 0.0, 1.0
    while total(high) > limit:
        low, high = high, 2 * high
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if total(mid) > limit else (low, mid)
    return low


def _start(variances: Sequence[float], counts: Sequence[int], limit: float) -> list[int]:
    """Photos added when every gain ``>= lam`` is taken (a state of the greedy walk below the minimum)."""
    mu = _continuous_mu(variances, counts, limit)
    if not mu > 0:
        return [0] * len(counts)
    lam = 1.01 / (mu * mu)
    added = []
    for v, n in zip(variances, counts):
        # gains v / (N (N + 1)) >= lam for N = n, n + 1, ..., top: N (N + 1) <= v / lam
        top = math.floor((math.sqrt(1 + 4 * v / lam) - 1) / 2) if v > 0 else 0
        added.append(max(0, top - n + 1) if n > 0 else 0)
    return added


def fewest_photos(variances: Sequence[float], counts: Sequence[int], limit: float) -> list[int]:
    """The fewest photos to add per cell so that ``sum_i v_i / (n_i + m_i) <= limit`` (module docstring).

    ``variances``: ``v_i >= 0``; ``counts``: ``n_i >= 0`` (a cell with a variance and no photo gets
    one first); ``limit > 0``. Returns ``m_i`` per cell.
    """
    if not limit > 0:
        raise ValueError(f"the limit must be > 0, got {limit}")
    counts = [int(n) for n in counts]
    added = [1 if v > 0 and n <= 0 else 0 for v, n in zip(variances, counts)]
    if variance_sum(variances, [n + m for n, m in zip(counts, added)]) <= limit:
        return added
    base = [n + m for n, m in zip(counts, added)]
    start = _start(variances, base, limit)
    sizes = [n + m for n, m in zip(base, start)]
    if variance_sum(variances, sizes) <= limit:  # rounding put the start past the minimum: walk from the beginning
        sizes = list(base)
    heap = [(-v / (n * (n + 1)), i) for i, (v, n) in enumerate(zip(variances, sizes)) if v > 0]
    heapq.heapify(heap)
    while variance_sum(variances, sizes) > limit:
        _, i = heapq.heappop(heap)
        sizes[i] += 1
        heapq.heappush(heap, (-variances[i] / (sizes[i] * (sizes[i] + 1)), i))
    return [s - n for s, n in zip(sizes, counts)]
