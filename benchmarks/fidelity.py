"""Fid+ (MoRF) curve throughput: curate's ``fidelity_curves`` against Quantus 0.6.0's ``PixelFlipping``.

Same model, images, explanations, labels and baseline in one run. Quantus's PixelFlipping is
the ready-made "remove the most relevant features first, record the prediction" curve a user
would otherwise reach for; set up as below it computes the same numbers as curate's Fid+ with
``score="probability"``. The script

1. draws ``--images`` images of the synthetic world (no files, no downloads), applies the
   model's own preprocessing and takes the label of each (a CLIP's zero-shot class among the
   world's classes, logits ``100 * cos(f(x), w_c)``; a timm classifier's ImageNet index);
2. gives each image a random explanation on the input grid, a random permutation of
   ``0 .. D-1`` (``D = H * W`` pixels): distinct scores, so the pixel order is unambiguous for
   both tools (curate breaks ties at random, Quantus by ``np.argsort``; ``torch.rand`` in float32
   has 2^24 values and gives a tie in about one 48 px image in six);
3. computes curate's per-image Fid+ curve, ``fidelity_curves(..., metrics=["fid_plus"],
   score="probability", baseline=0.0)``, at sparsities ``j / steps`` (``j = 1 .. steps - 1``) in
   batches of ``--batch-size``;
4. computes Quantus's pixel-flipping curve, ``PixelFlipping(features_in_step=3 * D / steps,
   perturb_baseline=0.0, normalise=False, abs=False)(..., softmax=True,
   batch_size=--batch-size)``;
5. checks ``curate Fid+[:, j-1] == p(y|x) - quantus[:, j-1]`` for ``j = 1 .. steps - 1`` (max
   |difference|, default tolerance 1e-5) and prints both throughputs (images/s for the whole
   curve) and the ratio.

How the two are aligned:

- Removal. Quantus flattens the input ``(N, 3, H, W)`` to ``3 * D`` features and broadcasts the
  2-D explanation ``(N, 1, H, W)`` over the channels, so each pixel's score appears three times;
  the three copies are equal and sort next to each other, so a step of ``3 * D / steps``
  features removes exactly ``D / steps`` whole pixels (all three channels), as curate does.
  Quantus asserts that ``features_in_step`` divides ``H * W`` (not ``3 * H * W``, the features
  it counts), which a whole-pixel step passes only when ``steps`` is a multiple of 3. Otherwise
  (160 and 224 px: ``H * W`` is not a multiple of 3) the script hands Quantus the same memory
  viewed as ``(N, 1, 3H, W)``, the explanation tiled to match, and the model behind a reshape
  back to ``(N, 3, H, W)``: the flattened feature order, hence what is removed, is unchanged.
- Baseline. ``perturb_baseline=0.0`` (a float) makes Quantus write 0.0 into the removed
  features: 0 in the normalised input space, curate's ``baseline=0.0`` (the normalisation
  mean). Quantus's default ``"black"`` would be the minimum of each image instead.
- Order and steps. Quantus removes pixels cumulatively in descending order of the (not
  normalised, not absolute) explanation, ``D / steps`` more per step, ``steps`` steps; after
  step ``j`` the top ``j * D / steps`` pixels are gone, curate's ``k = round(s * D)`` at
  ``s = j / steps``. Quantus's last step removes every pixel; curate caps the explanation at
  ``D - 1`` pixels, so that step has no curate counterpart and is not compared.
- Score. ``softmax=True``: Quantus appends ``nn.Softmax(dim=-1)`` to the model and records
  ``p(y | x with pixels removed)``; curate's ``score="probability"`` is the same softmax
  probability. Quantus does not record ``p(y | x)``, which Fid+ subtracts from; the script takes
  it from one untimed forward pass of the same model.
- Work. Both do ``steps`` batched forward passes per image: curate one unperturbed and
  ``steps - 1`` removals, Quantus ``steps`` removals. The unperturbed pass that a Quantus user
  would need for Fid+ is left out of Quantus's time (in its favour).

Examples::

    .venv/bin/python benchmarks/fidelity.py                                  # tiny CLIP (48 px), CPU
    .venv/bin/python benchmarks/fidelity.py --model timm:test_resnet --images 16 --batch-size 16
    .venv/bin/python benchmarks/fidelity.py --model ViT-B-32 --device cuda --images 256 --batch-size 64

Weights are random (``seed=0``): throughput does not depend on them, and nothing is downloaded.
A random model's probabilities move little as pixels go (its curves are small), so the script
also prints the largest change between neighbouring points of a curve, the difference a
one-step misalignment would show, and says when that is under 10x the tolerance (a weak check).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger("benchmarks.fidelity")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from saliency import ZeroShotHead, configure, synthetic_images  # noqa: E402  (shared with the GradCAM benchmark)


class StackedChannels(torch.nn.Module):
    """``net`` on images handed over as ``(N, 1, 3H, W)`` (the channels stacked along the height):
    the same memory as ``(N, 3, H, W)``, so the same flattened feature order."""

    def __init__(self, net: torch.nn.Module, h: int, w: int) -> None:
        super().__init__()
        self.net, self.h, self.w = net, h, w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(x.shape[0], 3, self.h, self.w))


def pick_steps(d: int, wanted: int) -> int:
    """The number of steps closest to ``wanted`` (at least 2) that divides ``d`` pixels evenly."""
    divisors = [s for s in range(2, d + 1) if d % s == 0]
    return min(divisors, key=lambda s: (abs(s - wanted), s))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="curate-tiny-clip-rn",
                        help="open_clip arch (zero-shot over the world's classes) or timm:<name>; random weights")
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch, both tools")
    parser.add_argument("--steps", type=int, default=18,
                        help="removal steps of Quantus (curate's curve has steps - 1 points); the nearest divisor "
                             "of H*W is used")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each tool, alternating; best kept")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args(argv)
    configure(log, args.threads)

    import quantus

    from curate.metrics.fidelity import fidelity_curves
    from curate.models import load_model
    from curate.saliency import clip_classifier

    model = load_model(args.model, seed=0, device=args.device)
    pil, classes, positions, names = synthetic_images(args.images, size=max(model.image_size))
    x = model.preprocess_images(pil).to(model.device)
    if model.kind == "clip":
        net: torch.nn.Module = ZeroShotHead(model.module, clip_classifier(model, names)).to(model.device)
        labels = positions
    else:
        net = model.module
        labels = classes
    net.eval()
    n, _, h, w = x.shape
    d = h * w
    steps = pick_steps(d, args.steps)
    per_step = d // steps
    sparsities = [j * per_step / d for j in range(1, steps)]

    gen = torch.Generator().manual_seed(0)
    explanations = torch.stack([torch.randperm(d, generator=gen) for _ in range(n)]).float().reshape(n, h, w)
    labels_t = torch.as_tensor(labels, device=model.device)
    x_np = x.cpu().numpy()
    a_np = explanations.unsqueeze(1).numpy()  # (N, 1, H, W): Quantus broadcasts it over the channels
    q_net = net
    stacked = steps % 3 != 0  # Quantus asserts (H*W) % features_in_step == 0, with 3 * D / steps features
    if stacked:  # a step of whole pixels fails that check: hand over the same memory as (N, 1, 3H, W)
        q_net = StackedChannels(net, h, w).eval()
        x_np = x_np.reshape(n, 1, 3 * h, w)
        a_np = np.tile(a_np, (1, 1, 3, 1))  # channel c of pixel p at flat index c * D + p, as before
    y_np = np.asarray(labels)
    quantus_device = str(model.device)
    log.info("model %s (%s) on %s, %d images of %s, %d steps of %d pixels, batch %d, threads %d%s",
             model.model_id, model.kind, model.device, n, tuple(x.shape[1:]), steps, per_step,
             args.batch_size, torch.get_num_threads(),
             "; Quantus gets the images as (N, 1, 3H, W) (steps not a multiple of 3)" if stacked else "")

    def sync() -> None:
        if model.device.type == "cuda":
            torch.cuda.synchronize()

    def run_curate(images: torch.Tensor, expl: torch.Tensor, lab: list[int]) -> np.ndarray:
        curves = fidelity_curves(net, images, expl.to(images.device), lab, sparsities=sparsities,
                                 metrics=["fid_plus"], score="probability", baseline=0.0, chunk=args.batch_size)
        return curves.per_image["fid_plus"]

    def run_quantus(images: np.ndarray, expl: np.ndarray, lab: np.ndarray) -> np.ndarray:
        metric = quantus.PixelFlipping(features_in_step=3 * per_step, perturb_baseline=0.0, normalise=False,
                                       abs=False, disable_warnings=True, display_progressbar=False)
        scores = metric(model=q_net, x_batch=images, y_batch=lab, a_batch=expl, channel_first=True, softmax=True,
                        device=quantus_device, batch_size=args.batch_size)
        return np.asarray(scores, dtype=np.float64)

    # warm-up both on one full batch (allocators, kernels for the timed batch shape, lazy imports)
    m = min(n, args.batch_size)
    run_curate(x[:m], explanations[:m], labels[:m])
    run_quantus(x_np[:m], a_np[:m], y_np[:m])
    sync()

    times_ours, times_ref = [], []
    for _ in range(max(1, args.repeats)):  # alternate, keep the best of each (the CPU may be shared)
        start = time.perf_counter()
        ours = run_curate(x, explanations, labels)
        sync()
        times_ours.append(time.perf_counter() - start)

        start = time.perf_counter()
        ref = run_quantus(x_np, a_np, y_np)
        sync()
        times_ref.append(time.perf_counter() - start)
    t_ours, t_ref = min(times_ours), min(times_ref)

    with torch.no_grad():  # p(y|x): Fid+ subtracts from it; Quantus does not record it
        p0 = torch.cat([net(x[i:i + args.batch_size]).float().softmax(-1) for i in range(0, n, args.batch_size)])
        p0 = p0.gather(1, labels_t.unsqueeze(1)).squeeze(1).cpu().numpy().astype(np.float64)
    ref_fid = p0[:, None] - ref[:, : steps - 1]
    diff = float(np.abs(ours - ref_fid).max())
    ok = diff <= args.tolerance
    ours_rate, ref_rate = n / t_ours, n / t_ref
    # how far apart neighbouring points of a curve are: what a one-step misalignment would show
    spread = float(np.abs(np.diff(ours, axis=1)).max()) if steps > 2 else float("nan")
    log.info("curves: %d images x %d sparsities (%.4f .. %.4f); p(y|x) %.4f .. %.4f; max |Fid+| %.2e, "
             "max |change between neighbouring steps| %.2e", n, steps - 1, sparsities[0], sparsities[-1],
             p0.min(), p0.max(), np.abs(ours).max(), spread)
    if not spread > 10 * args.tolerance:
        log.info("note: the curves move less than 10x the tolerance between steps, so the check is weak here")
    log.info("agreement: max |curate Fid+ - (p(y|x) - quantus)| = %.2e (%s, tolerance %.0e)",
             diff, "OK" if ok else "FAIL", args.tolerance)
    log.info("curate fidelity_curves (batch %d):  %8.1f images/s  (%d images in %.2f s)", args.batch_size,
             ours_rate, n, t_ours)
    log.info("quantus PixelFlipping (batch %d):   %8.1f images/s  (%d images in %.2f s)", args.batch_size,
             ref_rate, n, t_ref)
    log.info("all runs (s): curate %s; quantus %s", " ".join(f"{t:.2f}" for t in times_ours),
             " ".join(f"{t:.2f}" for t in times_ref))
    log.info("ratio: %.1fx", ours_rate / ref_rate)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
