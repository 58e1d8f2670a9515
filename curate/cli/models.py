"""Model verbs: train-reference, models (the zoo)."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from curate.cli import main, progress, shown
from curate.cli import out as stdout
from curate.cli.options import UserPath


@main.command("train-reference")
@click.argument("world", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--out", type=UserPath(path_type=Path), required=True, help="Weights file to write (.pt).")
@click.option("--steps", type=int, default=250, show_default=True)
@click.option("--batch-size", type=int, default=128, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--eval", "eval_dir", type=UserPath(path_type=Path, exists=True, file_okay=False),
              help="A synthetic world to report aligned vs conflicting accuracy on.")
def train_reference_cmd(world: Path, out: Path, steps: int, batch_size: int, lr: float, seed: int, eval_dir: Path | None) -> None:
    """Train the tiny reference CLIP on a synthetic world folder."""
    from curate.store import Dataset
    from curate.train_reference import TrainConfig, dataset_arrays, evaluate_shortcut, train_reference_clip

    ds = Dataset.open(world)
    images, labels, _, names, _ = dataset_arrays(ds)
    config = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    with progress() as bar:
        task = bar.add_task("training", total=steps)
        result = train_reference_clip(images, labels, names, out, config, meta={"dataset": str(world)},
                                      progress=lambda step, loss: bar.update(task, completed=step + 1, description=f"training, loss {loss:.3f}"))
    ds.record_provenance("train_reference", {"weights": str(out), "steps": steps, "seconds": round(result.seconds, 1)})
    stdout().print(f"wrote {shown(out)} ({result.seconds:.0f} s, final loss {result.losses[-1]:.3f})")
    if eval_dir:
        report = evaluate_shortcut(out, Dataset.open(eval_dir))
        stdout().print(f"aligned {report.aligned_acc:.1f}%  conflicting {report.conflicting_acc:.1f}%  gap {report.gap:.1f} points")


@main.command("models")
def models_cmd() -> None:
    """List the model zoo (the paper's checkpoint names and their open_clip pairs)."""
    from curate.models import load_zoo

    table = Table(title="model zoo (datasets/zoo.yaml)", title_justify="left")
    for column in ("paper name", "open_clip model", "pretrained"):
        table.add_column(column)
    for name, entry in load_zoo().items():
        table.add_row(name, entry.model, entry.pretrained)
    stdout().print(table)
    from curate.models import backends

    usage = {"open_clip": ("open_clip:ARCH (or a bare arch / zoo name)", "clip"),
             "timm": ("timm:NAME[.TAG]", "classifier"),
             "lvlm": ("lvlm:PATH_OR_REPO (transformers LLaVA-family, local folder or HF cache)", "lvlm"),
             "endpoint": ("endpoint:http://HOST:PORT/v1#NAME (OpenAI-compatible with prompt log-probs)", "lvlm")}
    kinds = Table(title="model backends (--model PREFIX:...)", title_justify="left")
    for column in ("prefix", "--model", "family"):
        kinds.add_column(column)
    for prefix in backends():
        kinds.add_row(prefix, *usage.get(prefix, (f"{prefix}:NAME", "")))
    stdout().print(kinds)
