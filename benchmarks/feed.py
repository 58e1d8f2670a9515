"""Benchmark: curate's input pipeline alone on the CPU, against a plain PyTorch DataLoader (issue 27).

What feeds the model when ``curate evaluate`` encodes, with the model replaced by nothing (the
output function returns a zero column), so the CPU-side part can be measured and worked on on
any machine. The data are shaped like a collector's: ``--images`` JPEG photos of 500 px on the
longest side (iNaturalist's "medium"; smooth gradients, a disc and mild noise, generated offline
with PIL, quality 90), imported by ``curate.collect.folder.import_folder`` (every row carries its
own provenance: source, source id, licence fields), read through ``Dataset``.

Timed, each ``--repeat`` times, alternating (the best run is printed):

- **curate**: :class:`curate.engine.local.LocalEngine` ``map_batches`` over every id with an
  :class:`~curate.engine.base.EncodeJob` (input path ``cpu-exact``: open_clip's ViT-B-32 eval
  transform, 224 px bicubic + centre crop + normalise, in ``--workers`` loader processes; paths
  resolved for all ids at once by ``Dataset.image_paths``; :func:`curate.engine.base.encode_batch`
  per batch, as in a run);
- **plain**: a ``torch.utils.data.DataLoader`` over the same files with the same transform,
  workers and batch size (PIL open, ``convert("RGB")``, transform; batches discarded): what a
  user's own script costs.

Printed per pipeline: images/s (wall), the main process's CPU time per image (user + system of
this process and its threads: what curate adds on top of decoding; target < 20 us), the
workers' CPU time per image, and the ratio curate / plain. CPU times do not move with a shared
machine's load, wall times do; the load average is printed beside them.

    .venv/bin/python benchmarks/feed.py                          # 1,000 photos, 2 workers
    .venv/bin/python benchmarks/feed.py --images 4000 --workers 8 --batch 256 --keep /tmp/feed
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def make_photos(src: Path, n: int, *, longest: int = 500, classes: int = 10, seed: int = 0) -> None:
    """``n`` JPEG photos in ``src/<class name>/`` (imagefolder layout), ``longest`` px on the long side."""
    from PIL import Image

    from curate.labels import imagenet1k

    names = imagenet1k().names
    rng = np.random.default_rng(seed)
    for i in range(n):
        landscape = i % 3 != 0
        w, h = (longest, longest * 3 // 4) if landscape else (longest * 3 // 4, longest)
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        base, slope = rng.uniform(0, 255, 3), rng.uniform(-0.3, 0.3, (3, 2))
        img = np.stack([base[c] + slope[c, 0] * x + slope[c, 1] * y for c in range(3)], axis=-1)
        cx, cy, r = rng.uniform(0.3, 0.7) * w, rng.uniform(0.3, 0.7) * h, rng.uniform(0.1, 0.3) * min(w, h)
        img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
        img += rng.normal(0, 6, img.shape)
        folder = src / names[10 + i % classes]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(folder / f"photo-{i:06d}.jpg", quality=90)


class Nothing:
    """The model replaced by nothing: the stand-in's identity and ViT-B-32's eval transform."""

    kind, model_id, cache_safe, precision = "clip", "bench:nothing", False, "fp32"

    def __init__(self) -> None:
        import torch
        from open_clip.transform import PreprocessCfg, image_transform_v2

        self.device = torch.device("cpu")
        self.preprocess = image_transform_v2(PreprocessCfg(size=(224, 224), interpolation="bicubic"), is_train=False)
        self.image_size = (224, 224)


def nothing(model: Any, kind: str, batch: Any) -> Any:
    """The per-batch output: one zero column (no model work)."""
    import torch

    return torch.zeros(batch.shape[0], 1)


class PlainFiles:
    """The user's own Dataset: PIL open, RGB, the transform."""

    def __init__(self, paths: list[Path], preprocess: Any) -> None:
        self.paths, self.preprocess = paths, preprocess

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        from PIL import Image

        with Image.open(self.paths[i]) as image:
            return self.preprocess(image.convert("RGB"))


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(fn: Any) -> dict[str, float]:
    """wall s, main-process CPU s, finished child processes' CPU s of one call."""
    wall, main, children = time.perf_counter(), _cpu_self(), _cpu_children()
    count = fn()
    return {"wall": time.perf_counter() - wall, "main": _cpu_self() - main, "workers": _cpu_children() - children,
            "images": count}


def run_curate(ds: Any, ids: list[str], model: Nothing, workers: int, batch: int) -> int:
    from curate.engine.base import EncodeJob
    from curate.engine.local import LocalEngine

    job = EncodeJob(model=model, kind="embedding", batch_size=batch, output=nothing)
    seen = 0
    for out in LocalEngine(workers=workers).map_batches(ds, ids, job):
        seen += out.count
    return seen


def run_plain(paths: list[Path], model: Nothing, workers: int, batch: int) -> int:
    import torch

    loader = torch.utils.data.DataLoader(PlainFiles(paths, model.preprocess), batch_size=batch, shuffle=False,
                                         num_workers=workers, persistent_workers=False)
    seen = 0
    for pixels in loader:
        seen += len(pixels)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--keep", type=Path, default=None, help="build (or reuse) the folder here")
    args = parser.parse_args()

    import torch

    from curate.collect.folder import import_folder
    from curate.store import Dataset

    torch.set_num_threads(1)  # the main process only feeds; as a GPU run's would
    work = args.keep or Path(tempfile.mkdtemp(prefix="curate-feed-"))
    root = work / f"ds-{args.images}"
    if not (root / "dataset.yaml").exists():
        started = time.perf_counter()
        make_photos(work / f"src-{args.images}", args.images)
        import_folder(work / f"src-{args.images}", root, status="accepted")
        print(f"built {args.images} JPEG photos (500 px longest side) and imported them in "
              f"{time.perf_counter() - started:.1f} s")
    ds = Dataset.open(root)
    ids = ds.sample_ids()
    paths = [ds.image_path(sid) for sid in ids]
    print(f"{len(ids)} images, {args.workers} workers, batch {args.batch}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    model = Nothing()  # imports open_clip and builds the transform outside the timings
    import curate.engine.base  # noqa: F401 - imported outside the timings, as in a run
    import curate.engine.local  # noqa: F401
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.repeat):
        for name, fn in (("curate", lambda: run_curate(ds, ids, model, args.workers, args.batch)),
                         ("plain", lambda: run_plain(paths, model, args.workers, args.batch))):
            result = timed(fn)
            assert result["images"] == len(ids), result
            if name not in best or result["wall"] < best[name]["wall"]:
                best[name] = result
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"{'pipeline':<8} {'images/s':>9} {'wall s':>7} {'main CPU s':>10} {'main us/image':>13} "
          f"{'workers CPU s':>13} {'workers ms/image':>16}")
    for name, r in best.items():
        n = r["images"]
        print(f"{name:<8} {n / r['wall']:9.0f} {r['wall']:7.2f} {r['main']:10.2f} {r['main'] / n * 1e6:13.1f} "
              f"{r['workers']:13.2f} {r['workers'] / n * 1e3:16.2f}")
    ratio = best["plain"]["wall"] / best["curate"]["wall"]
    overhead = (best["curate"]["main"] - best["plain"]["main"]) / len(ids) * 1e6
    print(f"curate / plain images/s: {ratio:.2f}x; curate's main process over plain's: {overhead:+.1f} us/image "
          f"(target: curate >= plain, main process < 20 us/image)")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
