"""The evaluate stage's LVLM branch: answer losses of every candidate -> a scores matrix.

For each sample ``i`` and each candidate label ``c`` of its candidate space (1 vs 20 by
default, papers/003 §3.3 and App. C.2), the answer ``answer_template.format(name(c))`` is scored
with the question as context (papers/003 App. C.4, docs/design.md#lvlm-scoring):

```
score[i, c] = -mean_nll(i, c)     for c among sample i's candidates
score[i, c] = -inf                otherwise
```

so the existing top-k (``argsort(-score)``) predicts the candidate with the LOWEST loss, and
``candidates.restrict``, top-k and :func:`curate.stages.evaluate.compute_metrics` stay as they
are. Both mean and summed NLL of every candidate go to the run's
``candidate_losses.parquet``. Images that fail to decode are excluded and counted, with the
reason, like every other model's.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from curate.lvlm.defaults import DEFAULT_ANSWER_TEMPLATE, DEFAULT_QUESTION

__all__ = ["LVLM_PREFIXES", "is_lvlm_spec", "resolve_label_space", "load_lvlm", "lvlm_scores", "LvlmScores",
           "prompt_config", "cost_estimate", "answer_text"]

logger = logging.getLogger(__name__)

#: Model-name prefixes of the LVLM backends (``lvlm:PATH_OR_REPO``, ``endpoint:URL#NAME``).
LVLM_PREFIXES = ("lvlm", "endpoint")
#: Candidates per image above which the cost estimate is a warning.
COSTLY_CANDIDATES = 100


def is_lvlm_spec(model: Any) -> bool:
    """Whether ``model`` (a ModelSpec, a name or a loaded model) is an LVLM backend's."""
    if getattr(model, "kind", None) == "lvlm":
        return True
    name = getattr(model, "name", model)
    return isinstance(name, str) and name.partition(":")[0] in LVLM_PREFIXES and ":" in name


def resolve_label_space(settings: Any, model: Any) -> Any:
    """``label_space="auto"`` -> ``top20`` for an LVLM (1000 answers per image is 50x the cost),
    ``imagenet1k`` for every other model; any other value is kept."""
    if getattr(settings, "label_space", None) != "auto":
        return settings
    return dataclasses.replace(settings, label_space="top20" if is_lvlm_spec(model) else "imagenet1k")


def answer_text(template: str, label: str) -> str:
    """``template.format(label)``; a template without ``{}`` is refused (every answer would be equal)."""
    if "{}" not in template:
        raise ValueError(f"the answer template {template!r} has no '{{}}' for the label")
    return template.replace("{}", label)


def prompt_config(question: str, template: str) -> dict[str, Any]:
    """What an LVLM run records as its prompts: the paper's pair is named ``paper-qa``, any other
    pair ``qa-<sha256 prefix>`` so that ``compare`` never fits across prompt sets."""
    default = question == DEFAULT_QUESTION and template == DEFAULT_ANSWER_TEMPLATE
    digest = hashlib.sha256(f"{question}\x00{template}".encode()).hexdigest()[:8]
    return {"name": "paper-qa" if default else f"qa-{digest}", "templates": [template], "question": question,
            "protocol": "answer likelihood, lowest mean NLL over answer tokens (papers/003 App. C.4)"}


def cost_estimate(n_images: int, n_candidates: int) -> str:
    """One line: how many answers will be scored, and against 1 vs 20."""
    answers = n_images * n_candidates
    return (f"LVLM scoring: {n_images} images x {n_candidates} candidates = {answers} answers to score "
            f"({n_candidates / 20:.0f}x the 1-vs-20 cost)")


def load_lvlm(spec: Any, settings: Any) -> Any:
    """Load the LVLM a spec names, with the settings' device, precision, batch and token variable."""
    prefix, _, rest = spec.name.partition(":")
    if prefix == "endpoint":
        from curate.lvlm.endpoint import EndpointClient, parse_endpoint_name

        base, name = parse_endpoint_name(rest)
        return EndpointClient(base, name, token_env=getattr(settings, "token_env", None),
                              workers=getattr(settings, "workers", None) or 4)
    from curate.lvlm.hf import load_hf_lvlm

    source = rest or spec.pretrained
    if not source:
        raise ValueError("name the model as lvlm:PATH_OR_REPO (a local folder or a repo in the local HF cache)")
    return load_hf_lvlm(source, device=settings.device, precision=settings.precision,
                        batch_size=max(1, min(int(settings.batch_size), 64)))


@dataclass
class LvlmScores:
    """What the LVLM branch gives the evaluate stage (see the module docstring)."""

    scores: np.ndarray  # [N_kept, L] float32: -mean NLL at candidates, -inf elsewhere
    sample_ids: list[str]
    failed: dict[str, str]
    scored: int
    losses: Any  # pyarrow Table: sample_id, label, mean_nll, sum_nll
    model: Any


def _decode(ds: Any, sample_ids: Sequence[str]) -> tuple[list[Any], list[str], dict[str, str]]:
    images, kept, failed = [], [], {}
    for sid in sample_ids:
        try:
            images.append(ds.load_image(sid))
            kept.append(sid)
        except Exception as error:  # noqa: BLE001 - reported per sample, never fatal
            failed[sid] = f"{type(error).__name__}: {error}"[:300]
    return images, kept, failed


def lvlm_scores(ds: Any, model: Any, rows: Sequence[dict], candidates: Any, settings: Any,
                progress: Any = None) -> LvlmScores:
    """Score every row's candidates with an LVLM (a spec to load, or a loaded HFLvlm/EndpointClient)."""
    import pyarrow as pa

    loaded = model if getattr(model, "kind", None) == "lvlm" and hasattr(model, "answer_losses") \
        else load_lvlm(model, settings)
    question = getattr(settings, "question", DEFAULT_QUESTION)
    template = getattr(settings, "answer_template", DEFAULT_ANSWER_TEMPLATE)
    names = ds.label_space.names
    n_labels = len(names)
    ids = [r["sample_id"] for r in rows]
    class_of = {r["sample_id"]: int(r["class_index"]) for r in rows}
    sizes = {len(candidates.candidates_for(c)) for c in set(class_of.values())}
    message = cost_estimate(len(ids), max(sizes))
    (logger.warning if max(sizes) > COSTLY_CANDIDATES else logger.info)(message)
    texts: dict[int, str] = {}
    scores_rows: list[np.ndarray] = []
    kept: list[str] = []
    failed: dict[str, str] = {}
    table: dict[str, list] = {"sample_id": [], "label": [], "mean_nll": [], "sum_nll": []}
    chunk = 32  # images decoded at a time (bounded memory; the model batches within)
    done = 0
    for start in range(0, len(ids), chunk):
        images, good, bad = _decode(ds, ids[start:start + chunk])
        failed.update(bad)
        if good:
            cands = [candidates.candidates_for(class_of[sid]) for sid in good]
            answers = [[texts.setdefault(int(c), answer_text(template, names[int(c)])) for c in cs] for cs in cands]
            mean, total = loaded.answer_losses(images, question, answers)
            for row, (sid, cs) in enumerate(zip(good, cands)):
                m, s = mean[row, :len(cs)], total[row, :len(cs)]
                if not (np.isfinite(m).all() and np.isfinite(s).all()):
                    failed[sid] = "non-finite model output (NaN or inf answer loss)"
                    continue
                line = np.full(n_labels, -np.inf, dtype=np.float32)
                line[np.asarray(cs, dtype=np.int64)] = -m
                scores_rows.append(line)
                kept.append(sid)
                table["sample_id"].extend([sid] * len(cs))
                table["label"].extend(int(c) for c in cs)
                table["mean_nll"].extend(m.tolist())
                table["sum_nll"].extend(s.tolist())
        done += len(ids[start:start + chunk])
        if progress is not None:
            progress(done, len(ids))
    scores = np.stack(scores_rows) if scores_rows else np.zeros((0, n_labels), dtype=np.float32)
    losses = pa.table({"sample_id": pa.array(table["sample_id"], pa.string()),
                       "label": pa.array(table["label"], pa.int32()),
                       "mean_nll": pa.array(table["mean_nll"], pa.float64()),
                       "sum_nll": pa.array(table["sum_nll"], pa.float64())})
    return LvlmScores(scores=scores, sample_ids=kept, failed=failed, scored=len(kept), losses=losses, model=loaded)
