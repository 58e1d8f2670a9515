"""LVLMs behind an OpenAI-compatible server: the loopback stand-in (tests/fake_openai.py) runs the tiny LLaVA."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from fake_openai import FakeOpenAI
from PIL import Image

from curate.collect.http import HttpError
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, assign_truth_groups, collect_synthetic
from curate.lvlm.endpoint import EndpointClient, EndpointError, parse_endpoint_name
from curate.lvlm.hf import DEFAULT_QUESTION, load_hf_lvlm
from curate.lvlm.tiny import build_tiny_llava
from curate.store import Dataset

SECRET = "sk-curate-test-4f9c2e"  # a fake token: it must reach the server and nowhere else


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("lvlm-ep") / "tiny", seed=0)


@pytest.fixture(scope="module")
def lvlm(tiny_dir):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_hf_lvlm(tiny_dir)
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def server(lvlm):
    with FakeOpenAI(lvlm, slow_seconds=0.6) as srv:
        yield srv


@pytest.fixture()
def fresh(server):
    server.faults.clear()
    server.no_logprobs = False
    server.requests.clear()
    return server


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(2)]


ANSWERS = [["A tench.", "A great white shark.", "A jack-o'-lantern."], ["A hen.", "A Model T."]]


def client(server, **kwargs) -> EndpointClient:
    kwargs.setdefault("backoff_base", 0.01)
    return EndpointClient(server.base_url, "tiny-llava", **kwargs)


def test_endpoint_losses_equal_the_in_process_losses(fresh, lvlm, images) -> None:
    mean, total = client(fresh).answer_losses(images, DEFAULT_QUESTION, ANSWERS)
    ref_mean, ref_total = lvlm.answer_losses(images, DEFAULT_QUESTION, ANSWERS)
    np.testing.assert_allclose(mean, ref_mean, atol=1e-5, equal_nan=True)
    np.testing.assert_allclose(total, ref_total, atol=1e-4, equal_nan=True)
    body = fresh.requests[-1][2]
    assert body["prompt_logprobs"] == 0 and body["continue_final_message"] is True
    assert body["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")


def test_timeouts_429_and_5xx_are_retried_with_backoff(fresh, images) -> None:
    slept: list[float] = []
    c = client(fresh, timeout=(2.0, 0.3), sleep=slept.append)
    fresh.faults.extend(["timeout", "429", "500", "503"])
    assert isinstance(c.chat([{"role": "user", "content": "hi"}], max_tokens=2), str)
    assert c.http.stats.retries == 4 and c.http.stats.throttled == 1 and len(slept) == 4
    fresh.faults.extend(["502"] * 3)
    with pytest.raises(HttpError, match="HTTP 502 after 3 attempts"):
        client(fresh, retries=2, sleep=lambda s: None).chat([{"role": "user", "content": "hi"}])


def test_malformed_json_and_missing_prompt_logprobs_are_refused_clearly(fresh, images) -> None:
    fresh.faults.append("malformed")
    with pytest.raises(HttpError, match="not JSON"):
        client(fresh).chat([{"role": "user", "content": "hi"}])
    fresh.no_logprobs = True
    with pytest.raises(EndpointError, match="no prompt log-probabilities.*does not fall back"):
        client(fresh).answer_losses(images, DEFAULT_QUESTION, ANSWERS)
    with pytest.raises(ValueError, match="tokenises to nothing"):
        client(fresh).answer_losses(images[:1], DEFAULT_QUESTION, [[" "]])


def test_chat_handler_scripts_the_chat_and_images_travel_inline(images) -> None:
    seen = []

    def handler(messages, body):
        seen.append(messages)
        return "scripted: " + messages[-1]["content"][-1]["text"]

    with FakeOpenAI(None, chat_handler=handler) as srv:
        c = EndpointClient(srv.base_url, "scripted", backoff_base=0.01)
        assert c.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "why?"}],
                      images=images[:1]) == "scripted: why?"
        assert c.generate([None], ["explain"]) == ["scripted: explain"]
    assert seen[0][1]["content"][0]["type"] == "image_url" and seen[0][0]["content"] == "be brief"


def test_endpoint_names_parse_and_a_missing_token_variable_is_named(monkeypatch) -> None:
    assert parse_endpoint_name("http://127.0.0.1:8000/v1#llava") == ("http://127.0.0.1:8000/v1", "llava")
    with pytest.raises(ValueError, match="#MODEL_NAME"):
        parse_endpoint_name("http://127.0.0.1:8000/v1")
    monkeypatch.delenv("CURATE_TEST_NO_TOKEN", raising=False)
    with pytest.raises(EndpointError, match="CURATE_TEST_NO_TOKEN"):
        EndpointClient("http://127.0.0.1:9/v1", "m", token_env="CURATE_TEST_NO_TOKEN")


def test_cli_evaluates_through_an_endpoint_and_the_token_stays_out_of_files_and_logs(
        fresh, tmp_path, monkeypatch, caplog) -> None:
    from curate.cli import main
    from curate.runs import load_run

    classes = DEFAULT_CLASSES[:3]
    root = tmp_path / "world"
    collect_synthetic(root, WorldSpec(classes=classes, per_class=3, image_size=32, seed=5, p=0.34))
    assign_truth_groups(Dataset.open(root))
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"{c.imagenet_index}\n" for c in classes))
    monkeypatch.setenv("CURATE_TEST_TOKEN", SECRET)
    runner = CliRunner(env={"COLUMNS": "250"})
    with caplog.at_level(logging.DEBUG):
        result = runner.invoke(main, ["-vv", "evaluate", str(root), "--model", f"endpoint:{fresh.base_url}#tiny-llava",
                                      "--token-env", "CURATE_TEST_TOKEN", "--label-space", str(labels),
                                      "--bootstrap", "20", "--run-name", "ep"])
    assert result.exit_code == 0, result.output
    assert "endpoint:" in result.output and "paper-qa" in result.output
    assert all(headers.get("Authorization") == f"Bearer {SECRET}" for _, headers, _ in fresh.requests)
    run = load_run(root / "runs" / "ep")
    assert run.family == "lvlm" and run.model["info"]["token_env"] == "CURATE_TEST_TOKEN"
    assert run.candidate_losses().num_rows == 9 * 3
    for path in root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in caplog.text and SECRET not in result.output
    models = runner.invoke(main, ["models"])
    assert models.exit_code == 0 and "endpoint:http://HOST:PORT/v1#NAME" in models.output and "lvlm:PATH" in models.output
