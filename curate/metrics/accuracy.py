"""Accuracy metrics of papers/003 App. C.3 (and App. F for unbalanced accuracy and top-5).

Notation: ``correct[i]`` is 1{y_hat_i = y_i} (or, for top-k, 1{y_i in top-k_i}) and ``classes[i]``
is the true class of image i.

- class-wise accuracy ``ACC(c) = mean_{i: y_i = c} correct[i]``;
- balanced accuracy = mean over the classes present of ACC(c) (the paper's default, App. C.3);
- unbalanced accuracy = mean over images of correct[i] (App. F, Tables 17-18);
- drop = ACC_easy - ACC_hard, per class, and at the dataset level the mean of the per-class
  drops over the classes that have images in both groups (App. C.3);
- mean per-class recall = balanced top-1 accuracy over the classes present in the targets
  (what CLIP_benchmark reports via sklearn's ``balanced_accuracy_score``).

Direction: higher is better for accuracies; a larger drop means more reliance on the
background. Undefined cases (no images) give NaN, never 0.
"""
from __future__ import annotations

import numpy as np

from curate.metrics.info import MetricInfo

BALANCED_ACCURACY_INFO = MetricInfo(
    "balanced accuracy", "mean over classes c of mean_{i: y_i = c} 1[y_hat_i = y_i]", True, "papers/003 App. C.3",
    ("no image of any class",))
UNBALANCED_ACCURACY_INFO = MetricInfo(
    "unbalanced accuracy", "mean over images of 1[y_hat_i = y_i]", True, "papers/003 App. F", ("no image",))
DROP_INFO = MetricInfo(
    "drop", "mean over classes with images in both groups of ACC_easy(c) - ACC_hard(c)", None, "papers/003 App. C.3",
    ("no class with images in both easy and hard",))


def topk_correct(topk_labels: np.ndarray, targets: np.ndarray, k: int) -> np.ndarray:
    """Bool (N,): whether ``targets[i]`` is among the first ``k`` columns of ``topk_labels[i]``."""
    topk_labels = np.asarray(topk_labels)
    if topk_labels.ndim != 2 or topk_labels.shape[0] != len(targets):
        raise ValueError(f"topk_labels must be (N, K) with N = {len(targets)}, got {topk_labels.shape}")
    if k > topk_labels.shape[1]:
        raise ValueError(f"asked for top-{k} but only {topk_labels.shape[1]} predictions are stored")
    return (topk_labels[:, :k] == np.asarray(targets)[:, None]).any(axis=1)


def class_accuracies(correct: np.ndarray, classes: np.ndarray) -> dict[int, tuple[float, int]]:
    """``{class: (ACC(class), n)}`` over the classes present (App. C.3, class-wise accuracy)."""
    correct = np.asarray(correct, dtype=np.float64)
    classes = np.asarray(classes)
    out: dict[int, tuple[float, int]] = {}
    for c in np.unique(classes):
        sel = classes == c
        out[int(c)] = (float(correct[sel].mean()), int(sel.sum()))
    return out


def balanced_accuracy(correct: np.ndarray, classes: np.ndarray) -> float:
    """Mean over classes present of the class-wise accuracy; NaN when there are no images."""
    per_class = class_accuracies(correct, classes)
    return float(np.mean([acc for acc, _ in per_class.values()])) if per_class else float("nan")


def unbalanced_accuracy(correct: np.ndarray) -> float:
    """Mean over images; NaN when there are none."""
    correct = np.asarray(correct, dtype=np.float64)
    return float(correct.mean()) if correct.size else float("nan")


def mean_per_class_recall(predictions: np.ndarray, targets: np.ndarray) -> float:
    """Balanced top-1 accuracy over the classes present in ``targets`` (= sklearn's
    ``balanced_accuracy_score``, as CLIP_benchmark reports it)."""
    return balanced_accuracy(np.asarray(predictions) == np.asarray(targets), targets)


def class_drops(
    correct: np.ndarray, classes: np.ndarray, groups: np.ndarray
) -> dict[int, tuple[float, float, float, int, int]]:
    """``{class: (ACC_easy, ACC_hard, drop, n_easy, n_hard)}``; NaN where a group is empty."""
    correct = np.asarray(correct, dtype=np.float64)
    classes, groups = np.asarray(classes), np.asarray(groups, dtype=object)
    out = {}
    for c in np.unique(classes[np.isin(groups, ["easy", "hard"])]):
        easy = (classes == c) & (groups == "easy")
        hard = (classes == c) & (groups == "hard")
        acc_e = float(correct[easy].mean()) if easy.any() else float("nan")
        acc_h = float(correct[hard].mean()) if hard.any() else float("nan")
        out[int(c)] = (acc_e, acc_h, acc_e - acc_h, int(easy.sum()), int(hard.sum()))
    return out


def mean_drop(correct: np.ndarray, classes: np.ndarray, groups: np.ndarray) -> float:
    """Dataset-level drop: the mean of per-class drops over classes with both groups (App. C.3)."""
    drops = [d for _, _, d, ne, nh in class_drops(correct, classes, groups).values() if ne and nh]
    return float(np.mean(drops)) if drops else float("nan")
