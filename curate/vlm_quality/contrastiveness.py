"""Contrastiveness of a VLM's explanation (papers/001 §2.2, Alg. 2).

For a question ``Q``, explanation ``E``, answer options ``A`` and the predicted option
``a_0 in A``:

1. ``P = Mask(E, A)``: every mention of every option is replaced by a mask token, so the
   entailment model cannot read the answer off the explanation;
2. a paraphraser turns each ``(Q, a_j)``, for **all** ``a_j in A``, into a declarative
   hypothesis ``h_j``;
3. ``S_Contr(E) = Pr_NLI(P entails h_0) / sum_j Pr_NLI(P entails h_j)``.

Masking is case-insensitive and whole-word (:func:`curate.vlm_quality.text.word_pattern`,
plural ``s`` / ``es`` included), longest option first so "tiger cat" is masked whole before
"tiger"; every masked mention is logged (option, count, spans in ``E``). An explanation that
names no option is scored as it is (its log says 0 mentions and the summary counts it).

Undefined (NaN with a reason): ``empty_explanation``, ``prediction_not_an_option``,
``empty_hypothesis`` (a paraphraser reply that is empty), ``zero_entailment`` (every
probability 0). A probability outside [0, 1], or a count that differs from the hypotheses, is an
error of the entailment model and raises. See ``docs/design.md#explanation-quality``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from curate.metrics.info import MetricInfo
from curate.vlm_quality.text import unique_options, word_pattern

__all__ = ["CONTR_INFO", "CONTR_NAN_REASONS", "MASK_TOKEN", "Contrastiveness", "mask_options", "contrastiveness"]

MASK_TOKEN = "<mask>"
CONTR_NAN_REASONS = ("empty_explanation", "prediction_not_an_option", "empty_hypothesis", "zero_entailment")

CONTR_INFO = MetricInfo(
    name="Contr",
    formula="S_Contr = Pr(P entails h_0) / sum_j Pr(P entails h_j), P = E with every option masked",
    higher_is_better=True,
    paper="papers/001 §2.2 Alg. 2",
    nan_reasons=CONTR_NAN_REASONS,
)

#: ``paraphraser(question, option) -> hypothesis sentence``.
Paraphraser = Callable[[str, str], str]
#: ``nli(premise, hypotheses) -> entailment probability per hypothesis``.
Entailment = Callable[[str, Sequence[str]], Sequence[float]]


def mask_options(explanation: str, options: Sequence[str], mask: str = MASK_TOKEN, *,
                 plurals: bool = True) -> tuple[str, list[dict[str, Any]]]:
    """``(masked explanation, log)``: every whole-word, case-insensitive mention of an option replaced.

    The log has one entry per option with at least one mention: ``{"option", "count", "spans"}``
    (spans index the original explanation). Longer options are matched first, and a span that is
    already masked is not matched again.
    """
    text = explanation or ""
    taken: list[tuple[int, int]] = []
    log: list[dict[str, Any]] = []
    for option in sorted(unique_options(options), key=lambda o: (-len(o), o)):
        spans = [s for s in (m.span() for m in word_pattern(option, plurals).finditer(text))
                 if not any(s[0] < t[1] and t[0] < s[1] for t in taken)]
        if spans:
            taken.extend(spans)
            log.append({"option": option, "count": len(spans), "spans": [list(s) for s in spans]})
    out, last = [], 0
    for start, end in sorted(taken):
        out.append(text[last:start])
        out.append(mask)
        last = end
    out.append(text[last:])
    return "".join(out), log


@dataclass
class Contrastiveness:
    """One explanation's Contrastiveness with everything that produced it."""

    score: float
    masked_explanation: str = ""
    mask_log: list[dict[str, Any]] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    hypotheses: list[str] = field(default_factory=list)
    entailment: list[float] = field(default_factory=list)
    predicted_index: int | None = None
    nan_reason: str | None = None

    @property
    def n_masked(self) -> int:
        """Mentions of any option masked out of the explanation."""
        return sum(int(e["count"]) for e in self.mask_log)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "n_masked": self.n_masked}


def _index_of(options: Sequence[str], predicted: str) -> int | None:
    key = " ".join(str(predicted).split()).casefold()
    for i, option in enumerate(options):
        if " ".join(option.split()).casefold() == key:
            return i
    return None


def contrastiveness(explanation: str, question: str, options: Sequence[str], predicted: str, *,
                    paraphraser: Paraphraser, nli: Entailment, mask: str = MASK_TOKEN,
                    plurals: bool = True) -> Contrastiveness:
    """Score ``explanation`` with papers/001 Alg. 2 over **all** ``options`` (see the module docstring).

    Args:
        explanation: the VLM's explanation ``E``.
        question: the question ``Q``.
        options: the closed answer set ``A`` (repeats, case-insensitive, are kept once).
        predicted: the VLM's answer ``a_0``; must be one of ``options``.
        paraphraser: ``paraphraser(question, option) -> hypothesis``.
        nli: ``nli(premise, hypotheses) -> probabilities`` that the premise entails each hypothesis.
        mask: the token that replaces option mentions.
    """
    opts = unique_options(options)
    if not opts:
        raise ValueError("contrastiveness needs at least one answer option")
    masked, log = mask_options(explanation, opts, mask, plurals=plurals)
    base = Contrastiveness(float("nan"), masked, log, opts)
    if not (explanation or "").strip():
        base.nan_reason = "empty_explanation"
        return base
    index = _index_of(opts, predicted)
    base.predicted_index = index
    if index is None:
        base.nan_reason = "prediction_not_an_option"
        return base
    hypotheses = [str(paraphraser(question, o) or "").strip() for o in opts]
    base.hypotheses = hypotheses
    if any(not h for h in hypotheses):
        base.nan_reason = "empty_hypothesis"
        return base
    probs = [float(p) for p in nli(masked, hypotheses)]
    if len(probs) != len(hypotheses):
        raise ValueError(f"the entailment model returned {len(probs)} probabilities for {len(hypotheses)} hypotheses")
    bad = [p for p in probs if not (0.0 <= p <= 1.0) or math.isnan(p)]
    if bad:
        raise ValueError(f"the entailment model returned probabilities outside [0, 1]: {bad[:3]}")
    base.entailment = probs
    total = math.fsum(probs)
    if total <= 0.0:
        base.nan_reason = "zero_entailment"
        return base
    base.score = probs[index] / total
    return base
