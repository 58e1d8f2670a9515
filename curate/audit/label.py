"""Label noise: "the photo does not belong to the queried class" (papers/003 §2.1).

The score is cleanlab's label quality on the zero-shot probabilities of the cached CLIP
features, turned into a suspicion: ``score_i = 1 - q_i`` with ``q_i`` =
``cleanlab.rank.get_label_quality_scores(labels, pred_probs, method="self_confidence")``, i.e.
``1 - p(y_i | x_i)`` where ``p = softmax(100 * cos(f_i, w_c))`` over the label space's columns
(docs/design.md#zero-shot-classifier). ``flagged`` is ``cleanlab.filter.find_label_issues``
(confident learning, Northcutt et al. 2021), which also needs every column's class to be seen.

The probabilities are zero-shot, not out-of-sample fitted ones: cleanlab's guarantees assume
held-out predicted probabilities, which a zero-shot CLIP gives by construction (it never saw
these labels), so no cross-validation is needed.
"""
from __future__ import annotations

import logging
import warnings

import numpy as np

from curate.audit.base import AuditInputs, CheckResult, nan_scores

logger = logging.getLogger(__name__)

METHOD = "1 - cleanlab self-confidence p(label | image) of the zero-shot CLIP"


def label_check(inputs: AuditInputs, settings=None) -> CheckResult:
    """Per-sample label-noise suspicion (see the module docstring)."""
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    n = len(inputs)
    scores = nan_scores(n)
    flagged = np.zeros(n, bool)
    ok = inputs.encoded
    result = CheckResult("label", scores, METHOD, flagged=flagged)
    if inputs.probs is None or not ok.any():
        result.notes.append("no sample could be encoded; nothing scored")
        return result
    labels = inputs.label_col[ok].astype(np.int64)
    probs = inputs.probs[ok].astype(np.float64)
    probs = probs / probs.sum(axis=1, keepdims=True)
    quality = get_label_quality_scores(labels, probs, method="self_confidence")
    scores[ok] = 1.0 - quality
    seen = np.unique(labels)
    if len(seen) < 2:
        result.notes.append("one class only: cleanlab's find_label_issues needs two or more; ranking only")
        return result
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cleanlab warns about columns no sample is labelled with (1 vs 1000)
        try:
            issues = find_label_issues(labels, probs, filter_by="prune_by_noise_rate", n_jobs=1)
            flagged[np.flatnonzero(ok)[issues]] = True
        except (ValueError, IndexError) as error:  # e.g. too few samples per class
            result.notes.append(f"cleanlab find_label_issues did not run ({error}); ranking only")
    small = [int(c) for c in seen if (labels == c).sum() < 2]
    if small:
        result.notes.append(f"{len(small)} class(es) with one sample: their threshold in find_label_issues is that "
                            "sample's own confidence")
    return result
