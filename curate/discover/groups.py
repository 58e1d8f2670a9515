"""Background groups within a class, found on one half and scored on the other (docs/design.md#discover).

Inputs per class are plain arrays, so every step is testable by hand: ``X`` (N, D) background
embeddings (L2-normalised; how they are made is :mod:`curate.discover.embed`) and ``y`` (N,)
correctness of the reference model(s) in [0, 1] (1/0 for one model, the mean over models for
several, as the split's cells are).

The procedure (one class; :func:`discover_class`):

1. **Halves.** The N photos are cut into two halves H0, H1 at random (seeded by the class).
   A class with fewer than ``2 * min_half`` photos gets no groups (reason ``too_few_photos``).
2. **Groups, fitted on one half.** On each half separately, k-means (scikit-learn, cosine geometry:
   the embeddings are centred on the half's mean and L2-normalised again, so k-means' Euclidean
   distance ranks as cosine) for every K in ``2..max_groups`` (limited so a group can hold
   ``min_group`` photos of the half); K is the one with the highest mean silhouette (cosine), and
   when no K reaches ``min_silhouette`` the half has one group, i.e. no structure
   (reason ``no_structure``). Grouping never reads correctness unless ``error_weight > 0``:
   then each photo's vector gets one more coordinate ``error_weight * (1 - y)`` (Domino's
   error-aware mixture, Eyuboglu et al. 2022, reduced to k-means), which is exactly why step 3
   must score on the other half.
3. **Held-out assignment.** Every photo is assigned to a group by the centroids fitted on the
   *other* half, using its embedding only (never its correctness). So a photo's group never
   depends on whether the model got it right.
4. **One group set.** The two fits are matched: all N photos are assigned by both fits, and the
   groups are paired by the Hungarian assignment maximising overlap (scipy); a pair whose
   Jaccard overlap is at least ``min_overlap`` is one discovered group (it was found on both
   halves); a group found on one half only is reported as unstable and proposes nothing. A
   photo belongs to the discovered group its held-out assignment (step 3) falls in.
5. **Scores, held out.** For a group g: ``acc(g)`` is the mean of ``y`` over its members,
   ``acc(rest)`` over the class's other photos (members of other groups and photos of unstable
   groups alike), ``gap = acc(rest) - acc(g)`` in points (positive: the model does worse on g).
   Intervals: percentile bootstrap (``n_boot`` resamples of the class's photos, stratified by
   group membership), only for a group of at least ``min_boot`` photos (10) with at least as
   many outside it: resampling fewer photos cannot show their uncertainty (one photo gives a
   zero-width interval however its p-value reads); smaller groups get NaN intervals.
6. **Permutation null.** Under "this background has nothing to do with correctness", the
   held-out ``y`` are exchangeable within each half given the assignments (the assignments of
   half h were made from the other half's fit and the photos' embeddings only). So ``y`` is
   permuted within each half, ``n_perm`` times, the assignments kept fixed, and the two-sided
   p-value of group g is ``(1 + #{|gap_perm| >= |gap|}) / (1 + n_perm)``. (With
   ``error_weight > 0`` the other half's fit read its own ``y``, which the permutation keeps, so
   the test is still valid.)
7. **False discoveries.** :func:`benjamini_hochberg` over every stable group of every class
   gives q-values; a group is *significant* when ``q < fdr`` (default 0.1), which controls the
   expected share of false discoveries among the proposed groups at ``fdr`` (Benjamini and
   Hochberg 1995; the permutation p-values of groups of one class are positively dependent at
   most, where BH stays valid).

What a group can show: that in this data, the reference model's accuracy differs on photos
whose background looks like g's. Not why: the interventions (``curate intervene``) test causes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["GroupSettings", "FoundGroup", "ClassDiscovery", "discover_class", "benjamini_hochberg",
           "adjusted_rand_index", "class_seed", "REASONS", "MIN_BOOT"]

#: The fewest photos a group (and the rest of its class) needs for bootstrap intervals.
MIN_BOOT = 10

#: Why a class proposes no group.
REASONS = {
    "too_few_photos": "fewer photos than two halves of min_half each",
    "no_structure": "no number of groups reached the minimum silhouette on both halves",
    "no_stable_group": "the groups of the two halves did not match (none found on both halves)",
    "no_trusted_mask": "removal needs a trusted object mask and too few photos have one",
}


@dataclass(frozen=True)
class GroupSettings:
    """How groups are found and tested (``curate discover`` options map one to one)."""

    max_groups: int = 6  # K is chosen in 2..max_groups
    min_half: int = 10  # photos per half below which a class gets no groups
    min_group: int = 4  # photos of a half a group must be able to hold (limits K)
    min_silhouette: float = 0.05  # below this mean silhouette on a half: one group (no structure)
    min_overlap: float = 0.5  # Jaccard overlap for two halves' groups to be one group
    error_weight: float = 0.0  # > 0: error-aware grouping (the extra coordinate of step 2)
    n_perm: int = 2000
    n_boot: int = 1000
    min_boot: int = MIN_BOOT  # fewer photos in a group (or outside it): no bootstrap interval (NaN)
    fdr: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_groups < 2:
            raise ValueError(f"max_groups must be >= 2, got {self.max_groups}")
        if self.min_half < 2 or self.min_group < 1:
            raise ValueError("min_half must be >= 2 and min_group >= 1")
        if not 0.0 < self.min_overlap <= 1.0:
            raise ValueError(f"min_overlap must be in (0, 1], got {self.min_overlap}")
        if not 0.0 < self.fdr < 1.0:
            raise ValueError(f"fdr must be in (0, 1), got {self.fdr}")
        if self.n_perm < 1 or self.n_boot < 1 or self.min_boot < 1:
            raise ValueError("n_perm, n_boot and min_boot must be >= 1")
        if self.error_weight < 0:
            raise ValueError(f"error_weight must be >= 0, got {self.error_weight}")


@dataclass
class FoundGroup:
    """One discovered group of a class (found on both halves), scored held out."""

    index: int  # within the class, 0.. in order of size (largest first)
    members: list[int]  # positions in the class's arrays (held-out assignments)
    accuracy: float  # acc(g), fraction
    accuracy_low: float
    accuracy_high: float
    rest_accuracy: float
    gap: float  # acc(rest) - acc(g), points
    gap_low: float
    gap_high: float
    p_value: float
    overlap: float  # Jaccard of the two halves' versions of the group
    centroid: np.ndarray  # L2-normalised mean embedding of the members
    q_value: float = float("nan")  # set by benjamini_hochberg over all classes
    significant: bool = False


@dataclass
class ClassDiscovery:
    """What discovery found in one class."""

    n: int
    k_halves: tuple[int, int] = (0, 0)
    silhouettes: tuple[float, float] = (float("nan"), float("nan"))
    groups: list[FoundGroup] = field(default_factory=list)
    unstable: int = 0  # groups found on one half only
    unassigned: int = 0  # photos whose held-out group is unstable
    reason: str | None = None  # a key of REASONS when no group was proposed
    assignment: np.ndarray | None = None  # (n,) discovered group index per photo, -1 = none


def class_seed(seed: int, key: str) -> np.random.Generator:
    """A class's own random stream: the same seed and class give the same halves and groups,
    whichever classes run beside it."""
    digest = int.from_bytes(__import__("hashlib").sha256(f"{seed}:{key}".encode()).digest()[:8], "little")
    return np.random.default_rng(digest)


def _normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def _geometry(x: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Centred on the fitting half's mean and normalised: Euclidean k-means ranks as cosine."""
    return _normalise(x - centre)


@dataclass
class _Fit:
    k: int
    silhouette: float
    centre: np.ndarray  # the half's mean (embedding space)
    centroids: np.ndarray  # (k, D) in the centred, normalised geometry (embedding coordinates only)

    def assign(self, x: np.ndarray) -> np.ndarray:
        """Nearest centroid by the embedding alone (cosine in the fitted geometry)."""
        if self.k == 1:
            return np.zeros(len(x), dtype=np.int64)
        z = _geometry(x, self.centre)
        return np.argmax(z @ _normalise(self.centroids).T, axis=1)


def _fit_half(x: np.ndarray, y: np.ndarray, settings: GroupSettings, seed: int) -> _Fit:
    """k-means with K by the highest mean cosine silhouette (step 2 of the module docstring)."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    centre = x.mean(axis=0)
    z = _geometry(x, centre)
    features = np.hstack([z, settings.error_weight * (1.0 - y)[:, None]]) if settings.error_weight > 0 else z
    best = _Fit(1, float("nan"), centre, np.zeros((1, x.shape[1])))
    k_max = min(settings.max_groups, len(x) // settings.min_group)
    for k in range(2, k_max + 1):
        km = KMeans(n_clusters=k, n_init=4, random_state=seed, max_iter=200).fit(features)
        labels = km.labels_
        if len(np.unique(labels)) < 2:
            continue
        score = float(silhouette_score(features, labels, metric="cosine"))
        if score >= settings.min_silhouette and (best.k == 1 or score > best.silhouette + 1e-12):
            centroids = np.stack([z[labels == j].mean(axis=0) for j in range(k)])
            best = _Fit(k, score, centre, centroids)
    return best


def _match(a: np.ndarray, b: np.ndarray, ka: int, kb: int, min_overlap: float) -> list[tuple[int, int, float]]:
    """Pairs (group of fit a, group of fit b, Jaccard) matched by the Hungarian assignment on the
    overlap counts of the two assignments of all photos; pairs below ``min_overlap`` are dropped."""
    from scipy.optimize import linear_sum_assignment

    overlap = np.zeros((ka, kb))
    np.add.at(overlap, (a, b), 1)
    rows, cols = linear_sum_assignment(-overlap)
    sizes_a, sizes_b = np.bincount(a, minlength=ka), np.bincount(b, minlength=kb)
    pairs = []
    for i, j in zip(rows, cols):
        union = sizes_a[i] + sizes_b[j] - overlap[i, j]
        jaccard = float(overlap[i, j] / union) if union else 0.0
        if jaccard >= min_overlap:
            pairs.append((int(i), int(j), jaccard))
    return pairs


def _gaps(y: np.ndarray, member: np.ndarray) -> np.ndarray:
    """``acc(rest) - acc(g)`` in points for each row of ``member`` (G, N) booleans and each row of
    ``y`` (P, N): returns (P, G); NaN where a side is empty."""
    y = np.atleast_2d(y)
    m = member.astype(np.float64)
    n_in = m.sum(axis=1)
    n_out = m.shape[1] - n_in
    s_in = y @ m.T
    s_all = y.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100.0 * ((s_all - s_in) / n_out - s_in / n_in)


def discover_class(x: np.ndarray, y: np.ndarray, settings: GroupSettings, key: str) -> ClassDiscovery:
    """Groups of one class (module docstring, steps 1-6); ``key`` seeds the class's stream."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.shape != (len(x),):
        raise ValueError(f"embeddings must be (N, D) and correctness (N,); got {x.shape} and {y.shape}")
    if not np.isfinite(x).all() or not np.isfinite(y).all():
        raise ValueError("embeddings and correctness must be finite")
    n = len(x)
    result = ClassDiscovery(n=n, assignment=np.full(n, -1, dtype=np.int64))
    if n < 2 * settings.min_half:
        result.reason = "too_few_photos"
        return result
    rng = class_seed(settings.seed, key)
    order = rng.permutation(n)
    halves = [np.sort(order[: n // 2]), np.sort(order[n // 2:])]
    fit_seed = int(rng.integers(2**31 - 1))
    fits = [_fit_half(x[h], y[h], settings, fit_seed) for h in halves]
    result.k_halves = (fits[0].k, fits[1].k)
    result.silhouettes = (fits[0].silhouette, fits[1].silhouette)
    if fits[0].k == 1 or fits[1].k == 1:
        result.reason = "no_structure"
        return result
    by_fit = [fits[0].assign(x), fits[1].assign(x)]  # every photo by each fit
    pairs = _match(by_fit[0], by_fit[1], fits[0].k, fits[1].k, settings.min_overlap)
    result.unstable = fits[0].k + fits[1].k - 2 * len(pairs)
    if not pairs:
        result.reason = "no_stable_group"
        return result
    # held out: half 1 by fit 0, half 0 by fit 1; expressed as discovered-group numbers
    held = np.full(n, -1, dtype=np.int64)
    of_a = {a: g for g, (a, _, _) in enumerate(pairs)}
    of_b = {b: g for g, (_, b, _) in enumerate(pairs)}
    held[halves[1]] = [of_a.get(int(a), -1) for a in by_fit[0][halves[1]]]
    held[halves[0]] = [of_b.get(int(b), -1) for b in by_fit[1][halves[0]]]
    result.unassigned = int((held < 0).sum())
    member = np.stack([held == g for g in range(len(pairs))])
    keep = member.sum(axis=1) > 0
    observed = _gaps(y, member)[0]
    # permutation null: y shuffled within each half, assignments fixed
    perm = np.tile(y, (settings.n_perm, 1))
    for h in halves:
        idx = np.argsort(rng.random((settings.n_perm, len(h))), axis=1)
        perm[:, h] = y[h][idx]
    null = _gaps(perm, member)
    exceed = (np.abs(null) >= np.abs(observed)[None, :] - 1e-12).sum(axis=0)
    p_values = (1.0 + exceed) / (1.0 + settings.n_perm)
    # bootstrap, stratified: members and non-members resampled separately per group
    boot_gap = np.empty((settings.n_boot, len(pairs)))
    boot_acc = np.empty((settings.n_boot, len(pairs)))
    for g in range(len(pairs)):
        inside, outside = np.flatnonzero(member[g]), np.flatnonzero(~member[g])
        if not len(inside) or not len(outside):
            boot_gap[:, g] = boot_acc[:, g] = np.nan
            continue
        a_in = y[inside][rng.integers(0, len(inside), (settings.n_boot, len(inside)))].mean(axis=1)
        a_out = y[outside][rng.integers(0, len(outside), (settings.n_boot, len(outside)))].mean(axis=1)
        boot_acc[:, g], boot_gap[:, g] = a_in, 100.0 * (a_out - a_in)
        if min(len(inside), len(outside)) < settings.min_boot:  # too few to resample (step 5); drawn all the
            boot_gap[:, g] = boot_acc[:, g] = np.nan  # same, so the other groups' intervals do not move
    z_all = _normalise(x)
    groups = []
    for g, (_, _, jaccard) in enumerate(pairs):
        if not keep[g]:
            continue
        inside = np.flatnonzero(member[g])
        outside = np.flatnonzero(~member[g])
        acc = float(y[inside].mean())
        rest = float(y[outside].mean()) if len(outside) else float("nan")
        sampled = bool(np.isfinite(boot_acc[:, g]).all())
        lo, hi = np.percentile(boot_acc[:, g], [2.5, 97.5]) if sampled else (np.nan, np.nan)
        glo, ghi = np.percentile(boot_gap[:, g], [2.5, 97.5]) if sampled else (np.nan, np.nan)
        groups.append(FoundGroup(index=g, members=inside.tolist(), accuracy=acc, accuracy_low=float(lo),
                                 accuracy_high=float(hi), rest_accuracy=rest, gap=float(observed[g]),
                                 gap_low=float(glo), gap_high=float(ghi), p_value=float(p_values[g]),
                                 overlap=jaccard, centroid=_normalise(z_all[inside].mean(axis=0)[None])[0]))
    groups.sort(key=lambda grp: (-len(grp.members), grp.index))
    renumber = {grp.index: i for i, grp in enumerate(groups)}
    for grp in groups:
        result.assignment[grp.members] = renumber[grp.index]
        grp.index = renumber[grp.index]
    result.groups = groups
    return result


def benjamini_hochberg(p_values: Sequence[float]) -> np.ndarray:
    """BH q-values (Benjamini and Hochberg 1995): ``q_(i) = min_{j >= i} p_(j) * m / j`` over the
    sorted p-values, capped at 1; a hypothesis with ``q < alpha`` is rejected at FDR ``alpha``."""
    p = np.asarray(p_values, dtype=np.float64)
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p)
    scaled = p[order] * m / np.arange(1, m + 1)
    q_sorted = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    q = np.empty(m)
    q[order] = q_sorted
    return q


def adjusted_rand_index(truth: Sequence[object], found: Sequence[object]) -> float:
    """Hubert and Arabie's adjusted Rand index of two labellings (1 = identical partitions, about 0
    = chance; scikit-learn's implementation)."""
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(list(map(str, truth)), list(map(str, found))))
