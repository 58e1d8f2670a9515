"""Collector-shaped rows at scale (issue 29, section 2), tested on small folders.

At a million rows every ``extra`` is distinct (per-row provenance), so ``Dataset.open`` must not
parse each one on every open. The mechanism tested here (docs/design.md#dataset-folder):

- ``extra`` is parsed whole (arrow's JSON reader, ``json.loads`` only for a segment it refuses)
  by the first open of a samples.parquet that curate has no record for, and by every
  ``curate check``; the parse is exact (the same rows as ``json.loads`` on each value);
- a parse that finds nothing wrong is recorded against the file's identity
  (``.curate.extracheck.json``); curate's writers, which check every ``extra`` they write,
  carry the record to the file they commit; an open whose file matches the record checks only
  the shape of ``extra`` (``{...}``), parsing nothing;
- any other write of samples.parquet gives a file the record does not name, so a hand-corrupted
  ``extra`` is reported by the next open (and by ``curate check`` always);
- exact after update, add and SIGKILL.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import (
    TESTS_DIR,
    color_for,
    disk_state,
    make_dataset,
    rewrite_parquet,
    set_cell,
    solid_png,
    toy_space,
)

from curate.store import Dataset, DatasetError, NewSample, check_dataset, rowscan, validate
from curate.store import schema as S
from curate.store.validate import inspect_dataset


def inat_extra(i: int) -> dict[str, Any]:
    """An ``extra`` shaped like ``curate collect inat``'s (curate/collect/inat.py), unique per row."""
    return {
        "observation_id": 1_000 + i, "observation_url": f"https://www.inaturalist.org/observations/{1_000 + i}",
        "photo_id": 5_000 + i, "observer": f"naturalist{i % 7}", "observer_id": i % 7,
        "observer_name": f"Observer {i % 7}", "observed_on": "2023-05-01", "place": f"Reserve {i}, Somewhere",
        "location": [round(i / 10, 1), -round(i / 10, 1)], "quality_grade": "research", "taxon_id": 40_000 + i % 3,
        "taxon_name": "Genus species", "query_taxon_ids": [40_000 + i % 3], "photo_size": "medium",
        "original_dimensions": [2048, 1536], "license_code": "CC-BY-NC", "inat_job": "job-1", "note": "é ✓ \u2028",
    }


def collector_dataset(root: Path, n: int = 12) -> Dataset:
    ds = Dataset.create(root, name="collector", label_space=toy_space())
    items = [NewSample(image=solid_png(color_for(2_000 + i)), class_index=i % 3, source="inat", source_id=str(5_000 + i),
                       source_url=f"https://example.org/photos/{5_000 + i}/medium.jpg", license="cc-by-nc",
                       attribution=f"(c) Observer {i % 7}", extra=inat_extra(i)) for i in range(n)]
    assert len(ds.add_samples(items, actor="test").added) == n
    return ds


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each whole parse of ``extra`` covered (one entry per parse)."""
    calls: list[int] = []
    real = rowscan.extra_not_objects

    def counting(column: pa.ChunkedArray) -> np.ndarray:
        calls.append(len(column))
        return real(column)

    monkeypatch.setattr(rowscan, "extra_not_objects", counting)
    return calls


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text ``json.loads`` was given (all callers)."""
    seen: list[str] = []
    real = json.loads

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(text if isinstance(text, str) else repr(text))
        return real(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    return seen


def extra_problems(root: Path) -> list[str]:
    return [str(p) for p in check_dataset(root) if p.column == "extra"]


# --------------------------------------------------------------------------- the schema
def test_extra_is_not_dictionary_encoded() -> None:
    assert "extra" not in S.LOW_CARDINALITY_COLUMNS
    assert "extra" not in S.PARQUET_OPTIONS["use_dictionary"]


def test_commits_write_extra_plain(tmp_path: Path) -> None:
    ds = collector_dataset(tmp_path / "ds", n=4)
    meta = pq.ParquetFile(ds.root / "samples.parquet").metadata
    column = next(meta.row_group(0).column(i) for i in range(meta.num_columns)
                  if meta.row_group(0).column(i).path_in_schema == "extra")
    assert "RLE_DICTIONARY" not in column.encodings and "PLAIN_DICTIONARY" not in column.encodings


# --------------------------------------------------------------------------- the parse is exact
AWKWARD = [
    '{"a": 1}', "{}", '{"a": {"b": [1, 2, {"c": null}]}}', '{"k": "x}{y"}', '{"a":\n1}', '{"a": NaN}',
    '{"a": "\\ud800"}', '{"é": "✓"}', '{"a": 1e999}',
    "", "{", "}", "[1]", "null", "1", '"{}"', "{}{}", '{"a": 1}\n{"b": 2}', '{"a": }', " {}", "{} ",
    '{"a":"x}', '{y"}', '{"a": 1,}', "{'a': 1}", '{"a": "line\nbreak"}', '{"a": "tab\there"}',
    '{"a": 1}\x00{"b": 2}', '{"a": "x\x00y"}', '{"a": 1}\r{"b": 2}', '{"a":\r1}',
    "{" * 2_000 + "}" * 2_000, '{"a": ' + "[" * 2_000 + "]" * 2_000 + "}", None,
]


def by_json_loads(values: list[str | None]) -> list[bool]:
    """The definition: json.loads refuses the value, or it is not an object."""
    out = []
    for text in values:
        if text is None:
            out.append(False)
            continue
        try:
            out.append(not isinstance(json.loads(text), dict))
        except (ValueError, RecursionError):
            out.append(True)
    return out


def test_whole_parse_finds_exactly_what_json_loads_refuses() -> None:
    rng = random.Random(7)
    values = [json.dumps(inat_extra(i), ensure_ascii=False) for i in range(40)] + AWKWARD
    rng.shuffle(values)
    for column in (pa.chunked_array([values], type=pa.string()),
                   pa.chunked_array([values[:17], values[17:]], type=pa.string()),
                   pa.chunked_array([values], type=pa.large_string()),
                   pa.chunked_array([values]).cast(pa.string_view())):
        assert rowscan.extra_not_objects(column).tolist() == by_json_loads(values)
    shape = rowscan.extra_shape_suspects(pa.chunked_array([values], type=pa.string()))
    bad = np.array(by_json_loads(values))
    assert all(bad[~shape] == rowscan.extra_not_objects(pa.chunked_array([values]))[~shape])
    curate_written = [json.dumps(inat_extra(i), sort_keys=True, ensure_ascii=False) for i in range(5)] + ["{}"]
    assert not rowscan.extra_shape_suspects(pa.chunked_array([curate_written])).any()


#: Pieces of JSON and near-JSON: objects made of these are valid, invalid, or valid only to
#: Python (NaN, Infinity, lone surrogates, huge numbers), which is where simdjson and json.loads
#: part ways.
FRAGMENTS = ['"a"', '"b\\"', '"\\ud800"', '"\\udc00\\ud800"', '"\\ud83d\\ude00"', '"x}{y"', '"é"', '"\\u0000"',
             "1", "-0", "1e999", "1E+2", "01", "1.", ".5", "+1", "123456789012345678901234567890", "NaN",
             "-Infinity", "true", "tru", "null", "[]", "[1,]", "{}", ":", ",", " ", "\n", "\t", "\x00", "\x7f", "}{",
             '"tab\there"', "\ufeff", "\u2028"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=8), st.lists(st.sampled_from(FRAGMENTS), max_size=3))
def test_simdjson_and_json_loads_agree_on_generated_objects(keys: list[str], values: list[str]) -> None:
    """Objects built from awkward pieces (half of them with the shape of a key-value list):
    the parse says "bad" exactly where json.loads refuses the text or gives no object."""
    body = ",".join(f"{k}:{v}" for k, v in zip(keys, values or ["1"] * len(keys)))
    texts = ["{" + body + "}", "{" + "".join(keys) + "}", "{" + "".join(values) + "}"]
    assert rowscan.extra_not_objects(pa.chunked_array([texts], type=pa.string())).tolist() == by_json_loads(texts)


def test_whole_parse_of_good_values_does_not_call_json_loads(loads: list[str]) -> None:
    values = [json.dumps(inat_extra(i), ensure_ascii=False) for i in range(500)]
    assert not rowscan.extra_not_objects(pa.chunked_array([values])).any()
    assert loads == []  # simdjson read them all


# --------------------------------------------------------------------------- open parses once
def test_open_parses_extra_only_when_the_file_is_new_to_curate(tmp_path: Path, parses: list[int],
                                                              loads: list[str]) -> None:
    root = tmp_path / "ds"
    collector_dataset(root, n=12)
    parses.clear()
    loads.clear()
    Dataset.open(root)
    Dataset.open(root)
    assert parses == []  # create -> add carried the record: nothing to parse
    assert not [text for text in loads if "observation_id" in text]
    rewrite_parquet(root, lambda t: t)  # another tool rewrites the same rows
    Dataset.open(root)
    assert parses == [12]  # a file curate has no record of: parsed whole, once
    Dataset.open(root)
    assert parses == [12]
    assert check_dataset(root) == []
    assert parses == [12, 12]  # curate check parses every extra, whatever the record says


def test_old_folder_opens_without_migration(tmp_path: Path, parses: list[int]) -> None:
    """A folder written before issue 29: extra dictionary-encoded, no record beside it."""
    root = tmp_path / "ds"
    ds = collector_dataset(root, n=6)
    before = ds.table()
    (root / rowscan.EXTRA_CHECK_CACHE).unlink()
    old_options = {"compression": "zstd", "use_dictionary": [*S.LOW_CARDINALITY_COLUMNS, "extra"]}
    pq.write_table(before.replace_schema_metadata(S.SCHEMA.metadata), root / "samples.parquet", **old_options)
    parses.clear()
    again = Dataset.open(root)
    assert again.table().equals(before)
    assert parses == [6]
    assert (root / rowscan.EXTRA_CHECK_CACHE).is_file()
    Dataset.open(root)
    assert parses == [6]


# --------------------------------------------------------------------------- corruption is reported
@pytest.mark.parametrize("bad", ['{"observer": }', '{"a": 1}{"b": 2}', '{"a": "cut', "[1, 2]", "", "not json"])
def test_hand_corrupted_extra_is_reported_by_open_and_check(tmp_path: Path, bad: str) -> None:
    root = tmp_path / "ds"
    collector_dataset(root, n=8)
    Dataset.open(root)  # the record exists and names the good file
    rewrite_parquet(root, lambda t: set_cell(t, "extra", 5, bad))
    with pytest.raises(DatasetError) as caught:
        Dataset.open(root)
    assert "row 5" in str(caught.value) and "extra" in str(caught.value)
    assert [p.row for p in check_dataset(root) if p.column == "extra"] == [5]
    with pytest.raises(DatasetError):  # still refused: a failed parse records nothing
        Dataset.open(root)


def test_same_size_rewrite_in_place_with_the_old_mtime_is_parsed(tmp_path: Path) -> None:
    """The record names (inode, mtime, size) and a hash of the file's last 64 KiB (the footer):
    a rewrite in place that keeps inode, mtime and, here, the size is still a different file."""
    root = tmp_path / "ds"
    collector_dataset(root, n=8)
    Dataset.open(root)
    path = root / "samples.parquet"
    st = os.stat(path)
    table = pq.read_table(path)
    good = table.column("extra")[3].as_py()
    bad = good.replace('"observer": ', '"observer"; ', 1)
    assert len(bad) == len(good)
    sink = pa.BufferOutputStream()
    pq.write_table(set_cell(table, "extra", 3, bad), sink, **S.PARQUET_OPTIONS)
    data = sink.getvalue().to_pybytes()
    with open(path, "r+b") as handle:  # same inode
        handle.write(data)
        handle.truncate()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_ino == st.st_ino and os.stat(path).st_mtime_ns == st.st_mtime_ns
    with pytest.raises(DatasetError, match="row 3"):
        Dataset.open(root)


@pytest.mark.parametrize("validation", ["open", "check"])
def test_a_record_is_only_written_for_the_file_that_was_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            validation: str) -> None:
    """samples.parquet replaced while an open (or a check) reads it: neither the parse nor the
    presence of the images is recorded (which file was read is unknown), and the next open
    checks again."""
    root = tmp_path / "ds"
    collector_dataset(root, n=5)
    (root / rowscan.EXTRA_CHECK_CACHE).unlink()
    (root / rowscan.FILE_CHECK_CACHE).unlink(missing_ok=True)
    real = rowscan.samples_identity
    calls = {"n": 0}

    def moving(folder: Path) -> dict[str, Any] | None:
        calls["n"] += 1
        if calls["n"] == 2:  # the check after the read sees another file
            rewrite_parquet(folder, lambda t: t)
        return real(folder)

    monkeypatch.setattr(rowscan, "samples_identity", moving)
    if validation == "open":
        inspect_dataset(root)
    else:
        check_dataset(root)
    assert not (root / rowscan.EXTRA_CHECK_CACHE).exists()
    assert not (root / rowscan.FILE_CHECK_CACHE).exists()


# --------------------------------------------------------------------------- writers carry the record
def test_update_add_and_set_masks_carry_the_record_and_stay_exact(tmp_path: Path, parses: list[int]) -> None:
    root = tmp_path / "ds"
    ds = collector_dataset(root, n=10)
    parses.clear()
    ids = ds.sample_ids()
    ds.update(ids[:3], {"extra": {"reviewed": True, "note": "ok"}}, actor="test")
    ds.update(ids[3], {"extra": json.dumps({"text": "as JSON text"})}, actor="test")
    ds.set_masks({ids[4]: np.ones((16, 16), np.uint8)}, extra_updates={ids[4]: {"mask_from": "test"}}, actor="test")
    ds.add_samples([NewSample(image=solid_png(color_for(3_000 + i)), source="inat", extra=inat_extra(100 + i))
                    for i in range(4)], actor="test", commit_every=2)
    reopened = Dataset.open(root)
    assert parses == []  # every commit carried the record
    expected = {sid: ds.row(sid)["extra"] for sid in ds.sample_ids()}
    assert {r["sample_id"]: r["extra"] for r in reopened.table().to_pylist()} == expected
    assert json.loads(expected[ids[0]]) == {"note": "ok", "reviewed": True}
    assert json.loads(expected[ids[4]])["mask_from"] == "test"
    assert len(reopened) == 14
    assert check_dataset(root) == []
    # the record names the file on disk, and that file's extras all parse
    assert rowscan.extras_unchanged(root, rowscan.samples_identity(root))


def test_refused_update_changes_neither_rows_nor_record(tmp_path: Path, parses: list[int]) -> None:
    root = tmp_path / "ds"
    ds = collector_dataset(root, n=4)
    record = (root / rowscan.EXTRA_CHECK_CACHE).read_bytes()
    with pytest.raises(DatasetError):
        ds.update(ds.sample_ids()[0], {"extra": "{not json"}, actor="test")
    assert (root / rowscan.EXTRA_CHECK_CACHE).read_bytes() == record
    Dataset.open(root)
    assert parses == []


def test_a_commit_on_top_of_an_unrecorded_file_records_nothing(tmp_path: Path, parses: list[int]) -> None:
    """A writer only vouches for what it wrote: on top of a file nobody parsed it carries no
    record, so a bad extra written by another tool is still found by the next open."""
    root = tmp_path / "ds"
    ds = collector_dataset(root, n=6)
    rewrite_parquet(root, lambda t: set_cell(t, "extra", 2, '{"x": }'))
    writer = Dataset.open(root, validate=False)
    writer.update(writer.sample_ids()[0], {"status": "accepted"}, actor="test")
    assert not rowscan.extras_unchanged(root, rowscan.samples_identity(root))
    with pytest.raises(DatasetError, match="row 2"):
        Dataset.open(root)
    del ds


# --------------------------------------------------------------------------- SIGKILL
def _env() -> dict[str, str]:
    env = dict(os.environ)
    repo = TESTS_DIR.parent
    env["PYTHONPATH"] = os.pathsep.join([str(repo), str(TESTS_DIR), env.get("PYTHONPATH", "")])
    return env


def test_writer_killed_mid_write_never_leaves_a_lying_record(tmp_path: Path) -> None:
    """SIGKILL tests/store_helpers.py's writer (adds, updates of every row's extra, masks) at
    random moments: the folder opens and validates, and whenever the record names the file on
    disk, a whole parse of that file's extra finds nothing (the record never vouches for a file
    it was not written for)."""
    root = tmp_path / "ds"
    make_dataset(root, n=3)
    journal = tmp_path / "journal.jsonl"
    journal.write_text(json.dumps({"c": 0, "expect": disk_state(Dataset.open(root))}) + "\n"
                       + json.dumps({"c": 0, "done": True}) + "\n")
    rng = random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    for attempt in range(4):
        proc = subprocess.Popen([sys.executable, str(TESTS_DIR / "store_helpers.py"), str(root), str(journal)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        try:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            time.sleep(rng.uniform(0.05, 0.4))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        if rowscan.extras_unchanged(root, rowscan.samples_identity(root)):
            table = pq.read_table(root / "samples.parquet")
            assert not rowscan.extra_not_objects(table.column("extra")).any(), f"seed {seed}, attempt {attempt}"
        ds = Dataset.open(root)  # validates
        assert [p for p in check_dataset(root) if p.severity == "error"] == [], f"seed {seed}, attempt {attempt}"
        assert rowscan.extras_unchanged(root, rowscan.samples_identity(root))  # recorded by the open at the latest
        assert all(isinstance(json.loads(r["extra"]), dict) for r in ds.table().to_pylist())


# --------------------------------------------------------------------------- extra read when needed
@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[list[str] | None]:
    """The columns of every ``ParquetFile.read`` (None = every column)."""
    seen: list[list[str] | None] = []
    real = pq.ParquetFile.read

    def recording(self: pq.ParquetFile, columns: Any = None, *args: Any, **kwargs: Any) -> pa.Table:
        seen.append(None if columns is None else list(columns))
        return real(self, columns, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read", recording)
    return seen


def reads_of_extra(reads: list[list[str] | None]) -> list[list[str] | None]:
    return [columns for columns in reads if columns is None or "extra" in columns]


def test_open_count_and_columns_never_read_extra(tmp_path: Path, reads: list[list[str] | None]) -> None:
    """``extra`` (600 MB of a collector's 1 GB table at a million rows) is read only when a
    caller needs it, from the file the rest was read from, and then equals the file's."""
    from curate.store import summarize

    root = tmp_path / "ds"
    collector_dataset(root, n=12)
    on_disk = pq.ParquetFile(root / "samples.parquet").read()
    reads.clear()
    ds = Dataset.open(root)
    assert len(ds) == 12 and ds.sample_ids() == on_disk.column("sample_id").to_pylist()
    assert summarize(ds)["license"] == {"cc-by-nc": 12}
    assert ds.table(["tags", "class_name"]).column_names == ["tags", "class_name"]
    assert ds.image_path(ds.sample_ids()[3]).is_file()
    assert ds.ids(class_index=0) == on_disk.column("sample_id").to_pylist()[::3]
    assert reads and reads_of_extra(reads) == []
    full = ds.table()
    assert reads_of_extra(reads) == [["extra"]]
    assert full.schema.equals(S.SCHEMA) and full.column_names == list(S.COLUMN_NAMES)
    assert full.column("extra").to_pylist() == on_disk.column("extra").to_pylist()
    assert ds.row(ds.sample_ids()[5])["extra"] == on_disk.column("extra")[5].as_py()
    ds.table()
    assert reads_of_extra(reads) == [["extra"]]  # read once
    with pytest.raises(DatasetError, match="no column 'nope'"):
        ds.table(["sample_id", "nope"])


def test_a_write_after_an_open_keeps_every_extra(tmp_path: Path) -> None:
    """A writer starts from the whole table: an update made right after an open that never read
    ``extra`` writes every row's ``extra`` unchanged; a reader of a folder another process has
    committed to sees the new file's values."""
    import pickle

    root = tmp_path / "ds"
    collector_dataset(root, n=10)
    before = pq.ParquetFile(root / "samples.parquet").read().column("extra").to_pylist()
    reader = Dataset.open(root)
    writer = Dataset.open(root)
    ids = writer.sample_ids()
    writer.update(ids[1], {"status": "accepted"}, actor="test")
    assert pq.ParquetFile(root / "samples.parquet").read().column("extra").to_pylist() == before
    writer.update(ids[2], {"extra": {"note": "new"}}, actor="test")
    assert json.loads(reader.row(ids[2])["extra"]) == {"note": "new"}
    assert reader.row(ids[1])["status"] == "accepted"
    assert reader.table().column("extra").to_pylist() == [*before[:2], '{"note": "new"}', *before[3:]]
    copy = pickle.loads(pickle.dumps(reader))  # a DataLoader worker's copy reads the file itself
    assert copy.table().equals(reader.table())
    assert check_dataset(root) == []


def test_check_streams_extra_and_names_rows_across_batches(tmp_path: Path, parses: list[int],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``curate check`` and the first open parse ``extra`` one batch at a time (never the whole
    column at once); a bad value in a later batch is named by its row in the file."""
    root = tmp_path / "ds"
    collector_dataset(root, n=12)
    rewrite_parquet(root, lambda t: set_cell(set_cell(t, "extra", 7, "[7]"), "extra", 11, None))
    monkeypatch.setattr(validate, "STREAM_ROWS", 5)
    parses.clear()
    problems = [(p.row, p.message) for p in check_dataset(root) if p.column == "extra"]
    assert parses == [5, 5, 2]
    assert [row for row, _ in problems] == [7, 11]
    assert "expected an object" in problems[0][1]
    with pytest.raises(DatasetError, match="row 7"):
        Dataset.open(root)


# --------------------------------------------------------------------------- presence by listing
_HEX = "0123456789abcdef"


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_missing_media_is_exactly_not_is_file(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    """``rowscan.MediaListing`` (sorted 64-bit keys, no string hashing) says "missing" exactly
    where ``Path.is_file`` says False, whatever the folders hold: names sharing their first 16
    digits, one name in two folders, the same image under two extensions, a file in the wrong
    folder, a folder or a broken symlink named like an image, a symlink to a file, odd names."""
    root = tmp_path_factory.mktemp("media")
    prefixes = data.draw(st.lists(st.text(_HEX, min_size=16, max_size=16), min_size=1, max_size=3))
    tails = st.text(_HEX, min_size=48, max_size=48)
    shas = [p + data.draw(tails) for p in prefixes for _ in range(data.draw(st.integers(1, 3)))]
    exts = ["jpg", "png", "jpeg", "JPG"]
    paths: list[str] = []
    for sha in shas:
        for ext in data.draw(st.lists(st.sampled_from(exts), min_size=1, max_size=2, unique=True)):
            folder = sha[:2] if data.draw(st.booleans()) else data.draw(st.sampled_from(["00", "ff", sha[:2]]))
            rel = f"media/{folder}/{sha}.{ext}"
            paths.append(f"media/{sha[:2]}/{sha}.{ext}")
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            kind = data.draw(st.sampled_from(["file", "file", "none", "dir", "broken", "link"]))
            if target.exists() or target.is_symlink():  # the same digest drawn twice
                continue
            if kind == "file":
                target.write_bytes(b"x")
            elif kind == "dir":
                target.mkdir()
            elif kind == "broken":
                target.symlink_to(root / "nowhere")
            elif kind == "link":
                (root / "real").write_bytes(b"y")
                target.symlink_to(root / "real")
    odd = root / "media" / shas[0][:2]
    odd.mkdir(parents=True, exist_ok=True)
    (odd / "notes\nwith a newline.txt").write_bytes(b"z")
    (odd / "short.jpg").write_bytes(b"z")
    folders = sorted({p[:8] for p in paths})
    column = pa.chunked_array([paths[: len(paths) // 2], paths[len(paths) // 2:]], type=pa.string())
    assert rowscan.MediaListing(root, folders).missing(column).tolist() == [not (root / p).is_file() for p in paths]


# --------------------------------------------------------------------------- check streams, open holds
def _with_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _undecodable(table: pa.Table, name: str, row: int) -> pa.Table:
    """``table`` with the text of column ``name`` at ``row`` replaced by bytes that are not UTF-8
    (arrow checks nothing when it reads parquet, so another tool can write such a file)."""
    values = [(v or "").encode() for v in table.column(name).to_pylist()]
    values[row] = b"caf\xe9"
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    column = pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets), pa.py_buffer(b"".join(values)))
    return table.set_column(table.schema.get_field_index(name), name, column)


def _extra_as_undecodable_lists(table: pa.Table) -> pa.Table:
    """``extra`` of the wrong type (lists of text), one of them holding bytes that are not UTF-8:
    an open never reads a mistyped ``extra``, so a check must not fail on its bytes either."""
    texts = _undecodable(pa.table({"t": table.column("extra")}), "t", 4).column("t").chunk(0)
    offsets = pa.array(range(table.num_rows + 1), type=pa.int32())
    return _with_column(table, "extra", pa.ListArray.from_arrays(offsets, texts))


DAMAGE = {
    "clean": lambda t: t,
    "unknown column": lambda t: t.append_column("note", pa.array(["x"] * t.num_rows)),
    "repeated column": lambda t: t.append_column("status", t.column("status")),
    "missing column": lambda t: t.drop_columns(["tags"]),
    "mistyped column": lambda t: _with_column(t, "class_index", pa.array([str(v) for v in t.column("class_index").to_pylist()])),
    "large strings": lambda t: _with_column(t, "filepath", t.column("filepath").cast(pa.large_string())),
    "string views": lambda t: _with_column(_with_column(t, "status", t.column("status").cast(pa.string_view())),
                                           "filepath", t.column("filepath").cast(pa.string_view())),
    "no rows": lambda t: t.slice(0, 0),
    "bad values": lambda t: set_cell(set_cell(set_cell(t, "status", 2, "maybe"), "extra", 5, "[5]"), "mask_path", 3,
                                     "masks/../x.png"),
    "null extra": lambda t: set_cell(t, "extra", 2, None),
    "nulls in two columns": lambda t: set_cell(set_cell(t, "width", 1, None), "sample_id", 7, None),
    "duplicate rows": lambda t: pa.concat_tables([t, t.slice(1, 2)]),
    "duplicate row, image gone": lambda t: pa.concat_tables([t, t.slice(4, 1)]),  # and on disk: ON_DISK
    "not UTF-8": lambda t: _undecodable(t, "attribution", 5),
    "extra not UTF-8": lambda t: _undecodable(t, "extra", 6),
    "extra and source not UTF-8": lambda t: _undecodable(_undecodable(t, "extra", 1), "source", 7),
    "mistyped extra not UTF-8": _extra_as_undecodable_lists,
    "missing image": lambda t: t,  # on disk: see ON_DISK
    "wrong-size mask": lambda t: t,
    "stray folders": lambda t: t,
}
#: Damage done to the files rather than the table: (column of row 4 whose file, what to do with it).
ON_DISK = {"missing image": ("filepath", lambda path: path.unlink()),
           "duplicate row, image gone": ("filepath", lambda path: path.unlink()),
           "wrong-size mask": ("mask_path", lambda path: path.write_bytes(solid_png((1, 2, 3), size=(5, 7)))),
           # folders no row names: a symlink loop, a file, an empty folder (nothing to report)
           "stray folders": ("filepath", lambda path: (os.symlink("0a", path.parents[1] / "0a"),
                                                       (path.parents[1] / "0b").write_bytes(b"x"),
                                                       (path.parents[1] / "0c").mkdir()))}
#: Valid folders among DAMAGE (the check finds nothing).
VALID = {"clean", "large strings", "string views", "no rows", "stray folders"}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_check_streams_and_finds_what_the_open_path_finds(tmp_path: Path, damage: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``check_dataset`` never holds the table (it streams batches, here of 3 rows); an open's
    whole-table path (``inspect_dataset``) reports the very same problems, in the same order,
    whatever is wrong with the file."""
    root = tmp_path / "ds"
    ds = make_dataset(root, n=8)
    rewrite_parquet(root, DAMAGE[damage])
    if damage in ON_DISK:
        column, spoil = ON_DISK[damage]
        spoil(root / ds.table().column(column)[4].as_py())
    monkeypatch.setattr(validate, "STREAM_ROWS", 3)
    streamed = [str(p) for p in check_dataset(root)]
    held = inspect_dataset(root, cached_files=False)
    assert streamed == [str(p) for p in held.problems]
    assert (streamed == []) == (damage in VALID)
    if damage == "clean":
        assert held.table is not None and held.table.num_rows == len(ds)
    undecodable = {"not UTF-8": ("attribution", 5), "extra not UTF-8": ("extra", 6),
                   "extra and source not UTF-8": ("source", 7)}  # the other columns first, as an open reads them
    if damage in undecodable:
        column, row = undecodable[damage]
        assert streamed == [f"samples.parquet cannot be read as parquet: column '{column}' row {row} holds bytes "
                            "that are not UTF-8 text"]
        with pytest.raises(DatasetError, match=f"row {row} holds bytes that are not UTF-8 text"):
            Dataset.open(root)
    if damage == "duplicate row, image gone":
        assert [p.row for p in held.problems if "is missing" in (p.message or "")] == [4, 8]
    if damage == "nulls in two columns":
        assert "does not cast to the schema: Casting field 'sample_id'" in streamed[-1]


def test_missing_media_with_made_up_digests_and_unlistable_folders(tmp_path: Path) -> None:
    """Digests that are not random (sequential numbers: every name in one bucket of the index)
    and many names sharing their first 16 digits are looked up exactly, as are paths in folders
    that cannot be listed (a symlink loop) or do not exist."""
    root = tmp_path
    sequential = [f"{i:064x}" for i in range(1500)]
    shared = ["ab" + "0" * 14 + f"{i:048x}" for i in range(1500)]
    paths = []
    for i, sha in enumerate(sequential + shared):
        rel = f"media/{sha[:2]}/{sha}.{'png' if i % 3 else 'jpg'}"
        paths.append(rel)
        if i % 4:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(b"x")
    os.symlink("ee", root / "media" / "ee")  # a loop: listing fails, each path is checked by hand
    paths += [f"media/ee/ee{'1' * 62}.png", f"media/dd/dd{'2' * 62}.png"]
    folders = rowscan.media_folders(root)
    assert "media/ee" in folders and "media/dd" not in folders
    listing = rowscan.MediaListing(root, folders)
    assert listing.bucket_depth > rowscan.MediaListing.MAX_BUCKET_DEPTH  # the binary search was used
    column = pa.chunked_array([paths], type=pa.string())
    assert listing.missing(column).tolist() == [not (root / p).is_file() for p in paths]
