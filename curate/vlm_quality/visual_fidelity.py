"""Visual Fidelity of a VLM's explanation (papers/001 §2.1, Alg. 1).

For an image ``I``, question ``Q``, predicted answer ``a`` and explanation ``E``:

1. a question generator turns ``(E, Q, a)`` into verification questions ``q_1 .. q_K``, each
   phrased so that "yes" confirms a visual detail ``E`` claims;
2. a verifier that sees ``I`` answers each ``q_j``;
3. ``S_VF(E) = #{j : answer_j = yes} / K``.

curate's reading of the undefined and malformed cases (``docs/design.md#explanation-quality``):

- no questions (empty or unparseable generator output) -> NaN with reason ``empty_output`` /
  ``no_questions_parsed``, never 0;
- a verifier answer that is neither yes nor no is *unparsed*: counted, and left out of both the
  numerator and ``K`` (it is not read as "no"); every answer unparsed -> NaN with reason
  ``no_parsed_answers``;
- a verifier that returns probabilities (:class:`VerifierReply` with ``p_yes``) answers yes when
  ``p_yes > 0.5``, no when ``p_yes < 0.5``, unparsed at exactly 0.5 or NaN.

The roles are plain callables, so the function needs no dataset folder, model or server.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from curate.metrics.info import MetricInfo
from curate.vlm_quality.text import parse_questions, parse_yes_no

__all__ = ["VF_INFO", "VF_NAN_REASONS", "VerifierReply", "VisualFidelity", "visual_fidelity", "verdict_of"]

VF_NAN_REASONS = ("empty_output", "no_questions_parsed", "no_parsed_answers")

VF_INFO = MetricInfo(
    name="VF",
    formula="S_VF = #{verifier answers yes} / #{verification questions answered yes or no}",
    higher_is_better=True,
    paper="papers/001 §2.1 Alg. 1",
    nan_reasons=VF_NAN_REASONS,
)

#: ``qgen(question, answer, explanation) -> reply text`` (a numbered list of yes/no questions).
QuestionGenerator = Callable[[str, str, str], str]


@dataclass(frozen=True)
class VerifierReply:
    """What a verifier said: its text and, for a likelihood verifier, ``P(yes)`` against ``P(no)``."""

    text: str
    p_yes: float | None = None


#: ``verifier(image, verification_question) -> reply`` (text, or a :class:`VerifierReply`).
Verifier = Callable[[Any, str], "str | VerifierReply"]


def verdict_of(reply: str | VerifierReply) -> tuple[str | None, str, float | None]:
    """``(verdict, text, p_yes)``: verdict ``yes`` / ``no`` / ``None`` (unparsed) for one reply."""
    if isinstance(reply, VerifierReply):
        p = reply.p_yes
        if p is not None:
            p = float(p)
            if math.isnan(p) or p == 0.5:
                return None, reply.text, p
            return ("yes" if p > 0.5 else "no"), reply.text, p
        return parse_yes_no(reply.text), reply.text, None
    return parse_yes_no(str(reply)), str(reply), None


@dataclass
class VisualFidelity:
    """One explanation's Visual Fidelity with everything that produced it."""

    score: float
    questions: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    verdicts: list[str | None] = field(default_factory=list)
    p_yes: list[float | None] = field(default_factory=list)
    generator_output: str = ""
    nan_reason: str | None = None

    @property
    def n_questions(self) -> int:
        return len(self.questions)

    @property
    def n_yes(self) -> int:
        return sum(v == "yes" for v in self.verdicts)

    @property
    def n_no(self) -> int:
        return sum(v == "no" for v in self.verdicts)

    @property
    def n_unparsed(self) -> int:
        return sum(v is None for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "n_questions": self.n_questions, "n_yes": self.n_yes, "n_no": self.n_no,
                "n_unparsed": self.n_unparsed}


def visual_fidelity(explanation: str, image: Any, question: str, answer: str, *, qgen: QuestionGenerator,
                    verifier: Verifier) -> VisualFidelity:
    """Score ``explanation`` with papers/001 Alg. 1 (see the module docstring for the rules).

    Args:
        explanation: the VLM's explanation ``E`` of its answer.
        image: whatever ``verifier`` accepts (a PIL image, a path, bytes).
        question: the question ``Q`` the VLM answered.
        answer: the VLM's predicted answer ``a``.
        qgen: question generator, ``qgen(question, answer, explanation) -> text``.
        verifier: ``verifier(image, verification_question) -> text | VerifierReply``.
    """
    raw = qgen(question, answer, explanation)
    raw = "" if raw is None else str(raw)
    questions, reason = parse_questions(raw)
    if reason is not None:
        return VisualFidelity(float("nan"), generator_output=raw, nan_reason=reason)
    replies, verdicts, p_yes = [], [], []
    for q in questions:
        verdict, text, p = verdict_of(verifier(image, q))
        replies.append(text)
        verdicts.append(verdict)
        p_yes.append(p)
    answered = sum(v is not None for v in verdicts)
    if answered == 0:
        return VisualFidelity(float("nan"), questions, replies, verdicts, p_yes, raw, "no_parsed_answers")
    score = sum(v == "yes" for v in verdicts) / answered
    return VisualFidelity(score, questions, replies, verdicts, p_yes, raw, None)
