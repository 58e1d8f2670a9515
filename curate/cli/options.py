"""Options every verb shares, declared once so they cannot drift.

- :func:`model_options`: ``--model`` / ``--pretrained`` (``none`` = random weights everywhere);
- :func:`device_options`: ``--device`` (default ``auto`` in every verb) and ``--precision``
  (one choice list, :data:`curate.models.PRECISIONS`);
- :func:`run_options`: ``--run-name`` and ``--overwrite`` (an existing run is refused unless
  ``--overwrite``, in every verb);
- :func:`batch_options`: ``--batch-size`` and ``--workers``.

Each is a decorator; the verb receives the options as keyword arguments of the same names.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import click

from curate.models.base import PRECISIONS
from curate.models.spec import ModelSpec, specs_from_cli

__all__ = ["model_options", "device_options", "run_options", "batch_options", "model_specs", "one_model_spec"]

MODEL_HELP = ("open_clip arch, a paper name from the zoo (CLIP-LAION400M-ViT-B/32), timm:<name>, or 'auto' "
              "(architecture read from a curate weights file)")


def _apply(func: Callable, decorators: Sequence[Callable]) -> Callable:
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def model_options(*, multiple: bool = False, required: bool = True, default: str | None = None,
                  name: str = "--model", dest: str = "models") -> Callable:
    """``--model`` (repeatable when ``multiple``) and ``--pretrained`` (one per model, same order)."""
    def decorate(func: Callable) -> Callable:
        return _apply(func, [
            click.option(name, dest if multiple else dest.rstrip("s"), multiple=multiple,
                         required=required and default is None, default=default,
                         help=MODEL_HELP + (". Repeat for several models." if multiple else ".")),
            click.option("--pretrained", "pretrained", multiple=multiple,
                         help="Tag or weights file" + (" per model, in the same order" if multiple else "")
                              + " ('none' = random weights for an open_clip architecture or timm name; a zoo "
                                "name always loads its own checkpoint, so omit it there)."),
        ])
    return decorate


def model_specs(models: Sequence[str], pretrained: Sequence[str]) -> list[ModelSpec]:
    """:class:`ModelSpec` per ``--model`` (a usage error when the ``--pretrained`` count differs)."""
    try:
        return specs_from_cli(models, pretrained)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--pretrained") from None


def one_model_spec(model: str | None, pretrained: str | None) -> ModelSpec:
    """The spec of a single-model verb; ``--model auto`` (or none) needs a weights file."""
    name = model or "auto"
    if name == "auto" and not pretrained:
        raise click.UsageError("give --model NAME (and --pretrained), or --pretrained FILE of a curate weights file")
    return specs_from_cli([name], [pretrained] if pretrained else [])[0]


def device_options(func: Callable) -> Callable:
    """``--device auto|cpu|cuda[:N]`` (default auto) and ``--precision`` (default fp32)."""
    return _apply(func, [
        click.option("--device", default="auto", show_default=True, help="auto | cpu | cuda[:N]"),
        click.option("--precision", type=click.Choice(PRECISIONS), default="fp32", show_default=True),
    ])


def run_options(func: Callable) -> Callable:
    """``--run-name`` and ``--overwrite``."""
    return _apply(func, [
        click.option("--run-name", default=None, help="Run folder name under DIR/runs/ (default: <kind>-<model>-<time>)."),
        click.option("--overwrite", is_flag=True, help="Replace an existing run of that name (refused otherwise)."),
    ])


def batch_options(*, batch_size: int = 256, workers: int | None = None, with_workers: bool = True) -> Callable:
    """``--batch-size`` and (unless ``with_workers`` is False) ``--workers`` (decoding processes)."""
    def decorate(func: Callable) -> Callable:
        options = [click.option("--batch-size", type=int, default=batch_size, show_default=True,
                                help="Images per batch (halved on out-of-memory where the stage supports it).")]
        if with_workers:
            options.append(click.option("--workers", type=int, default=workers, show_default=workers is not None,
                                        help="Decoding processes (default: 0 on CPU, up to 8 on GPU)."))
        return _apply(func, options)
    return decorate
