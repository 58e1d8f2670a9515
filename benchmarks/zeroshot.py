"""Zero-shot evaluation throughput: curate vs CLIP_benchmark, same model and images, one run.

    .venv/bin/python benchmarks/zeroshot.py --model ViT-B-32 --images 512 --device cpu

What is timed (wall clock, images/s = images / seconds):
- first pass: a 1-vs-1000 evaluation from nothing. CLIP_benchmark's
  ``zeroshot_classification.evaluate`` (its text classifier is built class by class, then the
  images are encoded); curate's ``evaluate`` with an empty feature cache (text
  classifier built in large batches, images encoded once and cached, run folder written).
- re-scoring, two cases, each a second evaluation of the same model:
  (a) another label space (a 100-label subset), same prompt: curate reuses the cached image
      embeddings and slices the cached text classifier, so it encodes nothing;
  (b) another label space *and* a new prompt ("a photo of a {}."): curate encodes the 100 new
      prompts (work CLIP_benchmark does too) and no image.
  CLIP_benchmark runs everything again in both cases.

- re-scoring from the command: (a) again, but as a fresh ``curate evaluate`` process (Python
  start, imports, the model's identity read from the dataset folder instead of loading the
  model: curate/engine/identity.py), against CLIP_benchmark's from-scratch run counting its
  model load from the same weights file, and (last row, "from the command to the metrics" on
  both sides) against CLIP_benchmark's run as a fresh process too (Python start, importing
  torch, open_clip and CLIP_benchmark, then the same run; its image list comes from a JSON file).

Every ratio is printed with ``os.getloadavg()`` (1-minute) taken just before it was measured:
on a shared 2-core machine a load above 2 means the timings are inflated.

Both tools get the same random-weights model (weights are irrelevant to speed), the same
preprocessing, batch size and decoding workers, and fp32 on CPU (``--amp`` turns on mixed
precision for both on a GPU). acc1 of the two first passes is printed as a sanity check.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def make_dataset(root: Path, n_images: int, size: int):
    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic

    classes = DEFAULT_CLASSES[:6]
    spec = WorldSpec(classes=classes, per_class=max(1, n_images // len(classes)), image_size=size, seed=0)
    return collect_synthetic(root, spec)


def run_clip_benchmark(load, paths, targets, names, templates, args) -> tuple[float, float]:
    """CLIP_benchmark's evaluate, timed from loading the model to the metrics."""
    from clip_benchmark.metrics import zeroshot_classification as zsc

    start = time.perf_counter()
    module, preprocess, tokenizer = load()

    class ImageSet(torch.utils.data.Dataset):
        classes = names

        def __len__(self):
            return len(paths)

        def __getitem__(self, i):
            from PIL import Image

            with Image.open(paths[i]) as image:
                return preprocess(image.convert("RGB")), targets[i]

    loader = torch.utils.data.DataLoader(ImageSet(), batch_size=args.batch_size, num_workers=args.workers,
                                         pin_memory=args.device.startswith("cuda"))
    metrics = zsc.evaluate(module, loader, tokenizer, names, templates, args.device, amp=args.amp)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, metrics["acc1"]


def clip_benchmark_process(case_file: Path, args) -> None:
    """The CLIP_benchmark side of a re-score as a user runs it: a fresh Python process that imports
    torch, open_clip and CLIP_benchmark, loads the weights file and evaluates (the image paths,
    targets and label names come from a plain JSON file, so no curate code runs in it)."""
    import open_clip

    case = json.loads(case_file.read_text())

    def load():
        module, _, preprocess = open_clip.create_model_and_transforms(args.model, pretrained=case["weights"],
                                                                      device=args.device)
        return module.eval(), preprocess, open_clip.get_tokenizer(args.model)

    run_clip_benchmark(load, case["paths"], case["targets"], case["names"], case["templates"], args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--image-size", type=int, default=64, help="stored image side (resized by the model's preprocessing)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--amp", action="store_true", help="mixed precision for both tools")
    parser.add_argument("--keep", action="store_true", help="keep the temporary dataset folder")
    parser.add_argument("--clip-benchmark-process", type=Path, help=argparse.SUPPRESS)  # internal: the child run
    args = parser.parse_args()
    if args.clip_benchmark_process:
        clip_benchmark_process(args.clip_benchmark_process, args)
        return

    from curate.labels import imagenet1k
    from curate.models import ModelSpec, load_model
    from curate.stages.evaluate import EvalSettings, evaluate

    workdir = Path(tempfile.mkdtemp(prefix="curate-bench-"))
    ds = make_dataset(workdir / "ds", args.images, args.image_size)
    rows = ds.rows()
    n = len(rows)
    names = list(imagenet1k().names)
    for r in rows:
        r["target"] = r["class_index"]
    precision = "amp" if args.amp else "fp32"
    seeded = load_model(args.model, None, seed=0, device="cpu")
    weights = workdir / "weights.pt"  # both tools load the very same weights file
    torch.save({"state_dict": seeded.module.state_dict(), "curate": {"arch": args.model}}, weights)
    del seeded
    spec = ModelSpec(args.model, str(weights))

    def cb_load():
        """How a CLIP_benchmark user loads the model: open_clip from the weights file."""
        import open_clip

        module, _, preprocess = open_clip.create_model_and_transforms(args.model, pretrained=str(weights),
                                                                      device=args.device)
        return module.eval(), preprocess, open_clip.get_tokenizer(args.model)
    subset = workdir / "subset.txt"
    present = sorted({r["class_index"] for r in rows})
    filler = [i for i in range(1000) if i not in present][: 100 - len(present)]
    subset.write_text("\n".join(str(i) for i in sorted(set(present) | set(filler))))
    caption = workdir / "caption.txt"
    caption.write_text("a photo of a {}.\n")
    common = dict(device=args.device, batch_size=args.batch_size, workers=args.workers, precision=precision, bootstrap=1000)

    print(f"model {args.model} (seeded random weights in a file) on {args.device}, {n} images, batch {args.batch_size}, workers {args.workers}, "
          f"precision {precision}, torch threads {torch.get_num_threads()}")
    load1 = os.getloadavg()[0]
    start = time.perf_counter()
    first = evaluate(ds.root, spec, EvalSettings(**common), run_name="bench-first", overwrite=True)
    t_cu1 = time.perf_counter() - start
    print(f"curate first pass: {t_cu1:.1f} s", flush=True)
    paths = [str(ds.image_path(r["sample_id"])) for r in rows]
    t_cb1, acc_cb = run_clip_benchmark(cb_load, paths, [r["target"] for r in rows], names, ["A photo of {c}."], args)
    print(f"CLIP_benchmark first pass: {t_cb1:.1f} s", flush=True)

    sub_names = [names[int(i)] for i in subset.read_text().split()]
    sub_rows = [dict(r, target=sub_names.index(names[r["class_index"]])) for r in rows]
    results = {}
    for case, prompt_file, template in (("a", None, "A photo of {c}."), ("b", caption, "a photo of a {c}.")):
        load = os.getloadavg()[0]
        t_cb, _ = run_clip_benchmark(cb_load, paths, [r["target"] for r in sub_rows], sub_names, [template], args)
        start = time.perf_counter()
        settings = EvalSettings(label_space=str(subset), **({"prompts": str(prompt_file)} if prompt_file else {}), **common)
        again = evaluate(ds.root, spec, settings, run_name=f"bench-rescore-{case}", overwrite=True)
        t_cu = time.perf_counter() - start
        assert again.images_encoded == 0, "re-scoring must not encode images"
        results[case] = (t_cb, t_cu, load)
        print(f"re-scoring ({case}): CLIP_benchmark {t_cb:.1f} s, curate {t_cu:.2f} s", flush=True)

    load = os.getloadavg()[0]
    command = [sys.executable, "-m", "curate.cli", "evaluate", str(ds.root), "--model", args.model, "--pretrained",
               str(weights), "--label-space", str(subset), "--device", args.device, "--batch-size",
               str(args.batch_size), "--run-name", "bench-rescore-cli", "--overwrite"]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    t_cli = time.perf_counter() - start
    results["cli"] = (results["a"][0], t_cli, load)
    print(f"re-scoring (a) as a fresh `curate evaluate` process: {t_cli:.2f} s", flush=True)

    case_file = workdir / "clip-benchmark-case.json"
    case_file.write_text(json.dumps({"weights": str(weights), "paths": paths, "names": sub_names,
                                     "targets": [r["target"] for r in sub_rows], "templates": ["A photo of {c}."]}))
    load = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--model", args.model, "--device", args.device, "--batch-size",
                    str(args.batch_size), "--workers", str(args.workers), *(["--amp"] if args.amp else []),
                    "--clip-benchmark-process", str(case_file)], check=True, capture_output=True)
    results["processes"] = (time.perf_counter() - start, t_cli, load)
    print(f"re-scoring (a) by CLIP_benchmark as a fresh process: {results['processes'][0]:.1f} s", flush=True)

    print(f"sanity: acc1 CLIP_benchmark {acc_cb:.4f}, curate {first.metrics['overall']['acc1']:.4f}")
    print("CLIP_benchmark is timed from loading the weights file to its metrics (last row: from its process start), "
          "curate from the library call (or the process start) to the run folder; load = 1-minute load average "
          "before the measurement")
    print(f"{'':44s}{'CLIP_benchmark':>16s}{'curate':>12s}{'ratio':>9s}")
    print(f"{'first pass 1 vs 1000 (img/s)':44s}{n / t_cb1:16.1f}{n / t_cu1:12.1f}{t_cb1 / t_cu1:8.1f}x   "
          f"({t_cb1:.1f} s vs {t_cu1:.1f} s; load {load1:.2f})")
    for case, label in (("a", "re-scoring, other labels (img/s)"), ("b", "re-scoring, new prompt (img/s)"),
                        ("cli", "re-scoring, other labels, CLI process"),
                        ("processes", "re-scoring, other labels, both as processes")):
        t_cb, t_cu, load = results[case]
        print(f"{label:44s}{n / t_cb:16.1f}{n / t_cu:12.1f}{t_cb / t_cu:8.1f}x   "
              f"({t_cb:.1f} s vs {t_cu:.2f} s; load {load:.2f})")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
