"""Spuriousity of saliency maps against object masks: SSS (papers/004) and RMA (papers/000).

Definitions (docs/design.md "Definitions"; the papers are the authority):

- **RMA**, Relevance Mass Accuracy (papers/000, eq. 1; Arras et al. 2022)::

      RMA(H, M) = sum(H * M) / sum(H)

  the share of the saliency mass ``H`` that falls inside the binary object mask ``M``.
  Higher is better (more of the explanation lies on the object).

- **SSS**, Semantic Spuriousity Score (papers/004 §3.1, eq. 1-2), with ``R`` the relevant
  region (the mask) and ``Omega`` the image::

      SSS' = (sum_{x in R} H(x) - sum_{x in Omega \\ R} H(x)) / sum_{x in Omega} H(x)   in [-1, 1]
      SSS  = 1 - (SSS' + 1) / 2                                                          in [0, 1]

  Lower is better (less mass on semantically irrelevant pixels). Since
  ``SSS' = 2 RMA - 1``, without thresholding **SSS = 1 - RMA** exactly.

- **Thresholding** (papers/004 App. C, eq. 3 and §3.2): before scoring, the map becomes
  ``H_tau(x) = H(x)`` (soft) or ``1`` (hard) where ``H(x) >= tau``, and ``0`` elsewhere.
  ``tau`` is in the units of the map; the maps of :mod:`curate.saliency` are min-max
  normalised to [0, 1] like pytorch-grad-cam's (which SemScore thresholds), so ``tau`` in
  [0, 1] reads as "fraction of the map's range". Both scores use the same thresholded map.

- **Undefined cases** are NaN, never a silent 0 or a dropped row; each NaN has a reason
  (:data:`NAN_REASONS`), which :func:`nan_reasons` lists per map and ``nan_counts=`` (a
  :class:`collections.Counter`) tallies:

  ``nonfinite_map`` (NaN/inf in the map), ``negative_map`` (a negative value: both formulas
  assume a non-negative mass; clip or take ``abs`` first), ``empty_mask`` (no relevant pixel),
  ``zero_map`` (the map sums to 0), ``zero_after_threshold`` (no pixel reaches ``tau``).

- **Aggregation** (papers/004 §3.2): per prediction (one map per image and target), per image
  (the mean of that image's predictions) and per class (the mean of the predictions whose
  target is that class); curate adds the split by group (easy/hard, papers/003 §2.1) and by
  correct/wrong prediction (:func:`aggregate_scores`). NaN predictions are excluded from the
  means and counted next to them (``n_nan``).

Inputs are numpy arrays or torch tensors shaped ``(H, W)`` or ``(N, H, W)``; a single mask
``(H, W)`` broadcasts over ``N`` maps. Outputs: a float for one map, else an array of ``N``
(numpy in, numpy out; torch in, a tensor on the input's device out, so GPU pipelines reduce
on the device). Masks are binary (bool or 0/1); a mask holding other integers (instance ids,
0/255 PNGs) is read as "non-zero = relevant" with a one-time warning.
"""
from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from curate.metrics.info import MetricInfo

logger = logging.getLogger(__name__)

#: Why a score is NaN, in the order they are checked (the first that applies is reported).
NAN_REASONS: tuple[str, ...] = ("nonfinite_map", "negative_map", "empty_mask", "zero_map", "zero_after_threshold")
#: Threshold modes of papers/004 App. C.
THRESHOLD_MODES: tuple[str, ...] = ("soft", "hard")

#: The Semantic Spuriousity Score: lower = less saliency mass off the object.
SSS_INFO = MetricInfo(
    name="SSS",
    formula="SSS = 1 - (SSS' + 1) / 2, SSS' = (sum_R H - sum_{not R} H) / sum H (H thresholded; = 1 - RMA without a "
            "threshold)",
    higher_is_better=False,
    paper="papers/004 §3.1 eq. 1-2 (thresholding App. C)",
    nan_reasons=NAN_REASONS,
)
#: Relevance Mass Accuracy: higher = more saliency mass on the object.
RMA_INFO = MetricInfo(
    name="RMA",
    formula="RMA = sum(H * M) / sum(H)",
    higher_is_better=True,
    paper="papers/000 eq. 1 (Arras et al. 2022)",
    nan_reasons=NAN_REASONS,
)

ArrayLike = np.ndarray | torch.Tensor
_warned_instance_ids = False


# ------------------------------------------------------------------------------------ inputs
def _as_tensor(value: Any, name: str) -> tuple[torch.Tensor, bool]:
    """``value`` as a tensor and whether it came in as numpy (or a list)."""
    if isinstance(value, torch.Tensor):
        return value, False
    if isinstance(value, (np.ndarray, list, tuple)) or np.isscalar(value):
        array = np.asarray(value)
        if array.dtype == object:
            raise TypeError(f"{name} must be a numeric array, got dtype object")
        return torch.from_numpy(np.ascontiguousarray(array)), True
    raise TypeError(f"{name} must be a numpy array or a torch tensor, not {type(value).__name__}")


def _work_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


def _prepare(saliency: ArrayLike, mask: ArrayLike) -> tuple[torch.Tensor, torch.Tensor, bool, bool]:
    """Validate shapes; return (maps (N,H,W) float, masks (N|1,H,W) bool, single, numpy_in)."""
    global _warned_instance_ids
    h, numpy_in = _as_tensor(saliency, "saliency")
    m, _ = _as_tensor(mask, "mask")
    if h.ndim not in (2, 3):
        raise ValueError(f"saliency must be (H, W) or (N, H, W), got shape {tuple(h.shape)}")
    if m.ndim not in (2, 3):
        raise ValueError(f"mask must be (H, W) or (N, H, W), got shape {tuple(m.shape)}")
    single = h.ndim == 2
    if single and m.ndim == 3 and m.shape[0] != 1:
        raise ValueError(f"one saliency map {tuple(h.shape)} but {m.shape[0]} masks {tuple(m.shape)}")
    h3 = h.unsqueeze(0) if h.ndim == 2 else h
    m3 = m.unsqueeze(0) if m.ndim == 2 else m
    if tuple(h3.shape[-2:]) != tuple(m3.shape[-2:]):
        raise ValueError(
            f"saliency map is {tuple(h3.shape[-2:])} (H, W) but the mask is {tuple(m3.shape[-2:])}: they must be "
            "aligned pixel for pixel; carry the mask through the same resize/crop as the image "
            "(curate.saliency.mask_transform_for(model.preprocess))"
        )
    if m3.shape[0] not in (1, h3.shape[0]):
        raise ValueError(f"{h3.shape[0]} saliency maps but {m3.shape[0]} masks; give one mask or one per map")
    if h3.dtype == torch.bool or not (h3.is_floating_point() or h3.dtype in (torch.int8, torch.int16, torch.int32,
                                                                              torch.int64, torch.uint8)):
        raise TypeError(f"saliency must hold real numbers, got {h3.dtype}")
    m3 = m3.to(h3.device)
    if m3.dtype != torch.bool:
        if m3.is_floating_point():
            finite = torch.isfinite(m3)
            if not bool(finite.all()) or not bool((m3 == torch.round(m3)).all()):
                raise ValueError("mask holds non-integer values; pass a binary mask (bool or 0/1), not a soft mask")
        if bool((m3 < 0).any()):
            raise ValueError("mask holds negative values; pass a binary mask (bool or 0/1)")
        if bool((m3 > 1).any()) and not _warned_instance_ids:
            _warned_instance_ids = True
            logger.warning(
                "mask holds values other than 0/1 (instance ids or a 0/255 image): every non-zero pixel counts "
                "as relevant (the union of the instances, papers/004 §3.1)"
            )
        m3 = m3 != 0
    return h3.to(_work_dtype(h3.device)), m3, single, numpy_in


def threshold_map(saliency: ArrayLike, threshold: float | None, mode: str = "soft") -> ArrayLike:
    """Apply papers/004 App. C eq. 3: ``H(x)`` (soft) or ``1`` (hard) where ``H(x) >= tau``, else 0.

    ``threshold=None`` returns the map unchanged. Works on numpy or torch, any shape.
    """
    if mode not in THRESHOLD_MODES:
        raise ValueError(f"threshold mode {mode!r} is not one of {', '.join(THRESHOLD_MODES)}")
    if threshold is None:
        return saliency
    tau = float(threshold)
    if not math.isfinite(tau):
        raise ValueError(f"threshold must be a finite number, got {threshold!r}")
    if isinstance(saliency, torch.Tensor):
        keep = saliency >= tau
        return keep.to(saliency.dtype) if mode == "hard" else torch.where(keep, saliency, torch.zeros_like(saliency))
    array = np.asarray(saliency)
    keep = array >= tau
    return keep.astype(array.dtype if np.issubdtype(array.dtype, np.floating) else np.float64) if mode == "hard" \
        else np.where(keep, array, 0)


# ------------------------------------------------------------------------------------ scores
@dataclass
class SpuriousityScores:
    """SSS, RMA and the NaN reason of each of N maps (torch tensors, on the maps' device).

    Attributes:
        sss: ``(N,)`` float, NaN where undefined.
        rma: ``(N,)`` float, NaN where undefined.
        inside: ``(N,)`` mass in the mask (after thresholding).
        total: ``(N,)`` total mass (after thresholding).
        reasons: ``(N,)`` int codes: -1 = defined, else an index into :data:`NAN_REASONS`.
    """

    sss: torch.Tensor
    rma: torch.Tensor
    inside: torch.Tensor
    total: torch.Tensor
    reasons: torch.Tensor

    def reason_names(self) -> list[str | None]:
        """The NaN reason of each map (None where the scores are defined)."""
        return [None if int(r) < 0 else NAN_REASONS[int(r)] for r in self.reasons.tolist()]

    def nan_counts(self) -> dict[str, int]:
        """``{reason: count}`` over the maps (reasons with a zero count left out)."""
        return dict(Counter(r for r in self.reason_names() if r is not None))


def spuriousity_scores(
    saliency: ArrayLike, mask: ArrayLike, threshold: float | None = None, mode: str = "soft"
) -> SpuriousityScores:
    """Compute SSS and RMA together (one pass), with the NaN reason of each map.

    Args:
        saliency: ``(H, W)`` or ``(N, H, W)`` non-negative maps (numpy or torch).
        mask: ``(H, W)`` (broadcast) or ``(N, H, W)`` binary masks aligned with the maps.
        threshold: ``tau`` of papers/004 App. C, or None for no thresholding.
        mode: ``"soft"`` (keep ``H`` where ``H >= tau``) or ``"hard"`` (set it to 1 there).

    Returns:
        :class:`SpuriousityScores` (tensors of N, on the maps' device).

    Formulas: ``RMA = sum(H*M)/sum(H)`` (papers/000 eq. 1); ``SSS = 1 - (SSS'+1)/2`` with
    ``SSS' = (sum_R H - sum_{not R} H)/sum H`` (papers/004 eq. 1-2), on the thresholded map.
    """
    if mode not in THRESHOLD_MODES:
        raise ValueError(f"threshold mode {mode!r} is not one of {', '.join(THRESHOLD_MODES)}")
    h, m, _, _ = _prepare(saliency, mask)
    n = h.shape[0]
    flat = h.reshape(n, -1)
    mflat = m.reshape(m.shape[0], -1).expand(n, -1)
    finite = torch.isfinite(flat).all(dim=1)
    safe = torch.where(torch.isfinite(flat), flat, torch.zeros_like(flat))
    negative = (safe < 0).any(dim=1)
    empty = ~mflat.any(dim=1)
    raw_total = safe.sum(dim=1)
    hm = threshold_map(safe, threshold, mode)
    assert isinstance(hm, torch.Tensor)
    inside = (hm * mflat).sum(dim=1)
    total = hm.sum(dim=1)
    outside = total - inside
    reasons = torch.full((n,), -1, dtype=torch.int64, device=h.device)
    # later assignments have lower priority, so assign in reverse order of NAN_REASONS
    for code, bad in reversed(list(enumerate(
            (~finite, negative, empty, raw_total <= 0, total <= 0)))):
        reasons = torch.where(bad, torch.full_like(reasons, code), reasons)
    defined = reasons < 0
    denom = torch.where(defined, total, torch.ones_like(total))
    sss_prime = (inside - outside) / denom
    nan = torch.full_like(total, float("nan"))
    sss_value = torch.where(defined, 1.0 - (sss_prime + 1.0) / 2.0, nan).clamp(0.0, 1.0)
    rma_value = torch.where(defined, inside / denom, nan).clamp(0.0, 1.0)
    return SpuriousityScores(sss=sss_value, rma=rma_value, inside=inside, total=total, reasons=reasons)


def _finish(values: torch.Tensor, saliency: ArrayLike) -> float | ArrayLike:
    single = (saliency.ndim if hasattr(saliency, "ndim") else np.asarray(saliency).ndim) == 2
    if single:
        return float(values[0])
    if isinstance(saliency, torch.Tensor):
        return values.to(saliency.dtype if saliency.is_floating_point() else torch.float32)
    return values.cpu().numpy()


def _count(scores: SpuriousityScores, nan_counts: Counter | None) -> None:
    if nan_counts is not None:
        nan_counts.update(scores.nan_counts())


def sss(
    saliency: ArrayLike,
    mask: ArrayLike,
    threshold: float | None = None,
    mode: str = "soft",
    *,
    nan_counts: Counter | None = None,
) -> float | ArrayLike:
    """Semantic Spuriousity Score (papers/004 §3.1 eq. 1-2; thresholding App. C). Lower is better.

    ``SSS' = (sum_{x in R} H(x) - sum_{x notin R} H(x)) / sum_x H(x)``, ``SSS = 1 - (SSS' + 1)/2``,
    where ``R`` is the mask and ``H`` the map after optional thresholding (``H(x)`` (soft) or 1
    (hard) where ``H(x) >= threshold``, else 0). Without a threshold ``SSS = 1 - RMA``.

    Args:
        saliency: ``(H, W)`` or ``(N, H, W)`` non-negative map(s), numpy or torch.
        mask: binary ``(H, W)`` or ``(N, H, W)`` mask(s) aligned with the map(s).
        threshold: ``tau`` or None (no thresholding).
        mode: ``"soft"`` or ``"hard"``.
        nan_counts: a :class:`collections.Counter` that receives ``{reason: count}`` of NaNs.

    Returns:
        A float for one map, else an array of N (numpy for numpy input, a tensor on the input's
        device for torch input). NaN for an empty mask, an all-zero map (before or after
        thresholding), a map with NaN/inf or negative values (see :data:`NAN_REASONS`).
    """
    scores = spuriousity_scores(saliency, mask, threshold, mode)
    _count(scores, nan_counts)
    return _finish(scores.sss, saliency)


def rma(
    saliency: ArrayLike,
    mask: ArrayLike,
    threshold: float | None = None,
    mode: str = "soft",
    *,
    nan_counts: Counter | None = None,
) -> float | ArrayLike:
    """Relevance Mass Accuracy ``RMA(H, M) = sum(H * M) / sum(H)`` (papers/000 eq. 1). Higher is better.

    Same inputs, outputs and NaN cases as :func:`sss` (``threshold`` is optional here and off by
    default; with it, the map is thresholded as in papers/004 App. C before the ratio). Equals
    Quantus' ``RelevanceMassAccuracy`` on non-negative attributions.
    """
    scores = spuriousity_scores(saliency, mask, threshold, mode)
    _count(scores, nan_counts)
    return _finish(scores.rma, saliency)


def nan_reasons(
    saliency: ArrayLike, mask: ArrayLike, threshold: float | None = None, mode: str = "soft"
) -> list[str | None]:
    """The NaN reason of each map (None where SSS/RMA are defined); see :data:`NAN_REASONS`."""
    return spuriousity_scores(saliency, mask, threshold, mode).reason_names()


# ------------------------------------------------------------------------------- aggregation
@dataclass(frozen=True)
class MeanStat:
    """A NaN-aware mean: ``mean`` and ``std`` over the ``n`` defined values; ``n_nan`` NaNs left out."""

    mean: float
    std: float
    n: int
    n_nan: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mean_stat(values: Iterable[float] | np.ndarray) -> MeanStat:
    """:class:`MeanStat` of ``values`` (NaN excluded and counted; mean NaN when none is defined)."""
    array = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64).ravel()
    ok = np.isfinite(array)
    n = int(ok.sum())
    if n == 0:
        return MeanStat(float("nan"), float("nan"), 0, int(array.size))
    kept = array[ok]
    return MeanStat(float(kept.mean()), float(kept.std(ddof=0)), n, int(array.size - n))


def mean_by(values: Sequence[float] | np.ndarray, keys: Sequence[Hashable]) -> dict[Hashable, MeanStat]:
    """``{key: MeanStat of the values with that key}``, keys in first-seen order (None keys skipped)."""
    array = np.asarray(values, dtype=np.float64)
    if len(array) != len(keys):
        raise ValueError(f"{len(array)} values but {len(keys)} keys")
    buckets: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        if key is not None:
            buckets.setdefault(key, []).append(i)
    return {key: mean_stat(array[idx]) for key, idx in buckets.items()}


def per_image(
    values: Sequence[float] | np.ndarray, image_ids: Sequence[Hashable]
) -> tuple[list[Hashable], np.ndarray, np.ndarray]:
    """Per-image aggregation (papers/004 §3.2): the mean of each image's prediction scores.

    Returns ``(ids in first-seen order, means, n_nan per image)``; an image whose predictions
    are all NaN gets NaN.
    """
    stats = mean_by(values, image_ids)
    ids = list(stats)
    return ids, np.array([stats[i].mean for i in ids]), np.array([stats[i].n_nan for i in ids], dtype=np.int64)


def per_class(values: Sequence[float] | np.ndarray, class_ids: Sequence[Hashable]) -> dict[Hashable, MeanStat]:
    """Per-class aggregation (papers/004 §3.2): the mean over the predictions of each class."""
    return mean_by(values, class_ids)


def balanced_mean(values: Sequence[float] | np.ndarray, class_ids: Sequence[Hashable]) -> float:
    """The mean over classes of the per-class means (each class weighs the same; NaN-aware)."""
    means = [s.mean for s in per_class(values, class_ids).values() if s.n > 0]
    return float(np.mean(means)) if means else float("nan")


def aggregate_scores(
    values: Sequence[float] | np.ndarray,
    *,
    image_ids: Sequence[Hashable],
    class_ids: Sequence[Hashable],
    image_class: Mapping[Hashable, Hashable] | None = None,
    image_group: Mapping[Hashable, Hashable] | None = None,
    image_correct: Mapping[Hashable, bool | None] | None = None,
) -> dict[str, Any]:
    """All aggregation levels of one score (SSS or RMA) as a JSON-ready dict.

    Args:
        values: per-prediction scores (NaN allowed).
        image_ids: the image of each prediction.
        class_ids: the class of each prediction (its target class): the per-class key.
        image_class: the true class of each image (for the class-balanced image means); defaults
            to the class of the image's first prediction.
        image_group: group of each image (``easy``/``hard``, or ``aligned``/``conflicting``);
            images mapped to None are left out of the split.
        image_correct: whether each image's top-1 prediction is right (None: unknown, left out).

    Returns:
        ``{"per_prediction": MeanStat, "per_image": MeanStat, "balanced": float,
        "per_class": {class: MeanStat}, "by_group": {group: {...}}, "by_correct": {...}}`` where
        the split entries hold the per-image ``MeanStat`` and the class-balanced mean of the
        images in that part.
    """
    values = np.asarray(values, dtype=np.float64)
    ids, img_means, _ = per_image(values, image_ids)
    first_class: dict[Hashable, Hashable] = {}
    for i, c in zip(image_ids, class_ids):
        first_class.setdefault(i, c)
    cls_of = {i: (image_class[i] if image_class is not None and i in image_class else first_class[i]) for i in ids}

    def part(selected: list[int]) -> dict[str, Any]:
        chosen = img_means[selected] if selected else np.array([])
        stat = mean_stat(chosen)
        bal = balanced_mean(chosen, [cls_of[ids[j]] for j in selected]) if selected else float("nan")
        return {**stat.to_dict(), "balanced": bal}

    out: dict[str, Any] = {
        "per_prediction": mean_stat(values).to_dict(),
        "per_image": part(list(range(len(ids)))),
        "per_class": {str(k): v.to_dict() for k, v in per_class(values, class_ids).items()},
    }
    for name, mapping in (("by_group", image_group), ("by_correct", image_correct)):
        if mapping is None:
            continue
        buckets: dict[Hashable, list[int]] = {}
        for j, i in enumerate(ids):
            key = mapping.get(i)
            if key is None:
                continue
            if name == "by_correct":
                key = "correct" if key else "wrong"
            buckets.setdefault(key, []).append(j)
        out[name] = {str(k): part(v) for k, v in buckets.items()}
    return out
