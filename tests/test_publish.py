"""The Hub folder: written with --out, read back with datasets.load_dataset, compared with the folder."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

datasets = pytest.importorskip("datasets")
from huggingface_hub import DatasetCard  # noqa: E402
from publish_helpers import CLASSES, make_dataset  # noqa: E402

from curate.cli import main  # noqa: E402
from curate.publish import COLUMN_DOCS, PublishError, write_hub_folder  # noqa: E402
from curate.publish.hub import MANIFEST, read_manifest  # noqa: E402
from curate.store import Dataset  # noqa: E402


@pytest.fixture()
def world(tmp_path: Path) -> Dataset:
    return make_dataset(tmp_path / "world")


def load(folder: Path, tmp_path: Path, **kwargs):
    return datasets.load_dataset(str(folder), cache_dir=str(tmp_path / "hf-cache"), **kwargs)


def expected_rows(ds: Dataset, splits=("easy", "hard")) -> dict[str, dict]:
    wanted = []
    for r in ds.rows(status="accepted"):
        split = r["group"] if r["group"] else "other"
        if split in splits:
            wanted.append(r)
    return {r["sample_id"]: r for r in wanted}


def test_out_folder_round_trips_through_load_dataset(world: Dataset, tmp_path: Path) -> None:
    folder = write_hub_folder(world.root, tmp_path / "hub", repo_id="alice/pubtest")
    assert folder.splits == {"easy": 9, "hard": 9}
    assert (tmp_path / "hub" / "data" / "easy-00000-of-00001.parquet").is_file()
    assert sorted(folder.files) == ["ATTRIBUTION.csv", "README.md", "data/easy-00000-of-00001.parquet",
                                    "data/hard-00000-of-00001.parquet"]
    loaded = load(tmp_path / "hub", tmp_path)
    assert set(loaded) == {"easy", "hard"}
    assert list(loaded["easy"].features) == list(COLUMN_DOCS)
    expected = expected_rows(world)
    seen = set()
    for split in ("easy", "hard"):
        part = loaded[split]
        features = part.features
        raw = part.cast_column("image", datasets.Image(decode=False)).cast_column("mask", datasets.Image(decode=False))
        for row in raw:
            source = expected[row["sample_id"]]
            seen.add(row["sample_id"])
            assert row["image"]["bytes"] == world.image_path(source).read_bytes()
            mask = world.mask_path(source)
            if mask is None:
                assert row["mask"] is None
            else:
                assert row["mask"]["bytes"] == mask.read_bytes()
            assert features["group"].int2str(row["group"]) == source["group"] == split
            assert features["background"].int2str(row["background"]) == source["background"]
            name = features["label"].int2str(row["label"])
            assert name.split(" (")[0] == source["class_name"]
            assert row["class_index"] == source["class_index"]
            for column in ("sha256", "width", "height", "source", "source_id", "source_url", "attribution",
                           "background_source", "mask_status", "tags"):
                assert row[column] == source[column], column
            assert row["license"] == "cc-by" and row["license_as_stated"] == source["license"]
            extra = json.loads(row["extra"])
            assert extra == {"observation_id": json.loads(source["extra"])["observation_id"]}  # location removed
    assert seen == set(expected)
    # decoded images equal the stored ones
    first = loaded["hard"][0]
    assert first["image"].size == (12, 12)


def test_duplicate_class_names_get_their_index(world: Dataset, tmp_path: Path) -> None:
    write_hub_folder(world.root, tmp_path / "hub")
    names = load(tmp_path / "hub", tmp_path, split="easy").features["label"].names
    assert names == ["ostrich", "missile (657)", "missile (744)"]
    assert len(set(names)) == len(CLASSES)


def test_easy_hard_selection_is_one_argument(world: Dataset, tmp_path: Path) -> None:
    write_hub_folder(world.root, tmp_path / "hub")
    hard = load(tmp_path / "hub", tmp_path, split="hard")
    assert hard.num_rows == 9
    assert set(hard.features["group"].int2str(g) for g in hard["group"]) == {"hard"}
    both = load(tmp_path / "hub", tmp_path, split="easy+hard")
    assert both.num_rows == 18
    assert set(both["sample_id"]) == set(expected_rows(world))


def test_include_unsplit_adds_an_other_split(world: Dataset, tmp_path: Path) -> None:
    folder = write_hub_folder(world.root, tmp_path / "hub", include_unsplit=True)
    assert folder.splits == {"easy": 9, "hard": 9, "other": 3}
    other = load(tmp_path / "hub", tmp_path, split="other")
    assert other["group"] == [None, None, None]
    assert set(other["sample_id"]) == set(expected_rows(world, ("other",)))


def test_card_parses_and_carries_licence_and_provenance(world: Dataset, tmp_path: Path) -> None:
    folder = write_hub_folder(world.root, tmp_path / "hub", repo_id="alice/pubtest")
    card = DatasetCard.load(folder.card_path)
    assert card.data.license == "cc-by-4.0"
    assert card.data.pretty_name == "pubtest"
    assert "non-commercial" not in card.data.tags
    assert card.data.configs == [{"config_name": "default", "default": True,
                                  "data_files": [{"split": "easy", "path": "data/easy-*"},
                                                 {"split": "hard", "path": "data/hard-*"}]}]
    info = card.data.dataset_info
    assert {s["name"]: s["num_examples"] for s in info["splits"]} == {"easy": 9, "hard": 9}
    text = card.text
    assert 'load_dataset("alice/pubtest", split="hard")' in text
    assert "A Sober Look at the Robustness of {CLIP}s to Spurious Features" in text  # the citation
    assert "| 1: missile (657) | missile (657) | grass | water | 3 | 3 |" in text  # the per-class table
    assert "min_per_background=2" in text and "ViT-B-32 / ref.pt" in text  # split rule, reference (path reduced)
    assert "/home/someone" not in (tmp_path / "hub" / "README.md").read_text()
    assert "Published with curate" in text and "clarity 3" in text  # tool, curation counts
    with open(tmp_path / "hub" / "ATTRIBUTION.csv", newline="") as handle:
        credits = list(csv.DictReader(handle))
    assert len(credits) == 18
    assert {c["attribution"] for c in credits} == {r["attribution"] for r in expected_rows(world).values()}
    assert all(c["file"].startswith("data/") and c["license"] == "cc-by" for c in credits)


def test_card_says_where_the_published_masks_came_from(world: Dataset, tmp_path: Path) -> None:
    """Masks travel with the images; the card counts them by source and warns when some are
    unverified model proposals (curate propose-masks), which mask-based numbers should not use."""
    published = [sid for sid in expected_rows(world) if world.row(sid)["mask_path"] is not None]
    text = DatasetCard.load(write_hub_folder(world.root, tmp_path / "a").card_path).text
    assert f"Object masks of the published images by source: {len(published)} drawn or verified by people" in text
    assert "unverified model proposals" not in text
    world.set_masks({}, mask_status={published[0]: "model:tiny@abc"}, actor="test")
    text = DatasetCard.load(write_hub_folder(world.root, tmp_path / "b").card_path).text
    assert f"{len(published) - 1} drawn or verified by people, 1 **unverified model proposals**" in text
    assert "should use only the people-made and exact ones" in text


def test_shards_are_bounded_and_named_like_the_hub(world: Dataset, tmp_path: Path) -> None:
    folder = write_hub_folder(world.root, tmp_path / "hub", max_shard_bytes=2000)
    shards = sorted(p for p in folder.files if p.startswith("data/"))
    assert len(shards) > 2
    for path in shards:
        _, rest = Path(path).stem.split("-", 1)
        index, of, count = rest.split("-")
        assert of == "of" and int(index) < int(count) and len(index) == len(count) == 5
    loaded = load(tmp_path / "hub", tmp_path)
    assert loaded["easy"].num_rows + loaded["hard"].num_rows == 18


def test_rewriting_is_deterministic_and_unchanged_inputs_are_reused(world: Dataset, tmp_path: Path) -> None:
    first = write_hub_folder(world.root, tmp_path / "hub")
    again = write_hub_folder(world.root, tmp_path / "hub")
    assert again.reused and again.files == first.files
    forced = write_hub_folder(world.root, tmp_path / "hub", force=True)
    assert not forced.reused and forced.files == first.files  # same inputs, same bytes
    sid = world.ids(group="easy")[0]
    world.update([sid], {"attribution": "someone else"}, actor="test", reason="credit")
    changed = write_hub_folder(world.root, tmp_path / "hub")
    assert not changed.reused and changed.fingerprint != first.fingerprint
    assert changed.files["ATTRIBUTION.csv"]["sha256"] != first.files["ATTRIBUTION.csv"]["sha256"]
    assert read_manifest(tmp_path / "hub")["fingerprint"] == changed.fingerprint


def test_refuses_a_foreign_folder_and_an_empty_selection(world: Dataset, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(PublishError, match="not written by curate publish"):
        write_hub_folder(world.root, foreign)
    assert (foreign / "keep.txt").read_text() == "mine"
    empty = make_dataset(tmp_path / "nosplit", split_run=False)
    empty.update(empty.ids(), {"group": None}, actor="test", reason="no split")
    with pytest.raises(PublishError, match="run `curate split` first"):
        write_hub_folder(empty.root, tmp_path / "hub2")
    with pytest.raises(PublishError, match="inside the dataset folder"):
        write_hub_folder(world.root, world.root / "hub")


def test_cli_publish_out_and_dry_run(world: Dataset, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    runner = CliRunner()
    result = runner.invoke(main, ["publish", str(world.root), "--out", str(tmp_path / "hub"), "--repo", "alice/pubtest"])
    assert result.exit_code == 0, result.output
    assert "not uploaded" in result.output and (tmp_path / "hub" / MANIFEST).is_file()
    assert load(tmp_path / "hub", tmp_path)["easy"].num_rows == 9
    result = runner.invoke(main, ["publish", str(world.root), "--repo", "alice/pubtest", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "dry run" in result.output and "nothing was sent" in result.output
    assert (world.root / ".publish" / "hub-alice--pubtest" / "README.md").is_file()
    result = runner.invoke(main, ["publish", str(world.root), "--repo", "alice/pubtest"])
    assert result.exit_code == 1 and "no Hugging Face token in $HF_TOKEN" in result.output
    result = runner.invoke(main, ["publish", str(world.root), "--repo", "not-a-repo", "--dry-run"])
    assert result.exit_code == 1 and "OWNER/NAME" in result.output
    result = runner.invoke(main, ["publish", str(world.root)])
    assert result.exit_code != 0 and "--repo" in result.output
    # the dataset folder is still valid with the staging folder inside it
    Dataset.open(world.root)
