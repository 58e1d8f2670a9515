"""Benchmark: the audit's heavy parts on 10k and 100k synthetic embeddings (issue 18).

Random unit vectors (``--dim``, default 512 as ViT-B/32) with 1% planted near copies; for each
size:

- duplicate search: curate's blockwise nearest neighbour (``curate.audit.duplicates.nearest_cosine``,
  float32, ``block x N`` at a time) against scikit-learn's ``NearestNeighbors(metric="cosine",
  algorithm="brute")`` (what FiftyOne Brain's near-duplicate search uses), with the agreement of
  the neighbours found and the peak memory of each (tracemalloc: numpy's allocations);
- perceptual-hash search: ``nearest_hamming`` on random 64-bit hashes (blockwise ``bitwise_count``);
- cleanlab: ``get_label_quality_scores`` + ``find_label_issues`` on random 45-class
  probabilities, and ``OutOfDistribution.fit_score`` on the embeddings (cleanlab's own kNN).

The peer for the duplicate search is skipped above ``--peer-max`` rows (sklearn's brute force
at 100k takes minutes on two cores); ratios are printed where both ran.

    .venv/bin/python benchmarks/audit.py [--sizes 10000,100000] [--dim 512] [--peer-max 10000]
"""
from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np


def _timed(fn):
    tracemalloc.start()
    t = time.perf_counter()
    value = fn()
    seconds = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return value, seconds, peak / 2**20


def embeddings(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(n, dim)).astype(np.float32)
    copies = rng.choice(n, size=n // 100, replace=False)
    e[copies[: len(copies) // 2]] = e[copies[len(copies) // 2:]] + 0.01 * rng.normal(size=(len(copies) // 2, dim))
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--peer-max", type=int, default=10000)
    parser.add_argument("--ood-max", type=int, default=10000)
    args = parser.parse_args()
    for n in (int(s) for s in args.sizes.split(",")):
        bench(n, args)


def bench(n: int, args: argparse.Namespace) -> None:
    from curate.audit.duplicates import nearest_cosine, nearest_hamming

    e = embeddings(n, args.dim)
    print(f"\n== {n} embeddings, dim {args.dim} ==")
    (sim, arg, _), t_ours, m_ours = _timed(lambda: nearest_cosine(e, block=args.block))
    print(f"duplicates (cosine NN)  curate blockwise: {t_ours:7.2f} s  peak {m_ours:8.0f} MiB  "
          f"(N x N float32 would be {n * n * 4 / 2**20:,.0f} MiB)")
    if n <= args.peer_max:
        from sklearn.neighbors import NearestNeighbors

        def peer():
            nn = NearestNeighbors(n_neighbors=2, metric="cosine", algorithm="brute", n_jobs=1).fit(e)
            return nn.kneighbors(e)

        (dist, idx), t_peer, m_peer = _timed(peer)
        other = np.where(idx[:, 0] == np.arange(n), idx[:, 1], idx[:, 0])
        agree = float((other == arg).mean())
        print(f"                        sklearn brute   : {t_peer:7.2f} s  peak {m_peer:8.0f} MiB  "
              f"-> curate is {t_peer / t_ours:.1f}x faster, {m_peer / max(m_ours, 1):.1f}x less memory; "
              f"same neighbour for {100 * agree:.2f}% of rows")
    else:
        print(f"                        sklearn brute   : skipped (n > --peer-max {args.peer_max})")
    hashes = np.random.default_rng(1).integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64)
    _, t_hash, m_hash = _timed(lambda: nearest_hamming(hashes))
    print(f"duplicates (phash NN)   curate blockwise: {t_hash:7.2f} s  peak {m_hash:8.0f} MiB")
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    rng = np.random.default_rng(2)
    probs = rng.dirichlet(np.full(45, 0.2), size=n)
    labels = probs.argmax(axis=1)
    labels[: n // 20] = rng.integers(0, 45, size=n // 20)
    _, t_q, _ = _timed(lambda: get_label_quality_scores(labels, probs))
    _, t_f, _ = _timed(lambda: find_label_issues(labels, probs, n_jobs=1))
    print(f"label noise (cleanlab)  quality scores {t_q:6.2f} s, find_label_issues {t_f:6.2f} s (45 classes)")
    if n <= args.ood_max:
        from cleanlab.outlier import OutOfDistribution

        _, t_o, m_o = _timed(lambda: OutOfDistribution(params={"k": 10}).fit_score(features=e, verbose=False))
        print(f"outliers (cleanlab OOD) fit_score k=10: {t_o:7.2f} s  peak {m_o:8.0f} MiB")


if __name__ == "__main__":
    main()
