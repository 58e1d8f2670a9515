"""Dataset folders in a review-like state, for tests/test_review_*.py (and the docs screenshot)."""
from __future__ import annotations

import io
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
from curate.runs import create_run, write_bytes
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
    """A fake evaluation run: top-1 wrong (the next class) on odd rows and on hard ones, right elsewhere."""
    rows = ds.rows()
    classes = [r["class_index"] for r in rows]
    wrong = [i % 2 == 1 or r["group"] == "hard" for i, r in enumerate(rows)]
    labels = [[(c + 1) % 1000 if w else c, (c + 2) % 1000] for c, w in zip(classes, wrong)]
    run_dir = create_run(ds.root, name, {"kind": "evaluate", "model": {"name": "tiny"}}, overwrite=True)
    table = pa.table({
        "sample_id": pa.array([r["sample_id"] for r in rows], pa.string()),
        "topk_labels": pa.array(labels, pa.list_(pa.int32())),
        "topk_scores": pa.array([[0.8, 0.1]] * len(rows), pa.list_(pa.float32())),
        "correct1": pa.array([lab[0] == c for lab, c in zip(labels, classes)], pa.bool_()),
    })
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    write_bytes(run_dir / "predictions.parquet", buffer.getvalue())
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
