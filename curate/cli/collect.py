"""The ``collect`` group (other collectors add their verbs to it from their own modules)."""
from __future__ import annotations

from pathlib import Path

import click

from curate.cli import main, out, progress
from curate.cli.options import UserPath

#: ``collect synthetic`` option -> the WorldSpec rate of a planted problem (curate.collect.planted.RATE_FIELDS).
PLANTED_OPTIONS: dict[str, str] = {
    "--wrong-label-rate": "wrong_label_rate",
    "--duplicate-rate": "duplicate_rate",
    "--near-duplicate-rate": "near_duplicate_rate",
    "--feature-noise-rate": "feature_noise_rate",
    "--second-object-rate": "second_object_rate",
    "--small-object-rate": "small_object_rate",
}


def planted_options(func):
    """``--planted-rate`` (every planted problem at that rate) and one ``--<kind>-rate`` each."""
    for flag, name in reversed(PLANTED_OPTIONS.items()):
        kind = name[: -len("_rate")].replace("_", " ")
        func = click.option(flag, name, type=float, default=None,
                            help=f"Share of samples planted with a {kind} problem (default: --planted-rate).")(func)
    return click.option("--planted-rate", type=float, default=0.0, show_default=True,
                        help="Plant each of the six curation problems (wrong label, exact and near duplicate, "
                             "feature noise, second object, small object) in this share of samples; the truth "
                             "goes to the sample's extra, which `curate audit --measure --truth planted` reads.")(func)


@main.group()
def collect() -> None:
    """Collect images into a dataset folder."""


@collect.command("synthetic")
@click.argument("directory", type=UserPath(path_type=Path))
@click.option("--classes", default="6", show_default=True,
              help="A number K (the first K built-in classes) or comma-separated names/ImageNet indices.")
@click.option("--p", "p", type=float, default=0.9, show_default=True,
              help="Probability of the class's common background; 'uncorrelated' is 1/B.")
@click.option("--uncorrelated", is_flag=True, help="Set p = 1/B (no class-background correlation).")
@click.option("--per-class", type=int, default=100, show_default=True)
@click.option("--image-size", type=int, default=48, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--uncommon-scale", type=float, default=1.0, show_default=True,
              help="Object size factor for photos off the class's common background (< 1 plants a scale confound).")
@click.option("--outline", type=click.Choice(["contrast", "double"]), default="contrast", show_default=True,
              help="contrast: outline colour follows the background; double: the same on every background.")
@click.option("--truth-groups", is_flag=True,
              help="Set easy / hard from the truth (easy = the class's common background), as a perfect split would.")
@click.option("--vignette", type=float, default=0.0, show_default=True,
              help="Light falling off from the centre on every background, 1 - v r^2 (0 to 0.9; 0: none).")
@click.option("--backgrounds-only", type=int, default=None, metavar="N",
              help="Write N photos of each background alone (no object, no class) instead of the world: the "
                   "--background-photos folder of `curate intervene`.")
@planted_options
def collect_synthetic_cmd(directory: Path, classes: str, p: float, uncorrelated: bool, per_class: int,
                          image_size: int, seed: int, uncommon_scale: float, outline: str, truth_groups: bool,
                          vignette: float, backgrounds_only: int | None, planted_rate: float,
                          **rates: float | None) -> None:
    """Generate the synthetic world (shapes on procedural backgrounds, exact masks), optionally
    with planted curation problems at known rates (the ground truth of `curate audit`)."""
    from dataclasses import replace

    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, classes_by_name, collect_synthetic

    if classes.strip().isdigit() and int(classes) <= len(DEFAULT_CLASSES) and "," not in classes:
        picked = DEFAULT_CLASSES[: int(classes)]
    else:
        picked = classes_by_name(classes.split(","))
    planted = {name: (planted_rate if rate is None else rate) for name, rate in rates.items()}
    try:
        spec = WorldSpec(classes=picked, p=p, per_class=per_class, image_size=image_size, seed=seed,
                         uncommon_scale=uncommon_scale, outline=outline, vignette=vignette, **planted)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if uncorrelated:
        spec = replace(spec, p=spec.uncorrelated_p)
    if backgrounds_only is not None:
        from curate.collect.synthetic import collect_synthetic_backgrounds

        if backgrounds_only < 1:
            raise click.UsageError(f"--backgrounds-only must be >= 1, got {backgrounds_only}")
        ds = collect_synthetic_backgrounds(directory, spec, backgrounds_only)
        out().print(f"{ds.root}: {len(ds)} photos of backgrounds alone ({backgrounds_only} of each of "
                    f"{', '.join(spec.backgrounds)}), seed {seed}")
        return
    with progress() as bar:
        task = bar.add_task("generating", total=per_class * len(picked))
        ds = collect_synthetic(directory, spec, progress=lambda done, total: bar.update(task, completed=done))
    out().print(f"{ds.root}: {len(ds)} samples, {len(picked)} classes, p = {spec.p:.3f}, seed {seed}")
    if truth_groups:
        from curate.collect.synthetic import assign_truth_groups

        assign_truth_groups(ds)
        out().print("groups from the truth: easy = the class's common background, hard = any other")
    if any(planted.values()):
        import json
        from collections import Counter

        from curate.collect.planted import planted_truth

        extras = {r["sample_id"]: {**json.loads(r["extra"] or "{}"), "source_id": r["source_id"]} for r in ds.rows()}
        counts = Counter(planted_truth(extras).values())
        out().print("planted (truth in each sample's extra; duplicate_source = the original a duplicate copies): "
                    + ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())))
