"""Fine-tune a (tiny) LLaVA to answer "A <class>." on a synthetic world (demo and tests).

The paper's question for LVLMs (papers/003 §3.3, App. C.4) is whether they, too, rely on the
background. On the synthetic world (docs/design.md#synthetic-world) we can plant the answer:
a tiny LLaVA (:mod:`curate.lvlm.tiny`) fine-tuned on a world where each class sits on its
common background with probability ``p = 0.9`` should lean on the background and show a
larger easy-hard drop than one fine-tuned on an uncorrelated world.

The objective is LLaVA's instruction-tuning loss: for image ``x`` of class ``y``, the mean NLL
of the answer tokens of ``answer_template.format(name(y))`` given the chat-formatted image and
question, context tokens masked (``labels = -100``), exactly the loss the scorer ranks by.
All parameters train with AdamW. The fine-tuned model is saved with ``save_pretrained``
(model and processor), so it loads like any other LLaVA folder; ``curate_train.json`` beside
it records the settings and a key the demo uses to reuse it.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from curate.lvlm.hf import DEFAULT_ANSWER_TEMPLATE, DEFAULT_QUESTION

__all__ = ["LlavaTrainConfig", "LlavaTrainResult", "finetune_llava", "train_key", "trained_with"]

TRAIN_META = "curate_train.json"


@dataclass(frozen=True)
class LlavaTrainConfig:
    """Fine-tuning settings (defaults: seconds on 2 CPU cores for the tiny model)."""

    steps: int = 300
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 0.0
    seed: int = 0
    question: str = DEFAULT_QUESTION
    answer_template: str = DEFAULT_ANSWER_TEMPLATE
    #: torch threads while training (None: leave as is). One thread is ~10x faster for the tiny
    #: model on a busy 2-core machine (measured: 0.04 s vs 0.38 s per step of batch 8).
    threads: int | None = None


@dataclass
class LlavaTrainResult:
    """Where the model went, how long it took, and the loss per step."""

    path: Path
    seconds: float
    losses: list[float] = field(default_factory=list)


def train_key(config: LlavaTrainConfig, extra: dict[str, Any]) -> str:
    """A 16-hex-digit key of the settings and ``extra`` (the world, the base model)."""
    blob = json.dumps({"train": asdict(config), **extra}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def trained_with(path: Path, key: str) -> bool:
    """Whether ``path`` holds a finished fine-tune made with the settings of ``key``."""
    meta = Path(path) / TRAIN_META
    if not meta.is_file() or not (Path(path) / "config.json").is_file():
        return False
    try:
        return json.loads(meta.read_text()).get("key") == key
    except ValueError:
        return False


def finetune_llava(base: str | Path, images: np.ndarray, class_names: Sequence[str], labels: np.ndarray,
                   out: Path, config: LlavaTrainConfig | None = None, *, key: str | None = None,
                   progress: Callable[[int, float], None] | None = None) -> LlavaTrainResult:
    """Fine-tune the LLaVA at ``base`` on ``images`` ``(N, H, W, 3)`` uint8 with answers
    ``answer_template.format(class_names[labels[i]])`` and save it to ``out``.

    ``progress(step, loss)`` is called after each step.
    """
    import torch

    config = config or LlavaTrainConfig()
    if len(images) != len(labels) or not len(images):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        return _finetune(base, images, class_names, labels, Path(out), config, key, progress)
    finally:
        torch.set_num_threads(threads)


def _finetune(base, images, class_names, labels, out: Path, config: LlavaTrainConfig, key: str | None,
              progress) -> LlavaTrainResult:
    import torch
    from PIL import Image

    from curate.lvlm.hf import load_hf_lvlm
    from curate.models.hf_folders import quiet_transformers

    torch.manual_seed(config.seed)
    lvlm = load_hf_lvlm(base, device="cpu", precision="fp32")
    model = lvlm.module
    context = lvlm.context(config.question)
    pixel = torch.cat([lvlm.processor.image_processor([Image.fromarray(im) for im in images[i:i + 256]],
                                                      return_tensors="pt")["pixel_values"]
                       for i in range(0, len(images), 256)])
    prefix = lvlm.processor(images=[Image.fromarray(images[0])], text=[context], return_tensors="pt")["input_ids"][0]
    answers = [lvlm.answer_token_ids(context, config.answer_template.replace("{}", name)) for name in class_names]
    length = len(prefix) + max(len(a) for a in answers)
    pad = lvlm.processor.tokenizer.pad_token_id or 0
    tokens = torch.full((len(class_names), length), pad, dtype=torch.long)
    targets = torch.full((len(class_names), length), -100, dtype=torch.long)
    mask = torch.zeros((len(class_names), length), dtype=torch.long)
    for c, ids in enumerate(answers):
        n = len(prefix) + len(ids)
        tokens[c, :n] = torch.cat([prefix, torch.tensor(ids)])
        targets[c, len(prefix):n] = torch.tensor(ids)
        mask[c, :n] = 1
    labels_t = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config.lr, total_steps=config.steps,
                                                   pct_start=0.1)
    generator = torch.Generator().manual_seed(config.seed)
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(config.steps):
        batch = torch.randint(0, len(images), (min(config.batch_size, len(images)),), generator=generator)
        cls = labels_t[batch]
        out_ = model(input_ids=tokens[cls], attention_mask=mask[cls], pixel_values=pixel[batch], labels=targets[cls])
        optimizer.zero_grad(set_to_none=True)
        out_.loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(out_.loss.detach()))
        if progress is not None:
            progress(step, losses[-1])
    seconds = time.perf_counter() - start
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(out)
        lvlm.processor.save_pretrained(out)
    (out / TRAIN_META).write_text(json.dumps({"key": key, "base": str(base), "config": asdict(config),
                                              "classes": list(class_names), "images": int(len(images)),
                                              "seconds": round(seconds, 2), "final_loss": losses[-1]}) + "\n")
    return LlavaTrainResult(out, seconds, losses)


def finetune_on_world(base: str | Path, ds: Any, out: Path, config: LlavaTrainConfig | None = None, *,
                      progress: Callable[[int, float], None] | None = None) -> tuple[LlavaTrainResult, bool]:
    """Fine-tune on a synthetic world folder's accepted samples, reusing ``out`` when it was made
    with the same world, base model and settings. Returns ``(result, reused)``."""
    from curate.collect.synthetic import world_spec_of
    from curate.models.hf_folders import weights_fingerprint
    from curate.train_reference import dataset_arrays

    config = config or LlavaTrainConfig()
    key = train_key(config, {"world": world_spec_of(ds).to_dict(), "base": weights_fingerprint(Path(base))})
    if trained_with(out, key):
        meta = json.loads((Path(out) / TRAIN_META).read_text())
        return LlavaTrainResult(Path(out), float(meta.get("seconds") or 0.0), []), True
    images, labels, _, names, _ = dataset_arrays(ds)
    return finetune_llava(base, images, names, labels, out, config, key=key, progress=progress), False
