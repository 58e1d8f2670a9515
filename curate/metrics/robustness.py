"""Effective robustness (Taori et al. 2020, as used by papers/003 §1 Fig. 2 and App. F Fig. 14).

Across a set of models of ONE family, fit the hard-group accuracy as a linear function of the
easy-group accuracy, on a chosen scale ``s`` (``logit`` by default, as Taori et al.; ``linear``
on request): ``s(hard) ~ a * s(easy) + b`` (least squares). A model's effective robustness is
its distance above that fit, in accuracy space:

    ER_i = hard_i - s^-1(a * s(easy_i) + b)

Positive ER: more robust than models of its accuracy and family usually are. Families are
fitted separately, as papers/003 Fig. 2 fits CLIPs and ImageNet models separately: models with
different training data follow different easy-vs-hard lines (Shi et al. 2023, cited by
papers/003), so one pooled line would measure the family, not the model. The scale matters: it
can flip the sign of a model's ER (measured on the paper's Table 2 models, see
``tests/test_compare.py``), so it is recorded beside every figure.

Accuracies are fractions, clipped to [1e-4, 1 - 1e-4] before the logit. The fit needs at least
three models with distinct easy accuracies (:data:`MIN_MODELS`): through two points the line
passes exactly and every ER would be 0 by construction, which says nothing. Below that, ER is
NaN (not 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from curate.metrics.info import MetricInfo

__all__ = ["SCALES", "MIN_MODELS", "RobustnessFit", "fit_effective_robustness", "effective_robustness",
           "EFFECTIVE_ROBUSTNESS_INFO", "logit", "sigmoid"]

_EPS = 1e-4
MIN_MODELS = 3
#: The fit is undefined when the models' easy accuracies (on the fit's scale) spread less than this
#: fraction of their size: a line through points that differ only by rounding (0.05 and
#: 0.05000000000000001, found by the property test) is rounding, not a trend.
MIN_RELATIVE_SPREAD = 1e-9
SCALES = ("logit", "linear")

EFFECTIVE_ROBUSTNESS_INFO = MetricInfo(
    name="effective robustness",
    formula="hard - s^-1(a * s(easy) + b), (a, b) fitted by least squares over the models of one family; s = logit or identity",
    higher_is_better=True,
    paper="Taori et al. 2020; papers/003 §1 Fig. 2, App. F",
    nan_reasons=("fewer than 3 models of the family with distinct easy accuracies", "a missing accuracy"),
)


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1 - _EPS)
    return np.log(p / (1 - p))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def _check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ValueError(f"effective-robustness scale {scale!r} is not one of {', '.join(SCALES)}")
    return scale


def _forward(p: np.ndarray, scale: str) -> np.ndarray:
    return logit(p) if scale == "logit" else np.asarray(p, dtype=np.float64)


def _inverse(x: np.ndarray, scale: str) -> np.ndarray:
    return sigmoid(x) if scale == "logit" else np.asarray(x, dtype=np.float64)


@dataclass(frozen=True)
class RobustnessFit:
    slope: float
    intercept: float
    n_models: int
    scale: str = "logit"

    @property
    def defined(self) -> bool:
        return bool(np.isfinite(self.slope) and np.isfinite(self.intercept))

    def predict(self, easy: np.ndarray) -> np.ndarray:
        """The fit's hard accuracy for easy accuracies ``easy`` (fractions)."""
        return _inverse(self.slope * _forward(easy, self.scale) + self.intercept, self.scale)


def fit_effective_robustness(easy: np.ndarray, hard: np.ndarray, scale: str = "logit") -> RobustnessFit:
    """Least-squares line through (s(easy), s(hard)) over the models with both accuracies finite;
    undefined (NaN) below :data:`MIN_MODELS` models or when s(easy) does not spread
    (:data:`MIN_RELATIVE_SPREAD`)."""
    _check_scale(scale)
    easy, hard = np.asarray(easy, dtype=np.float64), np.asarray(hard, dtype=np.float64)
    ok = np.isfinite(easy) & np.isfinite(hard)
    x, y = _forward(easy[ok], scale), _forward(hard[ok], scale)
    if ok.sum() < MIN_MODELS or np.ptp(x) <= MIN_RELATIVE_SPREAD * max(1.0, float(np.abs(x).max())):
        return RobustnessFit(float("nan"), float("nan"), int(ok.sum()), scale)
    slope, intercept = np.polyfit(x, y, 1)
    return RobustnessFit(float(slope), float(intercept), int(ok.sum()), scale)


def effective_robustness(easy: np.ndarray, hard: np.ndarray, fit: RobustnessFit | None = None,
                         scale: str = "logit") -> np.ndarray:
    """ER per model (fractions); NaN where the fit is undefined or an accuracy is missing."""
    easy, hard = np.asarray(easy, dtype=np.float64), np.asarray(hard, dtype=np.float64)
    fit = fit or fit_effective_robustness(easy, hard, scale)
    if not fit.defined:
        return np.full(easy.shape, np.nan)
    return hard - fit.predict(easy)
