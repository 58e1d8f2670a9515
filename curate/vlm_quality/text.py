"""Text helpers shared by the explanation-quality scores: whole-word matching and reply parsing.

- :func:`word_pattern`: a case-insensitive, whole-word regular expression for a phrase (words
  joined by any whitespace; optionally the phrase's plural, ``s`` / ``es``, so "tigers" is a
  mention of "tiger" but "catalog" is not one of "cat"). Used to mask answer options
  (papers/001 Alg. 2 line 1) and to find background mentions.
- :func:`parse_questions`: the numbered (or bulleted) list a question generator returns
  (papers/001 Alg. 1 line 1).
- :func:`parse_yes_no`: a verifier's one-word reply (Alg. 1 line 3); anything that is not
  clearly yes or no is ``None`` (counted by the caller, never guessed).

See ``docs/design.md#explanation-quality``.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

__all__ = ["word_pattern", "find_mentions", "parse_questions", "parse_yes_no", "QUESTION_REASONS"]

#: Why a question generator's output gave no questions.
QUESTION_REASONS = ("empty_output", "no_questions_parsed")

_LIST_ITEM = re.compile(r"^\s*(?:\(?\d{1,3}[.):]|[-*\u2022])\s*(.+?)\s*$")
_WORD = re.compile(r"[a-z]+")


@lru_cache(maxsize=4096)
def word_pattern(phrase: str, plurals: bool = True) -> re.Pattern[str]:
    """Case-insensitive whole-word pattern for ``phrase`` (its words separated by any whitespace).

    With ``plurals`` the last word may carry ``s`` or ``es``. Whole word: no letter, digit or
    underscore directly before or after the match.
    """
    words = phrase.split()
    if not words:
        raise ValueError("cannot match an empty phrase")
    body = r"\s+".join(re.escape(w) for w in words)
    suffix = r"(?:e?s)?" if plurals else ""
    return re.compile(rf"(?<!\w){body}{suffix}(?!\w)", re.IGNORECASE)


def find_mentions(text: str, phrase: str, *, plurals: bool = True) -> list[tuple[int, int]]:
    """``(start, end)`` of every whole-word, case-insensitive mention of ``phrase`` in ``text``."""
    return [m.span() for m in word_pattern(phrase, plurals).finditer(text or "")]


def parse_questions(text: str | None) -> tuple[list[str], str | None]:
    """Verification questions from a question generator's reply, and why there are none.

    Rule: the items of a numbered (``1.``, ``1)``, ``(1)``) or bulleted (``-``, ``*``) list; when
    the reply has no list, every line that ends with ``?``. Items are stripped; exact repeats
    (case-insensitive) are kept once. Returns ``(questions, None)`` or ``([], reason)`` with
    reason ``empty_output`` (nothing but whitespace) or ``no_questions_parsed``.
    """
    if text is None or not str(text).strip():
        return [], "empty_output"
    lines = str(text).splitlines()
    items = [m.group(1) for m in (_LIST_ITEM.match(line) for line in lines) if m]
    if not items:
        items = [line.strip() for line in lines if line.strip().endswith("?")]
    seen: set[str] = set()
    questions = []
    for item in items:
        item = item.strip().strip('"').strip()
        key = item.casefold()
        if item and key not in seen:
            seen.add(key)
            questions.append(item)
    return (questions, None) if questions else ([], "no_questions_parsed")


def parse_yes_no(text: str | None) -> str | None:
    """``"yes"``, ``"no"`` or ``None`` for a verifier's reply.

    Rule: the first word (letters only, case-insensitive) when it is yes or no; otherwise the one
    of yes / no that occurs as a whole word when exactly one of them does; otherwise ``None``
    (empty, both, or neither: the caller counts it, it is never guessed).
    """
    words = _WORD.findall(str(text or "").casefold())
    if not words:
        return None
    if words[0] in ("yes", "no"):
        return words[0]
    present = {w for w in words if w in ("yes", "no")}
    return present.pop() if len(present) == 1 else None


def unique_options(options: Sequence[str]) -> list[str]:
    """``options`` without repeats (case-insensitive), order kept."""
    seen: set[str] = set()
    out = []
    for option in options:
        key = " ".join(str(option).split()).casefold()
        if key and key not in seen:
            seen.add(key)
            out.append(str(option))
    return out
