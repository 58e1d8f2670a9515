"""The phrase bank of curate discover (datasets/phrases.txt, curate.discover.phrases) and group naming."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import yaml

from curate.discover import phrases as phrases_module
from curate.discover.phrases import (
    DEFAULT_PHRASES,
    MAX_PHRASE_CHARS,
    TEMPLATE,
    PhraseBank,
    PhraseBankError,
    name_groups,
    normalise_phrase,
)
from curate.paths import data_file


def write(tmp_path: Path, content: str | bytes, name: str = "bank.txt") -> Path:
    """A bank file in ``tmp_path`` holding ``content`` (text is written as UTF-8)."""
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


# --- the shipped bank ---------------------------------------------------------------------------

def test_shipped_bank_loads_and_is_large_and_clean() -> None:
    bank = PhraseBank.load()
    assert bank.source == "built-in"
    assert len(bank.phrases) >= 400
    keys = [normalise_phrase(p).casefold() for p in bank.phrases]
    assert len(set(keys)) == len(keys)
    assert all(len(p) <= MAX_PHRASE_CHARS and "{" not in p and "}" not in p for p in bank.phrases)
    assert all(p == normalise_phrase(p) for p in bank.phrases)
    assert len(bank.sha256) == 64
    assert bank.sha256 == hashlib.sha256("".join(f"{p}\n" for p in bank.phrases).encode()).hexdigest()


def test_shipped_bank_is_the_default_path_in_the_data_folder() -> None:
    assert DEFAULT_PHRASES == data_file("phrases.txt")
    assert phrases_module.DEFAULT_PHRASES.name == "phrases.txt"
    explicit = PhraseBank.load(DEFAULT_PHRASES)
    assert explicit.phrases == PhraseBank.load().phrases
    assert explicit.sha256 == PhraseBank.load().sha256
    assert explicit.source == str(DEFAULT_PHRASES)


def test_shipped_bank_contains_the_background_vocabulary() -> None:
    vocabulary = yaml.safe_load(data_file("backgrounds.yaml").read_text(encoding="utf-8"))["phrases"]
    assert len(vocabulary) == 14
    bank = set(PhraseBank.load().phrases)
    missing = [p for p in vocabulary.values() if p not in bank]
    assert not missing, missing
    for phrase in ("a bird feeder", "a zoo enclosure", "a camera flash at night", "a petri dish", "a bamboo forest",
                   "an ice floe", "underwater"):
        assert phrase in bank


def test_shipped_bank_header_states_source_licence_and_template() -> None:
    text = DEFAULT_PHRASES.read_text(encoding="utf-8")
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for needle in ("Places365", "Zhou", "2017", "word list", "Licence", "Apache-2.0", '"a photo of {phrase}."',
                   "--phrases FILE"):
        assert needle in header, needle


def test_prompts_fill_the_template() -> None:
    bank = PhraseBank.load()
    prompts = bank.prompts()
    assert len(prompts) == len(bank.phrases)
    assert prompts[0] == f"a photo of {bank.phrases[0]}."
    assert TEMPLATE == PhraseBank.TEMPLATE == "a photo of {}."


# --- user files -----------------------------------------------------------------------------------

def test_user_file_is_normalised_and_fingerprinted(tmp_path: Path) -> None:
    path = write(tmp_path, "# my bank\n\n  a   bird feeder \n\ta zoo enclosure\n# done\n")
    bank = PhraseBank.load(path)
    assert bank.phrases == ("a bird feeder", "a zoo enclosure")
    assert bank.source == str(path)
    same = PhraseBank.load(write(tmp_path, "a bird feeder\na zoo enclosure\n", "other.txt"))
    assert same.sha256 == bank.sha256  # comments and spacing do not change the fingerprint
    changed = PhraseBank.load(write(tmp_path, "a bird feeder\na zoo\n", "changed.txt"))
    assert changed.sha256 != bank.sha256


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "\ufeffa road\nsnow\n".encode())
    assert PhraseBank.load(path).phrases == ("a road", "snow")


def assert_refused(path: Path, *needles: str) -> str:
    """Loading ``path`` raises PhraseBankError naming the file and every needle; returns the message."""
    with pytest.raises(PhraseBankError) as caught:
        PhraseBank.load(path)
    message = str(caught.value)
    assert str(path) in message, message
    for needle in needles:
        assert needle in message, (needle, message)
    assert isinstance(caught.value, ValueError)
    return message


def test_missing_file(tmp_path: Path) -> None:
    assert_refused(tmp_path / "nope.txt", "no such file")


def test_folder_is_not_a_file(tmp_path: Path) -> None:
    assert_refused(tmp_path, "not a file")


def test_empty_file(tmp_path: Path) -> None:
    assert_refused(write(tmp_path, ""), "empty")


def test_comments_and_blank_lines_only(tmp_path: Path) -> None:
    assert_refused(write(tmp_path, "# a comment\n\n   \n# another\n"), "empty")


def test_a_single_phrase_is_too_few(tmp_path: Path) -> None:
    assert_refused(write(tmp_path, "# one\na bird feeder\n"), "only 1 phrase", "at least 2")


def test_latin1_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, "a road\nsnow\na caf\xe9 terrace\n".encode("latin-1"))
    assert_refused(path, "line 3", "not UTF-8")


@pytest.mark.parametrize("second", ["A Bird Feeder", "  a   bird\tfeeder  ", "A BIRD FEEDER"])
def test_duplicates_differing_by_case_or_spacing(tmp_path: Path, second: str) -> None:
    path = write(tmp_path, f"a bird feeder\n# between\nsnow\n{second}\n")
    assert_refused(path, "line 4", "line 1", "duplicate")


def test_too_long(tmp_path: Path) -> None:
    long = "a " + "very " * 12 + "long phrase"
    assert len(long) > MAX_PHRASE_CHARS
    assert_refused(write(tmp_path, f"snow\n{long}\n"), "line 2", f"longer than {MAX_PHRASE_CHARS}")


def test_exactly_the_limit_is_accepted(tmp_path: Path) -> None:
    phrase = "x" * MAX_PHRASE_CHARS
    assert PhraseBank.load(write(tmp_path, f"snow\n{phrase}\n")).phrases == ("snow", phrase)


@pytest.mark.parametrize("bad", ["a {phrase}", "a } brace", "{}"])
def test_braces(tmp_path: Path, bad: str) -> None:
    assert_refused(write(tmp_path, f"snow\n\n{bad}\n"), "line 3", "brace")


def test_control_character(tmp_path: Path) -> None:
    assert_refused(write(tmp_path, "snow\na\x00road\n"), "line 2", "control character")


def test_file_over_ten_megabytes(tmp_path: Path) -> None:
    path = tmp_path / "huge.txt"
    with path.open("wb") as handle:
        handle.truncate(10 * 1024 * 1024 + 1)  # sparse: nothing is written
    assert_refused(path, "10 MB")


# --- naming groups ------------------------------------------------------------------------------

def unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=float)
    return v / np.linalg.norm(v)


def test_name_groups_ranks_by_the_difference_from_the_class_mean() -> None:
    # 3-d: the class mostly looks like x (grass); group 0 leans to y (a feeder), group 1 to z (a hand).
    phrases = ["grass", "a bird feeder", "a human hand", "the sky"]
    t = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 2.0], [1.0, 1.0, 0]])  # the hand's row is not unit: normalised
    reference = np.array([2.0, 0.0, 0.0])  # normalised to (1, 0, 0)
    centroids = np.array([[1.0, 1.0, 0.0], [3.0, 0.0, 4.0]])  # normalised: (.7071, .7071, 0), (.6, 0, .8)
    names = name_groups(centroids, reference, t, phrases, top=4)
    s = np.sqrt(0.5)
    # group 0: c - r = (s - 1, s, 0); t_p . (c - r):
    #   grass (s - 1) = -0.2929, feeder s = 0.7071, hand 0, sky s * ((s - 1) + s) = 0.2071
    expected0 = [("a bird feeder", s), ("the sky", s * (2 * s - 1)), ("a human hand", 0.0), ("grass", s - 1)]
    # group 1: c - r = (-0.4, 0, 0.8): grass -0.4, feeder 0, hand 0.8, sky -0.4 * s = -0.2828
    expected1 = [("a human hand", 0.8), ("a bird feeder", 0.0), ("the sky", -0.4 * s), ("grass", -0.4)]
    for got, want in zip(names, [expected0, expected1]):
        assert [p for p, _ in got] == [p for p, _ in want]
        assert [score for _, score in got] == pytest.approx([score for _, score in want])
    assert all(isinstance(score, float) for group in names for _, score in group)


def test_name_groups_differs_from_nearest_to_the_centroid() -> None:
    # Nearest to the centroid alone would name group 0 "grass" (what the whole class shares).
    phrases = ["grass", "a bird feeder"]
    t = np.eye(2)
    centroid = unit(0.9, 0.4)
    assert int(np.argmax(t @ centroid)) == 0
    assert name_groups(centroid[None, :], unit(1.0, 0.0), t, phrases, top=1)[0][0][0] == "a bird feeder"


def test_name_groups_top_ties_and_empty() -> None:
    phrases = ["a", "b", "c"]
    t = np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    names = name_groups(np.array([[0.0, 1.0]]), np.array([1.0, 0.0]), t, phrases)
    assert [p for p, _ in names[0]] == ["a", "b", "c"]  # top=5 > P: all, ties in bank order
    assert len(name_groups(np.array([[0.0, 1.0]]), np.array([1.0, 0.0]), t, phrases, top=2)[0]) == 2
    assert name_groups(np.zeros((0, 2)), np.array([1.0, 0.0]), t, phrases) == []


@pytest.mark.parametrize(
    ("centroids", "reference", "embeddings", "n_phrases", "top", "needle"),
    [
        (np.ones((2, 3)), np.ones(4), np.ones((2, 3)), 2, 5, "dimensions differ"),
        (np.ones((2, 3)), np.ones(3), np.ones((2, 4)), 2, 5, "dimensions differ"),
        (np.ones(3), np.ones(3), np.ones((2, 3)), 2, 5, "centroids must be 2-d"),
        (np.ones((2, 3)), np.ones((1, 3)), np.ones((2, 3)), 2, 5, "reference must be 1-d"),
        (np.ones((2, 3)), np.ones(3), np.ones(3), 2, 5, "phrase_embeddings must be 2-d"),
        (np.ones((2, 3)), np.ones(3), np.ones((2, 3)), 3, 5, "2 phrase embeddings for 3 phrases"),
        (np.ones((2, 3)), np.ones(3), np.ones((0, 3)), 0, 5, "no phrases"),
        (np.ones((2, 3)), np.ones(3), np.ones((2, 3)), 2, 0, "top must be a positive integer"),
        (np.ones((2, 3)), np.zeros(3), np.ones((2, 3)), 2, 5, "reference: row 0 is zero"),
        (np.array([[1.0, 0, 0], [np.nan, 0, 0]]), np.ones(3), np.ones((2, 3)), 2, 5, "centroids: row 1"),
    ],
)
def test_name_groups_refuses_bad_shapes(centroids: np.ndarray, reference: np.ndarray, embeddings: np.ndarray,
                                        n_phrases: int, top: int, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        name_groups(centroids, reference, embeddings, [f"p{i}" for i in range(n_phrases)], top=top)
