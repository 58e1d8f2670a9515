"""``curate publish --format fiftyone``: the call into FiftyOne's Hub integration.

The fast tests inject the builder (which needs MongoDB), the pusher (which needs the network)
and the HfApi (whoami), and check what reaches them: only publishable samples, the licence and
non-commercial tag, the token (and nowhere else). The slow test builds the real FiftyOne
collection against a real MongoDB (curate's offline mongod) and exports it the way
``fiftyone.utils.huggingface.push_to_hub`` does before uploading; only the upload is stubbed.
"""
from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from publish_helpers import TOKEN, files_under, make_dataset

from curate.cli import main
from curate.publish import PublishError, publish_fiftyone


class Recorder:
    def __init__(self, user: str = "alice", fail: bool = False) -> None:
        self.user = user
        self.fail = fail
        self.built: list[tuple[Path, list[str], str]] = []
        self.pushed: list[tuple[Any, str, dict[str, Any]]] = []
        self.tokens: list[str] = []

    def builder(self, root: Path, ids, name: str) -> Any:
        self.built.append((root, list(ids), name))
        return SimpleNamespace(name=name, ids=list(ids))

    def pusher(self, collection: Any, repo_name: str, **kwargs: Any) -> None:
        self.pushed.append((collection, repo_name, kwargs))
        if self.fail:
            raise RuntimeError(f"401 Unauthorized for token {kwargs['token']}")

    def api(self, token: str) -> Any:
        self.tokens.append(token)
        return SimpleNamespace(whoami=lambda: {"name": self.user})


@pytest.fixture()
def world(tmp_path: Path):
    return make_dataset(tmp_path / "world", licences=["cc-by", "cc-by-nc", "cc-by-nd"])


def run(world, recorder: Recorder, repo: str = "alice/pubtest", **kwargs: Any):
    return publish_fiftyone(world.root, repo, builder=recorder.builder, pusher=recorder.pusher,
                            api_factory=recorder.api, **kwargs)


def test_pushes_only_publishable_samples_with_the_licence(world, monkeypatch, caplog) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    recorder = Recorder()
    with caplog.at_level(logging.DEBUG):
        result = run(world, recorder, private=True)
    assert result.pushed and result.url == "https://huggingface.co/datasets/alice/pubtest"
    (root, ids, name), = recorder.built
    expected = {r["sample_id"] for r in world.rows(group=["easy", "hard"]) if r["license"] != "cc-by-nd"}
    assert set(ids) == expected and name == "pubtest" and root == world.root
    (collection, repo_name, kwargs), = recorder.pushed
    assert collection.ids == ids and repo_name == "pubtest"
    assert kwargs["license"] == "cc-by-nc-4.0" and "non-commercial" in kwargs["tags"] and "fiftyone" in kwargs["tags"]
    assert kwargs["description"].startswith("Non-commercial use only")
    assert kwargs["private"] is True and kwargs["exist_ok"] is True and kwargs["token"] == TOKEN
    assert recorder.tokens == [TOKEN]
    assert result.excluded["no-derivatives"] == len(world.rows(group=["easy", "hard"])) - len(expected)
    assert TOKEN not in caplog.text


def test_owner_must_be_the_token_user(world, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    recorder = Recorder(user="bob")
    with pytest.raises(PublishError, match="use --repo bob/pubtest"):
        run(world, recorder)
    assert recorder.built == [] and recorder.pushed == []


def test_a_failed_push_hides_the_token(world, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with pytest.raises(PublishError) as failure:
        run(world, Recorder(fail=True))
    assert "401 Unauthorized" in str(failure.value) and TOKEN not in str(failure.value)


def test_dry_run_needs_no_token_mongodb_or_network(world, monkeypatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    recorder = Recorder()
    result = run(world, recorder, dry_run=True)
    assert not result.pushed and result.samples > 0 and recorder.built == recorder.pushed == recorder.tokens == []
    out = CliRunner().invoke(main, ["publish", str(world.root), "--repo", "alice/pubtest", "--format", "fiftyone",
                                    "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "would publish" in out.output and "non-commercial" in out.output
    out = CliRunner().invoke(main, ["publish", str(world.root), "--format", "fiftyone", "--out", "x"])
    assert out.exit_code != 0 and "--out" in out.output


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_fiftyone_collection_is_built_and_exported(world, tmp_path: Path, monkeypatch) -> None:
    """The default builder against a real MongoDB; the pusher stub exports the collection exactly
    as push_to_hub does before it uploads (FiftyOneDataset format, media included)."""
    from curate.review.fiftyone import import_fiftyone_module

    fo = import_fiftyone_module()  # dodges the importlib_metadata backport (see its docstring)
    import fiftyone.core.odm.database as fodb

    from curate.review.database import start_mongod
    from curate.review.provision import provision_mongod

    binaries = provision_mongod()
    server = start_mongod(tmp_path / "mongo", binaries=binaries)
    saved = (fo.config.database_uri, fo.config.database_validation)
    try:
        monkeypatch.setenv("FIFTYONE_DATABASE_URI", server.uri)
        monkeypatch.setenv("FIFTYONE_DATABASE_VALIDATION", "false")
        monkeypatch.setenv("FIFTYONE_DO_NOT_TRACK", "true")
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        import fiftyone.types as fot

        fodb._disconnect()  # FiftyOne keeps one client per process: connect it to this server
        fo.config.database_uri = server.uri
        fo.config.database_validation = False
        seen: dict[str, Any] = {}

        def pusher(collection: Any, repo_name: str, **kwargs: Any) -> None:
            seen["ids"] = sorted(collection.values("sample_id"))
            seen["licences"] = set(collection.values("license"))
            collection.export(export_dir=str(tmp_path / "export"), dataset_type=fot.FiftyOneDataset, export_media=True)
            seen["name"] = collection.name

        recorder = Recorder()
        result = publish_fiftyone(world.root, "alice/pubtest", pusher=pusher, api_factory=recorder.api,
                                  name="pubtest-fo")
        expected = sorted(r["sample_id"] for r in world.rows(group=["easy", "hard"]) if r["license"] != "cc-by-nd")
        assert result.pushed and seen["ids"] == expected
        assert seen["licences"] == {"cc-by", "cc-by-nc"}
        exported = [p for p in files_under(tmp_path / "export") if p.suffix in (".png", ".jpg")]
        assert len(exported) >= len(expected)
        assert seen["name"] not in fo.list_datasets()  # the temporary clone is gone
        assert "pubtest-fo" in fo.list_datasets()  # the review dataset stays
    finally:
        fodb._disconnect()  # leave no client pointing at a server that is going away
        fo.config.database_uri, fo.config.database_validation = saved
        server.stop()
