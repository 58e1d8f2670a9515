"""Exact and near duplicates, within and across classes: cosine similarity of the cached CLIP
embeddings (blockwise, never the N x N matrix) and a perceptual hash (``imagehash.phash``).

For each sample ``i``:

    cos_i  = max_{j != i} <e_i, e_j>                  (embeddings L2-normalised)
    hash_i = 1 - min_{j != i} hamming(h_i, h_j) / 64   (64-bit DCT perceptual hash)
    score_i = max(pct(cos)_i, pct(hash)_i) + 1e-3 (cos_i + hash_i)   with imagehash,  cos_i  without

where ``pct`` is the rank percentile among the audited images: the two similarities live on
different scales (a small CLIP puts every same-class pair above 0.98 cosine), so each votes by
how extreme it is in this collection; exact copies are extreme in both.

Pairs with ``hamming <= hash_threshold`` or ``cos >= cos_threshold`` are joined into duplicate
groups (connected components); each group is listed with its members' classes, so a group
across classes (a copy filed under two labels) stands out. ``flagged`` = member of a group.

Memory: similarities are computed ``block`` rows at a time against all ``N`` rows, so the peak
is ``block x N`` float32 (1024 x 100k = 400 MB) instead of ``N^2`` (40 GB at 100k); Hamming
distances the same way on packed ``uint64`` hashes with ``numpy.bitwise_count``. We write this
ourselves rather than calling scikit-learn's ``NearestNeighbors`` (what FiftyOne Brain uses):
its brute-force cosine path materialises distance chunks in float64 and sorts them; ours keeps
float32 and an ``argmax`` (``benchmarks/audit.py`` prints the ratio).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from curate.audit.base import AuditInputs, CheckResult, nan_scores

logger = logging.getLogger(__name__)

METHOD = "max of rank percentiles: nearest-neighbour cosine of CLIP embeddings, nearest phash similarity"
DEFAULT_BLOCK = 1024
DEFAULT_COS_THRESHOLD = 0.998
DEFAULT_HASH_THRESHOLD = 4


def nearest_cosine(embeddings: np.ndarray, *, block: int = DEFAULT_BLOCK,
                   threshold: float | None = None) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, float]]]:
    """Blockwise nearest neighbour by cosine: (similarity (N,), neighbour index (N,), pairs).

    ``pairs`` lists ``(i, j, cos)`` with ``i < j`` and ``cos >= threshold`` (none when no
    threshold). Rows must be L2-normalised. Peak memory ``block x N`` float32.
    """
    e = np.ascontiguousarray(embeddings, dtype=np.float32)
    n = len(e)
    best = np.full(n, -np.inf, dtype=np.float32)
    arg = np.full(n, -1, dtype=np.int64)
    pairs: list[tuple[int, int, float]] = []
    if n < 2:
        return best.astype(np.float64), arg, pairs
    for start in range(0, n, block):
        stop = min(n, start + block)
        sim = e[start:stop] @ e.T  # (b, N)
        sim[np.arange(stop - start), np.arange(start, stop)] = -np.inf  # not oneself
        arg[start:stop] = np.argmax(sim, axis=1)
        best[start:stop] = sim[np.arange(stop - start), arg[start:stop]]
        if threshold is not None:
            rows, cols = np.nonzero(sim >= threshold)
            keep = cols > rows + start
            pairs.extend((int(r + start), int(c), float(sim[r, c])) for r, c in zip(rows[keep], cols[keep]))
    return best.astype(np.float64), arg, pairs


def phash_values(paths: Sequence[Path], *, hash_size: int = 8,
                 progress: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, dict[int, str]]:
    """64-bit perceptual hashes packed in ``uint64`` (position -> failure reason for undecodable files)."""
    import imagehash
    from PIL import Image

    out = np.zeros(len(paths), dtype=np.uint64)
    failed: dict[int, str] = {}
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as image:
                bits = imagehash.phash(image.convert("RGB"), hash_size=hash_size).hash.flatten()
            out[i] = np.packbits(bits.astype(np.uint8)).view(">u8")[0]
        except Exception as error:  # counted per sample, never fatal
            failed[i] = f"{type(error).__name__}: {error}"[:300]
        if progress is not None:
            progress(i + 1, len(paths))
    return out, failed


def nearest_hamming(hashes: np.ndarray, *, block: int = 256,
                    threshold: int | None = None) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]]]:
    """Blockwise nearest neighbour by Hamming distance of packed 64-bit hashes: (distance, index, pairs)."""
    h = np.ascontiguousarray(hashes, dtype=np.uint64)
    n = len(h)
    best = np.full(n, 65, dtype=np.int64)
    arg = np.full(n, -1, dtype=np.int64)
    pairs: list[tuple[int, int, int]] = []
    if n < 2:
        return best, arg, pairs
    for start in range(0, n, block):
        stop = min(n, start + block)
        dist = np.bitwise_count(h[start:stop, None] ^ h[None, :]).astype(np.int16)
        dist[np.arange(stop - start), np.arange(start, stop)] = 99
        arg[start:stop] = np.argmin(dist, axis=1)
        best[start:stop] = dist[np.arange(stop - start), arg[start:stop]]
        if threshold is not None:
            rows, cols = np.nonzero(dist <= threshold)
            keep = cols > rows + start
            pairs.extend((int(r + start), int(c), int(dist[r, c])) for r, c in zip(rows[keep], cols[keep]))
    return best, arg, pairs


def groups_of(n: int, pairs: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Connected components (size >= 2) of the pair graph, each sorted, largest first."""
    parent = list(range(n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    members: dict[int, list[int]] = {}
    for i in range(n):
        members.setdefault(find(i), []).append(i)
    return sorted((sorted(m) for m in members.values() if len(m) > 1), key=lambda m: (-len(m), m[0]))


def duplicates_check(inputs: AuditInputs, settings=None) -> CheckResult:
    """Duplicate suspicion and groups (see the module docstring)."""
    n = len(inputs)
    block = int(getattr(settings, "block", DEFAULT_BLOCK))
    cos_threshold = float(getattr(settings, "cos_threshold", DEFAULT_COS_THRESHOLD))
    hash_threshold = int(getattr(settings, "hash_threshold", DEFAULT_HASH_THRESHOLD))
    use_hash = bool(getattr(settings, "phash", True))
    scores = nan_scores(n)
    cos = nan_scores(n)
    result = CheckResult("duplicates", scores, METHOD if use_hash else "nearest-neighbour cosine of CLIP embeddings")
    pairs: list[tuple[int, int]] = []
    kinds: dict[tuple[int, int], str] = {}
    ok = inputs.encoded
    encoded = np.flatnonzero(ok)
    if len(encoded) >= 2:
        sim, _, cos_pairs = nearest_cosine(inputs.embeddings[ok], block=block, threshold=cos_threshold)
        cos[encoded] = sim
        for a, b, _ in cos_pairs:
            key = (int(encoded[a]), int(encoded[b]))
            pairs.append(key)
            kinds[key] = "embedding"
    hash_sim = nan_scores(n)
    if use_hash:
        hashes, failed = phash_values(inputs.image_paths)
        for position, reason in failed.items():
            result.failed[inputs.ids[position]] = reason
        good = np.array([i for i in range(n) if i not in failed], dtype=np.int64)
        if len(good) >= 2:
            dist, _, hash_pairs = nearest_hamming(hashes[good], threshold=hash_threshold)
            hash_sim[good] = 1.0 - dist / 64.0
            for a, b, _ in hash_pairs:
                key = (int(good[a]), int(good[b]))
                kinds[key] = "phash" if key not in kinds else "both"
                pairs.append(key)
    from curate.audit.feature import percentile_ranks

    if use_hash:
        both = np.vstack([percentile_ranks(cos), percentile_ranks(hash_sim)])
        finite = np.isfinite(both).any(axis=0)
        scores[finite] = np.nanmax(both[:, finite], axis=0) + 1e-3 * np.nansum(
            np.vstack([cos, hash_sim])[:, finite], axis=0)
    else:
        scores[:] = cos
    groups = groups_of(n, pairs)
    flagged = np.zeros(n, bool)
    listed = []
    for members in groups:
        flagged[members] = True
        classes = sorted({int(inputs.classes[m]) for m in members})
        listed.append({"sample_ids": [inputs.ids[m] for m in members], "classes": classes,
                       "across_classes": len(classes) > 1})
    result.flagged = flagged
    result.detail = {"columns": {"nearest_cosine": cos, "nearest_phash_similarity": hash_sim}, "groups": listed, "cos_threshold": cos_threshold, "hash_threshold": hash_threshold if use_hash else None,
                     "pairs": len(set(pairs)), "pairs_by": {k: sum(1 for v in kinds.values() if v == k)
                                                            for k in ("embedding", "phash", "both")}}
    return result
