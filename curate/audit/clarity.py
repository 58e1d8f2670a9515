"""Clarity: "animal objects are largely occluded ... or do not occupy the majority of the space
in photos" (papers/003 §2.1).

With an object mask (``mask_path``): the object's share of the image,

    share_i = (pixels of the mask) / (pixels of the image),   score_i = 1 - share_i

(the paper's "majority of the space" is ``share > 0.5``; an occluded animal's mask holds only
its visible pixels, so occlusion lowers the share too). Instance-id masks count every non-zero
pixel.

Without a mask, a **proxy** (reported as such in the run and in every table): the share of the
image where the CLIP's GradCAM map for the labelled class is at least half its maximum
(``curate.saliency``, min-max normalised maps, docs/design.md#rma-and-sss). It needs one forward
and backward pass per such image (saliency cannot come from the cached embeddings), is only as
good as the model's localisation, and a low share can also mean a small but clear object.

Which masks (docs/design.md#masks): the share is only as right as the mask, so a mask counts only
when :func:`curate.masks.sources.trusted_rows` allows it: human and exact masks always, a model's
unverified proposal (``mask_status = model:<id>``, ``curate propose-masks``) only with
``settings.allow_model_masks`` (``curate audit --allow-model-masks``), a mask reviewers marked bad
never. A sample whose mask is left out is scored like one without a mask (the proxy, or not
scored), with a note; ``detail["masks"]`` records how many masks of each source the shares used
and how many were left out (:meth:`curate.masks.sources.MaskCounts.as_dict`).

Two scales, one ranking (issue 28): the mask share and the GradCAM proxy share are different
measurements, not one scale (a GradCAM region above half its maximum is typically far smaller than
the object's mask), so ranking their raw ``1 - share`` together put the maskless samples on top in a
mixed folder (16 of the top 18 suspects), whatever their real clarity. **Decision: each sample's
score is the rank percentile of its raw ``1 - share`` within its own source**,
``(r - 0.5) / n_source`` (:func:`curate.audit.combine.within_group_percentiles`; ties share their
average rank), and the check ranks those. Why this and not the alternatives:

- a within-source z-score would assume the two sources' distributions have the same shape and
  tails; the proxy's is the model's and skewed, and a source of a few samples gives an unstable
  mean and spread. Rank percentiles assume nothing about either scale;
- ranking each source separately and interleaving is what percentiles do already, as one score:
  a top ``k`` holds each source in proportion to its size (two sources: within half a sample of
  ``k x n_source / n``, for every ``k``), and ``ranks``, ``top_candidates``, ``--measure`` and the
  review tools keep reading one score column;
- within a source the percentile is strictly increasing in the raw score, so a folder with one
  source (every sample masked, or none) ranks and tags exactly as before; only the score's values
  change (a percentile in (0, 1) instead of ``1 - share``; the shares stay in the run).

What it assumes: problems are about as common among masked as among maskless samples (a source's
top ``x``% is tagged whatever its raw values). ``flagged`` still compares each raw share with
``settings.clarity_share``, on the sample's own scale. The output records which scale each
sample's score came from: ``detail["columns"]`` holds ``object_share`` (the raw share, either
scale), ``mask_share`` and ``proxy_share`` (each NaN where the score came from the other scale);
``detail["scales"]`` counts the scored samples of each (``{"mask share": 120, "GradCAM proxy": 80}``),
``detail["ranking"]`` names the scale (``"within-source rank percentile"``), and a mixed run says
in a note, e.g. "clarity: 120 by mask share, 80 by GradCAM proxy, each ranked within its own scale"
(:func:`scales_line`).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from curate.audit.base import AuditInputs, CheckResult, nan_scores
from curate.audit.combine import within_group_percentiles
from curate.store.mask_sources import mask_counts, mask_source, trusted_rows

logger = logging.getLogger(__name__)

METHOD = ("1 - object share of the image (mask; GradCAM >= 0.5 of max as a proxy where there is no mask), as its "
          "rank percentile within its source")
SALIENCY_LEVEL = 0.5
#: The check's ``source`` of a scored sample -> the name of its scale (``detail["scales"]``).
SCALES = {"mask": "mask share", "saliency proxy": "GradCAM proxy"}
RANKING = "within-source rank percentile"


def scales_line(scales: Mapping[str, int], check: str = "clarity") -> str:
    """``clarity: 120 by mask share, 80 by GradCAM proxy, each ranked within its own scale``
    (from ``detail["scales"]``; one scale: ``clarity: 120 by mask share``)."""
    used = [f"{count} by {scale}" for scale, count in scales.items() if count]
    return f"{check}: " + (", ".join(used) or "none scored") + (", each ranked within its own scale"
                                                               if len(used) > 1 else "")


def mask_share(mask: np.ndarray) -> float:
    """Share of non-zero pixels."""
    m = np.asarray(mask)
    return float((m > 0).mean()) if m.size else float("nan")


def saliency_shares(model, paths, labels, classifier, columns, *, batch_size: int = 32) -> tuple[np.ndarray, dict[int, str]]:
    """Share of pixels with GradCAM >= 0.5 for each image's labelled class (the proxy)."""
    import torch
    from PIL import Image

    from curate.saliency.engine import saliency_maps

    out = np.full(len(paths), np.nan)
    failed: dict[int, str] = {}
    for start in range(0, len(paths), batch_size):
        images, keep = [], []
        for i in range(start, min(len(paths), start + batch_size)):
            try:
                with Image.open(paths[i]) as image:
                    images.append(image.convert("RGB"))
                keep.append(i)
            except Exception as error:  # counted, never fatal
                failed[i] = f"{type(error).__name__}: {error}"[:300]
        if not images:
            continue
        result = saliency_maps(model, images, method="gradcam", target="true",
                               labels=torch.as_tensor([int(labels[i]) for i in keep]), classifier=classifier,
                               columns=[int(c) for c in columns], batch_size=batch_size)
        maps = result.maps[:, 0].float().cpu().numpy()
        share = (maps >= SALIENCY_LEVEL).mean(axis=(1, 2))
        flat = result.flat[:, 0].cpu().numpy()
        for j, i in enumerate(keep):
            if flat[j]:
                failed[i] = "flat saliency map (carries no localisation)"
            else:
                out[i] = share[j]
    return out, failed


#: Why a sample's mask was left out (:func:`curate.masks.sources.mask_source` -> text).
LEFT_OUT = {"model": "unverified model mask", "rejected": "mask marked bad"}


def clarity_check(inputs: AuditInputs, settings=None, *, mask_rows: Sequence[Mapping[str, Any]] | None = None
                  ) -> CheckResult:
    """Clarity suspicion from masks, else the saliency proxy (see the module docstring).

    ``mask_rows``: the audited samples' rows (``sample_id``, ``mask_path``, ``mask_status``), in
    ``inputs.ids`` order, so the trust rule can pick the masks the shares may use; None uses every
    mask path in ``inputs`` (and records no sources).
    """
    from curate.store.images import mask_array

    n = len(inputs)
    result = CheckResult("clarity", nan_scores(n), METHOD)
    share = nan_scores(n)
    source = np.array(["none"] * n, dtype=object)
    left_out: dict[int, str] = {}  # position -> mask source (model, rejected) of a mask not used
    allow = bool(getattr(settings, "allow_model_masks", False))
    counts = None
    if mask_rows is not None:
        if [r["sample_id"] for r in mask_rows] != list(inputs.ids):
            raise ValueError("clarity_check: mask_rows must be the audited samples' rows, in inputs.ids order")
        trusted, counts = trusted_rows(mask_rows, allow_model_masks=allow)
        kept = {r["sample_id"] for r in trusted}
        left_out = {i: str(mask_source(r)) for i, r in enumerate(mask_rows)
                    if r.get("mask_path") is not None and r["sample_id"] not in kept}
    for i, path in enumerate(inputs.mask_paths):
        if path is None or i in left_out:
            continue
        try:
            share[i] = mask_share(mask_array(path))
            source[i] = "mask"
        except Exception as error:  # an unreadable mask: fall back to the proxy for this sample
            logger.warning("mask %s cannot be read (%s); using the saliency proxy", path, error)
    if left_out:
        kinds = {k: sum(v == k for v in left_out.values()) for k in LEFT_OUT}
        result.notes.append(
            f"{len(left_out)} of {n} sample(s) have a mask it may not use ("
            + ", ".join(f"{c} {LEFT_OUT[k]}{'s' if c != 1 else ''}" for k, c in kinds.items() if c)
            + "): scored as if they had none"
            + (" (--allow-model-masks uses the model's proposals; curate review verifies them)" if kinds["model"]
               else ""))
    no_mask = np.flatnonzero(source == "none")
    none = "no mask it may use" if left_out else "no mask"
    if len(no_mask):
        proxy_ok = bool(getattr(settings, "saliency_proxy", True)) and inputs.model is not None \
            and inputs.classifier is not None
        if proxy_ok:
            values, failed = saliency_shares(inputs.model, [inputs.image_paths[i] for i in no_mask],
                                             inputs.classes[no_mask], inputs.classifier, inputs.label_columns,
                                             batch_size=int(getattr(settings, "saliency_batch", 32)))
            share[no_mask] = values
            source[no_mask[np.isfinite(values)]] = "saliency proxy"
            for position, reason in failed.items():
                result.failed[inputs.ids[no_mask[position]]] = reason
            result.notes.append(f"{len(no_mask)} of {n} sample(s) have {none}: their clarity is a PROXY (share of the "
                                "image with GradCAM >= 0.5 for the labelled class), not the object's share")
        else:
            for i in no_mask:
                why = LEFT_OUT.get(left_out.get(int(i), ""), "no mask")
                result.failed[inputs.ids[i]] = f"{why} and no saliency proxy"
            result.notes.append(f"{len(no_mask)} of {n} sample(s) have {none} and the saliency proxy is off: not scored")
    # one scale per source, ranked on its own (see the module docstring): the raw 1 - share
    # becomes its rank percentile among the scored samples of the same source
    scored = np.isfinite(share)
    result.scores = within_group_percentiles(1.0 - share, source)
    result.flagged = share < float(getattr(settings, "clarity_share", 0.1))
    scales = {scale: int((scored & (source == s)).sum()) for s, scale in SCALES.items()}
    if sum(1 for count in scales.values() if count) > 1:
        result.notes.append(f"{scales_line(scales)} (a score is the sample's rank percentile among the samples "
                            "of its own source: the two shares are not one scale)")
    result.detail = {"sources": {s: int((source == s).sum()) for s in ("mask", "saliency proxy", "none")},
                     "scales": scales, "ranking": RANKING,
                     "columns": {"object_share": share,
                                 "mask_share": np.where(scored & (source == "mask"), share, np.nan),
                                 "proxy_share": np.where(scored & (source == "saliency proxy"), share, np.nan)}}
    if counts is not None and mask_rows is not None:  # the masks the shares used, and the ones left out
        used = mask_counts([mask_rows[i] for i in np.flatnonzero(source == "mask")], allow_model_masks=allow)
        used.skipped_model, used.skipped_rejected = counts.skipped_model, counts.skipped_rejected
        result.detail["masks"] = used.as_dict()
    result.method = METHOD
    return result
