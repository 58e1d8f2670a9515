"""Evaluating an ImageNet classifier: ``curate evaluate`` against the plain timm loop (issue 45).

    .venv/bin/python benchmarks/classifier.py                                  # 200 photos, tf_efficientnet_lite0
    .venv/bin/python benchmarks/classifier.py --images 400 --arch resnet18 --keep /tmp/cls

The case a user with their own classifier meets: a timm architecture and a weights file. Both
sides get the same file (``--arch`` with random weights, seeded, saved by ``torch.save`` of
the state dict: weights do not change speed, and nothing can be downloaded here) and the same
photos: ``--images`` JPEGs of 500 x 375 px (landscape) or 375 x 500 (portrait), quality 90,
made offline by ``benchmarks/feed.py``'s :func:`make_photos` and imported with
``curate.collect.folder.import_folder`` (every row with its provenance).

Timed once each, in this process, in turn (CPU = user + system time of this process and its
threads and of the child processes that finished, so decoding workers count; wall = elapsed;
torch, timm and curate's modules are imported before any timing):

- **loop**: what a user writes: ``timm.create_model(arch, pretrained=False)``, ``load_state_dict``
  of the file, ``timm.data.resolve_data_config`` + ``create_transform`` (the model's eval
  transform) [model], then one photo at a time: PIL open, RGB, transform, ``model(x[None])``
  under ``torch.no_grad()``, the top-1 kept [photos];
- **curate**: ``load_model("timm:ARCH", FILE)`` [model], then
  :func:`curate.features.compute_features` over every photo into an empty feature cache (the
  encoding phase of ``curate evaluate``) [encoding];
- **curate evaluate**: :func:`curate.stages.evaluate.evaluate` from nothing (empty cache: model
  load, encoding, metrics with 1,000 bootstrap replicates, the run folder), as ``curate evaluate
  DIR --model timm:ARCH --pretrained FILE`` runs it.

Printed: seconds of each, the ratios loop / curate (above 1: curate is faster) of the encoding
alone, of model + encoding, and of the whole loop against ``evaluate`` from nothing, the
top-1 agreement of the loop and curate (a sanity check: the same function up to float noise) and
the load average (a shared machine inflates wall times; CPU times move less).
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from feed import make_photos  # noqa: E402 - the benchmarks' shared photo maker


def _cpu() -> float:
    """CPU seconds of this process (all threads) and of its finished children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Any) -> tuple[Any, float, float]:
    """``(result, wall s, CPU s)`` of one call."""
    wall, cpu = time.perf_counter(), _cpu()
    result = fn()
    return result, time.perf_counter() - wall, _cpu() - cpu


def plain_model(arch: str, weights: Path) -> tuple[Any, Any]:
    """The user's model and transform: timm's architecture, the file's state dict, timm's eval transform."""
    import timm
    import torch

    model = timm.create_model(arch, pretrained=False)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    model.eval()
    return model, timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))


def plain_loop(model: Any, transform: Any, paths: list[Path]) -> np.ndarray:
    """The user's loop, one photo at a time: PIL open, RGB, transform, forward; top-1 per photo."""
    import torch
    from PIL import Image

    top1 = []
    with torch.no_grad():
        for path in paths:
            with Image.open(path) as image:
                x = transform(image.convert("RGB"))
            top1.append(int(model(x.unsqueeze(0)).argmax(dim=1)))
    return np.array(top1)


def curate_model(arch: str, weights: Path) -> Any:
    """curate's model from the file (``--model timm:ARCH --pretrained FILE``)."""
    from curate.models import load_model

    return load_model(f"timm:{arch}", weights, device="cpu")


def curate_encode(ds: Any, ids: list[str], model: Any, batch_size: int | None) -> np.ndarray:
    """curate's encoding phase: every photo into an empty feature cache; top-1 per photo."""
    from curate.features import compute_features

    feats = compute_features(ds, model, ids, **({"batch_size": batch_size} if batch_size else {}))
    assert not feats.failed and feats.sample_ids == ids, feats.failed
    return feats.values.argmax(axis=1)


def curate_evaluate(root: Path, arch: str, weights: Path, batch_size: int | None) -> Any:
    """``curate evaluate`` as a library call, from nothing."""
    from curate.models import ModelSpec
    from curate.stages.evaluate import EvalSettings, evaluate

    settings = EvalSettings(device="cpu", **({"batch_size": batch_size} if batch_size else {}))
    return evaluate(root, ModelSpec(f"timm:{arch}", str(weights)), settings, run_name="bench", overwrite=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--arch", default="tf_efficientnet_lite0", help="a timm architecture (random weights, seeded)")
    parser.add_argument("--batch-size", type=int, default=None, help="curate's batch size (default: curate's own)")
    parser.add_argument("--keep", type=Path, default=None, help="build (or reuse) the photos and folder here")
    args = parser.parse_args()

    import timm
    import torch

    from curate.collect.folder import import_folder
    from curate.features import FEATURES_DIR
    from curate.store import Dataset

    work = args.keep or Path(tempfile.mkdtemp(prefix="curate-classifier-"))
    work.mkdir(parents=True, exist_ok=True)
    root = work / f"ds-{args.images}"
    if not (root / "dataset.yaml").exists():
        make_photos(work / f"src-{args.images}", args.images)
        import_folder(work / f"src-{args.images}", root, status="accepted")
    weights = work / f"{args.arch}.pt"
    torch.manual_seed(0)
    torch.save(timm.create_model(args.arch, pretrained=False).state_dict(), weights)
    ds = Dataset.open(root)
    ids = ds.sample_ids()
    paths = [ds.image_path(sid) for sid in ids]
    print(f"{len(ids)} JPEG photos (500 x 375), {args.arch} (random weights from {weights.name}), CPU, "
          f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")

    import curate.engine.local  # noqa: F401 - imported outside the timings, as timm and torch are
    import curate.features  # noqa: F401

    rows = []
    (model, transform), wall, cpu = timed(lambda: plain_model(args.arch, weights))
    rows.append(("timm loop: model from the file", wall, cpu))
    top1_loop, wall, cpu = timed(lambda: plain_loop(model, transform, paths))
    rows.append(("timm loop: photos one at a time", wall, cpu))
    shutil.rmtree(root / FEATURES_DIR, ignore_errors=True)
    loaded, wall, cpu = timed(lambda: curate_model(args.arch, weights))
    rows.append(("curate: load_model", wall, cpu))
    top1_curate, wall, cpu = timed(lambda: curate_encode(ds, ids, loaded, args.batch_size))
    rows.append(("curate: encoding (compute_features)", wall, cpu))
    shutil.rmtree(root / FEATURES_DIR, ignore_errors=True)
    _, wall, cpu = timed(lambda: curate_evaluate(root, args.arch, weights, args.batch_size))
    rows.append(("curate evaluate (from nothing)", wall, cpu))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")

    n = len(ids)
    print(f"{'':38s}{'wall s':>8s}{'CPU s':>8s}{'s/photo':>9s}")
    for label, wall, cpu in rows:
        print(f"{label:38s}{wall:8.1f}{cpu:8.1f}{wall / n:9.3f}")
    (_, lw0, lc0), (_, lw, lc), (_, cw0, cc0), (_, cw, cc), (_, ew, ec) = rows
    print(f"encoding, loop / curate: wall {lw / cw:.2f}x, CPU {lc / cc:.2f}x")
    print(f"model + encoding, loop / curate: wall {(lw0 + lw) / (cw0 + cw):.2f}x, CPU {(lc0 + lc) / (cc0 + cc):.2f}x")
    print(f"loop (model + photos) / curate evaluate from nothing: wall {(lw0 + lw) / ew:.2f}x, "
          f"CPU {(lc0 + lc) / ec:.2f}x")
    agree = float(np.mean(top1_loop == top1_curate))
    print(f"top-1 of the loop and of curate agree on {agree:.1%} of the photos")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
