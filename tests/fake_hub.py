"""A loopback stand-in for the Hugging Face Hub's download API (stdlib http.server), for offline tests.

It serves dataset repos held in memory, enough for ``huggingface_hub.snapshot_download(...,
endpoint=hub.url)``: ``GET /api/datasets/<repo>/revision/<rev>`` (the commit and file list),
``GET /api/datasets/<repo>/tree/<rev>`` (recursive listing, one page) and ``HEAD``/``GET
/datasets/<repo>/resolve/<rev>/<path>`` (the file, with ``X-Repo-Commit``, ``ETag`` = git blob
id, ``Content-Length``). A repo is added from a local folder (:meth:`FakeHub.add_folder`) under a
branch; each add is a new commit. ``requests`` counts what was asked, ``tokens`` the
``Authorization`` headers seen.
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from quiet_http import QuietHTTPServer


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """``with FakeHub() as hub: hub.add_folder("alice/x", folder); hub.url`` (see the module docstring)."""

    def __init__(self) -> None:
        self.commits: dict[str, dict[str, bytes]] = {}  # commit -> files
        self.refs: dict[tuple[str, str], str] = {}  # (repo, branch) -> commit
        self.repo_of: dict[str, str] = {}  # commit -> repo
        self.requests: Counter = Counter()
        self.tokens: list[str] = []
        self._server: ThreadingHTTPServer | None = None

    def add_folder(self, repo_id: str, folder: Path, branch: str = "main") -> str:
        """Commit every file under ``folder`` (hidden ones left out) to ``repo_id@branch``; returns the commit."""
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*"))
                 if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)}
        digest = hashlib.sha1(repo_id.encode() + json.dumps(sorted((k, blob_id(v)) for k, v in files.items())).encode()
                              + str(len(self.commits)).encode())
        commit = digest.hexdigest()
        self.commits[commit], self.refs[(repo_id, branch)], self.repo_of[commit] = files, commit, repo_id
        return commit

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _resolve(self, repo: str, rev: str) -> str | None:
        if rev in self.commits and self.repo_of[rev] == repo:
            return rev
        return self.refs.get((repo, rev))

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None, head: bool = False) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, value: Any, status: int = 200) -> None:
                self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json"})

            def _missing(self, head: bool = False) -> None:
                self._send(404, b'{"error": "Repository not found"}',
                           {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"}, head=head)

            def _handle(self, head: bool) -> None:
                if self.headers.get("Authorization"):
                    hub.tokens.append(self.headers["Authorization"])
                parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
                if parts[:2] == ["api", "datasets"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                    repo, kind, rev = f"{parts[2]}/{parts[3]}", parts[4], parts[5]
                    hub.requests[kind] += 1
                    commit = hub._resolve(repo, rev)
                    if commit is None:
                        return self._missing(head)
                    files = hub.commits[commit]
                    if kind == "revision":
                        return self._json({"id": repo, "sha": commit, "private": False,
                                           "siblings": [{"rfilename": p} for p in files]})
                    return self._json([{"type": "file", "path": p, "size": len(d), "oid": blob_id(d)}
                                       for p, d in files.items()])
                if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
                    repo, rev, path = f"{parts[1]}/{parts[2]}", parts[4], "/".join(parts[5:])
                    commit = hub._resolve(repo, rev)
                    if commit is None or path not in hub.commits[commit]:
                        return self._missing(head)
                    data = hub.commits[commit][path]
                    hub.requests["head" if head else "download"] += 1
                    return self._send(200, data, {"X-Repo-Commit": commit, "ETag": f'"{blob_id(data)}"'}, head=head)
                hub.requests["other"] += 1
                self._missing(head)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._handle(False)

            def do_HEAD(self) -> None:  # noqa: N802
                self._handle(True)

        self._server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
