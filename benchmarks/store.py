"""Benchmark: the dataset folder at 100k and 1M rows shaped like a collector's (issues 17, 29).

For each size, a folder is built quickly (tests/scale_helpers.py: distinct 1x1 PNGs written by
hand, rows written straight to samples.parquet; a valid folder, deep check included), then its
rows are made **collector-shaped** (:func:`collector_columns`): every row carries its own
provenance, as ``curate collect inat`` and ``collect folder`` write it. Nine rows in ten are
iNaturalist photos (``extra`` holds observation id and URL, photo id, observer, place,
coordinates, taxon, licence code, job: ~650 bytes of JSON, unique per row; ``source_id``,
``source_url``, ``attribution`` unique too), one in ten comes from a folder (``extra`` holds the
original path and class folder). Then, timed:

- ``Dataset.open`` as a user meets it: "open, first" is the first open after samples.parquet was
  written by another tool (nothing recorded yet: every ``extra`` is parsed and the media folders
  are listed), "open" a folder opened again, "open after a commit" the first open after
  ``update`` (curate's writers carry the validation records forward);
- ``select`` on two columns (``status="accepted", background="ground"``);
- ``update`` of 1,000 random rows (one field each: a commit, i.e. samples.parquet rewritten
  atomically, and 1,000 change-log lines);
- ``add_samples`` of 10,000 new tiny PNGs (ten commits of 1,000) with iNaturalist-shaped
  ``extra``, with the time the same images take in ``prepare_image`` alone subtracted;
- ``curate info`` and ``curate check`` as a user runs them (a fresh process: interpreter start
  and imports included).

Every figure is printed as **wall / CPU (system) seconds**: CPU time (user + system of this
process and its threads, or of the child process for the CLI) moves much less with the load of a
shared machine than wall time; the system part (mostly first-touch page faults of the ~1 GB
table) is shown apart because it is the part that still varies with load. The peer is plain pyarrow on the same file: ``pq.read_table`` for open,
``pq.write_table`` for one commit, and for ``curate check`` the loop a user would write instead
(:data:`HAND_CHECK`, a fresh process: ``pq.read_table``, then per row ``json.loads`` of
``extra``, ``os.path.isfile`` of the image and a set of seen ids; it checks far less than curate:
no vocabularies, classes, canonical paths, masks or hashes). Each figure is the median of ``--repeat`` runs (open, select,
info), or one run (the rest: they change the folder). Targets at 1M rows: open < 2 CPU-s,
info < 2.5, check < 5 (issue 29); select < 0.5 s, update 1k < 3 s, add 10k < 30 s (issue 17).

    .venv/bin/python benchmarks/store.py                          # 100k rows, a minute or two
    .venv/bin/python benchmarks/store.py --rows 100000,1000000    # the 1M folder takes minutes to build
    .venv/bin/python benchmarks/store.py --rows 1000000 --keep DIR  # keep (and later reuse) the folders
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from scale_helpers import build_folder, tiny_png  # noqa: E402

from curate.store import Dataset, NewSample, check_dataset, prepare_image  # noqa: E402
from curate.store import schema as S  # noqa: E402

#: measure -> (target, "wall" or "cpu"): which figure the target is about at 1M rows.
TARGETS: dict[str, tuple[float, str]] = {
    "open": (2.0, "cpu"), "open after a commit": (2.0, "cpu"), "curate info": (2.5, "cpu"),
    "curate check": (5.0, "cpu"), "select": (0.5, "wall"), "update 1k": (3.0, "wall"), "add 10k": (30.0, "wall"),
}
CURATE = [str(Path(sys.executable).with_name("curate"))]
Figure = tuple[float, float, float]  # (wall seconds, CPU seconds, of which system)


def _cpu(who: int = resource.RUSAGE_SELF) -> tuple[float, float]:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime, usage.ru_stime


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[Figure, Any]:
    """(median wall, median CPU, median system CPU) of ``repeat`` calls, and the last result."""
    walls, cpus, syss, result = [], [], [], None
    for _ in range(repeat):
        (cpu, sys_cpu), start = _cpu(), time.perf_counter()
        result = fn()
        walls.append(time.perf_counter() - start)
        after = _cpu()
        cpus.append(after[0] - cpu)
        syss.append(after[1] - sys_cpu)
    return (statistics.median(walls), statistics.median(cpus), statistics.median(syss)), result


def cli(*args: str) -> Figure:
    """Wall, CPU and system CPU seconds of one ``curate`` process (from RUSAGE_CHILDREN)."""
    (cpu, sys_cpu), start = _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run([*CURATE, *args], capture_output=True, text=True, cwd=REPO)
    after = _cpu(resource.RUSAGE_CHILDREN)
    figure = (time.perf_counter() - start, after[0] - cpu, after[1] - sys_cpu)
    if done.returncode != 0:
        raise SystemExit(f"curate {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return figure


#: The check a user would write by hand with pyarrow and the standard library (see the module
#: docstring): the peer of ``curate check``. Prints the number of rows it finds wrong.
HAND_CHECK = """
import json, os, sys
import pyarrow.parquet as pq
root = sys.argv[1]
table = pq.read_table(os.path.join(root, "samples.parquet"))
seen, bad = set(), 0
for sid, path, extra in zip(*(table.column(c).to_pylist() for c in ("sample_id", "filepath", "extra"))):
    try:
        ok = isinstance(json.loads(extra), dict)
    except ValueError:
        ok = False
    ok = ok and os.path.isfile(os.path.join(root, path)) and sid not in seen
    seen.add(sid)
    bad += not ok
print(bad)
"""


def hand_check(root: Path) -> Figure:
    """Wall, CPU and system CPU seconds of :data:`HAND_CHECK` in a fresh process."""
    (cpu, sys_cpu), start = _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run([sys.executable, "-c", HAND_CHECK, str(root)], capture_output=True, text=True, check=True)
    after = _cpu(resource.RUSAGE_CHILDREN)
    assert done.stdout.strip() == "0", done.stdout  # the folder is valid: the loop must agree
    return time.perf_counter() - start, after[0] - cpu, after[1] - sys_cpu


def _text(values: np.ndarray) -> pa.Array:
    return pa.array(values.astype(str), type=pa.string())


def inat_extra(ordinal: np.ndarray) -> pa.Array:
    """``extra`` as ``curate collect inat`` writes it (curate/collect/inat.py; keys sorted, as
    ``json.dumps(sort_keys=True)``), unique per row, built with arrow string kernels."""
    obs, photo, user = _text(10_000_000 + ordinal * 7), _text(50_000_000 + ordinal * 3), _text(ordinal % 50_000)
    taxon = _text(40_000 + ordinal % 45)
    parts: list[Any] = [
        '{"inat_job": "inat-2024-05-01T10:00:00", "license_code": "CC-BY-NC", "location": [',
        _text(np.round((ordinal % 1_800) / 10 - 90, 1)), ", ", _text(np.round((ordinal % 3_600) / 10 - 180, 1)),
        '], "observation_id": ', obs, ', "observation_url": "https://www.inaturalist.org/observations/', obs,
        '", "observed_at": "2023-05-', _text(10 + ordinal % 18), "T", _text(10 + ordinal % 12),
        ':00:00+00:00", "observed_on": "2023-05-', _text(10 + ordinal % 18), '", "observer": "naturalist', user,
        '", "observer_id": ', user, ', "observer_name": "Observer Number ', user,
        '", "original_dimensions": [2048, 1536], "photo_id": ', photo,
        ', "photo_size": "medium", "place": "Nature Reserve ', _text(ordinal % 900),
        ', Some County, Some Country", "quality_grade": "research", "query_taxon_ids": [', taxon,
        '], "taxon_common_name": "Common Animal ', _text(ordinal % 45), '", "taxon_id": ', taxon,
        ', "taxon_name": "Genus species', _text(ordinal % 45), '", "taxon_rank": "species"}',
    ]
    return pc.binary_join_element_wise(*parts, "")


def folder_extra(ordinal: np.ndarray) -> pa.Array:
    """``extra`` as ``curate collect folder`` writes it (curate/collect/folder.py)."""
    cls = _text(ordinal % 45)
    return pc.binary_join_element_wise('{"folder_class": "class', cls, '", "folder_path": "class', cls,
                                       "/IMG_", _text(ordinal), '.jpg"}', "")


def collector_columns(table: pa.Table) -> pa.Table:
    """``table`` with per-row provenance in source, source_id, source_url, license, attribution
    and ``extra``: nine rows in ten from iNaturalist, one in ten from a folder."""
    n = table.num_rows
    ordinal = np.arange(n)
    inat = ordinal % 10 != 0
    mask = pa.array(inat)
    photo = _text(50_000_000 + ordinal * 3)
    values = {
        "source": pc.if_else(mask, "inat", "folder"),
        "source_id": pc.if_else(mask, photo, pc.binary_join_element_wise("class", _text(ordinal % 45), "/IMG_",
                                                                          _text(ordinal), ".jpg", "")),
        "source_url": pc.if_else(mask, pc.binary_join_element_wise(
            "https://inaturalist-open-data.s3.amazonaws.com/photos/", photo, "/medium.jpg", ""), None),
        "license": pc.if_else(mask, "cc-by-nc", "cc-by"),
        "attribution": pc.if_else(mask, pc.binary_join_element_wise(
            "(c) Observer Number ", _text(ordinal % 50_000), ", some rights reserved (CC BY-NC)", ""), "a lab"),
        "extra": pc.if_else(mask, inat_extra(ordinal), folder_extra(ordinal)),
    }
    for name, column in values.items():
        table = table.set_column(table.schema.get_field_index(name), S.SCHEMA.field(name), column)
    return table.cast(S.SCHEMA)


def make_collector_shaped(root: Path) -> None:
    """Rewrite ``root``'s samples.parquet with collector-shaped rows (another tool's write: curate
    has recorded nothing about the new file)."""
    path = root / "samples.parquet"
    table = collector_columns(pq.read_table(path))
    pq.write_table(table.replace_schema_metadata(S.SCHEMA.metadata), path, **S.PARQUET_OPTIONS)


def bench(root: Path, n: int, repeat: int) -> dict[str, Figure]:
    out: dict[str, Figure] = {}
    if (root / "dataset.yaml").is_file():  # --keep: a folder from an earlier run (grown by its adds)
        out["build"] = (float("nan"),) * 3
    else:
        out["build"], _ = timed(lambda: build_folder(root, n))
    make_collector_shaped(root)  # also on a kept folder, so that "open, first" is a first open
    path = root / "samples.parquet"
    out["size MB"] = (path.stat().st_size / 1e6, float("nan"), float("nan"))
    out["open, first"], _ = timed(lambda: Dataset.open(root))
    out["open"], ds = timed(lambda: Dataset.open(root), repeat)
    out["pq.read_table"], table = timed(lambda: pq.read_table(path), repeat)
    out["select"], picked = timed(lambda: ds.select(status="accepted", background="ground"), repeat)
    assert picked.num_rows > 0
    ids = random.Random(0).sample(ds.sample_ids(), 1000)
    stamp = f"bench run {time.time():.6f}"  # a new value, so all 1,000 rows change on a reused folder too
    out["update 1k"], changed = timed(lambda: ds.update(ids, {"reject_reason": stamp}, actor="bench", reason="bench"))
    assert changed == 1000, changed
    out["open after a commit"], _ = timed(lambda: Dataset.open(root))
    scratch = root.parent / "write-floor.parquet"
    out["pq.write_table"], _ = timed(lambda: pq.write_table(table, scratch, **S.PARQUET_OPTIONS))
    scratch.unlink()
    first = len(ds)  # build_folder and earlier runs used colours 0 .. len(ds) - 1
    images = [tiny_png(first + i) for i in range(10_000)]
    out["prepare 10k"], _ = timed(lambda: [prepare_image(data) for data in images])
    extras = inat_extra(np.arange(first, first + 10_000)).to_pylist()
    import json

    items = [NewSample(image=data, class_index=i % 1000, source="inat", source_id=f"new{first + i}", license="cc0",
                       extra=json.loads(extras[i])) for i, data in enumerate(images)]
    out["add 10k (total)"], report = timed(lambda: ds.add_samples(items, actor="bench"))
    assert len(report.added) == 10_000, report
    out["add 10k"] = tuple(a - b for a, b in zip(out["add 10k (total)"], out["prepare 10k"]))  # type: ignore[assignment]
    infos = [cli("info", str(root)) for _ in range(repeat)]
    out["curate info"] = tuple(statistics.median(f[i] for f in infos) for i in range(3))  # type: ignore[assignment]
    out["curate check"] = cli("check", str(root))
    out["check by hand"] = hand_check(root)
    problems = [p for p in check_dataset(root) if p.severity == "error"]
    assert not problems, problems[:3]
    assert len(ds.changes()) >= 11_000  # 1,000 updates + 10,000 adds logged
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", "--sizes", dest="rows", default="100000",
                        help="comma-separated folder sizes (default 100000; add 1000000 for the 1M figures)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="build the folders here and keep them; a later run reuses them "
                        "(each run adds 10,000 rows). Default: a temporary folder, removed at the end")
    args = parser.parse_args()
    sizes = [int(s) for s in args.rows.split(",") if s.strip()]
    base = args.keep or Path(tempfile.mkdtemp(prefix="curate-store-bench-"))
    results: dict[int, dict[str, Figure]] = {}
    try:
        for n in sizes:
            root = base / f"collector{n}"
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
            print(f"building and timing {n:,} collector-shaped rows in {root} ...", file=sys.stderr, flush=True)
            results[n] = bench(root, n, args.repeat)
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(f"\ndataset folder, collector-shaped rows: wall / CPU (of which system) seconds (median of {args.repeat} for open, select "
          f"and info; one run for the rest; load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs)")
    keys = ["build", "size MB", "open, first", "open", "open after a commit", "pq.read_table", "select", "update 1k",
            "pq.write_table", "add 10k (total)", "prepare 10k", "add 10k", "curate info", "curate check",
            "check by hand"]
    print("| measure | " + " | ".join(f"{n:,} rows" for n in sizes) + " | target at 1M |")
    print("|---|" + "---|" * (len(sizes) + 1))
    for key in keys:
        target = TARGETS.get(key)
        cells = []
        for n in sizes:
            wall, cpu, sys_cpu = results[n][key]
            if key == "size MB":
                cells.append(f"{wall:.0f}")
                continue
            mark = ""
            if target is not None and n >= 1_000_000:
                mark = " ok" if (cpu if target[1] == "cpu" else wall) < target[0] else " MISSED"
            cells.append(f"{wall:.2f} / {cpu:.2f} ({sys_cpu:.2f}){mark}")
        goal = f"< {target[0]:g} {'CPU-s' if target[1] == 'cpu' else 's'}" if target else ""
        print(f"| {key} | " + " | ".join(cells) + f" | {goal} |")
    print("\nratios against plain pyarrow on the same file, wall (1.0 = curate adds nothing):")
    for n in sizes:
        r = results[n]
        print(f"  {n:,} rows: open / pq.read_table = {r['open'][0] / r['pq.read_table'][0]:.1f}x, "
              f"update 1k / pq.write_table = {r['update 1k'][0] / r['pq.write_table'][0]:.1f}x, "
              f"curate check / check by hand = {r['curate check'][1] / r['check by hand'][1]:.2f}x in CPU time "
              "(the hand loop checks only extra, presence and repeated ids)")
    print("'add 10k' = add_samples of 10,000 tiny PNGs minus prepare_image on the same bytes; "
          "curate info/check include interpreter start-up and imports.")


if __name__ == "__main__":
    main()
