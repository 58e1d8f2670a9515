"""Outliers: photos unlike the rest of the collection (cleanlab's out-of-distribution score).

``cleanlab.outlier.OutOfDistribution().fit_score(features=E)`` on the cached, L2-normalised
CLIP embeddings: for each image the average cosine distance to its ``k`` nearest neighbours,
mapped to a score in (0, 1] with lower = more atypical (Kuan & Mueller 2022). The suspicion is
``1 - score``. Outliers have no reviewer reason of their own; they are measured against any
rejection (docs/design.md#audit).
"""
from __future__ import annotations

import numpy as np

from curate.audit.base import AuditInputs, CheckResult, nan_scores

METHOD = "1 - cleanlab OutOfDistribution score (mean cosine distance to the k nearest embeddings)"
DEFAULT_K = 10


def outlier_scores(embeddings: np.ndarray, k: int = DEFAULT_K) -> np.ndarray:
    """``1 - cleanlab`` OOD score per row (needs at least 2 rows).

    cleanlab's neighbour search is scikit-learn's brute force, which works in chunks of up to
    ``working_memory`` MiB (1 GiB by default): at 13,000 embeddings that took 1.7 GiB more peak
    memory than the rest of the audit (benchmarks/rehearsal.py). 64 MiB chunks give the same scores
    with 350 MiB (and were faster: 18.5 vs 57.9 s wall on 2 shared cores)."""
    import sklearn
    from cleanlab.outlier import OutOfDistribution

    k = max(1, min(int(k), len(embeddings) - 1))
    ood = OutOfDistribution(params={"k": k})
    with sklearn.config_context(working_memory=64):
        return 1.0 - ood.fit_score(features=np.ascontiguousarray(embeddings, dtype=np.float32), verbose=False)


def outliers_check(inputs: AuditInputs, settings=None) -> CheckResult:
    scores = nan_scores(len(inputs))
    ok = inputs.encoded
    result = CheckResult("outliers", scores, METHOD)
    if ok.sum() < 3:
        result.notes.append("fewer than 3 encoded samples: no neighbours to compare with; nothing scored")
        return result
    k = getattr(settings, "outlier_k", DEFAULT_K)
    scores[ok] = outlier_scores(inputs.embeddings[ok], k)
    result.detail["k"] = int(min(k, ok.sum() - 1))
    return result
