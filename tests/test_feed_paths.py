"""Dataset.image_paths: image_path for many rows at once, with the same refusals."""
from __future__ import annotations

import os

import pytest
from eval_helpers import make_folder

from curate.engine.local import image_paths
from curate.store import DatasetError


@pytest.fixture()
def folder(tmp_path):
    return make_folder(tmp_path / "ds", per_class=3)


def test_the_same_paths_as_image_path_by_id_row_and_index(folder) -> None:
    ids = folder.sample_ids()
    rows = folder.rows()
    expected = [folder.image_path(sid) for sid in ids]
    assert folder.image_paths(ids) == expected
    assert folder.image_paths(rows) == expected
    assert folder.image_paths([{"sample_id": sid} for sid in ids]) == expected
    assert folder.image_paths(list(range(len(ids)))) == expected
    assert folder.image_paths(reversed(ids)) == expected[::-1]
    assert folder.image_paths([]) == []
    assert image_paths(folder, ids) == expected  # what the local engine calls


def test_unknown_ids_and_bad_rows_are_refused(folder) -> None:
    with pytest.raises(DatasetError, match="no sample"):
        folder.image_paths([folder.sample_ids()[0], "nope"])
    with pytest.raises(DatasetError, match="outside 0"):
        folder.image_paths([10_000])
    for bad in ("media/../../etc/passwd", "/etc/passwd", "masks/x.png", "media\\x.png", "media//x.png",
                ""):
        with pytest.raises(DatasetError):
            folder.image_path({"filepath": bad})
        with pytest.raises(DatasetError):
            folder.image_paths([{"filepath": bad}])
    # a path safe_relpath accepts though the quick check doubts it is accepted, as by image_path
    odd = {"filepath": "media/./" + folder.rows()[0]["filepath"].split("/", 1)[1]}
    assert folder.image_paths([odd]) == [folder.image_path(odd)]


def test_symlinks_out_of_the_folder_are_refused(folder, tmp_path) -> None:
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"secret")
    row = folder.rows()[0]
    target = folder.root / row["filepath"]
    target.unlink()
    os.symlink(outside, target)  # a file symlink leaving the folder
    with pytest.raises(DatasetError, match="resolves outside"):
        folder.image_path(row)
    with pytest.raises(DatasetError, match="resolves outside"):
        folder.image_paths([row])
    inside = folder.root / folder.rows()[1]["filepath"]
    target.unlink()
    os.symlink(inside, target)  # a symlink that stays inside is followed, as image_path does
    assert folder.image_paths([row]) == [folder.image_path(row)]
    # a folder symlink leaving the dataset
    evil = tmp_path / "evil"
    evil.mkdir()
    os.symlink(evil, folder.root / "media" / "zz")
    with pytest.raises(DatasetError, match="resolves outside"):
        folder.image_path({"filepath": "media/zz/a.png"})
    with pytest.raises(DatasetError, match="resolves outside"):
        folder.image_paths([{"filepath": "media/zz/a.png"}])


def test_a_missing_file_is_returned_like_image_path_does(folder) -> None:
    row = folder.rows()[0]
    (folder.root / row["filepath"]).unlink()
    assert folder.image_paths([row]) == [folder.image_path(row)]
    assert folder.image_paths([{"filepath": "media/00/none.png"}]) == [folder.image_path({"filepath": "media/00/none.png"})]
