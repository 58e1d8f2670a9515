"""The ``curate`` command line: a thin shell over library calls.

Every verb parses its options, calls one library function and renders the result (rich
tables, progress bars). Errors from the library (bad input, damaged folders, missing weights)
are shown as one clear message and a non-zero exit, not a traceback; ``--debug`` shows it.

Layout: this module holds the ``main`` group and shared helpers (:func:`out`, :func:`err`,
:func:`progress`); each verb or group of verbs lives in its own module of this package
(``dataset``, ``collect``, ``models``, ``demo``, ...). :data:`COMMANDS` names the module(s)
of each verb, which are imported when the verb is used (``curate evaluate`` imports the evaluate
module only: a re-score is then about 0.1 s faster), and all of them for ``curate --help``. A new
stage adds a module and one line there (tests/test_cli.py checks that the table is complete).
"""
from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
from typing import Any

import click
from rich.console import Console

from curate import __version__

console = Console()
err_console = Console(stderr=True)
logger = logging.getLogger("curate")


#: Verb -> the modules of this package that define it and its subcommands (imported on first use).
COMMANDS: dict[str, tuple[str, ...]] = {
    "audit": ("audit",), "check": ("dataset",), "collect": ("collect", "collect_sources", "webdataset"),
    "compare": ("evaluate",), "create": ("dataset",), "demo": ("demo",), "evaluate": ("evaluate",),
    "attribution": ("interventions",), "explain": ("explain",), "export": ("split",), "fidelity": ("fidelity",),
    "info": ("dataset",), "intervene": ("interventions",),
    "label-backgrounds": ("split",), "models": ("models",), "propose-masks": ("masks",), "publish": ("publish",), "report": ("publish",),
    "review": ("review",), "split": ("split",), "train-reference": ("models",), "vlm-explain": ("vlm",),
    "vlm-quality": ("vlm",),
}


class CurateGroup(click.Group):
    """Loads each verb's module on first use (:data:`COMMANDS`); turns library errors into a
    one-line message and exit code 1 (``--debug`` re-raises)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for module in COMMANDS.get(cmd_name, ()) if cmd_name not in self.commands else ():
            importlib.import_module(f"{__name__}.{module}")
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as error:  # noqa: BLE001 - the CLI boundary
            if ctx.obj and ctx.obj.get("debug"):
                raise
            err_console.print(f"[bold red]error:[/] {type(error).__name__}: {error}")
            sys.exit(1)


@click.group(cls=CurateGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="curate")
@click.option("--debug", is_flag=True, help="Show full tracebacks.")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only results and errors: no progress bars, no warnings.")
@click.pass_context
def main(ctx: click.Context, debug: bool, verbose: int, quiet: bool) -> None:
    """Build and score CounterAnimal-style spurious-feature benchmarks."""
    global console, err_console, _quiet
    # made per invocation so COLUMNS and the terminal are read now (tests set them per run)
    console, err_console = _console(), _console(stderr=True)
    _quiet = quiet
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    level = logging.ERROR if quiet else logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", force=True)


#: Width of tables written to a pipe or a file (rich would cut them at 80 columns).
PIPE_WIDTH = 240
_quiet = False


def _console(stderr: bool = False) -> Console:
    """A console that wraps softly; on a pipe or file, wide enough that tables are not truncated
    (``COLUMNS`` still wins when set)."""
    import os

    probe = Console(stderr=stderr)
    width = None if probe.is_terminal or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(stderr=stderr, soft_wrap=True, width=width)


def out() -> Console:
    """The console for results (stdout)."""
    return console


def err() -> Console:
    """The console for progress and messages (stderr)."""
    return err_console


def progress():
    """A rich progress bar on stderr (counts, elapsed time) for long work; hidden with ``--quiet``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err_console, transient=False, disable=_quiet)


class StageProgress:
    """Adapts a rich :func:`progress` bar to :class:`curate.progress.Progress`: one bar per phase."""

    def __init__(self, bar) -> None:
        self.bar = bar
        self.tasks: dict[str, Any] = {}

    def __call__(self, done: int, total: int | None, message: str = "") -> None:
        key = message or "working"
        if key not in self.tasks:
            self.tasks[key] = self.bar.add_task(key, total=total)
        self.bar.update(self.tasks[key], completed=done, total=total)


def load_all_commands() -> None:
    """Import every command module of this package (each registers its verbs on ``main``)."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
