"""The vlm-explain stage: a vision-language model answers among the candidates, then explains (papers/001 App. C).

For each sample (image ``I``, question ``Q``, the sample's candidate labels ``A`` from the label
space, 1 vs 20 by default):

1. **answer**: ``generate`` (default, papers/001 App. C step 1) asks for one of the choices and
   reads the reply (:func:`parse_answer`: the reply is a candidate, up to case, punctuation and a
   leading article, or names exactly one candidate as a whole word; otherwise it is *unparsed*,
   counted, and the sample counts as wrong); ``likelihood`` takes the candidate with the lowest
   mean answer NLL (papers/003 App. C.4, issue 15's scorer);
2. **explain**: the model gets the answer back and "Please explain the reasoning behind your
   answer." (App. C step 2; every prompt is a setting, recorded in the run).

Every model call is cached on disk per (step, model, prompt, image) (:class:`curate.vlm_quality.cache.RoleCache`
under ``DIR/features/vlm_quality/``), so an interrupted run resumes and a re-run calls nothing.
Writes a :class:`curate.runs.VlmExplainRun`.
"""
from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from curate.models.spec import ModelSpec
from curate.progress import Progress, phase, report
from curate.runs.vlm_explain import VlmExplainRun, explanations_schema
from curate.stages.common import claim_run_dir, model_identity, open_dataset, run_stage, spec_of
from curate.vlm_quality.cache import CACHE_DIR, RoleCache
from curate.vlm_quality.contrastiveness import mask_options
from curate.vlm_quality.prompts import ExplainPrompts
from curate.vlm_quality.roles import BackendPool, ImageRef, parse_role_spec

log = logging.getLogger(__name__)

__all__ = ["VlmExplainSettings", "vlm_explain", "parse_answer", "ANSWER_MODES", "select_rows"]

ANSWER_MODES = ("generate", "likelihood")
_ARTICLE = re.compile(r"^(?:a|an|the)\s+", re.IGNORECASE)


@dataclass
class VlmExplainSettings:
    """How to ask (the CLI's options map one to one)."""

    label_space: str = "top20"  # top20 | imagenet1k | dataset | a file (see curate.zeroshot.candidates)
    answer_mode: str = "generate"  # generate | likelihood
    answer_template: str = "A {}."  # likelihood: the answer text scored per candidate
    prompts: ExplainPrompts = field(default_factory=ExplainPrompts)
    limit: int | None = None
    statuses: tuple[str, ...] = ("candidate", "accepted")
    answer_max_tokens: int = 16
    explain_max_tokens: int = 128
    device: str = "cpu"
    precision: str = "fp32"
    token_env: str | None = None
    timeout: float | None = None
    retries: int | None = None
    backoff_base: float | None = None  # endpoints: first retry wait in seconds (doubles per retry)
    top20_reference: ModelSpec | None = None
    rebuild_top20: bool = False
    use_cache: bool = True

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["top20_reference"] = self.top20_reference.label if self.top20_reference else None
        return out


def _norm(text: str) -> str:
    text = " ".join(re.sub(r"[^\w\s'-]", " ", str(text)).split()).casefold()
    return _ARTICLE.sub("", text)


def parse_answer(reply: str, candidates: Sequence[str]) -> int | None:
    """The index of the candidate ``reply`` names, or None (see the module docstring for the rule)."""
    key = _norm(reply)
    if not key:
        return None
    normed = [_norm(c) for c in candidates]
    if key in normed:
        return normed.index(key)
    _, log_entries = mask_options(reply, list(candidates))
    named = {e["option"] for e in log_entries}
    hits = [i for i, c in enumerate(candidates) if c in named]
    return hits[0] if len(hits) == 1 else None


def select_rows(rows: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """``limit`` rows taken round-robin over (group, class) cells, each cell in sample-id order, so a
    small limit still covers easy and hard samples of every class; all rows when ``limit`` is None."""
    ordered = sorted(rows, key=lambda r: r["sample_id"])
    if limit is None or limit >= len(ordered):
        return ordered
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in ordered:
        cells.setdefault((str(r.get("group") or ""), int(r["class_index"])), []).append(r)
    queues = [cells[k] for k in sorted(cells)]
    out: list[dict[str, Any]] = []
    depth = 0
    while len(out) < limit:
        for q in queues:
            if depth < len(q) and len(out) < limit:
                out.append(q[depth])
        depth += 1
    return out


def _role_text(model: Any) -> str:
    """The role spec text of a model named by a spec (a string or a :class:`ModelSpec`)."""
    return model if isinstance(model, str) else model.name


def as_text_backend(model: Any, pool: BackendPool, *, role: str = "--model") -> Any:
    """A generating backend from a role spec (``lvlm:...`` / ``endpoint:...``, a string or a
    :class:`ModelSpec`), a loaded LLaVA-style model (:class:`curate.lvlm.hf.HFLvlm`), or any
    backend with ``complete`` and ``model_id`` (returned as it is)."""
    if spec_of(model) is not None:
        return pool.text_backend(parse_role_spec(_role_text(model), allowed=("endpoint", "lvlm"), role=role))
    if hasattr(model, "complete") and hasattr(model, "model_id"):
        return model
    if hasattr(model, "generate") and hasattr(model, "answer_losses") and hasattr(model, "processor"):
        from curate.vlm_quality.roles import LvlmBackend

        return LvlmBackend(model)
    raise TypeError(f"{role}: a {type(model).__name__} cannot generate text; pass lvlm:PATH_OR_REPO, "
                    "endpoint:URL#MODEL, a loaded curate.lvlm.hf.HFLvlm, or a backend with complete()")


def _ask(cache: RoleCache, step: str, backend: Any, system: str, user: str, ref: ImageRef, max_tokens: int) -> str:
    """One cached generation of ``backend`` (keyed by step, model, system and user prompt, image)."""
    def compute() -> str:
        return backend.complete(user, system=system, image=ref, max_tokens=max_tokens)

    return str(cache.call(step, backend.model_id, {"system": system, "user": user}, compute, image=ref.key) or "")


def _losses(cache: RoleCache, backend: Any, question: str, answers: list[str], ref: ImageRef) -> list[float]:
    """Mean answer NLL per candidate answer (cached), papers/003 App. C.4."""
    def compute() -> list[float]:
        return [float(x) for x in backend.answer_losses([ref], question, [answers])[0][0]]

    return cache.call("explainer-likelihood", backend.model_id, {"question": question, "answers": answers}, compute,
                      image=ref.key)


@run_stage("vlm-explain")
def vlm_explain(dataset: Any, model: Any, settings: VlmExplainSettings | None = None, *, run_name: str | None = None,
                overwrite: bool = False, progress: Progress | None = None) -> VlmExplainRun:
    """Ask ``model`` for its answer and its explanation on each sample; write a :class:`VlmExplainRun`.

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        model: ``lvlm:PATH_OR_REPO`` | ``endpoint:URL#MODEL`` (a string or a :class:`ModelSpec`), a
            loaded :class:`curate.lvlm.hf.HFLvlm`, or any backend with ``complete`` (and
            ``answer_losses`` for ``likelihood``); the config's ``model`` records what was passed
            (:func:`curate.stages.common.model_identity`) beside the ``spec`` text.
        settings: :class:`VlmExplainSettings`.
        run_name: the run folder (default ``vlm-explain-<model>-<UTC time>``); a finished one is
            refused before any model is called unless ``overwrite``, an unfinished one (killed)
            replaced (:func:`curate.stages.common.run_stage`).
        progress: phases "asking".
    """
    from curate.stages.evaluate import EvalSettings, resolve_candidates

    settings = settings or VlmExplainSettings()
    if settings.answer_mode not in ANSWER_MODES:
        raise ValueError(f"answer mode must be one of {ANSWER_MODES}, got {settings.answer_mode!r}")
    if settings.limit is not None and settings.limit < 1:
        raise ValueError("--limit must be at least 1")
    ds = open_dataset(dataset)
    rows = [r for r in ds.rows(status=list(settings.statuses)) if r["class_index"] is not None]
    if not rows:
        raise ValueError(f"{ds.root}: no samples with status in {list(settings.statuses)} and a class to ask about")
    eval_settings = EvalSettings(label_space=settings.label_space, device=settings.device,
                                 top20_reference=settings.top20_reference, rebuild_top20=settings.rebuild_top20)
    candidates = resolve_candidates(ds, eval_settings, rows, phase(progress, "building the 1-vs-20 space"))
    candidates.check_covers([r["class_index"] for r in rows], ds.label_space)
    pool = BackendPool(device=settings.device, precision=settings.precision, token_env=settings.token_env,
                       timeout=settings.timeout, retries=settings.retries,
                       backoff_base=settings.backoff_base)
    backend = as_text_backend(model, pool)
    identity = model_identity(model, backend)
    if settings.answer_mode == "likelihood" and not hasattr(backend, "answer_losses"):
        raise ValueError(f"{backend.model_id} cannot score answers by likelihood; use --answer generate")
    cache = RoleCache(ds.root / "features" / CACHE_DIR if settings.use_cache else None)
    chosen = select_rows(rows, settings.limit)
    names = ds.label_space.names
    p = settings.prompts
    started = time.perf_counter()
    out: dict[str, list[Any]] = {f.name: [] for f in explanations_schema()}
    skipped: dict[str, str] = {}
    for done, row in enumerate(chosen, start=1):
        path = ds.image_path(row)
        if not path.is_file():
            skipped[row["sample_id"]] = "missing_image"
            continue
        ref = ImageRef(str(row["sha256"]), path)
        cand = [int(c) for c in candidates.candidates_for(int(row["class_index"]))]
        cand_names = [names[c] for c in cand]
        choices = ", ".join(cand_names)
        if settings.answer_mode == "generate":
            user = p.answer_user.format(question=p.question, choices=choices)
            raw = _ask(cache, "explainer-answer", backend, p.answer_system, user, ref, settings.answer_max_tokens)
            k = parse_answer(raw, cand_names)
        else:
            answers = [settings.answer_template.format(n) for n in cand_names]
            losses = _losses(cache, backend, p.question, answers, ref)
            k = int(np.nanargmin(np.asarray(losses, dtype=float)))
            raw = f"lowest mean NLL: {cand_names[k]} ({losses[k]:.4f})"
        predicted_name = cand_names[k] if k is not None else None
        user = p.explain_user.format(question=p.question, choices=choices, answer=predicted_name or raw)
        explanation = _ask(cache, "explainer-explain", backend, p.explain_system, user, ref,
                           settings.explain_max_tokens).strip()
        out["sample_id"].append(row["sample_id"])
        out["class_index"].append(int(row["class_index"]))
        out["class_name"].append(names[int(row["class_index"])])
        out["group"].append(row.get("group"))
        out["background"].append(row.get("background"))
        out["candidates"].append(cand_names)
        out["candidate_indices"].append(cand)
        out["answer_raw"].append(raw)
        out["predicted_index"].append(cand[k] if k is not None else None)
        out["predicted_name"].append(predicted_name)
        out["correct"].append(k is not None and cand[k] == int(row["class_index"]))
        out["explanation"].append(explanation)
        out["answer_reason"].append(None if k is not None else "unparsed_answer")
        report(progress, done, len(chosen), "asking the model")
    if not out["sample_id"]:
        raise ValueError(f"{ds.root}: none of the {len(chosen)} chosen samples could be read")
    import pyarrow as pa

    table = pa.table(out, schema=explanations_schema())
    correct = np.array(out["correct"], dtype=bool)
    groups = np.array([g or "" for g in out["group"]], dtype=object)
    by_group = {g: float(correct[groups == g].mean()) for g in ("easy", "hard") if (groups == g).any()}
    seconds = time.perf_counter() - started
    summary = {
        "n": len(out["sample_id"]),
        "accuracy": {"overall": float(correct.mean()), "by_group": by_group,
                     "definition": "fraction of samples whose answer is the true class; an unparsed answer is wrong"},
        "unparsed": sum(r is not None for r in out["answer_reason"]),
        "skipped": {"count": len(skipped), "reasons": dict(Counter(skipped.values())),
                    "samples": [{"sample_id": s, "reason": r} for s, r in sorted(skipped.items())][:200]},
        "cache": cache.stats(),
        "timing": {"seconds": seconds},
    }
    spec_text = identity["name"] if identity["passed"] == "spec" else getattr(getattr(backend, "spec", None), "text",
                                                                              identity["name"])
    record = VlmExplainRun(
        config={"dataset": {"name": ds.config.get("name"), "samples": len(rows)},
                "model": {**identity, "spec": str(spec_text), "backend": type(backend).__name__},
                "label_space": {"name": candidates.name, **candidates.info},
                "prompts": p.to_dict(), "settings": settings.to_dict()},
        summary=summary, table=table)
    label = str(spec_text).split("/")[-1].split("#")[-1]
    run_dir = claim_run_dir(ds.root, run_name, "vlm-explain", label, overwrite=overwrite)
    record.write(run_dir)
    log.info("vlm-explain %s: %d samples, accuracy %.3f -> %s", backend.model_id, summary["n"],
             summary["accuracy"]["overall"], run_dir)
    return record
