"""Upload a Hub folder with huggingface_hub's ``HfApi``: bounded batches, resumable, token-safe.

:func:`upload_hub_folder` does, in order:

1. ``create_repo(repo_id, repo_type="dataset", private=..., exist_ok=True)``, and
   ``create_branch`` when a revision other than ``main`` is asked for;
2. lists what the repo already holds (``list_repo_tree``; LFS sha256 or git blob id per file)
   and reads the local upload journal (``state_file``);
3. commits the files not yet there with ``create_commit`` in batches of at most
   ``max_files_per_commit`` files and ``max_bytes_per_commit`` bytes: the parquet shards first,
   then one last commit with ``ATTRIBUTION.csv``, the card (``README.md``, last, so the configs
   appear when the data is complete) and the deletion of shards a previous publish left that
   this one no longer has (their names encode the shard count, so they would otherwise be read
   as data);
4. after every successful commit, records its files (path -> sha256) in the journal (atomic
   write). A run that is interrupted (network, Ctrl-C, a crash) leaves the committed batches
   recorded; running the same command again skips every file the Hub already holds with the
   same content, and continues with the rest.

A file counts as already uploaded when the Hub's copy has the same content (LFS sha256 or git
blob id), or, when the Hub did not say, when the journal recorded it with the same sha256 and
the Hub lists a file at that path (or could not be listed at all).

The token comes from the environment only (:func:`read_token`, ``HF_TOKEN`` by default): it is
given to ``HfApi(token=...)`` and to nothing else; it is never logged, written, or shown in an
error message (messages pass through :func:`scrub`).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from curate.publish.hub import (
    ATTRIBUTION_FILE,
    CARD_FILE,
    DATA_DIR,
    MANIFEST,
    PublishError,
    read_manifest,
)
from curate.runs import write_json

log = logging.getLogger(__name__)

DEFAULT_TOKEN_ENV = "HF_TOKEN"
DEFAULT_MAX_FILES_PER_COMMIT = 50
DEFAULT_MAX_BYTES_PER_COMMIT = 2 * 1000 ** 3
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class HfApiLike(Protocol):
    """The part of ``huggingface_hub.HfApi`` curate uses (tests inject a recording stand-in)."""

    def create_repo(self, repo_id: str, **kwargs: Any) -> Any: ...

    def create_branch(self, repo_id: str, **kwargs: Any) -> Any: ...

    def create_commit(self, repo_id: str, operations: Iterable[Any], **kwargs: Any) -> Any: ...

    def list_repo_tree(self, repo_id: str, **kwargs: Any) -> Iterable[Any]: ...


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` when it is ``owner/name``; a clear error otherwise."""
    if not isinstance(repo_id, str) or not REPO_ID.match(repo_id) or ".." in repo_id:
        raise PublishError(f"--repo {repo_id!r} is not OWNER/NAME (letters, digits, '.', '_', '-'), "
                           "e.g. --repo alice/counteranimal-mini")
    return repo_id


def read_token(env: str = DEFAULT_TOKEN_ENV) -> str:
    """The Hugging Face token from environment variable ``env`` (never from a file or the command line)."""
    if not env or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env):
        raise PublishError(f"--token-env {env!r} is not an environment variable name")
    token = os.environ.get(env, "").strip()
    if not token:
        raise PublishError(f"no Hugging Face token in ${env}; create a token with write access at "
                           f"https://huggingface.co/settings/tokens and run `export {env}=...` (curate reads it from the "
                           "environment only, and never writes or logs it), or use --dry-run / --out to write the "
                           "folder without uploading")
    return token


def scrub(text: str, secrets: Sequence[str | None]) -> str:
    """``text`` with every secret (and any ``hf_...`` token-looking word) replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return re.sub(r"\bhf_[A-Za-z0-9]{8,}\b", "***", text)


def git_blob_sha1(path: Path) -> str:
    """The git object id of a file's content (what the Hub reports for non-LFS files)."""
    size = path.stat().st_size
    digest = hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- the journal
@dataclass
class UploadState:
    """The upload journal: per (repo, revision), the files committed (path -> sha256) and the commits."""

    path: Path
    repo_id: str
    revision: str
    files: dict[str, str] = field(default_factory=dict)
    commits: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path, repo_id: str, revision: str) -> UploadState:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            log.warning("upload journal %s is unreadable (%s); starting a new one", path, exc)
            data = {}
        entry = ((data.get("repos") or {}).get(repo_id) or {}).get(revision) or {}
        return cls(Path(path), repo_id, revision, dict(entry.get("files") or {}), list(entry.get("commits") or []))

    def save(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        repos = data.setdefault("repos", {})
        repos.setdefault(self.repo_id, {})[self.revision] = {"files": self.files, "commits": self.commits}
        write_json(self.path, data)

    def record(self, message: str, files: Mapping[str, str], deleted: Sequence[str], oid: str | None) -> None:
        self.files.update(files)
        for path in deleted:
            self.files.pop(path, None)
        self.commits.append({"time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                             "message": message, "files": sorted(files), "deleted": list(deleted), "oid": oid})
        self.save()


# ----------------------------------------------------------------------------- planning
@dataclass
class UploadPlan:
    """Which files go in which commit; what is already there; which stale shards are deleted."""

    batches: list[list[str]]
    final: list[str]
    deletes: list[str]
    skipped: list[str]

    @property
    def commits(self) -> int:
        return len(self.batches) + (1 if self.final or self.deletes else 0)

    @property
    def to_upload(self) -> list[str]:
        return [p for b in self.batches for p in b] + self.final


def _order(paths: Iterable[str]) -> tuple[list[str], list[str]]:
    """(data files, the others with the card last)."""
    paths = sorted(paths)
    data = [p for p in paths if p.startswith(DATA_DIR + "/")]
    rest = [p for p in paths if not p.startswith(DATA_DIR + "/")]
    rest.sort(key=lambda p: (p == CARD_FILE, p))
    return data, rest


def _batches(paths: Sequence[str], sizes: Mapping[str, int], max_files: int, max_bytes: int) -> list[list[str]]:
    batches: list[list[str]] = []
    size = 0
    for path in paths:
        if not batches or len(batches[-1]) >= max_files or (batches[-1] and size + sizes[path] > max_bytes):
            batches.append([])
            size = 0
        batches[-1].append(path)
        size += sizes[path]
    return batches


def _remote_matches(remote: Any, local: Path, sha256: str) -> bool:
    lfs = getattr(remote, "lfs", None)
    lfs_sha = getattr(lfs, "sha256", None) if lfs is not None else None
    if lfs_sha is None and isinstance(lfs, Mapping):
        lfs_sha = lfs.get("sha256") or lfs.get("oid")
    if lfs_sha:
        return lfs_sha == sha256
    blob = getattr(remote, "blob_id", None)
    return bool(blob) and blob == git_blob_sha1(local)


def plan_upload(folder: Path, files: Mapping[str, Mapping[str, Any]], state: UploadState,
                remote: Mapping[str, Any] | None, *, max_files_per_commit: int = DEFAULT_MAX_FILES_PER_COMMIT,
                max_bytes_per_commit: int = DEFAULT_MAX_BYTES_PER_COMMIT) -> UploadPlan:
    """The commits still needed to make the repo hold ``files`` (``remote`` None: not listable)."""
    if max_files_per_commit < 1 or max_bytes_per_commit < 1:
        raise ValueError("max_files_per_commit and max_bytes_per_commit must be positive")
    pending, skipped = [], []
    for path, info in files.items():
        sha = info["sha256"]
        there = remote.get(path) if remote is not None else None
        if there is not None and _remote_matches(there, folder / path, sha):
            done = True
        else:
            done = state.files.get(path) == sha and (remote is None or there is not None)
        (skipped if done else pending).append(path)
    data, rest = _order(pending)
    sizes = {p: int(files[p]["size"]) for p in pending}
    deletes = sorted(p for p in (remote or {}) if p.startswith(DATA_DIR + "/") and p not in files)
    return UploadPlan(_batches(data, sizes, max_files_per_commit, max_bytes_per_commit), rest, deletes, sorted(skipped))


def _remote_files(api: HfApiLike, repo_id: str, revision: str | None, secrets: Sequence[str | None]) -> dict[str, Any] | None:
    try:
        entries = api.list_repo_tree(repo_id, repo_type="dataset", revision=revision, recursive=True)
        return {e.path: e for e in entries if getattr(e, "size", None) is not None or hasattr(e, "blob_id")}
    except Exception as exc:  # noqa: BLE001 - a repo that cannot be listed is treated as unknown
        log.info("could not list %s@%s (%s); relying on the upload journal", repo_id, revision or "main",
                 scrub(str(exc), secrets))
        return None


# ----------------------------------------------------------------------------- upload
@dataclass
class UploadResult:
    """What :func:`upload_hub_folder` did."""

    repo_id: str
    revision: str
    url: str
    commits: int
    uploaded: list[str]
    skipped: list[str]
    deleted: list[str]
    state_file: Path


def hub_url(repo_id: str, revision: str | None = None) -> str:
    base = f"https://huggingface.co/datasets/{repo_id}"
    return base if not revision or revision == "main" else f"{base}/tree/{revision}"


def upload_hub_folder(
    folder: str | Path,
    repo_id: str,
    *,
    api: HfApiLike,
    state_file: str | Path,
    revision: str | None = None,
    private: bool = False,
    max_files_per_commit: int = DEFAULT_MAX_FILES_PER_COMMIT,
    max_bytes_per_commit: int = DEFAULT_MAX_BYTES_PER_COMMIT,
    secrets: Sequence[str | None] = (),
    progress: Callable[[int, int], None] | None = None,
) -> UploadResult:
    """Upload a folder written by :func:`~curate.publish.hub.write_hub_folder` (see the module docstring).

    ``secrets`` (the token) are scrubbed from every message. Raises :class:`PublishError` when a
    commit fails, saying how much is on the Hub and that re-running continues.
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    check_repo_id(repo_id)
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        raise PublishError(f"{folder} has no {MANIFEST}; write it with write_hub_folder / `curate publish --out` first")
    files = {p: info for p, info in manifest["files"].items() if p != MANIFEST}
    for path, info in files.items():
        local = folder / path
        if not local.is_file() or local.stat().st_size != info["size"]:
            raise PublishError(f"{local} is missing or changed since it was written; write the folder again")
    branch = revision or "main"

    def call(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - the Hub boundary: one clear, token-free message
            raise PublishError(f"{what} failed: {type(exc).__name__}: {scrub(str(exc), secrets)}") from None

    call(f"creating the dataset repo {repo_id}",
         lambda: api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True))
    if branch != "main":
        call(f"creating branch {branch!r} of {repo_id}",
             lambda: api.create_branch(repo_id, branch=branch, repo_type="dataset", exist_ok=True))
    state = UploadState.load(Path(state_file), repo_id, branch)
    remote = _remote_files(api, repo_id, branch, secrets)
    plan = plan_upload(folder, files, state, remote, max_files_per_commit=max_files_per_commit,
                       max_bytes_per_commit=max_bytes_per_commit)
    total = len(plan.to_upload)
    if plan.skipped:
        log.info("%d file(s) already on %s@%s with the same content; skipped", len(plan.skipped), repo_id, branch)
    commits: list[tuple[str, list[str], list[str]]] = [
        (f"curate publish: data {k}/{len(plan.batches)} ({len(batch)} file(s))", batch, [])
        for k, batch in enumerate(plan.batches, 1)
    ]
    if plan.final or plan.deletes:
        commits.append(("curate publish: dataset card and attribution"
                        + (f", remove {len(plan.deletes)} stale shard(s)" if plan.deletes else ""), plan.final, plan.deletes))
    uploaded: list[str] = []
    for k, (message, adds, deletes) in enumerate(commits, 1):
        operations: list[Any] = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(folder / p)) for p in adds]
        operations += [CommitOperationDelete(path_in_repo=p) for p in deletes]
        log.info("commit %d/%d to %s@%s: %s", k, len(commits), repo_id, branch, message)
        try:
            info = api.create_commit(repo_id, operations=operations, commit_message=message, repo_type="dataset",
                                     revision=branch)
        except Exception as exc:  # noqa: BLE001
            raise PublishError(
                f"commit {k}/{len(commits)} to {repo_id}@{branch} failed: {type(exc).__name__}: "
                f"{scrub(str(exc), secrets)}. {len(uploaded)} of {total} file(s) were uploaded in this run and are "
                f"recorded in {state.path}; run the same command again to continue from there") from None
        state.record(message, {p: files[p]["sha256"] for p in adds}, deletes, getattr(info, "oid", None))
        uploaded += adds
        if progress is not None:
            progress(len(uploaded), total)
    if not commits:
        log.info("%s@%s is already up to date", repo_id, branch)
    return UploadResult(repo_id, branch, hub_url(repo_id, branch), len(commits), uploaded, plan.skipped,
                        plan.deletes, Path(state_file))


# ----------------------------------------------------------------------------- the whole publish
@dataclass
class PublishResult:
    """What :func:`publish_to_hub` did: the folder it wrote and, unless a dry run, the upload."""

    folder: Any  # HubFolder
    upload: UploadResult | None
    plan: UploadPlan | None = None


def staging_paths(root: str | Path, repo_id: str) -> tuple[Path, Path]:
    """(folder, journal) for a repo: ``DIR/.publish/hub-<owner>--<name>/`` and ``....upload.json``."""
    slug = repo_id.replace("/", "--")
    base = Path(root).absolute() / ".publish"
    return base / f"hub-{slug}", base / f"hub-{slug}.upload.json"


def _default_api(token: str) -> HfApiLike:
    from huggingface_hub import HfApi

    return HfApi(token=token)


def publish_to_hub(
    root: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    token_env: str = DEFAULT_TOKEN_ENV,
    dry_run: bool = False,
    include_unsplit: bool = False,
    max_shard_bytes: int | None = None,
    max_files_per_commit: int = DEFAULT_MAX_FILES_PER_COMMIT,
    max_bytes_per_commit: int = DEFAULT_MAX_BYTES_PER_COMMIT,
    api_factory: Callable[[str], HfApiLike] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> PublishResult:
    """Write the Hub folder of the dataset at ``root`` under ``DIR/.publish/`` and upload it to
    the dataset repo ``repo_id`` (see the module docstring). ``dry_run`` writes the folder and
    plans the commits from the journal alone: no token needed, nothing sent.

    ``api_factory(token)`` makes the ``HfApi`` (default ``huggingface_hub.HfApi(token=token)``);
    tests pass a recording stand-in. ``progress(stage, done, total)`` with stage "write" or "upload".
    """
    from curate.publish.hub import DEFAULT_MAX_SHARD_BYTES, write_hub_folder

    check_repo_id(repo_id)
    token = None if dry_run else read_token(token_env)
    folder_path, journal = staging_paths(root, repo_id)
    folder = write_hub_folder(root, folder_path, repo_id=repo_id, include_unsplit=include_unsplit,
                              max_shard_bytes=max_shard_bytes or DEFAULT_MAX_SHARD_BYTES,
                              progress=(lambda d, t: progress("write", d, t)) if progress else None)
    if dry_run:
        files = {p: i for p, i in folder.files.items() if p != MANIFEST}
        state = UploadState.load(journal, repo_id, revision or "main")
        plan = plan_upload(folder.path, files, state, None, max_files_per_commit=max_files_per_commit,
                           max_bytes_per_commit=max_bytes_per_commit)
        return PublishResult(folder, None, plan)
    assert token is not None
    api = (api_factory or _default_api)(token)
    result = upload_hub_folder(folder.path, repo_id, api=api, state_file=journal, revision=revision, private=private,
                               max_files_per_commit=max_files_per_commit, max_bytes_per_commit=max_bytes_per_commit,
                               secrets=[token], progress=(lambda d, t: progress("upload", d, t)) if progress else None)
    log.info("published %s to %s (%d commit(s), %d file(s) uploaded, %d already there)", folder.path, result.url,
             result.commits, len(result.uploaded), len(result.skipped))
    return PublishResult(folder, result)


__all__ = [
    "ATTRIBUTION_FILE", "DEFAULT_TOKEN_ENV", "HfApiLike", "PublishResult", "UploadPlan", "UploadResult", "UploadState",
    "check_repo_id", "hub_url", "plan_upload", "publish_to_hub", "read_token", "scrub", "staging_paths",
    "upload_hub_folder",
]
