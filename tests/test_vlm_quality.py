"""The explanation-quality pipeline end to end (issue 16): ``curate vlm-explain`` and ``curate vlm-quality``
on a tiny synthetic world, with the tiny random LLaVA (issue 15) as explainer and verifier, a scripted
judge behind the loopback OpenAI-compatible server as question generator and paraphraser, and a tiny
random NLI model through the ``hf:`` path. Plus the bad inputs: malformed judge output, explanations
naming no option, an NLI model without an entailment label, an interrupted run, 429s and timeouts.

Numbers here are plumbing (random tiny models), never science: the tests check the pipeline's
bookkeeping and arithmetic, not the scores' values."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from fake_judges import ScriptedJudge
from fake_openai import FakeOpenAI

from curate.cli import main
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, assign_truth_groups, collect_synthetic
from curate.runs import VlmExplainRun, VlmQualityRun, list_runs
from curate.stages.vlm_explain import VlmExplainSettings, parse_answer, select_rows, vlm_explain
from curate.stages.vlm_quality import Judges, VlmQualitySettings, vlm_quality
from curate.store.validate import check_dataset
from curate.vlm_quality.cache import RoleCache
from curate.vlm_quality.roles import VerifierRole, parse_role_spec
from curate.zeroshot.candidates import save_top20

CLASSES = DEFAULT_CLASSES[:2]  # polar bear (snow), black swan (water)
# 1 vs 4 candidates per class: the true class, the other class and two distractors
TOP = {296: [296, 100, 9, 33], 100: [100, 296, 9, 33]}


def _world(root):
    ds = collect_synthetic(root, WorldSpec(classes=CLASSES, per_class=4, image_size=32, p=0.5, seed=5))
    assign_truth_groups(ds)
    save_top20(ds.root, {c: np.array(v) for c, v in TOP.items()}, {"reference_spec": "test table"})
    return ds


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from curate.lvlm.tiny import build_tiny_llava
    from curate.vlm_quality.tiny import build_tiny_nli

    root = tmp_path_factory.mktemp("vlmq-models")
    llava = build_tiny_llava(root / "llava", image_size=32, extra_words=["snow", "water", "polar", "swan"])
    nli = build_tiny_nli(root / "nli", words=["The main object in the image is a polar bear black swan tench goldfish"])
    bad = build_tiny_nli(root / "bad-nli", labels=("LABEL_0", "LABEL_1"))
    return {"llava": llava, "nli": nli, "bad": bad}


@pytest.fixture()
def judge():
    script = ScriptedJudge()
    with FakeOpenAI(chat_handler=script, model_name="judge") as server:
        server.script = script
        yield server


@pytest.fixture()
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "220"})


def _quality_args(ds, server, models, run, name, *extra):
    url = f"endpoint:{server.base_url}#judge"
    return ["vlm-quality", str(ds.root), "--run", run, "--qgen", url, "--verifier", f"lvlm:{models['llava']}",
            "--verifier-mode", "likelihood", "--paraphraser", url, "--nli", f"hf:{models['nli']}",
            "--run-name", name, *extra]


def test_cli_end_to_end_with_tiny_models(tmp_path, models, judge, runner, one_thread):
    ds = _world(tmp_path / "world")
    result = runner.invoke(main, ["vlm-explain", str(ds.root), "--model", f"lvlm:{models['llava']}",
                                  "--answer", "likelihood", "--limit", "6", "--max-new-tokens", "12",
                                  "--run-name", "ex"])
    assert result.exit_code == 0, result.output
    assert "accuracy = share of samples whose answer is the true class" in result.output
    assert "chance: 25.0% (1 of 4 candidates" in result.output
    explained = VlmExplainRun.load(ds.root / "runs" / "ex")
    rows = explained.rows()
    assert explained.n == 6 and {r.group for r in rows} == {"easy", "hard"}
    assert all(r.predicted_name in r.candidates and r.explanation for r in rows)
    assert explained.prompts["explain_system"] == "Please explain the reasoning behind your answer."
    assert explained.accuracy == pytest.approx(np.mean([r.correct for r in rows]))

    result = runner.invoke(main, _quality_args(ds, judge, models, "ex", "q1"))
    assert result.exit_code == 0, result.output
    for phrase in ("mean score in [0, 1]", "Disc = mean on correct - mean on wrong", "Does the explanation name",
                   "favours no option: 1/4 = 0.250", "neither (left out of VF, never guessed)"):
        assert phrase in result.output
    run = VlmQualityRun.load(ds.root / "runs" / "q1")
    table = run.scores().to_pylist()
    assert len(table) == 6
    for r in table:
        assert len(r["options"]) == 4 and len(r["hypotheses"]) == 4 and len(r["entailment"]) == 4
        k = r["options"].index(r["predicted_name"])
        assert r["contr"] == pytest.approx(r["entailment"][k] / sum(r["entailment"]))  # Alg. 2 over all options
        assert r["hypotheses"][k] == f"The main object in the image is a {r['predicted_name']}."
        if r["vf_reason"] is None:  # likelihood verifier: every answer is yes or no
            assert r["n_unparsed"] == 0 and r["vf"] == pytest.approx(r["n_yes"] / r["n_questions"])
            assert all(0 <= p <= 1 for p in r["p_yes"])
        else:
            assert r["vf"] is None and r["vf_reason"] in ("no_questions_parsed", "empty_output")
        if r["vf"] is not None:
            assert r["prod"] == pytest.approx(r["vf"] * r["contr"])
            assert r["min"] == pytest.approx(min(r["vf"], r["contr"]))
        for option in r["options"]:  # masked: no option survives in the premise
            assert option not in r["masked_explanation"].lower()
    assert (ds.root / "runs" / "q1" / "reliability.png").read_bytes()[:4] == b"\x89PNG"
    assert run.judges["verifier"]["mode"] == "likelihood" and run.judges["nli"]["model_id"].startswith("hf:")
    made = run.summary["cache"]["misses"]
    assert made > 0 and judge.script.count("paraphrase") == 4  # one paraphrase per (question, option), reused

    # a re-run costs nothing: every judge call comes from the cache, no request reaches the server
    before = len(judge.requests)
    result = runner.invoke(main, _quality_args(ds, judge, models, "ex", "q2"))
    assert result.exit_code == 0, result.output
    again = VlmQualityRun.load(ds.root / "runs" / "q2")
    assert again.summary["cache"]["misses"] == 0 and len(judge.requests) == before
    assert again.scores(["contr"]).to_pylist() == run.scores(["contr"]).to_pylist()

    from curate.report import build_report

    md = build_report(ds.root).read_text()
    assert "Explanation quality (papers/001)" in md and "`q1`" in md and "Discriminability" in md
    assert not check_dataset(ds.root)


def test_endpoint_explainer_and_malformed_judges(tmp_path, models, judge, one_thread):
    ds = _world(tmp_path / "world")
    judge.script.answers = ["polar bear", "I cannot tell", "Black Swan.", "an ostrich"]
    judge.script.explanations = ["White fur on snow.", "It swims on the water, like a swan.", "", "Nothing to see."]
    url = f"endpoint:{judge.base_url}#judge"
    ex = vlm_explain(ds, url, VlmExplainSettings(limit=4), run_name="ex")
    rows = {r.sample_id: r for r in ex.rows()}
    assert ex.unparsed == 1 and sum(r.answer_reason == "unparsed_answer" for r in rows.values()) == 1
    assert [parse_answer(a, ["polar bear", "black swan", "ostrich"]) for a in judge.script.answers] == [0, None, 1, 2]
    judge.script.qgen = {"White fur on snow.": "", "Nothing to see.": "1. Is there fur?\n2. Is it snowing?"}
    judge.script.verify = {"Is there fur?": "maybe", "Is it snowing?": "No."}
    q = vlm_quality(ds, Judges(url, url, url, f"hf:{models['nli']}"), VlmQualitySettings(run="ex"), run_name="q")
    table = {r["explanation"]: r for r in q.scores().to_pylist()}
    fur = table["White fur on snow."]
    assert fur["vf"] is None and fur["vf_reason"] == "empty_output"  # no questions: NaN with a reason, not 0
    assert fur["mentions_own_background"] is (rows[fur["sample_id"]].background == "snow")
    nothing = table["Nothing to see."]
    assert nothing["verdicts"] == [None, "no"] and nothing["vf"] == 0.0 and nothing["n_unparsed"] == 1
    empty = table[""]
    assert empty["contr"] is None and empty["contr_reason"] == "empty_explanation"
    swan = table["It swims on the water, like a swan."]
    assert swan["n_masked"] == 0 and "water" in swan["mentioned_backgrounds"]  # "swan" is not "black swan"
    assert q.summary["masking"]["no_option_mentioned"] == 3
    assert q.summary["verifier"]["unparsed"] >= 1
    assert q.nan_reasons("vf")["empty_output"] == 1
    unparsed = next(r for r in q.scores().to_pylist() if r["predicted_name"] is None)
    assert unparsed["contr_reason"] == "prediction_not_an_option"


def test_nli_without_entailment_label_is_refused(tmp_path, models, judge, runner):
    ds = _world(tmp_path / "world")
    url = f"endpoint:{judge.base_url}#judge"
    vlm_explain(ds, url, VlmExplainSettings(limit=2), run_name="ex")
    args = _quality_args(ds, judge, models, "ex", "q")
    args[args.index("--nli") + 1] = f"hf:{models['bad']}"
    result = runner.invoke(main, args)
    assert result.exit_code == 1
    assert "no 'entailment' label" in result.output and "'LABEL_0'" in result.output
    assert [p.name for p in list_runs(ds.root)] == ["ex"]
    result = runner.invoke(main, [*args[:args.index("--nli")], "--nli", f"lvlm:{models['llava']}", "--run-name", "q"])
    assert result.exit_code == 1 and "must be hf:" not in result.output and "cannot play this role" in result.output


def test_interrupted_run_resumes_from_the_cache(tmp_path, models, judge):
    ds = _world(tmp_path / "world")
    url = f"endpoint:{judge.base_url}#judge"
    vlm_explain(ds, url, VlmExplainSettings(limit=4), run_name="ex")
    total_before = len(judge.script.calls)
    judge.script.fail_after = total_before + 5  # the judge goes away after 5 calls of the quality stage
    judges = Judges(url, url, url, f"hf:{models['nli']}")
    settings = VlmQualitySettings(run="ex", retries=0)
    with pytest.raises(Exception, match="400|scripted failure|server says"):
        vlm_quality(ds, judges, settings, run_name="q")
    assert [p.name for p in list_runs(ds.root)] == ["ex"] and not check_dataset(ds.root)
    done_first = len(judge.script.calls) - total_before
    assert done_first == 5
    judge.script.fail_after = None
    run = vlm_quality(ds, judges, settings, run_name="q")
    by_role = run.summary["cache"]["by_role"]
    fresh = len(judge.script.calls) - total_before - done_first
    assert fresh == sum(by_role[r]["misses"] for r in ("qgen", "verifier", "paraphraser"))
    # every judge call was made once over both attempts: the 5 of the first are cache entries the second reused
    entries = sum(len(list((ds.root / "features" / "vlm_quality" / r).rglob("*.json")))
                  for r in ("qgen", "verifier", "paraphraser"))
    assert entries == done_first + fresh and run.n == 4


def test_429_and_timeout_are_retried(tmp_path, models, judge):
    ds = _world(tmp_path / "world")
    url = f"endpoint:{judge.base_url}#judge"
    judge.slow_seconds = 1.0
    judge.faults = ["429", "timeout", "503"]
    run = vlm_explain(ds, url, VlmExplainSettings(limit=2, timeout=0.4, retries=3, backoff_base=0.05), run_name="ex")
    assert run.n == 2 and not judge.faults
    calls = run.summary["cache"]["misses"]
    assert len(judge.requests) == calls + 3  # three failed attempts, each retried


def test_role_specs_and_likelihood_verifier(tmp_path):
    assert parse_role_spec("endpoint:http://127.0.0.1:8000/v1#m").model == "m"
    with pytest.raises(ValueError, match="after '#'"):
        parse_role_spec("endpoint:http://127.0.0.1:8000/v1")
    with pytest.raises(ValueError, match="expected endpoint"):
        parse_role_spec("openai:gpt")

    class Losses:
        model_id = "fake"

        def answer_losses(self, images, question, answers, system=None):
            return None, np.array([[math.log(4), math.log(4 / 3)]])  # p(yes) = 1/4, p(no) = 3/4

    verifier = VerifierRole(Losses(), RoleCache(tmp_path / "cache"), mode="likelihood")
    from PIL import Image

    reply = verifier(Image.new("RGB", (4, 4)), "Is there a dog?")
    assert reply.p_yes == pytest.approx(0.25)
    assert list((tmp_path / "cache" / "verifier").rglob("*.json"))


def test_select_rows_round_robin():
    rows = [{"sample_id": f"{g}{c}{i}", "group": g, "class_index": c} for g in ("easy", "hard") for c in (1, 2)
            for i in range(3)]
    picked = select_rows(rows, 4)
    assert {(r["group"], r["class_index"]) for r in picked} == {("easy", 1), ("easy", 2), ("hard", 1), ("hard", 2)}
    assert json.dumps(select_rows(rows, None)) == json.dumps(sorted(rows, key=lambda r: r["sample_id"]))


def test_seq2seq_entailment_verifier(tmp_path):
    """A T5-style verifier (the kind papers/001 uses): Pr = p(Yes) / (p(Yes) + p(No)) at the first decoder step."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

    from curate.vlm_quality.nli import load_nli

    words = ["<pad>", "</s>", "<unk>", "yes", "no", "premise", "hypothesis", "given", "the", "is", "correct", "answer",
             "a", "dog", "cat", ":", "?", "."]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                  pre_tokenizers.Punctuation(behavior="isolated")])
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(tmp_path / "t5")
    torch.manual_seed(0)
    config = T5Config(vocab_size=len(words), d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    module = T5ForConditionalGeneration(config).eval()
    module.save_pretrained(tmp_path / "t5")
    model = load_nli(tmp_path / "t5")
    probs = model.entailment("a dog", ["the dog is a dog.", "a cat"])
    assert model.info["kind"] == "seq2seq" and len(probs) == 2
    enc = model.tokenizer("Premise: a dog\nHypothesis: a cat\nGiven the premise, is the hypothesis correct?\nAnswer:",
                          return_tensors="pt")
    with torch.no_grad():
        logits = module(**enc, decoder_input_ids=torch.zeros((1, 1), dtype=torch.long)).logits[0, 0]
    yes, no = float(logits[3]), float(logits[4])
    assert probs[1] == pytest.approx(math.exp(yes) / (math.exp(yes) + math.exp(no)), rel=1e-5)
