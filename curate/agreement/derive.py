"""The folder's ``background`` derived from the team's answers, never from one person (issue 44).

:func:`derive_backgrounds` takes the decisions of :func:`curate.agreement.aggregate.aggregate_labels`
and writes, in this order:

1. ``label_status.parquet`` (:func:`curate.store.annotations.write_label_status`): per photo of the
   annotation table, its status (agreed | adjudicated | disputed | single | unlabelled), the
   derived background, the rule's candidate and confidence, the rule and threshold;
2. ``samples.parquet``: ``background`` = the derived background of an agreed, adjudicated or single
   photo (``background_source`` = "human": people made it), null for a disputed or unlabelled one
   (``background_source`` null), each change in ``changes.jsonl`` (actor ``agreement``).

Photos not in the annotation table keep what they had. A kill between the two writes leaves a
valid folder whose check warns that the backgrounds differ from the status (the next
``curate agreement`` derives them again). Old folders have no status file: the split reads that
as "no status recorded" and uses the folder's backgrounds as before.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from curate.agreement.aggregate import Decision
from curate.store.annotation_schema import LABEL_STATUSES, LABELLED_STATUSES
from curate.store.annotations import LabelStatus, write_label_status

__all__ = ["Derivation", "derive_backgrounds"]


@dataclass
class Derivation:
    """What :func:`derive_backgrounds` did: photos per status, samples whose background changed."""

    counts: dict[str, int] = field(default_factory=dict)
    changed: int = 0


def derive_backgrounds(ds: Any, decisions: Mapping[str, Decision], *, rule: str, threshold: float,
                       actor: str = "agreement") -> Derivation:
    """Write the label status and the derived backgrounds of ``ds`` (module docstring)."""
    known = set(ds.sample_ids())
    chosen = [d for sid, d in sorted(decisions.items()) if sid in known]
    write_label_status(ds, [LabelStatus(
        sample_id=d.sample_id, status=d.status,
        background=d.background if d.status in LABELLED_STATUSES else None, n_answers=d.n_answers, rule=rule,
        threshold=float(threshold), confidence=None if math.isnan(d.confidence) else float(d.confidence),
        candidate=d.candidate) for d in chosen])
    table = ds.table(["sample_id", "background", "background_source"])
    current = {sid: (bg, src) for sid, bg, src in zip(*(table.column(c).to_pylist() for c in table.column_names))}
    per_sample: dict[str, dict[str, Any]] = {}
    for d in chosen:
        new = d.background if d.status in LABELLED_STATUSES else None
        target = (new, "human" if new is not None else None)
        if current.get(d.sample_id) != target:
            per_sample[d.sample_id] = {"background": target[0], "background_source": target[1]}
    if per_sample:
        ds.update(list(per_sample), per_sample=per_sample, actor=actor,
                  reason=f"derived from the annotations ({rule}, threshold {threshold:g})")
    counts = Counter(d.status for d in chosen)
    return Derivation({s: counts.get(s, 0) for s in LABEL_STATUSES}, len(per_sample))
