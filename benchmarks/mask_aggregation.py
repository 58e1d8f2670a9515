"""Which of crowd-kit's segmentation aggregators curate uses by default (issue 44): each against the
true mask on simulated annotators with known mask errors (a measurement of accuracy, with CPU time).

Truth: an ellipse per photo (random centre and axes, seeded) on a 48 x 48 grid. Annotators: the
default team's mask noise (curate.collect.annotator_sim.DEFAULT_MASKS: careful grows the mask by a
pixel, confuse shrinks it by one, random shifts it two pixels and misses a quarter on 20 % of the
photos). For each aggregator (curate.agreement.aggregate.aggregate_masks: majority = crowd-kit's
SegmentationMajorityVote, em = SegmentationEM, rasa = SegmentationRASA): the mean IoU with the true
mask over the photos, and the CPU seconds of the call; the best single annotator's mean IoU beside.

    .venv/bin/python benchmarks/mask_aggregation.py [--photos 200] [--seeds 0,1,2]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from curate.agreement.aggregate import MASK_METHODS, aggregate_masks
from curate.agreement.metrics import mask_iou
from curate.collect.annotator_sim import DEFAULT_MASKS, noisy_mask

SIZE = 48


def ellipse(rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    cy, cx = rng.uniform(14, 34, 2)
    ay, ax = rng.uniform(5, 13, 2)
    return (((yy - cy) / ay) ** 2 + ((xx - cx) / ax) ** 2 <= 1).astype(np.uint8)


def measure(photos: int, seed: int) -> dict[str, tuple[float, float]]:
    rng = np.random.default_rng(seed)
    truth = {f"p{i}": ellipse(rng) for i in range(photos)}
    drawn = {sid: {who: noisy_mask(mask, noise, rng) for who, noise in DEFAULT_MASKS.items()}
             for sid, mask in truth.items()}
    out: dict[str, tuple[float, float]] = {}
    for who in DEFAULT_MASKS:
        out[f"annotator {who}"] = (float(np.mean([mask_iou(drawn[s][who], truth[s]) for s in truth])), 0.0)
    for method in MASK_METHODS:
        start = time.process_time()
        agreed = aggregate_masks(drawn, method)
        cpu = time.process_time() - start
        out[method] = (float(np.mean([mask_iou(agreed[s], truth[s]) for s in truth])), cpu)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=200)
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    rows: dict[str, list[tuple[float, float]]] = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, value in measure(args.photos, seed).items():
            rows.setdefault(name, []).append(value)
    print(f"| aggregator | mean IoU with the truth (seeds {args.seeds}, {args.photos} photos each) | CPU s per call |")
    print("| --- | --- | --- |")
    for name, values in rows.items():
        ious = ", ".join(f"{v[0]:.3f}" for v in values)
        cpu = "" if name.startswith("annotator") else f"{np.mean([v[1] for v in values]):.2f}"
        print(f"| {name} | {ious} | {cpu} |")


if __name__ == "__main__":
    main()
