"""The CLI as a new user meets it (issue 28): `~` in paths, printed paths, error wording, `--help`,
progress in a log file, evaluate's header without a split."""
from __future__ import annotations

import io
import os
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from eval_helpers import make_folder
from progress_helpers import assert_closing_lines_full
from publish_helpers import make_dataset, write_eval_run
from rich.console import Console

import curate.cli as cli
from curate.cli import main


@pytest.fixture()
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200"})


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    """HOME is a fresh folder; the working directory is another one (where a stray `~` would land)."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    return home


# 1. `~` in every path option and argument ---------------------------------------------------------

def test_tilde_in_output_options_means_home(tmp_path, home, runner) -> None:
    ds = make_dataset(tmp_path / "world")
    for name, model, easy, hard in (("eval-a", "model-a", 0.9, 0.4), ("eval-b", "model-b", 0.8, 0.45)):
        write_eval_run(ds, name, model, easy, hard)
    result = runner.invoke(main, ["report", str(ds.root), "--out=~/rep", "--gallery", "0"])
    assert result.exit_code == 0, result.output
    assert (home / "rep" / "report.md").is_file()
    result = runner.invoke(main, ["compare", str(ds.root), "--out", "~/cmp"])
    assert result.exit_code == 0, result.output
    assert (home / "cmp" / "compare.md").is_file()
    result = runner.invoke(main, ["export", str(ds.root), "~/released"])
    assert result.exit_code == 0, result.output
    assert (home / "released" / "metadata.csv").is_file()
    assert not Path("~").exists(), "a folder named ~ was made in the working directory"
    # an input argument too: the dataset itself named from HOME
    result = runner.invoke(main, ["check", "~/../world"])
    assert result.exit_code == 0, result.output


def test_every_path_parameter_expands_tilde() -> None:
    """Every click.Path parameter of the CLI is a UserPath (expands `~`)."""
    from curate.cli.options import UserPath

    cli.load_all_commands()
    ctx = click.Context(main)
    missing = []

    def walk(group: click.Group, prefix: str) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if isinstance(command, click.Group):
                walk(command, f"{prefix}{name} ")
                continue
            for param in command.params:
                if isinstance(param.type, click.Path) and not isinstance(param.type, UserPath):
                    missing.append(f"{prefix}{name} {param.name}")

    walk(main, "")
    assert not missing, missing


# 2. printed paths carry no `..` ------------------------------------------------------------------

def test_printed_paths_are_resolved(tmp_path, runner, monkeypatch) -> None:
    ds = make_dataset(tmp_path / "world", split_run=False)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, ["report", "sub/../world", "--gallery", "0"])
    assert result.exit_code == 0, result.output
    assert ".." not in result.output
    assert f"wrote {Path('world', 'runs', 'report', 'report.md')}" in result.output
    assert ds.root.exists()
    assert cli.shown(tmp_path / "sub" / ".." / "world") == Path("world")
    assert cli.shown(tmp_path.parent / "x" / ".." / "y") == tmp_path.parent / "y"  # outside cwd: absolute


# 3. errors: no class name, CLI advice ------------------------------------------------------------

def test_error_of_a_folder_that_is_no_dataset_names_cli_verbs(tmp_path, runner, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("empty").mkdir()
    result = runner.invoke(main, ["info", "empty"])
    assert result.exit_code == 1
    assert "error: dataset at empty is invalid" in result.output
    assert "DatasetError" not in result.output
    assert "curate check empty" in result.output and "curate create empty" in result.output
    for python in ("check_dataset(", "Dataset.create", "curate.store"):
        assert python not in result.output
    result = runner.invoke(main, ["check", "empty"])  # the check verb's own list says it the CLI way too
    assert "Dataset.create" not in result.output and "curate create empty" in result.output
    make_folder(tmp_path / "ds")
    result = runner.invoke(main, ["create", "ds"])
    assert result.exit_code == 1 and "exist_ok" not in result.output and "Dataset.open" not in result.output
    assert "curate info ds" in result.output
    result = runner.invoke(main, ["-v", "info", "empty"])  # -v keeps the class name
    assert "error: DatasetError: dataset at empty" in result.output


def test_error_of_missing_weights_says_pretrained_file(tmp_path, runner, monkeypatch) -> None:
    monkeypatch.setenv("CURATE_WEIGHTS_DIR", str(tmp_path / "w"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ds = make_folder(tmp_path / "ds", per_class=2)
    result = runner.invoke(main, ["-q", "evaluate", str(ds.root), "--model", "curate-tiny-vit",
                                  "--pretrained", str(tmp_path / "nope.pt")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "error: weights file" in result.output and "WeightsNotFoundError" not in result.output
    result = runner.invoke(main, ["-q", "evaluate", str(ds.root), "--model", "CLIP-LAION400M-ViT-B/32"])
    assert result.exit_code == 1 and "WeightsNotFoundError" not in result.output
    assert "error: weights for open_clip" in result.output
    assert "load_model(" not in result.output and "--pretrained /path/to/weights" in result.output


def test_cli_advice_table() -> None:
    advice = cli.cli_advice
    assert advice("x is not a curate dataset (make one with Dataset.create)") == \
        "x is not a curate dataset (make one with `curate create x`)"
    assert "run `curate check 'my world'`" in advice("my world/samples.parquet cannot be read any more (gone); "
                                                     "run check_dataset('my world')")
    assert advice("weird: pretrained=None for random weights") == "weird: --pretrained none for random weights"
    assert advice("names the tag 'a1' but pretrained='b2'; give the tag once (pretrained='default' uses it)") == \
        "names the tag 'a1' but --pretrained 'b2'; give the tag once (--pretrained 'default' uses it)"
    assert "allow_model_masks" not in advice("or pass --allow-model-masks (allow_model_masks=True) to use them")
    assert advice("nothing to translate") == "nothing to translate"


# 4. `curate --help` shows each summary in full ---------------------------------------------------

def test_help_shows_every_summary_in_full(runner) -> None:
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    flat = " ".join(result.output.split())
    assert "Propose an object mask per photo (models propose, people verify in `curate review`)." in flat
    assert "Table 2 (model, easy, hard, drop, effective robustness) and the Fig. 2 scatter over runs." in flat
    commands = result.output.partition("Commands:")[2]
    assert commands.count("\n") > 20 and not re.search(r"\.\.\.\s*$", commands, re.MULTILINE), result.output
    result = runner.invoke(main, ["review", "--help"])  # subgroups too
    commands = result.output.partition("Commands:")[2]
    assert commands.strip() and not re.search(r"\.\.\.\s*$", commands, re.MULTILINE), result.output
    assert "Push DIR into a persistent FiftyOne dataset with saved views for the review tasks." in \
        " ".join(result.output.split())


# 5. progress lines when stderr is not a terminal --------------------------------------------------

def _bar_on(monkeypatch, *, terminal: bool, quiet: bool = False) -> io.StringIO:
    buffer = io.StringIO()
    monkeypatch.setattr(cli, "err_console", Console(file=buffer, width=200, force_terminal=terminal))
    monkeypatch.setattr(cli, "_quiet", quiet)
    return buffer


def test_stage_progress_prints_plain_lines_without_a_terminal(monkeypatch) -> None:
    monkeypatch.setattr(cli, "PLAIN_EVERY_S", 0)
    buffer = _bar_on(monkeypatch, terminal=False)
    with cli.progress() as bar:
        stage = cli.StageProgress(bar)
        for done in (1, 2, 3):
            stage(done, 3, "encoding images")
        stage(5, None, "scoring")
        stage(1, 2, "writing")  # a new phase ends the one before
    lines = buffer.getvalue().splitlines()
    assert re.fullmatch(r"encoding images: 1/3 \([\d.]+/s, ETA \d\d:\d\d\)", lines[0]), lines
    assert re.fullmatch(r"encoding images: 2/3 \([\d.]+/s, ETA \d\d:\d\d\)", lines[1]), lines
    assert re.fullmatch(r"encoding images: 3/3 done in \d\d:\d\d \([\d.]+/s\)", lines[2]), lines  # the phase ends
    assert sum("encoding images: 3/3 done" in line for line in lines) == 1
    assert re.fullmatch(r"scoring: 5 \([\d.]+/s\)", lines[3]), lines
    assert re.fullmatch(r"scoring: 5 done in \d\d:\d\d \([\d.]+/s\)", lines[4]), lines
    assert re.fullmatch(r"writing: 1/2 \([\d.]+/s, ETA \d\d:\d\d\)", lines[5]), lines
    assert re.fullmatch(r"writing: 1/2 stopped after \d\d:\d\d \([\d.]+/s\)", lines[6]), lines  # not done: exit
    assert len(lines) == 7, lines
    assert "━" not in buffer.getvalue()  # no bar drawn into the log


class Clock:
    """A stand-in for :mod:`time` in curate.cli: ``monotonic()`` is what the test sets."""

    now = 0.0

    @classmethod
    def monotonic(cls) -> float:
        return cls.now


def test_stage_progress_says_done_only_at_n_of_n_and_no_zero_rate(monkeypatch) -> None:
    """The tour's fidelity log said `fine-tuning: 1/3 (0.00/s, ETA 15:41)` and `fine-tuning: 1/3 done in
    07:51` when the stage turned to scoring. A phase left unfinished for another is not closed; it
    closes when it reaches n/n; a slow rate is shown per minute; a phase first reported at its end
    is timed from the event before it (split's `encoding images: 120/120 done in 00:00 (3886136/s)`);
    the rich bar ends at n/n too."""
    monkeypatch.setattr(cli, "PLAIN_EVERY_S", 0)
    monkeypatch.setattr(cli, "time", Clock)
    buffer = _bar_on(monkeypatch, terminal=False)
    with cli.progress() as bar:
        stage = cli.StageProgress(bar)
        stage(0, 3, "fine-tuning")
        Clock.now = 471.0
        stage(1, 3, "fine-tuning")
        Clock.now = 501.0
        stage(1, 1, "scoring")  # interleaved: fine-tuning is not over; scoring's first report came as it ended
        Clock.now = 942.0
        stage(3, 3, "fine-tuning")  # back to it: it ends now
    lines = buffer.getvalue().splitlines()
    assert lines[1] == "fine-tuning: 1/3 (0.13/min, ETA 15:42)", lines
    assert not any(line.startswith("fine-tuning: 1/3 done") for line in lines), lines
    assert assert_closing_lines_full(buffer.getvalue()) == {"scoring": (1, 1), "fine-tuning": (3, 3)}
    assert lines[-2] == "scoring: 1/1 done in 00:30 (2.0/min)", lines  # timed from the event before it
    assert lines[-1] == "fine-tuning: 3/3 done in 15:42 (0.19/min)", lines
    buffer = _bar_on(monkeypatch, terminal=True)
    with cli.progress() as bar:
        stage = cli.StageProgress(bar)
        stage(1, 3, "fine-tuning")
        stage(3, 3, "fine-tuning")
    assert "fine-tuning" in buffer.getvalue() and "3/3" in buffer.getvalue().rsplit("fine-tuning", 1)[1]


def test_stage_progress_is_quiet_between_intervals_and_with_a_terminal(monkeypatch) -> None:
    buffer = _bar_on(monkeypatch, terminal=False)  # PLAIN_EVERY_S = 30: a quick phase prints its end only
    with cli.progress() as bar:
        stage = cli.StageProgress(bar)
        for done in range(1, 11):
            stage(done, 10, "encoding images")
    assert [line.split(" done")[0] for line in buffer.getvalue().splitlines()] == ["encoding images: 10/10"]
    monkeypatch.setattr(cli, "PLAIN_EVERY_S", 0)
    buffer = _bar_on(monkeypatch, terminal=True)
    with cli.progress() as bar:
        cli.StageProgress(bar)(1, 2, "encoding images")
    assert "encoding images: 1/2 (" not in buffer.getvalue()  # the rich bar, not plain lines
    buffer = _bar_on(monkeypatch, terminal=False, quiet=True)
    with cli.progress() as bar:
        cli.StageProgress(bar)(1, 2, "encoding images")
    assert buffer.getvalue() == ""


@pytest.fixture()
def masked_world(tmp_path) -> Path:
    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, assign_truth_groups, collect_synthetic

    ds = collect_synthetic(tmp_path / "world", WorldSpec(classes=DEFAULT_CLASSES[:2], per_class=4, p=0.5, seed=1,
                                                         image_size=32))
    assign_truth_groups(ds)
    return ds.root


def test_a_logged_cli_run_prints_progress_lines(masked_world, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cli, "PLAIN_EVERY_S", 0)
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(main, ["intervene", str(masked_world), "--out", str(tmp_path / "out"),
                                  "--variants", "swap"])
    assert result.exit_code == 0, result.output
    assert re.search(r"^[a-z][\w ]*: \d+/\d+ \([\d.]+/s, ETA \d\d:\d\d\)$", result.stderr, re.MULTILINE), result.stderr
    assert re.search(r"^[a-z][\w ]*: \d+(/\d+)? done in \d\d:\d\d", result.stderr, re.MULTILINE), result.stderr
    assert " done in " not in result.stdout
    result = runner.invoke(main, ["-q", "intervene", str(masked_world), "--out", str(tmp_path / "out2"),
                                  "--variants", "swap"])
    assert result.exit_code == 0, result.output
    assert "/s" not in result.stderr


# 6. evaluate's header on a folder without a split -------------------------------------------------

def test_evaluate_header_without_a_split(tmp_path, runner, monkeypatch) -> None:
    ds = make_folder(tmp_path / "ds", per_class=2)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, ["-q", "evaluate", "sub/../ds", "--model", "curate-tiny-vit", "--pretrained", "none",
                                  "--bootstrap", "10", "--run-name", "t"])
    assert result.exit_code == 0, result.output
    assert "reference model" not in result.output
    assert "no `curate split` run" in " ".join(result.output.split())
    assert f"{Path('ds', 'runs', 't')} (" in result.output and ".." not in result.output  # printed resolved
    assert ds.root.exists()
    bare = make_folder(tmp_path / "bare", per_class=2, with_groups=False)
    result = runner.invoke(main, ["-q", "evaluate", str(bare.root), "--model", "curate-tiny-vit", "--pretrained", "none",
                                  "--bootstrap", "10"])
    assert result.exit_code == 0, result.output
    assert "reference model" not in result.output and "drop in points" not in result.output
    assert "no easy/hard groups" in " ".join(result.output.split())
    assert os.sep + ".." not in result.output
