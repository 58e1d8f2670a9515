"""A recording :class:`curate.progress.Progress` and checks that progress tells the truth: every
phase a stage reports ends at ``n/n``, and the CLI's logged closing lines say ``n/n done``."""
from __future__ import annotations

import re

#: A closing line of the CLI's logged progress (:func:`curate.cli.progress` without a terminal).
DONE_LINE = re.compile(r"^(?P<phase>[^:\n]+): (?P<done>\d+)(?:/(?P<total>\d+))? done in \d+:\d\d", re.MULTILINE)


class Recorder:
    """``progress(done, total, message)`` that keeps every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int | None, str]] = []

    def __call__(self, done: int, total: int | None, message: str = "") -> None:
        self.calls.append((done, total, message))

    def phases(self) -> dict[str, list[tuple[int, int | None]]]:
        """Each phase's ``(done, total)`` calls, phases in the order they first appeared."""
        out: dict[str, list[tuple[int, int | None]]] = {}
        for done, total, message in self.calls:
            out.setdefault(message, []).append((done, total))
        return out

    def assert_every_phase_ends_full(self) -> None:
        """The last call of every phase has a known total and ``done == total``."""
        assert self.calls, "no progress was reported"
        unfinished = {m: calls[-1] for m, calls in self.phases().items() if calls[-1][1] is None
                      or calls[-1][0] != calls[-1][1]}
        assert not unfinished, unfinished


def done_lines(text: str) -> dict[str, tuple[int, int | None]]:
    """The logged closing lines ``<phase>: done/total done in mm:ss`` of ``text``, by phase."""
    return {m["phase"]: (int(m["done"]), None if m["total"] is None else int(m["total"]))
            for m in DONE_LINE.finditer(text)}


def assert_closing_lines_full(text: str) -> dict[str, tuple[int, int | None]]:
    """Every logged closing line says ``n/n done``; returns them by phase."""
    lines = done_lines(text)
    assert lines, text
    assert all(total is not None and done == total for done, total in lines.values()), text
    return lines
