"""Packaging: curate's data folders travel inside the wheel, and a non-editable install works.

The slow test builds a wheel from a copy of the source tree, installs it with ``--no-deps`` into
a fresh venv outside the repository, lends that venv the dev venv's dependencies through a
plain path line in a ``.pth`` file (which adds the dev ``site-packages`` without running the
``.pth`` files inside it, so the editable finder of the dev install stays off), and runs the
installed ``curate`` from a folder outside the repository with no data override. The fast tests
pin the lookup order of :mod:`curate.paths`.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from curate import paths

REPO_DIR = Path(__file__).resolve().parents[1]
# What a build needs from the source tree; a copy keeps the build from writing build/ and
# *.egg-info into the checkout and from shipping a stale build/lib of an earlier build.
SOURCE_ENTRIES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "curate", "datasets", "annotation")
OVERRIDES = ("CURATE_DATA_DIR", "CURATE_ANNOTATION_DIR")
SHIPPED = ("curate/_data/datasets/imagenet1k.tsv", "curate/_data/datasets/zoo.yaml",
           "curate/_data/datasets/backgrounds.yaml", "curate/_data/datasets/phrases.txt",
           "curate/_data/annotation/labelstudio.xml",
           "curate/_data/annotation/tags.yaml")


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    result = subprocess.run([str(a) for a in args], check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _copy_source(target: Path) -> Path:
    target.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_data", ".*")
    for name in SOURCE_ENTRIES:
        source = REPO_DIR / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=ignore)
        else:
            shutil.copy2(source, target / name)
    return target


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_wheel_ships_the_data_and_a_plain_install_runs(tmp_path) -> None:
    setuptools = pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools in this venv")
    assert tuple(int(x) for x in setuptools.__version__.split(".")[:2]) >= (70, 1), \
        "setuptools >= 70.1 builds wheels without the 'wheel' package"
    started = time.perf_counter()
    source = _copy_source(tmp_path / "src")

    # the sdist carries the data folders (MANIFEST.in), the wheel carries them as package data
    sdist_dir = tmp_path / "sdist"
    _run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(sdist_dir)!r})"],
         cwd=source)
    with tarfile.open(next(sdist_dir.glob("*.tar.gz"))) as sdist:
        members = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"setup.py", "datasets/imagenet1k.tsv", "annotation/labelstudio.xml"} <= members
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", wheels, "."], cwd=source)
    wheel = next(wheels.glob("curate-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(SHIPPED) <= names
    shipped = {n.split("/", 3)[3] for n in names if n.startswith("curate/_data/datasets/")}
    assert shipped == {p.name for p in (REPO_DIR / "datasets").iterdir() if p.is_file()}
    assert not any(n.startswith(("datasets/", "annotation/")) for n in names), \
        "the data folders must not become top-level packages (datasets/ would shadow Hugging Face datasets)"

    # a fresh venv outside the repository; install first, so pip sees no other curate to replace
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
         cwd=tmp_path)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path).strip())
    (site / "curate-dev-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (*OVERRIDES, "PYTHONPATH", "VIRTUAL_ENV")}
    probe = ("import json, sys, curate, curate.paths as p, curate.labels as l; "
             "print(json.dumps({'file': curate.__file__, 'data': str(p.data_dir()), "
             "'annotation': str(p.source_dir('annotation', 'CURATE_ANNOTATION_DIR')), "
             "'editable': any('__editable__' in m for m in sys.modules), 'n': len(l.imagenet1k())}))")
    seen = json.loads(_run([python, "-c", probe], cwd=work, env=env))
    assert Path(seen["file"]).is_relative_to(site), seen  # the wheel's curate, not the dev checkout
    assert not seen["editable"], seen
    assert Path(seen["data"]) == site / "curate" / "_data" / "datasets", seen
    assert Path(seen["annotation"]) == site / "curate" / "_data" / "annotation", seen
    assert seen["n"] == 1000

    curate = venv / "bin" / "curate"
    _run([curate, "collect", "synthetic", "W", "--classes", "3", "--per-class", "4", "--image-size", "32",
          "--seed", "0"], cwd=work, env=env)
    assert (work / "W" / "samples.parquet").is_file()
    # imagenet1k (1 vs 1000) needs the shipped label names
    _run([curate, "evaluate", "W", "--model", "curate-tiny-vit", "--pretrained", "none", "--label-space",
          "imagenet1k", "--device", "cpu", "--bootstrap", "10", "--run-name", "eval"], cwd=work, env=env)
    assert (work / "W" / "runs" / "eval" / "metrics.json").is_file()
    _run([curate, "explain", "W", "--model", "curate-tiny-rn", "--pretrained", "none", "--device", "cpu",
          "--run-name", "explain", "--json"], cwd=work, env=env)
    assert (work / "W" / "runs" / "explain" / "summary.json").is_file()
    assert not (REPO_DIR / "curate" / "_data").exists(), "the build must not write into the source tree"
    print(f"packaging round trip: {time.perf_counter() - started:.1f} s")


# ----------------------------------------------------------------------------- lookup order
def _clear_overrides(monkeypatch) -> None:
    for name in OVERRIDES:
        monkeypatch.delenv(name, raising=False)


def test_source_tree_is_the_fallback_of_an_editable_install(monkeypatch) -> None:
    _clear_overrides(monkeypatch)
    assert paths.packaged_dir("datasets") is None  # nothing is generated in the source tree
    assert paths.data_dir() == REPO_DIR / "datasets"
    assert paths.source_dir("annotation", "CURATE_ANNOTATION_DIR") == REPO_DIR / "annotation"
    assert paths.data_file("imagenet1k.tsv").is_file()


def test_packaged_copy_wins_over_the_source_tree_and_the_override_over_both(tmp_path, monkeypatch) -> None:
    _clear_overrides(monkeypatch)
    package = tmp_path / "site" / "curate"
    (package / "_data" / "datasets").mkdir(parents=True)
    monkeypatch.setattr(paths, "files", lambda name: package)
    assert paths.data_dir() == package / "_data" / "datasets"
    assert paths.source_dir("annotation", "CURATE_ANNOTATION_DIR") == REPO_DIR / "annotation"
    monkeypatch.setenv("CURATE_DATA_DIR", str(tmp_path))
    assert paths.data_dir() == tmp_path
    monkeypatch.setenv("CURATE_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="CURATE_DATA_DIR"):
        paths.data_dir()


def test_a_folder_beside_an_installed_package_is_not_the_source_tree(tmp_path, monkeypatch) -> None:
    # installed without package data, site-packages/datasets is Hugging Face's package
    _clear_overrides(monkeypatch)
    site = tmp_path / "site-packages"
    (site / "curate").mkdir(parents=True)
    (site / "datasets").mkdir()
    monkeypatch.setattr(paths, "files", lambda name: site / "curate")
    monkeypatch.setattr(paths, "REPO_DIR", site)
    with pytest.raises(FileNotFoundError, match="CURATE_DATA_DIR"):
        paths.data_dir()
    with pytest.raises(FileNotFoundError, match="CURATE_ANNOTATION_DIR"):
        paths.source_dir("annotation", "CURATE_ANNOTATION_DIR")


def test_a_zipped_install_is_refused_with_the_way_out(tmp_path, monkeypatch) -> None:
    _clear_overrides(monkeypatch)
    archive = tmp_path / "curate.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("curate/__init__.py", "")
    monkeypatch.setattr(paths, "files", lambda name: zipfile.Path(archive, "curate/"))
    with pytest.raises(RuntimeError, match="zip archive.*CURATE_DATA_DIR"):
        paths.data_dir()
    monkeypatch.setenv("CURATE_DATA_DIR", str(tmp_path))
    assert paths.data_dir() == tmp_path
