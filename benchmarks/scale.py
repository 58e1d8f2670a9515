"""Engine throughput: the local engine vs Ray Data with 1 and 2 workers, same images, one run.

    .venv/bin/python benchmarks/scale.py --model ViT-B-32 --images 512 --device cpu

What is timed (wall clock; images/s = images / seconds) is :func:`curate.features.compute_features`
encoding every image of a fresh feature cache, writing the shards and compacting them:

- ``local``: the in-process engine (torch ``DataLoader``, the model in this process);
- ``ray xN``: Ray Data with N model actors, on a local Ray instance started once beforehand
  (its start-up is timed and printed apart: a cluster pays it once, not per run). Each run
  still pays Ray Data's per-run costs: actor start-up and one model load per actor, reading
  the samples file, scheduling.

Then a projection for a cluster from the per-worker figure, with its assumptions printed:
throughput = workers x (per-worker images/s measured with ``ray x1``) x efficiency, valid while
(1) enough CPUs decode (``decode img/s per CPU`` is measured here, so CPUs per worker =
per-worker rate / decode rate), (2) shared storage serves the images (one image is
``--image-size`` px here; real photos are larger), (3) the driver keeps up writing shards
(measured: ``shard write MB/s``). The efficiency default 0.9 is an assumption, not a
measurement. ``os.getloadavg()`` is printed beside every figure: on a shared machine a load
above the core count inflates every timing.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (then each Ray worker gets --gpus-per-worker)")
    parser.add_argument("--gpus-per-worker", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2], help="Ray worker counts to time")
    parser.add_argument("--efficiency", type=float, default=0.9, help="assumed scaling efficiency of the projection")
    parser.add_argument("--project", type=int, nargs="*", default=[8, 32, 128], help="worker counts to project")
    args = parser.parse_args()

    import ray

    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
    from curate.engine import make_engine
    from curate.engine.base import ModelFactory
    from curate.features import FeatureCache, _ImageFiles, compute_features
    from curate.models import load_model

    work = Path(tempfile.mkdtemp(prefix="curate-scale-"))
    classes = DEFAULT_CLASSES[:6]
    ds = collect_synthetic(work / "ds", WorldSpec(classes=classes, per_class=max(1, args.images // len(classes)),
                                                  image_size=args.image_size, seed=0))
    ids = [r["sample_id"] for r in ds.rows()]
    n = len(ids)
    seeded = load_model(args.model, None, seed=0)
    weights = work / "weights.pt"
    torch.save({"state_dict": seeded.module.state_dict(), "curate": {"arch": args.model}}, weights)
    model = load_model(args.model, weights, device=args.device)
    factory = ModelFactory(args.model, str(weights), expected_model_id=model.model_id)
    cache = FeatureCache(ds.root, model, "embedding")
    print(f"{args.model} on {args.device}, {n} images of {args.image_size} px, batch {args.batch_size}, "
          f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}")

    start = time.perf_counter()
    files = _ImageFiles([ds.image_path(s) for s in ids], model.preprocess, model.image_size)
    for i in range(len(files)):
        files[i]
    decode_rate = n / (time.perf_counter() - start)

    results: list[tuple[str, float, float]] = []

    def timed(label: str, engine) -> None:
        shutil.rmtree(cache.folder, ignore_errors=True)
        load = os.getloadavg()[0]
        start = time.perf_counter()
        feats = compute_features(ds, model, ids, batch_size=args.batch_size, engine=engine, factory=factory)
        seconds = time.perf_counter() - start
        assert feats.computed == n and len(feats.sample_ids) == n
        results.append((label, seconds, load))
        print(f"{label}: {seconds:.1f} s ({n / seconds:.1f} img/s, load {load:.2f})", flush=True)

    timed("local", make_engine("local", workers=0))
    load = os.getloadavg()[0]
    start = time.perf_counter()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,  # never a running cluster
             object_store_memory=512 * 1024 * 1024, log_to_driver=False)
    ray_start = time.perf_counter() - start
    print(f"ray.init (local instance): {ray_start:.1f} s (load {load:.2f})", flush=True)
    try:
        for k in args.workers:
            timed(f"ray x{k}", make_engine("ray", workers=k, gpus_per_worker=args.gpus_per_worker))
    finally:
        ray.shutdown()

    import io

    import numpy as np

    values = np.random.default_rng(0).standard_normal((n, model.embed_dim)).astype(np.float32)
    start = time.perf_counter()
    cache.append(ids, values)
    write_rate = len(io.BytesIO(values.tobytes()).getvalue()) / 1e6 / (time.perf_counter() - start)

    local_s = results[0][1]
    print(f"\n{'engine':12s}{'seconds':>10s}{'img/s':>10s}{'vs local':>10s}{'load':>8s}")
    for label, seconds, load in results:
        print(f"{label:12s}{seconds:10.1f}{n / seconds:10.1f}{local_s / seconds:9.2f}x{load:8.2f}")
    per_worker = next((n / s for label, s, _ in results if label == "ray x1"), None)
    print(f"\ndecode img/s per CPU: {decode_rate:.0f}   shard write MB/s: {write_rate:.0f}   "
          f"ray start-up: {ray_start:.1f} s (once per cluster)")
    if per_worker:
        print(f"projection: workers x {per_worker:.1f} img/s per worker (ray x1, measured here) x efficiency "
              f"{args.efficiency} (assumed); needs {per_worker / decode_rate:.2f} decoding CPUs per worker, "
              "storage that serves the images, and a driver writing shards")
        for k in args.project:
            rate = k * per_worker * args.efficiency
            print(f"  {k:4d} workers: {rate:10.0f} img/s   (1M images in {1e6 / rate / 60:.0f} min)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
