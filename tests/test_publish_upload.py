"""The upload path against an injected HfApi that records calls and keeps the repo's files in memory:
repo creation, bounded batches, resume after a failure mid-upload, stale shards, branches, and
that the token reaches no file and no log line."""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("datasets")
from publish_helpers import TOKEN, files_under, json_of, make_dataset  # noqa: E402

from curate.publish import PublishError, publish_to_hub, staging_paths  # noqa: E402
from curate.publish.upload import scrub  # noqa: E402

REPO = "alice/pubtest"


class HubRepo:
    """What the fake Hub holds for one repo: path -> bytes, per branch."""

    def __init__(self) -> None:
        self.branches: dict[str, dict[str, bytes]] = {"main": {".gitattributes": b"*.parquet filter=lfs\n"}}
        self.private: bool | None = None


class RecordingApi:
    """A stand-in for huggingface_hub.HfApi: records every call, applies commits to a HubRepo,
    and fails the commit number ``fail_on_commit`` (1-based, counted over this api's commits)."""

    def __init__(self, token: str, repo: HubRepo, *, fail_on_commit: int | None = None, listable: bool = True) -> None:
        self.token = token
        self.repo = repo
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.commits: list[dict[str, Any]] = []
        self.fail_on_commit = fail_on_commit
        self.listable = listable

    def create_repo(self, repo_id: str, **kwargs: Any) -> Any:
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
        if self.repo.private is None:
            self.repo.private = kwargs.get("private")
        return SimpleNamespace(repo_id=repo_id)

    def create_branch(self, repo_id: str, **kwargs: Any) -> None:
        self.calls.append(("create_branch", {"repo_id": repo_id, **kwargs}))
        self.repo.branches.setdefault(kwargs["branch"], dict(self.repo.branches["main"]))

    def list_repo_tree(self, repo_id: str, **kwargs: Any) -> list[Any]:
        self.calls.append(("list_repo_tree", {"repo_id": repo_id, **kwargs}))
        if not self.listable:
            raise RuntimeError(f"500 Server Error (Authorization: Bearer {self.token})")
        files = self.repo.branches[kwargs.get("revision") or "main"]
        entries = []
        for path, data in files.items():
            lfs = SimpleNamespace(sha256=hashlib.sha256(data).hexdigest()) if path.endswith(".parquet") else None
            blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
            entries.append(SimpleNamespace(path=path, size=len(data), blob_id=blob, lfs=lfs))
        return entries

    def create_commit(self, repo_id: str, operations: Any, **kwargs: Any) -> Any:
        operations = list(operations)
        number = len(self.commits) + 1
        record = {"repo_id": repo_id, "message": kwargs.get("commit_message"), "revision": kwargs.get("revision"),
                  "repo_type": kwargs.get("repo_type"),
                  "adds": [op.path_in_repo for op in operations if type(op).__name__ == "CommitOperationAdd"],
                  "deletes": [op.path_in_repo for op in operations if type(op).__name__ == "CommitOperationDelete"]}
        self.calls.append(("create_commit", record))
        if self.fail_on_commit == number:
            raise ConnectionError(f"connection reset while uploading (token={self.token})")
        files = self.repo.branches[kwargs.get("revision") or "main"]
        for op in operations:
            if type(op).__name__ == "CommitOperationAdd":
                files[op.path_in_repo] = Path(op.path_or_fileobj).read_bytes()
            else:
                files.pop(op.path_in_repo, None)
        self.commits.append(record)
        return SimpleNamespace(oid=f"commit{number}")


@pytest.fixture()
def world(tmp_path: Path):
    return make_dataset(tmp_path / "world", per_group=4)


@pytest.fixture()
def token(monkeypatch) -> str:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return TOKEN


def publish(world, repo: HubRepo, apis: list, **kwargs: Any):
    options = dict(max_shard_bytes=1500, max_files_per_commit=2)
    options.update(kwargs)
    fail = options.pop("fail_on_commit", None)
    listable = options.pop("listable", True)

    def factory(token: str) -> RecordingApi:
        api = RecordingApi(token, repo, fail_on_commit=fail, listable=listable)
        apis.append(api)
        return api

    return publish_to_hub(world.root, REPO, api_factory=factory, **options)


def local_files(world) -> dict[str, bytes]:
    folder, _ = staging_paths(world.root, REPO)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in files_under(folder) if not p.name.startswith(".")}


def test_creates_the_repo_and_commits_in_bounded_batches(world, token) -> None:
    repo, apis = HubRepo(), []
    result = publish(world, repo, apis, private=True)
    api = apis[0]
    assert api.token == token
    assert api.calls[0] == ("create_repo", {"repo_id": REPO, "repo_type": "dataset", "private": True, "exist_ok": True})
    commits = api.commits
    shards = [p for p in local_files(world) if p.startswith("data/")]
    assert len(shards) >= 4
    assert all(len(c["adds"]) <= 2 for c in commits)
    assert all(c["repo_type"] == "dataset" and c["revision"] == "main" for c in commits)
    assert [p for c in commits[:-1] for p in c["adds"]] == sorted(shards)  # data first
    assert commits[-1]["adds"] == ["ATTRIBUTION.csv", "README.md"]  # the card last
    assert {p: d for p, d in repo.branches["main"].items() if p != ".gitattributes"} == local_files(world)
    assert result.upload.commits == len(commits) and result.upload.url == f"https://huggingface.co/datasets/{REPO}"
    assert sorted(result.upload.uploaded) == sorted(local_files(world))


def test_resumes_after_a_failure_mid_upload(world, token) -> None:
    repo, apis = HubRepo(), []
    with pytest.raises(PublishError) as failure:
        publish(world, repo, apis, fail_on_commit=2)
    message = str(failure.value)
    assert "commit 2/" in message and "run the same command again" in message and token not in message
    first = apis[0].commits
    assert len(first) == 1 and len(first[0]["adds"]) == 2
    _, journal = staging_paths(world.root, REPO)
    state = json_of(journal)["repos"][REPO]["main"]
    assert sorted(state["files"]) == sorted(first[0]["adds"])
    result = publish(world, repo, apis)  # the same command again
    second = apis[1].commits
    uploaded_twice = set(first[0]["adds"]) & {p for c in second for p in c["adds"]}
    assert not uploaded_twice
    assert sorted(result.upload.skipped) == sorted(first[0]["adds"])
    assert {p: d for p, d in repo.branches["main"].items() if p != ".gitattributes"} == local_files(world)
    again = publish(world, repo, apis)  # nothing left to do
    assert apis[2].commits == [] and again.upload.commits == 0 and again.folder.reused


def test_resume_relies_on_the_journal_when_the_repo_cannot_be_listed(world, token, caplog) -> None:
    repo, apis = HubRepo(), []
    with pytest.raises(PublishError):
        publish(world, repo, apis, fail_on_commit=3, listable=False)
    done = {p for c in apis[0].commits for p in c["adds"]}
    assert len(done) == 4
    with caplog.at_level(logging.DEBUG):
        publish(world, repo, apis, listable=False)
    assert not done & {p for c in apis[1].commits for p in c["adds"]}
    assert token not in caplog.text and "relying on the upload journal" in caplog.text


def test_remote_content_is_trusted_over_a_lost_journal(world, token) -> None:
    repo, apis = HubRepo(), []
    publish(world, repo, apis)
    _, journal = staging_paths(world.root, REPO)
    journal.unlink()
    result = publish(world, repo, apis)
    assert apis[1].commits == [] and result.upload.commits == 0


def test_stale_shards_of_a_previous_publish_are_deleted(world, token) -> None:
    repo, apis = HubRepo(), []
    publish(world, repo, apis)
    old = {p for p in repo.branches["main"] if p.startswith("data/")}
    publish(world, repo, apis, max_shard_bytes=10**9)  # one shard per split now
    new = {p for p in repo.branches["main"] if p.startswith("data/")}
    assert new == {"data/easy-00000-of-00001.parquet", "data/hard-00000-of-00001.parquet"}
    last = apis[1].commits[-1]
    assert set(last["deletes"]) == old - new and "README.md" in last["adds"]


def test_a_revision_is_a_branch(world, token) -> None:
    repo, apis = HubRepo(), []
    result = publish(world, repo, apis, revision="v1")
    api = apis[0]
    assert ("create_branch", {"repo_id": REPO, "branch": "v1", "repo_type": "dataset", "exist_ok": True}) in api.calls
    assert all(c["revision"] == "v1" for c in api.commits)
    assert "README.md" in repo.branches["v1"] and "README.md" not in repo.branches["main"]
    assert result.upload.url.endswith("/tree/v1")


def test_no_token_in_any_file_or_log(world, token, tmp_path: Path, caplog, capsys) -> None:
    repo, apis = HubRepo(), []
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(PublishError) as failure:
            publish(world, repo, apis, fail_on_commit=1, listable=False)
        publish(world, repo, apis)
    captured = capsys.readouterr()
    assert apis[0].token == token  # it did reach HfApi
    for text in (caplog.text, str(failure.value), captured.out, captured.err):
        assert token not in text
    for path in files_under(tmp_path):
        assert token.encode() not in path.read_bytes(), path


def test_missing_token_stops_before_writing_anything(world, monkeypatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("MY_TOKEN", "")
    with pytest.raises(PublishError, match=r"no Hugging Face token in \$HF_TOKEN"):
        publish(world, HubRepo(), [])
    with pytest.raises(PublishError, match=r"\$MY_TOKEN"):
        publish(world, HubRepo(), [], token_env="MY_TOKEN")
    assert not (world.root / ".publish").exists()


def test_token_env_names_another_variable(world, monkeypatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HUB_WRITE", TOKEN)
    repo, apis = HubRepo(), []
    publish(world, repo, apis, token_env="HUB_WRITE")
    assert apis[0].token == TOKEN


def test_dry_run_sends_nothing(world, monkeypatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    apis: list = []
    result = publish(world, HubRepo(), apis, dry_run=True)
    assert apis == [] and result.upload is None
    assert result.plan.commits >= 3 and "README.md" in result.plan.final


def test_scrub() -> None:
    assert scrub(f"failed with {TOKEN}", [TOKEN]) == "failed with ***"
    assert scrub("Bearer hf_abcdefghijklmnop", []) == "Bearer ***"


def test_cli_publish_uploads_and_resumes(world, token, monkeypatch) -> None:
    """`curate publish DIR --repo ...` end to end, with the default HfApi replaced by the recorder."""
    from click.testing import CliRunner

    import curate.publish.upload as upload
    from curate.cli import main

    repo, apis = HubRepo(), []
    fail = {"on": 1}

    def factory(tok: str) -> RecordingApi:
        api = RecordingApi(tok, repo, fail_on_commit=fail["on"])
        apis.append(api)
        return api

    monkeypatch.setattr(upload, "_default_api", factory)
    runner = CliRunner()
    args = ["publish", str(world.root), "--repo", REPO, "--private", "--max-shard-mb", "0.0015",
            "--max-files-per-commit", "3"]
    first = runner.invoke(main, args)
    assert first.exit_code == 1 and "run the same command again" in first.output and token not in first.output
    fail["on"] = None
    second = runner.invoke(main, args)
    assert second.exit_code == 0, second.output
    assert f"published to https://huggingface.co/datasets/{REPO}" in second.output and token not in second.output
    assert apis[1].calls[0][1]["private"] is True
    assert {p: d for p, d in repo.branches["main"].items() if p != ".gitattributes"} == local_files(world)
