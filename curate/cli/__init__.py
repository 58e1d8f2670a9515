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

import contextlib
import importlib
import inspect
import logging
import os
import pkgutil
import re
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from curate import __version__
from curate.shell import quote

console = Console()
err_console = Console(stderr=True)
logger = logging.getLogger("curate")


#: Verb -> the modules of this package that define it and its subcommands (imported on first use).
COMMANDS: dict[str, tuple[str, ...]] = {
    "annotator-spread": ("annotators",), "simulate-annotators": ("annotators",),
    "agreement": ("agreement",), "audit": ("audit",), "check": ("dataset",), "collect": ("collect", "collect_sources", "webdataset", "collect_hub",
                "collect_fiftyone"),
    "compare": ("evaluate",), "create": ("dataset",), "demo": ("demo",), "discover": ("discover",),
    "groups": ("discover",), "accept-group": ("discover",), "reject-group": ("discover",), "evaluate": ("evaluate",),
    "attribution": ("interventions",), "explain": ("explain",), "export": ("split",), "fidelity": ("fidelity",),
    "info": ("dataset",), "intervene": ("interventions",),
    "label-backgrounds": ("split",), "models": ("models",), "plan": ("plan",), "propose-masks": ("masks",), "publish": ("publish",), "report": ("publish",),
    "review": ("review", "discover"), "split": ("split",), "train-reference": ("models",), "vlm-explain": ("vlm",),
    "vlm-quality": ("vlm",),
}


def summary(command: click.Command) -> str:
    """The line of ``command`` in its group's command list: its ``short_help``, else the first
    paragraph of its docstring (one sentence in every curate verb), whole."""
    if command.short_help:
        return inspect.cleandoc(command.short_help)
    words = inspect.cleandoc(command.help or "").partition("\n\n")[0].split()
    return " ".join(words[1:] if words[:1] == ["\b"] else words)


class HelpGroup(click.Group):
    """A group whose ``--help`` lists each command with its whole summary (:func:`summary`), wrapped
    by click's formatter, where click would cut it at 45 characters with "..."."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, summary(command)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


#: Python advice in library messages -> what to type at the CLI (the library keeps its own wording).
#: Each left side is a regular expression; on the right, ``{dir}`` is the dataset folder the message
#: names (:func:`_named_folder`), shell-quoted, and ``\1`` ... are the expression's groups.
CLI_ADVICE: tuple[tuple[str, str], ...] = (
    (r"curate\.store\.check_dataset\(root\)", "`curate check {dir}`"),
    (r"run check_dataset\((['\"]).*?\1\)", "run `curate check {dir}`"),
    (r"check_dataset\(\) says", "`curate check {dir}` says"),
    (r"make one with Dataset\.create", "make one with `curate create {dir}`"),
    (r"open it with Dataset\.open\(root\) or pass exist_ok=True",
     "see what it holds with `curate info {dir}`, or choose another folder"),
    (r"load_model\(name, pretrained=\"/path/to/weights\"\)", "--pretrained /path/to/weights"),
    (r"pass e\.g\. load_model\('curate-tiny-clip', 'ref\.pt'\)", "pass e.g. --model curate-tiny-clip --pretrained ref.pt"),
    (r"pretrained=None for random weights", "--pretrained none for random weights"),
    (r"\bpretrained=('[^']*'|\"[^\"]*\")", r"--pretrained \1"),
    (r"pass it as a path \('(.+?)'\) or a pathlib\.Path", r"pass it as a path (--pretrained \1)"),
    (r"load '([^']+)' with pretrained '([^']+)'", r"type --model \1 --pretrained \2"),
    (r"or the zoo name '([^']+)'", r"or --model \1"),
    (r" \((?:allow_model_masks|allow_model_backgrounds|allow_restricted)=True\)", ""),
)

#: Where a library message names its dataset folder (the first that matches gives ``{dir}``).
_FOLDER_IN_MESSAGE = (
    r"dataset at (.+?) is invalid",
    r"check_dataset\((?:['\"])(.+?)(?:['\"])\)",
    r"is missing: (.+?) is not a curate dataset",
    r"^(.+?) is not a curate dataset",
    r"^(.+?) already holds a dataset",
    r"^(.+?)[/\\]dataset\.yaml was damaged",
)


def _named_folder(message: str) -> str:
    for pattern in _FOLDER_IN_MESSAGE:
        match = re.search(pattern, message, re.MULTILINE)
        if match:
            return quote(match.group(1))
    return "DIR"


def cli_advice(message: str) -> str:
    """``message`` with its Python advice (``Dataset.create``, ``exist_ok=True``, ``load_model(...)``,
    ``check_dataset(...)`` ...) replaced by the command to type (:data:`CLI_ADVICE`)."""
    folder = _named_folder(message)
    for pattern, replacement in CLI_ADVICE:
        template = replacement.replace("{dir}", folder.replace("\\", "\\\\"))
        message = re.sub(pattern, lambda m, t=template: m.expand(t), message)
    return message


def one_line(text: str) -> str:
    """``text`` on one line: its lines stripped and joined by ``; `` (by a space after a line that
    ends with ``:``, which introduces the next)."""
    joined = ""
    for line in (part.strip() for part in text.splitlines()):
        if line:
            joined = f"{joined}{' ' if joined.endswith(':') else '; '}{line}" if joined else line
    return joined


def error_line(error: BaseException) -> str:
    """What the CLI prints for a library error: its message in the CLI's words (:func:`cli_advice`),
    on one line (:func:`one_line`). An invalid dataset folder (a ``DatasetError`` with
    ``problems``) names its first problem and counts the others, which ``curate check`` lists."""
    from curate.store import DatasetError

    text = getattr(error, "headline", None) or str(error)  # an error with details: its first line only
    if isinstance(error, DatasetError) and error.problems and "\n" in text:
        lines, more = text.splitlines(), len(error.problems) - 1
        text = f"{lines[0]} {error.problems[0]}{f' (and {more} more)' if more else ''}. {lines[-1].strip()}"
    return one_line(cli_advice(text)) or type(error).__name__


def print_error(message: str, details: list[str] | tuple[str, ...] = ()) -> None:
    """Print an error as the CLI prints every error, library or usage: ``error: <message>`` on
    stderr, one line (:func:`one_line`); ``details`` (an error's ``details``: where curate looked,
    how to fix it) each on its own line below it, in the CLI's words (:func:`cli_advice`)."""
    console = _console(stderr=True)
    console.print("[bold red]error:[/] ", end="")
    console.print(one_line(message), markup=False, highlight=False)
    for line in details:
        console.print(cli_advice(line), markup=False, highlight=False, soft_wrap=True)


def _ours(category: type, filename: str) -> bool:
    """Whether a warning is curate's: its class is defined in curate, or curate's code raised it."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return category.__module__.split(".")[0] == "curate" or os.path.abspath(filename).startswith(package + os.sep)


@contextlib.contextmanager
def curate_warnings() -> Any:
    """While a verb runs, curate's own warnings (:func:`_ours`; e.g. ``QuickGELUWarning``) print as
    one line, ``warning: <message>`` in the CLI's words (:func:`cli_advice`), on stderr, nothing
    under ``--quiet``; any other library's warnings keep Python's form."""
    import warnings

    python_form = warnings.showwarning

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if not _ours(category, filename):
            python_form(message, category, filename, lineno, file, line)
        elif not _quiet:
            console = _console(stderr=True)
            console.print("[yellow]warning:[/] ", end="")
            console.print(one_line(cli_advice(str(message))), markup=False, highlight=False)

    warnings.showwarning = show
    try:
        yield
    finally:
        if warnings.showwarning is show:
            warnings.showwarning = python_form


def _show_click_error(error: click.ClickException) -> None:
    """Click's report of a usage error (the usage line and the help hint), with the message
    written by :func:`print_error` where click writes ``Error: <message>``."""
    ctx = getattr(error, "ctx", None)
    if isinstance(error, click.UsageError) and ctx is not None:
        hint = ""
        if ctx.command.get_help_option(ctx) is not None:
            hint = f"Try '{ctx.command_path} {max(ctx.command.get_help_option_names(ctx), key=len)}' for help.\n"
        click.echo(f"{ctx.get_usage()}\n{hint}", err=True, color=ctx.color)
    print_error(error.format_message())


def _in_one_form(error: click.ClickException) -> None:
    """Let click show ``error`` by :func:`_show_click_error` where it would print ``Error:`` (an
    exception that shows itself another way, e.g. help for a bare group, is left alone)."""
    if type(error).show in (click.ClickException.show, click.UsageError.show):
        error.show = lambda file=None: _show_click_error(error)  # type: ignore[method-assign]


class CurateGroup(HelpGroup):
    """Loads each verb's module on first use (:data:`COMMANDS`); turns library errors into a
    one-line message and exit code 1: ``error: <message>`` in the CLI's words (:func:`error_line`;
    ``-v`` adds the exception's class, ``--debug`` re-raises). Click's own errors (usage, bad
    values; exit code 2) say ``error:`` too: :func:`print_error` writes both."""

    group_class = HelpGroup  # `@main.group()` subgroups (collect, review) list their commands whole too

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for module in COMMANDS.get(cmd_name, ()) if cmd_name not in self.commands else ():
            importlib.import_module(f"{__name__}.{module}")
        return super().get_command(ctx, cmd_name)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as error:  # curate's own options (`curate --nope`)
            _in_one_form(error)
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with curate_warnings():
                return super().invoke(ctx)
        except click.ClickException as error:  # a verb's options and arguments, or the verb's name
            _in_one_form(error)
            raise
        except (click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as error:  # noqa: BLE001 - the CLI boundary
            if ctx.obj and ctx.obj.get("debug"):
                raise
            message = error_line(error)
            if ctx.obj and ctx.obj.get("verbose"):
                message = f"{type(error).__name__}: {message}"
            details = getattr(error, "details", None)
            print_error(message, [str(d) for d in details] if isinstance(details, (list, tuple)) else ())
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
    ctx.obj["verbose"] = verbose
    level = logging.ERROR if quiet else logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", force=True)


#: Width of tables written to a pipe or a file (rich would cut them at 80 columns).
PIPE_WIDTH = 240
_quiet = False


def _console(stderr: bool = False) -> Console:
    """A console that wraps softly; on a pipe or file, wide enough that tables are not truncated
    (``COLUMNS`` still wins when set)."""
    probe = Console(stderr=stderr)
    width = None if probe.is_terminal or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(stderr=stderr, soft_wrap=True, width=width)


def out() -> Console:
    """The console for results (stdout)."""
    return console


def err() -> Console:
    """The console for progress and messages (stderr)."""
    return err_console


def shown(path: str | os.PathLike) -> Path:
    """How the CLI prints a path: absolute and without ``..`` (``os.path.abspath``: symlinks are kept
    as typed), then relative to the working directory when it lies inside it."""
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(Path.cwd())
    except ValueError:
        return absolute


#: Seconds between the plain progress lines written where stderr is not a terminal (a log file, a pipe).
PLAIN_EVERY_S = 30


def progress():
    """A rich progress bar on stderr (counts, elapsed time) for long work; hidden with ``--quiet``.

    Where stderr is not a terminal (output to a log file) it draws no bar; it prints a line
    ``<phase>: done/total (rate/s, ETA mm:ss)`` at least every :data:`PLAIN_EVERY_S` seconds of a
    phase and ``<phase>: n/n done in mm:ss (rate/s)`` when the phase ends; a phase still short of
    its total when the bar stops closes with ``<phase>: done/total stopped after mm:ss``, never
    "done". A rate under 0.1/s is shown per minute (``0.13/min``), never as ``0.00/s``.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    class Bar(Progress):
        def __init__(self, *args: Any, plain: bool, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.plain = plain
            self.clocks: dict[Any, list[float]] = {}  # task -> [phase start, last line, last done]
            self.ended: dict[Any, bool] = {}  # task -> its closing line is printed (True: it reached its total)
            self.last = time.monotonic()  # the last progress event: where the next new phase's work began

        def add_task(self, *args: Any, **kwargs: Any) -> Any:
            task_id = super().add_task(*args, **kwargs)
            if self.plain:  # its clock starts at the last event: a stage often reports a phase first when a batch ends
                self.clocks[task_id] = [self.last, time.monotonic(), self._tasks[task_id].completed]
            return task_id

        def update(self, task_id: Any, **kwargs: Any) -> None:
            super().update(task_id, **kwargs)
            if self.plain:
                self._tick(task_id)

        def advance(self, task_id: Any, advance: float = 1) -> None:
            super().advance(task_id, advance)
            if self.plain:
                self._tick(task_id)

        def end_task(self, task_id: Any) -> None:
            """The phase of ``task_id`` is over: its one closing line (plain mode), "done in" when it
            reached its total (or has none), "stopped after" when it is short of it."""
            if self.plain and task_id in self.clocks and task_id not in self.ended:
                task = self._tasks[task_id]
                finished = task.total is None or task.completed >= task.total
                self.ended[task_id] = finished
                elapsed = time.monotonic() - self.clocks[task_id][0]
                self._line(f"{task.description}: {_count(task.completed, task.total)} "
                           f"{'done in' if finished else 'stopped after'} {_clock(elapsed)} "
                           f"({_rate(task.completed, elapsed)})")

        def stop(self) -> None:
            for task_id in list(self.clocks):
                self.end_task(task_id)
            super().stop()

        def _tick(self, task_id: Any) -> None:
            task, now = self._tasks[task_id], time.monotonic()
            self.last = now
            clock = self.clocks.setdefault(task_id, [now, now, task.completed])
            if task.completed < clock[2]:  # the phase starts again (the next model, ...)
                clock[0] = clock[1] = now
            clock[2] = task.completed
            finished = task.total is not None and task.completed >= task.total
            if not (finished and self.ended.get(task_id)):
                self.ended.pop(task_id, None)  # it goes on (or reaches its total after stopping): it closes again
            if finished:
                self.end_task(task_id)
                return
            if now - clock[1] >= PLAIN_EVERY_S:
                clock[1] = now
                elapsed = now - clock[0]
                rate = task.completed / elapsed if elapsed > 0 else 0.0
                eta = ""
                if task.total is not None:
                    eta = f", ETA {_clock((task.total - task.completed) / rate)}" if rate > 0 else ", ETA --:--"
                self._line(f"{task.description}: {_count(task.completed, task.total)} "
                           f"({_rate(task.completed, elapsed)}{eta})")

        def _line(self, text: str) -> None:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    plain = not _quiet and not err_console.is_terminal
    return Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               console=err_console, transient=False, disable=_quiet or plain, plain=plain)


def _count(done: float, total: float | None) -> str:
    def number(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else f"{x:.1f}"

    return number(done) if total is None else f"{number(done)}/{number(total)}"


def _rate(done: float, seconds: float) -> str:
    """``done`` per second with its unit (``12.5/s``), per minute below 0.1/s (``0.13/min``)."""
    rate = done / seconds if seconds > 0 else 0.0
    unit = "/s"
    if 0 < rate < 0.1:
        rate, unit = rate * 60, "/min"
    text = f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 1 else f"{rate:.2g}" if rate else "0"
    return text + unit


def _clock(seconds: float) -> str:
    hours, rest = divmod(int(seconds + 0.5), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class StageProgress:
    """Adapts a rich :func:`progress` bar to :class:`curate.progress.Progress`: one bar per phase.

    Where stderr is a log file, a phase with a total closes (its one closing line) when it reaches
    it: a phase another one interrupts stays open (stages interleave phases, and a phase left at
    1/3 is not done), and one still short of its total when the bar stops says "stopped after".
    A phase without a total closes when the next phase begins.
    """

    def __init__(self, bar) -> None:
        self.bar = bar
        self.tasks: dict[str, Any] = {}
        self.totals: dict[str, int | None] = {}
        self.current: str | None = None

    def __call__(self, done: int, total: int | None, message: str = "") -> None:
        key = message or "working"
        if (key != self.current and self.current is not None and self.totals[self.current] is None
                and hasattr(self.bar, "end_task")):
            self.bar.end_task(self.tasks[self.current])
        self.current = key
        self.totals[key] = total
        if key not in self.tasks:
            self.tasks[key] = self.bar.add_task(key, total=total)
        self.bar.update(self.tasks[key], completed=done, total=total)


def load_all_commands() -> None:
    """Import every command module of this package (each registers its verbs on ``main``)."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
