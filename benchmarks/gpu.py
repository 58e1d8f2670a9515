"""Benchmark: does curate keep a GPU busy? One short script for a GPU machine (issue 27).

On ``--images`` JPEG photos of 500 px on the longest side (generated offline, as in
``benchmarks/feed.py``; a human mask each, so ``explain`` has something to score), in order:

1. **model alone**: the image tower on random input already on the device (the ceiling);
2. **plain DataLoader**: PIL decode + the model's transform in ``--workers`` processes, batches
   moved to the device, no model (what the input side of a user's script delivers);
3. **curate pipeline alone**: :class:`curate.engine.local.LocalEngine` with the model replaced by
   nothing, on the input path ``--input-path`` (``auto``: ``gpu`` on CUDA, decode/resize/crop/
   normalise on the device; ``cpu-exact`` elsewhere);
4. **evaluate end to end**: :func:`curate.stages.evaluate.evaluate` of the loaded model, first pass
   (no feature cache), 1 vs 1000;
5. **explain end to end**: :func:`curate.stages.explain.explain`, GradCAM, the true class, on
   ``--explain-images`` of them.

Each prints images/s and, on CUDA, the GPU utilisation sampled every 200 ms by ``nvidia-smi``
(mean over the step; "n/a" without it). Defaults: ViT-B-32 (random weights: the speed of a
pretrained one; nothing is downloaded), bf16, batch 512, 10,000 images, every core but one as
workers: under 5 minutes on an H100/H200 with 16 cores. ``--reduced``: a CPU smoke run (the
tiny CLIP ``curate-tiny-vit``, 200 images of 160 px, batch 64, fp32, 0 workers) in under a
minute, so the script is checked where no GPU is lent.

    .venv/bin/python benchmarks/gpu.py                 # on a GPU machine
    .venv/bin/python benchmarks/gpu.py --reduced       # anywhere, < 1 min
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from feed import Nothing, PlainFiles, make_photos, nothing  # noqa: E402 - a sibling script


@contextlib.contextmanager
def gpu_utilisation(out: dict[str, float]) -> Iterator[None]:
    """``out["gpu_util"]``: mean GPU utilisation (%) sampled by nvidia-smi while the block runs (NaN without it)."""
    out["gpu_util"] = float("nan")
    if not shutil.which("nvidia-smi"):
        yield
        return
    samples: list[float] = []
    proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms",
                             "200", "-i", "0"], stdout=subprocess.PIPE, text=True)

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            with contextlib.suppress(ValueError):
                samples.append(float(line.strip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=5)
        reader.join(timeout=2)
        if samples:
            out["gpu_util"] = float(np.mean(samples))


def step(name: str, images: int, fn: Any, device: Any) -> None:
    import torch

    stats: dict[str, float] = {}
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    with gpu_utilisation(stats):
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    wall = time.perf_counter() - started
    util = "n/a" if np.isnan(stats["gpu_util"]) else f"{stats['gpu_util']:.0f} %"
    print(f"{name:<34} {images:>7} images {wall:8.2f} s {images / wall:10.0f} images/s   GPU util {util}", flush=True)


def build(root: Path, n: int, longest: int) -> Any:
    """The photos, imported as a collector would, each with a human mask (the disc's bounding box)."""
    from PIL import Image

    from curate.collect.folder import import_folder
    from curate.store import Dataset

    src = root.parent / f"src-{n}-{longest}"
    make_photos(src, n, longest=longest)
    import_folder(src, root, status="accepted")
    ds = Dataset.open(root)
    masks = {}
    for row in ds.rows():
        with Image.open(ds.image_path(row)) as image:
            w, h = image.size
        mask = np.zeros((h, w), np.uint8)
        mask[h // 4: 3 * h // 4, w // 4: 3 * w // 4] = 1
        masks[row["sample_id"]] = mask
    ds.set_masks(masks, mask_status="human", actor="benchmarks/gpu.py", reason="a box mask per photo")
    return ds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reduced", action="store_true", help="CPU smoke run, < 1 min")
    parser.add_argument("--images", type=int, default=None)
    parser.add_argument("--explain-images", type=int, default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--precision", default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--input-path", default="auto", choices=("auto", "cpu-exact", "gpu"))
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from curate.engine.base import EncodeJob
    from curate.engine.images import choose_input_path, default_workers
    from curate.engine.local import LocalEngine
    from curate.models import load_model
    from curate.stages.evaluate import EvalSettings, evaluate
    from curate.stages.explain import ExplainSettings, explain
    from curate.store import Dataset

    reduced = args.reduced
    device = torch.device("cuda" if torch.cuda.is_available() and not reduced else "cpu")
    n = args.images or (200 if reduced else 10_000)
    n_explain = args.explain_images or (40 if reduced else 2_000)
    model_name = args.model or ("curate-tiny-vit" if reduced else "ViT-B-32")
    precision = args.precision or ("fp32" if device.type == "cpu" else "bf16")
    batch = args.batch or (64 if reduced else 512)
    workers = default_workers(device) if args.workers is None else args.workers
    longest = 160 if reduced else 500
    work = args.keep or Path(tempfile.mkdtemp(prefix="curate-gpu-"))
    root = work / f"ds-{n}-{longest}"
    started = time.perf_counter()
    ds = build(root, n, longest) if not (root / "dataset.yaml").exists() else Dataset.open(root)
    print(f"{n} photos ({longest} px longest side) ready in {time.perf_counter() - started:.1f} s; device {device}"
          f"{' ' + torch.cuda.get_device_name() if device.type == 'cuda' else ''}, {os.cpu_count()} CPUs, "
          f"{workers} workers, batch {batch}, {model_name} {precision}, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    model = load_model(model_name, None, seed=0, device=str(device), precision=precision)
    path = choose_input_path(device, args.input_path, model.preprocess)
    ids = ds.sample_ids()

    x = torch.randn(batch, 3, *model.image_size, device=device)
    model.encode_image(x)  # warm-up
    rounds = max(1, n // batch)
    step("model alone", rounds * batch, lambda: [model.encode_image(x) for _ in range(rounds)], device)

    paths = ds.image_paths(ids)

    def plain() -> None:
        loader = torch.utils.data.DataLoader(PlainFiles(paths, model.preprocess), batch_size=batch,
                                             num_workers=workers, pin_memory=device.type == "cuda")
        for pixels in loader:
            pixels.to(device, non_blocking=True)

    step("plain DataLoader", n, plain, device)
    stand_in = Nothing()
    stand_in.device, stand_in.preprocess, stand_in.image_size = device, model.preprocess, model.image_size
    job = EncodeJob(model=stand_in, kind="embedding", batch_size=batch, output=nothing, input_path=path)
    step(f"curate pipeline ({path})", n, lambda: list(LocalEngine(workers=workers).map_batches(ds, ids, job)), device)
    settings = EvalSettings(device=str(device), precision=precision, batch_size=batch, workers=workers, bootstrap=10,
                            use_cache=False, input_path=path)
    step(f"evaluate end to end ({path})", n, lambda: evaluate(ds, model, settings, run_name="bench-eval",
                                                             overwrite=True), device)
    explain_settings = ExplainSettings(method="gradcam", device=str(device), precision=precision,
                                       batch_size=min(batch, 256), workers=workers, limit=n_explain)
    step("explain gradcam end to end", n_explain,
         lambda: explain(ds, model, explain_settings, run_name="bench-explain", overwrite=True), device)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
