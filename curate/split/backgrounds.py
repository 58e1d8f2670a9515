"""Background pre-labels: a CLIP proposes a background for samples people have not labelled.

For a sample of class c and each background b of the dataset's vocabulary, the prompt
embedding ``w_{c,b}`` averages the templates of ``datasets/backgrounds.yaml`` (or the user's),
filled with c's name and b's phrase; the sample's scores are ``LOGIT_SCALE * <f, w_{c,b}>``
(CLIP's 100, :data:`curate.zeroshot.classifier.LOGIT_SCALE`) and
``p(b) = softmax_b`` of them. The label is the argmax, ``background_score`` its probability,
``background_source = "model"``; a probability below ``threshold`` adds the tag
``review:background`` so people see it first. Labels from people (``human``) and from the
synthetic world's truth (``synthetic``) are never overwritten; earlier model labels are
refreshed. Image embeddings come from the feature cache (the same as evaluation).

``measure=True`` writes nothing: it predicts for samples that already carry a human or
synthetic label and reports agreement, the per-background confusion and chance levels.

This module holds the pieces; the stage (dataset in, labels and a report out) is
:func:`curate.stages.label_backgrounds.label_backgrounds`.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from curate.paths import data_file
from curate.zeroshot.classifier import LOGIT_SCALE

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
                        *, batch_size: int = 256, workers: int | None = None, progress=None, engine=None,
                        factory=None):
    """(sample ids, probabilities (N, B), failures) for ``rows`` (each needs a class).

    Image embeddings fill the feature cache through ``engine`` (:mod:`curate.engine`; default
    in-process; ``factory`` is how a remote worker loads the model), then the prediction runs here.
    """
    from curate.features import compute_features

    feats = compute_features(ds, model, [r["sample_id"] for r in rows], kind="embedding", batch_size=batch_size,
                             workers=workers, progress=progress, engine=engine, factory=factory)
    by_id = {r["sample_id"]: r for r in rows}
    present = sorted({int(by_id[s]["class_index"]) for s in feats.sample_ids})
    weights = _text_weights(model, [ds.label_space.names[c] for c in present], vocabulary, prompts)
    position = {c: i for i, c in enumerate(present)}
    image = torch.from_numpy(feats.values)
    per_sample_w = weights[[position[int(by_id[s]["class_index"])] for s in feats.sample_ids]]  # (N, B, D)
    logits = LOGIT_SCALE * torch.einsum("nd,nbd->nb", F.normalize(image, dim=-1), per_sample_w)
    return feats.sample_ids, torch.softmax(logits, dim=1).numpy(), feats.failed


def measure_agreement(ids: Sequence[str], probs: np.ndarray, present: Sequence[str],
                      truth: dict[str, str]) -> BackgroundReport:
    """Agreement of the argmax pre-labels with the existing labels ``truth`` (``measure`` mode)."""
    report = BackgroundReport()
    predicted = [present[i] for i in probs.argmax(axis=1)] if len(ids) else []
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
    return report


def pre_label_updates(ids: Sequence[str], probs: np.ndarray, vocabulary: Sequence[str], rows_by_id: dict[str, dict],
                      threshold: float) -> tuple[dict[str, dict], int]:
    """Per-sample updates (background, score, source ``model``, tags) and how many fell below ``threshold``."""
    per_sample, low = {}, 0
    for sid, p in zip(ids, probs):
        best = int(p.argmax())
        tags = [t for t in (rows_by_id[sid]["tags"] or []) if t != REVIEW_TAG]
        if p[best] < threshold:
            tags.append(REVIEW_TAG)
            low += 1
        per_sample[sid] = {"background": vocabulary[best], "background_score": float(p[best]),
                           "background_source": "model", "tags": tags}
    return per_sample, low
