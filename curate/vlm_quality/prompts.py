"""The prompts of the explanation-quality pipeline, each a ``str.format`` template (papers/001 App. C, D).

The roles and steps follow papers/001 (two-step answer then explanation, App. C; question
generation, verification and paraphrasing, App. D / K); the wording is curate's. Every prompt is
a setting of its stage and is recorded in the run's ``config.json``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["ExplainPrompts", "JudgePrompts", "DEFAULT_QUESTION", "EXPLAIN_SYSTEM"]

DEFAULT_QUESTION = "What is the main object in the image?"
#: papers/001 App. C, step 2 (the issue's wording).
EXPLAIN_SYSTEM = "Please explain the reasoning behind your answer."


@dataclass(frozen=True)
class ExplainPrompts:
    """Step 1 asks for the answer among the choices, step 2 for the reasoning behind it (papers/001 App. C).

    Placeholders: ``{question}``, ``{choices}`` (the candidates joined by ", "), ``{answer}`` (step 2).
    """

    question: str = DEFAULT_QUESTION
    answer_system: str = "Answer the question with one of the listed choices, as a single word or phrase."
    answer_user: str = "Question: {question} Choices: {choices}."
    explain_system: str = EXPLAIN_SYSTEM
    explain_user: str = "Question: {question} Choices: {choices}. The answer is {answer}."

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class JudgePrompts:
    """Prompts of the judges. Placeholders: ``{question}``, ``{answer}``, ``{explanation}`` (qgen);
    ``{question}`` (verify: the verification question); ``{question}``, ``{answer}`` (paraphrase)."""

    qgen: str = (
        "You see a question about an image, the answer a model gave, and the model's explanation of that "
        "answer. Write yes/no questions that check the visual details the explanation states explicitly, each "
        "phrased so that the answer 'yes' means the detail is true of the image. Ask only about things that can "
        "be seen; one question per detail; nothing the explanation does not state or says is absent; nothing "
        "about intentions or outside knowledge; no question that only checks the answer itself.\n\n"
        "Question: {question}\nAnswer: {answer}\nExplanation: {explanation}\n\n"
        "Reply with the questions only, as a numbered list starting at '1.'."
    )
    verify: str = "Question: {question} Look at the image and reply with one word: yes or no."
    paraphrase: str = (
        "Turn the question and its answer into one declarative sentence. For example, the question "
        "\"What is the man holding?\" with the answer \"umbrella\" becomes \"The man is holding an umbrella.\" "
        "Reply with the sentence only.\nQuestion: {question}\nAnswer: {answer}"
    )

    def to_dict(self) -> dict[str, str]:
        return asdict(self)
