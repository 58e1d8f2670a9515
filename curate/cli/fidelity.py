"""``curate fidelity DIR``: Fid+/Fid-, R-Fidelity and F-Fidelity of saliency methods (papers/002)."""
from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from curate.cli import StageProgress, err, main, out, progress, shown
from curate.cli.options import (
    IMAGE_MODELS,
    UserPath,
    device_options,
    mask_trust_option,
    model_options,
    one_model_spec,
    run_options,
)
from curate.formatting import num


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


@main.command("fidelity")
@click.argument("directory", type=UserPath(exists=True, file_okay=False, path_type=Path))
@model_options(required=False, accepts=IMAGE_MODELS)
@click.option("--methods", default="gradcam", show_default=True,
              help="Comma list: saliency methods, 'mask', 'random' (needed for the verdicts), or NAME~RATIO "
                   "(degraded by noise).")
@click.option("--sparsities", "--sparsity", "sparsities", default="0.05:0.95:0.05", show_default=True,
              help="start:stop:step or a comma list.")
@click.option("--alpha", type=float, default=0.5, show_default=True, help="R-/F-Fidelity removal fraction.")
@click.option("--beta", type=float, default=0.1, show_default=True, help="F-Fidelity bound on removed pixels.")
@click.option("--samples", type=int, default=10, show_default=True, help="Stochastic removals per image.")
@click.option("--finetune-epochs", type=int, default=5, show_default=True,
              help="Epochs of F-Fidelity's fine-tuning (the paper: 100-200, the full schedule); 0 skips F-Fidelity.")
@click.option("--finetune-limit", type=int, default=None, help="Images fine-tuned on (default: all masked samples).")
@click.option("--finetune-lr", type=float, default=1e-4, show_default=True, help="Fine-tuning learning rate (Adam).")
@click.option("--limit", type=int, default=128, show_default=True, help="Images scored (classes interleaved).")
@click.option("--score", type=click.Choice(["accuracy", "probability", "margin"]), default="margin", show_default=True,
              help="accuracy (the paper's indicator), probability of the label, or logit margin.")
@click.option("--families", default="fid,rfid,ffid", show_default=True,
              help="Which of fid (Fid+/Fid-), rfid (R-Fidelity), ffid (F-Fidelity) to compute.")
@click.option("--seed", type=int, default=0, show_default=True, help="The first replicate's seed.")
@click.option("--seeds", type=int, default=3, show_default=True,
              help="Replicates: fine-tuned copies and removal draws with seeds SEED..SEED+SEEDS-1; the verdicts' "
                   "intervals cover their spread.")
@click.option("--marginal", type=float, default=0.25, show_default=True,
              help="Mark a verdict '(marginal)' when its interval's lower bound is below this fraction of the "
                   "effect (0: never).")
@click.option("--batch-size", type=int, default=32, show_default=True)
@device_options
@click.option("--statuses", default="accepted,candidate", show_default=True,
              help="Comma list of sample statuses scored, or 'all'.")
@mask_trust_option
@run_options
@click.option("--json", "as_json", is_flag=True, help="Print the ranking as JSON.")
def fidelity(directory: Path, model: str | None, pretrained: str | None, methods: str, sparsities: str, alpha: float,
             beta: float, samples: int, finetune_epochs: int, finetune_limit: int | None, finetune_lr: float,
             limit: int, score: str, families: str, seed: int, seeds: int, marginal: float, batch_size: int,
             device: str, precision: str, statuses: str, allow_model_masks: bool, run_name: str | None,
             overwrite: bool, as_json: bool) -> None:
    """Score saliency methods on DIR's masked samples; writes runs/<run-name>/ (curves, AUCs, ranking, plot)."""
    from curate.stages.fidelity import FidelitySettings
    from curate.stages.fidelity import fidelity as run_fidelity

    spec = one_model_spec(model, pretrained)
    settings = FidelitySettings(
        methods=_csv(methods), sparsities=sparsities, alpha=alpha, beta=beta, samples=samples,
        finetune_epochs=finetune_epochs, limit=limit, finetune_limit=finetune_limit, finetune_lr=finetune_lr,
        score=score, families=_csv(families), seed=seed, seeds=seeds, marginal=marginal, batch_size=batch_size,
        device=device, precision=precision, statuses=None if statuses.strip() == "all" else _csv(statuses),
        allow_model_masks=allow_model_masks)
    with progress() as bar:
        run = run_fidelity(directory, spec, settings, run_name=run_name, overwrite=overwrite,
                           progress=StageProgress(bar))
    if as_json:
        out().print_json(json.dumps({"ranking": [r.to_dict() for r in run.ranking], "correlations": run.correlations,
                                     "masks": run.config.masks, "skipped": dict(run.config.skipped),
                                     "run_dir": str(run.run_dir)}, default=str))
        return
    label = run.family_label
    table = Table(title=f"Fidelity: methods ranked by {label} AUC over sparsity (higher {label}+ and lower {label}- = "
                        "more faithful); every AUC in ranking.csv", title_justify="left",
                  caption=f"the mask reference's {run.mask_line}" if run.mask_line else None, caption_justify="left")
    verdicts = run.has_verdicts
    for c in ["#", "method", f"{label}+", f"{label}-", *(["vs random MoRF", "vs random LeRF", "verdict"] if verdicts else [])]:
        table.add_column(c, justify="left" if c in ("method", "verdict") else "right", overflow="fold")
    for r in run.ranking:
        extra = [r.vs_random_text("morf"), r.vs_random_text("lerf"), r.verdict] if verdicts else []
        table.add_row(str(r.rank), r.method, num(r.plus, 4), num(r.minus, 4), *extra)
    out().print(table)
    if verdicts:
        out().print(f"vs random: method minus a random map on the same images (MoRF: {label}+, LeRF: {label}-; "
                    f"higher = more faithful), {run.interval_note}")
    if run.config.skipped:
        out().print("skipped samples: " + ", ".join(f"{k} {v}" for k, v in sorted(run.config.skipped.items())))
    for base in run.correlations:
        out().print(f"degraded series '{base}': macro Spearman vs noise "
                    + ", ".join(f"{m} {num(v, 2, signed=True)}" for m, v in run.macro_correlations(base).items()))
    err().print(f"• run folder: {shown(run.run_dir)}")
