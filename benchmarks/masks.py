"""Benchmark: mask proposals, batched on the engine seam vs one image at a time; mask writes at 10,000.

Two parts, both printed with wall time and CPU time (CPU time does not move with the machine's
load):

1. ``model``: ``curate propose-masks`` (the stage: images decoded in batches, one CLIPSeg
   forward per batch, each distinct prompt's text embedding computed once per batch) against
   the loop a user would write with ``transformers`` alone: for each photo, ``CLIPSegProcessor``
   on (image, prompt), one forward, sigmoid, resize, threshold. Same model folder, same
   images, same threshold; the masks are checked equal (IoU between the two >= 0.99 on every
   photo, since batching changes float rounding only). The model is the tiny CLIPSeg the
   demo fine-tunes (``--size tiny``) or CLIPSeg's real architecture with random weights
   (``--size base``: ViT-B/16 at 352 px, as CIDAS/clipseg-rd64-refined; nothing downloaded).
2. ``writes``: a 10,000-row folder (tests/scale_helpers.py, collector-shaped rows) and the
   stage with a proposer that costs nothing, so everything timed is curate's own work:
   decoding, the run folder's PNGs, and the dataset commits (``Dataset.set_masks`` every 256
   samples). Beside it, per-sample ``Dataset.set_mask`` (what the store offered before),
   timed on 200 samples and scaled to 10,000. Compare the per-image cost with part 1's
   model cost per image to see whether writes could be the bottleneck.

    .venv/bin/python benchmarks/masks.py [--part model|writes|all] [--images 128] [--size tiny|base]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402


def clock():
    return time.perf_counter(), time.process_time()


def since(start) -> tuple[float, float]:
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]


def load_line() -> str:
    return f"load average {os.getloadavg()[0]:.2f}"


# ----------------------------------------------------------------------------- part 1
def naive_clipseg(folder: Path, images, prompts, threshold: float, out: Path) -> list[np.ndarray | None]:
    """What a user writes with transformers alone: one photo at a time, each mask saved as a PNG
    (plain ``Image.save``, no fsync: the stage's writes are atomic and durable, so this side is
    favoured)."""
    import torch
    from PIL import Image
    from transformers import CLIPSegForImageSegmentation, CLIPSegProcessor

    processor = CLIPSegProcessor.from_pretrained(folder)
    model = CLIPSegForImageSegmentation.from_pretrained(folder).eval()
    out.mkdir(parents=True, exist_ok=True)
    masks: list[np.ndarray | None] = []
    with torch.inference_mode():
        for image, prompt in zip(images, prompts):
            inputs = processor(text=[prompt], images=[image], return_tensors="pt", padding=True)
            logits = model(**inputs).logits  # (H, W) for one image: CLIPSeg squeezes the batch
            prob = torch.sigmoid(logits.reshape(logits.shape[-2:])).numpy()
            prob = np.asarray(Image.fromarray(prob.astype(np.float32), mode="F").resize(image.size, Image.BILINEAR))
            mask = prob >= threshold
            masks.append(mask if mask.any() else None)
            if mask.any():
                Image.fromarray(mask.astype(np.uint8)).save(out / f"{len(masks):06d}.png")
    return masks


def part_model(images_n: int, size: str, workdir: Path, batch_size: int) -> float:
    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
    from curate.masks.tiny import build_tiny_clipseg
    from curate.stages.propose_masks import ProposeMasksSettings, propose_masks

    per_class = max(1, images_n // 6)
    ds = collect_synthetic(workdir / "world", WorldSpec(classes=DEFAULT_CLASSES[:6], per_class=per_class,
                                                        image_size=96, seed=7))
    folder = workdir / f"clipseg-{size}"
    build_tiny_clipseg(folder, size=size)
    rows = ds.rows()
    images = [ds.load_image(r["sample_id"]) for r in rows]
    prompts = [f"a photo of a {r['class_name'].split(',')[0]}." for r in rows]
    threshold = 0.5
    start = clock()
    naive = naive_clipseg(folder, images, prompts, threshold, workdir / "naive-masks")
    naive_wall, naive_cpu = since(start)
    start = clock()
    record = propose_masks(ds, f"clipseg:{folder}", ProposeMasksSettings(threshold=threshold, batch_size=batch_size,
                                                                         device="cpu"), run_name="bench")
    ours_wall, ours_cpu = since(start)
    from curate.masks.measure import iou

    agree = []
    for r, n in zip(rows, naive):
        p = record.proposal(r["sample_id"])
        if p is None or n is None:
            agree.append(1.0 if p is None and n is None else 0.0)
        else:
            agree.append(iou(p, n))
    print(f"\n## proposing masks: CLIPSeg ({size}), {len(rows)} photos of 96 px, CPU, {load_line()}")
    print("| way | wall | CPU | photos/s (wall) |")
    print("| --- | --- | --- | --- |")
    print(f"| transformers, one photo at a time, masks saved | {naive_wall:.2f} s | {naive_cpu:.2f} s | {len(rows) / naive_wall:.1f} |")
    print(f"| curate propose-masks (batch {batch_size}) | {ours_wall:.2f} s | {ours_cpu:.2f} s | {len(rows) / ours_wall:.1f} |")
    print(f"ratio (wall): {naive_wall / ours_wall:.2f}x; ratio (CPU): {naive_cpu / ours_cpu:.2f}x; "
          f"the stage's time includes its writes (run folder PNGs and dataset commits)")
    print(f"agreement of the masks: min IoU {min(agree):.4f}, mean {float(np.mean(agree)):.4f} "
          f"(1.0 = identical; batching changes float rounding only)")
    return ours_wall / len(rows)


# ----------------------------------------------------------------------------- part 2
class FreeProposer:
    """A proposer that costs nothing: the whole image as the mask (1x1 photos here)."""

    model_id = "free@0"
    info = {"backend": "clipseg", "spec": ""}

    def propose(self, images, prompts, threshold):
        from curate.masks.backends.base import Proposal

        return [Proposal(np.ones((im.height, im.width), bool), 1.0) for im in images]


def part_writes(n: int, workdir: Path, model_seconds_per_image: float | None) -> None:
    from scale_helpers import build_folder

    from curate.stages.propose_masks import ProposeMasksSettings, propose_masks
    from curate.store import Dataset

    root = workdir / "scale"
    build_folder(root, n)
    ds = Dataset.open(root)
    timings = {"set_masks": [0.0, 0.0]}
    original = Dataset.set_masks

    def timed_set_masks(self, *args, **kwargs):
        start = clock()
        try:
            return original(self, *args, **kwargs)
        finally:
            wall, cpu = since(start)
            timings["set_masks"][0] += wall
            timings["set_masks"][1] += cpu

    Dataset.set_masks = timed_set_masks
    try:
        start = clock()
        record = propose_masks(ds, FreeProposer(), ProposeMasksSettings(batch_size=64, device="cpu"), run_name="w")
        stage_wall, stage_cpu = since(start)
    finally:
        Dataset.set_masks = original
    assert record.counts["applied"] == n, record.counts
    ids = Dataset.open(root).sample_ids()[:200]
    start = clock()
    for sid in ids:
        ds.set_mask(sid, np.zeros((1, 1), np.uint8), mask_status="model:old", actor="bench")
    one_wall, one_cpu = since(start)
    per_image = stage_wall / n
    print(f"\n## mask writes at {n:,} rows ({load_line()})")
    print("| what | wall | CPU | per photo |")
    print("| --- | --- | --- | --- |")
    print(f"| propose-masks with a free model: decode, run-folder PNGs, commits | {stage_wall:.1f} s | {stage_cpu:.1f} s "
          f"| {1000 * per_image:.2f} ms |")
    print(f"| of which Dataset.set_masks (every 256 samples: {-(-n // 256)} commits) | {timings['set_masks'][0]:.1f} s "
          f"| {timings['set_masks'][1]:.1f} s | {1000 * timings['set_masks'][0] / n:.2f} ms |")
    print(f"| per-sample Dataset.set_mask, 200 timed, scaled to {n:,} | {one_wall / 200 * n:.0f} s | "
          f"{one_cpu / 200 * n:.0f} s | {1000 * one_wall / 200:.1f} ms |")
    if model_seconds_per_image:
        print(f"the model (part 1) costs {1000 * model_seconds_per_image:.1f} ms per photo on this CPU: the writes are "
              f"{100 * per_image / model_seconds_per_image:.1f}% of it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["model", "writes", "all"], default="all")
    parser.add_argument("--images", type=int, default=120)
    parser.add_argument("--size", choices=["tiny", "base"], default="tiny")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    workdir = Path(tempfile.mkdtemp(prefix="curate-masks-bench-"))
    try:
        per_image = None
        if args.part in ("model", "all"):
            per_image = part_model(args.images, args.size, workdir, args.batch_size)
        if args.part in ("writes", "all"):
            part_writes(args.rows, workdir, per_image)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
