"""Score saliency methods on a dataset with Fid, R-Fid and F-Fid (papers/002), into ``runs/<name>/``.

>>> from curate.metrics.fidelity_run import fidelity_dataset
>>> res = fidelity_dataset("world/", "ref.pt", ["gradcam", "layercam", "mask", "random"], run_name="fid")
>>> [(r["method"], r["verdict"]) for r in res.ranking]

Methods are :data:`curate.saliency.METHODS` names plus two references: ``mask`` (the sample's
object mask as the explanation; the right answer for a model that looks at the object) and
``random`` (a uniformly random map); ``NAME~R`` is ``NAME`` degraded with noise ratio ``R``
(papers/002 §5), and a series of them gets the paper's macro/micro Spearman correlations vs
the noise ratio.

Each method is compared with ``random`` on the same images (:func:`trust_vs_reference`): the
paired difference of per-image F-Fid AUCs with a bootstrap interval, and a verdict
(``faithful`` / ``MoRF only`` / ``LeRF only`` / ``not above random``). That verdict is what
tells a user whether the method's SSS/RMA (``curate explain``) describe the model.

The run folder holds ``config.json``, ``curves.csv`` (method, metric, sparsity, value),
``curves.json``, ``aucs.json``, ``ranking.csv`` (by F-Fid+ AUC, higher first; then F-Fid- AUC,
lower first; with the verdict columns), ``correlations.json`` (degraded series only),
``curves.png`` and ``summary.json``. The fine-tuned model is cached in
``<dataset>/features/fidelity/<key>.pt`` (only the trained parameters; the key covers model,
samples, label columns, beta, epochs, lr, seed), so scoring more methods later costs no second
fine-tuning. Samples whose image or mask cannot be read are skipped and counted in
``config.json`` (``skipped``); the dataset itself is never written.
"""
from __future__ import annotations

import csv
import io
import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from curate.metrics.fidelity import (
    DEFAULT_ALPHA, DEFAULT_BETA, DEFAULT_SAMPLES, DEFAULT_SPARSITIES, METRICS, FidelityCurves, FidelityError,
    degrade, fidelity_curves, finetune, finetune_key, merge_curves, series_correlations,
)

logger = logging.getLogger(__name__)
REFERENCE_METHODS = ("mask", "random")
FAMILIES = ("fid", "rfid", "ffid")
_DEGRADED = re.compile(r"^(?P<base>[\w\-]+)~(?P<ratio>[0-9.]+)$")


@dataclass
class FidelityResult:
    """Curves and AUCs per method, the ranking, correlations of degraded series, the run folder."""

    curves: dict[str, FidelityCurves]
    aucs: dict[str, dict[str, float]]
    ranking: list[dict[str, Any]]
    correlations: dict[str, dict[str, dict[str, float]]]
    config: dict[str, Any]
    run_dir: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)


def parse_sparsity(spec: str | Sequence[float]) -> list[float]:
    """``"0.05:0.95:0.05"`` (start:stop:step, inclusive), ``"0.1,0.5"`` or a list."""
    if not isinstance(spec, str):
        return [float(s) for s in spec]
    if ":" in spec:
        start, stop, step = (float(p) for p in spec.split(":"))
        n = int(round((stop - start) / step)) + 1
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


def _explanations(name: str, loaded: Any, images: torch.Tensor, masks: torch.Tensor, labels: list[int],
                  classifier: torch.Tensor | None, head_columns: Sequence[int] | None, seed: int,
                  batch_size: int, cache: dict[str, torch.Tensor]) -> torch.Tensor:
    if name in cache:
        return cache[name]
    match = _DEGRADED.match(name)
    if match:
        base = _explanations(match["base"], loaded, images, masks, labels, classifier, head_columns, seed,
                             batch_size, cache)
        out = degrade(base, float(match["ratio"]), seed=seed + 1)
    elif name == "mask":
        out = masks.float()
    elif name == "random":
        gen = torch.Generator(device=images.device).manual_seed(seed + 2)
        out = torch.rand(masks.shape, generator=gen, device=images.device)
    else:
        from curate.saliency.engine import Explainer, explain_with_backoff

        explainer = Explainer(loaded, name, classifier=classifier, columns=head_columns)
        result = explain_with_backoff(explainer, images, "true", labels, batch_size=batch_size)[0]
        out = result.maps[:, 0].float().detach()
    cache[name] = out.to(images.device)
    return cache[name]


def fidelity_dataset(
    ds_root: Any,
    model: Any,
    methods: Sequence[str] = ("gradcam",),
    sparsities: str | Sequence[float] = DEFAULT_SPARSITIES,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    samples: int = DEFAULT_SAMPLES,
    finetune_epochs: int = 5,
    run_name: str | None = None,
    *,
    pretrained: Any = None,
    limit: int | None = 128,
    finetune_limit: int | None = None,
    finetune_lr: float = 1e-4,
    score: str = "margin",
    families: Sequence[str] = FAMILIES,
    seed: int = 0,
    batch_size: int = 32,
    device: Any = None,
    precision: str = "fp32",
    statuses: Sequence[str] | None = ("accepted", "candidate"),
    write: bool = True,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
) -> FidelityResult:
    """Fid+/Fid-, R-Fid+/R-Fid- and F-Fid+/F-Fid- curves of each method on a dataset's masked samples.

    Args:
        ds_root: the dataset folder (or a :class:`curate.store.Dataset`).
        model: a loaded model, a model name (with ``pretrained``) or a curate weights file.
        methods: saliency methods, ``mask``, ``random``, or ``NAME~RATIO`` (degraded).
        sparsities: explanation sizes; ``"a:b:step"``, a comma list or floats (papers/002: 0.05:0.95:0.05).
        alpha, beta, samples: R-/F-Fidelity parameters (:func:`curate.metrics.fidelity.fidelity_curves`).
        finetune_epochs: epochs of F-Fidelity's fine-tuning (eq. 5); 0 skips F-Fidelity.
        run_name: the run folder (default ``fidelity-<model>-<UTC time>``).
        limit: evaluate the first ``limit`` eligible samples (None: all).
        finetune_limit: fine-tune on the first ``finetune_limit`` eligible samples (default: all of them;
            the paper's ImageNet protocol fine-tunes and evaluates on the same set).
        score: ``accuracy`` (the paper's indicator), ``probability`` (of the label) or ``margin``
            (label logit minus the best other logit; does not saturate on a confident model).
        families: which of ``fid`` (Fid+/Fid-), ``rfid`` (R-Fidelity), ``ffid`` (F-Fidelity) to compute.
        seed: seeds fine-tuning, tie-breaking, degradation and all stochastic removals.
    """
    from curate.runs import create_run, write_bytes, write_json
    from curate.runs import run_name as make_run_name
    from curate.saliency.inputs import (
        MaskedImages, collate_masked, model_class_names, open_masked_dataset, prompt_set_for, resolve_model,
    )
    from curate.saliency.masks import mask_transform_for

    started = time.perf_counter()
    timings: dict[str, float] = {}
    say = progress or (lambda msg: None)
    grid = parse_sparsity(sparsities)
    methods = check_methods(methods)
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not 0 < float(value) <= 1:
            raise FidelityError(f"alpha and beta must be in (0, 1], got {name} = {value}")
    if samples < 1 or finetune_epochs < 0:
        raise FidelityError("samples must be >= 1 and finetune_epochs >= 0")
    families = [f.strip() for f in families if f.strip()]
    if not families or any(f not in FAMILIES for f in families):
        raise FidelityError(f"families must be among {FAMILIES}, got {families}")
    if "ffid" not in families:
        finetune_epochs = 0
    elif finetune_epochs == 0:
        families = [f for f in families if f != "ffid"]
        if not families:
            raise FidelityError("F-Fidelity alone needs finetune_epochs > 0")
    metric_names = [m for m in METRICS if m.rsplit("_", 1)[0] in families]
    ds = open_masked_dataset(ds_root)
    loaded = resolve_model(model, pretrained, device, precision)
    rows_all = ds.rows() if statuses is None else ds.rows(status=list(statuses))
    rows = [r for r in rows_all if r.get("mask_path") is not None and r.get("class_index") is not None]
    if not rows:
        raise FidelityError(f"{ds.root}: no sample with a class and a mask")
    all_classes = sorted({int(r["class_index"]) for r in rows})
    rows = _interleave_classes(rows)  # a limit keeps every class represented
    n_ft = len(rows) if finetune_limit is None else min(len(rows), finetune_limit)
    n_eval = len(rows) if limit is None else min(len(rows), limit)
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
                                            ds.root / "features" if write else None)
        head_columns: list[int] | None = columns
    else:
        if len(space) != 1000:
            raise FidelityError(f"{loaded.model_id} scores ImageNet-1K; {ds.root} uses '{space.name}'")
        columns, head_columns = list(range(1000)), None
    col_of = {c: j for j, c in enumerate(columns)}

    # --- decode images and input-aligned masks once
    items = MaskedImages(ds, rows, loaded.preprocess, mask_transform_for(loaded.preprocess), tuple(loaded.image_size))
    batches = [collate_masked([items[i] for i in range(j, min(j + batch_size, len(items)))])
               for j in range(0, len(items), batch_size)]
    good = [(b["image"][k], b["mask"][k], rows[b["index"][k]]) for b in batches for k in range(len(b["problem"]))
            if b["problem"][k] in ("", "mask_resized")]
    skipped = Counter(b["problem"][k] for b in batches for k in range(len(b["problem"]))
                      if b["problem"][k] not in ("", "mask_resized"))
    for reason, count in skipped.items():
        logger.warning("%s: %d samples skipped (%s)", ds.root, count, reason)
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

    # --- F-Fidelity's fine-tuning, cached
    finetuned = None
    ft_info: dict[str, Any] = {"epochs": finetune_epochs}
    if finetune_epochs > 0:
        t0 = time.perf_counter()
        ft_rows = rows_ok[:n_ft]
        key = finetune_key(loaded.model_id, [r["sample_id"] for r in ft_rows], columns, beta=beta,
                           epochs=finetune_epochs, lr=finetune_lr, seed=seed, cache_safe=loaded.cache_safe)
        path = ds.root / "features" / "fidelity" / f"{key}.pt"
        pick = _trainable(loaded)
        if loaded.cache_safe and path.exists():
            import copy

            tuned = copy.deepcopy(original)
            params = dict(tuned.named_parameters())
            for name, value in torch.load(path, map_location=loaded.device, weights_only=True).items():
                params[name].data.copy_(value)
            tuned.eval()
            ft_info["cached"] = True
        else:
            say(f"fine-tuning {loaded.model_id} ({finetune_epochs} epochs, beta {beta}, {len(ft_rows)} images)")
            tuned = finetune(original, forward, images_all[:n_ft], lab_all[:n_ft], beta=beta, epochs=finetune_epochs,
                             lr=finetune_lr, batch_size=batch_size, params=pick, seed=seed)
            ft_info["cached"] = False
            if write and loaded.cache_safe:
                chosen = {id(p) for p in pick(tuned)}
                state = {n: p.detach().cpu() for n, p in tuned.named_parameters() if id(p) in chosen}
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                torch.save(state, tmp)
                tmp.replace(path)
        ft_info.update(key=key, path=str(path), images=len(ft_rows), lr=finetune_lr)

        def finetuned(x: torch.Tensor) -> torch.Tensor:  # noqa: F811
            return forward(tuned, x)

        timings["finetune_s"] = time.perf_counter() - t0

    # --- explanations and curves
    images, masks, labels = images_all[:n_eval], masks_all[:n_eval], lab_all[:n_eval]
    cache: dict[str, torch.Tensor] = {}
    curves: dict[str, FidelityCurves] = {}
    for method in methods:
        t0 = time.perf_counter()
        say(f"scoring {method}")
        expl = _explanations(method, loaded, images, masks, cls_all[:n_eval], classifier, head_columns, seed,
                             batch_size, cache)
        parts = [fidelity_curves(predict, images[i:i + batch_size], expl[i:i + batch_size], labels[i:i + batch_size],
                                 sparsities=grid, alpha=alpha, beta=beta, samples=samples, finetuned=finetuned,
                                 score=score, metrics=metric_names, seed=seed + i)
                 for i in range(0, len(images), batch_size)]
        curves[method] = merge_curves(parts)
        timings[f"{method}_s"] = time.perf_counter() - t0
    aucs = {m: c.aucs for m, c in curves.items()}
    ranking = rank_methods(aucs)
    trust = trust_vs_reference(curves, seed=seed)
    for row in ranking:
        row.update(trust.get(row["method"], {}))
    correlations = degraded_correlations(curves)

    config = {
        "kind": "fidelity", "dataset": str(ds.root), "model": loaded.model_id, "model_kind": loaded.kind,
        "methods": list(methods), "sparsities": grid, "alpha": alpha, "beta": beta, "samples": samples,
        "score": score, "families": families, "seed": seed, "images": len(images), "finetune": ft_info,
        "baseline": "0 in the model's normalised input space (= the preprocessing's mean colour)",
        "elements": "pixels of the model input grid", "label_columns": len(columns), "skipped": dict(skipped),
    }
    timings["total_s"] = time.perf_counter() - started
    result = FidelityResult(curves, aucs, ranking, correlations, config, None, timings)
    if write:
        name = run_name or make_run_name("fidelity", loaded.model_id)
        run_dir = create_run(ds.root, name, config, overwrite=overwrite)
        write_fidelity_run(run_dir, result, write_json, write_bytes)
        result.run_dir = run_dir
    return result


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


def _family(metrics: set[str]) -> str:
    """The family a ranking uses: F-Fidelity when computed, else R-Fidelity, else Fidelity."""
    return next(f for f in ("ffid", "rfid", "fid") if f"{f}_plus" in metrics and f"{f}_minus" in metrics)


def rank_methods(aucs: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    """Methods by F-Fid+ AUC (higher first), then F-Fid- AUC (lower first); R-Fid (then Fid) when no F-Fid."""
    fam = _family({k for a in aucs.values() for k in a})
    order = sorted(aucs, key=lambda m: (-aucs[m][f"{fam}_plus"], aucs[m][f"{fam}_minus"]))
    return [{"rank": i + 1, "method": m, "by": fam, **{k: round(v, 6) for k, v in aucs[m].items()}}
            for i, m in enumerate(order)]


def trust_vs_reference(curves: Mapping[str, FidelityCurves], reference: str = "random", *, seed: int = 0,
                       n_boot: int = 2000) -> dict[str, dict[str, Any]]:
    """Is each method more faithful than the ``reference`` explanation (a random map), on the same images?

    With ``fam`` = F-Fid when computed (else R-Fid) and per-image AUCs over sparsity:
    ``morf = mean_i(AUC fam+ of method - AUC fam+ of random)`` (higher = the method's top pixels
    matter more than random ones) and ``lerf = mean_i(AUC fam- of random - AUC fam- of method)``
    (higher = keeping the method's top pixels preserves the prediction better), each with a
    paired bootstrap 95 % interval over images. ``verdict``: ``faithful`` when both intervals lie
    above 0, ``MoRF only`` / ``LeRF only`` when one does, ``not above random`` otherwise; the
    reference itself gets ``reference``. Empty when ``reference`` was not scored.
    """
    from curate.metrics.bootstrap import bootstrap_paired_mean
    from curate.metrics.fidelity import per_image_aucs

    if reference not in curves:
        return {}
    ref = curves[reference]
    fam = _family(set(ref.per_image))
    out: dict[str, dict[str, Any]] = {reference: {"verdict": "reference"}}
    for method, c in curves.items():
        if method == reference:
            continue
        morf = per_image_aucs(c, f"{fam}_plus") - per_image_aucs(ref, f"{fam}_plus")
        lerf = per_image_aucs(ref, f"{fam}_minus") - per_image_aucs(c, f"{fam}_minus")
        morf_ci = bootstrap_paired_mean(morf, n_boot=n_boot, seed=seed)
        lerf_ci = bootstrap_paired_mean(lerf, n_boot=n_boot, seed=seed + 1)
        above = (morf_ci.low > 0, lerf_ci.low > 0)
        verdict = {(True, True): "faithful", (True, False): "MoRF only", (False, True): "LeRF only",
                   (False, False): "not above random"}[above]
        out[method] = {"vs_random_morf": round(float(morf.mean()), 6), "vs_random_morf_low": round(morf_ci.low, 6),
                       "vs_random_morf_high": round(morf_ci.high, 6), "vs_random_lerf": round(float(lerf.mean()), 6),
                       "vs_random_lerf_low": round(lerf_ci.low, 6), "vs_random_lerf_high": round(lerf_ci.high, 6),
                       "verdict": verdict}
    return out


def vs_random_text(row: Mapping[str, Any], order: str) -> str:
    """``+0.012 [+0.004, +0.020]``: a ranking row's paired difference to the random map for ``order``
    (``morf`` or ``lerf``) with its 95 % interval; empty when the row has none (e.g. the reference)."""
    key = f"vs_random_{order}"
    if key not in row:
        return ""
    return f"{row[key]:+.3f} [{row[key + '_low']:+.3f}, {row[key + '_high']:+.3f}]"


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


def write_fidelity_run(run_dir: Path, result: FidelityResult, write_json: Callable, write_bytes: Callable) -> None:
    rows = [(m, metric, s, v) for m, c in result.curves.items() for metric, vals in c.curves.items()
            for s, v in zip(c.sparsities, vals)]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["method", "metric", "sparsity", "value"])
    w.writerows(rows)
    write_bytes(run_dir / "curves.csv", buf.getvalue().encode())
    write_json(run_dir / "curves.json", {m: {"sparsities": c.sparsities, "curves": c.curves, "images": c.n_images}
                                         for m, c in result.curves.items()})
    write_json(run_dir / "aucs.json", result.aucs)
    buf = io.StringIO()
    if result.ranking:
        fields = list(dict.fromkeys(k for row in result.ranking for k in row))
        w = csv.DictWriter(buf, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows(result.ranking)
    write_bytes(run_dir / "ranking.csv", buf.getvalue().encode())
    if result.correlations:
        write_json(run_dir / "correlations.json", result.correlations)
    write_bytes(run_dir / "curves.png", plot_curves(result.curves))
    write_json(run_dir / "summary.json", {"config": result.config, "aucs": result.aucs, "ranking": result.ranking,
                                          "correlations": result.correlations, "timings": result.timings})


def plot_curves(curves: Mapping[str, FidelityCurves]) -> bytes:
    """PNG of each metric's curve over sparsity, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(next(iter(curves.values())).curves)
    cols = 2
    nrows = (len(metrics) + 1) // 2
    fig, axes = plt.subplots(nrows, cols, figsize=(10, 3.2 * nrows), squeeze=False)
    for ax, metric in zip(axes.ravel(), metrics):
        for method, c in curves.items():
            ax.plot(c.sparsities, c.curves[metric], marker=".", label=method)
        ax.set_title(metric.replace("_plus", "+ (MoRF)").replace("_minus", "- (LeRF)"))
        ax.set_xlabel("sparsity")
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(metrics):]:
        ax.axis("off")
    axes.ravel()[0].legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


__all__ = ["FAMILIES", "REFERENCE_METHODS", "FidelityResult", "check_methods", "degraded_correlations",
           "fidelity_dataset", "parse_sparsity", "plot_curves", "rank_methods", "trust_vs_reference",
           "vs_random_text"]
