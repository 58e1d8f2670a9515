"""The one progress protocol every stage accepts.

A stage reports ``progress(done, total, message)``: ``done`` units of ``total`` (``None`` when
the total is unknown yet) in the current phase, named by ``message`` ("encoding images",
"fine-tuning", ...). The CLI passes a rich progress bar adapter (:func:`curate.cli.progress`),
a script passes ``None`` or any callable of that shape. Stages never print.

The contract (docs/design.md#stages): a phase that ends reports ``done == total``; a long phase
reports a live count (per batch or optimisation step); work repeated in turns is named per turn
("fine-tuning copy 2 of 3") so that each phase ends at ``n/n``.
"""
from __future__ import annotations

from typing import Protocol

__all__ = ["Progress", "report", "phase"]


class Progress(Protocol):
    """``progress(done, total, message)``; ``total`` may be ``None`` (unknown yet)."""

    def __call__(self, done: int, total: int | None, message: str = "") -> None: ...  # pragma: no cover


def report(progress: Progress | None, done: int, total: int | None, message: str = "") -> None:
    """Call ``progress`` when there is one."""
    if progress is not None:
        progress(done, total, message)


def phase(progress: Progress | None, message: str):
    """A ``(done, total)`` callback that reports under ``message`` (for lower layers that count)."""
    if progress is None:
        return None

    def callback(done: int, total: int | None = None) -> None:
        progress(done, total, message)

    return callback
