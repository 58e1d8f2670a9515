"""``curate split``: run the discovery rule on a dataset folder and write the groups.

Where the correctness comes from:
- ``references``: models evaluated now with the paper's setting (1 vs 1000 over ImageNet-1K,
  or the dataset's own label space when it is not ImageNet; prompt "A photo of {}."), each as
  an ordinary evaluation run (``runs/split-ref-*``), image embeddings from the cache;
- ``predictions``: finished evaluation runs (any model, e.g. an ImageNet classifier for the
  paper's CounterAnimal-I, App. E): the split then costs no inference.

What it writes: ``group`` (easy|hard) for the kept classes' accepted samples in their two
backgrounds and ``None`` for every other sample (so a re-run after new labels updates the
split, and only changed rows are written, each change in ``changes.jsonl``); the rule, the
models and the counts in ``dataset.yaml`` (``provenance.split``); a run folder
``runs/split-*/`` with ``split.md`` / ``split.csv`` (the paper's Tables 1 and 5: class, easy
background and accuracy, hard background and accuracy, drop, counts, plus intervals and the
reason for every dropped class), ``cells.csv`` (every class x background accuracy) and the
figures ``fig3_counts.png`` (easy/hard counts per class) and ``fig4_drops.png`` (drop per class).
"""
from __future__ import annotations

import csv
import io
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow.parquet as pq

from curate.runs import RUNS_DIR, create_run, run_name, unique_run_name, write_bytes, write_json
from curate.split.discovery import ClassSplit, SplitRule, discover, group_assignments

logger = logging.getLogger(__name__)

PINS_STAGE = "split_pins"


@dataclass
class SplitResult:
    run_dir: Path
    splits: list[ClassSplit]
    changed: int
    references: list[dict]

    @property
    def kept(self) -> list[ClassSplit]:
        return [s for s in self.splits if s.kept]


def load_pins(ds) -> dict[int, tuple[str, str]]:
    """Pinned (easy, hard) backgrounds per class, from ``dataset.yaml``."""
    raw = ds.provenance.get(PINS_STAGE) or {}
    return {int(c): (v["easy"], v["hard"]) for c, v in (raw.get("pins") or {}).items()}


def set_pins(ds, add: dict[int, tuple[str, str]] | None = None, remove: Sequence[int] = ()) -> dict[int, tuple[str, str]]:
    """Add/replace and remove pins; backgrounds must be in the vocabulary."""
    pins = load_pins(ds)
    for c, (easy, hard) in (add or {}).items():
        for b in (easy, hard):
            if b not in ds.backgrounds:
                raise ValueError(f"pin for class {c}: background {b!r} is not in the vocabulary {ds.backgrounds}")
        if easy == hard:
            raise ValueError(f"pin for class {c}: easy and hard must differ")
        ds.label_space.name_of(c)
        pins[int(c)] = (easy, hard)
    for c in remove:
        pins.pop(int(c), None)
    ds.record_provenance(PINS_STAGE, {"pins": {str(c): {"easy": e, "hard": h} for c, (e, h) in sorted(pins.items())}})
    return pins


def _reference_runs(ds, references, settings, progress) -> list[Path]:
    from curate.evaluate import EvalSettings, evaluate_model

    label_space = "imagenet1k" if ds.label_space.is_builtin else "dataset"
    runs = []
    for spec in references:
        eval_settings = EvalSettings(label_space=label_space, prompts="simple", statuses=("accepted",),
                                     **(settings or {}))
        name = unique_run_name(ds.root, run_name("split-ref", spec.label))
        runs.append(evaluate_model(ds.root, spec, eval_settings, run_name=name, progress=progress).run_dir)
    return runs


def _correctness(ds, run_dirs: Sequence[Path], sample_ids: list[str]) -> tuple[np.ndarray, list[dict]]:
    """(M, N) correctness of each run on ``sample_ids``; a sample missing from a run is an error."""
    rows, info = [], []
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        table = pq.read_table(run_dir / "predictions.parquet", columns=["sample_id", "correct1"]).to_pydict()
        by_id = dict(zip(table["sample_id"], table["correct1"]))
        missing = [s for s in sample_ids if s not in by_id]
        if missing:
            raise ValueError(f"run {run_dir.name} has no prediction for {len(missing)} accepted sample(s) with a "
                             f"background (e.g. {missing[0]}); re-run the evaluation on the current dataset")
        config = json.loads((run_dir / "config.json").read_text())
        label_space = config.get("label_space", {}).get("name")
        templates = config.get("prompts", {}).get("templates")
        if label_space not in ("imagenet1k",) or templates != ["A photo of {}."]:
            logger.warning("run %s used label space %s and prompts %s, not the paper's 1 vs 1000 with 'A photo of {}.'",
                           run_dir.name, label_space, templates)
        rows.append([bool(by_id[s]) for s in sample_ids])
        info.append({"run": run_dir.name, "model_id": config.get("model", {}).get("model_id"),
                     "name": config.get("model", {}).get("name"), "pretrained": config.get("model", {}).get("pretrained"),
                     "label_space": label_space, "prompts": templates})
    return np.array(rows, dtype=np.float64), info


def split_dataset(
    dataset_root: Path,
    *,
    references: Sequence = (),
    predictions: Sequence[str] = (),
    rule: SplitRule = SplitRule(),
    eval_settings: dict | None = None,
    run: str | None = None,
    progress=None,
) -> SplitResult:
    """Discover easy/hard backgrounds and write the groups (see the module docstring)."""
    from curate.store import Dataset

    if not references and not predictions:
        raise ValueError("give a reference model (--reference) or finished evaluation runs (--predictions)")
    ds = Dataset.open(dataset_root)
    rows = [r for r in ds.rows(status="accepted") if r["class_index"] is not None and r["background"] is not None]
    if not rows:
        raise ValueError(f"{ds.root}: no accepted samples with a background label; label backgrounds first "
                         "(curate label-backgrounds, or review)")
    run_dirs = [ds.root / RUNS_DIR / name for name in predictions]
    for run_dir in run_dirs:
        if not (run_dir / "predictions.parquet").exists():
            raise FileNotFoundError(f"{run_dir} is not a finished evaluation run (no predictions.parquet)")
    run_dirs += _reference_runs(ds, references, eval_settings, progress)
    ids = [r["sample_id"] for r in rows]
    classes = [int(r["class_index"]) for r in rows]
    backgrounds = [r["background"] for r in rows]
    correct, ref_info = _correctness(ds, run_dirs, ids)
    pins = load_pins(ds)
    splits = discover(classes, backgrounds, correct, rule, pins)

    # every sample gets its group recomputed: kept classes' easy/hard accepted samples, None otherwise
    assigned = group_assignments(ids, classes, backgrounds, splits)
    per_sample = {}
    for row in ds.rows():
        target = assigned.get(row["sample_id"])
        if row["group"] != target:
            per_sample[row["sample_id"]] = {"group": target}
    if per_sample:
        ds.update(list(per_sample), per_sample=per_sample, actor="split", reason="spurious discovery (papers/003 §2.1)")

    names = ds.label_space.names
    kept = [s for s in splits if s.kept]
    provenance = {
        "rule": asdict(rule), "references": ref_info,
        "reference": ({"name": ref_info[0]["name"], "pretrained": ref_info[0]["pretrained"], "model_id": ref_info[0]["model_id"]}
                      if ref_info else None),
        "prompt": "A photo of {}.", "kept_classes": len(kept), "dropped_classes": len(splits) - len(kept),
        "easy_samples": sum(s.n_easy for s in kept), "hard_samples": sum(s.n_hard for s in kept),
        "pins": {str(c): list(v) for c, v in pins.items()},
    }
    name = run or unique_run_name(ds.root, run_name("split", "-".join(i["name"] or "run" for i in ref_info)[:40]))
    run_dir = create_run(ds.root, name, {"kind": "split", **provenance}, overwrite=bool(run))
    provenance["run"] = run_dir.name
    ds.record_provenance("split", provenance)
    write_bytes(run_dir / "split.csv", to_csv(splits, names).encode())
    write_bytes(run_dir / "split.md", to_markdown(splits, names, rule).encode())
    write_bytes(run_dir / "cells.csv", cells_csv(splits, names).encode())
    write_json(run_dir / "split.json", {"classes": [_split_json(s, names) for s in splits], **provenance})
    write_bytes(run_dir / "fig3_counts.png", counts_figure(kept, names))
    write_bytes(run_dir / "fig4_drops.png", drops_figure(kept, names))
    logger.info("split: %d kept, %d dropped, %d samples changed group -> %s", len(kept), len(splits) - len(kept),
                len(per_sample), run_dir)
    return SplitResult(run_dir, splits, len(per_sample), ref_info)


def _split_json(s: ClassSplit, names) -> dict:
    d = asdict(s)
    d["class_name"] = names[s.class_index]
    return d


def _pct(x: float) -> str:
    return "—" if not np.isfinite(x) else f"{100 * x:.2f}"


def to_markdown(splits: Sequence[ClassSplit], names, rule: SplitRule) -> str:
    kept = [s for s in splits if s.kept]
    dropped = [s for s in splits if not s.kept]
    lines = [f"# Spurious discovery: {len(kept)} classes kept, {len(dropped)} dropped", "",
             f"Rule (papers/003 §2.1): backgrounds with >= {rule.min_per_background} accepted samples; easy = highest "
             f"accuracy, hard = lowest; keep when the drop exceeds {rule.min_drop:g} points"
             + (" and it is significant (95% interval above 0 and permutation p < "
                f"{rule.alpha:g} for the max-min over backgrounds)." if rule.require_significant else "."), "",
             "| class | easy bkg | easy acc | hard bkg | hard acc | drop [95% CI] | p (permutation) | n easy | n hard |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(kept, key=lambda s: -s.drop):
        pin = " (pinned)" if s.pinned else ""
        lines.append(f"| {s.class_index} {names[s.class_index]}{pin} | {s.easy} | {_pct(s.easy_acc)} | {s.hard} | "
                     f"{_pct(s.hard_acc)} | {_pct(s.drop)} [{_pct(s.drop_ci[0])}, {_pct(s.drop_ci[1])}] | {s.p_value:.3g} | {s.n_easy} | {s.n_hard} |")
    if dropped:
        lines += ["", "## Dropped classes", "", "| class | reason |", "|---|---|"]
        for s in dropped:
            lines.append(f"| {s.class_index} {names[s.class_index]} | {s.reason} |")
    return "\n".join(lines) + "\n"


def to_csv(splits: Sequence[ClassSplit], names) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["class_index", "class_name", "kept", "reason", "pinned", "easy_background", "easy_acc",
                     "hard_background", "hard_acc", "drop", "drop_ci_low", "drop_ci_high", "p_value", "n_easy", "n_hard"])
    for s in splits:
        writer.writerow([s.class_index, names[s.class_index], s.kept, s.reason, s.pinned, s.easy, s.easy_acc, s.hard,
                         s.hard_acc, s.drop, *s.drop_ci, s.p_value, s.n_easy, s.n_hard])
    return buffer.getvalue()


def cells_csv(splits: Sequence[ClassSplit], names) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["class_index", "class_name", "background", "n", "accuracy", "ci_low", "ci_high", "eligible"])
    for s in splits:
        for cell in s.cells:
            writer.writerow([s.class_index, names[s.class_index], cell.background, cell.n, cell.accuracy, *cell.ci, cell.eligible])
    return buffer.getvalue()


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def counts_figure(kept: Sequence[ClassSplit], names) -> bytes:
    """papers/003 Fig. 3: easy and hard sample counts per kept class."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(kept) + 2), 4), dpi=110)
    x = np.arange(len(kept))
    ax.bar(x - 0.2, [s.n_easy for s in kept], 0.4, label="easy")
    ax.bar(x + 0.2, [s.n_hard for s in kept], 0.4, label="hard")
    ax.set_xticks(x, [names[s.class_index] for s in kept], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("photos")
    ax.set_title("easy and hard photos per class")
    ax.legend()
    return _save(plt, fig)


def drops_figure(kept: Sequence[ClassSplit], names) -> bytes:
    """papers/003 Fig. 4: the accuracy drop (points) per kept class, with its interval."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(kept) + 2), 4), dpi=110)
    order = sorted(kept, key=lambda s: -s.drop)
    x = np.arange(len(order))
    drops = np.array([100 * s.drop for s in order])
    low = np.array([100 * s.drop_ci[0] for s in order])
    high = np.array([100 * s.drop_ci[1] for s in order])
    ax.bar(x, drops, color="tab:red", alpha=0.8)
    if len(order):
        ax.errorbar(x, drops, yerr=[drops - low, high - drops], fmt="none", ecolor="black", lw=0.8, capsize=2)
    ax.set_xticks(x, [names[s.class_index] for s in order], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("easy - hard accuracy (points)")
    ax.set_title("accuracy drop per class (95% bootstrap interval)")
    ax.axhline(0, color="grey", lw=0.8)
    return _save(plt, fig)


def _save(plt, fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
