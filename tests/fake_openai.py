"""A loopback OpenAI-compatible stand-in server (vLLM-shaped replies) for the LVLM tests.

``FakeOpenAI(lvlm)`` serves ``POST /v1/chat/completions`` and ``GET /v1/models`` on
127.0.0.1 (random port, a daemon thread), backed by an in-process
:class:`curate.lvlm.hf.HFLvlm` (the tiny LLaVA):

- ``prompt_logprobs: k`` -> ``prompt_logprobs`` as vLLM returns it: ``None`` for the first
  prompt token, then per token ``{token_id: {"logprob", "rank", "decoded_token"}}``; the prompt
  is rendered with the model's chat template honouring ``add_generation_prompt`` and
  ``continue_final_message``; ``usage.prompt_tokens`` counts the prompt (image tokens expanded);
- otherwise a greedy completion, or whatever ``chat_handler(messages, body) -> str`` returns
  (issue 16 scripts its chat backend that way; ``messages`` are as sent, images as data URLs).

Fault switches (``server.faults``, consumed one per request, first in first out):
``"timeout"`` (answer after ``slow_seconds``), ``"429"`` (with ``Retry-After: 0``), ``"500"``,
``"502"``, ``"503"``, ``"malformed"`` (a body that is not JSON), ``"no_logprobs"`` (a normal reply
without ``prompt_logprobs``). ``server.no_logprobs = True`` drops them from every reply (a server
without the extension). ``server.requests`` records ``(path, headers, body)`` of every request.
"""
from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from quiet_http import QuietHTTPServer

__all__ = ["FakeOpenAI"]


def _decode_image(url: str):
    from PIL import Image

    head, _, data = url.partition(",")
    if not head.startswith("data:image/") or ";base64" not in head:
        raise ValueError(f"only inline base64 images are served here, got {head[:40]!r}")
    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


def _to_hf(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """OpenAI messages -> transformers chat messages (image parts become ``{"type": "image"}``) and the images."""
    out, images = [], []
    for message in messages:
        content = message.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        hf_parts = []
        for part in parts:
            if part.get("type") == "image_url":
                images.append(_decode_image(part["image_url"]["url"]))
                hf_parts.append({"type": "image"})
            elif part.get("type") == "text":
                hf_parts.append({"type": "text", "text": part["text"]})
        out.append({"role": message["role"], "content": hf_parts})
    return out, images


class FakeOpenAI:
    """The stand-in server; use as a context manager or call :meth:`start` / :meth:`stop`."""

    def __init__(self, lvlm: Any = None, *, model_name: str = "tiny-llava",
                 chat_handler: Callable[[list[dict[str, Any]], dict[str, Any]], str] | None = None,
                 slow_seconds: float = 1.0) -> None:
        self.lvlm = lvlm
        self.model_name = model_name
        self.chat_handler = chat_handler
        self.slow_seconds = slow_seconds
        self.faults: list[str] = []
        self.no_logprobs = False
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start the server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> FakeOpenAI:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:  # noqa: N802
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": owner.model_name, "object": "model", "owned_by": "curate-tests"}]}).encode())
                else:
                    self._send(404, b'{"error": "not found"}')

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._send(400, b'{"error": "bad json"}')
                    return
                with owner._lock:
                    owner.requests.append((self.path, dict(self.headers), body))
                    fault = owner.faults.pop(0) if owner.faults else None
                if fault == "timeout":
                    time.sleep(owner.slow_seconds)
                elif fault in ("429", "500", "502", "503"):
                    self._send(int(fault), b'{"error": "injected"}', {"Retry-After": "0"} if fault == "429" else None)
                    return
                elif fault == "malformed":
                    self._send(200, b'{"choices": [ this is not json')
                    return
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, b'{"error": "not found"}')
                    return
                try:
                    reply = owner.reply(body, drop_logprobs=owner.no_logprobs or fault == "no_logprobs")
                except Exception as error:  # noqa: BLE001 - a server answers 400 to what it cannot serve
                    self._send(400, json.dumps({"error": f"{type(error).__name__}: {error}"}).encode())
                    return
                try:
                    self._send(200, json.dumps(reply).encode())
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- what the server computes
    def reply(self, body: dict[str, Any], *, drop_logprobs: bool = False) -> dict[str, Any]:
        """The vLLM-shaped reply to a chat completion request."""
        messages = body["messages"]
        want_prompt_logprobs = body.get("prompt_logprobs") is not None
        usage: dict[str, int] = {"completion_tokens": 1}
        prompt_logprobs = None
        if self.chat_handler is not None and not want_prompt_logprobs:
            text = self.chat_handler(messages, body)
            usage["prompt_tokens"] = 0
        else:
            text, usage["prompt_tokens"], prompt_logprobs = self._model_reply(body, want_prompt_logprobs)
        reply = {"id": "chatcmpl-fake", "object": "chat.completion", "model": self.model_name,
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                              "finish_reason": "length"}],
                 "usage": {**usage, "total_tokens": usage["prompt_tokens"] + 1}}
        if want_prompt_logprobs and not drop_logprobs:
            reply["prompt_logprobs"] = prompt_logprobs
        return reply

    def _model_reply(self, body: dict[str, Any], want_prompt_logprobs: bool) -> tuple[str, int, Any]:
        import torch

        lvlm = self.lvlm
        hf_messages, images = _to_hf(body["messages"])
        prompt = lvlm.processor.apply_chat_template(
            hf_messages, add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            continue_final_message=bool(body.get("continue_final_message", False)))
        tok = lvlm.processor.tokenizer
        if images:
            inputs = lvlm._prefix_inputs(images, prompt)
        else:
            inputs = {k: v.to(lvlm.device) for k, v in tok([prompt], return_tensors="pt").items()}
        ids = inputs["input_ids"][0]
        entries = None
        if want_prompt_logprobs:
            with torch.no_grad():
                logits = lvlm.module(**inputs).logits[0].float()
            logp = torch.log_softmax(logits, dim=-1)
            entries = [None]
            for pos in range(1, len(ids)):
                token = int(ids[pos])
                value = float(logp[pos - 1, token])
                rank = int((logp[pos - 1] > logp[pos - 1, token]).sum()) + 1
                entries.append({str(token): {"logprob": value, "rank": rank,
                                             "decoded_token": tok.convert_ids_to_tokens(token)}})
        max_tokens = int(body.get("max_tokens") or 16)
        with torch.no_grad():
            out = lvlm.module.generate(**inputs, do_sample=False, max_new_tokens=max_tokens,
                                       pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, len(ids):], skip_special_tokens=True).strip()
        return text, int(len(ids)), entries
