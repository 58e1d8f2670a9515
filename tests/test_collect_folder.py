"""Local folders: ImageFolder (class folders by index, WordNet id, name), the released
CounterAnimal layout (easy-/hard-, common-/counter-), licence CSVs, clear errors, resume, CLI."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from curate.cli import main
from curate.collect.folder import (
    FolderLayoutError,
    import_folder,
    parse_group_folder,
    resolve_class_folder,
)
from curate.labels import UnknownClassError, imagenet1k
from curate.store import Dataset, check_dataset


def _image(path: Path, seed: int, fmt: str = "JPEG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).save(buffer, fmt)
    path.write_bytes(buffer.getvalue())


def _rows(root: Path) -> dict[str, dict]:
    return {r["source_id"]: r for r in Dataset.open(root).rows()}


def test_resolve_class_folder_names() -> None:
    space = imagenet1k()
    for name, index in [("9", 9), ("009", 9), ("n01518878", 9), ("ostrich", 9), ("black_swan", 100),
                        ("9 ostrich", 9), ("009_ostrich", 9), ("n01518878_ostrich", 9), ("Struthio camelus", 9),
                        ("ice bear, polar bear", 296), ("missile (657)", 657), ("missile (744)", 744)]:
        assert resolve_class_folder(name, space) == index, name
    with pytest.raises(UnknownClassError, match="did you mean"):
        resolve_class_folder("ostrichh", space)


def test_parse_group_folder() -> None:
    vocab = ["ground", "water", "snow"]
    assert parse_group_folder("easy-ground", vocab) == ("easy", "ground", "ground")
    assert parse_group_folder("hard_Water", vocab) == ("hard", "water", "Water")
    assert parse_group_folder("common-snow", vocab) == ("easy", "snow", "snow")
    assert parse_group_folder("counter-lava", vocab) == ("hard", None, "lava")
    with pytest.raises(ValueError, match="easy-<background>"):
        parse_group_folder("medium-ground", vocab)


def test_imagefolder(tmp_path) -> None:
    src = tmp_path / "src"
    _image(src / "9" / "a.jpg", 1)
    _image(src / "n01530575" / "b.jpg", 2)  # brambling by WordNet id
    _image(src / "black_swan" / "nested" / "c.png", 3, "PNG")
    _image(src / "16 bulbul" / "d.jpg", 4)
    _image(src / "16 bulbul" / "same-as-a.jpg", 1)  # identical bytes to 9/a.jpg
    (src / "9" / "notes.txt").write_text("not an image")
    (src / "9" / "broken.jpg").write_bytes(b"\xff\xd8\xff" + b"junk" * 10)
    (src / "stray.jpg").write_bytes(b"x")
    outside = tmp_path / "secret.jpg"
    _image(outside, 9)
    os.symlink(outside, src / "9" / "link.jpg")
    report = import_folder(src, tmp_path / "ds", "imagefolder", license="cc-by", attribution="me")
    rows = _rows(tmp_path / "ds")
    assert {k: r["class_index"] for k, r in rows.items()} == {"9/a.jpg": 9, "n01530575/b.jpg": 10,
                                                             "black_swan/nested/c.png": 100, "16 bulbul/d.jpg": 16}
    assert all(r["status"] == "candidate" and r["source"] == "folder" and r["license"] == "cc-by" for r in rows.values())
    assert report.totals()["duplicate"] == 1 and report.totals()["quarantined"] == 1
    skipped = " ".join(report.info["skipped_files"])
    assert "stray.jpg" in skipped and "link.jpg" in skipped
    assert not check_dataset(tmp_path / "ds")
    again = import_folder(src, tmp_path / "ds", "imagefolder", license="cc-by", attribution="me")
    assert not again.added and sum(again.totals().values()) == 0  # everything journaled: nothing re-read
    assert len(Dataset.open(tmp_path / "ds")) == 4


def test_unknown_class_folders_fail_before_anything_is_written(tmp_path) -> None:
    src = tmp_path / "src"
    _image(src / "dragon" / "a.jpg", 1)
    _image(src / "ostrich" / "b.jpg", 2)
    _image(src / "unicorn" / "c.jpg", 3)
    _image(src / "cat" / "d.jpg", 4)
    with pytest.raises(FolderLayoutError) as info:
        import_folder(src, tmp_path / "ds")
    assert "'dragon'" in str(info.value) and "'unicorn'" in str(info.value) and "Rename" in str(info.value)
    assert "'cat'" in str(info.value) and "did you mean 'tabby cat' (281), 'tiger cat' (282)" in str(info.value)
    assert not (tmp_path / "ds").exists()


def test_counteranimal_layout_and_licence_csv(tmp_path) -> None:
    src = tmp_path / "CounterAnimal"
    _image(src / "9 ostrich" / "easy-ground" / "1.jpg", 1)
    _image(src / "9 ostrich" / "hard-water" / "2.jpg", 2)
    _image(src / "10 brambling" / "common-grass" / "3.jpg", 3)
    _image(src / "10 brambling" / "counter-sky" / "4.jpg", 4)
    _image(src / "10 brambling" / "counter-lava" / "5.jpg", 5)
    csv = tmp_path / "licenses.csv"
    csv.write_text("path,license,attribution,source_url\n"
                   "9 ostrich/easy-ground/1.jpg,CC BY-NC 4.0,Ann,https://example.org/1\n"
                   "10 brambling/counter-sky/4.jpg,cc0,Bob,\n"
                   "missing/file.jpg,cc0,Nobody,\n")
    import_folder(src, tmp_path / "ds", "counteranimal", licenses_csv=csv)
    rows = _rows(tmp_path / "ds")
    got = {k: (r["class_index"], r["group"], r["background"], r["background_source"]) for k, r in rows.items()}
    assert got == {
        "9 ostrich/easy-ground/1.jpg": (9, "easy", "ground", "human"),
        "9 ostrich/hard-water/2.jpg": (9, "hard", "water", "human"),
        "10 brambling/common-grass/3.jpg": (10, "easy", "grass", "human"),
        "10 brambling/counter-sky/4.jpg": (10, "hard", "sky", "human"),
        "10 brambling/counter-lava/5.jpg": (10, "hard", None, None),
    }
    assert json.loads(rows["10 brambling/counter-lava/5.jpg"]["extra"])["folder_background"] == "lava"
    first = rows["9 ostrich/easy-ground/1.jpg"]
    assert (first["license"], first["attribution"], first["source_url"]) == ("cc-by-nc-4.0", "Ann", "https://example.org/1")
    assert rows["10 brambling/counter-sky/4.jpg"]["license"] == "cc0"
    assert rows["9 ostrich/hard-water/2.jpg"]["license"] is None
    assert all(r["status"] == "accepted" for r in rows.values())


def test_counteranimal_bad_group_folder_is_a_clear_error(tmp_path) -> None:
    src = tmp_path / "src"
    _image(src / "9" / "medium-ground" / "1.jpg", 1)
    _image(src / "9" / "easy-ground" / "2.jpg", 2)
    with pytest.raises(FolderLayoutError, match="medium-ground"):
        import_folder(src, tmp_path / "ds", "counteranimal")


def test_custom_label_space(tmp_path) -> None:
    from curate.labels import LabelSpace

    src = tmp_path / "src"
    _image(src / "cat" / "1.jpg", 1)
    _image(src / "1" / "2.jpg", 2)
    space = LabelSpace.from_names("pets", ["cat", "dog"])
    import_folder(src, tmp_path / "ds", label_space=space)
    assert {r["class_name"] for r in Dataset.open(tmp_path / "ds").rows()} == {"cat", "dog"}


def test_cli_collect_folder(tmp_path) -> None:
    src = tmp_path / "src"
    _image(src / "9" / "easy-ground" / "1.jpg", 1)
    _image(src / "9" / "hard-water" / "2.jpg", 2)
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["collect", "folder", str(tmp_path / "ds"), str(src), "--layout", "counteranimal",
                                  "--license", "cc-by"])
    assert result.exit_code == 0, result.output
    assert "2 added" in result.output
    _image(tmp_path / "bad" / "dragon" / "1.jpg", 3)
    result = runner.invoke(main, ["collect", "folder", str(tmp_path / "other"), str(tmp_path / "bad")])
    assert result.exit_code == 1 and "'dragon'" in result.output and "Traceback" not in result.output


def test_cli_collect_folder_keeps_the_licence_version(tmp_path) -> None:
    """`--license gpl-2.0` is stored as gpl-2.0 (not gpl: GPL-2.0 and GPL-3.0 oblige differently), and a
    CSV's ``CC BY-NC 4.0`` as cc-by-nc-4.0."""
    src = tmp_path / "src"
    _image(src / "9" / "1.jpg", 1)
    _image(src / "9" / "2.jpg", 2)
    (tmp_path / "lic.csv").write_text("path,license,attribution\n9/2.jpg,CC BY-NC 4.0,someone\n")
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["collect", "folder", str(tmp_path / "ds"), str(src), "--license", "gpl-2.0",
                                  "--licenses-csv", str(tmp_path / "lic.csv")])
    assert result.exit_code == 0, result.output
    rows = _rows(tmp_path / "ds")
    assert rows["9/1.jpg"]["license"] == "gpl-2.0" and rows["9/2.jpg"]["license"] == "cc-by-nc-4.0"
