"""``curate vlm-explain`` and ``curate vlm-quality``: a VLM's explanations and their quality (papers/001)."""
from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from curate.cli import StageProgress, err, main, out, progress, shown
from curate.cli.options import UserPath, device_options, expand_home, lvlm_options, run_options
from curate.formatting import num, pct

ROLE_HELP = "endpoint:http://HOST:PORT/v1#MODEL or lvlm:PATH_OR_REPO"


def _short(text: str | None, limit: int = 70) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _prompt_option(name: str, help_text: str):
    return click.option(name, default=None, help=help_text + " (default: curate's; stored in the run).")


@main.command("vlm-explain")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--model", required=True, help=f"The VLM that answers and explains: {ROLE_HELP}.")
@click.option("--label-space", callback=expand_home, default="top20", show_default=True,
              help="Candidates per sample: top20 (the saved 1-vs-20 space) | imagenet1k | dataset | FILE.")
@click.option("--answer", "answer_mode", type=click.Choice(["generate", "likelihood"]), default="generate",
              show_default=True, help="generate: ask for one of the choices and read the reply (papers/001 App. C); "
                                      "likelihood: the candidate with the lowest mean answer NLL (papers/003 App. C.4).")
@click.option("--limit", type=int, default=None, help="At most N samples (round-robin over group and class).")
@click.option("--max-new-tokens", type=int, default=128, show_default=True, help="Length cap of an explanation.")
@_prompt_option("--answer-system", "Step-1 system prompt")
@_prompt_option("--answer-prompt", "Step-1 user prompt with {question} and {choices}")
@_prompt_option("--explain-system", "Step-2 system prompt ('Please explain the reasoning behind your answer.')")
@_prompt_option("--explain-prompt", "Step-2 user prompt with {question}, {choices}, {answer}")
@lvlm_options
@click.option("--top20-reference", help="Reference CLIP for building the 1-vs-20 space when the dataset has none.")
@click.option("--top20-pretrained", callback=expand_home, help="Its tag or weights file.")
@click.option("--statuses", default="candidate,accepted", show_default=True, help="Comma list of sample statuses.")
@click.option("--no-cache", is_flag=True, help="Neither read nor write the cache of model calls.")
@device_options
@run_options
@click.option("--json", "as_json", is_flag=True, help="Print the run's summary as JSON.")
def vlm_explain_cmd(directory: Path, model: str, label_space: str, answer_mode: str, limit: int | None,
                    max_new_tokens: int, answer_system: str | None, answer_prompt: str | None,
                    explain_system: str | None, explain_prompt: str | None, question: str, answer_template: str,
                    token_env: str | None, top20_reference: str | None, top20_pretrained: str | None, statuses: str,
                    no_cache: bool, device: str, precision: str, run_name: str | None, overwrite: bool,
                    as_json: bool) -> None:
    """Ask a VLM for its answer among the candidates, then for the reasoning behind it; writes runs/<run-name>/."""
    from dataclasses import replace

    from curate.models.spec import ModelSpec, parse_pretrained
    from curate.stages.vlm_explain import VlmExplainSettings, vlm_explain
    from curate.vlm_quality.prompts import ExplainPrompts

    prompts = ExplainPrompts(question=question)
    overrides = {"answer_system": answer_system, "answer_user": answer_prompt, "explain_system": explain_system,
                 "explain_user": explain_prompt}
    prompts = replace(prompts, **{k: v for k, v in overrides.items() if v is not None})
    settings = VlmExplainSettings(
        label_space=label_space, answer_mode=answer_mode, answer_template=answer_template, prompts=prompts,
        limit=limit, statuses=tuple(s.strip() for s in statuses.split(",") if s.strip()),
        explain_max_tokens=max_new_tokens, device="cpu" if device == "auto" else device, precision=precision,
        token_env=token_env, use_cache=not no_cache,
        top20_reference=ModelSpec(top20_reference, parse_pretrained(top20_pretrained)) if top20_reference else None)
    with progress() as bar:
        run = vlm_explain(directory, model, settings, run_name=run_name, overwrite=overwrite,
                          progress=StageProgress(bar))
    if as_json:
        out().print_json(json.dumps({"run_dir": str(run.run_dir), **run.summary}, default=str))
        return
    table = Table(title=f"{run.model_id} on {directory} ({run.label_space}): answer then explanation; accuracy = "
                        "share of samples whose answer is the true class (unparsed answers count as wrong)",
                  title_justify="left")
    for column in ("samples", "accuracy %", "easy %", "hard %", "unparsed answers"):
        table.add_column(column, justify="right")
    by_group = run.accuracy_by_group
    table.add_row(str(run.n), pct(run.accuracy), pct(by_group.get("easy")), pct(by_group.get("hard")),
                  str(run.unparsed))
    out().print(table)
    sizes = {len(r.candidates) for r in run.rows()}
    if len(sizes) == 1:
        k = sizes.pop()
        out().print(f"chance: {pct(1 / k)}% (1 of {k} candidates per sample, answering at random)")
    examples = Table(title="first explanations (all in explanations.parquet)", title_justify="left")
    for column in ("sample", "group", "true", "answer", "explanation"):
        examples.add_column(column, overflow="fold")
    for r in run.rows()[:5]:
        examples.add_row(r.sample_id, str(r.group or "—"), r.class_name, r.predicted_name or f"({_short(r.answer_raw, 30)})",
                         _short(r.explanation))
    out().print(examples)
    cache = run.summary.get("cache") or {}
    err().print(f"• model calls: {cache.get('misses', 0)} made, {cache.get('hits', 0)} from the cache")
    err().print(f"• run folder: {shown(run.run_dir)}")


@main.command("vlm-quality")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--run", "source_run", required=True, help="The vlm-explain run whose explanations are scored.")
@click.option("--qgen", required=True, help=f"Question generator (Visual Fidelity, Alg. 1): {ROLE_HELP}.")
@click.option("--verifier", required=True, help=f"Verifier that sees the image (Alg. 1): {ROLE_HELP}.")
@click.option("--verifier-mode", type=click.Choice(["text", "likelihood"]), default="text", show_default=True,
              help="text: read the reply as yes/no; likelihood: P(yes) vs P(no) from answer log-likelihoods.")
@click.option("--paraphraser", required=True, help=f"Question+answer -> hypothesis (Contrastiveness, Alg. 2): {ROLE_HELP}.")
@click.option("--nli", required=True, help="Entailment model: hf:PATH_OR_REPO (sequence classification with an "
                                           "entailment label, or a seq2seq yes/no verifier).")
@click.option("--bins", type=int, default=10, show_default=True, help="ECE bins (equal width over [0, 1]).")
@click.option("--welch", is_flag=True, help="Welch's t-test instead of Student's for Discriminability.")
@click.option("--limit", type=int, default=None, help="Score only the first N samples of the run.")
@_prompt_option("--qgen-prompt", "Question-generation prompt with {question}, {answer}, {explanation}")
@_prompt_option("--verify-prompt", "Verification prompt with {question}")
@_prompt_option("--paraphrase-prompt", "Paraphrase prompt with {question}, {answer}")
@click.option("--token-env", default=None, metavar="VAR",
              help="Endpoints: the environment variable holding the API token (never the token itself).")
@click.option("--timeout", type=float, default=None, help="Endpoints: seconds per request (retried with backoff).")
@click.option("--retries", type=int, default=None, help="Endpoints: retries on timeouts, 429 and 5xx.")
@click.option("--no-cache", is_flag=True, help="Neither read nor write the cache of judge calls.")
@device_options
@run_options
@click.option("--json", "as_json", is_flag=True, help="Print the run's summary as JSON.")
def vlm_quality_cmd(directory: Path, source_run: str, qgen: str, verifier: str, verifier_mode: str, paraphraser: str,
                    nli: str, bins: int, welch: bool, limit: int | None, qgen_prompt: str | None,
                    verify_prompt: str | None, paraphrase_prompt: str | None, token_env: str | None,
                    timeout: float | None, retries: int | None, no_cache: bool, device: str, precision: str,
                    run_name: str | None, overwrite: bool, as_json: bool) -> None:
    """Visual Fidelity and Contrastiveness of a vlm-explain run's explanations (papers/001); writes runs/<run-name>/."""
    from dataclasses import replace

    from curate.stages.vlm_quality import Judges, VlmQualitySettings, vlm_quality
    from curate.vlm_quality.prompts import JudgePrompts

    overrides = {"qgen": qgen_prompt, "verify": verify_prompt, "paraphrase": paraphrase_prompt}
    prompts = replace(JudgePrompts(), **{k: v for k, v in overrides.items() if v is not None})
    settings = VlmQualitySettings(run=source_run, prompts=prompts, bins=bins, equal_var=not welch, limit=limit,
                                  device="cpu" if device == "auto" else device, precision=precision,
                                  token_env=token_env, timeout=timeout, retries=retries, use_cache=not no_cache)
    judges = Judges(qgen=qgen, verifier=verifier, paraphraser=paraphraser, nli=nli, verifier_mode=verifier_mode)
    with progress() as bar:
        run = vlm_quality(directory, judges, settings, run_name=run_name, overwrite=overwrite,
                          progress=StageProgress(bar))
    if as_json:
        out().print_json(json.dumps({"run_dir": str(run.run_dir), **run.summary}, default=str))
        return
    print_quality(run)
    err().print(f"• run folder: {shown(run.run_dir)} (every question, answer, masked explanation, hypothesis and "
                f"entailment probability in scores.parquet; reliability diagram reliability.png)")


def print_quality(run) -> None:
    """The three tables of a vlm-quality run, each saying what its numbers mean."""
    from curate.runs.vlm_quality import SCORE_LABELS, SCORES

    summary = run.summary
    parts = ("easy", "hard", "all", "correct", "wrong")
    table = Table(title=f"Explanation quality of {run.explainer} ({run.n} samples, in-sample): mean score in [0, 1], "
                        "higher = the explanation is confirmed by the image (VF) / singles out the answer given "
                        "(Contr)", title_justify="left")
    for column in ("score", *parts, "NaN (why)"):
        table.add_column(column, justify="left" if column in ("score", "NaN (why)") else "right")
    for s in SCORES:
        means = run.group_means(s)
        why = ", ".join(f"{k} {v}" for k, v in run.nan_reasons(s).items())
        table.add_row(SCORE_LABELS[s], *(f"{num(means[p]['mean'])} (n={means[p]['n']})" if p in means else "—"
                                         for p in parts), why or "0")
    out().print(table)
    sizes = {len(o) for o in run.scores(["options"]).column("options").to_pylist()}
    if len(sizes) == 1:
        k = sizes.pop()
        out().print(f"Contrastiveness of an explanation that favours no option: 1/{k} = {num(1 / k)}.")
    disc = Table(title=f"Does the score warn of a wrong answer? Disc = mean on correct - mean on wrong (> 0: higher "
                       f"on correct answers), unpaired t-test; ECE over {run.bins} equal-width bins with the score "
                       f"read as P(correct) (0 = calibrated). Accuracy {pct(run.accuracy)}%.", title_justify="left")
    for column in ("score", "Disc", "t", "p", "n correct / wrong", "ECE"):
        disc.add_column(column, justify="left" if column == "score" else "right")
    for s in SCORES:
        d, e = run.discriminability[s], run.ece[s]
        stars = "***" if d["p"] < 0.001 else "**" if d["p"] < 0.01 else "*" if d["p"] < 0.05 else ""
        disc.add_row(SCORE_LABELS[s], num(d["disc"], 3, signed=True) + stars, num(d["t"], 2), num(d["p"], 4),
                     f"{d['n_correct']} / {d['n_wrong']}", num(e["ece"]))
    out().print(disc)
    background = Table(title="Does the explanation name the background? % of explanations naming the sample's own "
                             "background, its class's hard background, any background of the vocabulary",
                       title_justify="left")
    for column in ("samples", "n", "own %", "hard-bg %", "any %"):
        background.add_column(column, justify="left" if column == "samples" else "right")
    for row in (run.background.get("rows") or []):
        background.add_row(row["part"], str(row["n"]), pct(row["own"]), pct(row["hard"]), pct(row["any"]))
    out().print(background)
    verifier = summary.get("verifier") or {}
    masking = summary.get("masking") or {}
    cache = summary.get("cache") or {}
    out().print(f"verifier: {verifier.get('questions', 0)} questions, {verifier.get('yes', 0)} yes, "
                f"{verifier.get('no', 0)} no, {verifier.get('unparsed', 0)} neither (left out of VF, never guessed); "
                f"masking: {masking.get('no_option_mentioned', 0)} of {masking.get('explanations', 0)} explanations "
                f"named no answer option; judge calls: {cache.get('misses', 0)} made, {cache.get('hits', 0)} from "
                "the cache.")
