"""Feature noise: "some pixels are disrupted or missing" (papers/003 §2.1).

Two sources, both reading pixels (no model):

- CleanVision (``cleanvision.Imagelab``): ``blurry``, ``dark``, ``light``, ``low_information``,
  ``odd_size``, ``odd_aspect_ratio``; each gives a quality score in [0, 1] (lower = worse) and
  its own ``is_<issue>_issue`` verdict.
- our own noise estimate, which CleanVision does not have (its issues do not include noise):
  Immerkaer's (1996) fast estimate of the Gaussian noise sigma of the grey image,
  ``sigma = sqrt(pi / 2) / (6 (W - 2)(H - 2)) * sum |I * L|`` with ``L`` the 3x3 kernel
  ``[[1, -2, 1], [-2, 4, -2], [1, -2, 1]]`` (a Laplacian difference that cancels edges to first order);
- our own missing-block check, which CleanVision does not have either: the share of the image that is
  perfectly flat, ``max(flat tiles / tiles, constant edge rows or columns / side)``, where a
  tile (``tile x tile`` px) is flat when every channel's max - min <= 1 and an edge row is
  constant when all its pixels are equal. A truncated file (rows that never arrived), padding
  (letterbox bands) and blanked blocks are flat; photos, with sensor noise, almost never are.

The score ranks by the most extreme component: each component's suspicion (``1 - quality``;
the block share) is turned into its rank percentile among the audited images, and
``score_i = max_component percentile_i`` (ties to the block share, a raw value, broken by
adding ``1e-3 x`` it). Percentiles make the components comparable: CleanVision's scores live on
different scales per issue. ``flagged`` = CleanVision flagged any issue, or the flat share is
at least ``block_threshold`` (default 0.15).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from curate.audit.base import AuditInputs, CheckResult, nan_scores

logger = logging.getLogger(__name__)

CLEANVISION_ISSUES: tuple[str, ...] = ("blurry", "dark", "light", "low_information", "odd_size", "odd_aspect_ratio")
METHOD = ("max over components of the rank percentile: CleanVision blurry/dark/light/low_information/odd_size/"
          "odd_aspect_ratio, curate's noise sigma and flat-block share")
DEFAULT_TILE = 4
DEFAULT_BLOCK_THRESHOLD = 0.15


def flat_share(image: np.ndarray, tile: int = DEFAULT_TILE) -> float:
    """The share of an (H, W, C) uint8 image that is perfectly flat (see the module docstring)."""
    a = np.asarray(image)
    if a.ndim == 2:
        a = a[..., None]
    h, w = a.shape[:2]
    th, tw = h // tile, w // tile
    tiles_share = 0.0
    if th and tw:
        t = a[: th * tile, : tw * tile].reshape(th, tile, tw, tile, a.shape[2]).astype(np.int16)
        spread = (t.max(axis=(1, 3)) - t.min(axis=(1, 3))).max(axis=-1)
        tiles_share = float((spread <= 1).mean())
    rows = (a == a[:, :1]).all(axis=(1, 2))  # a row whose pixels all equal its first
    cols = (a == a[:1, :]).all(axis=(0, 2))
    edge = max(_run(rows) + _run(rows[::-1]), 0) / h, max(_run(cols) + _run(cols[::-1]), 0) / w
    return float(min(1.0, max(tiles_share, *edge)))


def noise_sigma(image: np.ndarray) -> float:
    """Immerkaer's fast noise estimate of an (H, W[, C]) image (grey levels; see the module docstring)."""
    a = np.asarray(image, dtype=np.float64)
    grey = a @ np.array([0.299, 0.587, 0.114]) if a.ndim == 3 else a
    h, w = grey.shape
    if h < 3 or w < 3:
        return float("nan")
    g = grey
    conv = (g[:-2, :-2] - 2 * g[:-2, 1:-1] + g[:-2, 2:] - 2 * g[1:-1, :-2] + 4 * g[1:-1, 1:-1] - 2 * g[1:-1, 2:]
            + g[2:, :-2] - 2 * g[2:, 1:-1] + g[2:, 2:])
    return float(np.sqrt(np.pi / 2) * np.abs(conv).sum() / (6.0 * (w - 2) * (h - 2)))


def _run(flags: np.ndarray) -> int:
    """Length of the leading run of True."""
    off = np.flatnonzero(~flags)
    return int(off[0]) if len(off) else len(flags)


def percentile_ranks(values: np.ndarray) -> np.ndarray:
    """Rank percentile in (0, 1] of each finite value (average ranks for ties); NaN stays NaN."""
    from scipy.stats import rankdata

    out = np.full(len(values), np.nan)
    ok = np.isfinite(values)
    if ok.any():
        out[ok] = rankdata(values[ok], method="average") / ok.sum()
    return out


def cleanvision_scores(paths: Sequence[Path], *, n_jobs: int = 1) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """CleanVision's per-issue quality scores and verdicts, aligned with ``paths`` (NaN where missing)."""
    import contextlib
    import io

    from cleanvision import Imagelab

    lab = Imagelab(filepaths=[str(p) for p in paths], verbose=False)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # it prints anyway
        lab.find_issues({issue: {} for issue in CLEANVISION_ISSUES}, n_jobs=n_jobs, verbose=False)
    frame = lab.issues.reindex([str(p) for p in paths])
    scores, verdicts = {}, {}
    for issue in CLEANVISION_ISSUES:
        column = f"{issue}_score"
        if column in frame:
            scores[issue] = frame[column].to_numpy(dtype=np.float64)
            verdicts[issue] = frame[f"is_{issue}_issue"].fillna(False).to_numpy(dtype=bool)
    return scores, verdicts


def feature_check(inputs: AuditInputs, settings=None) -> CheckResult:
    """Feature-noise suspicion (see the module docstring)."""
    from PIL import Image

    n = len(inputs)
    tile = int(getattr(settings, "tile", DEFAULT_TILE))
    threshold = float(getattr(settings, "block_threshold", DEFAULT_BLOCK_THRESHOLD))
    result = CheckResult("feature", nan_scores(n), METHOD)
    flat = nan_scores(n)
    noise = nan_scores(n)
    decodable: list[int] = []
    for i, path in enumerate(inputs.image_paths):
        try:
            with Image.open(path) as image:
                pixels = np.asarray(image.convert("RGB"))
            flat[i] = flat_share(pixels, tile)
            noise[i] = noise_sigma(pixels)
            decodable.append(i)
        except Exception as error:  # counted, never fatal
            result.failed[inputs.ids[i]] = f"{type(error).__name__}: {error}"[:300]
    if not decodable:
        result.notes.append("no image could be decoded; nothing scored")
        return result
    components = {"flat_block": percentile_ranks(flat), "noise": percentile_ranks(noise)}
    flagged = np.zeros(n, bool)
    flagged |= np.nan_to_num(flat, nan=0.0) >= threshold
    counts = {"flat_block": int(flagged.sum())}
    try:
        good = [inputs.image_paths[i] for i in decodable]
        cv_scores, cv_flags = cleanvision_scores(good, n_jobs=int(getattr(settings, "n_jobs", 1)))
        for issue, values in cv_scores.items():
            full = nan_scores(n)
            full[decodable] = 1.0 - values
            components[issue] = percentile_ranks(full)
            hit = np.zeros(n, bool)
            hit[decodable] = cv_flags[issue]
            counts[issue] = int(hit.sum())
            flagged |= hit
    except Exception as error:  # noqa: BLE001 - CleanVision failing leaves the block check
        result.notes.append(f"CleanVision did not run ({type(error).__name__}: {error}); flat-block check only")
    stacked = np.vstack(list(components.values()))
    ok = np.isfinite(stacked).any(axis=0)
    result.scores[ok] = np.nanmax(stacked[:, ok], axis=0) + 1e-3 * np.nan_to_num(flat[ok])
    result.flagged = flagged
    result.detail = {"flagged_by": counts, "components": list(components), "tile": tile, "block_threshold": threshold}
    result.detail["columns"] = {"flat_share": flat, "noise_sigma": noise, **{f"{k}_pct": v for k, v in components.items()}}
    return result
