"""The COCO collector on a hand-made annotation file: masks against pycocotools' annToMask
(a polygon, a compressed RLE, an uncompressed RLE and a crowd region), crowd handling,
per-instance masks, local and HTTP images, mappings, unsafe names, resume and the CLI."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from fake_inat import FileServer
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from curate.cli import main
from curate.collect.coco import collect_coco, instance_masks, load_mapping, safe_member
from curate.labels import imagenet1k
from curate.paths import data_file
from curate.store import Dataset, check_dataset

W, H = 40, 30
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pycocotools.*")


def _rle_string(binary: np.ndarray) -> dict:
    rle = mask_utils.encode(np.asfortranarray(binary.astype(np.uint8)))
    return {"size": rle["size"], "counts": rle["counts"].decode("ascii")}


def _uncompressed(binary: np.ndarray) -> dict:
    flat = binary.astype(np.uint8).flatten(order="F")
    counts, current, run = [], 0, 0
    for value in flat:
        if value == current:
            run += 1
        else:
            counts.append(run)
            current, run = value, 1
    counts.append(run)
    return {"size": list(binary.shape), "counts": counts}


def _box(y0: int, y1: int, x0: int, x1: int, h: int = H, w: int = W) -> np.ndarray:
    out = np.zeros((h, w), dtype=bool)
    out[y0:y1, x0:x1] = True
    return out


def _jpeg(seed: int, size=(W, H)) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@pytest.fixture()
def coco_files(tmp_path) -> tuple[Path, Path]:
    images = tmp_path / "images"
    images.mkdir()
    names = {1: "a.jpg", 2: "b.jpg", 3: "c.jpg", 4: "d.jpg", 5: "../../outside.jpg", 6: "small.jpg"}
    for image_id, name in names.items():
        if image_id == 5:
            continue
        size = (20, 20) if image_id == 6 else (W, H)
        (images / name).write_bytes(_jpeg(image_id, size))
    annotations = [
        # image 1: a cat as a two-part polygon, a cat as compressed RLE, a crowd of cats (uncompressed RLE), a dog
        {"id": 101, "image_id": 1, "category_id": 17, "iscrowd": 0, "area": 60.0, "bbox": [2, 2, 10, 8],
         "segmentation": [[2, 2, 12, 2, 12, 10, 2, 10], [14, 3, 18, 3, 16, 8]]},
        {"id": 102, "image_id": 1, "category_id": 17, "iscrowd": 0, "area": 50.0, "bbox": [20, 5, 10, 5],
         "segmentation": _rle_string(_box(5, 10, 20, 30))},
        {"id": 103, "image_id": 1, "category_id": 17, "iscrowd": 1, "area": 80.0, "bbox": [25, 18, 10, 8],
         "segmentation": _uncompressed(_box(18, 26, 25, 35))},
        {"id": 104, "image_id": 1, "category_id": 18, "iscrowd": 0, "area": 16.0, "bbox": [5, 20, 4, 4],
         "segmentation": [[5, 20, 9, 20, 9, 24, 5, 24]]},
        # image 2: a cat as uncompressed RLE (non-crowd), overlapping a polygon cat
        {"id": 201, "image_id": 2, "category_id": 17, "iscrowd": 0, "area": 100.0, "bbox": [0, 0, 10, 10],
         "segmentation": _uncompressed(_box(0, 10, 0, 10))},
        {"id": 202, "image_id": 2, "category_id": 17, "iscrowd": 0, "area": 64.0, "bbox": [6, 6, 8, 8],
         "segmentation": [[6, 6, 14, 6, 14, 14, 6, 14]]},
        # image 3: a dog only; image 4: only a crowd of cats (not a candidate)
        {"id": 301, "image_id": 3, "category_id": 18, "iscrowd": 0, "area": 200.0, "bbox": [10, 5, 20, 10],
         "segmentation": [[10, 5, 30, 5, 30, 15, 10, 15]]},
        {"id": 401, "image_id": 4, "category_id": 17, "iscrowd": 1, "area": 40.0, "bbox": [0, 0, 5, 8],
         "segmentation": _uncompressed(_box(0, 8, 0, 5))},
        # image 5: a hostile file name; image 6: the annotation's size does not match the file
        {"id": 501, "image_id": 5, "category_id": 18, "iscrowd": 0, "area": 30.0, "bbox": [0, 0, 5, 6],
         "segmentation": [[0, 0, 5, 0, 5, 6, 0, 6]]},
        {"id": 601, "image_id": 6, "category_id": 18, "iscrowd": 0, "area": 30.0, "bbox": [0, 0, 5, 6],
         "segmentation": [[0, 0, 5, 0, 5, 6, 0, 6]]},
    ]
    data = {
        "info": {"description": "hand-made"},
        "licenses": [{"id": 1, "name": "Attribution-NonCommercial-ShareAlike License",
                      "url": "http://creativecommons.org/licenses/by-nc-sa/2.0/"},
                     {"id": 4, "name": "Attribution License", "url": "http://creativecommons.org/licenses/by/2.0/"}],
        "images": [{"id": i, "file_name": n, "width": W, "height": H, "license": 1 if i % 2 else 4,
                    "coco_url": f"http://images.cocodataset.org/val2017/{n}", "flickr_url": f"http://farm1.x/{i}.jpg"}
                   for i, n in names.items()],
        "annotations": annotations,
        "categories": [{"id": 16, "name": "bird", "supercategory": "animal"},
                       {"id": 17, "name": "cat", "supercategory": "animal"},
                       {"id": 18, "name": "dog", "supercategory": "animal"}],
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(data))
    return path, images


def _reference(ann_file: Path) -> COCO:
    import contextlib

    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(str(ann_file))


def _by_image(root: Path) -> dict[int, dict]:
    return {json.loads(r["extra"])["coco_image_id"]: r for r in Dataset.open(root).rows()}


def test_masks_equal_pycocotools_union_of_non_crowd_instances(tmp_path, coco_files) -> None:
    ann_file, images = coco_files
    report = collect_coco(tmp_path / "ds", ann_file, images_root=images, categories=["cat", "dog"])
    coco = _reference(ann_file)
    ds = Dataset.open(tmp_path / "ds")
    rows = _by_image(tmp_path / "ds")
    assert sorted(rows) == [1, 2, 3]  # 4 has only a crowd, 5 is unsafe, 6 does not match its annotation
    assert ds.label_space.names == ("bird", "cat", "dog")
    for image_id, row in rows.items():
        extra = json.loads(row["extra"])
        cat = extra["coco_category_id"]
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[image_id], catIds=[cat], iscrowd=None))
        expected = np.zeros((H, W), dtype=np.uint8)
        for ann in anns:
            if not ann["iscrowd"]:
                expected |= coco.annToMask(ann)
        assert np.array_equal(ds.load_mask(row["sample_id"]), expected), image_id
        assert row["class_index"] == ds.label_space.names.index(extra["coco_category"])
        # per-instance masks: each non-crowd annotation's own mask (where no later instance covers it)
        per_instance = instance_masks(ds, row["sample_id"])
        assert sorted(per_instance) == sorted(a["id"] for a in anns if not a["iscrowd"])
        covered = np.zeros((H, W), dtype=bool)
        for ann in sorted((a for a in anns if not a["iscrowd"]), key=lambda a: -a["id"]):
            own = coco.annToMask(ann).astype(bool)
            assert np.array_equal(per_instance[ann["id"]], own & ~covered)
            covered |= own
    one = json.loads(rows[1]["extra"])
    assert one["coco_category"] == "cat" and one["other_categories"] == ["dog"]
    assert one["crowd_annotation_ids"] == [103] and one["crowd_pixels"] == 8 * 10
    crowd = coco.annToMask(coco.loadAnns([103])[0]).astype(bool)
    assert not ds.load_mask(rows[1]["sample_id"])[crowd].any()  # crowd excluded from the union
    values = np.array(Image.open(ds.root / one["instance_mask_path"]))
    assert (values[crowd] == 255).all()  # ... and marked 255 in the instance mask
    assert rows[1]["license"] == "cc-by-nc-sa-2.0" and rows[2]["license"] == "cc-by-2.0"  # the version kept
    assert rows[1]["mask_status"] == "coco" and rows[1]["source"] == "coco" and rows[1]["source_id"] == "1"
    reasons = {f[0]: f[1] for f in report.failures}
    assert any("size_mismatch" in r for r in reasons.values())
    skipped = report.totals()["skipped"]
    assert skipped == 1  # the hostile name
    assert not check_dataset(tmp_path / "ds")
    assert not (tmp_path / "outside.jpg").exists()


def test_include_crowd_and_skip_multi(tmp_path, coco_files) -> None:
    ann_file, images = coco_files
    collect_coco(tmp_path / "a", ann_file, images_root=images, categories=["cat"], include_crowd=True)
    coco = _reference(ann_file)
    row = _by_image(tmp_path / "a")[1]
    crowd = coco.annToMask(coco.loadAnns([103])[0]).astype(bool)
    assert Dataset.open(tmp_path / "a").load_mask(row["sample_id"])[crowd].all()
    report = collect_coco(tmp_path / "b", ann_file, images_root=images, categories=["cat", "dog"], multi="skip")
    assert 1 not in _by_image(tmp_path / "b")
    from curate.collect.journal import Journal  # noqa: F401 - the journal names why
    journal = next((tmp_path / "b" / ".collect").glob("coco-*.jsonl")).read_text()
    assert "multiple_categories" in journal and report.totals()["skipped"] >= 1


def test_http_images_with_faults_then_resume(tmp_path, coco_files) -> None:
    ann_file, images = coco_files
    files = {f"/val/{p.name}": p.read_bytes() for p in images.iterdir()}
    with FileServer(files, faults={"/val/a.jpg": "500_once", "/val/b.jpg": "truncate_once"}) as server:
        from curate.collect.http import PoliteClient, RetryPolicy

        client = PoliteClient(api_limits=None, download_limits=None, byte_limits=None,
                              allowed_download_hosts={"127.0.0.1"},
                              retry=RetryPolicy(max_attempts=3, backoff_base=0.01, jitter=0.0))
        collect_coco(tmp_path / "http", ann_file, image_url_base=server.url + "/val/", client=client,
                     categories=["cat", "dog"])
        hits = sum(server.requests.values())
        collect_coco(tmp_path / "http", ann_file, image_url_base=server.url + "/val/", client=client,
                     categories=["cat", "dog"])
        assert sum(server.requests.values()) == hits  # the re-run fetches nothing
        assert not any(".." in path for path in server.requests)
    collect_coco(tmp_path / "local", ann_file, images_root=images, categories=["cat", "dog"])
    local = {i: (r["sample_id"], r["class_index"]) for i, r in _by_image(tmp_path / "local").items()}
    remote = {i: (r["sample_id"], r["class_index"]) for i, r in _by_image(tmp_path / "http").items()}
    assert local == remote
    ds_l, ds_r = Dataset.open(tmp_path / "local"), Dataset.open(tmp_path / "http")
    for sid, _ in local.values():
        assert np.array_equal(ds_l.load_mask(sid), ds_r.load_mask(sid))


def test_mapping_to_imagenet(tmp_path, coco_files) -> None:
    ann_file, images = coco_files
    with pytest.raises(ValueError, match=r"no ImageNet-1K class for \['dog'\]"):
        collect_coco(tmp_path / "x", ann_file, images_root=images, categories=["cat", "dog"],
                     mapping="coco_to_imagenet")
    collect_coco(tmp_path / "m", ann_file, images_root=images, categories=["cat"], mapping="coco_to_imagenet")
    ds = Dataset.open(tmp_path / "m")
    assert ds.label_space.is_builtin
    rows = ds.rows()
    assert len(rows) == 2  # the two images with non-crowd cats
    for row in rows:
        assert row["class_index"] == 281
        assert json.loads(row["extra"])["imagenet_indices"] == [281, 282, 283, 284, 285]
    with pytest.raises(Exception, match="label space"):  # a COCO-space dataset cannot take ImageNet classes
        collect_coco(tmp_path / "m", ann_file, images_root=images, categories=["cat"])


def test_shipped_mapping_names_match_imagenet() -> None:
    mapping = load_mapping("coco_to_imagenet")
    assert len(mapping) == 80
    space = imagenet1k()
    for line in data_file("coco_to_imagenet.yaml").read_text().splitlines():
        match = re.match(r"^  ([a-z ]+): \[([0-9, ]+)\]\s+# (.+)$", line)
        if match:
            indices = [int(i) for i in match.group(2).split(",")]
            assert [space.names[i] for i in indices] == [n.strip() for n in match.group(3).split(", ")], line
            assert mapping[match.group(1)] == indices


def test_unknown_categories_and_sources(tmp_path, coco_files) -> None:
    ann_file, images = coco_files
    with pytest.raises(ValueError, match="unknown COCO category.*'zebra'"):
        collect_coco(tmp_path / "a", ann_file, images_root=images, categories=["zebra"])
    with pytest.raises(ValueError, match="exactly one image source"):
        collect_coco(tmp_path / "a", ann_file, images_root=images, image_url_base="http://x/")
    for bad in ("../x.jpg", "/etc/passwd", "a/../../b", "C:\\x"):
        with pytest.raises(ValueError):
            safe_member(images, bad)


def test_cli_collect_coco(tmp_path, coco_files) -> None:
    ann_file, images = coco_files
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["collect", "coco", str(tmp_path / "ds"), "--annotations", str(ann_file),
                                  "--images-root", str(images), "--categories", "cat,dog", "--per-category", "1"])
    assert result.exit_code == 0, result.output
    assert "17 cat" in result.output and "1/1" in result.output
    assert len(Dataset.open(tmp_path / "ds")) == 2


def test_cli_collect_coco_into_a_relative_folder_twice(tmp_path, coco_files, monkeypatch) -> None:
    """As typed (issue 28): a relative DIRECTORY with a trailing slash, twice (the second adds nothing)."""
    ann_file, images = coco_files
    monkeypatch.chdir(tmp_path)
    runner = CliRunner(env={"COLUMNS": "200"})
    for _ in range(2):
        result = runner.invoke(main, ["collect", "coco", "mycoco/", "--annotations", str(ann_file),
                                      "--images-root", str(images), "--categories", "cat,dog", "--per-category", "1"])
        assert result.exit_code == 0, result.output
    assert len(Dataset.open(tmp_path / "mycoco")) == 2
