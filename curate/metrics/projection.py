"""One direction taken out of embeddings (docs/design.md#discover): ``b = (e - (e . t) t) / ||e - (e . t) t||``.

What ``curate discover``'s ``projection`` background embeddings and ``collect inat --fill``'s
background ranking both use, to remove the class's text direction ``t`` from image embeddings ``e``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["project_out"]


def project_out(embeddings: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """``(e - (e . t) t)`` renormalised, row by row, with ``t`` the L2-normalised ``direction``."""
    e = np.asarray(embeddings, dtype=np.float64)
    t = np.asarray(direction, dtype=np.float64)
    t = t / np.linalg.norm(t)
    rest = e - np.outer(e @ t, t)
    norms = np.linalg.norm(rest, axis=1, keepdims=True)
    return (rest / np.where(norms > 0, norms, 1.0)).astype(np.float32)
