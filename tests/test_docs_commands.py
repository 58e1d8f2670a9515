"""Every `curate` command the README and docs/ print, kept working as written.

Two levels:

- **Every command parses.** Each line starting with ``curate`` in a ```bash block of README.md
  and docs/*.md (continuations joined, comments dropped) names a verb that exists and only
  options that verb has; ``curate X --help`` works for it. This is the check for commands that
  need what CI has not (real checkpoints, the internet, a GPU, a running server).
- **Offline blocks run.** A block fenced as ```bash offline runs for real, line by line, in
  order, in a fresh folder with relative paths (as a user pastes it), each line in a fresh shell.
  Sizes are shrunk so the run takes seconds, by the substitutions in :data:`TINY` (the only
  difference from the text: world sizes and training steps); every other token is verbatim.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from curate.cli import load_all_commands, main

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)?([^\n]*)\n(.*?)^```", re.M | re.S)
#: How an offline block is shrunk to a tiny world: (pattern, replacement) on each command line.
TINY: tuple[tuple[str, str], ...] = (
    (r"^(curate collect synthetic world/ .*)--per-class \d+", r"\1--per-class 100"),
    (r"^(curate collect synthetic eval/ .*)--per-class \d+", r"\1--per-class 90"),  # 15 per background
    (r"--per-class 500\b", "--per-class 100"),
    (r"^(curate train-reference .*)$", r"\1 --steps 40 --batch-size 64"),
    (r"--limit \d+", "--limit 8"),
    (r"--samples \d+", "--samples 2"),
)


def _blocks(path: Path) -> list[tuple[str, str]]:
    """(info string, body) of each fenced block of a Markdown file whose language is bash."""
    return [(m.group(2).strip(), m.group(3)) for m in FENCE.finditer(path.read_text()) if m.group(1) == "bash"]


def _lines(body: str) -> list[str]:
    """The ``curate`` command lines of a block: continuations joined, trailing comments removed."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line.startswith("curate "):
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as error:  # an unbalanced quote in the docs
            raise AssertionError(f"cannot parse {line!r}: {error}") from None
        out.append(shlex.join(tokens))
    return out


def _documented() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for _, body in _blocks(path):
            found.extend((path.name, line) for line in _lines(body))
    return found


def _resolve(tokens: list[str]) -> tuple[click.Command, list[str]]:
    """The click command a token list names (after ``curate``) and the tokens left for it."""
    load_all_commands()
    command: click.Command = main
    rest = list(tokens)
    while isinstance(command, click.Group):
        while rest and rest[0].startswith("-"):  # group options: -q, -v, --debug
            rest.pop(0)
        if not rest:
            break
        name = rest.pop(0)
        sub = command.get_command(click.Context(command), name)
        assert sub is not None, f"no verb {name!r}"
        command = sub
    return command, rest


COMMANDS = _documented()


def test_the_docs_print_commands():
    assert len(COMMANDS) > 40  # the extraction works (a broken pattern would make every test below vacuous)


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[f"{w}:{line[:60]}" for w, line in COMMANDS])
def test_every_documented_command_names_a_verb_and_its_options(where: str, line: str):
    tokens = shlex.split(line)[1:]
    command, rest = _resolve(tokens)
    known = {name for param in command.params for name in (*param.opts, *param.secondary_opts)} | {"--help", "-h"}
    for token in rest:
        if token.startswith("--") and len(token) > 2:
            option = token.split("=", 1)[0]
            assert option in known, f"{where}: `{line}`: {command.name} has no option {option}"


def _offline_blocks() -> list[tuple[str, list[str]]]:
    return [(path.name, _lines(body)) for path in DOCS for info, body in _blocks(path) if "offline" in info.split()]


def test_there_is_an_offline_block():
    assert _offline_blocks(), "README's tour is fenced ```bash offline"


@pytest.mark.parametrize(("where", "lines"), _offline_blocks(), ids=lambda v: v if isinstance(v, str) else "")
def test_offline_blocks_run_as_written_on_a_tiny_world(where: str, lines: list[str], tmp_path: Path):
    """Each line in a fresh shell, relative paths, in order; sizes shrunk by TINY only."""
    env = {**os.environ, "HOME": str(tmp_path), "COLUMNS": "200"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the venv's `curate`
    for line in lines:
        for pattern, replacement in TINY:
            line = re.sub(pattern, replacement, line)
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{where}: `{line}` exited {done.returncode}:\n{done.stdout[-2000:]}\n" \
                                     f"{done.stderr[-3000:]}"
