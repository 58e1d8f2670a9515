"""``curate fidelity DIR``: Fid+/Fid-, R-Fidelity and F-Fidelity of saliency methods (papers/002)."""
from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from curate.cli import err, main, out, progress


@main.command("fidelity")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--model", "model_name", default="auto", show_default=True, help="Model name, or 'auto' with a weights file.")
@click.option("--pretrained", default=None, help="Pretrained tag or local weights file ('none' for random).")
@click.option("--methods", default="gradcam", show_default=True,
              help="Comma list: saliency methods, 'mask', 'random', or NAME~RATIO (degraded by noise).")
@click.option("--sparsity", default="0.05:0.95:0.05", show_default=True, help="start:stop:step or a comma list.")
@click.option("--alpha", type=float, default=0.5, show_default=True, help="R-/F-Fidelity removal fraction.")
@click.option("--beta", type=float, default=0.1, show_default=True, help="F-Fidelity bound on removed pixels.")
@click.option("--samples", type=int, default=10, show_default=True, help="Stochastic removals per image.")
@click.option("--finetune-epochs", type=int, default=5, show_default=True, help="0 skips F-Fidelity.")
@click.option("--finetune-limit", type=int, default=None, help="Images fine-tuned on (default: all masked samples).")
@click.option("--finetune-lr", type=float, default=1e-4, show_default=True, help="Fine-tuning learning rate (Adam).")
@click.option("--limit", type=int, default=128, show_default=True, help="Images scored (classes interleaved).")
@click.option("--score", type=click.Choice(["accuracy", "probability", "margin"]), default="margin", show_default=True,
              help="accuracy (the paper's indicator), probability of the label, or logit margin.")
@click.option("--families", default="fid,rfid,ffid", show_default=True,
              help="Which of fid (Fid+/Fid-), rfid (R-Fidelity), ffid (F-Fidelity) to compute.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--run-name", default=None)
@click.option("--overwrite", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def fidelity(directory: Path, model_name: str, pretrained: str | None, methods: str, sparsity: str, alpha: float,
             beta: float, samples: int, finetune_epochs: int, finetune_limit: int | None, finetune_lr: float,
             limit: int, score: str, families: str, seed: int, batch_size: int, device: str, run_name: str | None, overwrite: bool,
             as_json: bool) -> None:
    """Score saliency methods on DIR's masked samples; writes runs/<run-name>/ (curves, AUCs, ranking, plot)."""
    from curate.metrics.fidelity_run import fidelity_dataset, vs_random_text
    from curate.models import load_model

    if (pretrained or "").lower() in ("", "none"):
        pretrained = None
    weights = Path(pretrained) if pretrained and Path(pretrained).exists() else pretrained
    model = load_model(model_name, weights, device=device)
    with progress() as bar:
        task = bar.add_task("fidelity", total=None)
        result = fidelity_dataset(
            directory, model, [m.strip() for m in methods.split(",") if m.strip()], sparsity, alpha=alpha, beta=beta,
            samples=samples, finetune_epochs=finetune_epochs, run_name=run_name, limit=limit,
            finetune_limit=finetune_limit, finetune_lr=finetune_lr, score=score, seed=seed,
            families=[f for f in families.split(",") if f.strip()], batch_size=batch_size,
            overwrite=overwrite, progress=lambda msg: bar.update(task, description=msg),
        )
    if as_json:
        out().print_json(json.dumps({"ranking": result.ranking, "correlations": result.correlations,
                                     "run_dir": str(result.run_dir)}, default=str))
        return
    fam = result.ranking[0].get("by", "ffid")
    label = {"ffid": "F-Fid", "rfid": "R-Fid", "fid": "Fid"}[fam]
    table = Table(title=f"Fidelity: methods ranked by {label} AUC over sparsity (higher {label}+ and lower {label}- = "
                        "more faithful); every AUC in ranking.csv", title_justify="left")
    verdicts = any("verdict" in r for r in result.ranking)
    for c in ["#", "method", f"{label}+", f"{label}-", *(["vs random MoRF", "vs random LeRF", "verdict"] if verdicts else [])]:
        table.add_column(c, justify="left" if c in ("method", "verdict") else "right", overflow="fold")
    for r in result.ranking:
        extra = [vs_random_text(r, "morf"), vs_random_text(r, "lerf"), r.get("verdict", "")] if verdicts else []
        table.add_row(str(r["rank"]), r["method"], f"{r[fam + '_plus']:.4f}", f"{r[fam + '_minus']:.4f}", *extra)
    out().print(table)
    for base, corr in result.correlations.items():
        out().print(f"degraded series '{base}': macro Spearman vs noise "
                    + ", ".join(f"{m} {v['macro']:+.2f}" for m, v in corr.items() if "macro" in v))
    err().print(f"• run folder: {result.run_dir}")

