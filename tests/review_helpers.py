"""Dataset folders in a review-like state, for tests/test_review_*.py (and the docs screenshot)."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from curate.collect.synthetic import (
    WorldSpec,
    assign_truth_groups,
    classes_by_name,
    collect_synthetic,
)
from curate.store import Dataset

CLASSES = ("polar bear", "black swan", "vulture")
RUN = "eval-tiny"


def review_world(root: Path, *, per_class: int = 4, image_size: int = 32, classes: tuple[str, ...] = CLASSES,
                 seed: int = 0, with_run: bool = True) -> Dataset:
    """A synthetic world put in the state a review starts from.

    Per class (``per_class`` >= 4): sample 0 is a candidate, sample 1 has no background,
    sample 2 a low-confidence model background and a model mask to review, the rest stay as
    generated (accepted, synthetic background and mask); sample 3 of the first class has a
    confident model background tagged ``review:background``. Groups come from the ground truth;
    one free tag on the first sample; an evaluation run ``eval-tiny`` whose top-1 is wrong on
    every second sample.
    """
    spec = WorldSpec(classes=classes_by_name(list(classes)), per_class=per_class, image_size=image_size, seed=seed)
    ds = collect_synthetic(root, spec, name=Path(root).name)
    assign_truth_groups(ds)
    rows = ds.rows()
    per_sample: dict[str, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        k = i % per_class
        if k == 0:
            per_sample[row["sample_id"]] = {"status": "candidate"}
        elif k == 1:
            per_sample[row["sample_id"]] = {"background": None, "background_source": None, "background_score": None}
        elif k == 2:
            per_sample[row["sample_id"]] = {"background_source": "model", "background_score": 0.25 + 0.01 * i,
                                            "mask_status": "model"}
    per_sample.setdefault(rows[0]["sample_id"], {})["tags"] = ["first"]
    # a confident model label that `curate label-backgrounds` still flagged for review
    per_sample.setdefault(rows[3]["sample_id"], {}).update(
        background_source="model", background_score=0.8, tags=["review:background"])
    if not any(r["group"] == "hard" for r in rows):
        per_sample.setdefault(rows[-1]["sample_id"], {})["group"] = "hard"
    ds.update(list(per_sample), per_sample=per_sample, actor="test", reason="review-like state")
    if with_run:
        write_run(ds, RUN)
    return ds


def write_run(ds: Dataset, name: str) -> Path:
    """A fake evaluation run (a real EvaluationRun record): top-1 wrong (the next class) on odd
    rows and on hard ones, right elsewhere."""
    from curate.runs import EvaluationRun

    rows = ds.rows()
    classes = [r["class_index"] for r in rows]
    wrong = [i % 2 == 1 or r["group"] == "hard" for i, r in enumerate(rows)]
    labels = [[(c + 1) % 1000 if w else c, (c + 2) % 1000] for c, w in zip(classes, wrong)]
    table = pa.table({
        "sample_id": pa.array([r["sample_id"] for r in rows], pa.string()),
        "class_index": pa.array(classes, pa.int32()),
        "group": pa.array([r["group"] for r in rows], pa.string()),
        "background": pa.array([r["background"] for r in rows], pa.string()),
        "topk_labels": pa.array(labels, pa.list_(pa.int32())),
        "topk_scores": pa.array([[0.8, 0.1]] * len(rows), pa.list_(pa.float32())),
        "correct1": pa.array([lab[0] == c for lab, c in zip(labels, classes)], pa.bool_()),
        "correct5": pa.array([c in lab for lab, c in zip(labels, classes)], pa.bool_()),
    })
    record = EvaluationRun(model={"name": "tiny", "model_id": "tiny", "family": "clip"}, label_space={"name": "imagenet1k"},
                           prompts={"name": "simple"}, settings={}, dataset={"samples": len(rows)}, metrics={},
                           predictions_table=table)
    run_dir = ds.root / "runs" / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    record.write(run_dir)
    return run_dir


def table_of(root: Path) -> list[dict[str, Any]]:
    """samples.parquet as rows keyed by nothing (for before/after comparisons)."""
    return pq.read_table(Path(root) / "samples.parquet").to_pylist()


def changed_fields(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, set[str]]:
    """sample_id -> the columns whose value differs between two reads of samples.parquet."""
    old = {r["sample_id"]: r for r in before}
    out: dict[str, set[str]] = {}
    for row in after:
        prev = old.get(row["sample_id"])
        if prev is None:
            out[row["sample_id"]] = {"<added>"}
            continue
        diff = {k for k in row if row[k] != prev.get(k)}
        if diff:
            out[row["sample_id"]] = diff
    return out


def square_mask(height: int, width: int, top: int, left: int, size: int) -> np.ndarray:
    mask = np.zeros((height, width), np.uint8)
    mask[top:top + size, left:left + size] = 1
    return mask


def write_audit_run(ds: Dataset, name: str, scores: dict[str, np.ndarray], *, tag_top: int = 0) -> Path:
    """An audit run written through :class:`curate.runs.AuditRun` with the given per-check scores
    (aligned with ``ds.rows()``, NaN = not scored); with ``tag_top``, the ``tag_top`` highest of
    each check are pre-tagged ``suspect:<check>`` in the folder (replacing those tags), as ``curate audit`` does."""
    from curate.runs import AuditRun

    rows = ds.rows()
    ids = [r["sample_id"] for r in rows]
    columns: dict[str, Any] = {"sample_id": pa.array(ids, pa.string()),
                               "class_index": pa.array([r["class_index"] for r in rows], pa.int32())}
    replaced = {f"suspect:{check}" for check in scores}  # like curate audit: the checks run are re-tagged
    tags = {sid: [t for t in (r["tags"] or []) if t not in replaced] for sid, r in zip(ids, rows)}
    for check, values in scores.items():
        values = np.asarray(values, dtype=np.float64)
        order = np.argsort(-np.nan_to_num(values, nan=-np.inf), kind="stable")
        rank = np.full(len(ids), -1, np.int64)
        rank[order] = np.arange(1, len(ids) + 1)
        rank[np.isnan(values)] = -1
        tagged = np.zeros(len(ids), bool)
        tagged[[i for i in order[:tag_top] if np.isfinite(values[i])]] = True
        for i in np.flatnonzero(tagged):
            tags[ids[i]].append(f"suspect:{check}")
        columns[f"{check}_score"] = pa.array([None if np.isnan(v) else float(v) for v in values], pa.float64())
        columns[f"{check}_rank"] = pa.array(rank, pa.int64())
        columns[f"{check}_flagged"] = pa.array(tagged, pa.bool_())
        columns[f"{check}_tagged"] = pa.array(tagged, pa.bool_())
    if tag_top:
        changed = {sid: {"tags": t} for sid, t, r in zip(ids, tags.values(), rows) if t != list(r["tags"] or [])}
        ds.update(list(changed), per_sample=changed, actor="audit:" + name, reason="suspect pre-tags (test)")
    record = AuditRun(model=None, settings={}, dataset={"name": ds.name, "samples": len(ids)}, checks=list(scores),
                      results={"checks": {}}, scores_table=pa.table(columns))
    return record.write(ds.root / "runs" / name)


def propose(ds: Dataset, sample_id: str, mask: np.ndarray, score: float, *, model: str = "tiny@abc",
            run: str = "masks-tiny") -> None:
    """What ``curate propose-masks`` leaves on a sample: the proposal as its mask with
    ``mask_status = model:<model>`` (actor ``propose-masks:<model>``), and ``mask_score`` /
    ``mask_run`` merged into its ``extra``."""
    import json

    from curate.masks.sources import MASK_RUN_KEY, MASK_SCORE_KEY, model_status

    ds.set_mask(sample_id, mask, mask_status=model_status(model), actor=f"propose-masks:{model}",
                reason=f"mask proposal (run {run})")
    extra = json.loads(ds.row(sample_id)["extra"] or "{}")
    ds.update(sample_id, {"extra": {**extra, MASK_SCORE_KEY: float(score), MASK_RUN_KEY: run}},
              actor=f"propose-masks:{model}", reason=f"mask proposal (run {run})")


#: Scores of :func:`proposal_world`'s proposals, in file order (not sorted, so an order can fail).
PROPOSAL_SCORES: tuple[float, ...] = (0.9, 0.3, 0.6, 0.15, 0.75, 0.45)


def proposal_world(root: Path, **kwargs: Any) -> tuple[Dataset, list[str]]:
    """:func:`review_world` where six samples (those without a bare ``model`` mask status, in file
    order) lost their synthetic mask and got a model proposal (a square, unlike the animal's
    mask) scored :data:`PROPOSAL_SCORES`. Returns the dataset and the six ids in that order."""
    ds = review_world(root, **kwargs)
    rows = [r for r in ds.rows() if r["mask_status"] != "model"][:len(PROPOSAL_SCORES)]
    ids = [r["sample_id"] for r in rows]
    for i, (row, score) in enumerate(zip(rows, PROPOSAL_SCORES)):
        ds.set_mask(row["sample_id"], None, actor="test", reason="no exact mask here")
        propose(ds, row["sample_id"], square_mask(row["height"], row["width"], 2 + i, 3, 12 + i), score)
    return ds, ids
