"""A scripted judge for the explanation-quality tests: a fixed mapping from prompts to answers.

``ScriptedJudge`` is a ``chat_handler`` for :class:`tests.fake_openai.FakeOpenAI`: it reads the
last user message's text and answers from ``mapping`` (exact text -> reply) when the text is
there, otherwise by deterministic rules keyed on which curate prompt it is:

- question generation (``Explanation:`` in the prompt): ``qgen[explanation]`` when scripted,
  else one question "Is there a <word> in the image?" per distinct word of 4+ letters of the
  explanation (at most 3), numbered; an explanation with none gets a reply with no questions;
- verification (``yes or no``): ``verify[question]`` when scripted, else "yes" when the
  question's sha256 is even, else "no";
- paraphrase (``declarative sentence``): "The main object in the image is a <answer>.";
- the explainer's answer step (``Choices:`` without ``The answer is``): ``answers`` in order
  (cycled) when given, else the first choice; the explanation step: ``explanations`` cycled,
  else "It is a <answer> because of its shape.".

Every call is recorded in ``calls`` as ``(kind, text)``; ``fail_after`` makes the handler raise
after that many calls (the server then answers 400: an interrupted run).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any


def _text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            return " ".join(p.get("text", "") for p in content or [] if p.get("type") == "text")
    return ""


def _field(text: str, name: str) -> str:
    match = re.search(rf"^{name}:\s*(.*)$", text, re.MULTILINE)
    return match.group(1).strip() if match else ""


class ScriptedJudge:
    def __init__(self, mapping: Mapping[str, str] | None = None, *, qgen: Mapping[str, str] | None = None,
                 verify: Mapping[str, str] | None = None, answers: Sequence[str] = (),
                 explanations: Sequence[str] = (), fail_after: int | None = None) -> None:
        self.mapping = dict(mapping or {})
        self.qgen = dict(qgen or {})
        self.verify = dict(verify or {})
        self.answers = list(answers)
        self.explanations = list(explanations)
        self.fail_after = fail_after
        self.calls: list[tuple[str, str]] = []

    def count(self, kind: str) -> int:
        return sum(k == kind for k, _ in self.calls)

    def __call__(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> str:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise RuntimeError("scripted failure (the judge went away)")
        text = _text(messages)
        kind, reply = self._reply(text)
        self.calls.append((kind, text))
        return reply

    def _reply(self, text: str) -> tuple[str, str]:
        if text in self.mapping:
            return "mapped", self.mapping[text]
        if "Explanation:" in text:
            explanation = _field(text, "Explanation")
            if explanation in self.qgen:
                return "qgen", self.qgen[explanation]
            words = list(dict.fromkeys(w.lower() for w in re.findall(r"[A-Za-z]{4,}", explanation)))[:3]
            if not words:
                return "qgen", "The explanation states no visual detail."
            return "qgen", "\n".join(f"{i}. Is there a {w} in the image?" for i, w in enumerate(words, start=1))
        if "yes or no" in text:
            question = text.split("Question:", 1)[-1].split(" Look at the image", 1)[0].strip()
            if question in self.verify:
                return "verify", self.verify[question]
            return "verify", "yes" if int(hashlib.sha256(question.encode()).hexdigest(), 16) % 2 == 0 else "no"
        if "declarative sentence" in text:
            return "paraphrase", f"The main object in the image is a {_field(text, 'Answer')}."
        if "Choices:" in text and "The answer is" not in text:
            if self.answers:
                return "answer", self.answers[self.count("answer") % len(self.answers)]
            choices = text.split("Choices:", 1)[1].strip().rstrip(".")
            return "answer", choices.split(",")[0].strip()
        if "The answer is" in text:
            answer = text.split("The answer is", 1)[1].strip().rstrip(".")
            if self.explanations:
                return "explain", self.explanations[self.count("explain") % len(self.explanations)]
            return "explain", f"It is a {answer} because of its shape."
        return "other", ""
