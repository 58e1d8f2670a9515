"""The CLI as a user runs it: create, collect synthetic, info, check, train-reference, models."""
from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from store_helpers import make_dataset

import curate
from curate.cli import COMMANDS, main
from curate.shell import suggest


@pytest.fixture()
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200"})


@pytest.fixture()
def world(tmp_path, runner):
    root = tmp_path / "world"
    result = runner.invoke(main, ["collect", "synthetic", str(root), "--classes", "3", "--per-class", "4",
                                  "--image-size", "48", "--seed", "1"])
    assert result.exit_code == 0, result.output
    return root


def test_collect_info_check(world, runner) -> None:
    result = runner.invoke(main, ["info", str(world)])
    assert result.exit_code == 0, result.output
    for text in ("12 samples", "polar bear", "black swan", "vulture", "snow", "accepted", "CC0-1.0"):
        assert text in result.output
    result = runner.invoke(main, ["check", str(world)])
    assert result.exit_code == 0 and "ok" in result.output


def test_check_lists_every_problem_and_exits_nonzero(world, runner) -> None:
    table = pq.read_table(world / "samples.parquet")
    rows = table.to_pylist()
    (world / rows[1]["filepath"]).unlink()  # a missing image
    rows[2]["background"] = "lava"  # an unknown background
    pq.write_table(type(table).from_pylist(rows, schema=table.schema), world / "samples.parquet")
    result = runner.invoke(main, ["check", str(world)])
    assert result.exit_code == 1
    assert "row 1" in result.output and "row 2" in result.output and "lava" in result.output
    result = runner.invoke(main, ["info", str(world)])  # opening fails with a clear error, no traceback
    assert result.exit_code == 1 and "Traceback" not in result.output


def test_create_with_a_custom_label_space(tmp_path, runner) -> None:
    labels = tmp_path / "coco.txt"
    labels.write_text("person\nbird\ncat\n")
    result = runner.invoke(main, ["create", str(tmp_path / "d"), "--label-space", str(labels), "--backgrounds", "grass,water"])
    assert result.exit_code == 0, result.output
    assert "3 classes, 2 backgrounds" in result.output
    result = runner.invoke(main, ["create", str(tmp_path / "e"), "--label-space", "nope.txt"])
    assert result.exit_code != 0 and "nope.txt" in result.output


def test_unknown_synthetic_class_is_a_clear_error(tmp_path, runner) -> None:
    result = runner.invoke(main, ["collect", "synthetic", str(tmp_path / "w"), "--classes", "lion,unicorn"])
    assert result.exit_code == 1 and "unicorn" in result.output
    assert not (tmp_path / "w").exists()


def test_train_reference_cli(world, tmp_path, runner) -> None:
    out = tmp_path / "ref.pt"
    result = runner.invoke(main, ["train-reference", str(world), "--out", str(out), "--steps", "2",
                                  "--batch-size", "8", "--eval", str(world)])
    assert result.exit_code == 0, result.output
    assert out.exists() and "aligned" in result.output and "conflicting" in result.output
    assert "train_reference" in (world / "dataset.yaml").read_text()


def test_models_lists_the_zoo(runner) -> None:
    result = runner.invoke(main, ["models"])
    assert result.exit_code == 0 and "CLIP-LAION400M-ViT-B/32" in result.output and "laion400m_e31" in result.output


def test_missing_weights_fail_fast_from_the_cli(tmp_path, runner) -> None:
    env = {"HF_HOME": str(tmp_path / "hf"), "CURATE_WEIGHTS_DIR": str(tmp_path / "w"), "XDG_CACHE_HOME": str(tmp_path)}
    code = ("from curate.models import load_model\n"
            "load_model('CLIP-LAION400M-ViT-B/32')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**__import__('os').environ, **env})
    assert proc.returncode != 0 and "WeightsNotFoundError" in proc.stderr


def test_console_script_is_installed() -> None:
    proc = subprocess.run([sys.executable, "-m", "curate.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "curate" in proc.stdout


def test_the_lazy_verb_table_is_complete_and_a_verb_loads_only_its_module() -> None:
    """COMMANDS names every verb and the modules defining it and its subcommands; `curate
    evaluate` imports no other verb's module (a fresh process, as a user runs it)."""
    from curate.cli import COMMANDS, load_all_commands

    load_all_commands()
    assert set(main.commands) == set(COMMANDS)
    for name, command in main.commands.items():
        modules = {command.callback.__module__.rpartition(".")[2]}
        for sub in getattr(command, "commands", {}).values():
            modules.add(sub.callback.__module__.rpartition(".")[2])
        assert modules == set(COMMANDS[name]), name
    code = ("import sys; from curate.cli import main; main(['evaluate', '--help'], standalone_mode=False); "
            "print(sorted(m for m in sys.modules if m.startswith('curate.cli.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip().splitlines()[-1] == "['curate.cli.evaluate', 'curate.cli.options']"
    listed = subprocess.run([sys.executable, "-m", "curate.cli", "--help"], capture_output=True, text=True, check=True)
    assert all(verb in listed.stdout for verb in COMMANDS)


# ------------------------------------------------------------------ one form for errors and suggestions

def _leaf_commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    leaves = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            leaves += _leaf_commands(command, (*path, name))
        else:
            leaves.append(((*path, name), command))
    return leaves


def test_every_verb_says_error_the_same_way_and_shows_every_option(tmp_path, runner) -> None:
    """Usage errors (click's) and library errors both start `error:` (one code path, never click's
    `Error:`), from every verb; no verb hides an option it accepts from --help (intervene hid
    --overwrite, which docs/cli.md lists)."""
    from curate.cli import load_all_commands

    load_all_commands()
    leaves = _leaf_commands(main)
    assert len(leaves) > len(COMMANDS)  # the subcommands of collect and review too
    for path, command in leaves:
        hidden = [p.name for p in command.params if getattr(p, "hidden", False)]
        assert not hidden, (path, hidden)
        result = runner.invoke(main, [*path, "--no-such-option"])
        assert result.exit_code == 2, (path, result.output)
        assert "error: No such option" in result.stderr and "Error:" not in result.output, (path, result.output)
    assert "--overwrite" in runner.invoke(main, ["intervene", "--help"]).output
    cases = {("--no-such-option",): 2, ("no-such-verb",): 2, ("info", str(tmp_path / "absent")): 2,
             ("info", str(tmp_path)): 1, ("create", str(tmp_path / "c"), "--label-space", "nope.txt"): 2}
    for args, code in cases.items():
        result = runner.invoke(main, list(args))
        assert result.exit_code == code and result.stderr.strip().splitlines()[-1].startswith("error: "), \
            (args, result.output)
        assert "Error:" not in result.output, args


def test_an_invalid_dataset_is_one_error_line(tmp_path, runner, monkeypatch) -> None:
    """docs/cli.md: an error is one line on stderr; a folder with several problems says the first,
    how many more, and the command that lists them all."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "dataset.yaml").write_text("- not\n- a mapping\n")
    result = runner.invoke(main, ["info", "bad"])
    assert result.exit_code == 1 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    line = result.stderr.strip()
    assert line.startswith("error: dataset at bad is invalid (2 problems): dataset.yaml is not a mapping"), line
    assert "(and 1 more)" in line and "`curate check bad` lists every problem" in line, line
    assert "samples.parquet" not in line  # the second problem is counted, not listed


def test_a_suggested_command_gives_back_a_folder_with_a_space(tmp_path, runner, monkeypatch) -> None:
    """Every `curate ...` suggestion quotes its values (curate.shell.suggest): split as a shell
    splits it, the folder `no masks` is one word; no f-string builds a suggestion around a value."""
    assert shlex.split(suggest("curate x {dir} --run {run} --model NAME", dir="no masks", run="it's $HOME")) == \
        ["curate", "x", "no masks", "--run", "it's $HOME", "--model", "NAME"]
    assert suggest("curate check {dir}", dir=Path("plain/dir")) == "curate check plain/dir"
    monkeypatch.chdir(tmp_path)
    folder = make_dataset(tmp_path / "no masks", n=2).root.resolve()
    for args in (["groups", "no masks"], ["audit", "no masks", "--measure"], ["info", "no masks/media"]):
        result = runner.invoke(main, args)
        commands = re.findall(r"`(curate [^`]+)`", result.output)
        assert commands, (args, result.output)
        for command in commands:  # the folder, as typed or absolute, or a folder inside it
            path = Path(shlex.split(command)[2]).resolve()
            assert path == folder or folder in path.parents, (args, command)
    verbs = "|".join(sorted(COMMANDS, key=len, reverse=True))
    unquoted = re.compile(rf"\bcurate (?:{verbs})\b[^`;:()\n]*\x00")
    offenders = []
    for path in sorted(Path(curate.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "\x00" for v in node.values)
                if unquoted.search(text):
                    offenders.append(f"{path.relative_to(Path(curate.__file__).parent)}:{node.lineno}")
    assert not offenders, offenders
