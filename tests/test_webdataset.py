"""webdataset shards in and out: a lossless round trip, the CLI verbs, and untrusted archives
(corrupt members, unsafe names, bad JSON, a truncated shard) quarantined with shard and member."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from store_helpers import make_dataset, solid_png

from curate.cli import main
from curate.collect.webdataset import collect_webdataset
from curate.export.webdataset import export_webdataset
from curate.store import Dataset, check_dataset


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Dataset:
    """Six samples with masks and every kind of field set; sample 5 carries an ND licence."""
    ds = make_dataset(tmp_path_factory.mktemp("wds") / "src", n=6)
    ids = ds.sample_ids()
    ds.update(ids[:2], {"group": "easy", "status": "accepted", "tags": ["reviewed", "x"],
                        "extra": {"note": "ünïcode", "n": [1, 2.5]}}, actor="t")
    ds.update(ids[2], {"group": "hard", "status": "rejected", "reject_reason": "clarity", "background": "snow",
                       "background_source": "model", "background_score": 0.25, "attribution": "A. Person",
                       "source_url": "http://127.0.0.1/x.png", "license": "cc-by"}, actor="t")
    ds.update(ids[3], {"class_index": None, "background": None, "background_source": None}, actor="t")
    ds.update(ids[5], {"license": "cc-by-nd"}, actor="t")
    return ds


def _rows(ds: Dataset) -> dict[str, dict]:
    return {row["sample_id"]: row for row in ds.table().to_pylist()}


def test_round_trip_is_lossless(source: Dataset, tmp_path: Path) -> None:
    report = export_webdataset(source, tmp_path / "wds", shard_size=2)
    assert report.samples == 5 and report.excluded_licence == 1  # the ND image stays home
    assert [p.name for p in report.shards] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    with tarfile.open(report.shards[0]) as tar:
        names = tar.getnames()
    first = source.sample_ids()[0]
    assert {f"{first}.png", f"{first}.json", f"{first}.cls", f"{first}.mask.png"} <= set(names)

    imported = collect_webdataset(tmp_path / "copy", str(tmp_path / "wds" / "shard-{000000..000002}.tar"))
    assert len(imported.added) == 5 and not imported.quarantined and not imported.damaged_shards
    copy = Dataset.open(tmp_path / "copy")
    assert copy.label_space.names == source.label_space.names and copy.backgrounds == source.backgrounds
    before, after = _rows(source), _rows(copy)
    kept = {sid for sid, row in before.items() if row["license"] != "cc-by-nd"}
    assert set(after) == kept
    for sid in kept:
        assert after[sid] == before[sid], sid  # every column, added_at and the mask path included
        assert hashlib.sha256(copy.image_path(sid).read_bytes()).hexdigest() == before[sid]["sha256"]
        assert np.array_equal(copy.load_mask(sid), source.load_mask(sid))
        assert np.array_equal(np.asarray(copy.load_image(sid)), np.asarray(source.load_image(sid)))
    assert check_dataset(copy.root) == []
    again = collect_webdataset(copy.root, sorted(str(p) for p in report.shards))  # idempotent re-run
    assert again.added == [] and len(again.duplicates) == 5 and len(Dataset.open(copy.root)) == 5


def test_cli_export_and_collect(source: Dataset, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "shards"
    result = runner.invoke(main, ["export", str(source.root), str(out), "--layout", "webdataset", "--shard-size", "4",
                                  "--include-restricted-licenses"])
    assert result.exit_code == 0, result.output
    assert "wrote 6 samples in 2 shard(s)" in result.output
    manifest = json.loads((out / "curate.json").read_text())
    assert manifest["samples"] == 6 and manifest["shards"] == ["shard-000000.tar", "shard-000001.tar"]
    result = runner.invoke(main, ["export", str(source.root), str(out), "--layout", "webdataset"])
    assert result.exit_code == 1 and "not empty" in result.output  # no silent overwrite
    result = runner.invoke(main, ["collect", "webdataset", str(tmp_path / "ds"),
                                  "--shards", str(out / "shard-{000000..000001}.tar")])
    assert result.exit_code == 0, result.output
    assert "6 added" in result.output and len(Dataset.open(tmp_path / "ds")) == 6
    result = runner.invoke(main, ["collect", "webdataset", str(tmp_path / "none"),
                                  "--shards", str(out / "shard-{000000..000003}.tar")])
    assert result.exit_code == 1 and "2 of 4 shard(s) do not exist" in result.output
    assert not (tmp_path / "none").exists()  # nothing created before the shards are all there


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_untrusted_shards_are_quarantined_by_shard_and_member(tmp_path: Path) -> None:
    good = solid_png((10, 20, 30))
    meta = json.dumps({"label": 1, "license": "CC BY 4.0", "url": "http://127.0.0.1/a", "author": "B"}).encode()
    first = tmp_path / "in" / "part-000000.tar"
    first.parent.mkdir()
    first.write_bytes(_tar([
        ("a.png", good), ("a.json", meta),
        ("broken.jpg", b"\xff\xd8\xff\xe0 not really a jpeg"), ("broken.cls", b"0"),
        ("badjson.png", solid_png((1, 2, 3))), ("badjson.json", b"{oops"),
        ("../escape.png", solid_png((4, 5, 6))),
        ("/abs/olute.png", solid_png((7, 8, 9))),
        ("lonely.json", b"{}"),
    ]))
    second = tmp_path / "in" / "part-000001.tar"
    whole = _tar([("b.png", solid_png((40, 50, 60))), ("b.cls", b"2"), ("c.png", solid_png((70, 80, 90)) * 50)])
    second.write_bytes(whole[: 2048 + 512 + 1000])  # cut inside c.png's data: a truncated download

    report = collect_webdataset(tmp_path / "ds", str(tmp_path / "in" / "part-{000000..000001}.tar"),
                                label_space=make_dataset(tmp_path / "space", n=1).label_space)
    assert len(report.added) == 2  # a.png and b.png
    where = dict(report.quarantined)
    assert set(where) == {"part-000000.tar:broken.jpg", "part-000000.tar:badjson.json", "part-000000.tar:../escape.png",
                          "part-000000.tar:/abs/olute.png", "part-000000.tar:lonely"}
    assert where["part-000000.tar:broken.jpg"].split(":")[0] in {"truncated", "not_an_image", "corrupt"}
    assert "unsafe member name" in where["part-000000.tar:../escape.png"]
    assert "JSON does not parse" in where["part-000000.tar:badjson.json"]
    assert [shard for shard, _ in report.damaged_shards] == [str(second)]
    ds = Dataset.open(tmp_path / "ds")
    recorded = {r["source"] for r in ds.quarantine()}
    assert set(where) <= recorded  # quarantine.jsonl names the shard and member too
    assert check_dataset(ds.root) == []  # the folder stays valid
    assert not (tmp_path / "escape.png").exists() and not (tmp_path / "in" / "escape.png").exists()
    by_source = {r["source_id"]: r for r in ds.rows()}
    a = by_source["part-000000.tar/a"]
    assert (a["class_index"], a["attribution"], a["license"], a["source_url"]) == (1, "B", "cc-by-4.0", "http://127.0.0.1/a")
    assert by_source["part-000001.tar/b"]["class_index"] == 2
    assert json.loads(by_source["part-000000.tar/a"]["extra"])["webdataset_json"]["url"] == "http://127.0.0.1/a"
