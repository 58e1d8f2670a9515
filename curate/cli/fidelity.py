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
@click.option("--pretrained", default=None, help="Pretrained tag or local weights file.")
@click.option("--methods", default="gradcam", show_default=True,
              help="Comma list: saliency methods, 'mask', 'random', or NAME~RATIO (degraded by noise).")
@click.option("--sparsity", default="0.05:0.95:0.05", show_default=True, help="start:stop:step or a comma list.")
@click.option("--alpha", type=float, default=0.5, show_default=True, help="R-/F-Fidelity removal fraction.")
@click.option("--beta", type=float, default=0.1, show_default=True, help="F-Fidelity bound on removed pixels.")
@click.option("--samples", type=int, default=10, show_default=True, help="Stochastic removals per image.")
@click.option("--finetune-epochs", type=int, default=3, show_default=True, help="0 skips F-Fidelity.")
@click.option("--limit", type=int, default=128, show_default=True, help="Images scored (classes interleaved).")
@click.option("--score", type=click.Choice(["accuracy", "probability"]), default="accuracy", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--run-name", default=None)
@click.option("--overwrite", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def fidelity(directory: Path, model_name: str, pretrained: str | None, methods: str, sparsity: str, alpha: float,
             beta: float, samples: int, finetune_epochs: int, limit: int, score: str, seed: int, batch_size: int,
             device: str, run_name: str | None, overwrite: bool, as_json: bool) -> None:
    """Score saliency methods on DIR's masked samples; writes runs/<run-name>/ (curves, AUCs, ranking, plot)."""
    from curate.metrics.fidelity_run import fidelity_dataset
    from curate.models import load_model

    weights = Path(pretrained) if pretrained and Path(pretrained).exists() else pretrained
    model = load_model(model_name, weights, device=device)
    with progress() as bar:
        task = bar.add_task("fidelity", total=None)
        result = fidelity_dataset(
            directory, model, [m.strip() for m in methods.split(",") if m.strip()], sparsity, alpha=alpha, beta=beta,
            samples=samples, finetune_epochs=finetune_epochs, run_name=run_name, limit=limit, score=score, seed=seed,
            batch_size=batch_size, overwrite=overwrite, progress=lambda msg: bar.update(task, description=msg),
        )
    if as_json:
        out().print_json(json.dumps({"ranking": result.ranking, "correlations": result.correlations,
                                     "run_dir": str(result.run_dir)}, default=str))
        return
    table = Table(title="Fidelity AUCs over sparsity (higher Fid+, lower Fid- = more faithful)")
    cols = [c for c in ("fid_plus", "fid_minus", "rfid_plus", "rfid_minus", "ffid_plus", "ffid_minus")
            if c in result.ranking[0]]
    for c in ["rank", "method", *cols]:
        table.add_column(c)
    for r in result.ranking:
        table.add_row(str(r["rank"]), r["method"], *(f"{r[c]:.4f}" for c in cols))
    out().print(table)
    for base, corr in result.correlations.items():
        out().print(f"degraded series '{base}': macro Spearman vs noise "
                    + ", ".join(f"{m} {v['macro']:+.2f}" for m, v in corr.items() if "macro" in v))
    err().print(f"• run folder: {result.run_dir}")
