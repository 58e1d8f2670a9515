"""GradCAM throughput: curate (batched) against pytorch-grad-cam one image at a time (SemScore's way).

Same model, same inputs, same layer, same targets (the true class: a CLIP's zero-shot logit
``100 * cos(f(x), w_c)``, a timm classifier's logit). The script

1. draws ``--images`` images of the synthetic world (no files, no downloads) and applies the
   model's own preprocessing;
2. computes GradCAM maps with ``curate.saliency.Explainer`` in batches of ``--batch-size``;
3. computes them with ``pytorch_grad_cam.GradCAM`` called once per image (the CAM object is
   built once, as SemScore does);
4. checks the two agree (max |difference| after min-max normalisation, default tolerance 1e-4)
   and prints both throughputs and the ratio.

Examples::

    .venv/bin/python benchmarks/saliency.py                                  # ViT-B-32 (random weights), CPU
    .venv/bin/python benchmarks/saliency.py --model timm:resnet50 --images 32
    .venv/bin/python benchmarks/saliency.py --model ViT-B-32 --device cuda --images 512 --batch-size 128

Weights are random (``seed=0``): throughput and agreement do not depend on them, and nothing is
downloaded.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger("benchmarks.saliency")


def configure(logger: logging.Logger, threads: int) -> None:
    """Plain log lines on stdout, library warnings off, ``threads`` torch CPU threads (0: default)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
    logger.setLevel(logging.INFO)
    warnings.filterwarnings("ignore")
    if threads:
        torch.set_num_threads(threads)


def synthetic_images(n: int, size: int = 224) -> tuple[list, list[int], list[int], list[str]]:
    """``n`` synthetic-world PIL images, their ImageNet-1K class indices, their class positions
    among the world's classes, and the world's class names."""
    from PIL import Image

    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, generate_sample

    spec = WorldSpec(classes=DEFAULT_CLASSES[:6], per_class=max(1, -(-n // 6)), image_size=size, seed=0)
    images, imagenet, positions = [], [], []
    for i in range(n):
        sample = generate_sample(spec, i)
        images.append(Image.fromarray(sample.image))
        imagenet.append(sample.cls.imagenet_index)
        positions.append(spec.classes.index(sample.cls))
    return images, imagenet, positions, [c.name for c in spec.classes]


class ZeroShotHead(torch.nn.Module):
    """A CLIP as an ``nn.Module`` returning zero-shot logits ``100 * cos(f(x), w_c)`` (for pytorch-grad-cam, Quantus)."""

    def __init__(self, clip: torch.nn.Module, weights: torch.Tensor) -> None:
        super().__init__()
        self.clip = clip
        self.register_buffer("weights", F.normalize(weights.float(), dim=-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 100.0 * F.normalize(self.clip.encode_image(x).float(), dim=-1) @ self.weights.t()


def minmax(maps: np.ndarray) -> np.ndarray:
    flat = maps.reshape(maps.shape[0], -1).astype(np.float64)
    flat = flat - flat.min(axis=1, keepdims=True)
    flat = flat / (flat.max(axis=1, keepdims=True) + 1e-12)
    return flat.reshape(maps.shape)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="ViT-B-32", help="open_clip arch or timm:<name> (random weights)")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--reference-images", type=int, default=None,
                        help="time pytorch-grad-cam on only this many of the images (default: all)")
    args = parser.parse_args(argv)
    configure(log, args.threads)

    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    from curate.models import load_model
    from curate.saliency import Explainer, clip_classifier
    from curate.saliency.layers import token_geometry

    model = load_model(args.model, seed=0, device=args.device)
    pil, classes, positions, names = synthetic_images(args.images)
    x = model.preprocess_images(pil)
    if model.kind == "clip":
        weights = clip_classifier(model, names)  # zero-shot classifier over the world's classes
        explainer = Explainer(model, "gradcam", classifier=weights)
        net: torch.nn.Module = ZeroShotHead(model.module, weights).to(model.device)
        labels_curate = positions
        targets_ref = positions
    else:
        explainer = Explainer(model, "gradcam")
        net = model.module
        labels_curate = classes
        targets_ref = classes
    layer_name, layer = explainer.layer_name, explainer.layer
    reshape = None
    if x.ndim == 4 and layer_name and ("ln_1" in layer_name or "norm1" in layer_name):
        prefix, grid = token_geometry(explainer.tower)

        def reshape(t: torch.Tensor) -> torch.Tensor:  # batch-first tokens -> (N, D, gh, gw)
            return t[:, prefix:, :].reshape(t.size(0), grid[0], grid[1], t.size(2)).permute(0, 3, 1, 2)

    log.info("model %s (%s) on %s, layer %s, %d images of %s, threads %d", model.model_id, model.kind,
             model.device, layer_name, len(x), tuple(x.shape[1:]), torch.get_num_threads())

    def sync() -> None:
        if model.device.type == "cuda":
            torch.cuda.synchronize()

    # warm-up both (allocators, kernels, lazy imports)
    explainer.explain_batched(x[: min(len(x), args.batch_size)], "true", labels_curate[: args.batch_size],
                              batch_size=args.batch_size)
    cam = GradCAM(model=net, target_layers=[layer], reshape_transform=reshape)
    cam(input_tensor=x[:1].to(model.device), targets=[ClassifierOutputTarget(targets_ref[0])])
    sync()

    start = time.perf_counter()
    ours = explainer.explain_batched(x, "true", labels_curate, batch_size=args.batch_size)
    sync()
    ours_maps = ours.maps[:, 0].float().cpu().numpy()
    t_ours = time.perf_counter() - start

    n_ref = min(len(x), args.reference_images or len(x))
    start = time.perf_counter()
    ref_maps = []
    for i in range(n_ref):
        ref_maps.append(cam(input_tensor=x[i:i + 1].to(model.device),
                            targets=[ClassifierOutputTarget(targets_ref[i])])[0])
    sync()
    t_ref = time.perf_counter() - start
    ref = np.stack(ref_maps)

    diff = float(np.abs(minmax(ours_maps[:n_ref]) - minmax(ref)).max())
    ours_rate = len(x) / t_ours
    ref_rate = n_ref / t_ref
    ok = diff <= args.tolerance
    log.info("agreement: max |curate - pytorch-grad-cam| after min-max = %.2e (%s, tolerance %.0e)",
             diff, "OK" if ok else "FAIL", args.tolerance)
    log.info("curate (batched, batch %d):        %8.1f images/s  (%d images in %.2f s)", args.batch_size,
             ours_rate, len(x), t_ours)
    log.info("pytorch-grad-cam (one at a time): %8.1f images/s  (%d images in %.2f s)", ref_rate, n_ref, t_ref)
    log.info("ratio: %.1fx", ours_rate / ref_rate)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
