"""Small dataset folders for the publish and report tests: tiny images and masks, mixed licences,
a split run, evaluation runs and an explain run written in the formats curate's stages write.
Imported by tests/test_publish*.py and tests/test_report.py."""
from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from curate.runs import create_run, write_json
from curate.store import Dataset, NewSample

#: ImageNet-1K: ostrich, and the two classes named "missile" (657, 744).
CLASSES = (9, 657, 744)
BACKGROUNDS = ("grass", "water", "snow")
EASY, HARD = "grass", "water"
TOKEN = "hf_SECRETtoken0123456789abcdef"


def image_bytes(seed: int, size: int = 12, fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def mask_array(seed: int, size: int = 12) -> np.ndarray:
    mask = np.zeros((size, size), dtype=np.uint8)
    k = 2 + seed % 4
    mask[k:k + 5, k:k + 5] = 1
    return mask


def make_dataset(root: Path, *, per_group: int = 3, licences: Sequence[Any] | None = None, name: str = "pubtest",
                 split_run: bool = True) -> Dataset:
    """Per class: ``per_group`` easy (grass) and hard (water) accepted images, one accepted image on
    snow outside the split, one rejected and one candidate. Licences cycle through ``licences``
    (default: all CC BY); every other image has a mask; JPEG and PNG alternate."""
    licences = list(licences) if licences is not None else ["cc-by"]
    ds = Dataset.create(root, name=name, backgrounds=list(BACKGROUNDS))
    items, n = [], 0
    for c in CLASSES:
        plan = [("easy", EASY, "accepted")] * per_group + [("hard", HARD, "accepted")] * per_group
        plan += [(None, "snow", "accepted"), (None, EASY, "rejected"), (None, HARD, "candidate")]
        for group, background, status in plan:
            fmt = "JPEG" if n % 2 else "PNG"
            items.append(NewSample(
                image=image_bytes(1000 + n, fmt=fmt), class_index=c, source="inat", source_id=str(5000 + n),
                source_url=f"https://example.org/photos/{5000 + n}.jpg", license=licences[n % len(licences)],
                attribution=f"(c) photographer {n}", status=status, group=group, background=background,
                background_source="human", mask=mask_array(n) if n % 2 == 0 else None,
                mask_status="reviewed" if n % 2 == 0 else None,
                reject_reason="clarity" if status == "rejected" else None, tags=["seen"] if n % 3 == 0 else [],
                extra={"observation_id": n, "location": "51.5,-0.1", "place": "somewhere"},
            ))
            n += 1
    report = ds.add_samples(items)
    assert not report.quarantined, report.quarantined
    if split_run:
        write_split_run(ds)
    return ds


def write_split_run(ds: Dataset, name: str = "split-test") -> Path:
    """A split run folder in the version-1 layout (before run records), and ``provenance.split``."""
    rule = {"min_per_background": 2, "min_drop": 5.0, "require_significant": False, "n_boot": 100, "level": 0.95,
            "n_perm": 100, "alpha": 0.05, "seed": 0}
    classes = []
    for k, c in enumerate(CLASSES):
        classes.append({"class_index": c, "kept": True, "reason": "drop 40.0 > 5", "easy": EASY, "hard": HARD,
                        "easy_acc": 0.9 - 0.1 * k, "hard_acc": 0.4, "drop": 0.5 - 0.1 * k,
                        "drop_ci": [0.3 - 0.1 * k, 0.7 - 0.1 * k], "p_value": 0.01, "n_easy": 3, "n_hard": 3,
                        "pinned": False, "cells": [], "class_name": ds.label_space.names[c]})
    classes.append({"class_index": 1, "kept": False, "reason": "drop 1.0 <= 5", "easy": EASY, "hard": HARD,
                    "easy_acc": 0.5, "hard_acc": 0.49, "drop": 0.01, "drop_ci": [-0.2, 0.2], "p_value": 0.9,
                    "n_easy": 3, "n_hard": 3, "pinned": False, "cells": [], "class_name": ds.label_space.names[1]})
    provenance = {"rule": rule, "references": [], "prompt": "A photo of {}.", "kept_classes": 3, "dropped_classes": 1,
                  "reference": {"name": "ViT-B-32", "pretrained": "/home/someone/weights/ref.pt",
                                "model_id": "open_clip:ViT-B-32:file-abc"},
                  "easy_samples": 9, "hard_samples": 9, "pins": {}}
    run_dir = create_run(ds.root, name, {"kind": "split", **provenance}, overwrite=True)
    provenance["run"] = name
    ds.record_provenance("split", provenance)
    write_json(run_dir / "split.json", {"classes": classes, **provenance})
    return run_dir


def write_eval_run(ds: Dataset, name: str, model: str, easy: float, hard: float, *, label_space: str = "imagenet1k",
                   prompts: str = "simple") -> Path:
    """An evaluation run folder with the config.json / metrics.json fields curate.compare reads."""
    config = {"kind": "evaluate", "model": {"name": model, "pretrained": None, "model_id": f"open_clip:{model}"},
              "label_space": {"name": label_space}, "prompts": {"name": prompts, "templates": ["A photo of {}."]}}
    run_dir = create_run(ds.root, name, config, overwrite=True)
    metrics = {
        "overall": {"acc1": (easy + hard) / 2, "acc5": 1.0, "mean_per_class_recall": (easy + hard) / 2},
        "groups": {
            "easy": {"acc1_balanced": easy, "acc1_unbalanced": easy, "acc5_balanced": 1.0, "n": 9, "n_classes": 3,
                     "acc1_balanced_ci95": [easy - 0.05, min(1.0, easy + 0.05)]},
            "hard": {"acc1_balanced": hard, "acc1_unbalanced": hard, "acc5_balanced": 1.0, "n": 9, "n_classes": 3,
                     "acc1_balanced_ci95": [hard - 0.05, hard + 0.05]},
        },
        "drop": {"acc1": easy - hard, "acc1_ci95": [easy - hard - 0.1, easy - hard + 0.1]},
        "per_class": [], "per_background": [], "per_class_background": [], "excluded": {"count": 0, "reasons": {}},
        "model_id": f"open_clip:{model}", "label_space": label_space, "prompts": prompts,
    }
    write_json(run_dir / "metrics.json", metrics)
    return run_dir


def explain_summary(model: str = "open_clip:m-a") -> dict[str, Any]:
    """A version-1 explain ``summary.json`` (the layout before run records; ExplainRun still loads it)."""

    def stat(mean: float, n: int = 9, n_nan: int = 0) -> dict[str, Any]:
        return {"mean": mean, "std": 0.1, "n": n, "n_nan": n_nan}

    return {
        "config": {"kind": "explain", "model": model, "method": "gradcam", "layer": "visual.trunk", "target": "true"},
        "n_images": 18, "n_predictions": 18, "accuracy": 0.7,
        "overall": {"sss": {"per_prediction": stat(0.45, 18), "per_image": stat(0.45, 18)},
                    "rma": {"per_prediction": stat(0.55, 18), "per_image": stat(0.55, 18)}, "sss_uniform": 0.8},
        "split": "group",
        "by_group": {
            "easy": {"sss": {**stat(0.30), "balanced": 0.31}, "rma": {**stat(0.70), "balanced": 0.69}, "sss_uniform": 0.8},
            "hard": {"sss": {**stat(0.60, 8, 1), "balanced": 0.61}, "rma": {**stat(0.40, 8, 1), "balanced": 0.41},
                     "sss_uniform": 0.8},
        },
        "by_correct": {}, "per_class": {"sss": {}, "rma": {}},
        "nan": {"count": 1, "reasons": {"empty_map": 1}},
        "skipped": {"count": 0, "reasons": {}, "samples": []},
        "masks": {"non_binary": 0, "resized": 0},
        "timing": {"seconds": 1.5, "images_per_second": 12.0, "final_batch_size": 8},
    }


def write_explain_run(ds: Dataset, name: str = "explain-gradcam-m-a", summary: dict[str, Any] | None = None) -> Path:
    summary = summary if summary is not None else explain_summary()
    run_dir = create_run(ds.root, name, summary["config"] if "config" in summary else {"kind": "explain"}, overwrite=True)
    write_json(run_dir / "summary.json", summary)
    return run_dir


def files_under(root: Path) -> list[Path]:
    return [p for p in Path(root).rglob("*") if p.is_file()]


def json_of(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
