"""The CLI as a user runs it: create, collect synthetic, info, check, train-reference, models."""
from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from curate.cli import main


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
