"""The saliency methods of papers/004 (Tables 1-4, 8-9): formulas on batched tensors.

Notation: ``A`` the layer's activations and ``G = d y_c / d A`` the gradient of the target
score ``y_c``, both ``(N, C, h, w)`` (tokens already reshaped to the patch grid, see
:mod:`curate.saliency.layers`); ``Z = h * w``. Every map is then ``ReLU``-ed, resized
bilinearly to the input and min-max normalised (pytorch-grad-cam's ``scale_cam_image``).

=============  ==============================================================  ==============
method         map                                                             reference
=============  ==============================================================  ==============
gradcam        ``sum_k a_k A_k``, ``a_k = 1/Z sum_ij G_kij``                   Selvaraju 2017
gradcam++      ``a_k = sum_ij relu(G_kij) alpha_kij``,                          Chattopadhay
               ``alpha = G^2 / (2 G^2 + sum_ij A_k * G^3 + eps)`` (0 where G=0)  2018, eq. 19
xgradcam       ``a_k = sum_ij G_kij A_kij / (sum_ij A_kij + eps)``              Fu 2020
layercam       ``sum_k relu(G_k) * A_k`` (element-wise weights)                 Jiang 2021
eigencam       projection of ``A`` on its first principal component           Muhammad 2020
               (per image, pixels as samples, channels centred); ignores the
               target
eigengradcam   the same projection of ``G * A``                                pytorch-grad-cam
scorecam       ``a_k = softmax_k y_c(x * norm(up(A_k))))``                      Wang 2020
ablationcam    ``a_k = (y_c - y_c(A with channel k ablated)) / y_c``            Desai 2020
fullgrad       ``|x * dy/dx|`` + sum over biased conv/BN layers of              Srinivas 2019
               ``|b * dy/dz|`` (each channel min-max normalised, summed)
rollout        ``R = prod_l norm((mean_heads(P_l) + I) / 2)``, row of the class  Abnar 2020
               token over the patches; ignores the target
grad-rollout   as rollout with ``mean_heads(relu(P_l * dy/dP_l))``             Gildenblat
                                                                               (vit-explain)
=============  ==============================================================  ==============

The method table (name, family, gradients, default layer rule, paper) is
:data:`curate.saliency.registry.METHODS`, importable without torch.

Default layers (any other can be named with ``layer=``; :mod:`curate.saliency.layers`):

- gradcam, gradcam++, xgradcam, layercam, eigencam, eigengradcam, scorecam, ablationcam: one
  layer; by default the last block's first norm (``ln_1`` / ``norm1``) for a ViT, and for a
  CNN the last stage whose map has at least 4 cells per side (``layer4`` of a ResNet at 224 px;
  ``layer2`` of the 48 px reference CLIP, whose ``layer4`` is 1 x 1);
- fullgrad: every ``Conv2d`` / ``BatchNorm2d`` with a bias in the image tower, plus the input
  (no ``layer``);
- rollout, grad-rollout: every attention block of a ViT (no ``layer``).

EigenCAM's sign: an SVD fixes the principal direction only up to sign, and pytorch-grad-cam's
``EigenCAM`` keeps whatever LAPACK returns (its map can come out inverted and then mostly
clipped by the ReLU). curate flips the projection when ``|min| > |max|`` (the sign correction
of Seg-Eigen-CAM, Chung & Ying 2025, which pytorch-grad-cam ships as
``get_2d_projection_with_sign_correction``), so the salient side is positive.
"""
from __future__ import annotations

import torch

# the method table lives in the torch-free registry; re-exported here for older imports
from curate.saliency.registry import ALIASES, METHODS, MethodInfo, method_info  # noqa: F401


# ---------------------------------------------------------------------------- gradient CAMs
def gradcam(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Grad-CAM: ``sum_k mean_ij(G_k) A_k`` -> ``(N, h, w)`` (before ReLU)."""
    weights = g.mean(dim=(2, 3), keepdim=True)
    return (weights * a).sum(dim=1)


def gradcam_pp(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Grad-CAM++ (Chattopadhay et al. 2018, eq. 19), as pytorch-grad-cam computes it."""
    g2 = g * g
    g3 = g2 * g
    sum_a = a.sum(dim=(2, 3), keepdim=True)
    alpha = g2 / (2 * g2 + sum_a * g3 + 1e-6)
    alpha = torch.where(g != 0, alpha, torch.zeros_like(alpha))
    weights = (g.clamp(min=0) * alpha).sum(dim=(2, 3), keepdim=True)
    return (weights * a).sum(dim=1)


def xgradcam(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """XGrad-CAM: ``a_k = sum_ij G A / (sum_ij A + 1e-7)``."""
    sum_a = a.sum(dim=(2, 3), keepdim=True)
    weights = (g * a / (sum_a + 1e-7)).sum(dim=(2, 3), keepdim=True)
    return (weights * a).sum(dim=1)


def layercam(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """LayerCAM: ``sum_k relu(G_k) * A_k``."""
    return (g.clamp(min=0) * a).sum(dim=1)


def first_component(x: torch.Tensor, sign_correction: bool = True) -> torch.Tensor:
    """Per image, ``X (C, h, w)`` projected on its first principal direction -> ``(N, h, w)``.

    Pixels are the samples and channels the features; channels are centred over the pixels
    (as pytorch-grad-cam's ``get_2d_projection``). Batched SVD on the device. With
    ``sign_correction`` the projection is negated where ``|min| > |max|`` (module docstring).
    """
    x = torch.nan_to_num(x.float(), nan=0.0, posinf=0.0, neginf=0.0)
    n, c, h, w = x.shape
    rows = x.reshape(n, c, h * w).transpose(1, 2)  # (N, Z, C)
    rows = rows - rows.mean(dim=1, keepdim=True)
    try:
        _, _, vh = torch.linalg.svd(rows, full_matrices=False)
    except RuntimeError:  # ill-conditioned on some backends: do it on the CPU in float64
        _, _, vh = torch.linalg.svd(rows.double().cpu(), full_matrices=False)
        vh = vh.to(rows.device, rows.dtype)
    projection = (rows @ vh[:, 0, :].unsqueeze(-1)).squeeze(-1)  # (N, Z)
    if sign_correction:
        flip = projection.min(dim=1).values.abs() > projection.max(dim=1).values.abs()
        projection = torch.where(flip.unsqueeze(1), -projection, projection)
    return projection.reshape(n, h, w)


def eigencam(a: torch.Tensor, sign_correction: bool = True) -> torch.Tensor:
    """EigenCAM: first principal component of the activations (target ignored)."""
    return first_component(a, sign_correction)


def eigengradcam(a: torch.Tensor, g: torch.Tensor, sign_correction: bool = True) -> torch.Tensor:
    """EigenGradCAM: first principal component of ``G * A``."""
    return first_component(g * a, sign_correction)


GRADIENT_CAMS = {
    "gradcam": gradcam,
    "gradcam++": gradcam_pp,
    "xgradcam": xgradcam,
    "layercam": layercam,
    "eigengradcam": eigengradcam,
}


# ---------------------------------------------------------------------------- post-processing
def minmax(maps: torch.Tensor) -> torch.Tensor:
    """pytorch-grad-cam's ``scale_cam_image`` normalisation over the last two dims:
    ``(m - min) / (1e-7 + max(m - min))``."""
    flat = maps.flatten(-2)
    shifted = flat - flat.min(dim=-1, keepdim=True).values
    scaled = shifted / (1e-7 + shifted.max(dim=-1, keepdim=True).values)
    return scaled.reshape(maps.shape)


def finish_maps(cams: torch.Tensor, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, K, h, w)`` raw maps -> ``(N, K, H, W)`` in [0, 1] and the ``(N, K)`` "constant" flags.

    ReLU, min-max, bilinear resize (``align_corners=False``, what ``cv2.resize`` does), min-max
    again: pytorch-grad-cam's ``compute_cam_per_layer`` + ``aggregate_multi_layers``.
    """
    import torch.nn.functional as F

    cams = cams.float().clamp(min=0)  # NaN stays NaN: the metrics report it as "nonfinite_map"
    flat = cams.flatten(-2)
    spread = flat.max(dim=-1).values - flat.min(dim=-1).values
    constant = spread == 0
    n, k, h, w = cams.shape
    scaled = minmax(cams)
    if (h, w) != tuple(size):
        scaled = F.interpolate(scaled.reshape(n * k, 1, h, w), size=tuple(size), mode="bilinear",
                               align_corners=False).reshape(n, k, *size)
    return minmax(scaled), constant
