"""The ``curate`` command line: a thin shell over library calls.

Every verb parses its options, calls one library function and renders the result (rich
tables, progress bars). Errors from the library (bad input, damaged folders, missing weights)
are shown as one clear message and a non-zero exit, not a traceback; ``--debug`` shows it.
"""
from __future__ import annotations

import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console
from rich.table import Table

from curate import __version__

console = Console()
err_console = Console(stderr=True)
logger = logging.getLogger("curate")


class CurateGroup(click.Group):
    """Turns library errors into a one-line message and exit code 1 (``--debug`` re-raises)."""

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
@click.pass_context
def main(ctx: click.Context, debug: bool, verbose: int) -> None:
    """Build and score CounterAnimal-style spurious-feature benchmarks."""
    global console, err_console
    console, err_console = Console(soft_wrap=True), Console(stderr=True, soft_wrap=True)  # honour COLUMNS now
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


# --------------------------------------------------------------------------------- dataset


@main.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--name", help="Dataset name (default: the folder's name).")
@click.option("--label-space", default="imagenet1k", show_default=True,
              help="'imagenet1k' or a text file with one class name per line (e.g. COCO categories).")
@click.option("--backgrounds", help="Comma-separated background vocabulary (default: the paper's 14).")
@click.option("--recipe", help="A recipe name recorded in dataset.yaml (e.g. counteranimal).")
def create(directory: Path, name: str | None, label_space: str, backgrounds: str | None, recipe: str | None) -> None:
    """Create an empty dataset folder."""
    from curate.labels import LabelSpace
    from curate.store import Dataset

    space = None
    if label_space != "imagenet1k":
        path = Path(label_space)
        if not path.is_file():
            raise click.BadParameter(f"{label_space!r} is neither 'imagenet1k' nor a file", param_hint="--label-space")
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip() and not line.startswith("#")]
        space = LabelSpace.from_names(path.stem, names)
    vocab = [b.strip() for b in backgrounds.split(",") if b.strip()] if backgrounds else None
    ds = Dataset.create(directory, name=name or directory.name, label_space=space, backgrounds=vocab, recipe=recipe)
    console.print(f"created [bold]{ds.root}[/] ({len(ds.label_space)} classes, {len(ds.backgrounds)} backgrounds)")


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
def info(directory: Path) -> None:
    """Counts per class, background, group, status and licence."""
    from curate.store import Dataset, summarize

    ds = Dataset.open(directory)
    counts = summarize(ds)
    console.print(f"[bold]{ds.config.get('name', directory.name)}[/] — {len(ds)} samples, label space "
                  f"'{ds.label_space.name}' ({len(ds.label_space)} classes), schema v{ds.config.get('schema_version')}")
    for key in ("class", "background", "group", "status", "license", "source"):
        if key in counts:
            console.print(_counter_table(key, counts[key]))


def _counter_table(title: str, counter: Counter) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column(title)
    table.add_column("n", justify="right")
    for value, n in sorted(counter.items(), key=lambda kv: (-kv[1], str(kv[0]))):
        table.add_row("—" if value is None else str(value), str(n))
    return table


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--deep", is_flag=True, help="Also re-hash every image against its recorded sha256.")
def check(directory: Path, deep: bool) -> None:
    """List every problem of a dataset folder; exit 1 when there is any error."""
    from curate.store import check_dataset

    problems = check_dataset(directory, deep=deep)
    errors = [p for p in problems if getattr(p, "severity", "error") == "error"]
    for problem in problems:
        colour = "red" if problem in errors else "yellow"
        console.print(f"[{colour}]{getattr(problem, 'severity', 'error')}[/] {problem}")
    if errors:
        console.print(f"[bold red]{len(errors)} error(s)[/] in {directory}")
        sys.exit(1)
    console.print(f"[green]ok[/] {directory}" + (f" ({len(problems)} warning(s))" if problems else ""))


# --------------------------------------------------------------------------------- collect


@main.group()
def collect() -> None:
    """Collect images into a dataset folder."""


@collect.command("synthetic")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--classes", default="6", show_default=True,
              help="A number K (the first K built-in classes) or comma-separated names/ImageNet indices.")
@click.option("--p", "p", type=float, default=0.9, show_default=True,
              help="Probability of the class's common background; 'uncorrelated' is 1/B.")
@click.option("--uncorrelated", is_flag=True, help="Set p = 1/B (no class-background correlation).")
@click.option("--per-class", type=int, default=100, show_default=True)
@click.option("--image-size", type=int, default=48, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def collect_synthetic_cmd(directory: Path, classes: str, p: float, uncorrelated: bool, per_class: int,
                          image_size: int, seed: int) -> None:
    """Generate the synthetic world (shapes on procedural backgrounds, exact masks)."""
    from dataclasses import replace

    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, classes_by_name, collect_synthetic

    if classes.strip().isdigit() and int(classes) <= len(DEFAULT_CLASSES) and "," not in classes:
        picked = DEFAULT_CLASSES[: int(classes)]
    else:
        picked = classes_by_name(classes.split(","))
    spec = WorldSpec(classes=picked, p=p, per_class=per_class, image_size=image_size, seed=seed)
    if uncorrelated:
        spec = replace(spec, p=spec.uncorrelated_p)
    with _progress() as bar:
        task = bar.add_task("generating", total=per_class * len(picked))
        ds = collect_synthetic(directory, spec, progress=lambda done, total: bar.update(task, completed=done))
    console.print(f"{ds.root}: {len(ds)} samples, {len(picked)} classes, p = {spec.p:.3f}, seed {seed}")


# --------------------------------------------------------------------------------- models


@main.command("train-reference")
@click.argument("world", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Weights file to write (.pt).")
@click.option("--steps", type=int, default=250, show_default=True)
@click.option("--batch-size", type=int, default=128, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--eval", "eval_dir", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="A synthetic world to report aligned vs conflicting accuracy on.")
def train_reference_cmd(world: Path, out: Path, steps: int, batch_size: int, lr: float, seed: int, eval_dir: Path | None) -> None:
    """Train the tiny reference CLIP on a synthetic world folder."""
    from curate.store import Dataset
    from curate.train_reference import TrainConfig, dataset_arrays, evaluate_shortcut, train_reference_clip

    ds = Dataset.open(world)
    images, labels, _, names, _ = dataset_arrays(ds)
    config = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    with _progress() as bar:
        task = bar.add_task("training", total=steps)
        result = train_reference_clip(images, labels, names, out, config, meta={"dataset": str(world)},
                                      progress=lambda step, loss: bar.update(task, completed=step + 1, description=f"loss {loss:.3f}"))
    ds.record_provenance("train_reference", {"weights": str(out), "steps": steps, "seconds": round(result.seconds, 1)})
    console.print(f"wrote {out} ({result.seconds:.0f} s, final loss {result.losses[-1]:.3f})")
    if eval_dir:
        report = evaluate_shortcut(out, Dataset.open(eval_dir))
        console.print(f"aligned {report.aligned_acc:.1f}%  conflicting {report.conflicting_acc:.1f}%  gap {report.gap:.1f} points")


@main.command("models")
def models_cmd() -> None:
    """List the model zoo (the paper's checkpoint names and their open_clip pairs)."""
    from curate.models import load_zoo

    table = Table(title="model zoo (datasets/zoo.yaml)", title_justify="left")
    for column in ("paper name", "open_clip model", "pretrained"):
        table.add_column(column)
    for name, entry in load_zoo().items():
        table.add_row(name, entry.model, entry.pretrained)
    console.print(table)


# --------------------------------------------------------------------------------- demo


@main.command()
@click.option("--workdir", type=click.Path(path_type=Path), default=Path("demo-output"), show_default=True)
@click.option("--steps", type=int, default=None, help="Training steps per model (default: the measured demo setting).")
def demo(workdir: Path, steps: int | None) -> None:
    """Offline demo: synthetic worlds, the tiny reference CLIP, and its background shortcut."""
    from curate.demo import DemoSettings, run_demo

    settings = DemoSettings()
    if steps:
        settings.steps = steps
    with _progress() as bar:
        tasks: dict[str, Any] = {}

        def on_step(label: str, step: int, total: int, loss: float) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(f"train {label}", total=total)
            bar.update(tasks[label], completed=step, description=f"train {label} loss {loss:.3f}")

        rows = run_demo(workdir, settings, on_stage=lambda m: bar.console.print(f"• {m}"), on_step=on_step)
    table = Table(title="zero-shot accuracy of the tiny reference CLIP on an uncorrelated evaluation world (balanced, %)",
                  title_justify="left")
    for column, justify in (("trained on", "left"), ("p", "right"), ("aligned bg", "right"),
                            ("conflicting bg", "right"), ("gap (points)", "right"), ("n aligned / conflicting", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        r = row.report
        table.add_row(row.world, f"{row.p:.3f}", f"{r.aligned_acc:.1f}", f"{r.conflicting_acc:.1f}", f"{r.gap:.1f}",
                      f"{r.n_aligned} / {r.n_conflicting}")
    console.print(table)
    console.print(f"worlds and weights are in {workdir}/ (re-running reuses them)")


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err_console, transient=False)


if __name__ == "__main__":  # pragma: no cover
    main()
