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
#: Images per engine batch (decoded together; the model batches within, ``--batch-size``).
IMAGES_PER_BATCH = 32


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

    return load_hf_lvlm(_hf_source(spec), device=settings.device, precision=settings.precision,
                        batch_size=_model_batch(settings))


def _hf_source(spec: Any) -> str:
    """The folder or cached repo an ``lvlm:`` spec names."""
    source = spec.name.partition(":")[2] or spec.pretrained
    if not source:
        raise ValueError("name the model as lvlm:PATH_OR_REPO (a local folder or a repo in the local HF cache)")
    return source


def _model_batch(settings: Any) -> int:
    """Images per prefix forward of an in-process LVLM: ``--batch-size``, capped at 64."""
    return max(1, min(int(getattr(settings, "batch_size", 8)), 64))


@dataclass
class LvlmScores:
    """What the LVLM branch gives the evaluate stage (see the module docstring)."""

    scores: np.ndarray  # [N_kept, L] float32: -mean NLL at candidates, -inf elsewhere
    sample_ids: list[str]
    failed: dict[str, str]
    scored: int
    losses: Any  # pyarrow Table: sample_id, label, mean_nll, sum_nll
    model: Any


class _ScoreAnswers:
    """``BatchJob.worker`` of LVLM scoring: the driver's model on the local engine (``device``
    ``auto``), else the model loaded once in the worker (a Ray actor) from its folder, checked
    against the driver's model id; ``run(payload)`` scores one batch's answers."""

    def __init__(self, *, model: Any | None, source: str | None, precision: str, batch_size: int,
                 expected_model_id: str, question: str) -> None:
        self.model, self.source, self.precision = model, source, precision
        self.batch_size, self.expected_model_id, self.question = batch_size, expected_model_id, question

    def __call__(self, device: str) -> Any:
        from curate.engine.base import worker_model

        return _AnswerLosses(worker_model(self.model, device, self._load, self.expected_model_id, str(self.source)),
                             self.question)

    def _load(self, device: str) -> Any:
        from curate.lvlm.hf import load_hf_lvlm

        return load_hf_lvlm(self.source, device=device, precision=self.precision, batch_size=self.batch_size)


class _AnswerLosses:
    """One batch: ``(sample ids, mean NLL, summed NLL, failures)`` for the images that decoded."""

    def __init__(self, model: Any, question: str) -> None:
        self.model, self.question = model, question

    def __call__(self, payload: dict[str, Any]) -> dict[str, Any]:
        items = payload["items"]
        if not items:
            return {"ids": [], "mean": None, "total": None, "failed": payload["failed"]}
        mean, total = self.model.answer_losses(payload["images"], self.question, [i["answers"] for i in items])
        return {"ids": [i["sample_id"] for i in items], "mean": np.asarray(mean), "total": np.asarray(total),
                "failed": payload["failed"]}


def lvlm_scores(ds: Any, model: Any, rows: Sequence[dict], candidates: Any, settings: Any,
                progress: Any = None, *, engine: Any = None) -> LvlmScores:
    """Score every row's candidates with an LVLM (a spec, or a loaded HFLvlm/EndpointClient).

    ``engine`` (:mod:`curate.engine`; default the local one) runs the batches of
    :data:`IMAGES_PER_BATCH` images: on the local engine the driver loads the model and runs
    them; on Ray (``lvlm:`` models only) each actor loads the model from its folder, which must
    be readable on every node, and the driver loads nothing (:func:`curate.lvlm.hf.lvlm_identity`
    names the model). The batches are the same on every engine, so the losses are too
    (bit-identical in fp32 on CPU).
    """
    import pyarrow as pa

    from curate.engine.base import BatchJob, DecodeImages
    from curate.engine.local import LocalEngine

    engine = engine or LocalEngine(workers=0)
    remote = getattr(engine, "name", "local") != "local"
    question = getattr(settings, "question", DEFAULT_QUESTION)
    template = getattr(settings, "answer_template", DEFAULT_ANSWER_TEMPLATE)
    if getattr(model, "kind", None) == "lvlm" and hasattr(model, "answer_losses"):
        loaded = model
    elif remote:
        loaded = _remote_identity(model, settings)
    else:
        loaded = load_lvlm(model, settings)
    source = (getattr(loaded, "info", None) or {}).get("folder")
    if remote and not source:
        raise ValueError(f"{loaded.model_id} cannot be scored on --engine {engine.name}: Ray actors load an lvlm: "
                         "model from its folder, and this one has none")
    names = ds.label_space.names
    n_labels = len(names)
    class_of = {r["sample_id"]: int(r["class_index"]) for r in rows}
    sizes = {len(candidates.candidates_for(c)) for c in set(class_of.values())}
    message = cost_estimate(len(rows), max(sizes))
    (logger.warning if max(sizes) > COSTLY_CANDIDATES else logger.info)(message)
    texts: dict[int, str] = {}
    items = []
    for r in rows:
        cands = [int(c) for c in candidates.candidates_for(class_of[r["sample_id"]])]
        items.append({"sample_id": r["sample_id"], "labels": cands,
                      "answers": [texts.setdefault(c, answer_text(template, names[c])) for c in cands]})
    worker = _ScoreAnswers(model=None if remote else loaded, source=source, precision=settings.precision,
                           batch_size=_model_batch(settings), expected_model_id=loaded.model_id,
                           question=question)
    job = BatchJob(items=items, batch_size=IMAGES_PER_BATCH, decode=DecodeImages(ds), worker=worker)
    labels_of = {item["sample_id"]: item["labels"] for item in items}
    scores_rows: list[np.ndarray] = []
    kept: list[str] = []
    failed: dict[str, str] = {}
    table: dict[str, list] = {"sample_id": [], "label": [], "mean_nll": [], "sum_nll": []}
    done = 0
    for result in engine.map_batches(ds, [i["sample_id"] for i in items], job):
        failed.update(result["failed"])
        for row, sid in enumerate(result["ids"]):
            cs = labels_of[sid]
            m, s = result["mean"][row, :len(cs)], result["total"][row, :len(cs)]
            if not (np.isfinite(m).all() and np.isfinite(s).all()):
                failed[sid] = "non-finite model output (NaN or inf answer loss)"
                continue
            line = np.full(n_labels, -np.inf, dtype=np.float32)
            line[np.asarray(cs, dtype=np.int64)] = -m
            scores_rows.append(line)
            kept.append(sid)
            table["sample_id"].extend([sid] * len(cs))
            table["label"].extend(cs)
            table["mean_nll"].extend(m.tolist())
            table["sum_nll"].extend(s.tolist())
        done += len(result["ids"]) + len(result["failed"])
        if progress is not None:
            progress(done, len(items))
    scores = np.stack(scores_rows) if scores_rows else np.zeros((0, n_labels), dtype=np.float32)
    losses = pa.table({"sample_id": pa.array(table["sample_id"], pa.string()),
                       "label": pa.array(table["label"], pa.int32()),
                       "mean_nll": pa.array(table["mean_nll"], pa.float64()),
                       "sum_nll": pa.array(table["sum_nll"], pa.float64())})
    return LvlmScores(scores=scores, sample_ids=kept, failed=failed, scored=len(kept), losses=losses, model=loaded)


def _remote_identity(spec: Any, settings: Any) -> Any:
    """The identity of the ``lvlm:`` model a spec names, for a driver that loads nothing (an
    ``endpoint:`` model is refused: it already scales on its own server)."""
    if spec.name.partition(":")[0] == "endpoint":
        raise ValueError("an endpoint: model is scored by its server, which batches and scales on its own; run it "
                         "with --engine local (the default) and raise --workers for more concurrent requests")
    from curate.lvlm.hf import lvlm_identity

    return lvlm_identity(_hf_source(spec), precision=settings.precision)
