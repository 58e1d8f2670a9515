"""The ``explain`` verb: saliency maps, SSS and RMA for a dataset folder (:mod:`curate.stages.explain`)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from curate.cli import err, main, out, progress, shown
from curate.cli.options import (
    UserPath,
    batch_options,
    device_options,
    engine_options,
    expand_home,
    mask_trust_option,
    run_options,
)
from curate.saliency.registry import method_names

if TYPE_CHECKING:  # pragma: no cover
    from curate.runs.explain import ExplainRun, GroupScores


def _target(ctx: click.Context, param: click.Parameter, value: str):
    """``--target`` parsed once, here, into a target object."""
    from curate.saliency.base import SaliencyError
    from curate.saliency.targets import parse_target

    try:
        return parse_target(value)
    except SaliencyError as error:
        raise click.BadParameter(str(error), ctx=ctx, param=param) from None


@main.command("explain")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--model", "model_name", default="auto", show_default=True,
              help="Model name (open_clip arch, zoo name, timm:<name>) or 'auto' for a curate weights file.")
@click.option("--pretrained", callback=expand_home, default=None, help="Pretrained tag or local weights file ('none' = random weights).")
@click.option("--method", type=click.Choice(method_names(), case_sensitive=False), default="gradcam",
              show_default=True, help="Saliency method (papers/004 Tables 1-4, 8-9).")
@click.option("--target", default="true", show_default=True, callback=_target, help="true | predicted | topk:K")
@click.option("--layer", default=None, help="Layer the CAM reads (default: the method's documented default).")
@click.option("--threshold", type=float, default=None, help="Threshold tau on the [0, 1] maps (papers/004 App. C).")
@click.option("--threshold-mode", type=click.Choice(["soft", "hard"]), default="soft", show_default=True)
@click.option("--label-space", type=click.Choice(["dataset", "present"]), default="dataset", show_default=True,
              help="Candidate classes of predicted/top-k targets: the whole label space or the classes present.")
@click.option("--prompts", callback=expand_home, default=None,
              help="simple | openai | template file (default: the weights' caption template, else simple).")
@click.option("--save-maps", is_flag=True,
              help="Write maps/<sample_id>.npz (float32 maps the scores come from, aligned mask, targets).")
@run_options
@device_options
@batch_options(batch_size=32)
@engine_options
@click.option("--limit", type=int, default=None, help="Explain only the first N samples with a mask.")
@mask_trust_option
@click.option("--json", "as_json", is_flag=True, help="Print the run's config and summary as JSON instead of tables.")
def explain_cmd(directory: Path, model_name: str, pretrained: str | None, method: str, target, layer: str | None,
                threshold: float | None, threshold_mode: str, label_space: str, prompts: str | None, save_maps: bool,
                run_name: str | None, overwrite: bool, device: str, precision: str, batch_size: int, workers: int,
                engine: str, ray_address: str | None, gpus_per_worker: float, limit: int | None,
                allow_model_masks: bool, as_json: bool) -> None:
    """Saliency maps, SSS and RMA (per prediction, image, class; by group and correct/wrong) for DIR."""
    from curate.jsonio import dumps
    from curate.models.spec import ModelSpec, parse_pretrained
    from curate.stages.explain import ExplainSettings, explain

    name = "auto" if model_name in ("", "auto") else model_name
    weights = parse_pretrained(pretrained)
    if name == "auto" and weights is None:
        raise click.UsageError("give --model NAME (and --pretrained), or --pretrained FILE of a curate weights file")
    settings = ExplainSettings(
        method=method, target=target, layer=layer, threshold=threshold, threshold_mode=threshold_mode,
        label_space=label_space, prompts=prompts, limit=limit, batch_size=batch_size, device=device,
        precision=precision, workers=workers, save_maps=save_maps, engine=engine, ray_address=ray_address,
        gpus_per_worker=gpus_per_worker, allow_model_masks=allow_model_masks,
    )
    spec = ModelSpec(name, weights)
    err().print(f"• {spec.label}, method {settings.method}, target {settings.target}")
    with progress() as bar:
        task = bar.add_task("explain", total=None)

        def on_progress(done: int, total: int | None, message: str = "") -> None:
            bar.update(task, completed=done, total=total, description=message or "explain")

        run = explain(directory, spec, settings, run_name=run_name, overwrite=overwrite, progress=on_progress)
    if as_json:
        out().print_json(dumps(run.to_json()))
        return
    render(run)


def _reasons(reasons: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]))


def render(run: ExplainRun) -> None:
    """The run's SSS / RMA table (all images, each split part, correct / wrong), the masks it used
    by source (caption) and its notes."""
    from curate.formatting import num
    from curate.metrics.spuriousity import RMA_INFO, SSS_INFO

    def direction(info) -> str:
        return "higher" if info.higher_is_better else "lower"

    threshold = f", threshold {run.threshold} ({run.threshold_mode})" if run.threshold is not None else ""
    table = Table(title=f"SSS ({direction(SSS_INFO)} = less spurious) and RMA ({direction(RMA_INFO)} = more on the "
                        f"object): {run.method} @ {run.layer or 'all layers'}, target {run.target}{threshold}",
                  title_justify="left", caption=run.mask_line, caption_justify="left")
    for column, justify in (("images", "left"), ("n", "right"), ("SSS", "right"), ("SSS balanced", "right"),
                            ("RMA", "right"), ("SSS uniform map", "right"), ("NaN images", "right"),
                            ("NaN maps (why)", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]

    def row(label: str, g: GroupScores, uniform: bool = True, reasons: bool = True) -> None:
        why = (f"{g.nan_maps}: {_reasons(g.nan_reasons)}" if g.nan_maps else "0") if reasons else ""
        table.add_row(label, str(g.n), num(g.sss.mean, 4), num(g.sss.balanced, 4), num(g.rma.mean, 4),
                      num(g.sss_uniform, 4) if uniform else "", str(g.n_nan), why)

    row("all", run.overall)
    for part, g in run.groups.items():
        row(part, g)
    for part, g in run.by_correct.items():
        row(f"{part} prediction", g, uniform=False, reasons=False)
    out().print(table)
    pred = run.per_prediction["sss"]
    out().print(f"per prediction: SSS {num(pred.mean, 4)} over {pred.n} maps; accuracy {num(run.accuracy, 3)}; "
                f"{num(run.images_per_second, 2)} images/s")
    if run.nan_count:
        out().print(f"NaN scores: {run.nan_count} maps ({_reasons(run.nan_reasons)})")
    if run.skipped_count:
        out().print(f"skipped samples: {run.skipped_count} ({_reasons(run.skipped_reasons)})")
    if run.run_dir is not None:
        files = [run.PREDICTIONS, run.IMAGES, run.CLASSES, run.SUMMARY] + ([run.MAPS + "/"] if run.maps_saved else [])
        out().print(f"wrote {shown(run.run_dir)}/ ({', '.join(files)})")
