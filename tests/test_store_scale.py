"""The dataset folder at a modest scale (20,000 rows): the whole-column validation finds exactly
what the row-by-row checks find, the file-presence cache notices a deleted image, updates and
adds keep the change log, and a writer SIGKILLed mid-commit leaves a valid, committed state.
Timings are benchmarks/store.py's business; these tests assert structure only."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from scale_helpers import build_folder, tiny_png
from store_helpers import set_cell

from curate.store import Dataset, DatasetError, NewSample, check_dataset, rowscan, validate
from curate.store.rowscan import FILE_CHECK_CACHE
from curate.store.validate import inspect_dataset

N = 20_000
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scale") / "ds"
    build_folder(root, N)
    return root


def test_open_select_and_the_parquet_files(big: Path) -> None:
    ds = Dataset.open(big)
    assert len(ds) == N and check_dataset(big) == []
    assert ds.samples_files() == [big / "samples.parquet"]
    assert pa.concat_tables([pq.read_table(p) for p in ds.samples_files()]).num_rows == N
    picked = ds.select(status="accepted", background="ground")
    assert picked.num_rows == len([i for i in range(N) if i % 10 == 0 and i % 14 == 0])
    assert (big / FILE_CHECK_CACHE).is_file()  # a complete presence check was recorded


def test_whole_column_checks_find_what_row_checks_find(big: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = (big / "samples.parquet").read_bytes()
    table = pq.read_table(big / "samples.parquet")
    sid10 = table.column("sample_id")[10].as_py()
    for column, row, value in [("status", 123, "maybe"), ("sample_id", 4567, sid10), ("class_name", 9999, "ostrich"),
                               ("filepath", 15000, "../x.png"), ("tags", 17000, [""]), ("extra", 18000, "[1]"),
                               ("background", 18500, "lava"), ("class_index", 19000, 5000)]:
        table = set_cell(table, column, row, value)
    for column in ("sample_id", "sha256", "filepath"):  # row 16000 is row 20 again: canonical, only repeated
        table = set_cell(table, column, 16000, table.column(column)[20].as_py())
    pq.write_table(table, big / "samples.parquet")
    gone = big / table.column("filepath")[12345].as_py()
    image = gone.read_bytes()
    gone.unlink()
    try:
        fast = [(p.row, p.column, p.message) for p in check_dataset(big)]
        with monkeypatch.context() as patch:  # every row through the exact row-by-row checks
            patch.setattr(rowscan, "local_suspects", lambda table, usable, vocab, **kw: np.ones(table.num_rows, dtype=bool))
            exact = [(p.row, p.column, p.message) for p in check_dataset(big)]
        assert fast == exact
        # check streams the file (batches of 997 rows here: row 10 and its duplicate at row 4567
        # fall in different batches); an open's whole-table path finds the same, in the same order
        monkeypatch.setattr(validate, "STREAM_ROWS", 997)
        assert [(p.row, p.column, p.message) for p in check_dataset(big)] == fast
        whole = inspect_dataset(big, cached_files=False)
        assert [(p.row, p.column, p.message) for p in whole.problems] == fast and whole.table is not None
        assert {row for row, _, _ in fast} == {123, 4567, 9999, 12345, 15000, 16000, 17000, 18000, 18500, 19000}
        assert any("duplicate sample_id" in m and row == 4567 for row, _, m in fast)
        assert [m for row, _, m in fast if row == 16000] == [f"duplicate sample_id {table.column('sample_id')[20]} "
                                                             "(first at row 20)"]
        assert any("image file" in m and "is missing" in m and row == 12345 for row, _, m in fast)
        with pytest.raises(DatasetError, match="row 123 .*status 'maybe' is not allowed"):
            Dataset.open(big)
    finally:
        (big / "samples.parquet").write_bytes(original)
        gone.write_bytes(image)
    assert check_dataset(big) == []


def test_check_records_the_presence_an_open_then_trusts(big: Path) -> None:
    """``curate check`` lists every media folder before it streams the rows; when every image
    is there it leaves the same record an open's own listing leaves, so the next open lists
    nothing."""
    Dataset.open(big)
    by_open = json.loads((big / FILE_CHECK_CACHE).read_text())
    (big / FILE_CHECK_CACHE).unlink()
    assert check_dataset(big) == []
    assert json.loads((big / FILE_CHECK_CACHE).read_text()) == by_open
    assert rowscan.files_unchanged(big, None)


def test_a_deleted_image_is_noticed_despite_the_cache(big: Path) -> None:
    ds = Dataset.open(big)
    row = ds.table().slice(777, 1).to_pylist()[0]
    image = big / row["filepath"]
    data = image.read_bytes()
    image.unlink()
    try:
        with pytest.raises(DatasetError, match=f"row 777 \\(sample {row['sample_id']}\\): image file .* is missing"):
            Dataset.open(big)
    finally:
        image.write_bytes(data)
    assert len(Dataset.open(big)) == N


def test_update_and_add_at_scale_keep_the_log(big: Path) -> None:
    ds = Dataset.open(big)
    ids = random.Random(1).sample(ds.sample_ids(), 1000)
    before = ds.table()
    assert ds.update(ids, {"group": "hard"}, actor="t", reason="scale") == 1000
    after = Dataset.open(big).table()
    assert after.drop_columns(["group"]).equals(before.drop_columns(["group"]))  # nothing else moved
    hard = after.filter(pc.equal(after.column("group"), "hard")).column("sample_id").to_pylist()
    assert set(hard) == set(ids) and before.column("group").null_count == N
    log = [c for c in ds.changes() if c["reason"] == "scale"]
    assert len(log) == 1000 and {c["field"] for c in log} == {"group"} and {c["new"] for c in log} == {"hard"}
    assert Dataset.open(big).ids(group="hard") == [sid for sid in before.column("sample_id").to_pylist() if sid in ids]
    assert rowscan.files_unchanged(big, None)  # the writer carried the presence record over its commit
    report = ds.add_samples([NewSample(image=tiny_png(9_000_000 + i), class_index=3, source="synthetic")
                             for i in range(50)], actor="t")
    assert len(report.added) == 50 and rowscan.files_unchanged(big, None)
    new_image = ds.image_path(report.added[-1])
    data = new_image.read_bytes()
    new_image.unlink()  # deleted by hand after the add: the folder's mtime changes, open lists again
    assert not rowscan.files_unchanged(big, None)
    with pytest.raises(DatasetError, match="image file .* is missing"):
        Dataset.open(big)
    new_image.write_bytes(data)
    assert len(Dataset.open(big)) == N + 50


_WRITER = """
import sys
sys.path.insert(0, {tests!r})
from scale_helpers import tiny_png
from curate.store import Dataset, NewSample
ds = Dataset.open({root!r}, lock_timeout=30)
ids = ds.sample_ids()[:1000]
k = 0
while True:
    k += 1
    ds.update(ids, {{"extra": {{"round": k}}}}, actor="writer")
    ds.add_samples([NewSample(image=tiny_png(5_000_000 + 10 * k + j), class_index=1, source="synthetic",
                              license="cc0") for j in range(10)], actor="writer", commit_every=5)
    print(k, flush=True)
"""


def test_writer_killed_mid_commit_leaves_a_committed_state(tmp_path: Path) -> None:
    root = tmp_path / "killed"
    build_folder(root, 5000)
    start_rows = len(Dataset.open(root))
    proc = subprocess.Popen([sys.executable, "-c", _WRITER.format(tests=str(TESTS), root=str(root))],
                            stdout=subprocess.PIPE, text=True)
    try:
        rounds = [int(proc.stdout.readline()) for _ in range(2)]
        time.sleep(random.Random(os.getpid()).uniform(0.0, 0.4))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done = rounds[-1]
    ds = Dataset.open(root)  # validates every row and file: raises on any problem
    assert [p for p in check_dataset(root) if p.severity == "error"] == []
    firsts = ds.table().slice(0, 1000).column("extra").to_pylist()
    round_seen = {json.loads(e)["round"] for e in firsts}
    assert len(round_seen) == 1, "an update was half applied"
    (r,) = round_seen
    assert r >= done
    added = len(ds) - start_rows
    assert added % 5 == 0 and 10 * (r - 1) <= added <= 10 * r  # adds commit in batches of 5, whole
    logged = {}
    for change in ds.changes():
        if change["actor"] == "writer" and change["op"] == "update":
            logged[change["new"]["round"]] = logged.get(change["new"]["round"], 0) + 1
    assert max(logged) <= r  # the log never claims a commit that did not happen
    assert all(logged[k] == 1000 for k in range(1, r))  # every earlier round fully logged
