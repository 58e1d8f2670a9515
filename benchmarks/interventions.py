"""Benchmark: ``curate intervene`` against the loop a user would write for the same images.

The same synthetic world (collector-shaped rows: per-row licence, attribution and ``extra``), the
same plan (``curate.interventions.plan``: the same donors for every photo) and the same image
operations (``curate.interventions.image_ops``), so both sides make the same pixels:

- curate: :func:`curate.stages.intervene.intervene`: images made in threads in source order, each
  donor's filled background decoded and filled once (an LRU cache), every image stored through
  the dataset folder (content ids, masks, atomic commits, the typed record);
- the loop: for each image of curate's variants table (the plan is not timed on its side), open
  the photo and its mask, grow and fill the hole, open and fill the donor again, ``Image.save`` a
  PNG into a folder and a row into a CSV (no fsync, no validation, no copies of the originals: the
  loop is favoured).

Wall and CPU time of each, the ratio of both, and a pixel check on a sample of the images (the
two sides must agree exactly). Run:

    .venv/bin/python benchmarks/interventions.py [--per-class 40] [--size 256] [--classes 6]

``--fills DEMO_DIR`` measures the hole fills and donor rules instead, where the truth is known
(docs/interventions.md#the-ghost-control): a world of :mod:`curate.interventions.worlds`
(``--world ghost``: hard objects at 0.3 of the easy ones' size) scored by one of the demo's
reference CLIPs (``--model uncorrelated``: shape only), one intervention per (donor rule, fill),
each against the exact counterfactuals of its swaps: D, B, B unghosted, the ghost control and
the ghost alone with 95 % intervals, the true B, the mean uncovered share of the hard swaps'
donor holes, and the CPU time per image made:

    .venv/bin/python benchmarks/interventions.py --fills demo-output --world ghost --model uncorrelated
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]


def the_loop(ds, table, settings, out: Path) -> int:
    """What a user writes: one image at a time, each recomputed from the files (the plan, i.e. which
    donor each image uses, is read from curate's variants table so both sides make the same images)."""
    from curate.interventions import image_ops as ops
    from curate.interventions.plan import variant_rng

    out.mkdir(parents=True, exist_ok=True)

    def load(sample_id):
        row = ds.row(sample_id)
        with Image.open(ds.image_path(row)) as im:
            image = np.asarray(im.convert("RGB"))
        mask = ds.load_mask(row) > 0
        hole = ops.object_hole(mask, ops.hole_margin(mask.shape, settings.hole_margin))
        return image, mask, hole, ops.fill_hole(image, hole)

    made = 0
    with open(out / "variants.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        for row in table:
            variant, sid = row["variant"], row["source_sample_id"]
            if variant == "original":
                continue
            image, mask, hole, filled = load(sid)
            if variant == "only-fg":
                array = ops.only_foreground(image, mask)
            elif variant == "no-fg":
                array = ops.no_foreground(image, hole)
            elif variant == "only-bg":
                array = filled.image
            elif variant == "paste":
                array = ops.paste(image, mask, filled.image)
            elif variant in ("noise-fg", "noise-bg"):
                region = mask if variant == "noise-fg" else ~mask
                array = ops.gaussian_noise(image, region, settings.sigma, variant_rng(settings.seed, sid, "noise-fg"))
            else:
                d_image, _, d_hole, d_filled = load(row["donor_sample_id"])
                background = ops.fit_background(d_filled.image, mask.shape)
                if variant == "ghost":
                    array = background
                elif variant == "ghost-neutral":
                    array = ops.neutral_object(background, mask)
                elif variant == "swap-unghosted":
                    boxed = ops.fill_hole(d_image, d_hole, "box-tile").image
                    array = ops.paste(image, mask, ops.fit_background(boxed, mask.shape))
                else:
                    array = ops.paste(image, mask, background)
            Image.fromarray(array).save(out / f"{sid}-{variant}-{row['k']}.png")
            writer.writerow([sid, variant, row["k"], row["donor_sample_id"] or ""])
            made += 1
    return made


def measure_fills(demo_dir: Path, world_kind: str, model: str, combos: list[tuple[str, str]], per_class: int) -> None:
    """Print one line per (donor rule, fill): the decomposition against the truth (module docstring)."""
    import torch

    from curate.interventions.worlds import build_world, write_truth
    from curate.models import ModelSpec
    from curate.stages.attribution import AttributionSettings, attribution
    from curate.stages.evaluate import EvalSettings, evaluate
    from curate.stages.intervene import InterveneSettings, intervene

    torch.set_num_threads(1)
    weights = ModelSpec("auto", str(demo_dir / "models" / f"reference-{model}.pt"))

    def decompose(folder: Path):
        evaluate(folder, weights, EvalSettings(bootstrap=20), run_name="eval", overwrite=True)
        return attribution(folder, ["eval"], AttributionSettings(n_boot=500), run_name="a", overwrite=True).models[0]

    def cell(m, k: str) -> str:
        low, high = m.interval(k)
        return f"{100 * m.value(k):+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"

    tmp = Path(tempfile.mkdtemp(prefix="curate-bench-fills-"))
    try:
        world = build_world(world_kind, tmp / "world", per_class=per_class)
        print(f"world {world_kind}, {per_class} photos per class, model reference-{model}; points, 95% intervals; "
              f"load average {os.getloadavg()[0]:.2f}")
        print("| donors | fill | D | B | true B | B unghosted | ghost control | ghost-neutral | uncovered | CPU ms / image |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for match, fill in combos:
            folder = tmp / f"{match}-{fill}"
            start = clock()
            made = intervene(world, folder, InterveneSettings(variants=("swap", "paste"), fill=fill, match=match))
            _, cpu = since(start)
            write_truth(world, folder, tmp / f"truth-{match}-{fill}")
            m, truth = decompose(folder), decompose(tmp / f"truth-{match}-{fill}")
            hard = [r["uncovered"] for r in made.rows() if r["variant"] == "swap" and r["group"] == "hard"]
            print(f"| {match} | {fill} | {cell(m, 'drop')} | {cell(m, 'background_part')} | "
                  f"{100 * truth.value('background_part'):+.1f} | {cell(m, 'background_part_unghosted')} | "
                  f"{cell(m, 'ghost_bias')} | {cell(m, 'ghost_neutral')} | {sum(hard) / len(hard):.2f} | "
                  f"{1000 * cpu / made.counts['images']:.1f} |", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, default=None, help="Photos per class (default 40; 60 with --fills).")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--classes", type=int, default=6)
    parser.add_argument("--fills", type=Path, default=None, metavar="DEMO_DIR",
                        help="Measure the fills and donor rules against the truth with the demo's models instead.")
    parser.add_argument("--world", default="ghost", help="With --fills: the world (curate.interventions.worlds).")
    parser.add_argument("--model", default="uncorrelated", help="With --fills: reference-<MODEL>.pt of the demo.")
    parser.add_argument("--combos", default="size:tile,cover:tile,cover:telea,cover:ns,cover:box-tile",
                        help="With --fills: donor-rule:fill pairs.")
    args = parser.parse_args()
    if args.fills is not None:
        combos = [tuple(item.split(":", 1)) for item in args.combos.split(",")]
        measure_fills(args.fills, args.world, args.model, combos, args.per_class or 60)
        return 0
    args.per_class = args.per_class or 40

    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, assign_truth_groups, collect_synthetic
    from curate.runs.interventions import InterventionRun
    from curate.stages.intervene import InterveneSettings, intervene
    from curate.store import Dataset

    tmp = Path(tempfile.mkdtemp(prefix="curate-bench-iv-"))
    try:
        spec = WorldSpec(classes=DEFAULT_CLASSES[:args.classes], per_class=args.per_class, p=0.5,
                         image_size=args.size, seed=7)
        world = collect_synthetic(tmp / "world", spec)
        assign_truth_groups(world)
        settings = InterveneSettings()
        print(f"world: {len(world)} photos of {args.size} px, {args.classes} classes; every variant, "
              f"{settings.adversarial_backgrounds} adversarial backgrounds; {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.2f}")

        start = clock()
        record = intervene(world, tmp / "curate-out", settings)
        curate_wall, curate_cpu = since(start)
        n_curate = len(record.rows())

        out = Dataset.open(tmp / "curate-out")
        table = InterventionRun.of_folder(tmp / "curate-out").rows()
        start = clock()
        n_loop = the_loop(world, table, settings, tmp / "loop-out")
        loop_wall, loop_cpu = since(start)

        rng = np.random.default_rng(0)
        checked = 0
        for i in rng.choice(len(table), size=min(50, len(table)), replace=False):
            row = table[int(i)]
            if row["variant"] == "original":
                continue
            name = f"{row['source_sample_id']}-{row['variant']}-{row['k']}.png"
            ours = np.asarray(out.load_image(row["sample_id"]))
            theirs = np.asarray(Image.open(tmp / "loop-out" / name).convert("RGB"))
            if not np.array_equal(ours, theirs):
                print(f"MISMATCH: {name}")
                return 1
            checked += 1
        print(f"images: curate {n_curate} rows ({len(out)} stored, identical images stored once), loop {n_loop} "
              f"(+{sum(1 for r in table if r['variant'] == 'original')} originals it does not copy); "
              f"{checked} sampled images pixel-identical")
        print(f"curate intervene: {curate_wall:.2f} s wall, {curate_cpu:.2f} s CPU")
        print(f"the loop:         {loop_wall:.2f} s wall, {loop_cpu:.2f} s CPU")
        print(f"ratio (loop / curate): wall {loop_wall / curate_wall:.2f}x, CPU {loop_cpu / curate_cpu:.2f}x; "
              f"load average {os.getloadavg()[0]:.2f}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
