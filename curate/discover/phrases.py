"""The phrase bank that names discovered groups, and the naming itself (docs/design.md#discover).

A group that ``curate discover`` finds within a class is a set of photos whose backgrounds look
alike; nobody listed that background, so the group gets a name from a bank of short phrases
("a bird feeder", "a zoo enclosure", "a camera flash at night"). Each phrase is filled into
:data:`TEMPLATE` and embedded by the CLIP text tower; :func:`name_groups` ranks the phrases by
how well they point from the class's mean background towards the group's. :func:`group_name`
says whether the top phrase names the group (its score reaches :data:`MIN_NAME_SCORE`) or is only
the closest phrase of the bank (the group is *unnamed*), with its margin over the next phrase.

The bank ships as ``datasets/phrases.txt`` (:data:`DEFAULT_PHRASES`; its header states its
sources and licence); a user passes their own with ``--phrases FILE``. Format: UTF-8 text, one
phrase per line, ``#`` starts a comment line, blank lines are ignored, spaces are collapsed.
:meth:`PhraseBank.load` refuses, naming the file (and the line where one applies): a missing
file, a file over :data:`MAX_FILE_BYTES`, a file that is not UTF-8, a bank with fewer than
:data:`MIN_PHRASES` phrases, a duplicate (ignoring case and spacing; both lines named), a phrase
longer than :data:`MAX_PHRASE_CHARS` characters or holding ``{``/``}`` (it would break the
template) or a control character. ``sha256`` fingerprints the normalised phrase list, so a run
records which bank named its groups.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from curate.paths import data_dir, data_file

__all__ = ["PHRASES_FILE", "DEFAULT_PHRASES", "TEMPLATE", "MAX_FILE_BYTES", "MAX_PHRASE_CHARS", "MIN_PHRASES",
           "PhraseBankError", "PhraseBank", "normalise_phrase", "default_phrases_path", "name_groups",
           "MIN_NAME_SCORE", "GroupName", "group_name"]

PHRASES_FILE = "phrases.txt"
"""The shipped bank's name in curate's ``datasets/`` folder (:func:`curate.paths.data_dir`)."""
TEMPLATE = "a photo of {}."
"""The prompt a phrase is embedded in (CLIP text tower)."""
MAX_FILE_BYTES = 10 * 1024 * 1024
"""A bank file larger than this (10 MB) is refused before it is read."""
MAX_PHRASE_CHARS = 60
"""The longest phrase accepted, in characters after spaces are collapsed."""
MIN_PHRASES = 2
"""Fewer phrases than this cannot rank anything."""
BUILT_IN = "built-in"
"""``PhraseBank.source`` of the shipped bank."""
MIN_NAME_SCORE = 0.03
"""The lowest score (:func:`name_groups`) at which a group's top phrase names it (docs/design.md#discover).

The score is a difference of two cosines: how much closer the phrase's text embedding lies to the
group's mean background than to the class's. A CLIP scores a text against an image by 100 x their
cosine (its logit scale), so a score of 0.03 raises the phrase's zero-shot logit by 3 from the
class's typical background to the group's: e^3, about 20 times the odds against a phrase the
group does not move. Below it (0.012 is 1.2 logits, 3.3 times) the phrase is only the closest of
the bank, not a description: the group is *unnamed* and a person must name it. A setting
(``DiscoverSettings.min_name_score``, recorded with the run)."""

DEFAULT_PHRASES: Path
"""The shipped bank, ``datasets/phrases.txt`` (resolved on access, like :func:`curate.paths.data_file`,
so ``CURATE_DATA_DIR`` and the installed package data apply; see :func:`default_phrases_path`)."""


def default_phrases_path() -> Path:
    """The shipped bank's path: ``<curate's datasets folder>/phrases.txt`` (it may be missing)."""
    return data_dir() / PHRASES_FILE


def __getattr__(name: str) -> Path:
    """Module attribute :data:`DEFAULT_PHRASES`, resolved when read (PEP 562)."""
    if name == "DEFAULT_PHRASES":
        return default_phrases_path()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class PhraseBankError(ValueError):
    """A phrase bank file that cannot be used; the message names the file and the problem."""


def normalise_phrase(text: str) -> str:
    """``text`` with surrounding spaces stripped and inner runs of whitespace collapsed to one space."""
    return " ".join(text.split())


def _fingerprint(phrases: Sequence[str]) -> str:
    """SHA-256 (hex) of the phrases, one per line, UTF-8, each line ending in a newline."""
    return hashlib.sha256("".join(f"{p}\n" for p in phrases).encode("utf-8")).hexdigest()


def _read_text(path: Path) -> str:
    """The file's text, or :class:`PhraseBankError` for a missing, huge or non-UTF-8 file."""
    if not path.exists():
        raise PhraseBankError(f"phrase bank {path}: no such file")
    if not path.is_file():
        raise PhraseBankError(f"phrase bank {path}: not a file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise PhraseBankError(f"phrase bank {path}: {size} bytes, over the limit of {MAX_FILE_BYTES} (10 MB); "
                              "a bank holds short phrases, one a line")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")  # a leading byte-order mark (some editors write one) is dropped
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise PhraseBankError(f"phrase bank {path}, line {line}: not UTF-8 text (byte 0x{data[error.start]:02x} "
                              f"at offset {error.start}); save the file as UTF-8") from None


def _parse(text: str, where: str) -> tuple[str, ...]:
    """The phrases of a bank file's text; ``where`` names the file in errors."""
    phrases: list[str] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        phrase = normalise_phrase(raw)
        if not phrase or phrase.startswith("#"):
            continue
        if "{" in phrase or "}" in phrase:
            raise PhraseBankError(f"phrase bank {where}, line {number}: {phrase!r} contains a brace ({{ or }}); "
                                  f"phrases are filled into the template {TEMPLATE!r} and may not hold braces")
        if not phrase.isprintable():
            raise PhraseBankError(f"phrase bank {where}, line {number}: {phrase!r} contains a control character")
        if len(phrase) > MAX_PHRASE_CHARS:
            raise PhraseBankError(f"phrase bank {where}, line {number}: phrase of {len(phrase)} characters, "
                                  f"longer than {MAX_PHRASE_CHARS}: {phrase[:MAX_PHRASE_CHARS]!r}...")
        key = phrase.casefold()
        if key in first_line:
            raise PhraseBankError(f"phrase bank {where}, line {number}: {phrase!r} duplicates line "
                                  f"{first_line[key]} (phrases are compared ignoring case and spacing)")
        first_line[key] = number
        phrases.append(phrase)
    if not phrases:
        raise PhraseBankError(f"phrase bank {where}: empty (no phrase outside comments and blank lines)")
    if len(phrases) < MIN_PHRASES:
        raise PhraseBankError(f"phrase bank {where}: only {len(phrases)} phrase; a bank needs at least "
                              f"{MIN_PHRASES} to rank names")
    return tuple(phrases)


@dataclass(frozen=True)
class PhraseBank:
    """Phrases that can name a discovered group.

    Attributes:
        phrases: the phrases, whitespace-normalised, in file order, without duplicates.
        source: the file's path as given, or ``"built-in"`` for the shipped bank.
        sha256: hex SHA-256 of the normalised phrases (one per line, ``\\n``-terminated, UTF-8):
            it changes when a phrase does, not when a comment or spacing does.
    """

    phrases: tuple[str, ...]
    source: str
    sha256: str

    TEMPLATE = TEMPLATE

    @classmethod
    def load(cls, path: str | Path | None = None) -> PhraseBank:
        """The bank of ``path``, or the shipped ``datasets/phrases.txt`` when ``path`` is None.

        Raises :class:`PhraseBankError` (a :class:`ValueError`) naming the file, and the line
        where one applies, for a missing file, a file over 10 MB, a file that is not UTF-8, an
        empty bank or one with a single phrase, a duplicate phrase (both lines), a phrase over
        60 characters, with a brace, or with a control character.
        """
        if path is None:
            try:
                file = data_file(PHRASES_FILE)
            except FileNotFoundError as error:
                raise PhraseBankError(f"curate's built-in phrase bank is missing: {error}") from None
            source = BUILT_IN
        else:
            file = Path(path).expanduser()
            source = str(path)
        phrases = _parse(_read_text(file), str(file))
        return cls(phrases=phrases, source=source, sha256=_fingerprint(phrases))

    def prompts(self) -> list[str]:
        """The texts to embed, one per phrase in order: :data:`TEMPLATE` filled with the phrase."""
        return [TEMPLATE.format(p) for p in self.phrases]

    def __len__(self) -> int:
        return len(self.phrases)


def _unit_rows(matrix: np.ndarray, what: str) -> np.ndarray:
    """Rows of ``matrix`` scaled to unit L2 norm; a zero or non-finite row is an error naming ``what``."""
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    bad = ~np.isfinite(norms) | (norms <= 0)
    if bad.any():
        index = int(np.flatnonzero(bad.reshape(-1))[0])
        raise ValueError(f"{what}: row {index} is zero or not finite; it cannot be L2-normalised")
    return matrix / norms


def name_groups(centroids: np.ndarray, reference: np.ndarray, phrase_embeddings: np.ndarray,
                phrases: Sequence[str], top: int = 5) -> list[list[tuple[str, float]]]:
    """For each group, the ``top`` phrases that best say what sets it apart from its class.

    The score of phrase p for group g is

        ``s_p = t_p · (c_g - r)``

    where ``t_p`` is p's embedding L2-normalised, ``c_g`` the group's mean background embedding
    L2-normalised, and ``r`` the reference, the class's mean background embedding L2-normalised
    (all three are normalised here, so raw means may be passed). Domino (Eyuboglu et al. 2022,
    "Domino: Discovering Systematic Errors with Cross-Modal Embeddings") names a slice by the
    text embeddings nearest the slice's mean, ``t_p · c_g``; within one class that mostly finds
    what every photo of the class shares (its usual habitat), so curate scores the difference
    from the class mean: the name says what distinguishes the group, and a phrase the group
    shares with its class scores about zero.

    Args:
        centroids: (G, D), one mean background embedding per group.
        reference: (D,), the class's mean background embedding.
        phrase_embeddings: (P, D), the text embeddings of the phrases' prompts
            (:meth:`PhraseBank.prompts`), in the order of ``phrases``.
        phrases: the P phrases.
        top: how many phrases to return per group (at most P).

    Returns:
        One list per group, in the order of ``centroids``: ``(phrase, score)`` pairs, best first
        (ties keep the bank's order).

    Raises:
        ValueError: for arrays of the wrong number of dimensions, mismatched D or P, an empty
            bank, ``top < 1``, or a zero or non-finite vector.
    """
    c = np.asarray(centroids, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    t = np.asarray(phrase_embeddings, dtype=np.float64)
    if c.ndim != 2:
        raise ValueError(f"centroids must be 2-d (groups, dim), got shape {c.shape}")
    if r.ndim != 1:
        raise ValueError(f"reference must be 1-d (dim,), got shape {r.shape}")
    if t.ndim != 2:
        raise ValueError(f"phrase_embeddings must be 2-d (phrases, dim), got shape {t.shape}")
    if not (c.shape[1] == r.shape[0] == t.shape[1]):
        raise ValueError(f"embedding dimensions differ: centroids {c.shape}, reference {r.shape}, "
                         f"phrase_embeddings {t.shape}")
    if t.shape[0] != len(phrases):
        raise ValueError(f"{t.shape[0]} phrase embeddings for {len(phrases)} phrases")
    if t.shape[0] == 0:
        raise ValueError("no phrases to name groups with")
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise ValueError(f"top must be a positive integer, got {top!r}")
    if c.shape[0] == 0:
        return []
    c = _unit_rows(c, "centroids")
    r = _unit_rows(r[None, :], "reference")[0]
    t = _unit_rows(t, "phrase_embeddings")
    scores = (c - r) @ t.T  # (G, P)
    keep = min(int(top), t.shape[0])
    names: list[list[tuple[str, float]]] = []
    for row in scores:
        order = np.argsort(-row, kind="stable")[:keep]
        names.append([(str(phrases[i]), float(row[i])) for i in order])
    return names


@dataclass(frozen=True)
class GroupName:
    """How well a group's top phrase names it.

    Attributes:
        phrase: the top phrase (the closest, named or not).
        score: its score (:func:`name_groups`).
        margin: its score minus the next phrase's (None when only one phrase was kept).
        min_score: the threshold it was held to.
    """

    phrase: str
    score: float
    margin: float | None
    min_score: float

    @property
    def named(self) -> bool:
        """The top phrase scores at least :attr:`min_score`: it names the group."""
        return bool(np.isfinite(self.score)) and self.score >= self.min_score

    def text(self) -> str:
        """``a road (0.081, +0.020)`` (score, margin over the next phrase), or, below the threshold,
        ``unnamed: closest 'a petri dish', 0.012``."""
        if not self.named:
            return f"unnamed: closest {self.phrase!r}, {self.score:.3f}"
        margin = "" if self.margin is None else f", {self.margin:+.3f}"
        return f"{self.phrase} ({self.score:.3f}{margin})"


def group_name(names: Sequence[tuple[str, float]], min_score: float = MIN_NAME_SCORE) -> GroupName | None:
    """The top phrase of ``names`` (``(phrase, score)`` pairs, best first, as :func:`name_groups`
    returns them) with its score, its margin over the next phrase and whether it reaches
    ``min_score`` (:data:`MIN_NAME_SCORE`); None when there are no names."""
    if not names:
        return None
    phrase, score = names[0]
    margin = float(score) - float(names[1][1]) if len(names) > 1 else None
    return GroupName(str(phrase), float(score), margin, float(min_score))
