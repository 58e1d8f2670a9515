"""Fidelity of explanations: Fid+/Fid-, R-Fidelity and F-Fidelity (papers/002 §2.3-§3, §5).

Elements are the pixels of the model's *input* grid (all channels of a pixel go together).
An explanation is a score per pixel, ``(N, H, W)``; at sparsity ``s`` the explanation set is
the ``k = round(s * D)`` highest-scoring pixels (``D = H * W``; ties broken by a seeded random
order), its complement the other ``D - k``.

Removal replaces a pixel by the **baseline**: zero in the model's normalised input space, i.e.
the per-channel normalisation mean (ImageNet/CLIP mean colour) for the usual
``Normalize(mean, std)`` preprocessing (``baseline=`` takes any other value, e.g. a tensor).

With ``f`` the model, ``y`` the label, ``m`` the explanation mask and ``1[.]`` an indicator
(``score="accuracy"``, the paper's). Two continuous scores replace ``1[f(.) = y]``:
``score="probability"`` uses ``p_f(y | .)``, and ``score="margin"`` the logit margin
``z_y(.) - max_{c != y} z_c(.)`` (the indicator is ``1[margin > 0]``). On a confident model
(the fine-tuned tiny CLIP classifies its images with mean top probability 1.000) the indicator
and the probability barely move when 10 % of the pixels go, so their differences are mostly
noise; the margin does not saturate. Measured on the synthetic world (docs/results.md, issue 9 note):
the degraded mask series is ranked with macro Spearman -1.00 by F-Fid+ for every fine-tuning
seed tried with ``margin``, versus -0.83..-1.00 with ``accuracy`` and ``probability``.

- Fidelity (papers/002 eqs. 1-2), MoRF / LeRF::

      Fid+ = 1/N sum_i ( 1[f(x_i) = y_i] - 1[f(x_i - m_i) = y_i] )      remove the explanation
      Fid- = 1/N sum_i ( 1[f(x_i) = y_i] - 1[f(x_i ∩ m_i) = y_i] )      keep only the explanation

- R-Fidelity (Zheng et al. 2024; papers/002 eqs. 3-4): the removal is stochastic, a sampling
  function removes ``round(alpha+ * k)`` pixels drawn uniformly from the explanation (Fid+) or
  ``round(alpha- * (D - k))`` from its complement (Fid-); averaged over ``S`` samples.
  ``alpha = 1`` gives back Fid.
- F-Fidelity (papers/002 §3, eqs. 5-6, Alg. 1): R-Fidelity on a model fine-tuned with random
  masks removing at most ``beta * D`` pixels (:func:`finetune`), with the removal capped at the
  same bound: ``alpha+' = min(alpha+, beta * D / k)``, ``alpha-' = min(alpha-, beta * D / (D - k))``,
  so at most ``floor(beta * D)`` pixels are ever removed.

Higher Fid+ and lower Fid- mean a more faithful explanation. Curves over sparsity
(papers/002 §5: 5 %-95 % in 5 % steps) are summarised by their AUC (trapezoid, divided by the
sparsity range, so an AUC is the curve's mean); the *macro* Spearman correlation of the AUCs with
the ground-truth order of a degraded series is the paper's check (:func:`degrade`, :func:`spearman`).
What each metric is (name, formula, direction, equation) is declared once in :data:`METRIC_INFO`.

Verdicts against a random map (:func:`trust_vs_reference`) must survive re-fitting: F-Fidelity
depends on one fine-tuned copy and on the removal draws, so a verdict is computed over ``R``
**replicates** ``r`` (seeds ``seed, seed + 1, ...``; replicate ``r`` = the copy fine-tuned with
seed ``r`` and removal draws, tie-breaking and the random reference map seeded by ``r``; Fid and
R-Fid, which fine-tune nothing, vary only by their draws). With ``fam`` the ranking family
(F-Fid when computed, else R-Fid, else Fid) and per-image AUCs over sparsity, the paired
differences of a method to the reference on image ``i`` under replicate ``r`` are::

    MoRF:  d_ri = AUC(fam+ of method)_ri - AUC(fam+ of random)_ri     (top pixels matter more)
    LeRF:  d_ri = AUC(fam- of random)_ri - AUC(fam- of method)_ri     (keeping them preserves more)
    effect  theta = 1/(R N) sum_r sum_i d_ri

Its interval is a **two-way (seeds x images) bootstrap** (:func:`seed_image_bootstrap`): every
replicate scored the same N images, so seeds and images are crossed factors, and a bootstrap
replicate draws R seeds with replacement and, independently, N images with replacement, and
averages ``d`` over the drawn pairs::

    theta*_b = 1/(R N) sum_{a=1..R} sum_{c=1..N} d[J_a, I_c],   J ~ U{1..R}^R,  I ~ U{1..N}^N

so ``Var(theta*) ~ s2_seed / R + s2_image / N + s2_interaction / (R N)``: the spread between
fine-tuned copies enters the interval next to the spread between images (resampling images
independently *within* each seed would divide the image term by R, as if every seed had its
own images). The interval is the 2.5 and 97.5 percentiles of ``B`` replicates (default 2000,
seeded). With ``R = 1`` it is the plain paired bootstrap over images. With few seeds the
bootstrap sees the seed spread through R values and understates that term by ``(R - 1) / R``
(a third at R = 3); the marginal flag below is there for the verdicts this could flip.

Verdict: ``faithful`` when both intervals lie above 0, ``MoRF only`` / ``LeRF only`` when one
does, ``not above random`` otherwise. An interval above 0 is **marginal** when its lower bound
is below ``marginal`` (default 0.25) times the effect: ``0 < low < marginal * theta``. For a
symmetric interval ``low = theta - 1.96 se``, so ``marginal = 0.25`` marks the effects with
``1.96 < theta / se < 2.61``: excluded from 0 at the 95 % level but not at 99 %. A verdict
resting on a marginal interval gets the suffix ``(marginal)``, e.g. ``faithful (marginal)``;
``marginal = 0`` turns the marking off.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from curate.metrics.info import MetricInfo

#: The paper's defaults (papers/002 App. E.4, figure names: MoRF/LeRF 0.5, threshold 0.1).
DEFAULT_ALPHA = 0.5
DEFAULT_BETA = 0.1
DEFAULT_SAMPLES = 10
DEFAULT_SPARSITIES = tuple(round(0.05 * i, 2) for i in range(1, 20))
METRICS = ("fid_plus", "fid_minus", "rfid_plus", "rfid_minus", "ffid_plus", "ffid_minus")
SCORES = ("accuracy", "probability", "margin")
#: Replicates (fine-tuning and removal seeds) behind a verdict, and the marginal rule's fraction.
DEFAULT_SEEDS = 3
DEFAULT_MARGINAL = 0.25
DEFAULT_BOOTSTRAP = 2000
#: Verdicts of a method against the reference map; the reference's own; the marginal suffix.
VERDICTS = ("faithful", "MoRF only", "LeRF only", "not above random")
REFERENCE_VERDICT = "reference"
MARGINAL_SUFFIX = " (marginal)"

_SCORE_NOTE = "1[.] is the indicator of a right prediction (score=accuracy), or p(y|.) or the logit margin"
_NAN = ("the model's logits are not finite for an image (scores probability and margin)",)
FID_PLUS_INFO = MetricInfo(
    name="Fid+", formula="1/N sum_i (1[f(x_i) = y_i] - 1[f(x_i - m_i) = y_i]): remove the explanation (MoRF); "
                         + _SCORE_NOTE,
    higher_is_better=True, paper="papers/002 §2.3 eq. 1", nan_reasons=_NAN)
FID_MINUS_INFO = MetricInfo(
    name="Fid-", formula="1/N sum_i (1[f(x_i) = y_i] - 1[f(x_i ∩ m_i) = y_i]): keep only the explanation (LeRF); "
                         + _SCORE_NOTE,
    higher_is_better=False, paper="papers/002 §2.3 eq. 2", nan_reasons=_NAN)
RFID_PLUS_INFO = MetricInfo(
    name="R-Fid+", formula="Fid+ with a stochastic removal of round(alpha+ k) of the k explanation pixels, "
                           "averaged over S samples",
    higher_is_better=True, paper="papers/002 §2.3 eq. 3 (Zheng et al. 2024)", nan_reasons=_NAN)
RFID_MINUS_INFO = MetricInfo(
    name="R-Fid-", formula="Fid- with a stochastic removal of round(alpha- (D - k)) of the D - k other pixels, "
                           "averaged over S samples",
    higher_is_better=False, paper="papers/002 §2.3 eq. 4 (Zheng et al. 2024)", nan_reasons=_NAN)
FFID_PLUS_INFO = MetricInfo(
    name="F-Fid+", formula="R-Fid+ on a copy fine-tuned with random masks of at most beta D pixels (eq. 5), "
                           "alpha+' = min(alpha+, beta D / k)",
    higher_is_better=True, paper="papers/002 §3 eqs. 5-6, Alg. 1", nan_reasons=_NAN)
FFID_MINUS_INFO = MetricInfo(
    name="F-Fid-", formula="R-Fid- on the fine-tuned copy (eq. 5), alpha-' = min(alpha-, beta D / (D - k))",
    higher_is_better=False, paper="papers/002 §3 eqs. 5-6, Alg. 1", nan_reasons=_NAN)
#: ``{metric key: MetricInfo}`` in :data:`METRICS` order.
METRIC_INFO = dict(zip(METRICS, (FID_PLUS_INFO, FID_MINUS_INFO, RFID_PLUS_INFO, RFID_MINUS_INFO, FFID_PLUS_INFO,
                                 FFID_MINUS_INFO)))

Predict = Callable[[torch.Tensor], torch.Tensor]  # (N, 3, H, W) -> logits (N, C)


class FidelityError(ValueError):
    """Bad arguments to a fidelity computation."""


# ----------------------------------------------------------------------------- elements
def pixel_ranks(explanations: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """``(N, D)`` rank of each pixel, 0 = most important; ties broken by a seeded random order."""
    e = explanations.reshape(explanations.shape[0], -1).float()
    e = torch.nan_to_num(e, nan=float("-inf"))
    jitter = torch.rand(e.shape, generator=generator, device=e.device, dtype=torch.float64)
    # lexicographic sort: by score (descending), then by the random jitter
    order = torch.argsort(jitter, dim=1)
    e_perm = torch.gather(e, 1, order)
    order = torch.gather(order, 1, torch.argsort(-e_perm, dim=1, stable=True))
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(e.shape[1], device=e.device).expand_as(order).contiguous())
    return ranks


def explanation_size(sparsity: float, d: int) -> int:
    """Number of pixels in the explanation set at a sparsity (at least 1, at most D - 1)."""
    return int(min(max(round(float(sparsity) * d), 1), d - 1))


def removal_counts(sparsity: float, d: int, alpha_plus: float, alpha_minus: float,
                   beta: float | None = None) -> tuple[int, int]:
    """Pixels removed for (Fid+, Fid-) at a sparsity: ``alpha * |set|``, capped at ``beta * D`` (eq. 6)."""
    k = explanation_size(sparsity, d)
    plus, minus = round(alpha_plus * k), round(alpha_minus * (d - k))
    if beta is not None:
        cap = math.floor(beta * d + 1e-9)
        plus, minus = min(plus, cap), min(minus, cap)
    return int(plus), int(minus)


def stochastic_removal(ranks: torch.Tensor, k: int, count: int, *, explanation: bool, samples: int,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """``(S, N, D)`` bool masks of removed pixels: ``count`` drawn uniformly without replacement
    from the explanation set (``rank < k``) or, with ``explanation=False``, from its complement.
    ``count`` equal to the set size removes the whole set (deterministic Fid)."""
    n, d = ranks.shape
    inset = ranks < k if explanation else ranks >= k
    keys = torch.rand((samples, n, d), generator=generator, device=ranks.device)
    keys = torch.where(inset.unsqueeze(0), keys, torch.full_like(keys, 2.0))
    if count <= 0:
        return torch.zeros((samples, n, d), dtype=torch.bool, device=ranks.device)
    idx = torch.topk(keys, count, dim=-1, largest=False).indices
    removed = torch.zeros((samples, n, d), dtype=torch.bool, device=ranks.device)
    removed.scatter_(-1, idx, True)
    return removed


def random_input_masks(n: int, hw: tuple[int, int], beta: float, *, generator: torch.Generator | None = None,
                       device: Any = "cpu") -> torch.Tensor:
    """``(N, H, W)`` bool masks for fine-tuning (papers/002 eq. 5): each removes a uniformly random
    number in ``[0, floor(beta * D)]`` of uniformly random pixels, never more than ``beta * D``."""
    d = hw[0] * hw[1]
    cap = math.floor(beta * d + 1e-9)
    counts = torch.randint(0, cap + 1, (n, 1), generator=generator, device=device)
    keys = torch.rand((n, d), generator=generator, device=device)
    ranks = torch.argsort(torch.argsort(keys, dim=1), dim=1)
    return (ranks < counts).reshape(n, *hw)


def apply_removal(images: torch.Tensor, removed: torch.Tensor, baseline: Any = 0.0) -> torch.Tensor:
    """Replace removed pixels (``removed`` broadcastable to ``(N, 1, H, W)``) by the baseline."""
    if removed.ndim == 3:
        removed = removed.unsqueeze(1)
    base = torch.as_tensor(baseline, dtype=images.dtype, device=images.device)
    if base.ndim == 1:
        base = base.view(1, -1, 1, 1)
    return torch.where(removed, base.expand_as(images) if base.ndim else base, images)


# ----------------------------------------------------------------------------- scoring
def _correct(logits: torch.Tensor, labels: torch.Tensor, score: str) -> torch.Tensor:
    if score == "accuracy":
        return (logits.argmax(-1) == labels).float()
    logits = logits.float()
    if score == "probability":
        return logits.softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    own = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    others = logits.scatter(-1, labels.unsqueeze(-1), float("-inf")).max(-1).values
    return own - others


@torch.no_grad()
def _scores(predict: Predict, images: torch.Tensor, labels: torch.Tensor, removed: torch.Tensor,
            baseline: Any, score: str, chunk: int) -> torch.Tensor:
    """Mean over samples of the score of each image with ``removed`` (S, N, D) pixels removed: (N,)."""
    s, n, _ = removed.shape
    h, w = images.shape[-2:]
    flat = removed.reshape(s * n, h, w)
    rep = images.unsqueeze(0).expand(s, *images.shape).reshape(s * n, *images.shape[1:])
    lab = labels.repeat(s)
    out = []
    for i in range(0, s * n, chunk):
        x = apply_removal(rep[i:i + chunk], flat[i:i + chunk], baseline)
        out.append(_correct(predict(x), lab[i:i + chunk], score))
    return torch.cat(out).reshape(s, n).mean(0)


@dataclass
class FidelityCurves:
    """Per-sparsity curves (one value per sparsity, averaged over images) and their AUCs."""

    sparsities: list[float]
    curves: dict[str, list[float]]
    per_image: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    n_images: int = 0

    @property
    def aucs(self) -> dict[str, float]:
        return {name: auc(self.sparsities, values) for name, values in self.curves.items()}


def per_image_aucs(curves: FidelityCurves, metric: str) -> np.ndarray:
    """``(N,)`` AUC of each image's own curve of ``metric`` (their mean is the curve's AUC)."""
    x = np.asarray(curves.sparsities, dtype=float)
    y = np.asarray(curves.per_image[metric], dtype=float)  # (N, S)
    if len(x) == 1:
        return y[:, 0].copy()
    area = np.sum((x[1:] - x[:-1]) * (y[:, 1:] + y[:, :-1]) / 2, axis=1)
    return area / float(x[-1] - x[0])


def auc(sparsities: Sequence[float], values: Sequence[float]) -> float:
    """Trapezoid area under a curve over sparsity, divided by the sparsity range (= its mean)."""
    x = np.asarray(sparsities, dtype=float)
    y = np.asarray(values, dtype=float)
    if len(x) == 1:
        return float(y[0])
    area = float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))
    return area / float(x[-1] - x[0])


def fidelity_curves(
    predict: Predict,
    images: torch.Tensor,
    explanations: torch.Tensor,
    labels: Sequence[int] | torch.Tensor,
    *,
    sparsities: Sequence[float] = DEFAULT_SPARSITIES,
    alpha: float | tuple[float, float] = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    samples: int = DEFAULT_SAMPLES,
    finetuned: Predict | None = None,
    baseline: Any = 0.0,
    score: str = "accuracy",
    metrics: Sequence[str] = METRICS,
    seed: int = 0,
    chunk: int = 256,
) -> FidelityCurves:
    """Fid+/Fid- (eqs. 1-2), R-Fid+/R-Fid- (eqs. 3-4) and F-Fid+/F-Fid- (eq. 6) curves.

    Args:
        predict: ``(N, 3, H, W)`` model input -> logits ``(N, C)``; labels index its columns.
        images: ``(N, 3, H, W)`` preprocessed inputs (on the device ``predict`` expects).
        explanations: ``(N, H, W)`` (or ``(N, 1, H, W)``) scores on the same grid.
        labels: the class column of each image.
        sparsities: explanation sizes as fractions of the pixels.
        alpha: ``alpha`` or ``(alpha+, alpha-)`` of R-/F-Fidelity.
        beta: F-Fidelity's bound on removed pixels (as a fraction of the input).
        samples: stochastic removals per image and sparsity (evaluated in batches).
        finetuned: the fine-tuned model for F-Fidelity (:func:`finetune`); None skips ``ffid_*``.
        baseline: value of a removed pixel in input space (default 0 = the normalisation mean).
        score: ``"accuracy"`` (the paper's indicator) or ``"probability"`` of the label.
        metrics: which of :data:`METRICS` to compute.
        seed: seeds tie-breaking and every random removal (same seed -> same numbers).
        chunk: images per forward pass.
    """
    if score not in SCORES:
        raise FidelityError(f"score must be one of {SCORES}, got {score!r}")
    a_plus, a_minus = (alpha, alpha) if np.isscalar(alpha) else tuple(alpha)  # type: ignore[misc]
    for a in (a_plus, a_minus, beta):
        if not 0 < float(a) <= 1:
            raise FidelityError(f"alpha and beta must be in (0, 1], got {a}")
    if samples < 1:
        raise FidelityError("samples must be >= 1")
    if explanations.ndim == 4:
        explanations = explanations[:, 0]
    n, h, w = explanations.shape
    if images.shape[0] != n or tuple(images.shape[-2:]) != (h, w):
        raise FidelityError(f"explanations {tuple(explanations.shape)} do not match images {tuple(images.shape)}")
    metrics = [m for m in metrics if m in METRICS and (finetuned is not None or not m.startswith("ffid"))]
    device = images.device
    labels_t = torch.as_tensor(labels, dtype=torch.long, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    d = h * w
    ranks = pixel_ranks(explanations.to(device), generator=gen)
    base = {"orig": _scores(predict, images, labels_t, torch.zeros((1, n, d), dtype=torch.bool, device=device),
                            baseline, score, chunk)}
    if finetuned is not None:
        base["ft"] = _scores(finetuned, images, labels_t, torch.zeros((1, n, d), dtype=torch.bool, device=device),
                             baseline, score, chunk)
    per_image: dict[str, list[torch.Tensor]] = {m: [] for m in metrics}
    for s in sparsities:
        k = explanation_size(s, d)
        for m in metrics:
            plus = m.endswith("plus")
            if m.startswith("fid"):
                count, reps, model, ref = (k if plus else d - k), 1, predict, base["orig"]
            elif m.startswith("rfid"):
                count = removal_counts(s, d, a_plus, a_minus)[0 if plus else 1]
                reps, model, ref = samples, predict, base["orig"]
            else:
                count = removal_counts(s, d, a_plus, a_minus, beta)[0 if plus else 1]
                reps, model, ref = samples, finetuned, base["ft"]
            removed = stochastic_removal(ranks, k, count, explanation=plus, samples=reps, generator=gen)
            per_image[m].append(ref - _scores(model, images, labels_t, removed, baseline, score, chunk))
    stacked = {m: torch.stack(v, 1).cpu().numpy() for m, v in per_image.items()}  # (N, S)
    curves = {m: [float(x) for x in v.mean(0)] for m, v in stacked.items()}
    return FidelityCurves([float(s) for s in sparsities], curves, stacked, n)


def merge_curves(parts: Sequence[FidelityCurves]) -> FidelityCurves:
    """Concatenate per-batch curves (image-weighted means)."""
    per = {m: np.concatenate([p.per_image[m] for p in parts], 0) for m in parts[0].per_image}
    return FidelityCurves(parts[0].sparsities, {m: [float(x) for x in v.mean(0)] for m, v in per.items()},
                          per, sum(p.n_images for p in parts))


# ----------------------------------------------------------------------------- fine-tuning
def finetune_steps(n: int, *, epochs: int, batch_size: int) -> int:
    """Optimisation steps of :func:`finetune` on ``n`` images: ``epochs * ceil(n / batch_size)``
    (the unit its progress counts in)."""
    return int(epochs) * -(-int(n) // int(batch_size))


def finetune(
    module: torch.nn.Module,
    forward: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    labels: Sequence[int] | torch.Tensor,
    *,
    beta: float = DEFAULT_BETA,
    epochs: int = 5,
    lr: float = 1e-4,
    weight_decay: float = 1e-4,
    batch_size: int = 32,
    baseline: Any = 0.0,
    params: Callable[[torch.nn.Module], Any] | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> torch.nn.Module:
    """Fine-tune a copy of ``module`` with random masks of at most ``beta`` of the pixels (eq. 5).

    ``L = E_{(x,y)} E_{m ~ M_beta} loss(f(x ⊙ m), y)`` with cross-entropy, Adam (the paper's
    defaults: lr = weight decay = 1e-4). ``forward(module, x) -> logits``; ``params(module)``
    selects the trained parameters (default all; a CLIP trains only its image tower). The copy
    stays in eval mode (frozen normalisation statistics, no dropout), which suits small sets.
    ``progress(done, total)`` is called with ``(0, total)`` first and after every optimisation
    step, in steps (:func:`finetune_steps`), so it ends at ``(total, total)``.
    Returns the fine-tuned copy; ``module`` is untouched.
    """
    torch.manual_seed(int(seed))
    tuned = copy.deepcopy(module)
    tuned.eval()
    chosen = list(params(tuned) if params is not None else tuned.parameters())
    for p in tuned.parameters():
        p.requires_grad_(False)
    for p in chosen:
        p.requires_grad_(True)
    opt = torch.optim.Adam(chosen, lr=lr, weight_decay=weight_decay)
    device = images.device
    labels_t = torch.as_tensor(labels, dtype=torch.long, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    n = images.shape[0]
    hw = tuple(images.shape[-2:])
    done, total = 0, finetune_steps(n, epochs=epochs, batch_size=batch_size)
    if progress is not None:
        progress(done, total)
    for _ in range(int(epochs)):
        order = torch.randperm(n, generator=gen, device=device)
        for i in range(0, n, batch_size):
            idx = order[i:i + batch_size]
            x = images.index_select(0, idx)
            masks = random_input_masks(len(idx), hw, beta, generator=gen, device=device)  # type: ignore[arg-type]
            loss = F.cross_entropy(forward(tuned, apply_removal(x, masks, baseline)).float(), labels_t[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 1
            if progress is not None:
                progress(done, total)
    for p in tuned.parameters():
        p.requires_grad_(False)
    return tuned


def finetune_key(model_id: str, sample_ids: Sequence[str], columns: Sequence[int], **settings: Any) -> str:
    """Cache key of a fine-tuned model: weights, data, label columns and settings."""
    blob = json.dumps({"model": model_id, "samples": list(sample_ids), "columns": list(columns), **settings},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- degraded series
def degrade(explanations: torch.Tensor, ratio: float, *, seed: int = 0) -> torch.Tensor:
    """A degraded copy (papers/002 §5): a random fraction ``ratio`` of the pixels get uniform
    random scores in the explanation's range; ratio 0 = the explanation, 1 = a random one."""
    e = explanations.float()
    gen = torch.Generator(device=e.device)
    gen.manual_seed(int(seed))
    flat = e.reshape(e.shape[0], -1)
    lo, hi = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    noise = lo + (hi - lo) * torch.rand(flat.shape, generator=gen, device=e.device)
    pick = torch.rand(flat.shape, generator=gen, device=e.device) < float(ratio)
    return torch.where(pick, noise, flat).reshape(e.shape)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); nan when one side is constant."""
    import warnings

    from scipy.stats import spearmanr

    x, y = np.asarray(x, float), np.asarray(y, float)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")  # e.g. every explainer scores 0 at a sparsity: no ranking to compare
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(spearmanr(x, y).statistic)


def series_correlations(results: Mapping[Any, FidelityCurves], truth: Mapping[Any, float]) -> dict[str, dict[str, float]]:
    """Macro (AUC) and micro (mean per-sparsity) Spearman of each metric vs a ground-truth value
    per explainer (e.g. its noise ratio: then a faithful metric gives -1 for ``*_plus``, +1 for
    ``*_minus``), and MoRF vs LeRF."""
    names = list(results)
    gt = [truth[n] for n in names]
    first = results[names[0]]
    out: dict[str, dict[str, float]] = {}
    for m in first.curves:
        macro = spearman([results[n].aucs[m] for n in names], gt)
        micro = [spearman([results[n].curves[m][j] for n in names], gt) for j in range(len(first.sparsities))]
        out[m] = {"macro": macro, "micro": float(np.nanmean(micro)) if not all(np.isnan(micro)) else float("nan")}
    for fam in ("fid", "rfid", "ffid"):
        if f"{fam}_plus" in first.curves and f"{fam}_minus" in first.curves:
            out[f"{fam}_morf_vs_lerf"] = {"macro": spearman([results[n].aucs[f"{fam}_plus"] for n in names],
                                                             [results[n].aucs[f"{fam}_minus"] for n in names])}
    return out


# ----------------------------------------------------------------------------- replicates and verdicts
def mean_curves(replicates: Sequence[FidelityCurves]) -> FidelityCurves:
    """The curves averaged over replicates of the same images (per image, then over images)."""
    if not replicates:
        raise FidelityError("no replicate to average")
    first = replicates[0]
    if any(r.n_images != first.n_images or r.sparsities != first.sparsities for r in replicates):
        raise FidelityError("replicates must score the same images at the same sparsities")
    per = {m: np.mean([r.per_image[m] for r in replicates], axis=0) for m in first.per_image}
    return FidelityCurves(first.sparsities, {m: [float(x) for x in v.mean(0)] for m, v in per.items()}, per,
                          first.n_images)


def ranking_family(metrics: set[str] | Sequence[str]) -> str:
    """The family a ranking uses: F-Fidelity when computed, else R-Fidelity, else Fidelity."""
    metrics = set(metrics)
    for fam in ("ffid", "rfid", "fid"):
        if f"{fam}_plus" in metrics and f"{fam}_minus" in metrics:
            return fam
    raise FidelityError(f"no family with both + and - among {sorted(metrics)}")


def rank_methods(aucs: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    """Methods by F-Fid+ AUC (higher first), then F-Fid- AUC (lower first); R-Fid (then Fid) when no F-Fid."""
    fam = ranking_family({k for a in aucs.values() for k in a})
    order = sorted(aucs, key=lambda m: (-aucs[m][f"{fam}_plus"], aucs[m][f"{fam}_minus"]))
    return [{"rank": i + 1, "method": m, "by": fam, **aucs[m]} for i, m in enumerate(order)]


def seed_image_bootstrap(diffs: Any, *, n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0,
                         level: float = 0.95) -> tuple[float, float]:
    """Two-way (seeds x images) percentile bootstrap interval of the mean of ``diffs`` ``(R, N)``.

    Each of ``n_boot`` replicates draws R seed rows and, independently, N image columns with
    replacement and averages the R x N drawn cells (module docstring). A 1-D array is one seed.
    Images with a non-finite value in any seed are left out; none left gives ``(nan, nan)``.
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim == 1:
        d = d[None, :]
    d = d[:, np.isfinite(d).all(axis=0)]
    r, n = d.shape
    if r == 0 or n == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    stats = []
    for start in range(0, n_boot, 250):  # bounded memory: (250, N) image counts at a time
        b = min(250, n_boot - start)
        w_seed = rng.multinomial(r, np.full(r, 1.0 / r), size=b)  # (b, R) how often each seed is drawn
        w_img = rng.multinomial(n, np.full(n, 1.0 / n), size=b)  # (b, N) how often each image is drawn
        stats.append(np.einsum("bn,bn->b", w_seed @ d, w_img) / (r * n))
    values = np.concatenate(stats)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def is_marginal(effect: float, low: float, fraction: float | None = DEFAULT_MARGINAL) -> bool:
    """An interval above 0 whose lower bound nearly touches it: ``0 < low < fraction * effect``."""
    if not fraction or not (np.isfinite(effect) and np.isfinite(low)):
        return False
    return bool(0 < low < fraction * effect)


@dataclass(frozen=True)
class VsReference:
    """A method minus the reference map for one order (MoRF or LeRF): effect, interval, per seed."""

    effect: float
    low: float
    high: float
    by_seed: tuple[float, ...] = ()
    marginal: bool = False

    @property
    def above(self) -> bool:
        """The whole interval lies above 0."""
        return bool(self.low > 0)


def compare_to_reference(diffs: Any, *, n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0, level: float = 0.95,
                         marginal: float | None = DEFAULT_MARGINAL) -> VsReference:
    """:class:`VsReference` of paired per-image differences ``(R, N)`` (seeds x images)."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim == 1:
        d = d[None, :]
    finite = d[:, np.isfinite(d).all(axis=0)]
    effect = float(finite.mean()) if finite.size else float("nan")
    low, high = seed_image_bootstrap(d, n_boot=n_boot, seed=seed, level=level)
    by_seed = tuple(float(row.mean()) if row.size else float("nan") for row in finite)
    return VsReference(effect, low, high, by_seed, is_marginal(effect, low, marginal))


def verdict(morf: VsReference, lerf: VsReference) -> str:
    """``faithful`` / ``MoRF only`` / ``LeRF only`` / ``not above random``, with ``(marginal)``
    when an interval the verdict rests on is marginal."""
    base = {(True, True): VERDICTS[0], (True, False): VERDICTS[1], (False, True): VERDICTS[2],
            (False, False): VERDICTS[3]}[(morf.above, lerf.above)]
    shaky = (morf.above and morf.marginal) or (lerf.above and lerf.marginal)
    return base + MARGINAL_SUFFIX if shaky else base


def trust_vs_reference(curves: Mapping[str, FidelityCurves | Sequence[FidelityCurves]], reference: str = "random",
                       *, seed: int = 0, n_boot: int = DEFAULT_BOOTSTRAP,
                       marginal: float | None = DEFAULT_MARGINAL) -> dict[str, dict[str, Any]]:
    """Is each method more faithful than the ``reference`` map (a random one), on the same images?

    ``curves[method]`` is one :class:`FidelityCurves` or a sequence of them, one per replicate
    seed, in the same order for every method (module docstring: the differences ``d_ri``, their
    two-way bootstrap interval, the verdict and the marginal rule). Returns per method the
    ranking-row fields ``vs_random_{morf,lerf}`` (effect), ``..._low`` / ``..._high`` (95 %),
    ``..._by_seed`` (the effect under each replicate), ``..._marginal`` and ``verdict``; the
    reference gets ``verdict = "reference"``. Empty when ``reference`` was not scored.
    """
    if reference not in curves:
        return {}
    reps = {m: [c] if isinstance(c, FidelityCurves) else list(c) for m, c in curves.items()}
    ref = reps[reference]
    fam = ranking_family(set(ref[0].per_image))
    out: dict[str, dict[str, Any]] = {reference: {"verdict": REFERENCE_VERDICT}}
    for method, reps_m in reps.items():
        if method == reference:
            continue
        if len(reps_m) != len(ref):
            raise FidelityError(f"{method}: {len(reps_m)} replicates, the reference has {len(ref)}")
        morf = np.stack([per_image_aucs(c, f"{fam}_plus") - per_image_aucs(r, f"{fam}_plus")
                         for c, r in zip(reps_m, ref)])
        lerf = np.stack([per_image_aucs(r, f"{fam}_minus") - per_image_aucs(c, f"{fam}_minus")
                         for c, r in zip(reps_m, ref)])
        row: dict[str, Any] = {}
        for order, diffs, offset in (("morf", morf, 0), ("lerf", lerf, 1)):
            vs = compare_to_reference(diffs, n_boot=n_boot, seed=seed + offset, marginal=marginal)
            row.update({f"vs_random_{order}": vs.effect, f"vs_random_{order}_low": vs.low,
                        f"vs_random_{order}_high": vs.high, f"vs_random_{order}_by_seed": list(vs.by_seed),
                        f"vs_random_{order}_marginal": vs.marginal})
            row[order] = vs
        row["verdict"] = verdict(row.pop("morf"), row.pop("lerf"))
        out[method] = row
    return out
