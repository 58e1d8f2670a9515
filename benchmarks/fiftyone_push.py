"""Benchmark: ``push_fiftyone`` of a folder with many evaluation runs, against a plain FiftyOne loop (issue 29 §1).

A folder of ``--samples`` rows (tests/scale_helpers.py: distinct 1x1 PNGs, rows written straight
to samples.parquet; ImageNet-1K label space, classes cycling) gets ``--runs`` evaluation runs
written through :class:`curate.runs.EvaluationRun` (fake but valid: random top-5 labels and
descending scores, top-1 right on about a third of the rows; the last run leaves every tenth
sample unscored, so some run fields are null). No model is needed. A private ``mongod`` from
``.services/`` is started as the tests start it. Timed, each on a FiftyOne dataset of its own:

- **curate push**: ``push_fiftyone(DIR)`` into a new dataset (every field of the module
  docstring, one ``pred_<run>`` field per run, the saved views, the push snapshot);
- **curate re-push**: the same call again, nothing changed (every sample is updated in place);
- **peer**: what a user writes with FiftyOne alone: read each run's predictions with pyarrow,
  then per row one ``fo.Sample`` with the row's fields, ``ground_truth`` / ``background``
  ``Classification``s and one ``Classification(label, class_index, confidence, correct, top5)``
  per run, and ``dataset.add_samples``. No saved views, no snapshot, no re-push logic.

``--also PATH`` times a second implementation of curate/review/fiftyone.py (e.g. a copy of the
version before a change) in the same process, on the same folder and mongod, right after the
first: its rows are labelled with the file's name. The run fields of every push are checked
equal, sample by sample (label, class_index, top5, correct, confidence), to the peer's.

Every figure is **wall / CPU seconds**; CPU is user + system of this process (its threads
included) plus the CPU time ``mongod`` used meanwhile (read with psutil), shown apart. The ratio
is curate / peer (CPU and wall). CPU time moves much less with the load of a shared machine than
wall time; the load average is printed with the table.

    .venv/bin/python benchmarks/fiftyone_push.py                              # 3,000 samples, 20 runs
    .venv/bin/python benchmarks/fiftyone_push.py --samples 13000 --runs 20    # CounterAnimal's size
    .venv/bin/python benchmarks/fiftyone_push.py --also /tmp/fiftyone_before.py   # before vs after a change

It runs on demand, not in ``make test``.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import secrets
import shutil
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

try:
    import psutil
except ImportError:  # mongod's CPU is then not counted
    psutil = None

RUN_FIELDS = ("label", "class_index", "top5", "correct", "confidence")


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Clock:
    """Wall, this process's CPU and mongod's CPU of a block."""

    def __init__(self, mongod_pid: int | None) -> None:
        self.mongod = psutil.Process(mongod_pid) if psutil and mongod_pid else None

    def _mongod_cpu(self) -> float:
        if self.mongod is None:
            return float("nan")
        times = self.mongod.cpu_times()
        return times.user + times.system

    def time(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, float, float, Any]:
        wall0, cpu0, db0 = time.perf_counter(), _self_cpu(), self._mongod_cpu()
        out = fn(*args, **kwargs)
        return time.perf_counter() - wall0, _self_cpu() - cpu0, self._mongod_cpu() - db0, out


# ---------------------------------------------------------------------------------------------
# the folder
# ---------------------------------------------------------------------------------------------


def build(root: Path, samples: int, runs: int, seed: int = 0):
    """The folder and its ``runs`` evaluation runs (written through EvaluationRun)."""
    import pyarrow as pa
    from scale_helpers import build_folder

    from curate.runs import EvaluationRun

    ds = build_folder(root, samples)
    rows = ds.rows()
    ids = [r["sample_id"] for r in rows]
    classes = np.asarray([r["class_index"] for r in rows], np.int32)
    rng = np.random.default_rng(seed)
    for k in range(runs):
        top = rng.integers(0, 1000, size=(len(ids), 5)).astype(np.int32)
        right = rng.random(len(ids)) < 0.33
        top[right, 0] = classes[right]
        scores = -np.sort(-rng.random((len(ids), 5)), axis=1).astype(np.float32)
        keep = np.ones(len(ids), bool)
        if k == runs - 1:
            keep[::10] = False  # a run that left some samples out: their field is null
        table = pa.table({
            "sample_id": pa.array([s for s, kept in zip(ids, keep) if kept], pa.string()),
            "class_index": pa.array(classes[keep], pa.int32()),
            "group": pa.nulls(int(keep.sum()), pa.string()),
            "background": pa.array([r["background"] for r, kept in zip(rows, keep) if kept], pa.string()),
            "topk_labels": pa.array(top[keep].tolist(), pa.list_(pa.int32())),
            "topk_scores": pa.array(scores[keep].tolist(), pa.list_(pa.float32())),
            "correct1": pa.array((top[keep, 0] == classes[keep]).tolist(), pa.bool_()),
            "correct5": pa.array((top[keep] == classes[keep, None]).any(axis=1).tolist(), pa.bool_()),
        })
        record = EvaluationRun(model={"name": f"fake-{k}", "model_id": f"fake-{k}", "family": "clip"},
                               label_space={"name": "imagenet1k"}, prompts={"name": "simple"}, settings={},
                               dataset={"samples": int(keep.sum())}, metrics={}, predictions_table=table)
        record.write(root / "runs" / f"eval-{k:02d}")
        os.utime(root / "runs" / f"eval-{k:02d}", (1e9 + k, 1e9 + k))  # runs are ordered by folder mtime
    return ds


# ---------------------------------------------------------------------------------------------
# the peer
# ---------------------------------------------------------------------------------------------


def peer_push(fo: Any, ds: Any, name: str) -> int:
    """A plain FiftyOne loop: one Sample per row, one Classification per run, add_samples."""
    import pyarrow.parquet as pq

    names = ds.label_space.names
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for run_dir in sorted((ds.root / "runs").iterdir()):
        table = pq.read_table(run_dir / "predictions.parquet",
                              columns=["sample_id", "topk_labels", "topk_scores", "correct1"]).to_pydict()
        runs["pred_" + run_dir.name.replace("-", "_")] = {
            sid: {"label": names[labels[0]], "class_index": int(labels[0]), "top5": [names[i] for i in labels[:5]],
                  "correct": bool(correct), "confidence": float(scores[0])}
            for sid, labels, scores, correct in zip(table["sample_id"], table["topk_labels"], table["topk_scores"],
                                                    table["correct1"])}
    dataset = fo.Dataset(name)
    samples = []
    for row in ds.rows():
        sample = fo.Sample(filepath=str(ds.image_path(row)),
                           metadata=fo.ImageMetadata(width=int(row["width"]), height=int(row["height"])))
        for key in ("sample_id", "source", "source_id", "source_url", "license", "attribution", "status",
                    "reject_reason", "background_source", "mask_status", "group"):
            sample[key] = row[key]
        sample["ground_truth"] = fo.Classification(label=row["class_name"], class_index=int(row["class_index"]))
        sample["background"] = fo.Classification(label=row["background"]) if row["background"] else None
        sample.tags = list(row["tags"] or [])
        for field, by_sample in runs.items():
            pred = by_sample.get(row["sample_id"])
            sample[field] = fo.Classification(**pred) if pred else None
        samples.append(sample)
    dataset.add_samples(samples, progress=False)
    dataset.add_dynamic_sample_fields()
    dataset.persistent = True
    return len(samples)


def run_values(dataset: Any) -> dict[str, dict[str, tuple]]:
    """field -> sample_id -> (label, class_index, top5, correct, confidence) of every pred_ field."""
    out: dict[str, dict[str, tuple]] = {}
    ids = dataset.values("sample_id")
    for field in sorted(n for n in dataset.get_field_schema() if n.startswith("pred_")):
        columns = dataset.values([f"{field}.{k}" for k in RUN_FIELDS])
        out[field] = dict(zip(ids, zip(*columns)))
    return out


def load_push(path: Path | None) -> Callable[..., Any]:
    """``push_fiftyone`` of curate, or of the implementation in the file ``path``."""
    if path is None:
        from curate.review.fiftyone import push_fiftyone

        return push_fiftyone
    spec = importlib.util.spec_from_file_location(f"curate_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.push_fiftyone


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=3_000)
    parser.add_argument("--runs", type=int, default=20, help="evaluation runs (default 20)")
    parser.add_argument("--also", type=Path, help="time this copy of curate/review/fiftyone.py too (e.g. the old one)")
    parser.add_argument("--keep", type=Path, help="work here and keep the folder (default: a temporary folder)")
    args = parser.parse_args()
    os.environ.setdefault("FIFTYONE_DO_NOT_TRACK", "true")
    work = args.keep or Path(tempfile.mkdtemp(prefix="curate-fo-bench-"))
    if args.keep and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    from curate.review.database import start_mongod
    from curate.review.provision import provision_mongod

    server = start_mongod(work / "mongo" / "db", binaries=provision_mongod())
    try:
        os.environ.update(FIFTYONE_DATABASE_URI=server.uri, FIFTYONE_DATABASE_VALIDATION="false")
        from curate.review.fiftyone import import_fiftyone_module

        fo = import_fiftyone_module()
        import fiftyone.core.odm.database as fodb

        if fo.config.database_uri != server.uri:
            fodb._disconnect()
            fo.config.database_uri = server.uri
        fo.config.database_validation = False
        t0 = time.perf_counter()
        ds = build(work / "folder", args.samples, args.runs)
        print(f"folder: {args.samples:,} samples, {args.runs} runs, built in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
        clock = Clock(server.pid)
        fo.list_datasets()  # connect before timing
        load0 = os.getloadavg()
        rows: list[tuple[str, float, float, float]] = []
        name = f"peer-{secrets.token_hex(3)}"
        wall, cpu, db, _ = clock.time(peer_push, fo, ds, name)
        rows.append(("peer: fo.Sample loop + add_samples", wall, cpu, db))
        expected = run_values(fo.load_dataset(name))
        impls: list[tuple[str, Path | None]] = [("curate", None)]
        if args.also:
            impls.append((args.also.name, args.also))
        for label, path in impls:
            push = load_push(path)
            name = f"curate-{secrets.token_hex(3)}"
            wall, cpu, db, result = clock.time(push, ds.root, name=name)
            rows.append((f"{label} push", wall, cpu, db))
            assert result.added == args.samples, result
            wall, cpu, db, result = clock.time(push, ds.root, name=name)
            rows.append((f"{label} re-push", wall, cpu, db))
            assert result.updated == args.samples, result
            got = run_values(fo.load_dataset(name))
            if got != expected:
                bad = [f for f in expected if got.get(f) != expected[f]]
                raise SystemExit(f"{label}: run fields differ from the peer's: {bad or sorted(set(got) ^ set(expected))}")
        load1 = os.getloadavg()
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    peer = rows[0]
    print(f"\nFiftyOne push: {args.samples:,} samples x {args.runs} run fields ({os.cpu_count()} CPUs; load average "
          f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} at start, {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} at end)")
    print("| what | wall s | CPU s (this process) | CPU s (mongod) | CPU s total | CPU µs / sample / run | "
          "total CPU vs peer | wall vs peer |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for what, wall, cpu, db in rows:
        total = cpu + (0.0 if np.isnan(db) else db)
        per = 1e6 * total / (args.samples * max(args.runs, 1))
        print(f"| {what} | {wall:.2f} | {cpu:.2f} | {db:.2f} | {total:.2f} | {per:.0f} | "
              f"{total / (peer[2] + np.nan_to_num(peer[3])):.2f}x | {wall / peer[1]:.2f}x |")
    print("run fields (label, class_index, top5, correct, confidence) of every push checked equal to the peer's")


if __name__ == "__main__":
    main()
