"""The ``explain`` verb: saliency maps, SSS and RMA for a dataset folder (curate.saliency)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from curate.cli import err, main, out, progress

METHOD_NAMES = ("gradcam", "gradcam++", "xgradcam", "layercam", "eigencam", "eigengradcam", "scorecam",
                "ablationcam", "fullgrad", "rollout", "grad-rollout")


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


@main.command("explain")
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--model", "model_name", default="auto", show_default=True,
              help="Model name (open_clip arch, zoo name, timm:<name>) or 'auto' for a curate weights file.")
@click.option("--pretrained", default=None, help="Pretrained tag or local weights file.")
@click.option("--method", type=click.Choice(METHOD_NAMES, case_sensitive=False), default="gradcam",
              show_default=True, help="Saliency method (papers/004 Tables 1-4, 8-9).")
@click.option("--target", default="true", show_default=True, help="true | predicted | topk:K")
@click.option("--layer", default=None, help="Layer the CAM reads (default: the method's documented default).")
@click.option("--threshold", type=float, default=None, help="Threshold tau on the [0, 1] maps (papers/004 App. C).")
@click.option("--threshold-mode", type=click.Choice(["soft", "hard"]), default="soft", show_default=True)
@click.option("--label-space", type=click.Choice(["dataset", "present"]), default="dataset", show_default=True,
              help="Candidate classes of predicted/top-k targets: the whole label space or the classes present.")
@click.option("--prompts", default=None,
              help="simple | openai | template file (default: the weights' caption template, else simple).")
@click.option("--save-maps", is_flag=True, help="Write maps/<sample_id>.npz (maps, aligned mask, targets).")
@click.option("--run-name", default=None, help="Run folder name under DIR/runs/ (default: explain-<method>-<model>-<time>).")
@click.option("--overwrite", is_flag=True, help="Replace an existing run of the same name.")
@click.option("--device", default="auto", show_default=True, help="cpu | cuda | cuda:1 | auto")
@click.option("--precision", default="fp32", show_default=True, help="fp32 | fp16 | bf16 | amp | amp_bf16")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Images per batch (halved on out-of-memory).")
@click.option("--workers", type=int, default=0, show_default=True, help="DataLoader workers decoding images and masks.")
@click.option("--limit", type=int, default=None, help="Explain only the first N samples with a mask.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of tables.")
def explain_cmd(directory: Path, model_name: str, pretrained: str | None, method: str, target: str, layer: str | None,
                threshold: float | None, threshold_mode: str, label_space: str, prompts: str | None, save_maps: bool,
                run_name: str | None, overwrite: bool, device: str, precision: str, batch_size: int, workers: int,
                limit: int | None, as_json: bool) -> None:
    """Saliency maps, SSS and RMA (per prediction, image, class; by group and correct/wrong) for DIR."""
    from curate.models import load_model
    from curate.saliency import explain_dataset

    name = None if model_name in ("", "auto") else model_name
    if name is None and not pretrained:
        raise click.UsageError("give --model NAME (and --pretrained), or --pretrained FILE of a curate weights file")
    weights: Any = pretrained
    if pretrained and name is None:
        weights = Path(pretrained)
    model = load_model(name, weights, device=device, precision=precision)
    err().print(f"• {model.model_id} on {model.device}, method {method}, target {target}")
    with progress() as bar:
        task = bar.add_task("explain", total=None)

        def on_progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        result = explain_dataset(
            directory, model, method=method, target=target, layer=layer, threshold=threshold,
            threshold_mode=threshold_mode, label_space=label_space, prompts=prompts, batch_size=batch_size,
            num_workers=workers, save_maps=save_maps, run_name=run_name, overwrite=overwrite, limit=limit,
            progress=on_progress,
        )
    summary = result.summary
    if as_json:
        out().print_json(json.dumps(_jsonable(summary)))
        return
    config = summary["config"]
    table = Table(title=f"SSS (lower = less spurious) and RMA (higher = more on the object): {config['method']}"
                        f" @ {config['layer'] or 'all layers'}, target {config['target']}"
                        + (f", threshold {config['threshold']} ({config['threshold_mode']})" if config["threshold"]
                           is not None else ""), title_justify="left")
    for column, justify in (("images", "left"), ("n", "right"), ("SSS", "right"), ("SSS balanced", "right"),
                            ("RMA", "right"), ("SSS uniform map", "right"), ("NaN", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    overall = summary["overall"]
    table.add_row("all", str(overall["sss"]["per_image"]["n"]), _fmt(overall["sss"]["per_image"]["mean"]),
                  _fmt(overall["sss"]["per_image"]["balanced"]), _fmt(overall["rma"]["per_image"]["mean"]),
                  _fmt(overall.get("sss_uniform")), str(overall["sss"]["per_image"]["n_nan"]))
    for part, entry in summary["by_group"].items():
        table.add_row(part, str(entry["sss"]["n"]), _fmt(entry["sss"]["mean"]), _fmt(entry["sss"]["balanced"]),
                      _fmt(entry["rma"]["mean"]), _fmt(entry.get("sss_uniform")), str(entry["sss"]["n_nan"]))
    for part, entry in summary["by_correct"].items():
        table.add_row(f"{part} prediction", str(entry["sss"]["n"]), _fmt(entry["sss"]["mean"]),
                      _fmt(entry["sss"]["balanced"]), _fmt(entry["rma"]["mean"]), "", str(entry["sss"]["n_nan"]))
    out().print(table)
    pred = overall["sss"]["per_prediction"]
    out().print(f"per prediction: SSS {_fmt(pred['mean'])} over {pred['n']} maps; accuracy "
                f"{_fmt(summary['accuracy'], 3)}; {summary['timing']['images_per_second']} images/s")
    if summary["nan"]["count"]:
        reasons = ", ".join(f"{k} {v}" for k, v in summary["nan"]["reasons"].items())
        out().print(f"NaN scores: {summary['nan']['count']} ({reasons})")
    if summary["skipped"]["count"]:
        reasons = ", ".join(f"{k} {v}" for k, v in summary["skipped"]["reasons"].items())
        out().print(f"skipped samples: {summary['skipped']['count']} ({reasons})")
    if result.run_dir is not None:
        out().print(f"wrote {result.run_dir}/ (predictions.parquet, images.parquet, classes.parquet, summary.json"
                    + (", maps/" if save_maps else "") + ")")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
