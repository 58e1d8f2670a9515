"""Background pre-labels: a CLIP proposes a background for samples people have not labelled.

For a sample of class c and each background b of the dataset's vocabulary, the prompt
embedding ``w_{c,b}`` averages the templates of ``datasets/backgrounds.yaml`` (or the user's),
filled with c's name and b's phrase; the sample's scores are ``100 * <f, w_{c,b}>`` and
``p(b) = softmax_b`` of them. The label is the argmax, ``background_score`` its probability,
``background_source = "model"``; a probability below ``threshold`` adds the tag
``review:background`` so people see it first. Labels from people (``human``) and from the
synthetic world's truth (``synthetic``) are never overwritten; earlier model labels are
refreshed. Image embeddings come from the feature cache (the same as evaluation).

``measure=True`` writes nothing: it predicts for samples that already carry a human or
synthetic label and reports agreement, the per-background confusion and chance levels.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from curate.paths import data_file

logger = logging.getLogger(__name__)

REVIEW_TAG = "review:background"
PROTECTED_SOURCES = ("human", "synthetic")


@dataclass
class BackgroundPrompts:
    phrases: dict[str, str]
    templates: tuple[str, ...]

    def phrase(self, background: str) -> str:
        return self.phrases.get(background, background)


def load_background_prompts(path: Path | None = None) -> BackgroundPrompts:
    """Phrases and templates from ``datasets/backgrounds.yaml`` or a user file of the same form."""
    source = Path(path) if path else data_file("backgrounds.yaml")
    data = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
    templates = tuple(data.get("templates") or ())
    if not templates:
        raise ValueError(f"{source}: no templates")
    for t in templates:
        if "{background}" not in t:
            raise ValueError(f"{source}: template {t!r} has no {{background}}")
        try:
            t.format(background="x", **{"class": "y"})
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(f"{source}: template {t!r} may only use {{background}} and {{class}} ({error})") from error
    return BackgroundPrompts({str(k): str(v) for k, v in (data.get("phrases") or {}).items()}, templates)


@dataclass
class BackgroundReport:
    labelled: int = 0
    low_confidence: int = 0
    skipped_protected: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    agreement: float | None = None  # measure mode
    chance_uniform: float | None = None
    chance_majority: float | None = None
    n_measured: int = 0
    confusion: dict[str, dict[str, int]] = field(default_factory=dict)
    per_background_recall: dict[str, float] = field(default_factory=dict)


def _text_weights(model, class_names: Sequence[str], vocabulary: Sequence[str], prompts: BackgroundPrompts) -> torch.Tensor:
    """(C, B, D): per class, per background, the averaged normalised prompt embedding."""
    texts = [t.format(background=prompts.phrase(b), **{"class": c}) for c in class_names for b in vocabulary
             for t in prompts.templates]
    emb = model.encode_text(texts, normalize=True).float().cpu()
    emb = emb.view(len(class_names), len(vocabulary), len(prompts.templates), -1).mean(dim=2)
    return F.normalize(emb, dim=-1)


def predict_backgrounds(ds, model, rows: Sequence[dict], vocabulary: Sequence[str], prompts: BackgroundPrompts,
                        *, batch_size: int = 256, workers: int | None = None, progress=None):
    """(sample ids, probabilities (N, B), failures) for ``rows`` (each needs a class)."""
    from curate.features import compute_features

    feats = compute_features(ds, model, [r["sample_id"] for r in rows], kind="embedding", batch_size=batch_size,
                             workers=workers, progress=progress)
    by_id = {r["sample_id"]: r for r in rows}
    present = sorted({int(by_id[s]["class_index"]) for s in feats.sample_ids})
    weights = _text_weights(model, [ds.label_space.names[c] for c in present], vocabulary, prompts)
    position = {c: i for i, c in enumerate(present)}
    image = torch.from_numpy(feats.values)
    per_sample_w = weights[[position[int(by_id[s]["class_index"])] for s in feats.sample_ids]]  # (N, B, D)
    logits = 100.0 * torch.einsum("nd,nbd->nb", F.normalize(image, dim=-1), per_sample_w)
    return feats.sample_ids, torch.softmax(logits, dim=1).numpy(), feats.failed


def label_backgrounds(
    dataset_root: Path, model_name: str, pretrained: str | None = None, *, prompts_file: Path | None = None,
    threshold: float = 0.5, measure: bool = False, device: str = "auto", batch_size: int = 256,
    workers: int | None = None, progress=None,
) -> BackgroundReport:
    """Pre-label (or, with ``measure``, score against existing labels); see the module docstring."""
    from curate.models import load_model
    from curate.store import Dataset

    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"--threshold must be in [0, 1], got {threshold}")
    ds = Dataset.open(dataset_root)
    prompts = load_background_prompts(prompts_file)
    vocabulary = list(ds.backgrounds)
    model = load_model(model_name, pretrained, device=device)
    if model.kind != "clip":
        raise ValueError(f"background pre-labels need a CLIP (text prompts); {model.model_id} is a classifier")
    rows = [r for r in ds.rows() if r["class_index"] is not None and r["status"] != "rejected"]
    report = BackgroundReport()
    if measure:
        target = [r for r in rows if r["background"] is not None and r["background_source"] in PROTECTED_SOURCES]
        if not target:
            raise ValueError("nothing to measure against: no sample has a human or synthetic background label")
        present = sorted({r["background"] for r in target})
        ids, probs, failed = predict_backgrounds(ds, model, target, present, prompts, batch_size=batch_size,
                                                 workers=workers, progress=progress)
        truth = {r["sample_id"]: r["background"] for r in target}
        predicted = [present[i] for i in probs.argmax(axis=1)]
        actual = [truth[s] for s in ids]
        report.n_measured = len(ids)
        report.agreement = float(np.mean([p == a for p, a in zip(predicted, actual)])) if ids else float("nan")
        counts = Counter(actual)
        report.chance_uniform = 1.0 / len(present)
        report.chance_majority = max(counts.values()) / len(actual) if actual else float("nan")
        for a, p in zip(actual, predicted):
            report.confusion.setdefault(a, {}).setdefault(p, 0)
            report.confusion[a][p] += 1
        report.per_background_recall = {b: report.confusion.get(b, {}).get(b, 0) / counts[b] for b in counts}
        report.failed = failed
        return report
    target = [r for r in rows if r["background"] is None or r["background_source"] == "model"]
    report.skipped_protected = sum(1 for r in rows if r["background"] is not None and r["background_source"] in PROTECTED_SOURCES)
    if not target:
        return report
    ids, probs, failed = predict_backgrounds(ds, model, target, vocabulary, prompts, batch_size=batch_size,
                                             workers=workers, progress=progress)
    report.failed = failed
    by_id = {r["sample_id"]: r for r in target}
    per_sample = {}
    for sid, p in zip(ids, probs):
        best = int(p.argmax())
        tags = [t for t in (by_id[sid]["tags"] or []) if t != REVIEW_TAG]
        if p[best] < threshold:
            tags.append(REVIEW_TAG)
            report.low_confidence += 1
        per_sample[sid] = {"background": vocabulary[best], "background_score": float(p[best]),
                           "background_source": "model", "tags": tags}
    ds.update(list(per_sample), per_sample=per_sample, actor=f"label-backgrounds:{model.model_id}",
              reason="CLIP background pre-label")
    report.labelled = len(per_sample)
    ds.record_provenance("label_backgrounds", {"model_id": model.model_id, "templates": list(prompts.templates),
                                               "threshold": threshold, "labelled": report.labelled,
                                               "low_confidence": report.low_confidence})
    return report
