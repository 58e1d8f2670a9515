"""Options every verb shares, declared once so they cannot drift.

- :func:`model_options`: ``--model`` / ``--pretrained`` (``none`` = random weights everywhere); each verb's
  help lists only the kinds of model it can use (``accepts``, :data:`MODEL_SPECS`);
- :func:`device_options`: ``--device`` (default ``auto`` in every verb) and ``--precision``
  (one choice list, :data:`curate.models.PRECISIONS`);
- :func:`run_options`: ``--run-name`` and ``--overwrite`` (a finished run is refused unless
  ``--overwrite``, in every verb, before any work; docs/design.md#run-folders);
- :func:`batch_options`: ``--batch-size`` and ``--workers``;
- :func:`lvlm_options`: ``--question``, ``--answer-template`` and ``--token-env`` (LVLMs);
- :func:`engine_options`: ``--engine local|ray``, ``--ray-address``, ``--gpus-per-worker``, and the Ray
  engine's bounded waits ``--ray-release-wait`` / ``--ray-start-timeout`` (with ``--engine ray``,
  ``--workers`` counts model actors);
- :func:`mask_trust_option`: ``--allow-model-masks`` (every verb whose numbers read object masks:
  explain, fidelity, audit, collect composite; :mod:`curate.masks.sources`);
- :class:`UserPath`: the type of every path option and argument (``click.Path`` that expands
  ``~``, so ``--out=~/rep``, which no shell expands, means the home folder as ``--pretrained=~/f`` does).

Each is a decorator; the verb receives the options as keyword arguments of the same names.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from curate.models.spec import ModelSpec

__all__ = ["UserPath", "expand_home", "model_options", "model_help", "MODEL_SPECS", "ALL_MODELS", "CLIP_ONLY",
           "IMAGE_MODELS", "device_options", "run_options", "batch_options", "lvlm_options", "engine_options",
           "mask_trust_option", "model_specs", "one_model_spec"]

#: What ``--model`` takes, per kind of model spec; a verb's help lists only the kinds it accepts.
MODEL_SPECS: dict[str, str] = {
    "clip": "open_clip arch, a paper name from the zoo (CLIP-LAION400M-ViT-B/32), 'auto' (architecture read from a "
            "curate weights file)",
    "timm": "timm:<name> (an ImageNet classifier)",
    "lvlm": "lvlm:PATH_OR_REPO (a transformers LLaVA-family model)",
    "endpoint": "endpoint:http://HOST:PORT/v1#NAME (an OpenAI-compatible server with prompt log-probs)",
}
ALL_MODELS = tuple(MODEL_SPECS)
CLIP_ONLY = ("clip",)
IMAGE_MODELS = ("clip", "timm")


def model_help(accepts: Sequence[str] = ALL_MODELS) -> str:
    """``--model``'s help for a verb that accepts the spec kinds ``accepts`` (keys of :data:`MODEL_SPECS`)."""
    unknown = [k for k in accepts if k not in MODEL_SPECS]
    if unknown or not accepts:
        raise ValueError(f"model kinds must be among {', '.join(MODEL_SPECS)}, got {list(accepts)}")
    parts = [MODEL_SPECS[k] for k in accepts]
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]
    return ("A CLIP: " + text) if tuple(accepts) == CLIP_ONLY else text


MODEL_HELP = model_help()


class UserPath(click.Path):
    """``click.Path`` that expands a leading ``~`` (``~/x``, ``~user/x``) before the checks
    (``exists=`` ...) run; every path parameter of the CLI uses it."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            value = os.path.expanduser(value)
        elif isinstance(value, os.PathLike) and os.fspath(value).startswith("~"):
            value = type(value)(os.path.expanduser(os.fspath(value)))
        return super().convert(value, param, ctx)


def expand_home(ctx: click.Context | None, param: click.Parameter | None, value: Any) -> Any:
    """Click callback of the options that take a name *or* a file (``--label-space``, ``--prompts``,
    ``--pretrained``): a value starting with ``~`` is a file under the home folder (names never start so)."""
    if isinstance(value, tuple):
        return tuple(expand_home(ctx, param, v) for v in value)
    return os.path.expanduser(value) if isinstance(value, str) and value.startswith("~") else value


def _apply(func: Callable, decorators: Sequence[Callable]) -> Callable:
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def model_options(*, multiple: bool = False, required: bool = True, default: str | None = None,
                  name: str = "--model", dest: str = "models", accepts: Sequence[str] = ALL_MODELS) -> Callable:
    """``--model`` (repeatable when ``multiple``) and ``--pretrained`` (one per model, same order);
    ``accepts``: the kinds of model spec the verb can use (:data:`MODEL_SPECS`), the only ones its help lists."""
    random_for = "an open_clip architecture or timm name" if "timm" in accepts else "an open_clip architecture"

    def decorate(func: Callable) -> Callable:
        return _apply(func, [
            click.option(name, dest if multiple else dest.rstrip("s"), multiple=multiple,
                         required=required and default is None, default=default,
                         help=model_help(accepts) + (". Repeat for several models." if multiple else ".")),
            click.option("--pretrained", "pretrained", multiple=multiple, callback=expand_home,
                         help="Tag or weights file" + (" per model, in the same order" if multiple else "")
                              + f" ('none' = random weights for {random_for}; a zoo "
                                "name always loads its own checkpoint, so omit it there)."),
        ])
    return decorate


def model_specs(models: Sequence[str], pretrained: Sequence[str]) -> list[ModelSpec]:
    """:class:`ModelSpec` per ``--model`` (a usage error when the ``--pretrained`` count differs)."""
    from curate.models.spec import specs_from_cli

    try:
        return specs_from_cli(models, pretrained)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--pretrained") from None


def one_model_spec(model: str | None, pretrained: str | None) -> ModelSpec:
    """The spec of a single-model verb; ``--model auto`` (or none) needs a weights file."""
    from curate.models.spec import specs_from_cli

    name = model or "auto"
    if name == "auto" and not pretrained:
        raise click.UsageError("give --model NAME (and --pretrained), or --pretrained FILE of a curate weights file")
    return specs_from_cli([name], [pretrained] if pretrained else [])[0]


def device_options(func: Callable) -> Callable:
    """``--device auto|cpu|cuda[:N]`` (default auto) and ``--precision`` (default fp32)."""
    from curate.models.base import PRECISIONS

    return _apply(func, [
        click.option("--device", default="auto", show_default=True, help="auto | cpu | cuda[:N]"),
        click.option("--precision", type=click.Choice(PRECISIONS), default="fp32", show_default=True),
    ])


def run_options(func: Callable) -> Callable:
    """``--run-name`` and ``--overwrite``."""
    return _apply(func, [
        click.option("--run-name", default=None, help="Run folder name under DIR/runs/ (default: <kind>-<model>-<time>)."),
        click.option("--overwrite", is_flag=True, help="Replace a finished run of that name (refused otherwise; "
                     "an unfinished one, without config.json, is replaced anyway)."),
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


def lvlm_options(func: Callable) -> Callable:
    """``--question``, ``--answer-template`` (papers/003 App. C.4 defaults) and ``--token-env``."""
    from curate.lvlm.defaults import DEFAULT_ANSWER_TEMPLATE, DEFAULT_QUESTION

    return _apply(func, [
        click.option("--question", default=DEFAULT_QUESTION, show_default=True,
                     help="LVLMs: the question asked about each image."),
        click.option("--answer-template", default=DEFAULT_ANSWER_TEMPLATE, show_default=True,
                     help="LVLMs: the answer scored per candidate label ('{}' is the label); lowest mean NLL wins."),
        click.option("--token-env", default=None, metavar="VAR",
                     help="endpoint LVLMs: the environment variable holding the API token (never the token itself)."),
    ])


def engine_options(func: Callable) -> Callable:
    """``--engine local|ray``, ``--ray-address``, ``--gpus-per-worker`` (curate.engine) and the Ray
    engine's two bounded waits, ``--ray-release-wait`` and ``--ray-start-timeout``: the verb runs
    within :func:`curate.engine.ray_waits` of them (every stage's Ray engine then waits so), and
    does not receive them."""
    from curate.engine import RAY_RELEASE_WAIT_S, RAY_START_TIMEOUT_S

    @functools.wraps(func)
    def verb(*args: Any, ray_release_wait: float | None, ray_start_timeout: float | None, **kwargs: Any) -> Any:
        from curate.engine import ray_waits

        if kwargs.get("engine") != "ray" and (ray_release_wait is not None or ray_start_timeout is not None):
            raise click.UsageError("--ray-release-wait and --ray-start-timeout need --engine ray")
        with ray_waits(release_wait_s=ray_release_wait, start_timeout_s=ray_start_timeout):
            return func(*args, **kwargs)

    return _apply(verb, [
        click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                     help="Where images are encoded: this process, or Ray Data (CPU decode tasks, a model actor "
                          "pool; same cache and results). With ray, --workers is the number of model actors."),
        click.option("--ray-address", default=None, metavar="auto|ray://HOST:PORT",
                     help="Ray cluster to use with --engine ray (default: start a local Ray instance for the run)."),
        click.option("--gpus-per-worker", type=float, default=0.0, show_default=True,
                     help="GPUs per model actor with --engine ray (0: the actors run on CPU)."),
        click.option("--ray-release-wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
                     show_default=f"{RAY_RELEASE_WAIT_S:g} s",
                     help="With --engine ray, after a lost node: how long the retry waits for the failed pipeline's "
                          "CPUs to be freed before it plans on what is free (then an error naming what holds them)."),
        click.option("--ray-start-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
                     metavar="SECONDS", show_default=f"{RAY_START_TIMEOUT_S:g} s",
                     help="With --engine ray: how long a pipeline waits for its model actors to start (model "
                          "loaded) before its first batch (then an error naming the actors and free CPUs)."),
    ])


def mask_trust_option(func: Callable) -> Callable:
    """``--allow-model-masks``: also use object masks a model proposed (``curate propose-masks``)
    that no person verified; without it they are left out and counted (the verbs' ``allow_model_masks``)."""
    return click.option(
        "--allow-model-masks", is_flag=True,
        help="Use object masks made by a model (curate propose-masks) that no person verified; without it they are "
             "left out and counted (verify them with curate review). Masks marked bad are never used.")(func)


def creation_vocabulary(label_space: str, backgrounds: str | None) -> tuple[Any, list[str] | None]:
    """The ``--label-space`` / ``--backgrounds`` of a verb that may create a dataset folder:
    ``(LabelSpace or None for ImageNet-1K, background list or None for the paper's 14)``.

    ``label_space`` is ``imagenet1k`` or a text file with one class name per line (``#`` lines
    skipped); anything else is a usage error.
    """
    from curate.labels import LabelSpace

    space = None
    if label_space != "imagenet1k":
        path = Path(label_space).expanduser()
        if not path.is_file():
            raise click.BadParameter(f"{label_space!r} is neither 'imagenet1k' nor a file", param_hint="--label-space")
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                 if line.strip() and not line.startswith("#")]
        space = LabelSpace.from_names(path.stem, names)
    vocab = [b.strip() for b in backgrounds.split(",") if b.strip()] if backgrounds else None
    return space, vocab


def preprocess_options(func: Callable) -> Callable:
    """``--mean``, ``--std``, ``--input-size``, ``--interpolation``: the eval preprocessing of a timm
    classifier trained with other preprocessing than its architecture's default
    (:func:`apply_preprocess`)."""
    from curate.models.spec import INTERPOLATIONS

    options = [
        click.option("--mean", "prep_mean", default=None, metavar="R,G,B",
                     help="Timm classifiers only. Per-channel mean of [0, 1] pixels the weights were trained with "
                          "(default: the architecture's)."),
        click.option("--std", "prep_std", default=None, metavar="R,G,B",
                     help="Timm classifiers only. Per-channel std of [0, 1] pixels (default: the architecture's)."),
        click.option("--input-size", "prep_size", default=None, metavar="N|HxW",
                     help="Timm classifiers only. The model's input size, after the resize and centre crop."),
        click.option("--interpolation", "prep_interpolation", default=None, type=click.Choice(INTERPOLATIONS),
                     help="Timm classifiers only. The resize's interpolation (default: the architecture's)."),
    ]
    return _apply(func, options)


def apply_preprocess(specs: list[ModelSpec], mean: str | None, std: str | None, size: str | None,
                     interpolation: str | None) -> list[ModelSpec]:
    """Each ``timm:`` spec with the preprocessing options folded into its name
    (:meth:`curate.models.spec.ModelSpec.with_preprocess`); a usage error when options are given
    and no model is a ``timm:`` classifier, or a value is malformed."""
    given = {"mean": mean, "std": std, "size": size, "interpolation": interpolation}
    if all(v is None for v in given.values()):
        return specs
    if not any(spec.name.startswith("timm:") for spec in specs):
        raise click.UsageError("--mean, --std, --input-size and --interpolation are options of timm: classifiers "
                               "(--model timm:NAME --pretrained FILE)")
    try:
        return [spec.with_preprocess(**given) if spec.name.startswith("timm:") else spec for spec in specs]
    except ValueError as error:
        raise click.UsageError(str(error)) from None
