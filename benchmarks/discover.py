"""Benchmark: ``curate discover``'s grouping and tests against the slice-discovery loop a user would write.

CounterAnimal's size: 45 classes, about 13,000 photos (290 a class), 512-d background embeddings
(what ViT-B-32 gives), each class drawn from 3-5 background clusters; the reference's correctness
is Bernoulli(0.85), lowered by 40 points on one cluster in every third class (the planted effect).
Both sides get the same embeddings and the same error-aware features (Domino's idea, Eyuboglu
et al. 2022: the embedding plus ``w * (1 - correct)``, w = 1):

- curate: :func:`curate.discover.groups.discover_class` per class (halves, k-means with K by
  silhouette on each half, held-out assignment, matched groups, permutation null with 2,000
  permutations, bootstrap intervals), then Benjamini-Hochberg over all groups;
- the loop: per class, scikit-learn k-means with K by silhouette on all photos, each cluster's
  accuracy against the rest with Fisher's exact test on the same photos (scipy), then BH.

Printed: wall and CPU seconds of each side, their ratio, and what each proposes at FDR 0.1 on the
planted data (true and false discoveries) and on the same data with the effect removed (every
proposal there is false). The embeddings exist already here: the time to make them is one image
encoding pass (``curate evaluate``'s, or the removal images' for ``--background-embedding
removal``), which docs/scaling.md measures. Run:

    .venv/bin/python benchmarks/discover.py [--classes 45] [--per-class 290] [--permutations 2000]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402


def world(classes: int, per_class: int, dim: int, effect: bool, seed: int = 0):
    """Per class: (embeddings, correctness, planted cluster index or -1, cluster of each photo)."""
    rng = np.random.default_rng(seed)
    out = []
    for c in range(classes):
        k = int(rng.integers(3, 6))
        centres = rng.normal(size=(k, dim))
        centres /= np.linalg.norm(centres, axis=1, keepdims=True)
        truth = rng.integers(0, k, per_class)
        x = rng.normal(size=dim) * 0.5 + 0.6 * centres[truth] + rng.normal(size=(per_class, dim)) * 0.02
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        planted = int(rng.integers(0, k)) if (effect and c % 3 == 0) else -1
        p = np.where(truth == planted, 0.45, 0.85)
        out.append((x, (rng.random(per_class) < p).astype(float), planted, truth))
    return out


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def run_curate(data, n_perm: int):
    from curate.discover.groups import GroupSettings, benjamini_hochberg, discover_class

    settings = GroupSettings(error_weight=1.0, n_perm=n_perm, n_boot=200)
    found = [discover_class(x, y, settings, key=str(c)) for c, (x, y, _, _) in enumerate(data)]
    groups = [(c, g) for c, f in enumerate(found) for g in f.groups]
    q = benjamini_hochberg([g.p_value for _, g in groups])
    return [(c, set(g.members)) for (c, g), qv in zip(groups, q) if qv < 0.1]


def run_loop(data):
    from scipy.stats import fisher_exact
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    from curate.discover.groups import benjamini_hochberg

    tests = []
    for c, (x, y, _, _) in enumerate(data):
        features = np.hstack([x - x.mean(axis=0), (1.0 - y)[:, None]])
        best = None
        for k in range(2, 7):
            labels = KMeans(n_clusters=k, n_init=4, random_state=0).fit(features).labels_
            score = silhouette_score(features, labels, metric="cosine")
            if best is None or score > best[0]:
                best = (score, labels)
        labels = best[1]
        for j in np.unique(labels):
            inside = labels == j
            table = [[int(y[inside].sum()), int((1 - y[inside]).sum())],
                     [int(y[~inside].sum()), int((1 - y[~inside]).sum())]]
            tests.append((c, set(np.flatnonzero(inside)), fisher_exact(table)[1]))
    q = benjamini_hochberg([p for _, _, p in tests])
    return [(c, members) for (c, members, _), qv in zip(tests, q) if qv < 0.1]


def score(proposed, data) -> tuple[int, int]:
    """(planted clusters found, false proposals). A planted cluster is found when a proposal of its
    class is mostly its photos; a proposal is false when its class has no planted effect (in a
    class with one, the other clusters do differ from a rest that holds the planted cluster)."""
    found = {c for c, members in proposed
             if data[c][2] >= 0 and np.mean(data[c][3][sorted(members)] == data[c][2]) > 0.5}
    return len(found), sum(1 for c, _ in proposed if data[c][2] < 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=45)
    parser.add_argument("--per-class", type=int, default=290)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--permutations", type=int, default=2000)
    args = parser.parse_args()
    planted = world(args.classes, args.per_class, args.dim, effect=True)
    null = world(args.classes, args.per_class, args.dim, effect=False)
    n_planted = sum(1 for _, _, p, _ in planted if p >= 0)
    print(f"{args.classes} classes x {args.per_class} photos = {args.classes * args.per_class}, {args.dim}-d; "
          f"{n_planted} planted effects (-40 points)")
    rows = []
    for name, fn in (("curate discover", lambda d: run_curate(d, args.permutations)), ("k-means + Fisher loop", run_loop)):
        w0, c0 = clock()
        found = fn(planted)
        w1, c1 = clock()
        false_null = len(fn(null))
        true, false = score(found, planted)
        rows.append((name, w1 - w0, c1 - c0, true, false, false_null))
        print(f"{name:24s} {w1 - w0:7.1f} s wall {c1 - c0:7.1f} s CPU | planted: {len(found)} proposed, {true} of "
              f"{n_planted} planted clusters found, {false} in classes without an effect (false) | null: "
              f"{false_null} proposed (all false)")
    (_, cw, cc, *_), (_, lw, lc, *_) = rows
    print(f"time, curate / loop: {cw / lw:.2f}x wall, {cc / lc:.2f}x CPU (curate fits two halves and runs "
          f"{args.permutations} permutations; the loop's speed comes from testing on the photos it grouped)")


if __name__ == "__main__":
    main()
