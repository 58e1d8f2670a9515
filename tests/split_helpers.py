"""Shared by the split suites: per-cell outcome tables built by hand."""
from __future__ import annotations

import numpy as np


def table(*cells):
    """cells: (class, background, [0/1 outcomes]) -> classes, backgrounds, correct."""
    classes, backgrounds, correct = [], [], []
    for c, b, outcomes in cells:
        classes += [c] * len(outcomes)
        backgrounds += [b] * len(outcomes)
        correct += list(outcomes)
    return np.array(classes), np.array(backgrounds, dtype=object), np.array(correct, dtype=float)


def by_class(splits):
    """``{class_index: split}`` of a list of class splits."""
    return {s.class_index: s for s in splits}
