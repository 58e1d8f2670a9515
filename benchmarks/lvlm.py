"""LVLM answer scoring: curate's KV-cache route against one forward per (image, candidate).

lmms-eval and most research code score a multiple-choice answer by running the whole model
(vision tower, image tokens, question, answer) once per (image, candidate) with the context
masked out of the loss. curate runs the image-and-question prefix once per image (batched
across images), copies its key/value cache per candidate and scores every candidate's answer
tokens in one batched forward (:meth:`curate.lvlm.hf.HFLvlm.answer_losses`). Both give the same
mean NLL per candidate; this script checks that (``--tolerance``, default 1e-4) and prints the
ratio of the two wall times on the same model, images and candidates.

The model is the tiny random LLaVA of :mod:`curate.lvlm.tiny`, with a text side big enough for
the prefix to matter (default: 4 Llama layers of width 256, 64 px images = 64 image tokens).
Run: ``.venv/bin/python benchmarks/lvlm.py [--images 8] [--candidates 20] [--device cpu]``.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--candidates", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--text-hidden", type=int, default=256)
    parser.add_argument("--text-layers", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--repeat", type=int, default=3, help="best of N alternating runs")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    import torch
    from PIL import Image

    from curate.labels import imagenet1k
    from curate.lvlm.hf import DEFAULT_QUESTION, load_hf_lvlm
    from curate.lvlm.tiny import TinyLlavaSize, build_tiny_llava

    if args.threads:
        torch.set_num_threads(args.threads)
    size = TinyLlavaSize(vision_hidden=64, vision_layers=2, vision_heads=4, patch_size=8,
                         text_hidden=args.text_hidden, text_layers=args.text_layers, text_heads=4,
                         text_intermediate=4 * args.text_hidden)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_llava(Path(tmp) / "tiny", seed=0, image_size=args.image_size, size=size)
        lvlm = load_hf_lvlm(folder, device=args.device, precision=args.precision)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (args.image_size, args.image_size, 3), dtype=np.uint8))
              for _ in range(args.images)]
    names = imagenet1k().names
    answers = [[f"A {names[j]}." for j in rng.choice(len(names), size=args.candidates, replace=False)]
               for _ in range(args.images)]
    n_prefix = lvlm._prefix_inputs(images[:1], lvlm.context(DEFAULT_QUESTION))["input_ids"].shape[1]
    params = sum(p.numel() for p in lvlm.module.parameters())

    def sync() -> None:
        if lvlm.device.type == "cuda":
            torch.cuda.synchronize()

    lvlm.answer_losses(images[:1], DEFAULT_QUESTION, answers[:1])  # warm-up, both routes
    lvlm.answer_losses_naive(images[:1], DEFAULT_QUESTION, [answers[0][:2]])
    kv_times, naive_times = [], []
    for _ in range(args.repeat):
        sync()
        start = time.perf_counter()
        kv_mean, kv_sum = lvlm.answer_losses(images, DEFAULT_QUESTION, answers)
        sync()
        kv_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        naive_mean, naive_sum = lvlm.answer_losses_naive(images, DEFAULT_QUESTION, answers)
        sync()
        naive_times.append(time.perf_counter() - start)
    diff = float(np.nanmax(np.abs(kv_mean - naive_mean)))
    diff_sum = float(np.nanmax(np.abs(kv_sum - naive_sum)))
    kv, naive = min(kv_times), min(naive_times)
    device = torch.cuda.get_device_name(lvlm.device) if lvlm.device.type == "cuda" else "cpu"
    print(f"model: tiny random LLaVA, {params / 1e6:.1f} M parameters (text {args.text_layers} layers x "
          f"{args.text_hidden}, vision 2 x 64), {args.precision} on {device}, torch threads {torch.get_num_threads()}")
    print(f"inputs: {args.images} images ({args.image_size} px, {n_prefix} prefix tokens) x {args.candidates} "
          f"candidates = {args.images * args.candidates} answers")
    print(f"same losses: max |mean NLL difference| {diff:.2e}, max |sum NLL difference| {diff_sum:.2e} "
          f"(tolerance {args.tolerance:g})")
    print(f"naive (one full forward per image x candidate, lmms-eval): {naive:.3f} s "
          f"({args.images * args.candidates / naive:.0f} answers/s)")
    print(f"curate KV-cache (prefix once per image, candidates batched): {kv:.3f} s "
          f"({args.images * args.candidates / kv:.0f} answers/s)")
    print(f"ratio naive / curate: {naive / kv:.1f}x (best of {args.repeat})")
    return 0 if diff <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
