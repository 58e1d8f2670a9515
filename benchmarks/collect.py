"""Benchmark: iNaturalist collection throughput against the loopback fake server, and the cost
of a resume with nothing left to do.

Measures, on one fake world (tests/fake_inat.py; no rate limits, no faults):

1. ``curate`` collecting N photos per class (photos/s, wall time, API calls);
2. the naive loop a user would otherwise write (requests + one ``add_samples`` per photo,
   sequential), on the same listing and photos, as the peer: the ratio is printed;
3. re-running the finished job through the library (journal read, no HTTP) and through the
   CLI in a fresh process (adds interpreter start-up and imports).

    .venv/bin/python benchmarks/collect.py [--per-class 100] [--classes 3] [--concurrency 8] [--size 500]
"""
from __future__ import annotations

import argparse
import logging
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--classes", type=int, default=3, choices=[1, 2, 3])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--size", type=int, default=500, help="edge of the served 'medium' photos (iNaturalist: 500)")
    parser.add_argument("--photo-delay", type=float, default=0.0, help="server latency per photo (s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
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
