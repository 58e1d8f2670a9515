"""The vlm-quality stage: Visual Fidelity and Contrastiveness of a vlm-explain run (papers/001 §2-3).

For each sample of the vlm-explain run ``settings.run``:

- Visual Fidelity (:func:`curate.vlm_quality.visual_fidelity`, Alg. 1) with the question
  generator and the verifier, the verifier seeing the sample's image;
- Contrastiveness (:func:`curate.vlm_quality.contrastiveness`, Alg. 2) over **all** the sample's
  candidates (the run's label space), with the paraphraser and the entailment model;
- their average, product and minimum (§2.3);
- whether the explanation names the sample's background, its class's hard background, or any
  background of the vocabulary (:mod:`curate.vlm_quality.background`).

The summary (§3): every score by easy / hard group and by correct / wrong answer;
Discriminability with an unpaired t-test; ECE with ``bins`` equal-width bins and the reliability
diagram; the background mentions by group and correctness. Every judge call is cached on disk
(:class:`curate.vlm_quality.cache.RoleCache`). Writes a :class:`curate.runs.VlmQualityRun`.
"""
from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from curate.progress import Progress, report
from curate.runs.base import RUNS_DIR
from curate.runs.vlm_explain import VlmExplainRun
from curate.runs.vlm_quality import SCORE_LABELS, SCORES, VlmQualityRun, scores_schema
from curate.stages.common import claim_run_dir, model_identity, open_dataset, run_stage, spec_of
from curate.stages.vlm_explain import as_text_backend
from curate.vlm_quality.background import background_terms, hard_backgrounds, mentioned_backgrounds, mentions
from curate.vlm_quality.cache import CACHE_DIR, RoleCache
from curate.vlm_quality.calibration import (
    DEFAULT_BINS,
    combine,
    discriminability,
    expected_calibration_error,
    reliability_png,
)
from curate.vlm_quality.contrastiveness import MASK_TOKEN, contrastiveness
from curate.vlm_quality.prompts import JudgePrompts
from curate.vlm_quality.roles import (
    VERIFIER_MODES,
    BackendPool,
    ImageRef,
    NliRole,
    ParaphraserRole,
    QuestionGeneratorRole,
    RoleSpec,
    VerifierRole,
    parse_role_spec,
)
from curate.vlm_quality.visual_fidelity import visual_fidelity

log = logging.getLogger(__name__)

__all__ = ["Judges", "VlmQualitySettings", "vlm_quality", "summarise"]


@dataclass(frozen=True)
class Judges:
    """Which model plays each role: a role spec (:func:`curate.vlm_quality.roles.parse_role_spec`,
    a string or a :class:`curate.models.ModelSpec`) or an already loaded model: for the three
    generating roles a :class:`curate.lvlm.hf.HFLvlm` or a backend with ``complete``, for ``nli``
    an entailment model with ``entailment`` (:func:`curate.vlm_quality.nli.load_nli`)."""

    qgen: Any
    verifier: Any
    paraphraser: Any
    nli: Any
    verifier_mode: str = "text"  # text | likelihood (P(yes) vs P(no); lvlm: or an endpoint with prompt logprobs)


@dataclass
class VlmQualitySettings:
    """How to score (the CLI's options map one to one); ``run`` is the vlm-explain run to score."""

    run: str = ""
    prompts: JudgePrompts = field(default_factory=JudgePrompts)
    bins: int = DEFAULT_BINS
    equal_var: bool = True
    mask_token: str = MASK_TOKEN
    limit: int | None = None
    device: str = "cpu"
    precision: str = "fp32"
    token_env: str | None = None
    timeout: float | None = None
    retries: int | None = None
    backoff_base: float | None = None  # endpoints: first retry wait in seconds (doubles per retry)
    use_cache: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean_part(values: np.ndarray, sel: np.ndarray) -> dict[str, Any]:
    v = values[sel]
    finite = v[np.isfinite(v)]
    return {"mean": float(finite.mean()) if len(finite) else None, "n": int(len(finite)),
            "n_nan": int(len(v) - len(finite))}


def summarise(table: dict[str, list[Any]], *, bins: int = DEFAULT_BINS, equal_var: bool = True) -> dict[str, Any]:
    """The run's summary from its per-sample columns (see :mod:`curate.runs.vlm_quality`)."""
    correct = np.array(table["correct"], dtype=bool)
    groups = np.array([g or "" for g in table["group"]], dtype=object)
    parts = {"easy": groups == "easy", "hard": groups == "hard", "all": np.ones(len(correct), bool)}
    scores, discs, eces = {}, {}, {}
    for s in SCORES:
        values = np.array([np.nan if x is None else x for x in table[s]], dtype=float)
        reasons: Counter = Counter()
        if s in ("vf", "contr"):
            reasons.update(r for r in table[f"{s}_reason"] if r)
        else:
            for vr, cr in zip(table["vf_reason"], table["contr_reason"]):
                if vr or cr:
                    reasons[f"vf:{vr}" if vr else f"contr:{cr}"] += 1
        scores[s] = {"label": SCORE_LABELS[s],
                     "by_group": {p: _mean_part(values, sel) for p, sel in parts.items() if sel.any()},
                     "by_correct": {"correct": _mean_part(values, correct), "wrong": _mean_part(values, ~correct)},
                     "nan_reasons": dict(reasons)}
        discs[s] = discriminability(values, correct, equal_var=equal_var).to_dict()
        eces[s] = expected_calibration_error(values, correct, bins=bins).to_dict()
    own = np.array(table["mentions_own_background"], dtype=bool)
    hard = np.array([x if x is not None else False for x in table["mentions_hard_background"]], dtype=bool)
    has_hard = np.array([h is not None for h in table["hard_background"]], dtype=bool)
    anyb = np.array([bool(x) for x in table["mentioned_backgrounds"]], dtype=bool)
    rows = []
    cuts = [("easy", parts["easy"]), ("hard", parts["hard"]), ("correct", correct), ("wrong", ~correct)]
    cuts += [(f"{g} / {c}", parts[g] & (correct if c == "correct" else ~correct)) for g in ("easy", "hard")
             for c in ("correct", "wrong")]
    cuts.append(("all", parts["all"]))
    for name, sel in cuts:
        n = int(sel.sum())
        if not n:
            continue
        nh = int((sel & has_hard).sum())
        rows.append({"part": name, "n": n, "own": float(own[sel].mean()),
                     "hard": float(hard[sel & has_hard].mean()) if nh else None, "n_with_hard": nh,
                     "any": float(anyb[sel].mean())})
    n_q = sum(int(x) for x in table["n_questions"])
    with_text = [m for m, e in zip(table["n_masked"], table["explanation"]) if (e or "").strip()]
    return {
        "n": len(correct), "accuracy": float(correct.mean()) if len(correct) else None,
        "n_correct": int(correct.sum()), "n_wrong": int((~correct).sum()),
        "scores": scores, "discriminability": discs, "ece": eces, "bins": bins,
        "background": {"rows": rows, "definition": "share of explanations that name the sample's own background "
                       "(own), its class's hard background (hard, over samples whose class has one) or any background "
                       "of the vocabulary (any); whole-word, case-insensitive, with the phrases of backgrounds.yaml"},
        "masking": {"explanations": len(with_text), "no_option_mentioned": sum(int(m) == 0 for m in with_text),
                    "masked_mentions": sum(int(m) for m in with_text)},
        "verifier": {"questions": n_q, "yes": sum(int(x) for x in table["n_yes"]),
                     "no": sum(int(x) for x in table["n_no"]), "unparsed": sum(int(x) for x in table["n_unparsed"])},
    }


def _load_source(ds: Any, run: str) -> VlmExplainRun:
    if not run:
        raise ValueError("vlm-quality needs the vlm-explain run to score (--run NAME)")
    path = ds.root / RUNS_DIR / run
    if not path.is_dir():
        raise FileNotFoundError(f"no run {run!r} in {ds.root / RUNS_DIR} (make one with curate vlm-explain)")
    return VlmExplainRun.load(path)


def _role_spec(value: Any, role: str) -> RoleSpec | None:
    """The parsed role spec of a judge named by a spec (a string or a :class:`ModelSpec`); None for a
    loaded one."""
    if spec_of(value) is None:
        return None
    allowed = ("hf",) if role == "nli" else ("endpoint", "lvlm")
    return parse_role_spec(value if isinstance(value, str) else value.name, allowed=allowed, role=f"--{role}")


def _role_backend(value: Any, spec: RoleSpec | None, role: str, pool: BackendPool) -> Any:
    """The backend that plays ``role``: loaded from its spec (once per spec, :class:`BackendPool`), or
    the loaded model passed (an HFLvlm is wrapped in a generating backend)."""
    if role == "nli":
        if spec is not None:
            return pool.nli(spec)
        if not (callable(getattr(value, "entailment", None)) and getattr(value, "model_id", None)):
            raise TypeError(f"--nli: a {type(value).__name__} is not an entailment model; pass hf:PATH_OR_REPO or a "
                            "model from curate.vlm_quality.nli.load_nli")
        return value
    return as_text_backend(value, pool, role=f"--{role}")


@run_stage("vlm-quality")
def vlm_quality(dataset: Any, judges: Judges, settings: VlmQualitySettings, *, run_name: str | None = None,
                overwrite: bool = False, progress: Progress | None = None) -> VlmQualityRun:
    """Score the explanations of the vlm-explain run ``settings.run``; write a :class:`VlmQualityRun`.

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        judges: the role specs or loaded models (:class:`Judges`); the config's ``judges`` record,
            per role, what was passed (:func:`curate.stages.common.model_identity`) and its ``spec``.
        settings: :class:`VlmQualitySettings` (``run`` is required).
        run_name: the run folder (default ``vlm-quality-<source run>-<UTC time>``); a finished one is
            refused before any model is called unless ``overwrite``, an unfinished one (killed)
            replaced (:func:`curate.stages.common.run_stage`).
        progress: phase "scoring explanations".
    """
    if judges.verifier_mode not in VERIFIER_MODES:
        raise ValueError(f"verifier mode must be one of {VERIFIER_MODES}, got {judges.verifier_mode!r}")
    if settings.limit is not None and settings.limit < 1:
        raise ValueError("--limit must be at least 1")
    given = {"qgen": judges.qgen, "verifier": judges.verifier, "paraphraser": judges.paraphraser, "nli": judges.nli}
    specs = {role: _role_spec(value, role) for role, value in given.items()}  # bad specs fail before any work
    ds = open_dataset(dataset)
    source = _load_source(ds, settings.run)
    pool = BackendPool(device=settings.device, precision=settings.precision, token_env=settings.token_env,
                       timeout=settings.timeout, retries=settings.retries,
                       backoff_base=settings.backoff_base)
    backends = {role: _role_backend(given[role], specs[role], role, pool) for role in given}
    identities = {role: model_identity(given[role], backends[role]) for role in given}
    cache = RoleCache(ds.root / "features" / CACHE_DIR if settings.use_cache else None)
    p = settings.prompts
    qgen = QuestionGeneratorRole(backends["qgen"], cache, p.qgen)
    verifier = VerifierRole(backends["verifier"], cache, p.verify, mode=judges.verifier_mode)
    paraphraser = ParaphraserRole(backends["paraphraser"], cache, p.paraphrase)
    nli = NliRole(backends["nli"], cache)
    question = source.question
    samples = {r["sample_id"]: r for r in ds.rows()}
    terms = background_terms(ds.backgrounds)
    hard_of = hard_backgrounds(samples.values())
    rows = source.rows()[: settings.limit] if settings.limit else source.rows()
    columns: dict[str, list[Any]] = {f.name: [] for f in scores_schema()}
    skipped: dict[str, str] = {}
    started = time.perf_counter()
    for done, r in enumerate(rows, start=1):
        sample = samples.get(r.sample_id)
        path = ds.image_path(sample) if sample is not None else None
        if sample is None or path is None or not path.is_file():
            skipped[r.sample_id] = "missing_sample" if sample is None else "missing_image"
            continue
        ref = ImageRef(str(sample["sha256"]), path)
        answer = r.predicted_name or r.answer_raw
        vf = visual_fidelity(r.explanation, ref, question, answer, qgen=qgen, verifier=verifier)
        contr = contrastiveness(r.explanation, question, r.candidates, answer, paraphraser=paraphraser, nli=nli,
                                mask=settings.mask_token)
        hard_bg = hard_of.get(int(r.class_index))
        col = columns
        col["sample_id"].append(r.sample_id)
        col["class_index"].append(r.class_index)
        col["group"].append(r.group)
        col["background"].append(r.background)
        col["predicted_name"].append(r.predicted_name)
        col["correct"].append(bool(r.correct))
        col["explanation"].append(r.explanation)
        col["vf"].append(vf.score)
        col["vf_reason"].append(vf.nan_reason)
        col["questions"].append(vf.questions)
        col["replies"].append(vf.replies)
        col["verdicts"].append(vf.verdicts)
        col["p_yes"].append(vf.p_yes)
        col["qgen_output"].append(vf.generator_output)
        col["n_questions"].append(vf.n_questions)
        col["n_yes"].append(vf.n_yes)
        col["n_no"].append(vf.n_no)
        col["n_unparsed"].append(vf.n_unparsed)
        col["contr"].append(contr.score)
        col["contr_reason"].append(contr.nan_reason)
        col["masked_explanation"].append(contr.masked_explanation)
        col["mask_log"].append(json.dumps(contr.mask_log))
        col["n_masked"].append(contr.n_masked)
        col["options"].append(contr.options)
        col["hypotheses"].append(contr.hypotheses)
        col["entailment"].append(contr.entailment)
        for how in ("avg", "prod", "min"):
            col[how].append(combine(vf.score, contr.score, how))
        col["hard_background"].append(hard_bg)
        col["mentions_own_background"].append(bool(r.background) and mentions(r.explanation,
                                                                                 terms.get(r.background, [r.background])))
        col["mentions_hard_background"].append(
            None if hard_bg is None else mentions(r.explanation, terms.get(hard_bg, [hard_bg])))
        col["mentioned_backgrounds"].append(mentioned_backgrounds(r.explanation, terms))
        report(progress, done, len(rows), "scoring explanations")
    if not columns["sample_id"]:
        raise ValueError(f"none of the {len(rows)} samples of run {source.name} could be scored "
                         f"({dict(Counter(skipped.values()))})")
    import pyarrow as pa

    clean = {k: [None if isinstance(x, float) and math.isnan(x) else x for x in v] if k in (*SCORES,) else v
             for k, v in columns.items()}
    table = pa.table(clean, schema=scores_schema())
    summary = summarise(columns, bins=settings.bins, equal_var=settings.equal_var)
    summary["skipped"] = {"count": len(skipped), "reasons": dict(Counter(skipped.values()))}
    summary["cache"] = cache.stats()
    summary["timing"] = {"seconds": time.perf_counter() - started}
    from curate.vlm_quality.calibration import CalibrationBins

    curves = {SCORE_LABELS[s]: CalibrationBins(**summary["ece"][s]) for s in SCORES if summary["ece"][s]["n"]}
    plot = reliability_png(curves, f"Reliability of explanation-quality scores ({source.model_id}, "
                                   f"{summary['n']} samples, {settings.bins} bins)") if curves else None
    judges_cfg = {role: {**identity, "spec": specs[role].text if specs[role] is not None else identity["name"]}
                  for role, identity in identities.items()}
    judges_cfg["verifier"]["mode"] = judges.verifier_mode
    record = VlmQualityRun(
        config={"dataset": {"name": ds.config.get("name")}, "source_run": source.name, "explainer": source.model_id,
                "question": question, "label_space": source.label_space, "judges": judges_cfg,
                "prompts": p.to_dict(), "settings": settings.to_dict()},
        summary=summary, table=table, plot=plot)
    run_dir = claim_run_dir(ds.root, run_name, "vlm-quality", source.name, overwrite=overwrite)
    record.write(run_dir)
    log.info("vlm-quality of %s: %d samples -> %s", source.name, summary["n"], run_dir)
    return record


