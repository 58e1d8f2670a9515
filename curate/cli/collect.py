"""The ``collect`` group (other collectors add their verbs to it from their own modules)."""
from __future__ import annotations

from pathlib import Path

import click

from curate.cli import main, out, progress


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
    with progress() as bar:
        task = bar.add_task("generating", total=per_class * len(picked))
        ds = collect_synthetic(directory, spec, progress=lambda done, total: bar.update(task, completed=done))
    out().print(f"{ds.root}: {len(ds)} samples, {len(picked)} classes, p = {spec.p:.3f}, seed {seed}")
