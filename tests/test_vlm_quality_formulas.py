"""Hand-computed checks of papers/001's scores (curate/vlm_quality): Visual Fidelity (Alg. 1),
Contrastiveness (Alg. 2), their combinations, Discriminability with its t-test, ECE, and the
background mentions. Pure functions, scripted roles: no model, no server."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from curate.vlm_quality.background import background_terms, hard_backgrounds, mentioned_backgrounds, mentions
from curate.vlm_quality.calibration import (
    combine,
    discriminability,
    expected_calibration_error,
    reliability_png,
)
from curate.vlm_quality.contrastiveness import contrastiveness, mask_options
from curate.vlm_quality.text import parse_questions, parse_yes_no
from curate.vlm_quality.visual_fidelity import VerifierReply, visual_fidelity

Q = "What is the main object in the image?"


# ----------------------------------------------------------------------------- Visual Fidelity
def _qgen(reply):
    calls = []

    def qgen(question, answer, explanation):
        calls.append((question, answer, explanation))
        return reply
    qgen.calls = calls
    return qgen


def _verifier(table):
    def verifier(image, q):
        assert image == "IMG"
        return table[q]
    return verifier


def test_visual_fidelity_fraction_of_yes():
    qgen = _qgen("1. Is there a dog?\n2. Is the grass green?\n3. Is it raining?\n4. Is the dog brown?")
    table = {"Is there a dog?": "Yes.", "Is the grass green?": "yes", "Is it raining?": "No",
             "Is the dog brown?": "YES, it is"}
    vf = visual_fidelity("A brown dog on green grass in the rain.", "IMG", Q, "dog", qgen=qgen,
                         verifier=_verifier(table))
    assert vf.score == pytest.approx(3 / 4)
    assert (vf.n_questions, vf.n_yes, vf.n_no, vf.n_unparsed) == (4, 3, 1, 0)
    assert qgen.calls == [(Q, "dog", "A brown dog on green grass in the rain.")]
    assert vf.verdicts == ["yes", "yes", "no", "yes"]


def test_visual_fidelity_unparsed_answers_are_counted_not_guessed():
    qgen = _qgen("1. Is there a dog?\n2. Is the sky blue?\n3. Is there a tree?")
    table = {"Is there a dog?": "yes", "Is the sky blue?": "maybe, hard to say", "Is there a tree?": ""}
    vf = visual_fidelity("x", "IMG", Q, "dog", qgen=qgen, verifier=_verifier(table))
    # 1 yes out of the 1 answered: the two unparsed answers are neither yes nor no
    assert vf.score == 1.0 and vf.n_unparsed == 2 and vf.verdicts == ["yes", None, None]


@pytest.mark.parametrize("reply,reason", [("", "empty_output"), ("   \n", "empty_output"), (None, "empty_output"),
                                          ("The explanation has no visual details.", "no_questions_parsed")])
def test_visual_fidelity_without_questions_is_nan_with_reason(reply, reason):
    vf = visual_fidelity("x", "IMG", Q, "dog", qgen=_qgen(reply), verifier=_verifier({}))
    assert math.isnan(vf.score) and vf.nan_reason == reason and vf.n_questions == 0


def test_visual_fidelity_all_unparsed_is_nan():
    vf = visual_fidelity("x", "IMG", Q, "dog", qgen=_qgen("1. Is there a dog?"),
                         verifier=_verifier({"Is there a dog?": "perhaps"}))
    assert math.isnan(vf.score) and vf.nan_reason == "no_parsed_answers" and vf.n_unparsed == 1


def test_visual_fidelity_probability_verifier():
    replies = {"Is there a dog?": VerifierReply("", 0.8), "Is it wet?": VerifierReply("", 0.3),
               "Is it dark?": VerifierReply("", 0.5)}
    vf = visual_fidelity("x", "IMG", Q, "dog", qgen=_qgen("1. Is there a dog?\n2. Is it wet?\n3. Is it dark?"),
                         verifier=_verifier(replies))
    assert vf.verdicts == ["yes", "no", None] and vf.score == 0.5 and vf.p_yes == [0.8, 0.3, 0.5]


def test_parse_questions_forms():
    assert parse_questions("1. Is A?\n2) Is B?\n(3) Is C?\n- Is D?\n* Is E?\n1. Is A?")[0] == \
        ["Is A?", "Is B?", "Is C?", "Is D?", "Is E?"]
    assert parse_questions("Sure! Here they are:\nIs the dog brown?\nIs it sunny?") == \
        (["Is the dog brown?", "Is it sunny?"], None)


@pytest.mark.parametrize("reply,verdict", [("Yes", "yes"), ("no.", "no"), (" YES!", "yes"), ("No, it is not", "no"),
                                           ("The answer is yes", "yes"), ("yes or no", "yes"),
                                           ("it could be yes or no", None), ("unclear", None), ("", None),
                                           ("yesterday", None), ("nope", None)])
def test_parse_yes_no(reply, verdict):
    assert parse_yes_no(reply) == verdict


# ----------------------------------------------------------------------------- Contrastiveness
def test_mask_is_case_insensitive_whole_word_and_logged():
    text = "The Tiger cat sits; a TIGER, tigers and a cat. Not a catalog or tigerish."
    masked, log = mask_options(text, ["tiger", "tiger cat", "cat"])
    assert masked == "The <mask> sits; a <mask>, <mask> and a <mask>. Not a catalog or tigerish."
    by = {e["option"]: e["count"] for e in log}
    assert by == {"tiger cat": 1, "tiger": 2, "cat": 1}
    spans = {e["option"]: e["spans"] for e in log}
    assert text[slice(*spans["tiger cat"][0])] == "Tiger cat"


def test_mask_nothing_to_mask():
    masked, log = mask_options("An animal on grass.", ["dog", "cat"])
    assert masked == "An animal on grass." and log == []


def _paraphraser(question, option):
    return f"The main object is a {option}."


def test_contrastiveness_hand_computed_over_all_options():
    probs = {"dog": 0.6, "cat": 0.2, "fox": 0.1, "owl": 0.1, "emu": 0.2}
    seen = {}

    def nli(premise, hypotheses):
        seen["premise"], seen["hypotheses"] = premise, list(hypotheses)
        return [probs[h.split()[-1].rstrip(".")] for h in hypotheses]

    c = contrastiveness("It is a Dog: floppy ears, like no cat.", Q, list(probs), "dog",
                        paraphraser=_paraphraser, nli=nli)
    # all five options enter the denominator (not only the first three alternatives)
    assert c.score == pytest.approx(0.6 / (0.6 + 0.2 + 0.1 + 0.1 + 0.2))
    assert seen["premise"] == "It is a <mask>: floppy ears, like no <mask>."
    assert len(seen["hypotheses"]) == 5 and c.n_masked == 2 and c.predicted_index == 0
    assert c.entailment == [0.6, 0.2, 0.1, 0.1, 0.2]


def test_contrastiveness_explanation_without_options_is_scored_and_logged():
    c = contrastiveness("Four legs and fur.", Q, ["dog", "cat"], "cat", paraphraser=_paraphraser,
                        nli=lambda p, hs: [0.3, 0.1])
    assert c.score == pytest.approx(0.1 / 0.4) and c.n_masked == 0 and c.masked_explanation == "Four legs and fur."


@pytest.mark.parametrize("kwargs,reason", [
    ({"explanation": "  "}, "empty_explanation"),
    ({"predicted": "zebra"}, "prediction_not_an_option"),
    ({"paraphraser": lambda q, o: "" if o == "cat" else "x"}, "empty_hypothesis"),
    ({"nli": lambda p, hs: [0.0, 0.0]}, "zero_entailment"),
])
def test_contrastiveness_undefined_cases(kwargs, reason):
    args = {"explanation": "a dog", "question": Q, "options": ["dog", "cat"], "predicted": "dog",
            "paraphraser": _paraphraser, "nli": lambda p, hs: [0.5, 0.5], **kwargs}
    c = contrastiveness(**args)
    assert math.isnan(c.score) and c.nan_reason == reason


def test_contrastiveness_rejects_a_broken_entailment_model():
    with pytest.raises(ValueError, match="2 hypotheses"):
        contrastiveness("a dog", Q, ["dog", "cat"], "dog", paraphraser=_paraphraser, nli=lambda p, hs: [0.5])
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        contrastiveness("a dog", Q, ["dog", "cat"], "dog", paraphraser=_paraphraser, nli=lambda p, hs: [1.5, 0.1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.001, 1.0), min_size=2, max_size=8), st.data())
def test_contrastiveness_is_a_share_that_sums_to_one(probs, data):
    options = [f"opt{i}" for i in range(len(probs))]
    scores = [contrastiveness("text", Q, options, o, paraphraser=_paraphraser,
                              nli=lambda p, hs: probs).score for o in options]
    assert sum(scores) == pytest.approx(1.0)
    assert all(0.0 <= s <= 1.0 for s in scores)
    k = data.draw(st.integers(0, len(probs) - 1))
    assert scores[k] == pytest.approx(probs[k] / sum(probs))


# ----------------------------------------------------------------------------- combinations, Disc, ECE
def test_combinations():
    assert combine(0.8, 0.4, "avg") == pytest.approx(0.6)
    assert combine(0.8, 0.4, "prod") == pytest.approx(0.32)
    assert combine(0.8, 0.4, "min") == pytest.approx(0.4)
    assert math.isnan(combine(float("nan"), 0.4, "prod"))
    with pytest.raises(ValueError, match="unknown combination"):
        combine(0.1, 0.2, "max")


@settings(max_examples=50, deadline=None)
@given(st.floats(0, 1), st.floats(0, 1))
def test_combinations_order(a, b):
    assert combine(a, b, "min") <= combine(a, b, "avg") + 1e-12
    assert combine(a, b, "prod") <= combine(a, b, "min") + 1e-12


def test_discriminability_hand_computed_and_t_equals_scipy():
    scores = [0.9, 0.8, 0.7, float("nan"), 0.4, 0.2, 0.3, 0.1]
    correct = [True, True, True, True, False, False, False, False]
    d = discriminability(scores, correct)
    on, off = np.array([0.9, 0.8, 0.7]), np.array([0.4, 0.2, 0.3, 0.1])
    assert d.disc == pytest.approx(0.8 - 0.25)
    assert (d.n_correct, d.n_wrong, d.n_nan) == (3, 4, 1)
    # Student's t by hand: pooled variance over n1 + n2 - 2 degrees of freedom
    sp2 = (((on - on.mean()) ** 2).sum() + ((off - off.mean()) ** 2).sum()) / (3 + 4 - 2)
    t = (on.mean() - off.mean()) / math.sqrt(sp2 * (1 / 3 + 1 / 4))
    assert d.t == pytest.approx(t, rel=1e-12)
    ref = stats.ttest_ind(on, off)
    assert d.t == pytest.approx(ref.statistic, rel=1e-12) and d.p == pytest.approx(ref.pvalue, rel=1e-12)
    assert d.stars == "***" if d.p < 0.001 else d.stars in ("**", "*", "")
    welch = discriminability(scores, correct, equal_var=False)
    assert welch.t == pytest.approx(stats.ttest_ind(on, off, equal_var=False).statistic)


def test_discriminability_one_sided_data():
    d = discriminability([0.5, 0.6], [True, True])
    assert math.isnan(d.disc) and d.nan_reason == "no_wrong" and math.isnan(d.t)


def test_ece_hand_computed_with_stated_bins():
    # 10 bins: [0, .1], (.1, .2], ..., (.9, 1]; 0.1 is in bin 1, 0.55 in bin 6, 1.0 in bin 10
    scores = [0.0, 0.1, 0.55, 0.55, 0.6, 0.95, 1.0, 1.0]
    correct = [False, True, True, False, True, True, True, False]
    cal = expected_calibration_error(scores, correct, bins=10)
    # bin 1: {0.0, 0.1} acc 1/2 conf .05; bin 6: {.55, .55, .6} acc 2/3 conf .5666..; bin 10: {.95, 1, 1} acc 2/3
    hand = (2 / 8) * abs(0.5 - 0.05) + (3 / 8) * abs(2 / 3 - (0.55 + 0.55 + 0.6) / 3) \
        + (3 / 8) * abs(2 / 3 - (0.95 + 1 + 1) / 3)
    assert cal.ece == pytest.approx(hand, rel=1e-12)
    assert cal.counts == [2, 0, 0, 0, 0, 3, 0, 0, 0, 3] and cal.n == 8
    two = expected_calibration_error(scores, correct, bins=2)  # [0, .5], (.5, 1]
    assert two.counts == [2, 6]


def test_ece_rejects_out_of_range_and_handles_empty():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        expected_calibration_error([1.2], [True])
    empty = expected_calibration_error([float("nan")], [True])
    assert math.isnan(empty.ece) and empty.n_nan == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=40))
def test_ece_bounds_and_perfect_one_bin(pairs):
    scores, correct = zip(*pairs)
    cal = expected_calibration_error(scores, correct)
    assert 0.0 <= cal.ece <= 1.0 and sum(cal.counts) == len(pairs)
    one = expected_calibration_error(scores, correct, bins=1)
    assert one.ece == pytest.approx(abs(np.mean(correct) - np.mean(scores)))


def test_reliability_png_is_a_png():
    cal = expected_calibration_error([0.2, 0.7, 0.9], [False, True, True])
    png = reliability_png({"VF": cal, "Contr": cal})
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- background mentions
def test_background_terms_and_mentions():
    terms = background_terms(["grass", "human", "sky", "outdoor"])
    assert terms["human"] == ["human", "human hand"] and terms["sky"] == ["sky"]
    assert "outdoors" in terms["outdoor"]
    assert mentions("Standing on GRASS near the pond", terms["grass"])
    assert mentions("the grasses sway", terms["grass"])
    assert not mentions("a grasshopper", terms["grass"])
    assert mentioned_backgrounds("a bird in the Sky, held by a human", terms) == ["human", "sky"]


def test_hard_backgrounds_from_rows():
    rows = [{"class_index": 1, "group": "hard", "background": "water"},
            {"class_index": 1, "group": "hard", "background": "water"},
            {"class_index": 1, "group": "hard", "background": "sand"},
            {"class_index": 1, "group": "easy", "background": "grass"},
            {"class_index": 2, "group": "easy", "background": "grass"}]
    assert hard_backgrounds(rows) == {1: "water"}
