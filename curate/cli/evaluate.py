"""Evaluation verbs: evaluate (one or many models), compare (Table 2 + Fig. 2 over runs)."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from curate.cli import err, main, out, progress


def _pct(x) -> str:
    return "—" if x is None or x != x else f"{100 * x:.2f}"


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--model", "models", multiple=True, required=True,
              help="open_clip arch, a paper name from the zoo (CLIP-LAION400M-ViT-B/32), timm:<name>, or 'auto' "
                   "(arch from a curate weights file). Repeat for several models.")
@click.option("--pretrained", "pretrained", multiple=True,
              help="Tag or weights file per --model, in the same order ('none' = random weights; "
                   "omit for zoo names).")
@click.option("--label-space", default="imagenet1k", show_default=True,
              help="imagenet1k (1 vs 1000) | top20 (1 vs 20, App. C.2) | dataset (the dataset's own list) | FILE.")
@click.option("--prompts", default="simple", show_default=True, help="simple ('A photo of {}.') | openai (80) | FILE.")
@click.option("--device", default="auto", show_default=True, help="auto | cpu | cuda[:N]")
@click.option("--batch-size", type=int, default=256, show_default=True)
@click.option("--workers", type=int, default=None, help="Decoding processes (default: 0 on CPU, up to 8 on GPU).")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16", "amp", "amp_bf16"]), default="fp32", show_default=True)
@click.option("--run-name", help="Run folder name (several models: used as a prefix).")
@click.option("--overwrite", is_flag=True, help="Replace an existing run of that name.")
@click.option("--top20-reference", help="Reference CLIP for building the 1-vs-20 space (paper: CLIP-LAION400M-ViT-B/32).")
@click.option("--top20-pretrained", help="Its tag or weights file.")
@click.option("--rebuild-top20", is_flag=True, help="Rebuild the dataset's saved 1-vs-20 space.")
@click.option("--bootstrap", type=int, default=1000, show_default=True, help="Bootstrap replicates for the intervals.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-cache", is_flag=True, help="Neither read nor write the feature cache.")
def evaluate(directory: Path, models: tuple[str, ...], pretrained: tuple[str, ...], label_space: str, prompts: str,
             device: str, batch_size: int, workers: int | None, precision: str, run_name: str | None, overwrite: bool,
             top20_reference: str | None, top20_pretrained: str | None, rebuild_top20: bool, bootstrap: int, seed: int,
             no_cache: bool) -> None:
    """Zero-shot (CLIPs) or 1000-way (classifiers) evaluation: accuracy, easy/hard, drop, intervals."""
    from curate.evaluate import EvalSettings, ModelSpec, evaluate_models

    if pretrained and len(pretrained) != len(models):
        raise click.BadParameter(f"give one --pretrained per --model ({len(models)} models, {len(pretrained)} weights)",
                                 param_hint="--pretrained")
    tags = [None if (p or "").lower() in ("", "none") else p for p in (pretrained or [None] * len(models))]
    specs = [ModelSpec(m, t) for m, t in zip(models, tags)]
    settings = EvalSettings(
        label_space=label_space, prompts=prompts, device=device, batch_size=batch_size, workers=workers,
        precision=precision, bootstrap=bootstrap, seed=seed, rebuild_top20=rebuild_top20, use_cache=not no_cache,
        top20_reference=ModelSpec(top20_reference, top20_pretrained) if top20_reference else None,
    )
    with progress() as bar:
        task = bar.add_task("encoding images", total=None)
        results = evaluate_models(directory, specs, settings, run_name=run_name, overwrite=overwrite,
                                  progress=lambda done, total: bar.update(task, completed=done, total=total))
    table = Table(title=f"{directory} — {label_space}, prompts {prompts} (balanced top-1 %, drop in points)", title_justify="left")
    for column in ("model", "acc1", "acc5", "easy", "hard", "drop [95% CI]", "excluded"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for spec, result in zip(specs, results):
        m = result.metrics
        groups, drop = m.get("groups") or {}, m.get("drop") or {}
        ci = drop.get("acc1_ci95") or [None, None]
        table.add_row(spec.label, _pct(m["overall"]["acc1"]), _pct(m["overall"]["acc5"]),
                      _pct(groups.get("easy", {}).get("acc1_balanced")), _pct(groups.get("hard", {}).get("acc1_balanced")),
                      f"{_pct(drop.get('acc1'))} [{_pct(ci[0])}, {_pct(ci[1])}]" if drop else "—",
                      str(m["excluded"]["count"]))
    out().print(table)
    for result in results:
        out().print(f"{result.run_dir} ({result.encoded} images encoded, the rest from the cache)")
    for result in results:
        if result.metrics["excluded"]["count"]:
            err().print(f"[yellow]{result.metrics['excluded']['count']} sample(s) excluded[/] "
                        f"({result.metrics['excluded']['reasons']}); see {result.run_dir / 'metrics.json'}")


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--run", "runs", multiple=True, help="Only these runs (default: every evaluation run with groups).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Output folder (default DIR/runs/compare).")
def compare(directory: Path, runs: tuple[str, ...], out_dir: Path | None) -> None:
    """Table 2 (model, easy, hard, drop, effective robustness) and the Fig. 2 scatter over runs."""
    from curate.compare import compare_runs

    rows, folder = compare_runs(directory, out_dir, runs or None)
    table = Table(title="easy vs hard (balanced top-1 %)", title_justify="left")
    for column in ("model", "label space", "prompts", "easy", "hard", "drop", "eff. robustness"):
        table.add_column(column, justify="left" if column in ("model", "label space", "prompts") else "right")
    for r in sorted(rows, key=lambda r: (r.setup, -r.easy)):
        table.add_row(r.model, r.label_space, r.prompts, _pct(r.easy), _pct(r.hard), _pct(r.drop), _pct(r.effective_robustness))
    out().print(table)
    out().print(f"wrote {folder / 'compare.md'}, compare.csv, compare.png")
