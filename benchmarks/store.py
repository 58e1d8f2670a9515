"""Benchmark: the dataset folder at 10k, 100k and 1M rows (issue 17's targets).

For each size, a folder is built quickly (tests/scale_helpers.py: distinct 1x1 PNGs written by
hand, rows written straight to samples.parquet; a valid folder, deep check included), then timed:

- ``Dataset.open`` (validation included: the whole-column checks; the media folders are listed
  only when samples.parquet or a folder changed since the last complete check, so "open" is a
  folder opened again and "open after a commit" the first open after ``update``, which lists
  every media folder);
- ``select`` on two columns (``status="accepted", background="ground"``);
- ``update`` of 1,000 random rows (one field each: a commit, i.e. samples.parquet rewritten
  atomically, and 1,000 change-log lines);
- ``add_samples`` of 10,000 new tiny PNGs (ten commits of 1,000), with the time the same
  images take in ``prepare_image`` alone subtracted ("image preparation excluded");
- ``curate info`` and ``curate check`` as a user runs them (a fresh process: interpreter start
  and imports included).

The peer is plain pyarrow on the same file: ``pq.read_table`` (what any tool pays to read the
rows) for open, ``pq.write_table`` for one commit. The ratios say what curate adds on top of
reading or writing the table. Each figure is the median of ``--repeat`` runs (open, select,
info), or one run (update, add: they change the folder). Targets at 1M rows (issue 17): open
< 2 s, select < 0.5 s, update 1k < 3 s, add 10k < 30 s.

    .venv/bin/python benchmarks/store.py [--sizes 10000,100000,1000000] [--keep DIR] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import pyarrow.parquet as pq  # noqa: E402
from scale_helpers import build_folder, tiny_png  # noqa: E402

from curate.store import Dataset, NewSample, check_dataset, prepare_image  # noqa: E402
from curate.store import schema as S  # noqa: E402

TARGETS = {"open": 2.0, "open after a commit": 2.0, "select": 0.5, "update 1k": 3.0, "add 10k": 30.0}
CURATE = [str(Path(sys.executable).with_name("curate"))]


def timed(fn, repeat: int = 1) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def cli(*args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([*CURATE, *args], capture_output=True, text=True, cwd=REPO)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"curate {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return elapsed


def bench(root: Path, n: int, repeat: int) -> dict[str, float]:
    out: dict[str, float] = {}
    if (root / "dataset.yaml").is_file():  # --keep: a folder from an earlier run (grown by its adds)
        out["build"] = float("nan")
    else:
        out["build"], _ = timed(lambda: build_folder(root, n))
    path = root / "samples.parquet"
    out["size MB"] = path.stat().st_size / 1e6
    out["open"], ds = timed(lambda: Dataset.open(root), repeat)
    out["pq.read_table"], table = timed(lambda: pq.read_table(path), repeat)
    out["select"], picked = timed(lambda: ds.select(status="accepted", background="ground"), repeat)
    assert picked.num_rows > 0
    ids = random.Random(0).sample(ds.sample_ids(), 1000)
    stamp = f"bench run {time.time():.6f}"  # a new value, so all 1,000 rows change on a reused folder too
    out["update 1k"], changed = timed(lambda: ds.update(ids, {"reject_reason": stamp}, actor="bench", reason="bench"))
    assert changed == 1000, changed
    out["open after a commit"], _ = timed(lambda: Dataset.open(root))  # lists every media folder again
    scratch = root.parent / "write-floor.parquet"
    out["pq.write_table"], _ = timed(lambda: pq.write_table(table, scratch, **S.PARQUET_OPTIONS))
    scratch.unlink()
    first = len(ds)  # build_folder and earlier runs used colours 0 .. len(ds) - 1
    images = [tiny_png(first + i) for i in range(10_000)]
    out["prepare 10k"], _ = timed(lambda: [prepare_image(data) for data in images])
    items = [NewSample(image=data, class_index=i % 1000, source="synthetic", source_id=f"new{i}", license="cc0")
             for i, data in enumerate(images)]
    out["add 10k (total)"], report = timed(lambda: ds.add_samples(items, actor="bench"))
    assert len(report.added) == 10_000, report
    out["add 10k"] = out["add 10k (total)"] - out["prepare 10k"]
    out["curate info"] = statistics.median(cli("info", str(root)) for _ in range(repeat))
    out["curate check"] = cli("check", str(root))
    problems = [p for p in check_dataset(root) if p.severity == "error"]
    assert not problems, problems[:3]
    assert len(ds.changes()) >= 11_000  # 1,000 updates + 10,000 adds logged
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="build the folders here and keep them; a later run reuses them "
                        "(each run adds 10,000 rows). Default: a temporary folder, removed at the end")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    base = args.keep or Path(tempfile.mkdtemp(prefix="curate-store-bench-"))
    results: dict[int, dict[str, float]] = {}
    try:
        for n in sizes:
            root = base / f"ds{n}"
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
            print(f"building and timing {n:,} rows in {root} ...", file=sys.stderr, flush=True)
            results[n] = bench(root, n, args.repeat)
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(f"\ndataset folder timings (seconds; median of {args.repeat} for open/select/info; one run for "
          f"update/add; load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs)")
    keys = ["build", "size MB", "open", "open after a commit", "pq.read_table", "select", "update 1k", "pq.write_table",
            "add 10k (total)", "prepare 10k", "add 10k", "curate info", "curate check"]
    print("| measure | " + " | ".join(f"{n:,} rows" for n in sizes) + " | target at 1M |")
    print("|---|" + "---|" * (len(sizes) + 1))
    for key in keys:
        target = TARGETS.get(key)
        cells = []
        for n in sizes:
            value = results[n][key]
            mark = ""
            if target is not None and n >= 1_000_000:
                mark = " ok" if value < target else " MISSED"
            cells.append(f"{value:.2f}{mark}" if key != "size MB" else f"{value:.0f}")
        print(f"| {key} | " + " | ".join(cells) + f" | {'< ' + format(target, 'g') if target else ''} |")
    print("\nratios against plain pyarrow on the same file (1.0 = curate adds nothing):")
    for n in sizes:
        r = results[n]
        print(f"  {n:,} rows: open / pq.read_table = {r['open'] / r['pq.read_table']:.1f}x, "
              f"update 1k / pq.write_table = {r['update 1k'] / r['pq.write_table']:.1f}x")
    print("'add 10k' = add_samples of 10,000 tiny PNGs minus prepare_image on the same bytes; "
          "curate info/check include interpreter start-up and imports.")


if __name__ == "__main__":
    main()
