"""Benchmark: iNaturalist collection throughput against the loopback fake server, and the cost
of a resume with nothing left to do.

Measures, on one fake world (tests/fake_inat.py; no rate limits, no faults):

1. ``curate`` collecting N photos per class (photos/s, wall time, API calls);
2. the naive loop a user would otherwise write (requests + one ``add_samples`` per photo,
   sequential), on the same listing and photos, as the peer: the ratio is printed;
3. re-running the finished job through the library (journal read, no HTTP) and through the
   CLI in a fresh process (adds interpreter start-up and imports).

    .venv/bin/python benchmarks/collect.py [--per-class 100] [--classes 3] [--concurrency 8] [--size 500]

With ``--hub``, ``curate collect hub`` instead: a local Hub folder of ``--rows`` image-classification
rows (``--size`` px JPEGs, ImageNet class names as a ``ClassLabel``, one parquet shard per 1,000
rows) imported by curate (label mapping, verification, journal) against the loop a user would
write: ``datasets.load_dataset`` of the folder, then save each image to a class folder. Wall
time and CPU time (user + system, this process and its children) of each, and of a re-run with
nothing left to do::

    .venv/bin/python benchmarks/collect.py --hub [--rows 10000] [--size 64] [--concurrency 4]
"""
from __future__ import annotations

import argparse
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import fake_inat  # noqa: E402
import requests  # noqa: E402

from curate.collect.inat import INatClass, collect_inat, make_client  # noqa: E402
from curate.store import Dataset, NewSample  # noqa: E402

CLASSES = [INatClass(9, "ostrich"), INatClass(10, "brambling"), INatClass(16, "bulbul", ("Pycnonotidae",))]
TAXA = [20001, 20002, 20003]


def naive(api_url: str, root: Path, per_class: int, classes: int) -> int:
    """What a user might write: page, download and add one photo at a time."""
    ds = Dataset.create(root, name="naive")
    session = requests.Session()
    added = 0
    for cls, taxon in zip(CLASSES[:classes], TAXA[:classes]):
        have, id_below = 0, None
        while have < per_class:
            params = {"taxon_id": taxon, "photos": "true", "quality_grade": "research", "order_by": "id",
                      "order": "desc", "per_page": 200, "photo_license": "cc0,cc-by,cc-by-nc"}
            if id_below:
                params["id_below"] = id_below
            results = session.get(f"{api_url}/observations", params=params, timeout=30).json()["results"]
            if not results:
                break
            for obs in results:
                photo = next((p for p in obs["photos"] if p["license_code"] in ("cc0", "cc-by", "cc-by-nc")), None)
                if photo is None or have >= per_class:
                    continue
                data = session.get(photo["url"].replace("square", "medium"), timeout=30).content
                report = ds.add_samples([NewSample(image=data, class_index=cls.index, source="inat",
                                                   source_id=str(photo["id"]), license=photo["license_code"])])
                have += len(report.added)
                added += len(report.added)
            id_below = min(o["id"] for o in results)
    return added


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def hub_folder(folder: Path, rows: int, size: int) -> list[str]:
    """A Hub folder of ``rows`` rows (``image``, ``label`` ClassLabel over ImageNet names); its class names."""
    import io

    import datasets
    import numpy as np
    from PIL import Image

    from curate.labels import imagenet1k

    names = [imagenet1k().names[i] for i in (9, 10, 11, 12, 13, 14, 15, 16, 17, 18)]
    rng = np.random.default_rng(0)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    shard_rows = 1000
    count = (rows + shard_rows - 1) // shard_rows
    for k in range(count):
        images, labels = [], []
        for _ in range(min(shard_rows, rows - k * shard_rows)):
            buffer = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, "JPEG", quality=90)
            images.append({"bytes": buffer.getvalue(), "path": None})
            labels.append(int(rng.integers(0, len(names))))
        shard = folder / "data" / f"train-{k:05d}-of-{count:05d}.parquet"
        shard.parent.mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict({"image": images, "label": labels}, features=features).to_parquet(str(shard))
    return names


def user_loop(folder: Path, out: Path) -> int:
    """What a user might write: ``load_dataset`` the folder, save each image under its class name."""
    import datasets

    rows = datasets.load_dataset(str(folder), split="train")
    names = rows.features["label"].names
    saved = 0
    for i, row in enumerate(rows):
        target = out / names[row["label"]] / f"{i:06d}.jpg"
        target.parent.mkdir(parents=True, exist_ok=True)
        row["image"].save(target)
        saved += 1
    return saved


def hub_main(args: argparse.Namespace) -> None:
    import os

    from curate.collect.hub import collect_hub

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        os.environ["HF_DATASETS_CACHE"] = str(tmp_path / "hf-cache")  # the user loop's arrow cache: fresh
        hub_folder(tmp_path / "src", args.rows, args.size)
        measured = {}
        for name, run in (("curate collect hub", lambda: len(collect_hub(tmp_path / "src", tmp_path / "curate",
                                                                          concurrency=args.concurrency).added)),
                          ("load_dataset + save", lambda: user_loop(tmp_path / "src", tmp_path / "loop")),
                          ("resume, nothing left", lambda: len(collect_hub(tmp_path / "src", tmp_path / "curate",
                                                                            concurrency=args.concurrency).added))):
            wall, cpu = time.perf_counter(), cpu_seconds()
            done = run()
            measured[name] = (time.perf_counter() - wall, cpu_seconds() - cpu, done)
    print(f"rows: {args.rows} ({args.size} px JPEG, 10 classes), local Hub folder, concurrency {args.concurrency}")
    for name, (wall, cpu, done) in measured.items():
        rate = f"{done / wall:8.1f} rows/s  " if done else " " * 16
        print(f"{name:22s}: {wall:7.2f} s wall  {cpu:7.2f} s CPU  {rate}({done} stored)")
    curate_wall, loop_wall = measured["curate collect hub"][0], measured["load_dataset + save"][0]
    print(f"ratio (wall)          : {loop_wall / curate_wall:7.2f}x the user loop's speed "
          "(curate also verifies each image, maps labels, journals and commits atomically)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hub", action="store_true", help="benchmark `curate collect hub` (see above)")
    parser.add_argument("--rows", type=int, default=10000, help="--hub: rows in the Hub folder")
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--classes", type=int, default=3, choices=[1, 2, 3])
    parser.add_argument("--concurrency", type=int, help="threads (default 8; --hub: 4)")
    parser.add_argument("--size", type=int,
                        help="edge of the served 'medium' photos (default 500, iNaturalist's; --hub: of the images, 64)")
    parser.add_argument("--photo-delay", type=float, default=0.0, help="server latency per photo (s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.hub:
        args.size, args.concurrency = args.size or 64, args.concurrency or 4
        hub_main(args)
        return
    args.size, args.concurrency = args.size or 500, args.concurrency or 8
    fake_inat.PHOTO_SIZES["medium"] = args.size
    world = fake_inat.make_world(n_per_taxon=int(args.per_class * 1.6) + 10, seed=0)
    classes = CLASSES[: args.classes]
    with tempfile.TemporaryDirectory() as tmp, fake_inat.FakeINat(world, photo_delay=args.photo_delay) as server:
        tmp_path = Path(tmp)
        # warm the server's JPEG cache so both contenders pay the same serving cost
        for photo in world.photos.values():
            server.jpeg(photo, "medium")
        client = make_client(api_url=server.api_url, api_rate=None, download_rate=None, byte_rate=None)
        start = time.perf_counter()
        import pyinaturalist.models  # noqa: F401 - a one-off cost of the first collection in a process
        import_s = time.perf_counter() - start
        start = time.perf_counter()
        report = collect_inat(tmp_path / "curate", classes, per_class=args.per_class, api_url=server.api_url,
                              client=client, concurrency=args.concurrency)
        curate_s = time.perf_counter() - start
        photos = len(report.added)
        mb = report.client["bytes"] / 1e6 if report.client.get("bytes") else sum(
            p.stat().st_size for p in (tmp_path / "curate" / "media").rglob("*") if p.is_file()) / 1e6

        start = time.perf_counter()
        naive_added = naive(server.api_url, tmp_path / "naive", args.per_class, args.classes)
        naive_s = time.perf_counter() - start

        start = time.perf_counter()
        again = collect_inat(tmp_path / "curate", classes, per_class=args.per_class, api_url=server.api_url,
                             client=client, concurrency=args.concurrency)
        resume_lib_s = time.perf_counter() - start
        assert not again.added and again.client["downloads"] == report.client["downloads"]

        cmd = [sys.executable, "-m", "curate.cli", "collect", "inat", str(tmp_path / "curate"), "--classes",
               ",".join(str(c.index) for c in classes), "--per-class", str(args.per_class), "--api-url",
               server.api_url, "--api-rate", "none", "--download-rate", "none", "--byte-rate", "none"]
        if args.classes == 3:
            cmd += ["--taxon", "16=Pycnonotidae"]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
        resume_cli_s = time.perf_counter() - start
        client.close()

    media = f"{mb:.1f} MB" if mb else "?"
    print(f"photos: {photos} ({args.classes} classes x {args.per_class}), medium = {args.size} px, {media} stored, "
          f"concurrency {args.concurrency}, no rate limit, loopback")
    print(f"curate collect inat : {curate_s:7.2f} s  {photos / curate_s:7.1f} photos/s  "
          f"({report.client['api_calls']} API calls)")
    print(f"  (plus {import_s:.2f} s importing pyinaturalist once per process, not counted above)")
    print(f"naive loop (peer)   : {naive_s:7.2f} s  {naive_added / naive_s:7.1f} photos/s")
    print(f"ratio               : {naive_s / curate_s:7.2f}x faster than the naive loop")
    print(f"resume, nothing left: {resume_lib_s * 1000:7.1f} ms (library, 0 HTTP requests), "
          f"{resume_cli_s:.2f} s (CLI in a new process, incl. start-up)")


if __name__ == "__main__":
    main()
