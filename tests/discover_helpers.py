"""A tiny world with a hand-made discovery run (no model), shared by the discover suites.

``discovery_world``: 2 classes x 12 synthetic photos (32 px) whose background labels are made
``model`` (so an acceptance relabels them) and the run ``discover-test`` with three proposed
groups (:data:`ACC`, :data:`REJ`, :data:`CONF`) and one that is not significant (:data:`QUIET`).
``write_run`` writes any other hand-made run into a folder.
"""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from curate.collect.synthetic import WorldSpec, classes_by_name, collect_synthetic
from curate.runs.discovery import DiscoveredGroup, DiscoveryRun
from curate.store import Dataset

ACC, REJ, CONF, QUIET = "polar-bear-g1", "black-swan-g1", "black-swan-g2", "polar-bear-g2"
PROPOSED = (ACC, REJ, CONF)
RUN = "discover-test"


def hand_made_group(gid: str, class_index: int, class_name: str, size: int, names: list[tuple[str, float]],
                    significant: bool = True, **fields: Any) -> DiscoveredGroup:
    """A group with fixed figures (acc 35 % [10, 60] vs 90 %, gap +55 [20, 80], q 0.01); ``fields`` override."""
    values: dict[str, Any] = dict(
        group_id=gid, class_index=class_index, class_name=class_name, method="masked", size=size, accuracy=0.35,
        accuracy_low=0.1, accuracy_high=0.6, rest_accuracy=0.9, gap=55.0, gap_low=20.0, gap_high=80.0,
        p_value=0.002, q_value=0.01 if significant else 0.6, significant=significant, overlap=0.8, names=names,
        exemplars=[])
    values.update(fields)
    return DiscoveredGroup(**values)


def write_run(ds: Dataset, name: str, groups: Sequence[DiscoveredGroup], member_rows: list[dict[str, Any]],
              config: dict[str, Any] | None = None) -> DiscoveryRun:
    """Write a hand-made discovery run into ``ds``'s runs/ and load it back."""
    base = {"settings": {"fdr": 0.1}, "counts": {"groups": len(groups),
                                                 "significant": sum(g.significant for g in groups)}, "classes": []}
    record = DiscoveryRun(config={**base, **(config or {})}, groups=list(groups), member_rows=member_rows)
    record.write(ds.root / "runs" / name)
    return DiscoveryRun.load(ds.root / "runs" / name)


def discovery_world(root: Path) -> tuple[Dataset, DiscoveryRun]:
    """The world and its hand-made run ``discover-test`` (module docstring)."""
    spec = WorldSpec(classes=classes_by_name(["polar bear", "black swan"]), per_class=12, image_size=32, seed=3)
    ds = collect_synthetic(root, spec, name=f"disc-{uuid.uuid4().hex[:8]}")
    ids = ds.sample_ids()
    ds.update(ids, {"background_source": "model", "background_score": 0.5}, actor="test", reason="model pre-labels")
    rows = ds.rows()
    bear = [r for r in rows if r["class_name"] == "polar bear"]
    swan = [r for r in rows if r["class_name"] == "black swan"]
    assignment = {ACC: bear[:6], QUIET: bear[6:], REJ: swan[:5], CONF: swan[5:10]}
    rng = np.random.default_rng(0)
    members = []
    for gid, group_rows in assignment.items():
        for r in group_rows:  # similarities not in file order, so the typicality order is tested
            members.append({"sample_id": r["sample_id"], "class_index": r["class_index"], "group_id": gid,
                            "similarity": float(rng.uniform(0.2, 0.9))})
    for r in swan[10:]:
        members.append({"sample_id": r["sample_id"], "class_index": r["class_index"], "group_id": None,
                        "similarity": None})
    b, s = bear[0]["class_index"], swan[0]["class_index"]
    groups = [
        hand_made_group(ACC, b, "polar bear", 6, [("a feeding station", 0.31), ("a bird feeder", 0.28)]),
        hand_made_group(QUIET, b, "polar bear", 6, [("a snowfield", 0.3)], significant=False),
        hand_made_group(REJ, s, "black swan", 5, [("a night flash", 0.27), ("a dark room", 0.22)]),
        hand_made_group(CONF, s, "black swan", 5, [("a zoo enclosure", 0.25)]),
    ]
    record = write_run(ds, RUN, groups, members, {"counts": {"groups": 4, "significant": 3}})
    return Dataset.open(ds.root), record
