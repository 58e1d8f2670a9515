"""The iNaturalist collector against the fake v1 API + photo server on 127.0.0.1."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_inat import (
    FakeINat,
    FakeObservation,
    FakePhoto,
    dataset_signature,
    make_world,
)

from curate.cli import main
from curate.collect.http import HttpError, RetryPolicy
from curate.collect.inat import (
    INAT_PHOTO_LICENSES,
    INatClass,
    INatSettings,
    TaxonNotFoundError,
    classes_from_text,
    collect_inat,
    load_recipe,
    make_client,
    sized_photo_url,
)
from curate.collect.journal import collection_failures
from curate.licenses import license_policy
from curate.store import Dataset, check_dataset

CLASSES = [INatClass(9, "ostrich"), INatClass(10, "brambling"), INatClass(16, "bulbul", ("Pycnonotidae",))]
TAXA = {9: 20001, 10: 20002, 16: 20003}
FAST = RetryPolicy(max_attempts=4, backoff_base=0.01, backoff_max=0.05, jitter=0.0)


def run(server: FakeINat, root: Path, per_class: int = 6, classes=CLASSES, **kwargs):
    client = kwargs.pop("client", None) or make_client(api_url=server.api_url, api_rate=None, download_rate=None,
                                                       byte_rate=None, retry=FAST, timeout=kwargs.pop("timeout", None))
    with client:
        return collect_inat(root, classes, per_class=per_class, api_url=server.api_url, per_page=4, client=client,
                            concurrency=3, **kwargs)


def expected_ids(server: FakeINat, per_class: int, **kwargs) -> list[int]:
    taken: set[int] = set()
    content: set[int] = set()
    out: list[int] = []
    for cls in CLASSES:
        out += server.expected(TAXA[cls.index], per_class, taken=taken, taken_content=content, **kwargs)
    return sorted(out)


def collected_ids(root: Path) -> list[int]:
    return sorted(int(r["source_id"]) for r in Dataset.open(root).rows())


def faulty_world() -> tuple[FakeINat, dict[int, str]]:
    """A server whose first candidates of each class carry every kind of fault."""
    probe = FakeINat(make_world())
    first = {t: probe.expected(t, 8) for t in TAXA.values()}
    faults = {
        first[20001][0]: "500_once", first[20001][2]: "corrupt", first[20001][3]: "429_once",
        first[20002][0]: "truncate_once", first[20002][1]: "truncated_file", first[20002][2]: "slow_once",
        first[20003][0]: "404", first[20003][1]: "500_once",
    }
    return FakeINat(make_world(), api_429_every=5, api_retry_after="0", photo_faults=faults,
                    slow_seconds=1.0), faults


def test_collect_matches_ground_truth_despite_faults(tmp_path) -> None:
    server, faults = faulty_world()
    with server:
        report = run(server, tmp_path / "ds", timeout=(2.0, 0.5))
        assert collected_ids(tmp_path / "ds") == expected_ids(server, 6)
    assert all(g.have == 6 for g in report.groups.values())
    totals = report.totals()
    assert totals["quarantined"] == 2 and totals["failed"] == 1
    assert totals["duplicate"] >= 1 and totals["duplicate_source"] >= 1  # twin bytes, shared photo id
    assert report.client["throttled"] >= 1 and report.client["retries"] >= 4
    assert not check_dataset(tmp_path / "ds")
    # failures are recorded with a reason: quarantine.jsonl (bytes) and the journal (downloads)
    ds = Dataset.open(tmp_path / "ds")
    quarantined = {r["source_id"]: r["reason"] for r in ds.quarantine()}
    broken = {str(p) for p, kind in faults.items() if kind in ("corrupt", "truncated_file")}
    assert set(quarantined) == broken
    assert set(quarantined.values()) <= {"not_an_image", "corrupt", "truncated"}
    assert all(r["copy"] for r in ds.quarantine())  # the refused bytes are kept for inspection
    failures = collection_failures(tmp_path / "ds")
    http_fail = [f for f in failures if f["outcome"] == "failed"]
    assert len(http_fail) == 1 and http_fail[0]["reason"] == "http_404" and not http_fail[0]["retryable"]
    assert {f["reason"] for f in failures if f["outcome"] == "quarantined"} <= {"not_an_image", "corrupt", "truncated"}
    assert any("curate/" in agent for agent in server.user_agents)
    listed = CliRunner().invoke(main, ["collect", "status", str(tmp_path / "ds"), "--failures"])
    assert listed.exit_code == 0 and "http_404" in listed.output and "quarantined" in listed.output


def test_a_torn_journal_line_is_skipped_and_the_job_resumes(tmp_path) -> None:
    with FakeINat() as server:
        run(server, tmp_path / "ds", per_class=4)
        journal = next((tmp_path / "ds" / ".collect").glob("inat-*.jsonl"))
        lines = journal.read_bytes().splitlines(keepends=True)
        journal.write_bytes(b"".join(lines[:-3]) + lines[-3][:17])  # as if killed mid-write
        downloads = sum(server.photo_requests.values())
        run(server, tmp_path / "ds", per_class=4)
        assert sum(server.photo_requests.values()) == downloads  # the lost lines' photos were "present"
        assert collected_ids(tmp_path / "ds") == expected_ids(server, 4)


def test_every_sample_keeps_its_provenance(tmp_path) -> None:
    with FakeINat() as server:
        run(server, tmp_path / "ds", per_class=3)
    ds = Dataset.open(tmp_path / "ds")
    for row in ds.rows():
        extra = json.loads(row["extra"])
        assert row["source"] == "inat" and row["source_id"] == str(extra["photo_id"])
        assert row["source_url"].endswith(f"/photos/{extra['photo_id']}/medium.jpg")
        assert row["license"] in ("cc0", "cc-by", "cc-by-nc") and row["attribution"]
        for key in ("observation_id", "observation_url", "observer", "observed_on", "place", "quality_grade",
                    "taxon_id", "taxon_name", "query_taxon_ids", "photo_size", "location"):
            assert extra[key] not in (None, ""), key
        assert extra["quality_grade"] == "research"
    recorded = ds.provenance["collect.inat"]["jobs"]
    (job,) = recorded.values()
    assert job["complete"] and job["licenses"] == ["cc-by", "cc-by-nc", "cc0"]
    assert {c["index"]: c["taxon_ids"] for c in job["classes"]} == {9: [20001], 10: [20002], 16: [20003]}


def test_rerun_costs_nothing_and_more_per_class_continues(tmp_path) -> None:
    with FakeINat() as server:
        run(server, tmp_path / "ds", per_class=3)
        first_downloads = sum(server.photo_requests.values())
        api_before = len(server.api_requests)
        again = run(server, tmp_path / "ds", per_class=3)
        assert again.client["api_calls"] == 0 and again.client["downloads"] == 0
        assert len(server.api_requests) == api_before
        run(server, tmp_path / "ds", per_class=6)  # the same job, continued
        assert collected_ids(tmp_path / "ds") == expected_ids(server, 6)
        assert max(server.photo_requests.values()) == 1  # nothing downloaded twice
        assert sum(server.photo_requests.values()) > first_downloads
    assert not list((tmp_path / "ds" / ".collect").glob("*.staging"))


def test_listing_is_anchored_so_a_resumed_job_sees_the_same_photos(tmp_path) -> None:
    world = make_world()
    with FakeINat(world) as server:
        run(server, tmp_path / "ds", per_class=2, classes=CLASSES[:1])
        newest = max(o.id for o in world.observations) + 100
        photo = FakePhoto(99999, "cc0", content_seed=99999, user="late")
        world.photos[photo.id] = photo
        world.observations.append(FakeObservation(newest, world.taxa[0], [photo]))
        run(server, tmp_path / "ds", per_class=4, classes=CLASSES[:1])
        assert 99999 not in collected_ids(tmp_path / "ds")
        # pages by id, never by page number (the 10,000-result window)
        listing = [r for r in server.api_requests if r.startswith("/v1/observations")]
        assert listing and all("page=" not in r.replace("per_page=", "") for r in listing)
        assert sum("id_below=" in r for r in listing) == len(listing) - 1


def test_oldest_first_pages_with_id_above(tmp_path) -> None:
    with FakeINat() as server:
        run(server, tmp_path / "ds", per_class=5, classes=CLASSES[:2], order="asc")
        listing = [r for r in server.api_requests if r.startswith("/v1/observations")]
        assert any("id_above=" in r for r in listing) and all("page=" not in r.replace("per_page=", "") for r in listing)
        expected: list[int] = []
        taken: set[int] = set()
        content: set[int] = set()
        for taxon in (20001, 20002):  # ground truth: the oldest first
            out = []
            for obs in sorted(server.world.observations, key=lambda o: o.id):
                if obs.taxon.id != taxon or obs.quality_grade != "research" or len(out) >= 5:
                    continue
                photo = next((p for p in obs.photos if (p.license or "") in ("cc0", "cc-by", "cc-by-nc")), None)
                if photo is None or photo.id in taken or photo.content_seed in content:
                    continue
                taken.add(photo.id)
                content.add(photo.content_seed)
                out.append(photo.id)
            expected += out
        assert collected_ids(tmp_path / "ds") == sorted(expected)


def test_licence_policy(tmp_path) -> None:
    with FakeINat() as server:
        with pytest.raises(ValueError, match="allow-restricted-licenses"):
            run(server, tmp_path / "a", licenses="cc0,cc-by,cc-by-nd")
        assert not server.photo_requests
        run(server, tmp_path / "b", per_class=6, licenses="cc-by-nd,all-rights-reserved", allow_restricted_licenses=True)
        stored = {r["license"] for r in Dataset.open(tmp_path / "b").rows()}
        assert stored and stored <= {"cc-by-nd", "all-rights-reserved"}
        assert collected_ids(tmp_path / "b") == expected_ids(server, 6, licenses=("cc-by-nd", "all-rights-reserved"))


def test_licences_inaturalist_does_not_have_are_refused_before_any_request(tmp_path) -> None:
    # iNaturalist's photo_license filter (API v1) knows only the seven CC codes; pd and us-gov have
    # no equivalent there, so they are refused, naming the allowed codes, and nothing is sent.
    allowed = "cc-by, cc-by-nc, cc-by-nd, cc-by-sa, cc-by-nc-nd, cc-by-nc-sa, cc0"
    with FakeINat() as server:
        for asked in ("cc0,cc-by,cc-by-nc,pd,us-gov", "us-gov", "public domain", ["cc-by", "pd"]):
            with pytest.raises(ValueError, match="iNaturalist has no licence") as info:
                run(server, tmp_path / "a", licenses=asked, allow_restricted_licenses=True)
            assert allowed in str(info.value)
        assert not server.api_requests and not server.photo_requests
        assert not (tmp_path / "a").exists()
        with pytest.raises(ValueError, match="iNaturalist has no licence pd"):
            INatSettings(licenses=("cc0", "pd"))
        # what is sent is within the API's enum
        run(server, tmp_path / "b", per_class=2, classes=CLASSES[:1], licenses="cc0,cc-by-sa,cc-by-nc-sa")
        sent = [dict(p.split("=", 1) for p in r.split("?", 1)[1].split("&"))
                for r in server.api_requests if r.startswith("/v1/observations")]
        assert sent and all(q["photo_license"] == "cc0,cc-by-sa,cc-by-nc-sa" for q in sent)
    # "all" means every iNaturalist licence (and none: all rights reserved), never pd or us-gov
    assert INatSettings(licenses=license_policy("all", allow_restricted=True, source_codes=INAT_PHOTO_LICENSES
                                                + ("all-rights-reserved",))).licenses[-1] == "all-rights-reserved"


def test_cli_refuses_pd_and_us_gov_for_inaturalist(tmp_path) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    with FakeINat() as server:
        bad = runner.invoke(main, ["collect", "inat", str(tmp_path / "x"), "--classes", "9",
                                   "--licenses", "cc0,cc-by,cc-by-nc,pd,us-gov", "--api-url", server.api_url])
        assert bad.exit_code == 1, bad.output
        assert "iNaturalist has no licence pd" in bad.output and "cc-by-nc-sa, cc0" in bad.output
        assert not server.api_requests and not server.photo_requests


def test_taxon_resolution(tmp_path) -> None:
    with FakeINat() as server:
        report = run(server, tmp_path / "ds", classes=classes_from_text("ostrich"), resolve_only=True)
        taxon = report.info["taxa"]["9"]
        # "Struthio camelus" also matches the subspecies by substring; the exact species wins
        assert taxon["ids"] == [20001] and taxon["via"] == "lemma"
        assert not server.photo_requests
        by_id = run(server, tmp_path / "ds2", classes=[INatClass(16, "bulbul", (20003, "No Such Taxon"))],
                    resolve_only=True)
        assert by_id.info["taxa"]["16"]["ids"] == [20003]
        # every unresolved class is listed at once, before any download (bullfrog is inactive here)
        with pytest.raises(TaxonNotFoundError) as info:
            run(server, tmp_path / "ds3", classes=classes_from_text("9,bullfrog,16"))
        assert "30 American bullfrog" in str(info.value) and "16 bulbul" in str(info.value)
        assert "inat_taxon" in str(info.value)
        assert not server.photo_requests


def test_recipe_overrides_every_lemma_without_a_scientific_name() -> None:
    classes, recipe = load_recipe("counteranimal")
    assert len(classes) == 45 and recipe["collection"]["per_class"] == 300
    from curate.collect.inat import lemma_queries

    for cls in classes:
        if not cls.taxon:  # resolved from a binomial lemma
            assert any(" " in q and q[0].isupper() for q in lemma_queries(cls.index)), cls.label


def test_refuses_photo_urls_on_foreign_hosts(tmp_path) -> None:
    class Elsewhere(FakeINat):
        def api(self, path, query):
            status, payload, headers = super().api(path, query)
            for obs in payload.get("results", []):
                for photo in obs.get("photos", []):
                    photo["url"] = photo["url"].replace(self.base_url, "http://169.254.169.254")
            return status, payload, headers

    with Elsewhere() as server:
        report = run(server, tmp_path / "ds", per_class=2, classes=CLASSES[:1])
    assert report.totals()["failed"] >= 2 and report.groups["9"].have == 0
    assert {reason.split(":")[0] for _, reason in report.failures} == {"unsafe_url"}


def test_an_api_that_ignores_id_below_is_an_error(tmp_path) -> None:
    class Careless(FakeINat):
        def api(self, path, query):
            query.pop("id_below", None)
            return super().api(path, query)

    with Careless() as server, pytest.raises(HttpError, match="ignored id_below"):
        run(server, tmp_path / "ds", per_class=50, classes=CLASSES[:1])


def test_sized_photo_url() -> None:
    assert sized_photo_url("https://x.org/photos/1/square.jpg?123", "large") == "https://x.org/photos/1/large.jpg?123"
    assert sized_photo_url("https://square.org/photos/1/square.jpeg", "medium") == "https://square.org/photos/1/medium.jpeg"
    assert sized_photo_url("https://x.org/p/1", "medium") == "https://x.org/p/1"


def test_cli_collect_inat(tmp_path) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    with FakeINat() as server:
        args = ["collect", "inat", str(tmp_path / "ds"), "--classes", "9,10,bulbul", "--taxon", "bulbul=Pycnonotidae",
                "--per-class", "3", "--api-url", server.api_url, "--api-rate", "none", "--download-rate", "none",
                "--byte-rate", "none", "--per-page", "4", "--retry-backoff", "0.01"]
        result = runner.invoke(main, args)
        assert result.exit_code == 0, result.output
        assert "Struthio camelus (20001)" in result.output and "9 added" in result.output
        result = runner.invoke(main, args + ["--resolve-only"])
        assert result.exit_code == 0 and "Pycnonotidae" in result.output and "override" in result.output
        result = runner.invoke(main, ["collect", "status", str(tmp_path / "ds")])
        assert result.exit_code == 0 and "inat-" in result.output
        bad = runner.invoke(main, ["collect", "inat", str(tmp_path / "x"), "--classes", "9", "--licenses", "cc-by-nd",
                                   "--api-url", server.api_url])
        assert bad.exit_code == 1 and "allow-restricted-licenses" in bad.output
    assert collected_ids(tmp_path / "ds") == expected_ids(server, 3)


def test_same_job_twice_gives_the_same_dataset(tmp_path) -> None:
    with FakeINat() as one:
        run(one, tmp_path / "a", per_class=5)
    with FakeINat() as two:
        run(two, tmp_path / "b", per_class=5)
    assert dataset_signature(tmp_path / "a") == dataset_signature(tmp_path / "b")
