"""Effective robustness (Taori et al. 2020; papers/003 §3 Fig. 2 and App. F Fig. 14).

Across a set of models, fit the hard-group accuracy as a linear function of the easy-group
accuracy in logit space: ``logit(hard) ~ a * logit(easy) + b`` (least squares). A model's
effective robustness is its distance above that fit in accuracy space:

    ER_i = hard_i - sigmoid(a * logit(easy_i) + b)

Positive ER: more robust than models of its accuracy usually are. Accuracies are fractions,
clipped to [1e-4, 1 - 1e-4] before the logit. The fit needs at least three models with
distinct easy accuracies (MIN_MODELS): through two points the line passes exactly and every ER
would be 0 by construction, which says nothing. Below that, ER is NaN (not 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_EPS = 1e-4
MIN_MODELS = 3


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1 - _EPS)
    return np.log(p / (1 - p))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


@dataclass(frozen=True)
class RobustnessFit:
    slope: float
    intercept: float
    n_models: int

    @property
    def defined(self) -> bool:
        return np.isfinite(self.slope) and np.isfinite(self.intercept)

    def predict(self, easy: np.ndarray) -> np.ndarray:
        """The fit's hard accuracy for easy accuracies ``easy`` (fractions)."""
        return sigmoid(self.slope * logit(easy) + self.intercept)


def fit_effective_robustness(easy: np.ndarray, hard: np.ndarray) -> RobustnessFit:
    """Least-squares line through (logit(easy), logit(hard)) over the models with both finite."""
    easy, hard = np.asarray(easy, dtype=np.float64), np.asarray(hard, dtype=np.float64)
    ok = np.isfinite(easy) & np.isfinite(hard)
    x, y = logit(easy[ok]), logit(hard[ok])
    if ok.sum() < MIN_MODELS or np.ptp(x) == 0:
        return RobustnessFit(float("nan"), float("nan"), int(ok.sum()))
    slope, intercept = np.polyfit(x, y, 1)
    return RobustnessFit(float(slope), float(intercept), int(ok.sum()))


def effective_robustness(easy: np.ndarray, hard: np.ndarray, fit: RobustnessFit | None = None) -> np.ndarray:
    """ER per model (fractions); NaN where the fit is undefined or an accuracy is missing."""
    easy, hard = np.asarray(easy, dtype=np.float64), np.asarray(hard, dtype=np.float64)
    fit = fit or fit_effective_robustness(easy, hard)
    if not fit.defined:
        return np.full(easy.shape, np.nan)
    return hard - fit.predict(easy)
