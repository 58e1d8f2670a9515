"""Obscurity: "photos belong to more than one object class" (papers/003 §2.1).

Chosen definition: the probability mass the zero-shot CLIP puts on the strongest *other*
class, capped by the mass it keeps on the labelled one,

    score_i = min( p(y_i | x_i),  max_{c != y_i} p(c | x_i) )

with ``p`` the zero-shot softmax over the label space (as for label noise). A photo showing
the labelled animal and a second one splits the mass between the two, so both terms are large;
a clean photo has a small second term; a wrong label (the other class takes nearly all the
mass) has a small first term, which leaves it to the label check.

Why not the prompt set "a photo of a {c1} and a {c2}": it needs ``C^2`` text prompts (a million
over ImageNet-1K), and CLIPs trained on single-subject captions (the reference CLIP was trained
only on "a photo of a {c}.") score compositional prompts poorly; the margin reuses the
classifier the label check already built and costs no text encoding.
"""
from __future__ import annotations

import numpy as np

from curate.audit.base import AuditInputs, CheckResult, nan_scores

METHOD = "min(p(label), p(strongest other class)) of the zero-shot CLIP (top-2 mass, not pair prompts)"


def obscurity_scores(probs: np.ndarray, label_col: np.ndarray) -> np.ndarray:
    """``min(p_y, max_{c != y} p_c)`` per row (see the module docstring)."""
    probs = np.asarray(probs, dtype=np.float64)
    rows = np.arange(len(probs))
    p_label = probs[rows, label_col]
    others = probs.copy()
    others[rows, label_col] = -np.inf
    return np.minimum(p_label, others.max(axis=1))


def obscurity_check(inputs: AuditInputs, settings=None) -> CheckResult:
    scores = nan_scores(len(inputs))
    ok = inputs.encoded
    result = CheckResult("obscurity", scores, METHOD)
    if inputs.probs is None or not ok.any():
        result.notes.append("no sample could be encoded; nothing scored")
        return result
    if inputs.probs.shape[1] < 2:
        result.notes.append("a label space of one class has no second class; nothing scored")
        return result
    scores[ok] = obscurity_scores(inputs.probs[ok], inputs.label_col[ok])
    return result
