"""Train the tiny reference CLIP on a synthetic world, and measure its shortcut.

A small, from-scratch analogue of the planted-correlation check of papers/003 §4 / App. D.3
(ColoredCOCO), not that experiment: the paper fine-tunes pretrained CLIPs (RN-50, ViT-B/16) on
COCO objects with a biased background colour and compares them with supervised fine-tuning;
here a tiny CLIP is trained from random weights, with the contrastive objective, on captions
that name only the object ("a photo of a {class}."), and it picks up the background when the
background is correlated with the class in its training data. The model is the offline
stand-in for a pretrained CLIP in the demo and in tests.

Objective. CLIP's symmetric InfoNCE (Radford et al. 2021) over a batch of image-caption
pairs, with one adaptation: the world has only K distinct captions, so a batch of B images
holds many copies of each caption. Copies would be false negatives for one another, so we
encode the K unique captions once per step and use

    L = 1/2 [ CE_i(s * <f(x_i), g(t_{y_i})>  over the K captions)
              + mean_k ( -mean_{i: y_i = k} log softmax_i(s * <f(x_i), g(t_k)>) ) ]

i.e. image-to-text cross-entropy over the unique captions, and text-to-image with all images
of the caption's class as positives; ``s`` is CLIP's learned logit scale. Both are the CLIP
loss when captions are unique.

Text-only negatives (issue 14 §3). A CLIP pretrained on the web has read captions naming
thousands of things; a text tower that only ever saw the world's K class names maps the other
ImageNet-1K labels to arbitrary points, some of which sit closer to the images than any
trained caption. Scored 1 vs 1000, those untrained labels were free attractors: 88% of the
p = 0.9 model's top-1 predictions on the split's hard images went to one of the 994 labels it
never trained on (measured), so the demo's 1-vs-1000 drop measured the untrained text tower,
not the background shortcut. So each step also encodes ``text_negatives`` captions (same
template) of ImageNet-1K labels that are *not* world classes, drawn at random from the 1000
minus the world's, and appends them to the K captions as extra columns of the image-to-text
cross-entropy (they have no images, so they add no text-to-image term). Every label is then
trained to be a wrong answer for every image of the world, as a web caption about something
absent from the photo would be; the model still never sees an image of those labels. Measured
on the demo (150 steps): 0% of top-1 outside the world's classes, on conflicting and hard
images, with the trained prompts and with OpenAI's 80 templates. The protection is per name,
not general: trained with negatives from half of the 994 labels, the other half still took
22% of the conflicting images (43% with no negatives), so a label space other than ImageNet-1K
(COCO, a file) gets no such guarantee unless its names are passed as ``negative_names``.

Evaluation (the shortcut report). Zero-shot 1-vs-K accuracy of the trained model on a fresh,
*uncorrelated* world (p = 1/B, a different seed), split into images whose background is the
class's common background ("aligned") and the rest ("conflicting"). The gap aligned -
conflicting measures how much the model relies on the background (the paper's drop).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from curate.collect.synthetic import WorldSpec, generate_world

logger = logging.getLogger(__name__)

CAPTION_TEMPLATE = "a photo of a {}."
# Training alternates between the caption and the paper's zero-shot prompt (papers/003
# §2.1 "A photo of {}."), so the reference CLIP answers the prompt the splitter and the
# evaluation use; trained on the first alone it scored 6% with the second (measured).
CAPTION_TEMPLATES = (CAPTION_TEMPLATE, "A photo of {}.")
DEFAULT_ARCH = "curate-tiny-clip-rn"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass
class TrainConfig:
    """Settings of one reference-CLIP training run (all recorded in the weights file)."""

    arch: str = DEFAULT_ARCH
    steps: int = 250
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup: int = 30
    seed: int = 0
    threads: int = 2
    caption_templates: tuple[str, ...] = CAPTION_TEMPLATES
    # captions of non-world ImageNet-1K labels per step, as negatives only (0: the objective
    # before issue 14 §3). A new field changes the demo's weights key, so old weights retrain.
    text_negatives: int = 128


@dataclass
class TrainResult:
    path: Path
    losses: list[float]
    seconds: float
    config: TrainConfig
    class_names: list[str]
    meta: dict = field(default_factory=dict)


def _to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> normalised float (N, 3, H, W) with CLIP's mean/std."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0)
    mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def clip_loss_unique_captions(
    image_features: torch.Tensor, text_features: torch.Tensor, labels: torch.Tensor, logit_scale: torch.Tensor
) -> torch.Tensor:
    """CLIP's symmetric contrastive loss with K unique captions (see the module docstring).

    Captions that no image in the batch has (``labels`` never points at them: absent classes,
    text-only negatives appended after the K world captions) are negatives of every image in
    the image-to-text term and add no text-to-image term.

    Args:
        image_features: (B, D) L2-normalised image embeddings.
        text_features: (K, D) L2-normalised embeddings of the K unique captions (K may include
            text-only negatives).
        labels: (B,) caption index of each image.
        logit_scale: CLIP's learned log-scale (exp'd here, clamped at 100 as in CLIP).
    """
    scale = logit_scale.exp().clamp(max=100.0)
    logits = scale * image_features @ text_features.t()  # (B, K)
    image_to_text = F.cross_entropy(logits, labels)
    log_p_images = F.log_softmax(logits.t(), dim=1)  # (K, B): each caption over the batch's images
    positives = F.one_hot(labels, num_classes=text_features.shape[0]).t().float()  # (K, B)
    present = positives.sum(dim=1) > 0
    text_to_image = -((log_p_images * positives).sum(dim=1)[present] / positives.sum(dim=1)[present]).mean()
    return 0.5 * (image_to_text + text_to_image)


def train_reference_clip(
    images: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str],
    out_path: Path,
    config: TrainConfig | None = None,
    meta: dict | None = None,
    progress: Callable[[int, float], None] | None = None,
    negative_names: Sequence[str] | None = None,
) -> TrainResult:
    """Train ``config.arch`` from random weights on (images, labels) and save it to ``out_path``.

    ``negative_names``: the labels whose captions serve as text-only negatives
    (``config.text_negatives`` of them per step); default :func:`default_negative_names`, the
    ImageNet-1K names that are not among ``class_names``.

    The file holds ``{"state_dict": ..., "curate": {...}}`` where the ``curate`` entry records
    the arch, the class names, the caption template, the training config and ``meta`` (e.g.
    the world spec); the models layer reads the arch from it. Writing is atomic.
    """
    from curate.models.tiny import register_tiny_configs

    config = config or TrainConfig()
    register_tiny_configs()
    threads_before = torch.get_num_threads()  # restored on the way out: the caller's count is not ours to keep
    torch.set_num_threads(config.threads)
    try:
        return _train(images, labels, class_names, out_path, config, meta, progress, negative_names)
    finally:
        torch.set_num_threads(threads_before)


def _train(images: np.ndarray, labels: np.ndarray, class_names: Sequence[str], out_path: Path, config: TrainConfig,
           meta: dict | None, progress: Callable[[int, float], None] | None,
           negative_names: Sequence[str] | None) -> TrainResult:
    """The body of :func:`train_reference_clip`, run with torch's threads set to ``config.threads``."""
    import open_clip

    torch.manual_seed(config.seed)
    generator = np.random.default_rng(config.seed)

    from curate.models.clip import _quiet_random_init

    with _quiet_random_init():  # random init is the point here; open_clip's warning would mislead
        model = open_clip.create_model(config.arch, pretrained=None)
    model.train()
    tokenizer = open_clip.get_tokenizer(config.arch)
    token_sets = [tokenizer([template.format(name) for name in class_names]) for template in config.caption_templates]
    pool = list(default_negative_names(class_names) if negative_names is None else negative_names)
    n_negatives = min(config.text_negatives, len(pool))
    negative_tokens = ([tokenizer([template.format(name) for name in pool]) for template in config.caption_templates]
                       if n_negatives else [])
    negative_rng = np.random.default_rng([config.seed, 1])  # its own stream: image batches stay as without it
    x_all = _to_tensor(images)
    y_all = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    if x_all.shape[-1] != _image_size(model):
        x_all = F.interpolate(x_all, size=_image_size(model), mode="bilinear", antialias=True, align_corners=False)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, betas=(0.9, 0.98), eps=1e-6,
    )

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay (as in open_clip's training)
        if step < config.warmup:
            return config.lr * (step + 1) / config.warmup
        t = (step - config.warmup) / max(1, config.steps - config.warmup)
        return 0.5 * config.lr * (1 + math.cos(math.pi * t))

    losses: list[float] = []
    start = time.perf_counter()
    n = len(x_all)
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        idx = torch.from_numpy(generator.choice(n, size=min(config.batch_size, n), replace=False))
        x = x_all[idx]
        flip = torch.from_numpy(generator.random(len(idx)) < 0.5)
        x[flip] = x[flip].flip(-1)  # horizontal flips: the only augmentation
        image_features = F.normalize(model.encode_image(x), dim=-1)
        tokens = token_sets[step % len(token_sets)]  # one caption template per step, in turn
        if n_negatives:  # the K world captions first (labels index them), then the text-only negatives
            drawn = torch.from_numpy(negative_rng.choice(len(pool), size=n_negatives, replace=False))
            tokens = torch.cat([tokens, negative_tokens[step % len(negative_tokens)][drawn]])
        text_features = F.normalize(model.encode_text(tokens), dim=-1)
        loss = clip_loss_unique_captions(image_features, text_features, y_all[idx], model.logit_scale)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        losses.append(loss.item())
        if progress is not None:
            progress(step, losses[-1])
    seconds = time.perf_counter() - start

    payload = {
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "curate": {
            "format": "curate-reference-clip/1",
            "arch": config.arch,
            "class_names": list(class_names),
            "caption_templates": list(config.caption_templates),
            "text_negative_pool": len(pool) if n_negatives else 0,
            "train_config": asdict(config),
            "final_loss": losses[-1] if losses else None,
            "train_seconds": round(seconds, 1),
            "meta": meta or {},
        },
    }
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(out_path)
    return TrainResult(out_path, losses, seconds, config, list(class_names), meta or {})


def default_negative_names(class_names: Sequence[str]) -> list[str]:
    """ImageNet-1K's prompt names minus the world's classes (case-insensitive), in index order.

    The world's classes are named after ImageNet-1K labels, so these are exactly the labels a
    1-vs-1000 evaluation offers besides the world's own.
    """
    from curate.labels import imagenet1k

    own = {name.strip().lower() for name in class_names}
    return [name for name in imagenet1k().names if name.strip().lower() not in own]


def _image_size(model: torch.nn.Module) -> int:
    size = model.visual.image_size
    return int(size[0] if isinstance(size, (tuple, list)) else size)


def world_arrays(spec: WorldSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Generate ``spec`` in memory: images (N,H,W,3) uint8, labels, aligned flags, class names."""
    samples = list(generate_world(spec))
    images = np.stack([s.image for s in samples])
    labels = np.array([spec.classes.index(s.cls) for s in samples])
    aligned = np.array([s.aligned for s in samples])
    return images, labels, aligned, [c.name for c in spec.classes]


@dataclass
class ShortcutReport:
    """Zero-shot accuracy on aligned vs conflicting backgrounds (percent)."""

    aligned_acc: float
    conflicting_acc: float
    n_aligned: int
    n_conflicting: int

    @property
    def gap(self) -> float:
        return self.aligned_acc - self.conflicting_acc


def shortcut_report(predictions: np.ndarray, labels: np.ndarray, aligned: np.ndarray) -> ShortcutReport:
    """Accuracy (%) on images with the class's common background vs on the others.

    Balanced over classes like the paper's ACC (App. C.3): the mean over classes of each
    class's accuracy within the subset (classes absent from a subset are skipped).
    """
    def balanced(mask: np.ndarray) -> float:
        accs = [np.mean(predictions[mask & (labels == c)] == c) for c in np.unique(labels) if np.any(mask & (labels == c))]
        return float(100.0 * np.mean(accs)) if accs else float("nan")

    return ShortcutReport(balanced(aligned), balanced(~aligned), int(aligned.sum()), int((~aligned).sum()))


def dataset_arrays(ds, *, status: str | None = "accepted") -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], list[int]]:
    """Images, labels and aligned flags of a synthetic dataset folder, for training/evaluation.

    Returns (images (N,H,W,3) uint8, labels (N,) indices into ``class_names``, aligned (N,),
    class_names, class_indices) where ``class_indices`` are the classes' ImageNet-1K indices.
    Aligned = the sample's background is its class's common background (from the world spec).
    """
    from curate.collect.synthetic import world_spec_of

    spec = world_spec_of(ds)
    common = {c.imagenet_index: c.common_background for c in spec.classes}
    order = [c.imagenet_index for c in spec.classes]
    rows = ds.rows(status=status) if status else ds.rows()
    if not rows:
        raise ValueError(f"{ds.root}: no samples with status {status!r} to train on")
    images, labels, aligned = [], [], []
    for row in rows:
        if row["class_index"] not in common:
            raise ValueError(f"{ds.root}: sample {row['sample_id']} has class {row['class_index']} outside the world")
        images.append(np.asarray(ds.load_image(row["sample_id"]), dtype=np.uint8))
        labels.append(order.index(row["class_index"]))
        aligned.append(row["background"] == common[row["class_index"]])
    return np.stack(images), np.array(labels), np.array(aligned), [c.name for c in spec.classes], order


def evaluate_shortcut(weights: Path, ds, *, batch_size: int = 256) -> ShortcutReport:
    """Load ``weights`` through the models layer and report aligned vs conflicting accuracy on ``ds``.

    Zero-shot 1-vs-K over the world's classes with the training caption. Image embeddings come
    from the dataset's feature cache, so the evaluation engine that runs next on the same world
    (the demo) encodes no image again.
    """
    from curate.collect.synthetic import world_spec_of
    from curate.features import FEATURES_DIR, compute_features
    from curate.models import load_model
    from curate.zeroshot import PromptSet, cached_text_classifier, zero_shot_logits

    model = load_model("auto", Path(weights))
    spec = world_spec_of(ds)
    common = {c.imagenet_index: c.common_background for c in spec.classes}
    order = [c.imagenet_index for c in spec.classes]
    rows = {r["sample_id"]: r for r in ds.rows(status="accepted") if r["class_index"] in common}
    if not rows:
        raise ValueError(f"{ds.root}: no accepted samples of the world's classes to evaluate")
    feats = compute_features(ds, model, list(rows), batch_size=batch_size)
    if feats.failed:
        raise ValueError(f"{ds.root}: {len(feats.failed)} image(s) could not be encoded: {next(iter(feats.failed.values()))}")
    prompts = PromptSet("caption", (CAPTION_TEMPLATE,))
    classifier = cached_text_classifier(model, [c.name for c in spec.classes], prompts, ds.root / FEATURES_DIR / "text")
    predictions = zero_shot_logits(torch.from_numpy(feats.values), classifier).argmax(dim=1).numpy()
    labels = np.array([order.index(rows[s]["class_index"]) for s in feats.sample_ids])
    aligned = np.array([rows[s]["background"] == common[rows[s]["class_index"]] for s in feats.sample_ids])
    return shortcut_report(predictions, labels, aligned)
