"""The fidelity stage: Fid, R-Fid and F-Fid of saliency methods on a dataset (papers/002) -> :class:`FidelityRun`.

>>> from curate.stages.fidelity import FidelitySettings, fidelity
>>> run = fidelity("world/", "ref.pt", FidelitySettings(methods=("gradcam", "layercam", "mask", "random")),
...                run_name="fid")
>>> [(r.method, r.verdict) for r in run.ranking]

Methods are saliency method names (:func:`curate.saliency.methods.method_info`) plus two
references: ``mask`` (the sample's object mask as the explanation; the right answer for a model
that looks at the object) and ``random`` (a uniformly random map); ``NAME~R`` is ``NAME``
degraded with noise ratio ``R`` (papers/002 §5), and a series of them gets the paper's
macro/micro Spearman correlations vs the noise ratio.

**Replicates.** Everything is computed ``settings.seeds`` times (default 3), with seeds
``seed, seed + 1, ...``: replicate ``s`` fine-tunes its own copy of the model with seed ``s``
(F-Fidelity, eq. 5) and seeds its removal draws, tie-breaking and random reference map with
``s``; Fid and R-Fid fine-tune nothing and vary only by those draws. The curves and AUCs are the
means over replicates; each method is compared with ``random`` on the same images and
replicates (:func:`curate.metrics.fidelity.trust_vs_reference`): the paired per-image difference
of the ranking family's AUCs, its 95 % interval from a two-way bootstrap over seeds x images, a
verdict (``faithful`` / ``MoRF only`` / ``LeRF only`` / ``not above random``), and the suffix
``(marginal)`` when the interval it rests on has its lower bound below ``settings.marginal``
times the effect (formulas in :mod:`curate.metrics.fidelity`). That verdict is what tells a user
whether the method's SSS/RMA (``curate explain``) describe the model. The explanations under
test (saliency maps, masks, their degraded copies) are computed once, on the original model.

The run folder's files are listed in :mod:`curate.runs.fidelity`. Each fine-tuned copy is
cached in ``<dataset>/features/fidelity/<key>.pt`` (only the trained parameters; the key
covers model, samples, label columns, beta, epochs, lr and the replicate's seed), so scoring
more methods later, or a run whose seeds overlap, costs no second fine-tuning. Samples whose
image or mask cannot be read are skipped and counted (``config.skipped``); the dataset itself
is never written (its feature cache aside).

**Which masks** (docs/design.md#masks, :mod:`curate.masks.sources`): the ``mask`` reference
(and its degraded copies ``mask~R``) is the sample's object mask, so it is only as right as the
mask. When it is scored, samples whose mask is an unverified model proposal (``mask_status =
model:<id>``, ``curate propose-masks``) are left out unless ``allow_model_masks`` (``curate
fidelity --allow-model-masks``), the rule the split applies to model-made background labels, and
masks reviewers marked bad are never used; every method is then scored on the same remaining
images (the verdicts are paired), and the left-out samples are counted in ``config.skipped``
(``model_mask``, ``rejected_mask``). ``config.masks`` records how many masks of each source the
``mask`` reference used (:attr:`curate.runs.fidelity.FidelityRun.mask_line`); a selection whose
masks are all model proposals is refused without ``allow_model_masks``. Runs that do not score
``mask`` read no mask values (the random map takes only the input's size): they keep every masked
sample and record ``masks`` as None.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from curate.metrics.fidelity import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_MARGINAL,
    DEFAULT_SAMPLES,
    DEFAULT_SEEDS,
    METRICS,
    SCORES,
    FidelityCurves,
    FidelityError,
    degrade,
    fidelity_curves,
    finetune,
    finetune_key,
    finetune_steps,
    mean_curves,
    merge_curves,
    rank_methods,
    series_correlations,
    trust_vs_reference,
)
from curate.progress import Progress, phase, report
from curate.runs.fidelity import (
    CurveSet,
    FidelityConfig,
    FidelityRow,
    FidelityRun,
    FinetuneCopy,
    FinetuneInfo,
)
from curate.stages.common import check_device, claim_run_dir, load_spec, model_identity, run_stage

__all__ = [
    "DEFAULT_STATUSES",
    "FAMILIES",
    "REFERENCE_METHODS",
    "FidelitySettings",
    "check_methods",
    "compute_fidelity",
    "degraded_correlations",
    "fidelity",
    "parse_sparsity",
]

logger = logging.getLogger(__name__)
REFERENCE_METHODS = ("mask", "random")
FAMILIES = ("fid", "rfid", "ffid")
DEFAULT_STATUSES = ("accepted", "candidate")
_DEGRADED = re.compile(r"^(?P<base>[\w\-]+)~(?P<ratio>[0-9.]+)$")


@dataclass
class FidelitySettings:
    """How to score (the ``curate fidelity`` options map one to one).

    Attributes:
        methods: saliency methods, ``mask``, ``random``, or ``NAME~RATIO`` (degraded); score
            ``random`` too for the verdicts.
        sparsities: explanation sizes; ``"a:b:step"``, a comma list or floats (papers/002: 0.05:0.95:0.05).
        alpha, beta, samples: R-/F-Fidelity parameters (:func:`curate.metrics.fidelity.fidelity_curves`).
        finetune_epochs: epochs of F-Fidelity's fine-tuning (eq. 5); 0 skips F-Fidelity.
        limit: score the first ``limit`` eligible samples, classes interleaved (None: all).
        finetune_limit: fine-tune on the first ``finetune_limit`` eligible samples (default: all of
            them; the paper's ImageNet protocol fine-tunes and evaluates on the same set).
        finetune_lr: Adam's learning rate for the fine-tuning.
        score: ``accuracy`` (the paper's indicator), ``probability`` (of the label) or ``margin``
            (label logit minus the best other logit; does not saturate on a confident model).
        families: which of ``fid`` (Fid+/Fid-), ``rfid`` (R-Fidelity), ``ffid`` (F-Fidelity).
        seed: the first replicate's seed; also seeds the degraded copies' noise and the bootstrap.
        seeds: replicates (fine-tuned copies and removal draws), seeds ``seed .. seed + seeds - 1``.
        marginal: a verdict's interval is marginal when ``0 < low < marginal * effect`` (0: never).
        batch_size: images per forward pass, explanation batch and fine-tuning step.
        device, precision: where and how the model runs.
        statuses: sample statuses scored (None: all).
        allow_model_masks: the ``mask`` reference also uses masks that are unverified model
            proposals (``mask_status = model:<id>``); by default those samples are left out and
            counted (``model_mask``). Masks reviewers marked bad are never used.
    """

    methods: tuple[str, ...] = ("gradcam",)
    sparsities: str | tuple[float, ...] = "0.05:0.95:0.05"
    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    samples: int = DEFAULT_SAMPLES
    finetune_epochs: int = 5
    limit: int | None = 128
    finetune_limit: int | None = None
    finetune_lr: float = 1e-4
    score: str = "margin"
    families: tuple[str, ...] = FAMILIES
    seed: int = 0
    seeds: int = DEFAULT_SEEDS
    marginal: float = DEFAULT_MARGINAL
    batch_size: int = 32
    device: str = "auto"
    precision: str = "fp32"
    statuses: tuple[str, ...] | None = DEFAULT_STATUSES
    allow_model_masks: bool = False

    @property
    def seed_list(self) -> list[int]:
        """The replicates' seeds: ``seed, seed + 1, ..., seed + seeds - 1``."""
        return [int(self.seed) + j for j in range(int(self.seeds))]


@dataclass(frozen=True)
class _Plan:
    """Settings after validation."""

    grid: list[float]
    methods: list[str]
    families: list[str]
    metrics: list[str]
    finetune_epochs: int


def parse_sparsity(spec: str | Sequence[float]) -> list[float]:
    """``"0.05:0.95:0.05"`` (start:stop:step, inclusive), ``"0.1,0.5"`` or a list."""
    if not isinstance(spec, str):
        values = [float(s) for s in spec]
    elif ":" in spec:
        start, stop, step = (float(p) for p in spec.split(":"))
        n = round((stop - start) / step) + 1
        values = [round(start + i * step, 6) for i in range(n)]
    else:
        values = [float(p) for p in spec.split(",") if p.strip()]
    if not values or any(not 0 < v < 1 for v in values):
        raise FidelityError(f"sparsities must lie in (0, 1): {spec!r}")
    return values


def check_methods(methods: Sequence[str]) -> list[str]:
    """Validate method names before any work: saliency methods, ``mask``, ``random``, ``NAME~RATIO``."""
    from curate.saliency.base import SaliencyError
    from curate.saliency.methods import method_info

    out = []
    for name in methods:
        name = str(name).strip()
        match = _DEGRADED.match(name)
        base = match["base"] if match else name
        if match and not 0.0 <= float(match["ratio"]) <= 1.0:
            raise FidelityError(f"{name!r}: the noise ratio must lie in [0, 1]")
        if "~" in name and not match:
            raise FidelityError(f"{name!r}: a degraded method is written NAME~RATIO, e.g. gradcam~0.4")
        if base not in REFERENCE_METHODS:
            try:
                method_info(base)
            except SaliencyError as error:
                raise FidelityError(f"{error}; or one of {', '.join(REFERENCE_METHODS)}") from None
        out.append(name)
    if not out:
        raise FidelityError("no method given")
    if len(set(out)) != len(out):
        raise FidelityError(f"a method is listed twice: {out}")
    return out


def _plan(settings: FidelitySettings) -> _Plan:
    """Validate everything that can be checked before loading anything."""
    grid = parse_sparsity(settings.sparsities)
    methods = check_methods(settings.methods)
    for name in ("alpha", "beta"):
        value = getattr(settings, name)
        if not 0 < float(value) <= 1:
            raise FidelityError(f"alpha and beta must be in (0, 1], got {name} = {value}")
    if settings.samples < 1 or settings.finetune_epochs < 0:
        raise FidelityError("samples must be >= 1 and finetune_epochs >= 0")
    if settings.seeds < 1:
        raise FidelityError(f"seeds must be >= 1, got {settings.seeds}")
    if not 0 <= float(settings.marginal) < 1:
        raise FidelityError(f"marginal must be in [0, 1), got {settings.marginal}")
    if settings.score not in SCORES:
        raise FidelityError(f"score must be one of {SCORES}, got {settings.score!r}")
    if settings.batch_size < 1:
        raise FidelityError("batch_size must be >= 1")
    families = [f.strip() for f in settings.families if f.strip()]
    if not families or any(f not in FAMILIES for f in families):
        raise FidelityError(f"families must be among {FAMILIES}, got {families}")
    epochs = int(settings.finetune_epochs)
    if "ffid" not in families:
        epochs = 0
    elif epochs == 0:
        families = [f for f in families if f != "ffid"]
        if not families:
            raise FidelityError("F-Fidelity alone needs finetune_epochs > 0")
    metrics = [m for m in METRICS if m.rsplit("_", 1)[0] in families]
    return _Plan(grid, methods, families, metrics, epochs)


def _forward_for(loaded: Any, classifier: torch.Tensor | None, columns: Sequence[int]) -> Callable:
    """``forward(module, x) -> logits`` over ``columns`` for a CLIP (zero-shot) or a classifier."""
    from curate.zeroshot import zero_shot_logits

    cols = torch.as_tensor(list(columns), device=loaded.device)

    def forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        x = x.to(loaded.device, dtype=loaded.input_dtype)
        with loaded.autocast():
            if loaded.kind == "clip":
                return zero_shot_logits(module.encode_image(x).float(), classifier)
            out = module(x).float()
        return out.index_select(1, cols)

    return forward


def _trainable(loaded: Any) -> Callable[[torch.nn.Module], list[torch.nn.Parameter]]:
    def pick(module: torch.nn.Module) -> list[torch.nn.Parameter]:
        if loaded.kind == "clip" and hasattr(module, "visual"):
            return list(module.visual.parameters())  # the image tower; the text classifier stays fixed
        return list(module.parameters())

    return pick


def _uses_random(name: str) -> bool:
    match = _DEGRADED.match(name)
    return (match["base"] if match else name) == "random"


def _uses_mask(name: str) -> bool:
    """``mask`` or a degraded ``mask~R``: the explanation is the sample's object mask."""
    match = _DEGRADED.match(name)
    return (match["base"] if match else name) == "mask"


def _explanations(name: str, loaded: Any, images: torch.Tensor, masks: torch.Tensor, labels: list[int],
                  classifier: torch.Tensor | None, head_columns: Sequence[int] | None, seed: int, replicate: int,
                  batch_size: int, cache: dict[str, torch.Tensor]) -> torch.Tensor:
    """The explanation maps ``(N, H, W)`` of a method; the random map (and its degraded copies) is
    drawn per replicate seed, every other explanation once."""
    key = f"{name}@{replicate}" if _uses_random(name) else name
    if key in cache:
        return cache[key]
    match = _DEGRADED.match(name)
    if match:
        base = _explanations(match["base"], loaded, images, masks, labels, classifier, head_columns, seed, replicate,
                             batch_size, cache)
        out = degrade(base, float(match["ratio"]), seed=seed + 1)
    elif name == "mask":
        out = masks.float()
    elif name == "random":
        gen = torch.Generator(device=images.device).manual_seed(replicate + 2)
        out = torch.rand(masks.shape, generator=gen, device=images.device)
    else:
        from curate.saliency.engine import Explainer, explain_with_backoff

        explainer = Explainer(loaded, name, classifier=classifier, columns=head_columns)
        result = explain_with_backoff(explainer, images, "true", labels, batch_size=batch_size)[0]
        out = result.maps[:, 0].float().detach()
    cache[key] = out.to(images.device)
    return cache[key]


def _phase_name(name: str, unit: str, number: int, count: int) -> str:
    """A replicate's progress phase: ``name`` when there is one replicate, else ``"name unit k of n"``
    (e.g. ``fine-tuning copy 2 of 3``)."""
    return name if count == 1 else f"{name} {unit} {number} of {count}"


def _interleave_classes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows in round-robin order over classes (each class in dataset order)."""
    by: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(int(r["class_index"]), []).append(r)
    queues = [by[c] for c in sorted(by)]
    out: list[dict[str, Any]] = []
    for i in range(max(len(q) for q in queues)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def degraded_correlations(curves: Mapping[str, FidelityCurves]) -> dict[str, dict[str, dict[str, float]]]:
    """For each base with >= 3 members ``base`` / ``base~r``: Spearman of each metric vs the noise ratio."""
    series: dict[str, dict[str, float]] = {}
    for name in curves:
        match = _DEGRADED.match(name)
        base, ratio = (match["base"], float(match["ratio"])) if match else (name, 0.0)
        series.setdefault(base, {})[name] = ratio
    out = {}
    for base, members in series.items():
        if len(members) >= 3 and len(set(members.values())) >= 3:
            out[base] = series_correlations({m: curves[m] for m in members}, members)
    return out


def _finetuned_copy(loaded: Any, original: torch.nn.Module, forward: Callable, images: torch.Tensor,
                    labels: list[int], key: str, path: Path, settings: FidelitySettings, epochs: int, seed: int,
                    write_cache: bool, progress: Callable[[int, int], None] | None = None
                    ) -> tuple[torch.nn.Module, bool]:
    """The copy fine-tuned with ``seed`` (from the cache when there); returns it and whether it was cached.
    ``progress(done, total)`` counts optimisation steps; a cached copy reports all of them at once."""
    pick = _trainable(loaded)
    if loaded.cache_safe and path.exists():
        tuned = copy.deepcopy(original)
        params = dict(tuned.named_parameters())
        for name, value in torch.load(path, map_location=loaded.device, weights_only=True).items():
            params[name].data.copy_(value)
        tuned.eval()
        if progress is not None:
            steps = finetune_steps(len(images), epochs=epochs, batch_size=settings.batch_size)
            progress(steps, steps)
        return tuned, True
    tuned = finetune(original, forward, images, labels, beta=settings.beta, epochs=epochs, lr=settings.finetune_lr,
                     batch_size=settings.batch_size, params=pick, seed=seed, progress=progress)
    if write_cache and loaded.cache_safe:
        chosen = {id(p) for p in pick(tuned)}
        state = {n: p.detach().cpu() for n, p in tuned.named_parameters() if id(p) in chosen}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(path)
    return tuned, False


def compute_fidelity(dataset: Any, model: Any, settings: FidelitySettings | None = None, *,
                     progress: Progress | None = None, write_cache: bool = True) -> FidelityRun:
    """Score the methods and return the (not yet written) :class:`FidelityRun`.

    :func:`fidelity` is this plus the run folder. ``write_cache=False`` leaves the dataset's
    feature cache alone (fine-tuned copies already there are still read).
    """
    from curate.masks.sources import mask_counts, mask_source, trusted_rows, untrusted_masks_message
    from curate.saliency.inputs import (
        UNTRUSTED_MASK_REASONS,
        MaskedImages,
        collate_masked,
        model_class_names,
        open_masked_dataset,
        prompt_set_for,
    )
    from curate.saliency.masks import mask_transform_for

    settings = settings or FidelitySettings()
    plan = _plan(settings)
    check_device(settings.device)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    seeds = settings.seed_list
    ds = open_masked_dataset(dataset)
    loaded = load_spec(model, device=settings.device, precision=settings.precision)
    model_identity(model, loaded)  # a model the run cannot name fails before any work
    statuses = settings.statuses
    rows_all = ds.rows() if statuses is None else ds.rows(status=list(statuses))
    rows = [r for r in rows_all if r.get("mask_path") is not None and r.get("class_index") is not None]
    # the mask reference uses only masks it may trust (curate.masks.sources); all methods then share its images
    uses_masks = any(_uses_mask(m) for m in plan.methods)
    left_out: Counter = Counter()
    if uses_masks:
        trusted, untrusted = trusted_rows(rows, allow_model_masks=settings.allow_model_masks)
        if not trusted and untrusted.skipped_model:
            raise FidelityError(untrusted_masks_message(ds.root, untrusted, "the mask reference"))
        kept = {r["sample_id"] for r in trusted}
        left_out = Counter(UNTRUSTED_MASK_REASONS[str(mask_source(r))] for r in rows if r["sample_id"] not in kept)
        rows = list(trusted)
    if not rows:
        raise FidelityError(f"{ds.root}: no sample with a class and a mask"
                            + (f" it may use ({dict(left_out)})" if left_out else ""))
    all_classes = sorted({int(r["class_index"]) for r in rows})
    rows = _interleave_classes(rows)  # a limit keeps every class represented
    n_ft = len(rows) if settings.finetune_limit is None else min(len(rows), settings.finetune_limit)
    n_eval = len(rows) if settings.limit is None else min(len(rows), settings.limit)
    rows = rows[: max(n_ft, n_eval)]

    # --- label columns and the model's logits over them
    space = ds.label_space
    classifier = None
    if loaded.kind == "clip":
        from curate.zeroshot import cached_text_classifier

        columns = all_classes
        names = {i: space.names[i] for i in columns}
        names.update({i: n for i, n in model_class_names(loaded).items() if i in names})
        classifier = cached_text_classifier(loaded, [names[c] for c in columns], prompt_set_for(loaded, None),
                                            ds.root / "features" if write_cache else None)
        head_columns: list[int] | None = columns
    else:
        if len(space) != 1000:
            raise FidelityError(f"{loaded.model_id} scores ImageNet-1K; {ds.root} uses '{space.name}'")
        columns, head_columns = list(range(1000)), None
    col_of = {c: j for j, c in enumerate(columns)}

    # --- decode images and input-aligned masks once
    report(progress, 0, len(rows), "decoding images")
    items = MaskedImages(ds, rows, loaded.preprocess, mask_transform_for(loaded.preprocess), tuple(loaded.image_size))
    bs = settings.batch_size
    batches = []
    for j in range(0, len(items), bs):
        batches.append(collate_masked([items[i] for i in range(j, min(j + bs, len(items)))]))
        report(progress, min(j + bs, len(items)), len(items), "decoding images")
    good = [(b["image"][k], b["mask"][k], rows[b["index"][k]]) for b in batches for k in range(len(b["problem"]))
            if b["problem"][k] in ("", "mask_resized")]
    skipped = Counter(b["problem"][k] for b in batches for k in range(len(b["problem"]))
                      if b["problem"][k] not in ("", "mask_resized"))
    for reason, count in skipped.items():
        logger.warning("%s: %d samples skipped (%s)", ds.root, count, reason)
    for reason, count in left_out.items():
        logger.info("%s: %d samples left out of the mask reference (%s)", ds.root, count, reason)
    skipped.update(left_out)
    if not good:
        raise FidelityError(f"{ds.root}: no readable image with a mask (skipped: {dict(skipped)})")
    images_all = torch.stack([g[0] for g in good]).to(loaded.device)
    masks_all = torch.stack([g[1] for g in good]).to(loaded.device)
    rows_ok = [g[2] for g in good]
    cls_all = [int(r["class_index"]) for r in rows_ok]
    lab_all = [col_of[c] for c in cls_all]
    timings["decode_s"] = time.perf_counter() - started

    forward = _forward_for(loaded, classifier, columns)
    original = loaded.module

    def predict(x: torch.Tensor) -> torch.Tensor:
        return forward(original, x)

    images, masks, labels = images_all[:n_eval], masks_all[:n_eval], lab_all[:n_eval]
    sources = None
    if uses_masks:  # the masks the mask reference used (the scored images'), and the ones left out
        sources = mask_counts(rows_ok[:n_eval], allow_model_masks=settings.allow_model_masks)
        sources.skipped_model, sources.skipped_rejected = left_out["model_mask"], left_out["rejected_mask"]
    ft_rows = rows_ok[:n_ft]
    copies: list[FinetuneCopy] = []
    cache: dict[str, torch.Tensor] = {}
    replicates: dict[str, list[FidelityCurves]] = {m: [] for m in plan.methods}
    total = len(plan.methods) * len(images)  # a replicate's scoring: images x methods, counted per batch
    timings["finetune_s"] = 0.0
    for number, s in enumerate(seeds, 1):
        # each replicate's fine-tuning and its scoring are phases of their own: each ends at n/n
        finetuned = None
        if plan.finetune_epochs > 0:
            t0 = time.perf_counter()
            key = finetune_key(loaded.model_id, [r["sample_id"] for r in ft_rows], columns, beta=settings.beta,
                               epochs=plan.finetune_epochs, lr=settings.finetune_lr, seed=s,
                               cache_safe=loaded.cache_safe)
            path = ds.root / "features" / "fidelity" / f"{key}.pt"
            steps = phase(progress, _phase_name("fine-tuning", "copy", number, len(seeds)))
            tuned, cached = _finetuned_copy(loaded, original, forward, images_all[:n_ft], lab_all[:n_ft], key, path,
                                            settings, plan.finetune_epochs, s, write_cache, steps)
            copies.append(FinetuneCopy(s, key, str(path), cached))

            def finetuned(x: torch.Tensor, tuned: torch.nn.Module = tuned) -> torch.Tensor:
                return forward(tuned, x)

            timings["finetune_s"] += time.perf_counter() - t0

        # --- explanations and curves under this replicate
        scoring, done = _phase_name("scoring", "replicate", number, len(seeds)), 0
        report(progress, done, total, scoring)
        for method in plan.methods:
            t0 = time.perf_counter()
            expl = _explanations(method, loaded, images, masks, cls_all[:n_eval], classifier, head_columns,
                                 settings.seed, s, bs, cache)
            parts = []
            for i in range(0, len(images), bs):
                parts.append(fidelity_curves(predict, images[i:i + bs], expl[i:i + bs], labels[i:i + bs],
                                             sparsities=plan.grid, alpha=settings.alpha, beta=settings.beta,
                                             samples=settings.samples, finetuned=finetuned, score=settings.score,
                                             metrics=plan.metrics, seed=s + i))
                done += len(labels[i:i + bs])
                report(progress, done, total, scoring)
            replicates[method].append(merge_curves(parts))
            timings[f"{method}_s"] = timings.get(f"{method}_s", 0.0) + time.perf_counter() - t0
        finetuned = None

    # --- means over replicates, ranking, verdicts, degraded series
    means = {m: mean_curves(r) for m, r in replicates.items()}
    aucs = {m: c.aucs for m, c in means.items()}
    aucs_by_seed = {m: {s: c.aucs for s, c in zip(seeds, r)} for m, r in replicates.items()}
    trust = trust_vs_reference(replicates, seed=settings.seed, marginal=settings.marginal)
    ranking = [FidelityRow.from_dict({**row, **trust.get(row["method"], {})}) for row in rank_methods(aucs)]
    correlations = degraded_correlations(means)
    curves = {m: CurveSet(tuple(c.sparsities), c.curves, c.n_images,
                          {s: r.curves for s, r in zip(seeds, replicates[m])}) for m, c in means.items()}
    config = FidelityConfig(
        dataset=str(ds.root), model=loaded.model_id, model_kind=loaded.kind, methods=tuple(plan.methods),
        sparsities=tuple(plan.grid), alpha=settings.alpha, beta=settings.beta, samples=settings.samples,
        score=settings.score, families=tuple(plan.families), seed=settings.seed, seeds=tuple(seeds),
        marginal=float(settings.marginal), images=len(images),
        finetune=FinetuneInfo(plan.finetune_epochs, len(ft_rows) if plan.finetune_epochs else 0,
                              settings.finetune_lr, tuple(copies)),
        label_columns=len(columns), skipped=dict(skipped), masks=None if sources is None else sources.as_dict(),
        baseline="0 in the model's normalised input space (= the preprocessing's mean colour)",
        elements="pixels of the model input grid")
    timings["total_s"] = time.perf_counter() - started
    return FidelityRun(config=config, curves=curves, aucs=aucs, ranking=ranking, correlations=correlations,
                       aucs_by_seed=aucs_by_seed, timings=timings)


@run_stage("fidelity")
def fidelity(dataset: Any, model: Any, settings: FidelitySettings | None = None, *, run_name: str | None = None,
             overwrite: bool = False, progress: Progress | None = None) -> FidelityRun:
    """Score saliency methods by Fid, R-Fid and F-Fid and write ``<dataset>/runs/<run_name>/``.

    Args:
        dataset: the dataset folder (or a :class:`curate.store.Dataset`).
        model: a :class:`curate.models.ModelSpec`, a loaded model, a model name or a curate weights file.
        settings: :class:`FidelitySettings` (default: its defaults).
        run_name: the run folder (default ``fidelity-<model>-<UTC time>``); a finished one is
            refused before any work unless ``overwrite``, an unfinished one (killed) replaced
            (:func:`curate.stages.common.run_stage`).
        progress: ``progress(done, total, message)`` (:mod:`curate.progress`); phases "decoding images"
            (images), then per replicate "fine-tuning" (optimisation steps, one update per batch) and
            "scoring" (images x methods, one update per batch), named "fine-tuning copy k of n" and
            "scoring replicate k of n" when there are several seeds; each phase ends at ``n/n``.

    Returns the written :class:`curate.runs.fidelity.FidelityRun` (``run.run_dir`` set). The run's
    config names the model by its id and records what was passed (``model_identity``,
    :func:`curate.stages.common.model_identity`: a spec or a loaded model, its name and weights),
    as does the dataset's ``provenance.fidelity`` with the run's name.
    """
    from curate.saliency.inputs import open_masked_dataset

    settings = settings or FidelitySettings()
    _plan(settings)  # bad settings fail before the dataset is opened
    ds = open_masked_dataset(dataset)
    check_device(settings.device)
    loaded = load_spec(model, device=settings.device, precision=settings.precision)
    identity = model_identity(model, loaded)
    run = compute_fidelity(ds, loaded, settings, progress=progress)
    run.config = dataclasses.replace(run.config, model_identity=identity)
    run_dir = claim_run_dir(ds.root, run_name, FidelityRun.KIND, run.config.model, overwrite=overwrite)
    run.write(run_dir)
    ds.record_provenance("fidelity", {"run": run_dir.name, "model": identity})
    return run
