"""Does an explanation name the background? (curate's question on CounterAnimal, issue 16)

For each background ``b`` of the dataset's vocabulary the *terms* are ``b`` itself and its
phrase from ``datasets/backgrounds.yaml`` (:func:`curate.split.backgrounds.load_background_prompts`)
without a leading article ("the sky" -> "sky", "a human hand" -> "human hand"). An explanation
*mentions* ``b`` when any term occurs in it as a whole word, case-insensitively, plural allowed
(:func:`curate.vlm_quality.text.word_pattern`). Per sample curate records whether the explanation
mentions the sample's own background, the class's hard background (the background of the class's
``hard`` samples, from the folder's ``group`` column) and any background of the vocabulary.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from curate.vlm_quality.text import word_pattern

__all__ = ["background_terms", "mentions", "mentioned_backgrounds", "hard_backgrounds"]

_ARTICLES = ("the ", "a ", "an ")


def background_terms(vocabulary: Sequence[str], prompts_file: Path | None = None) -> dict[str, list[str]]:
    """``{background: [terms]}`` for every background of ``vocabulary`` (see the module docstring)."""
    from curate.split.backgrounds import load_background_prompts

    prompts = load_background_prompts(prompts_file)
    out: dict[str, list[str]] = {}
    for b in vocabulary:
        terms = [str(b)]
        phrase = prompts.phrase(str(b)).strip()
        low = phrase.casefold()
        for article in _ARTICLES:
            if low.startswith(article):
                phrase = phrase[len(article):]
                break
        if phrase and phrase.casefold() != str(b).casefold():
            terms.append(phrase)
        out[str(b)] = terms
    return out


def mentions(text: str, terms: Iterable[str]) -> bool:
    """True when ``text`` names any of ``terms`` (whole word, case-insensitive, plural allowed)."""
    return any(word_pattern(t).search(text or "") for t in terms if t.strip())


def mentioned_backgrounds(text: str, terms: Mapping[str, Sequence[str]]) -> list[str]:
    """The backgrounds whose terms ``text`` names, in vocabulary order."""
    return [b for b, ts in terms.items() if mentions(text, ts)]


def hard_backgrounds(rows: Iterable[Mapping]) -> dict[int, str]:
    """``{class_index: background}`` of each class's ``hard`` samples (the most common one when
    they differ; ties broken by name)."""
    counts: dict[int, Counter] = {}
    for r in rows:
        if r.get("group") == "hard" and r.get("background") and r.get("class_index") is not None:
            counts.setdefault(int(r["class_index"]), Counter())[str(r["background"])] += 1
    return {c: sorted(cnt.items(), key=lambda kv: (-kv[1], kv[0]))[0][0] for c, cnt in counts.items()}
