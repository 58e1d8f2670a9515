"""Object masks at scale: sources and trust, model proposals, their measurement.

- :mod:`curate.masks.sources`: where a mask came from and whether a number may use it (the one
  API every mask consumer shares);
- :mod:`curate.masks.backends`: the proposal models (CLIPSeg, SAM 3, OWLv2/Grounding DINO + SAM,
  a CLIP's own CAM), loaded offline through ``transformers``;
- :mod:`curate.masks.measure`: IoU, boundary F-score and trivial baselines against trusted masks;
- :mod:`curate.masks.tiny` / :mod:`curate.masks.train`: tiny offline models for tests and the demo.

The stage is :func:`curate.stages.propose_masks.propose_masks` (``curate propose-masks``).
"""
from __future__ import annotations

from curate.masks.sources import (
    MaskCounts,
    is_trusted,
    mask_counts,
    mask_source,
    model_status,
    trusted_rows,
)

__all__ = ["MaskCounts", "is_trusted", "mask_counts", "mask_source", "model_status", "trusted_rows"]
