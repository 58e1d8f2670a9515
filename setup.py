"""Build hook: ship the top-level ``datasets/`` and ``annotation/`` folders inside the wheel.

Everything else about the package lives in ``pyproject.toml``. The two folders stay at the top
of the source tree (their one source of truth, kept out of ``curate/`` so that ``datasets/``
never shadows Hugging Face ``datasets``); ``build_py`` copies their files into the *build*
directory as ``curate/_data/<folder>/...``, so a wheel or ``pip install .`` carries them and
nothing is generated in the source tree. An editable install skips the copy: ``curate.paths``
reads the source tree directly. ``MANIFEST.in`` puts the folders into the sdist, so a wheel
built from the sdist gets them too.
"""
from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DATA_FOLDERS = ("datasets", "annotation")  # keep in step with curate.paths.DATA_FOLDERS
PACKAGE_DATA = Path("curate") / "_data"  # curate.paths.PACKAGE_DATA
SKIPPED_NAMES = {"__pycache__", ".DS_Store"}


def shared_data_files() -> list[tuple[Path, Path]]:
    """``(source file, path relative to the build dir)`` for every file of the data folders."""
    pairs = []
    for folder in DATA_FOLDERS:
        source = ROOT / folder
        if not source.is_dir():
            raise FileNotFoundError(f"cannot build curate: its {folder}/ folder is missing from {ROOT} "
                                    "(build from a git checkout or from curate's sdist)")
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(source)
            if path.is_file() and not any(part in SKIPPED_NAMES or part.startswith(".") for part in relative.parts):
                pairs.append((path, PACKAGE_DATA / folder / relative))
    return pairs


class BuildPyWithData(build_py):
    """``build_py`` that also copies ``datasets/`` and ``annotation/`` to ``curate/_data/``."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for source, relative in shared_data_files():
            target = Path(self.build_lib) / relative
            self.mkpath(str(target.parent))
            self.copy_file(str(source), str(target))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:  # type: ignore[override]
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        return outputs + [str(Path(self.build_lib) / relative) for _, relative in shared_data_files()]


setup(cmdclass={"build_py": BuildPyWithData})
