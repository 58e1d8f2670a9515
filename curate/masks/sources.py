"""Where a sample's object mask came from, and whether a mask-based number may use it: the
vocabulary of the ``mask_status`` column, which lives in :mod:`curate.store.mask_sources` (the
dataset folder's floor, below every package that reads masks: docs/design.md#architecture).
This name is kept for the callers that know it; new code imports from the store."""
from __future__ import annotations

from curate.store.mask_sources import (
    EXACT_STATUSES,
    HUMAN_STATUSES,
    MASK_RUN_KEY,
    MASK_SCORE_KEY,
    MODEL_PREFIX,
    REJECTED_STATUS,
    SOURCES,
    MaskCounts,
    ProposalInfo,
    is_trusted,
    mask_counts,
    mask_source,
    model_id_of,
    model_status,
    proposal_of,
    proposal_run,
    proposal_score,
    row_extra,
    trusted_rows,
    untrusted_masks_message,
    usable_mask,
)

__all__ = [
    "EXACT_STATUSES", "HUMAN_STATUSES", "MODEL_PREFIX", "REJECTED_STATUS", "MASK_SCORE_KEY", "MASK_RUN_KEY",
    "SOURCES", "MaskCounts", "ProposalInfo", "mask_source", "model_status", "model_id_of", "is_trusted", "trusted_rows",
    "mask_counts", "untrusted_masks_message", "usable_mask", "row_extra", "proposal_score", "proposal_run", "proposal_of",
]
