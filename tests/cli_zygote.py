"""Run ``curate`` command lines each in a new process, without each paying the imports again (issue 42).

A ``curate`` process that loads a model spends about 5.5 s of CPU importing torch, torchvision
(which imports ``torch._dynamo``), open_clip (which imports transformers) and timm before it does
anything (measured, ``curate split`` profiled: 6.3 of its 7.5 s). The docs' offline blocks run
dozens of such lines. A :class:`Zygote` is one Python process started with the environment the
lines get (``HOME``, ``COLUMNS``, the thread counts): it imports curate's CLI, every verb's module
and the libraries they load, then, for each line, ``fork``\\ s a child that changes to the line's
folder, sets the line's environment, points its stdin at ``/dev/null`` and its stdout and stderr at
files, and calls ``curate.cli.main`` with the line's arguments, exactly as the ``curate`` console
script does (``pyproject.toml``: ``curate = "curate.cli:main"``). The child exits with the verb's
exit status after the ``atexit`` handlers and a flush of its output, as a normal exit does, but
without tearing down the imported modules: in a forked child that teardown writes to every page
the parent imported, and copying them cost 1-2 s a line (measured: ``curate models`` took 1.5 s
forked against 0.13 s fresh until then). The parent calls ``gc.freeze()`` for the same reason.

So each line still runs in a process of its own, from a state in which nothing but imports has
happened, and shares nothing with the lines before it but what they wrote to disk. What it does not
exercise is the console script's own two-line wrapper and a shell: ``tests/test_cli.py`` and
``tests/test_packaging.py`` run the installed ``curate`` script, and a line with shell syntax
(:func:`needs_a_shell`: ``~``, ``$``, globs, pipes, redirections) is run by ``bash -c`` as before.

Import-time reads of the environment are the one way the parent could differ from a fresh process;
that is why a zygote is started with the same environment its lines get, and why :meth:`Zygote.run`
refuses a line whose environment differs from the zygote's (run such a line with ``bash -c``).
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

#: What the zygote imports before it forks: every verb's module and the libraries the model-loading
#: verbs import (the CLI imports a verb's module only when the verb runs).
PRELOAD = ("numpy", "torch", "torchvision", "open_clip", "timm", "PIL.Image", "pyarrow", "pyarrow.parquet",
           "curate.cli", "curate.models")

_SERVER = r"""
import importlib, json, os, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
import atexit, gc, traceback
from curate.cli import load_all_commands, main
load_all_commands()
gc.freeze()  # the children's collections then skip what was imported here (no copy-on-write of its pages)
requests, replies = sys.stdin.buffer, sys.stdout
child = None
for line in requests:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child = request
        break
    replies.write(json.dumps({"pid": pid}) + "\n"); replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n"); replies.flush()
if child is None:
    sys.exit(0)
os.chdir(child["cwd"])
os.environ.clear(); os.environ.update(child["env"]); os.environ.update(child["runtime_env"])
null = os.open(os.devnull, os.O_RDONLY); os.dup2(null, 0); os.close(null)
for fd, path in ((1, child["stdout"]), (2, child["stderr"])):
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600); os.dup2(out, fd); os.close(out)
sys.argv = ["curate", *child["argv"]]
try:
    if child["code"] is None:
        main(args=child["argv"], prog_name="curate")
    else:  # as `python -c CODE ARGV...` would run it
        sys.argv = ["-c", *child["argv"]]
        exec(compile(child["code"], "<string>", "exec"), {"__name__": "__main__"})
    code = 0
except SystemExit as stop:  # what the interpreter does with it
    code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    if not isinstance(stop.code, (int, type(None))):
        print(stop.code, file=sys.stderr)
except BaseException:
    traceback.print_exc()
    code = 1
atexit._run_exitfuncs()  # a normal exit's handlers; then no teardown of the imported modules, whose pages
sys.stdout.flush(); sys.stderr.flush()  # a fresh process would not have to copy first (measured: 1-2 s a line)
os._exit(code)
"""

#: Characters a shell would act on outside single quotes: such a line goes to ``bash -c``.
_SHELL = re.compile(r"[~$*?|&;<>()`{}\[\]!#\\\"]")


def needs_a_shell(line: str) -> bool:
    """True when ``line`` uses shell syntax (outside single quotes), or is not a ``curate`` command."""
    unquoted = re.sub(r"'[^']*'", "''", line)
    return bool(_SHELL.search(unquoted)) or not line.startswith("curate ")


class Zygote:
    """A pre-imported Python that forks one child per ``curate`` line (the module docstring)."""

    def __init__(self, env: dict[str, str], cwd: Path, *, preload: tuple[str, ...] = PRELOAD) -> None:
        self.env = dict(env)
        self._scratch = Path(tempfile.mkdtemp(prefix="curate-zygote-"))
        self._log = self._scratch / "zygote.err"  # its own errors (an import that failed), for the message below
        with open(self._log, "wb") as log:
            self._process = subprocess.Popen([sys.executable, "-c", _SERVER, json.dumps(preload)], cwd=cwd,
                                             env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                             bufsize=0)  # unbuffered: select() sees every reply line
        self._count = 0

    def start(self, argv: list[str], cwd: Path, env: dict[str, str], *, runtime_env: dict[str, str] | None = None,
              code: str | None = None) -> ForkedRun:
        """``curate *argv`` in ``cwd`` with ``env`` (the zygote's own), in a forked child, started and not
        waited for (one at a time: the zygote waits for it before it forks the next).

        ``runtime_env``: variables set in the child only, which nothing reads at import (e.g. a test's
        own switch). ``code``: run that instead, as ``python -c CODE *argv`` would (``sys.argv[1:]`` is
        ``argv``)."""
        if env != self.env:
            raise ValueError("a line's environment differs from the zygote's: run it in a shell")
        self._count += 1
        out, err = self._scratch / f"{self._count}.out", self._scratch / f"{self._count}.err"
        request = {"argv": argv, "cwd": str(cwd), "env": env, "runtime_env": runtime_env or {}, "code": code,
                   "stdout": str(out), "stderr": str(err)}
        assert self._process.stdin is not None
        self._process.stdin.write((json.dumps(request) + "\n").encode())
        self._process.stdin.flush()
        pid = json.loads(self._read_line(timeout=60))["pid"]
        args = ["curate", *argv] if code is None else ["python", "-c", code, *argv]
        return ForkedRun(self, pid, args, out, err)

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], *, timeout: float,
            runtime_env: dict[str, str] | None = None, code: str | None = None) -> subprocess.CompletedProcess:
        """:meth:`start`, then wait: the exit status (``-N`` for a signal, as ``subprocess`` says) and output."""
        child = self.start(argv, cwd, env, runtime_env=runtime_env, code=code)
        child.wait(timeout=timeout)
        return child.result()

    def _read_line(self, *, timeout: float) -> str:
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"the zygote's child did not finish within {timeout} s")
        line = self._process.stdout.readline().decode()
        if not line:
            raise RuntimeError(f"the zygote exited (status {self._process.wait(timeout=30)}); its stderr ends:\n"
                               f"{self._log.read_text(errors='replace')[-3000:]}")
        return line

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for path in self._scratch.iterdir():
            path.unlink()
        self._scratch.rmdir()


class ForkedRun:
    """A child of a :class:`Zygote`, as much of ``subprocess.Popen`` as the tests use."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str], out: Path, err: Path) -> None:
        self.zygote, self.pid, self.args, self._out, self._err = zygote, pid, args, out, err
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status if the child has ended, else None (without waiting)."""
        if self.returncode is None:
            try:
                self.returncode = json.loads(self.zygote._read_line(timeout=0))["rc"]
            except TimeoutError:
                pass
        return self.returncode

    def wait(self, timeout: float) -> int:
        """The exit status; SIGKILLs the child after ``timeout`` seconds (and raises ``TimeoutError``)."""
        if self.returncode is None:
            try:
                self.returncode = json.loads(self.zygote._read_line(timeout=timeout))["rc"]
            except TimeoutError:
                self.kill()
                self.returncode = json.loads(self.zygote._read_line(timeout=30))["rc"]
                raise
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the child (if it has not ended)."""
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def result(self) -> subprocess.CompletedProcess:
        assert self.returncode is not None, "wait() first"
        return subprocess.CompletedProcess(self.args, self.returncode, self._out.read_text(errors="replace"),
                                           self._err.read_text(errors="replace"))
