"""Fine-tune a (tiny) CLIPSeg on a dataset's exact or human masks (tests and the demo).

The objective is CLIPSeg's own: per-pixel binary cross-entropy between the decoder's logits
and the object mask (resized to the model's input size, bilinear, so edge pixels are soft
targets), the prompt being the sample's class name in a template (``"a photo of a {}."``)::

    loss = mean_{pixels} BCEWithLogits(logits(image, template.format(class)), mask)

Real CLIPSeg keeps its (pretrained) CLIP frozen and trains only the decoder, which is what
``CLIPSegForImageSegmentation.forward`` does (it runs CLIP under ``no_grad``). The tiny model's
CLIP is random, and on frozen random features the decoder reaches a held-out mean IoU of only
0.64 on the synthetic world (centre box: 0.50; measured with the defaults below, 400 steps,
10.6 s), so by default the whole model trains (``train_backbone=True``): 0.85 held-out in about
17 s on one core (400 steps of 32 images at 32 px; ``tests/test_masks_backends.py``). That
forward is our own few lines (the library's freezes CLIP); with ``train_backbone=False`` the
library's forward and loss are used as they are.

Samples are the rows whose mask a mask-based number may use (:func:`curate.masks.sources.trusted_rows`:
exact or human masks, never model proposals). The model and processor are saved with
``save_pretrained``; ``curate_training.json`` beside them lists the sample ids trained on
(``tuned_on``: :func:`read_tuned_on`; measuring the model on them would flatter it) with the
settings, the loss and the time. Everything is deterministic for a seed on the CPU.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TRAINING_META", "TUNED_ON_KEY", "ClipSegTrainConfig", "ClipSegTrainResult", "train_tiny_clipseg",
           "read_tuned_on"]

#: The file a fine-tune writes into the model folder.
TRAINING_META = "curate_training.json"
#: Its key listing the sample ids the model was trained on.
TUNED_ON_KEY = "tuned_on"


@dataclass(frozen=True)
class ClipSegTrainConfig:
    """Fine-tuning settings (defaults: ~17 s on one CPU core for the tiny model, 240 images)."""

    steps: int = 400
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.0
    seed: int = 0
    template: str = "a photo of a {}."
    #: train CLIP too (our forward), not only the decoder (the library's); see the module docstring.
    train_backbone: bool = True
    #: torch threads while training (None: leave as is). One thread is fastest for the tiny
    #: model on a shared machine, and gives the same numbers on every machine.
    threads: int | None = 1


@dataclass
class ClipSegTrainResult:
    """Where the model went, the samples it saw, how long it took and the loss per step."""

    path: Path
    tuned_on: list[str]
    seconds: float
    losses: list[float] = field(default_factory=list)


def read_tuned_on(folder: str | Path) -> set[str]:
    """The sample ids a model folder was fine-tuned on (``tuned_on`` of its ``curate_training.json``);
    empty for a folder without that file (a model curate did not train).

    Raises:
        ValueError: the file exists but is not JSON with a list of ids under ``tuned_on``.
    """
    meta = Path(folder).expanduser() / TRAINING_META
    if not meta.is_file():
        return set()
    try:
        ids = json.loads(meta.read_text()).get(TUNED_ON_KEY)
    except (ValueError, AttributeError) as error:
        raise ValueError(f"{meta} is not a curate training record ({error}); delete it or re-train") from None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"{meta}: {TUNED_ON_KEY!r} must be a list of sample ids")
    return set(ids)


def _samples(ds: Any, sample_ids: Sequence[str] | None) -> tuple[list[str], list[Any], list[np.ndarray], list[str]]:
    """``(ids, images, masks, class names)`` of the rows with trusted masks (optionally only ``sample_ids``)."""
    from curate.masks.sources import trusted_rows

    rows, _ = trusted_rows(ds.rows())
    if sample_ids is not None:
        wanted = set(sample_ids)
        rows = [r for r in rows if r["sample_id"] in wanted]
    if not rows:
        raise ValueError(f"{ds.root}: no samples with an exact or human mask to train on")
    ids = [str(r["sample_id"]) for r in rows]
    images = [ds.load_image(r["sample_id"]) for r in rows]
    masks = [np.asarray(ds.load_mask(r["sample_id"])) > 0 for r in rows]
    names = [ds.label_space.name_of(int(r["class_index"])) for r in rows]
    return ids, images, masks, names


def train_tiny_clipseg(dataset: Any, out: str | Path, *, base: str | Path | None = None,
                       config: ClipSegTrainConfig | None = None, sample_ids: Sequence[str] | None = None,
                       progress: Callable[[int, float], None] | None = None) -> ClipSegTrainResult:
    """Fine-tune CLIPSeg on ``dataset``'s trusted masks and save it to ``out``.

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        out: the model folder to write (created; loadable as ``clipseg:<out>``).
        base: the CLIPSeg folder to start from; None builds a fresh tiny one
            (:func:`curate.masks.tiny.build_tiny_clipseg`, seeded with ``config.seed``) in ``out``.
        config: :class:`ClipSegTrainConfig`.
        sample_ids: train only on these samples (default: every row with a trusted mask).
        progress: called with ``(step, loss)`` after each step.

    Returns:
        :class:`ClipSegTrainResult`; ``out/curate_training.json`` records ``tuned_on``, the
        settings, the final loss and the time.
    """
    import torch

    from curate.store import Dataset

    config = config or ClipSegTrainConfig()
    ds = dataset if isinstance(dataset, Dataset) else Dataset.open(Path(dataset))
    out = Path(out)
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        if base is None:
            from curate.masks.tiny import build_tiny_clipseg

            return _train(ds, out, build_tiny_clipseg(out, seed=config.seed), config, sample_ids, progress,
                          base_label=f"tiny CLIPSeg (seed {config.seed})")
        return _train(ds, out, Path(base), config, sample_ids, progress, base_label=str(base))
    finally:
        torch.set_num_threads(threads)


def _train(ds: Any, out: Path, base: Path, config: ClipSegTrainConfig, sample_ids: Sequence[str] | None,
           progress: Callable[[int, float], None] | None, *, base_label: str) -> ClipSegTrainResult:
    import torch
    import torch.nn.functional as F

    from curate.masks.backends import load_mask_model
    from curate.models.hf_folders import quiet_transformers

    ids, images, masks, names = _samples(ds, sample_ids)
    proposer = load_mask_model(f"clipseg:{base}", device="cpu", precision="fp32")
    model, processor = proposer.module, proposer.processor
    classes = sorted(set(names))
    text = processor.tokenizer([config.template.format(c) for c in classes], padding=True, truncation=True,
                               return_tensors="pt")
    label = torch.tensor([classes.index(n) for n in names])
    pixels = torch.cat([processor.image_processor(images[i:i + 256], return_tensors="pt")["pixel_values"]
                        for i in range(0, len(images), 256)])
    side = pixels.shape[-2:]
    targets = torch.cat([F.interpolate(torch.from_numpy(m.astype(np.float32))[None, None], size=tuple(side),
                                       mode="bilinear", align_corners=False)[0] for m in masks])

    def forward(batch: torch.Tensor) -> torch.Tensor:
        ids_, attn = text["input_ids"][label[batch]], text["attention_mask"][label[batch]]
        if not config.train_backbone:  # the library's forward: CLIP frozen, decoder trained
            return model(input_ids=ids_, attention_mask=attn, pixel_values=pixels[batch], labels=targets[batch]).loss
        # our own forward: CLIPSegForImageSegmentation.forward without its no_grad around CLIP
        vision = model.clip.vision_model(pixel_values=pixels[batch], output_hidden_states=True,
                                         interpolate_pos_encoding=True)
        activations = [vision.hidden_states[i + 1] for i in model.extract_layers]
        condition = model.clip.get_text_features(input_ids=ids_, attention_mask=attn).pooler_output
        logits = model.decoder(activations, condition).logits
        return F.binary_cross_entropy_with_logits(logits, targets[batch])

    torch.manual_seed(config.seed)
    params = [p for name, p in model.named_parameters() if config.train_backbone or name.startswith("decoder.")]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config.lr, total_steps=config.steps,
                                                   pct_start=0.1)
    generator = torch.Generator().manual_seed(config.seed)
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(config.steps):
        batch = torch.randint(0, len(ids), (min(config.batch_size, len(ids)),), generator=generator)
        loss = forward(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step, losses[-1])
    seconds = time.perf_counter() - start
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(out)
        processor.save_pretrained(out)
    record = {TUNED_ON_KEY: sorted(ids), "base": base_label, "base_model_id": proposer.model_id,
              "dataset": {"name": ds.name, "root": str(ds.root)}, "classes": classes, "images": len(ids),
              "config": asdict(config), "steps": config.steps, "seed": config.seed, "final_loss": losses[-1],
              "first_loss": losses[0], "seconds": round(seconds, 2)}
    (out / TRAINING_META).write_text(json.dumps(record, indent=1) + "\n")
    return ClipSegTrainResult(out, sorted(ids), seconds, losses)
