"""Each image is decoded once on its way in (issue 42): for every collector, each stored image's bytes are
opened by Pillow exactly once (the engine's verification), not a second time by ``Dataset.add_samples``;
and a verified :class:`PreparedImage` is stored as it is while any other one is verified again.
(``collect fiftyone`` is counted in tests/test_collect_fiftyone.py, which has its MongoDB.)"""
from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from decode_helpers import count_opens, opens_per_stored_image
from fake_inat import FakeINat, make_world
from PIL import Image
from store_helpers import make_dataset

from curate.collect.coco import collect_coco
from curate.collect.composite import CompositeSpec, compose
from curate.collect.folder import import_folder
from curate.collect.hub import collect_hub
from curate.collect.inat import INatClass, collect_inat, make_client
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.collect.webdataset import collect_webdataset
from curate.export.webdataset import export_webdataset
from curate.store import Dataset, NewSample, check_dataset, prepare_image


def _jpeg(seed: int, size: tuple[int, int] = (24, 16)) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


Run = Callable[[Path], object]


def _folder(tmp: Path) -> Run:
    for k, cls in enumerate(["9", "10", "9"]):
        path = tmp / "src" / cls / f"{k}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_jpeg(k))
    return lambda out: import_folder(tmp / "src", out, "imagefolder", license="cc-by", concurrency=2)


def _hub(tmp: Path) -> Run:
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array([{"bytes": _jpeg(k), "path": None} for k in range(3)], type=image),
                      "label": ["ostrich", "brambling", "ostrich"], "licence": ["cc-by"] * 3})
    (tmp / "hub" / "data").mkdir(parents=True)
    pq.write_table(table, tmp / "hub" / "data" / "train-00000-of-00001.parquet")
    return lambda out: collect_hub(tmp / "hub", out, license_column="licence", concurrency=2)


def _coco(tmp: Path) -> Run:
    (tmp / "images").mkdir()
    images, annotations = [], []
    for k in range(3):
        (tmp / "images" / f"{k}.jpg").write_bytes(_jpeg(k, (40, 30)))
        images.append({"id": k + 1, "file_name": f"{k}.jpg", "width": 40, "height": 30, "license": 4})
        annotations.append({"id": 100 + k, "image_id": k + 1, "category_id": 17, "iscrowd": 0, "area": 80.0,
                            "bbox": [2, 2, 10, 8], "segmentation": [[2, 2, 12, 2, 12, 10, 2, 10]]})
    (tmp / "instances.json").write_text(json.dumps({
        "images": images, "annotations": annotations,
        "licenses": [{"id": 4, "name": "Attribution License", "url": "http://creativecommons.org/licenses/by/2.0/"}],
        "categories": [{"id": 17, "name": "cat", "supercategory": "animal"}]}))
    return lambda out: collect_coco(out, tmp / "instances.json", images_root=tmp / "images", categories=["cat"],
                                    concurrency=2)


def _inat(tmp: Path) -> Run:
    return _inat_run


def _inat_run(out: Path) -> None:
    # 3 observations per taxon: the world plants no photo twice (two candidates with the same bytes
    # would each be decoded once, rightly)
    with FakeINat(make_world(n_per_taxon=3)) as server, \
            make_client(api_url=server.api_url, api_rate=None, download_rate=None, byte_rate=None) as client:
        collect_inat(out, [INatClass(9, "ostrich")], per_class=2, api_url=server.api_url, client=client,
                     concurrency=2)


def _composite(tmp: Path) -> Run:
    collect_synthetic(tmp / "objects", WorldSpec(classes=DEFAULT_CLASSES[:2], per_class=2, image_size=32, seed=3))
    return lambda out: compose(tmp / "objects", out, CompositeSpec(p=0.5, colors=("red", "blue"), seed=1))


def _webdataset(tmp: Path) -> Run:
    report = export_webdataset(make_dataset(tmp / "wds-src", n=3), tmp / "wds", shard_size=2)
    return lambda out: collect_webdataset(out, [str(p) for p in report.shards])


#: collector -> its set-up (the source, made before counting), which returns the collection to count
COLLECTORS: dict[str, Callable[[Path], Run]] = {
    "folder": _folder, "hub": _hub, "coco": _coco, "inat": _inat, "composite": _composite, "webdataset": _webdataset,
}


@pytest.mark.parametrize("collector", list(COLLECTORS))
def test_each_stored_image_is_decoded_once(collector: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pillow opens each stored image's bytes exactly once between source and store (before issue 42 the
    engine's collectors opened each twice: once to verify, once more in add_samples)."""
    out = tmp_path / "ds"
    collect = COLLECTORS[collector](tmp_path)
    counts = count_opens(monkeypatch)
    collect(out)
    monkeypatch.undo()
    opened = opens_per_stored_image(counts, out)
    assert len(opened) >= 2
    assert opened == {sid: 1 for sid in opened}
    assert not check_dataset(out)


def test_a_verified_prepared_image_is_stored_without_a_decode_and_a_forged_one_is_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``add_samples`` keeps a PreparedImage made by ``prepare_image`` as it is (no decode), while a hand-made
    or ``dataclasses.replace``-d one is verified from its bytes like plain bytes: corrupt bytes are
    quarantined with their reason, a forged sha256 never reaches the table."""
    ds = Dataset.create(tmp_path / "ds", name="t")
    good = prepare_image(_jpeg(1))
    assert good.verified and not dataclasses.replace(good).verified
    counts = count_opens(monkeypatch)
    report = ds.add_samples([NewSample(image=good, class_index=9)])
    monkeypatch.undo()
    assert report.added == [good.sha256[:16]] and sum(counts.values()) == 0
    forged = dataclasses.replace(good, data=_jpeg(3)[:300])  # a cut JPEG under a verified-looking record
    hand_made = dataclasses.replace(prepare_image(_jpeg(2)), sha256="0" * 64)
    report = ds.add_samples([NewSample(image=forged, class_index=9, source_id="forged"),
                             NewSample(image=hand_made, class_index=9, source_id="hand")])
    assert [why.split(":")[0] for _, why in report.quarantined] == ["truncated"]
    assert report.added == [prepare_image(_jpeg(2)).sha256[:16]]  # its real sha256, not the forged one
    assert ds.quarantine()[0]["copy"] and not check_dataset(ds.root)
