"""Benchmark: iNaturalist collection throughput against the loopback fake server, and the cost
of a resume with nothing left to do.

Measures, on one fake world (tests/fake_inat.py; no rate limits, no faults):

1. ``curate`` collecting N photos per class (photos/s, wall time, API calls);
2. the naive loop a user would otherwise write (requests + one ``add_samples`` per photo,
   sequential), on the same listing and photos, as the peer: the ratio is printed;
3. re-running the finished job through the library (journal read, no HTTP) and through the
   CLI in a fresh process (adds interpreter start-up and imports).

    .venv/bin/python benchmarks/collect.py [--per-class 100] [--classes 3] [--concurrency 8] [--size 500]

With ``--hub``, the importers instead (issue 42), each against the loop a user would write, one run
each, wall time and CPU time (user + system, this process and its children) both printed with their
ratios, on data shaped like a collector's (every row its licence, attribution and source URL):

- ``curate collect hub``: a local Hub folder of ``--rows`` image-classification rows (``--size`` px
  JPEGs, ImageNet class names as a ``ClassLabel``, one parquet shard per 1,000 rows) imported by curate
  (label mapping, verification, journal) against ``datasets.load_dataset`` of the folder, then saving
  each image to a class folder and its provenance to a CSV;
- ``curate collect folder``: an ImageFolder of as many JPEGs with a licences CSV against copying each
  file and checking it with ``PIL.Image.open(...).verify()`` (and, a second peer, loading it in full),
  its provenance to a CSV;

and a re-run of each with nothing left to do::

    .venv/bin/python benchmarks/collect.py --hub [--rows 10000] [--size 64] [--concurrency 4] [--repeat 1]

``--repeat N`` runs N rounds, each into fresh output folders, curate and its loop alternating within a
round, and prints each figure's median with its range: one run's ratio moved from 0.73x to 1.29x between
three quiet runs on this 2-core VM (2026-11-29), since creating 10,000 files costs both sides most of
their time and that cost moves with the file system's state.
"""
from __future__ import annotations

import argparse
import logging
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
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


CLASS_INDICES = (9, 10, 11, 12, 13, 14, 15, 16, 17, 18)
LICENCES = ("cc-by", "cc0", "cc-by-nc", "cc-by-sa")


def provenance(i: int) -> dict[str, str]:
    """Row ``i``'s provenance, as a collector records it per row: licence, attribution, source URL."""
    return {"license": LICENCES[i % len(LICENCES)], "attribution": f"(c) photographer {i % 97}",
            "source_url": f"https://example.org/photos/{i}"}


def jpegs(rows: int, size: int) -> Iterator[tuple[int, bytes]]:
    """``rows`` random ``size`` px RGB JPEGs (quality 90) and their labels (0..9), from seed 0."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for _ in range(rows):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, "JPEG", quality=90)
        yield int(rng.integers(0, len(CLASS_INDICES))), buffer.getvalue()


def hub_folder(folder: Path, rows: int, size: int) -> list[str]:
    """A Hub folder of ``rows`` rows (``image``, ``label`` ClassLabel over ImageNet names, and the per-row
    provenance a collector keeps: ``licence``, ``attribution``, ``source_url``); its class names."""
    import datasets

    from curate.labels import imagenet1k

    names = [imagenet1k().names[i] for i in CLASS_INDICES]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names),
                                  "licence": datasets.Value("string"), "attribution": datasets.Value("string"),
                                  "source_url": datasets.Value("string")})
    shard_rows = 1000
    count = (rows + shard_rows - 1) // shard_rows
    made = jpegs(rows, size)
    for k in range(count):
        columns: dict[str, list] = {name: [] for name in features}
        for i in range(k * shard_rows, min(rows, (k + 1) * shard_rows)):
            label, data = next(made)
            columns["image"].append({"bytes": data, "path": None})
            columns["label"].append(label)
            row = provenance(i)
            columns["licence"].append(row["license"])
            columns["attribution"].append(row["attribution"])
            columns["source_url"].append(row["source_url"])
        shard = folder / "data" / f"train-{k:05d}-of-{count:05d}.parquet"
        shard.parent.mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict(columns, features=features).to_parquet(str(shard))
    return names


def user_loop(folder: Path, out: Path) -> int:
    """What a user might write: ``load_dataset`` the folder, save each image under its class name, and keep
    each row's provenance (licence, attribution, source URL) in a CSV beside the images."""
    import csv

    import datasets

    rows = datasets.load_dataset(str(folder), split="train")
    names = rows.features["label"].names
    saved = 0
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "provenance.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label", "license", "attribution", "source_url"])
        for i, row in enumerate(rows):
            target = out / names[row["label"]] / f"{i:06d}.jpg"
            target.parent.mkdir(parents=True, exist_ok=True)
            row["image"].save(target)
            writer.writerow([target.relative_to(out).as_posix(), names[row["label"]], row["licence"],
                             row["attribution"], row["source_url"]])
            saved += 1
    return saved


def image_folder(folder: Path, rows: int, size: int) -> Path:
    """An ImageFolder of ``rows`` JPEGs (``<class index>/<n>.jpg``) and its licences CSV (path, license,
    attribution, source_url: the per-file provenance ``collect folder --licenses`` reads); the CSV's path."""
    import csv

    table = folder.parent / f"{folder.name}-licences.csv"
    with open(table, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "license", "attribution", "source_url"])
        for i, (label, data) in enumerate(jpegs(rows, size)):
            rel = f"{CLASS_INDICES[label]}/{i:06d}.jpg"
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(data)
            row = provenance(i)
            writer.writerow([rel, row["license"], row["attribution"], row["source_url"]])
    return table


def copy_loop(folder: Path, table: Path, out: Path, *, load: bool) -> int:
    """What a user might write: copy each file of the folder, check it with ``PIL.Image.open(...).verify()``
    (``load``: open it again and decode it in full, the check that finds a truncated file), and keep its
    provenance from the licences CSV in a CSV beside the copies."""
    import csv

    from PIL import Image

    with open(table, newline="") as handle:
        licences = {row["path"]: row for row in csv.DictReader(handle)}
    out.mkdir(parents=True, exist_ok=True)
    copied = 0
    with open(out / "provenance.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "license", "attribution", "source_url"])
        for path in sorted(folder.rglob("*.jpg")):
            rel = path.relative_to(folder).as_posix()
            target = out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            with Image.open(target) as img:
                img.verify()
            if load:
                with Image.open(target) as img:
                    img.load()
            row = licences[rel]
            writer.writerow([rel, row["license"], row["attribution"], row["source_url"]])
            copied += 1
    return copied


def measure(runs: list[tuple[str, Callable[[], int]]]) -> dict[str, tuple[float, float, int]]:
    """``name -> (wall s, CPU s, rows stored)`` of each run, one after the other, once each."""
    measured = {}
    for name, run in runs:
        wall, cpu = time.perf_counter(), cpu_seconds()
        done = run()
        measured[name] = (time.perf_counter() - wall, cpu_seconds() - cpu, done)
    return measured


def median_runs(rounds: list[dict[str, tuple[float, float, int]]]) -> dict[str, tuple[float, float, int]]:
    """Each run's median wall and CPU seconds over ``rounds`` (one round: :func:`measure`'s result)."""
    import statistics

    return {name: (statistics.median(r[name][0] for r in rounds), statistics.median(r[name][1] for r in rounds),
                   rounds[0][name][2]) for name in rounds[0]}


def print_runs(measured: dict[str, tuple[float, float, int]],
               rounds: list[dict[str, tuple[float, float, int]]] | None = None) -> None:
    """One line a run; with several ``rounds`` (``measured`` their medians), each figure's range too."""
    for name, (wall, cpu, done) in measured.items():
        rate = f"{done / wall:8.1f} rows/s  " if done else " " * 16
        spread = ""
        if rounds and len(rounds) > 1:
            walls, cpus = [r[name][0] for r in rounds], [r[name][1] for r in rounds]
            spread = f"  [wall {min(walls):.2f}-{max(walls):.2f}, CPU {min(cpus):.2f}-{max(cpus):.2f}]"
        print(f"  {name:32s}: {wall:7.2f} s wall  {cpu:7.2f} s CPU  {rate}({done} stored){spread}")


def print_ratio(label: str, measured: dict[str, tuple[float, float, int]], ours: str, peer: str) -> None:
    """``peer / ours`` for wall and CPU time: above 1.0, curate is the faster."""
    (our_wall, our_cpu, _), (peer_wall, peer_cpu, _) = measured[ours], measured[peer]
    print(f"  ratio {label:26s}: {peer_wall / our_wall:5.2f}x wall, {peer_cpu / our_cpu:5.2f}x CPU "
          f"(the plain loop's time / curate's; > 1.0: curate is faster)")


def importers_main(args: argparse.Namespace) -> None:
    """``collect hub`` against ``load_dataset`` + save, then ``collect folder`` against copy-and-verify."""
    import os

    from curate.collect.folder import import_folder
    from curate.collect.hub import collect_hub

    concurrency, repeat = args.concurrency, max(1, args.repeat)
    hub_rounds, folder_rounds = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        os.environ["HF_DATASETS_CACHE"] = str(tmp_path / "hf-cache")  # the user loop's arrow cache: fresh
        hub_folder(tmp_path / "hub-src", args.rows, args.size)
        table = image_folder(tmp_path / "folder-src", args.rows, args.size)
        for r in range(repeat):  # each round into fresh folders; the re-runs find their round's output
            out = tmp_path / f"round-{r}"

            def hub(out: Path = out) -> int:
                return len(collect_hub(tmp_path / "hub-src", out / "hub-curate", license_column="licence",
                                       attribution_column="attribution", concurrency=concurrency).added)

            def folder(out: Path = out) -> int:
                return len(import_folder(tmp_path / "folder-src", out / "folder-curate", licenses_csv=table,
                                         concurrency=concurrency).added)

            hub_rounds.append(measure([
                ("curate collect hub", hub),
                ("load_dataset + save", lambda out=out: user_loop(tmp_path / "hub-src", out / "hub-loop")),
                ("collect hub, resume (nothing)", hub)]))
            folder_rounds.append(measure([
                ("curate collect folder", folder),
                ("copy + verify()", lambda out=out: copy_loop(tmp_path / "folder-src", table, out / "copy-v",
                                                              load=False)),
                ("copy + verify() + load()", lambda out=out: copy_loop(tmp_path / "folder-src", table, out / "copy-l",
                                                                       load=True)),
                ("collect folder, resume (nothing)", folder)]))
            shutil.rmtree(out, ignore_errors=True)
    hub_runs, folder_runs = median_runs(hub_rounds), median_runs(folder_rounds)
    each = "one run each" if repeat == 1 else f"median of {repeat} rounds [range], curate and its loop alternating"
    print(f"rows: {args.rows} ({args.size} px JPEG, 10 classes, per-row licence, attribution and source URL), "
          f"concurrency {concurrency}, {each}, CPU = user + system of this process and its children")
    print("collect hub (a local Hub folder, 1,000 rows a parquet shard):")
    print_runs(hub_runs, hub_rounds)
    print_ratio("hub vs load_dataset+save", hub_runs, "curate collect hub", "load_dataset + save")
    print("collect folder (an ImageFolder with a licences CSV):")
    print_runs(folder_runs, folder_rounds)
    print_ratio("folder vs copy+verify()", folder_runs, "curate collect folder", "copy + verify()")
    print_ratio("folder vs copy+verify()+load()", folder_runs, "curate collect folder", "copy + verify() + load()")
    print("What the ratios show: what each import costs as a user meets it on this machine (one run is noisy, "
          "even quiet:\n  --repeat N prints medians; under load read the CPU ratio first). What they cannot show: the loops check and keep less (the hub "
          "loop re-encodes\n  each JPEG and verifies nothing beyond its decode; verify() alone does not decode the "
          "pixels, so it misses a\n  truncated file; neither loop journals for a resume, commits atomically or "
          "deduplicates by content), so a\n  ratio is not a like-for-like speed-up; random-noise JPEGs decode "
          "slower than photos of the same size.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hub", action="store_true",
                        help="benchmark `curate collect hub` and `curate collect folder` (see above)")
    parser.add_argument("--rows", type=int, default=10000, help="--hub: rows of the Hub folder and of the folder")
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--classes", type=int, default=3, choices=[1, 2, 3])
    parser.add_argument("--concurrency", type=int, help="threads (default 8; --hub: 4)")
    parser.add_argument("--size", type=int,
                        help="edge of the served 'medium' photos (default 500, iNaturalist's; --hub: of the images, 64)")
    parser.add_argument("--photo-delay", type=float, default=0.0, help="server latency per photo (s)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="--hub: rounds, each figure's median and range printed (default 1: one run each)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.hub:
        args.size, args.concurrency = args.size or 64, args.concurrency or 4
        importers_main(args)
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
