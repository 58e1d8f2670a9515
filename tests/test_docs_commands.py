"""Every `curate` command the README and docs/ print, kept working as written.

Two levels:

- **Every command parses.** Each line starting with ``curate`` in a ```bash block of README.md
  and docs/*.md (continuations joined, comments dropped) names a verb that exists and only
  options that verb has; ``curate X --help`` works for it. This is the check for commands that
  need what CI has not (real checkpoints, the internet, a GPU, a running server).
- **Offline blocks run.** A block fenced as ```bash offline runs for real, line by line, each
  line in a process of its own: forked from a zygote that has done nothing but import curate and
  its libraries (tests/cli_zygote.py: each model-loading line would otherwise pay about 5.5 s of
  CPU for the imports), or in a fresh ``bash -c`` where the line uses shell syntax. The offline blocks of one file run in order in one fresh folder with
  relative paths and ``HOME`` set to it (as a user pastes them, block after block, from a new
  directory), so a block may continue the one before it in its file. Sizes are shrunk so the run
  takes seconds, by the substitutions in :data:`TINY` (the only difference from the text: world
  sizes, training steps, image and sample counts); every other token is verbatim, which
  :func:`test_tiny_substitutions_change_only_sizes` checks. Each line prints which of them it
  applied (``pytest -s``), and a failure names them.

Three kinds of lines are not run by the block's shell, and each says what it stands for:

- :data:`SETUP`: the lines that make the shared tiny world, evaluation world and reference CLIP
  (``world/``, ``eval/``, ``ref.pt``). The fixture :func:`prepared` runs them once, for real and
  shrunk by :data:`TINY` like any other line; a block that prints one of them gets a copy of what
  that line made (or changed), so each block reads as a user types it without training the same
  model five times.
- :data:`DEMO`: ``curate demo``, which writes ``demo-output/``; its stand-in is the demo's worlds and
  weights that the slow suites share anyway (conftest's ``demo_dir``: ``curate.demo.run_demo``,
  the part of the demo that later lines read: ``demo-output/models/*.pt``).
- lines that are not ``curate`` commands (``python -c ...``, ``export ...``) are left out.

:data:`LOCAL_FILES` are the user's own files that a block names (``~/photos/``, a
``metadata.csv``): the test writes small ones before the file's blocks run.
"""
from __future__ import annotations

import csv
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest
from cli_zygote import Zygote, needs_a_shell
from PIL import Image

from curate.cli import load_all_commands, main

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)?([^\n]*)\n(.*?)^```", re.M | re.S)
#: How an offline block is shrunk to a tiny world: (pattern, replacement) on each command line.
#: Only sizes and steps change (:func:`test_tiny_substitutions_change_only_sizes`).
TINY: tuple[tuple[str, str], ...] = (
    (r"^(curate collect synthetic world/ .*)--per-class \d+", r"\1--per-class 100"),
    (r"^(curate collect synthetic eval/ .*)--per-class \d+", r"\1--per-class 60"),  # 10 per background
    (r"--per-class 500\b", "--per-class 100"),
    (r"^(curate train-reference .*)$", r"\1 --steps 20 --batch-size 32"),
    (r"--limit \d+", "--limit 8"),
    (r"--samples \d+", "--samples 2"),
    (r"^(curate intervene .*)--per-cell \d+", r"\1--per-cell 4"),
    # F-Fidelity fine-tunes a copy per seed on every masked image (540 here, 3 seeds: ~45 s of CPU): 64 do
    (r"--finetune-limit \d+", "--finetune-limit 64"),
    (r"^(curate fidelity (?!.*--finetune-limit).*--families [a-z,]*ffid.*)$", r"\1 --finetune-limit 64"),
)
#: The options whose values TINY may change or append (sizes and steps, nothing else).
SIZE_OPTIONS = frozenset({"--per-class", "--steps", "--batch-size", "--limit", "--samples", "--per-cell",
                          "--finetune-limit"})
#: Setup lines (as extracted: comments dropped) -> the paths each makes or changes. The fixture
#: :func:`prepared` runs them in this order, shrunk by TINY; a block that prints one gets a copy of
#: those paths as they were right after it ran.
SETUP: dict[str, tuple[str, ...]] = {
    "curate collect synthetic world/ --classes 6 --p 0.9 --per-class 500 --seed 0": ("world",),
    "curate collect synthetic eval/ --classes 6 --uncorrelated --per-class 200 --seed 1000": ("eval",),
    "curate train-reference world/ --out ref.pt --eval eval/": ("world", "eval", "ref.pt"),  # provenance, eval cache
}
#: ``curate demo`` -> its stand-in: conftest's ``demo_dir`` weights copied to ``demo-output/models/``.
DEMO = "curate demo"


def _blocks(path: Path) -> list[tuple[str, str]]:
    """(info string, body) of each fenced block of a Markdown file whose language is bash."""
    return [(m.group(2).strip(), m.group(3)) for m in FENCE.finditer(path.read_text()) if m.group(1) == "bash"]


def _lines(body: str) -> list[str]:
    """The ``curate`` command lines of a block: continuations joined, trailing comments removed."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line != "curate" and not line.startswith("curate "):
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as error:  # an unbalanced quote in the docs
            raise AssertionError(f"cannot parse {line!r}: {error}") from None
        out.append(_join(tokens))
    return out


def _join(tokens: list[str]) -> str:
    """The tokens as one shell line, quoted where needed, a leading ``~/`` left to the shell as typed."""
    return " ".join(token if token.startswith("~/") and shlex.quote(token[2:]) == token[2:] else shlex.quote(token)
                    for token in tokens)


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


#: The options that name a model and the option that gives its weights, pair by pair (as the CLI pairs
#: them: one weights option per name, in order, or none at all).
MODEL_OPTIONS = (("--model", "--pretrained"), ("--reference", "--pretrained"),
                 ("--top20-reference", "--top20-pretrained"))


def _model_specs(line: str) -> list[tuple[str, str | None]]:
    """Each ``(name, weights)`` a documented command line names, paired by ``specs_from_cli``."""
    from curate.models.spec import specs_from_cli

    tokens = shlex.split(line)
    if tokens[1:2] == ["propose-masks"]:  # segmentation models; only cam: names a CLIP (cam:NAME@TAG)
        from curate.masks.backends.base import parse_mask_spec
        from curate.masks.backends.cam import parse_cam_spec

        specs = [parse_mask_spec(tokens[i + 1]) for i, t in enumerate(tokens[:-1]) if t == "--model"]
        return [(c.name, c.pretrained) for c in map(parse_cam_spec, (s for s in specs if s.backend == "cam"))]
    found = []
    for name_option, weights_option in MODEL_OPTIONS:
        names = [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == name_option]
        weights = [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == weights_option]
        if names and name_option == "--reference" and "--model" in tokens:
            weights = []  # a verb with both names --pretrained for its --model
        if names:
            found += [(s.name, s.pretrained) for s in specs_from_cli(names, weights if len(weights) == len(names) else [])]
    return found


class _StopBeforeWeights(Exception):
    """Raised where a model load would read its weights: the spec has been resolved by then."""


def test_documented_models_resolve_without_a_quickgelu_warning(monkeypatch):
    """Every open_clip model the docs name (issue 46) resolves, through ``load_model`` up to the point
    where it would read weights, to the architecture its weights were trained with: no
    :class:`~curate.models.base.QuickGELUWarning` (``ViT-B-32`` with ``laion400m_e31`` is the
    paper's model with the wrong activation, about 3 points of accuracy lost)."""
    import warnings

    import curate.models.clip as clip_backend
    from curate.models import QuickGELUWarning, load_model
    from curate.models.loader import as_pretrained, parse_model_name
    from curate.models.registry import DEFAULT_BACKEND
    from curate.models.weights import Checkpoint

    def stop(*_args, **_kwargs):
        raise _StopBeforeWeights

    monkeypatch.setattr(clip_backend, "resolve_weights", stop)
    warned: dict[tuple[str, str | None], list[str]] = {}  # each spec resolved once: its QuickGELU warnings
    bad = []
    for where, line in COMMANDS:
        for name, weights in _model_specs(line):
            if name in ("auto", "") or isinstance(as_pretrained(weights), Checkpoint):
                continue  # a weights file names its own architecture
            backend, _, _, zoo_tag = parse_model_name(name)
            if backend != DEFAULT_BACKEND or not (weights or zoo_tag):
                continue  # not an open_clip CLIP, or random weights: no activation to mismatch
            if (name, weights) not in warned:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    with pytest.raises(_StopBeforeWeights):
                        load_model(name, weights)
                warned[name, weights] = [str(w.message) for w in caught if issubclass(w.category, QuickGELUWarning)]
            bad += [f"{where}: `{line}`: {message}" for message in warned[name, weights]]
    assert len(warned) >= 3, warned  # the docs name pretrained CLIPs (else the check is vacuous)
    assert not bad, "\n".join(bad)


def _offline_files() -> list[tuple[str, list[list[str]]]]:
    """(file name, the command lines of each of its offline blocks, in order) for every file with one."""
    out = []
    for path in DOCS:
        blocks = [_lines(body) for info, body in _blocks(path) if "offline" in info.split()]
        if blocks:
            out.append((path.name, blocks))
    return out


OFFLINE = _offline_files()


def _tiny(line: str) -> tuple[str, list[str]]:
    """The line shrunk by TINY, and each substitution applied, as ``old -> new``."""
    applied = []
    for pattern, replacement in TINY:
        new = re.sub(pattern, replacement, line)
        if new != line:
            applied.append(_diff(line, new))
        line = new
    return line, applied


def _diff(old: str, new: str) -> str:
    """The tokens TINY changed, e.g. ``--per-class 500 -> 100`` or ``+ --steps 40``."""
    a, b = shlex.split(old), shlex.split(new)
    changed = [f"{a[i - 1]} {a[i]} -> {b[i]}" for i in range(min(len(a), len(b))) if a[i] != b[i]]
    added = [" ".join(b[len(a):])] if len(b) > len(a) else []
    return "; ".join([*changed, *(f"+ {extra}" for extra in added)])


def test_there_are_offline_blocks():
    names = {name for name, _ in OFFLINE}
    assert {"README.md", "cli.md"} <= names, names  # the tour and the CLI reference run for real
    assert sum(len(blocks) for _, blocks in OFFLINE) >= 8


#: What a README block of ``curate`` commands that cannot run here says it needs, in its info string
#: (```bash needs-weights), instead of ``offline``.
NEEDS = frozenset({"needs-weights", "needs-data", "needs-cluster"})


def test_every_readme_command_block_runs_or_says_what_it_needs():
    """Each README block of ``curate`` commands is run by :func:`test_offline_blocks_run_as_written_on_a_tiny_world`
    (``offline``) or says what this machine cannot give it (:data:`NEEDS`): a new block cannot go unrun unnoticed
    (issue 43)."""
    blocks = [(set(info.split()), _lines(body)) for info, body in _blocks(REPO / "README.md")]
    unmarked = [lines[0] for words, lines in blocks if lines and not words & (NEEDS | {"offline"})]
    assert not unmarked, f"README blocks neither offline nor marked {sorted(NEEDS)}: {unmarked}"
    assert sum("offline" in words for words, _ in blocks) >= 2  # the tour and its sequel run


def test_tiny_substitutions_change_only_sizes():
    """TINY changes option values of sizes and steps (or appends such options), no other token."""
    seen = 0
    for where, blocks in OFFLINE:
        for line in (line for block in blocks for line in block):
            shrunk, applied = _tiny(line)
            a, b = shlex.split(line), shlex.split(shrunk)
            assert len(b) >= len(a), f"{where}: `{line}` -> `{shrunk}`"  # nothing dropped; changed as below
            for i in range(min(len(a), len(b))):
                if a[i] != b[i]:
                    assert a[i - 1] in SIZE_OPTIONS and a[i].isdigit() and b[i].isdigit(), (where, a[i - 1], a[i], b[i])
            extra = b[len(a):]
            assert all(extra[k] in SIZE_OPTIONS and extra[k + 1].isdigit() for k in range(0, len(extra), 2)), extra
            seen += bool(applied)
    assert seen >= 5  # the patterns match the docs' lines (else the blocks would run at full size)


def test_setup_lines_are_in_the_docs_as_written():
    """Each stand-in replaces a line the docs print verbatim (else it would stand in for nothing)."""
    offline = {line for _, blocks in OFFLINE for block in blocks for line in block}
    assert set(SETUP) <= offline, set(SETUP) - offline
    assert DEMO in offline


def _env(home: Path) -> dict[str, str]:
    """The environment of every line run in ``home``: ``HOME`` is the folder, the venv's ``curate`` on ``PATH``."""
    env = {**os.environ, "HOME": str(home), "COLUMNS": "200"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


class _Lines:
    """Runs a folder's lines: each in a process of its own, forked from a pre-imported zygote
    (tests/cli_zygote.py, started at the first line that can use it), or ``bash -c`` where the line
    uses shell syntax."""

    def __init__(self, home: Path) -> None:
        self.home, self.env, self.zygote = home, _env(home), None

    def run(self, line: str, where: str) -> subprocess.CompletedProcess:
        shrunk, applied = _tiny(line)
        shell = needs_a_shell(shrunk)
        print(f"$ {shrunk}" + (f"    [tiny: {'; '.join(applied)}]" if applied else "") + ("    [bash -c]" if shell else ""))
        if shell:
            done = subprocess.run(["bash", "-c", shrunk], cwd=self.home, env=self.env, capture_output=True, text=True,
                                  timeout=600)
        else:
            if self.zygote is None:
                self.zygote = Zygote(self.env, self.home)
            done = self.zygote.run(shlex.split(shrunk)[1:], self.home, self.env, timeout=600)
        assert done.returncode == 0, (f"{where}: `{shrunk}` (tiny: {applied or 'none'}) exited {done.returncode}:\n"
                                      f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return done

    def close(self) -> None:
        if self.zygote is not None:
            self.zygote.close()


def test_a_forked_line_runs_where_and_as_a_fresh_process_would(tmp_path: Path):
    """The zygote's child gets the line's folder and environment and gives back the verb's exit status
    and output: a failing line fails the docs test (tests/cli_zygote.py)."""
    assert needs_a_shell("curate collect folder mydata/ ~/photos/") and needs_a_shell("curate info $X")
    assert not needs_a_shell("curate fidelity w/ --methods 'mask,mask~0.2'") and needs_a_shell("ls eval/")
    env = _env(tmp_path)
    zygote = Zygote(env, tmp_path, preload=("curate.cli",))
    try:
        made = zygote.run(["create", "mine/", "--label-space", "imagenet1k"], tmp_path, env, timeout=60)
        assert made.returncode == 0 and (tmp_path / "mine" / "dataset.yaml").exists(), made
        missing = zygote.run(["info", "nowhere/"], tmp_path, env, timeout=60)
        assert missing.returncode == 2 and "nowhere" in missing.stderr, missing
        with pytest.raises(ValueError, match="shell"):
            zygote.run(["models"], tmp_path, {**env, "HOME": "/"}, timeout=60)
    finally:
        zygote.close()


def _replace(src: Path, dst: Path) -> None:
    if dst.is_dir():
        shutil.rmtree(dst)
    elif dst.exists():
        dst.unlink()
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy2(src, dst)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, Path]:
    """Each SETUP line run once, in order, in one folder (shrunk by TINY); a snapshot of what it made."""
    work = tmp_path_factory.mktemp("docs-setup")
    snapshots = {}
    lines = _Lines(work)
    try:
        for i, (line, paths) in enumerate(SETUP.items()):
            lines.run(line, "SETUP")
            snap = tmp_path_factory.mktemp(f"docs-setup-{i}")
            for name in paths:
                _replace(work / name, snap / name)
            snapshots[line] = snap
    finally:
        lines.close()
    return snapshots


def _write_local_files(home: Path) -> None:
    """The user's own files that docs/recipes.md's local-folder block names: ``~/photos/`` (an
    ImageFolder, class folders by name, index and WordNet id), ``~/CounterAnimal/`` (the released
    layout, ``<class>/easy-<bg>/`` and ``hard-<bg>/``) and its licences, ``metadata.csv``."""
    rng = np.random.default_rng(0)

    def image(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(path)

    for folder in ("ostrich", "10", "n01531178"):  # by name; brambling by index; goldfinch by WordNet id
        for k in range(2):
            image(home / "photos" / folder / f"{folder}-{k}.png")
    rows = []
    for cls, group in (("ostrich", "easy-sand"), ("ostrich", "hard-grass"), ("brambling", "easy-grass"),
                       ("brambling", "hard-snow")):
        for k in range(2):
            rel = f"{cls}/{group}/{k}.png"
            image(home / "CounterAnimal" / rel)
            rows.append({"path": rel, "license": "cc-by", "attribution": f"photographer {k}"})
    with open(home / "metadata.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["path", "license", "attribution"])
        writer.writeheader()
        writer.writerows(rows)


#: Files whose blocks name the user's own files: the test writes small ones first.
LOCAL_FILES = {"recipes.md": _write_local_files}
#: What a file's blocks say they write (globs under the folder; each must match), so a command
#: that exits 0 having done nothing still fails.
WRITES: dict[str, tuple[str, ...]] = {
    "README.md": ("eval/runs/split-*/split.csv", "eval/runs/compare/compare.md", "eval/runs/fidelity-*/ranking.csv",
                  "eval/runs/report/report.md", "eval/runs/report/report.html", "eval/runs/plan/plan.csv",
                  "eval-iv/samples.parquet", "eval-iv/runs/attribution-*/attribution.csv"),
    "cli.md": ("mydata/dataset.yaml", "eval/runs/split-*/split.csv", "CounterAnimal/metadata.csv",
               "CounterAnimal/*/easy-*/*", "CounterAnimal/*/hard-*/*", "eval/runs/eval-*/metrics.json",
               "eval/runs/compare/compare.md", "world/runs/explain-*/summary.json",
               "world/runs/fidelity-*/ranking.csv"),
    "recipes.md": ("mydata/samples.parquet", "counteranimal/samples.parquet"),
    "curation-assists.md": ("world-audit/runs/audit-*/audit.json", "W/samples.parquet", "W2/samples.parquet"),
}


@pytest.mark.parametrize(("where", "blocks"), OFFLINE, ids=[name for name, _ in OFFLINE])
def test_offline_blocks_run_as_written_on_a_tiny_world(where: str, blocks: list[list[str]], tmp_path: Path, request):
    """The file's offline blocks in order, in one fresh folder; each line in a process of its own, relative
    paths; sizes shrunk by TINY only; SETUP and DEMO lines by their stand-ins (module docstring)."""
    if where in LOCAL_FILES:
        LOCAL_FILES[where](tmp_path)
    lines = _Lines(tmp_path)
    request.addfinalizer(lines.close)
    for b, block in enumerate(blocks, start=1):
        for line in block:
            if line in SETUP:
                prepared = request.getfixturevalue("prepared")  # made once, at the first block that needs it
                print(f"$ {line}    [stand-in: {', '.join(SETUP[line])} from the fixture, run as {_tiny(line)[0]!r}]")
                for name in SETUP[line]:
                    _replace(prepared[line] / name, tmp_path / name)
            elif line == DEMO:
                demo = request.getfixturevalue("demo_dir")
                print(f"$ {line}    [stand-in: {demo}/models/*.pt -> demo-output/models/]")
                (tmp_path / "demo-output").mkdir(exist_ok=True)
                _replace(demo / "models", tmp_path / "demo-output" / "models")
            else:
                lines.run(line, f"{where}, offline block {b}")
    missing = [pattern for pattern in WRITES.get(where, ()) if not any(tmp_path.glob(pattern))]
    assert not missing, f"{where}: its blocks ran but wrote none of {missing}"
    if where == "recipes.md":  # every local file imported, groups and licences from the layout and the CSV
        from curate import Dataset
        mine, released = Dataset.open(tmp_path / "mydata"), Dataset.open(tmp_path / "counteranimal")
        assert len(mine) == 6 and set(mine.table().column("license").to_pylist()) == {"cc-by"}
        rows = released.table().to_pylist()
        assert len(rows) == 8 and {r["group"] for r in rows} == {"easy", "hard"}
        assert {r["attribution"] for r in rows} == {"photographer 0", "photographer 1"}
