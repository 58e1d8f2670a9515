"""Licence rules: what is published, and what the card says (ND never, NC makes the card non-commercial)."""
from __future__ import annotations

from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")
from huggingface_hub import DatasetCard  # noqa: E402
from publish_helpers import image_bytes, make_dataset  # noqa: E402

from curate.licenses import derivative_licence, most_restrictive, stored_license  # noqa: E402
from curate.publish import (  # noqa: E402
    PublishError,
    card_licence,
    classify_licence,
    write_hub_folder,
)
from curate.store import Dataset, NewSample  # noqa: E402


def three_licences(root: Path) -> tuple[Dataset, dict[str, str]]:
    """One ND, one NC and one CC-BY image, all easy; returns the sample id per licence."""
    ds = Dataset.create(root, name="licences", backgrounds=["grass", "water"])
    ids = {}
    for k, licence in enumerate(["cc-by-nd", "CC BY-NC 4.0", "cc-by"]):
        report = ds.add_samples([NewSample(image=image_bytes(k), class_index=9, status="accepted", group="easy",
                                           background="grass", license=licence, attribution=f"author {k}",
                                           source="inat", source_url=f"https://example.org/{k}")])
        ids[licence] = report.added[0]
    return ds, ids


def test_nd_nc_and_cc_by_publish_the_right_subset_and_card(tmp_path: Path) -> None:
    ds, ids = three_licences(tmp_path / "ds")
    folder = write_hub_folder(ds.root, tmp_path / "hub")
    loaded = datasets.load_dataset(str(tmp_path / "hub"), cache_dir=str(tmp_path / "cache"), split="easy")
    assert sorted(loaded["sample_id"]) == sorted([ids["CC BY-NC 4.0"], ids["cc-by"]])
    assert ids["cc-by-nd"] not in (tmp_path / "hub" / "ATTRIBUTION.csv").read_text()
    assert sorted(loaded["license"]) == ["cc-by", "cc-by-nc"]
    assert folder.excluded == {"no-derivatives": 1} and folder.excluded_licences == {"cc-by-nd": 1}
    card = DatasetCard.load(folder.card_path)
    assert card.data.license == "cc-by-nc-4.0"  # the most restrictive present, with its stated version
    assert "non-commercial" in card.data.tags
    assert "**Non-commercial use only.**" in card.text
    assert "licence forbids derivative works (ND) | 1 |" in card.text
    assert "| cc-by-nc | 1 | 50.0% |" in card.text and "| cc-by | 1 | 50.0% |" in card.text


def test_unlicensed_and_all_rights_reserved_are_never_published(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", licences=["cc-by", None, "all rights reserved", "some custom terms", "cc-by-nc-nd"])
    folder = write_hub_folder(ds.root, tmp_path / "hub")
    published = {r["sample_id"] for r in ds.rows(group=["easy", "hard"]) if r["license"] == "cc-by"}
    loaded = datasets.load_dataset(str(tmp_path / "hub"), cache_dir=str(tmp_path / "cache"), split="easy+hard")
    assert set(loaded["sample_id"]) == published
    assert set(folder.excluded) >= {"unlicensed", "all-rights-reserved", "unknown-licence", "no-derivatives"}
    assert folder.licence.license == "cc-by-4.0" and not folder.licence.non_commercial


def test_only_restricted_images_means_nothing_to_publish(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", licences=["cc-by-nd", None])
    with pytest.raises(PublishError, match="nothing to publish"):
        write_hub_folder(ds.root, tmp_path / "hub")
    assert not (tmp_path / "hub").exists()


def test_mixed_licences_without_a_covering_one_give_other(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", licences=["cc-by-sa", "cc-by-nc", "cc0"])
    folder = write_hub_folder(ds.root, tmp_path / "hub")
    card = DatasetCard.load(folder.card_path)
    assert card.data.license == "other"
    assert card.data.license_name == "mixed-per-image-non-commercial"
    assert card.data.license_link == "ATTRIBUTION.csv"
    assert "non-commercial" in card.data.tags and "share-alike" in card.text


@pytest.mark.parametrize("raw, code, publishable, reason", [
    ("cc-by", "cc-by", True, None),
    ("CC BY-NC 4.0", "cc-by-nc", True, None),
    ("http://creativecommons.org/licenses/by-nc-sa/2.0/", "cc-by-nc-sa", True, None),
    ("CC0-1.0", "cc0", True, None),
    ("cc-by-nd", "cc-by-nd", False, "no-derivatives"),
    ("cc-by-nc-nd", "cc-by-nc-nd", False, "no-derivatives"),
    (None, "all-rights-reserved", False, "unlicensed"),
    ("", "all-rights-reserved", False, "unlicensed"),
    ("All rights reserved", "all-rights-reserved", False, "all-rights-reserved"),
    ("my own licence", "my-own-licence", False, "unknown-licence"),
])
def test_classify_licence(raw, code, publishable, reason) -> None:
    verdict = classify_licence(raw)
    assert (verdict.code, verdict.publishable, verdict.reason) == (code, publishable, reason)


def test_most_restrictive_and_versions() -> None:
    assert most_restrictive(["cc0", "cc-by", "cc-by-nc"]) == "cc-by-nc"
    assert most_restrictive(["cc-by", "cc-by-nc-sa", "cc-by-sa"]) == "cc-by-nc-sa"
    assert most_restrictive(["cc-by-sa", "cc-by-nc"]) is None
    assert most_restrictive(["cc0", "pd"]) is None
    rows = lambda *pairs: [{"license_code": c, "license": raw} for c, raw in pairs]  # noqa: E731
    assert card_licence(rows(("cc-by", "CC BY 2.0"), ("cc-by", "https://creativecommons.org/licenses/by/2.0/"))).license == "cc-by-2.0"
    mixed = card_licence(rows(("cc-by", "CC BY 2.0"), ("cc-by", "cc-by")))
    assert mixed.license == "cc-by-4.0" and mixed.note and "4.0" in mixed.note
    assert card_licence(rows(("cc0", "cc0"))).license == "cc0-1.0"
    public = card_licence(rows(("pd", "public domain"), ("us-gov", "United States Government Work")))
    assert (public.license, public.license_name) == ("other", "public-domain")


@pytest.mark.parametrize("raw, stored", [
    ("gpl-2.0", "gpl-2.0"), ("GPL-3.0", "gpl-3.0"), ("GPL-2.0-or-later", "gpl-2.0-or-later"),
    ("Apache 2.0", "apache-2.0"), ("MIT", "mit"),
    ("cc-by", "cc-by"), ("CC BY-NC 4.0", "cc-by-nc-4.0"), ("cc_by_sa_3.0", "cc-by-sa-3.0"),
    ("http://creativecommons.org/licenses/by-nc-sa/2.0/", "cc-by-nc-sa-2.0"),
    ("https://creativecommons.org/publicdomain/zero/1.0/", "cc0-1.0"), ("CC0", "cc0"),
    ("public domain", "pd"), ("All rights reserved", "all-rights-reserved"), (None, None), ("  ", None),
])
def test_collectors_store_the_licence_with_its_version(raw, stored) -> None:
    assert stored_license(raw) == stored
    if stored is not None:  # the stored id is read back as the same licence
        assert classify_licence(stored).code == classify_licence(raw).code
        assert stored_license(stored) == stored


def test_versioned_ids_keep_the_publish_policy(tmp_path: Path) -> None:
    """GPL-2.0 and GPL-3.0 stay two licences; versioned CC ids publish as their codes; ND never."""
    ds = make_dataset(tmp_path / "ds", licences=["cc-by-4.0", "cc-by-nc-sa-2.0", "gpl-2.0", "cc-by-nd-4.0", "gpl-3.0"])
    folder = write_hub_folder(ds.root, tmp_path / "hub")
    published = {r["sample_id"] for r in ds.rows(group=["easy", "hard"]) if r["license"] in ("cc-by-4.0",
                                                                                             "cc-by-nc-sa-2.0")}
    loaded = datasets.load_dataset(str(tmp_path / "hub"), cache_dir=str(tmp_path / "cache"), split="easy+hard")
    assert set(loaded["sample_id"]) == published and set(loaded["license"]) == {"cc-by", "cc-by-nc-sa"}
    assert set(loaded["license_as_stated"]) == {"cc-by-4.0", "cc-by-nc-sa-2.0"}
    assert {"gpl-2.0", "gpl-3.0", "cc-by-nd"} <= set(folder.excluded_licences)
    assert folder.excluded["unknown-licence"] == folder.excluded_licences["gpl-2.0"] + folder.excluded_licences["gpl-3.0"]
    assert DatasetCard.load(folder.card_path).data.license == "cc-by-nc-sa-2.0"
    assert derivative_licence(["cc-by-4.0", "cc-by-nc-4.0"]) == "cc-by-nc-4.0"
    assert derivative_licence(["cc-by-2.0", "cc-by-nc-4.0"]) == "cc-by-nc-4.0"
    assert derivative_licence(["cc-by", "cc-by-nc-4.0"]) == "cc-by-nc-4.0"
    assert derivative_licence(["cc-by-4.0", "cc-by"]) == "cc-by"
    assert derivative_licence(["cc-by-sa-4.0", "cc-by-nc-sa-4.0"]) is None
    assert derivative_licence(["gpl-2.0", "cc-by-4.0"]) is None
