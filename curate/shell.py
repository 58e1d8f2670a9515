"""Command lines curate suggests, quoted so that they paste into a POSIX shell as meant.

Every ``curate <verb> ...`` that curate prints, logs or puts in an error message with a value in
it (a folder, a run name, a URL) is built by :func:`suggest`: each value becomes one shell word
(:func:`shlex.quote`), so a folder called ``no masks`` comes back whole from ``shlex.split``
(tests/test_cli.py checks that no f-string builds such a line around a value). A value that
needs no quoting (``world``, ``runs/a-1``) is written as it is.
"""
from __future__ import annotations

import os
import shlex

__all__ = ["quote", "suggest"]


def quote(value: object) -> str:
    """``value`` (text, a path, a number) as one shell word: unchanged when the shell would keep it
    so, else single-quoted (:func:`shlex.quote`)."""
    return shlex.quote(os.fspath(value) if isinstance(value, os.PathLike) else str(value))


def suggest(template: str, /, **values: object) -> str:
    """``template``, a command line such as ``curate evaluate {dir} --model NAME``, with each
    ``{name}`` replaced by ``values[name]`` as one shell word (:func:`quote`). The rest is kept as
    written: placeholders (``NAME``, ``...``) are for the user to replace."""
    return template.format(**{name: quote(value) for name, value in values.items()})
