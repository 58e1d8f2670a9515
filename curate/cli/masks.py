"""``curate propose-masks``: a segmentation model proposes object masks; ``--measure`` scores them."""
from __future__ import annotations

import json
from pathlib import Path

import click

from curate.cli import StageProgress, err, main, out, progress, shown
from curate.cli.options import UserPath, batch_options, device_options, engine_options, run_options
from curate.shell import suggest

MODEL_HELP = ("clipseg:PATH | sam3:PATH | sam:PATH+owlv2:PATH | sam:PATH+grounding-dino:PATH | cam:<CLIP weights "
              "file or name> | salient:FILE.onnx (PATH: a local model folder or a repo id in the local Hugging Face "
              "cache; FILE: a local U2-Net / IS-Net / BiRefNet ONNX file; nothing is downloaded)")
#: The options of salient: models, folded into the spec (curate.masks.backends.salient.with_options).
SALIENT_OPTIONS = ("--preset", "--input-size", "--mean", "--std", "--postprocess")


@main.command("propose-masks")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--model", default=None, help=f"The mask model: {MODEL_HELP}.")
@click.option("--prompt", default=None,
              help="Text template with {} for the class name (default: '{}' for sam3, sam+grounding-dino and "
                   "salient, which reads no text; 'a photo of a {}.' otherwise).")
@click.option("--threshold", type=float, default=0.5, show_default=True,
              help="Per-pixel probability (clipseg, cam, salient) or instance/box score (sam3, sam+detector) a mask "
                   "needs.")
@click.option("--preset", default=None, metavar="NAME",
              help="Salient models only. The input size, normalisation and output of a model family as rembg runs "
                   "it: u2net, isnet, isnet-anime or birefnet (default: from the file's rembg name).")
@click.option("--input-size", default=None, metavar="N|HxW", help="Salient models only. The model's input size (over the preset).")
@click.option("--mean", default=None, metavar="R,G,B", help="Salient models only. Per-channel mean of [0, 1] pixels.")
@click.option("--std", default=None, metavar="R,G,B", help="Salient models only. Per-channel std of [0, 1] pixels.")
@click.option("--postprocess", default=None, metavar="minmax|sigmoid-minmax|sigmoid|none",
              help="Salient models only. How the model's first output becomes a map in [0, 1].")
@click.option("--only-missing", is_flag=True, help="Only samples with no mask at all (default: every sample in scope; "
                                                     "human and exact masks are never overwritten, only compared).")
@click.option("--retry-rejected", is_flag=True, help="Also samples whose proposal a reviewer rejected (mask:bad).")
@click.option("--limit", type=int, default=None, help="At most N samples (to try a model first).")
@click.option("--measure", is_flag=True, help="Write nothing: score a run's proposals against human or exact masks "
                                               "(mean IoU, IoU>=0.5/0.75, boundary F, baselines) and count verdicts.")
@click.option("--run", "run", default=None, help="With --measure: the run to score (default: the newest).")
@click.option("--json", "as_json", is_flag=True, help="With --measure: print the figures as JSON.")
@device_options
@batch_options(batch_size=16)
@engine_options
@run_options
def propose_masks_cmd(directory: Path, model: str | None, prompt: str | None, threshold: float, preset: str | None,
                      input_size: str | None, mean: str | None, std: str | None, postprocess: str | None,
                      only_missing: bool, retry_rejected: bool, limit: int | None, measure: bool, run: str | None,
                      as_json: bool, device: str, precision: str, batch_size: int, workers: int | None, engine: str,
                      ray_address: str | None, gpus_per_worker: float, run_name: str | None,
                      overwrite: bool) -> None:
    """Propose an object mask per photo (models propose, people verify in `curate review`).

    Proposals become masks with mask_status model:<id> where no human or exact mask exists;
    SSS, RMA, clarity, fidelity's mask method and composites ignore them until a reviewer
    accepts them (or --allow-model-masks).
    """
    from curate.stages.propose_masks import ProposeMasksSettings, measure_masks, propose_masks

    if measure:
        from curate.masks.measure import format_measurement, format_verdicts

        measurement, verdicts = measure_masks(directory, run)
        if as_json:
            out().print_json(json.dumps({"measurement": None if measurement is None else measurement.as_dict(),
                                         "review": verdicts.as_dict()}))
            return
        if measurement is None:
            out().print("nothing to measure against: no proposal of this run lies beside a human or exact mask that "
                        "the model was not tuned on (propose without --only-missing on photos people have masked)",
                        highlight=False)
        else:
            out().print(format_measurement(measurement), highlight=False)
        if verdicts.applied:
            out().print(format_verdicts(verdicts), highlight=False)
        else:
            out().print("reviewers' verdicts: none to count (this run wrote no proposal into the dataset: where it "
                        "proposed, a human or exact mask was already there, or it found nothing)", highlight=False)
        return
    if not model:
        raise click.UsageError("give --model (e.g. clipseg:~/models/clipseg-rd64-refined), or --measure")
    if model.partition(":")[0] != "cam":
        prefix, _, rest = model.partition(":")
        model = f"{prefix}:{_expand(rest)}"
    salient = {"preset": preset, "input_size": input_size, "mean": mean, "std": std, "postprocess": postprocess}
    if any(v is not None for v in salient.values()):
        if model.partition(":")[0] != "salient":
            raise click.UsageError(f"{', '.join(SALIENT_OPTIONS)} are options of salient: models (--model "
                                   "salient:FILE.onnx)")
        from curate.masks.backends.salient import with_options

        model = with_options(model, **salient)
    settings = ProposeMasksSettings(prompt=prompt, threshold=threshold, only_missing=only_missing,
                                    retry_rejected=retry_rejected, limit=limit, device=device, precision=precision,
                                    batch_size=batch_size, workers=workers, engine=engine, ray_address=ray_address,
                                    gpus_per_worker=gpus_per_worker)
    with progress() as bar:
        record = propose_masks(directory, model, settings, run_name=run_name, overwrite=overwrite,
                               progress=StageProgress(bar))
    c = record.counts
    out().print(f"{record.model_id}: {c.get('found', 0)} of {c.get('in_scope', 0)} photos got a proposal "
                f"({c.get('applied', 0)} written as masks to verify, {c.get('kept_trusted', 0)} kept only in the run "
                f"beside a human or exact mask); nothing found in {c.get('nothing_found', 0)}, "
                f"{c.get('wrong_size', 0)} refused for their size, {c.get('failed', 0)} failed"
                + (f"; {c['resumed']} from the interrupted run" if c.get("resumed") else ""), highlight=False)
    skipped = {k[len('skipped_'):]: v for k, v in c.items() if k.startswith("skipped_") and v}
    if skipped:
        out().print("not in scope: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in skipped.items()),
                    highlight=False)
    out().print(f"run: {shown(record.run_dir)}", highlight=False)
    if c.get("applied"):
        out().print(f"people verify them: `{suggest('curate review fiftyone {dir} --launch', dir=directory)}` "
                    f"(view 'masks to verify') or `{suggest('curate review labelstudio {dir} --url ...', dir=directory)}`; "
                    f"then `{suggest('curate review pull {dir}', dir=directory)}`", highlight=False)
    measure = suggest("curate propose-masks {dir} --measure --run {run}", dir=directory, run=record.name)
    out().print(f"how good they are: `{measure}`", highlight=False)
    if c.get("failed"):
        err().print(f"[yellow]{c['failed']} image(s) failed[/]; reasons in {shown(record.run_dir / 'proposals.parquet')}")


def _expand(parts: str) -> str:
    """``~`` expanded in each folder of a spec's ``PATH`` / ``PATH+detector:PATH``."""
    out_parts = []
    for piece in parts.split("+"):
        name, colon, folder = piece.partition(":")
        if colon and name in ("owlv2", "grounding-dino"):
            out_parts.append(f"{name}:{Path(folder).expanduser() if folder.startswith('~') else folder}")
        else:
            out_parts.append(str(Path(piece).expanduser()) if piece.startswith("~") else piece)
    return "+".join(out_parts)
