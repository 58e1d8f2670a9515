"""LVLMs behind an OpenAI-compatible server (vLLM), scored by prompt log-probabilities.

``EndpointClient(base_url, model)`` speaks the OpenAI chat API. The answer loss of papers/003
App. C.4 (docs/design.md#lvlm-scoring) needs the log-probabilities of the *prompt's* answer
tokens, which only servers with vLLM's ``prompt_logprobs`` extension return. For each image
and candidate the client sends ``[user: image + question, assistant: answer]`` with
``continue_final_message`` (the prompt then ends with the answer) and ``prompt_logprobs: 0``;
for each image it also sends the context alone (``add_generation_prompt``) and reads its
``usage.prompt_tokens``. The answer's tokens are the last ``n = len(prompt_logprobs) - n_ctx``
positions, and

```
mean_nll = -(1/n) sum_{j > n_ctx} logprob_j        sum_nll = -sum_{j > n_ctx} logprob_j
```

exactly the in-process numbers of :class:`curate.lvlm.hf.HFLvlm` when the server runs the same
model. A server that returns no prompt log-probabilities is refused (never a silent first-token
approximation). Requests go through :class:`curate.collect.http.PoliteClient` (retries with
backoff on timeouts, 429 honouring ``Retry-After``, 5xx). The API token is read from the
environment variable named by ``token_env`` at each request and is never stored, logged or
recorded.
"""
from __future__ import annotations

import base64
import io
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from curate.collect.http import HttpError, PoliteClient, RetryPolicy, check_url
from curate.models.base import ModelError

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["EndpointClient", "EndpointError", "HttpError", "parse_endpoint_name", "image_data_url"]

log = logging.getLogger(__name__)


class EndpointError(ModelError):
    """A server reply curate cannot use (no prompt log-probs, wrong shape, missing token variable)."""


def parse_endpoint_name(text: str) -> tuple[str, str]:
    """``"http://HOST:PORT/v1#NAME"`` -> ``(base_url, model_name)``."""
    base, sep, name = text.partition("#")
    if not sep or not name.strip():
        raise ValueError(f"an endpoint model is written endpoint:http://HOST:PORT/v1#MODEL_NAME, got {text!r} "
                         "(the part after '#' names the served model)")
    return check_url(base.rstrip("/")), name.strip()


def image_data_url(image: Image.Image) -> str:
    """A PNG ``data:`` URL of ``image`` (how OpenAI-compatible servers take inline images)."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class EndpointClient:
    """An LVLM served over the OpenAI-compatible API (see the module docstring).

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (a parameter; never hard-coded).
        model: the served model name (``--served-model-name`` of vLLM).
        token_env: the environment variable holding the API token (None: no token sent).
        timeout: seconds (connect, read) per request.
        retries: retries after the first attempt on timeouts, 429 and 5xx.
        backoff_base: first backoff in seconds (doubles per retry, capped at 60 s).
        workers: concurrent requests.
        sleep: injectable for tests.
    """

    kind = "lvlm"
    device = "remote"
    cache_safe = False

    def __init__(self, base_url: str, model: str, *, token_env: str | None = None,
                 timeout: float | tuple[float, float] = (10.0, 300.0), retries: int = 4, backoff_base: float = 1.0,
                 workers: int = 4, sleep: Callable[[float], None] | None = None) -> None:
        self.base_url = check_url(base_url.rstrip("/"))
        self.model = model
        self.token_env = token_env
        self.workers = max(1, int(workers))
        if token_env is not None:
            self._token()  # fail now, naming the variable, when it is unset
        kwargs: dict[str, Any] = {} if sleep is None else {"sleep": sleep}
        self.http = PoliteClient(api_limits="none", download_limits="none", byte_limits="none",
                                 retry=RetryPolicy(max_attempts=int(retries) + 1, backoff_base=backoff_base),
                                 timeout=timeout, pool_size=max(4, self.workers), **kwargs)
        self.model_id = f"endpoint:{model}"
        self.revision = "served"
        self.info: dict[str, Any] = {"backend": "endpoint", "base_url": self.base_url, "model": model,
                                     "revision": self.revision,
                                     "token_env": token_env, "model_id": self.model_id,
                                     "logprobs": "vLLM prompt_logprobs on /chat/completions"}

    # -- plumbing
    def _token(self) -> str | None:
        if self.token_env is None:
            return None
        value = os.environ.get(self.token_env)
        if not value:
            raise EndpointError(f"the environment variable {self.token_env} (named by --token-env) is not set; "
                                "export the API token in it")
        return value

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        token = self._token()
        headers = {"Authorization": f"Bearer {token}"} if token else None
        reply = self.http.post_json(f"{self.base_url}/{path}", body, headers=headers)
        if not isinstance(reply, dict):
            raise EndpointError(f"{self.base_url}/{path} answered with {type(reply).__name__}, not a JSON object")
        if "error" in reply and "choices" not in reply:
            raise EndpointError(f"{self.base_url}/{path}: the server says {str(reply['error'])[:300]}")
        return reply

    @staticmethod
    def _user(question: str, image: Image.Image | None) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if image is not None:
            content.append({"type": "image_url", "image_url": {"url": image_data_url(image)}})
        content.append({"type": "text", "text": question})
        return {"role": "user", "content": content}

    def _context_tokens(self, messages: list[dict[str, Any]]) -> int:
        reply = self._post("chat/completions", {"model": self.model, "messages": messages, "max_tokens": 1,
                                                "temperature": 0.0, "add_generation_prompt": True})
        try:
            return int(reply["usage"]["prompt_tokens"])
        except (KeyError, TypeError, ValueError):
            raise EndpointError(f"{self.base_url}: the reply has no usage.prompt_tokens; curate needs it to find "
                                "where the answer starts") from None

    def _answer_logprobs(self, messages: list[dict[str, Any]], answer: str) -> list[float]:
        body = {"model": self.model, "messages": [*messages, {"role": "assistant", "content": answer}],
                "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "add_generation_prompt": False,
                "continue_final_message": True}
        reply = self._post("chat/completions", body)
        entries = reply.get("prompt_logprobs")
        if not isinstance(entries, list) or not any(e for e in entries):
            raise EndpointError(
                f"{self.base_url} returned no prompt log-probabilities (no 'prompt_logprobs' in the reply): the "
                "answer-likelihood protocol needs them; serve the model with vLLM (its chat API returns them on "
                "request). curate does not fall back to a first-token approximation")
        values: list[float] = []
        for entry in entries:
            if entry is None:
                values.append(float("nan"))
                continue
            if not isinstance(entry, dict) or len(entry) != 1:
                raise EndpointError(f"{self.base_url}: a prompt_logprobs entry has {len(entry) if isinstance(entry, dict) else 'no'} "
                                    "tokens; curate asks for prompt_logprobs=0 and expects exactly the prompt token")
            (only,) = entry.values()
            try:
                values.append(float(only["logprob"] if isinstance(only, dict) else only))
            except (KeyError, TypeError, ValueError):
                raise EndpointError(f"{self.base_url}: a prompt_logprobs entry has no number: {str(only)[:100]}") from None
        return values

    # -- scoring
    def answer_losses(self, images: Sequence[Image.Image], question: str, answers_per_image: Sequence[Sequence[str]],
                      *, system: str | None = None, progress: Callable[[int], None] | None = None,
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and summed answer NLL per (image, candidate) from the server's prompt log-probs.

        Same contract as :meth:`curate.lvlm.hf.HFLvlm.answer_losses`: float64 ``[N, C_max]``,
        NaN where an image has fewer answers; an answer that is empty, or that adds no token
        to the prompt, raises ``ValueError``.
        """
        if len(images) != len(answers_per_image):
            raise ValueError(f"{len(images)} images but {len(answers_per_image)} answer lists")
        for answers in answers_per_image:
            for answer in answers:
                if not answer.strip():
                    raise ValueError(f"the answer {answer!r} tokenises to nothing; check the answer template and "
                                     "the label names (an empty label?)")
        n_max = max((len(a) for a in answers_per_image), default=0)
        mean = np.full((len(images), n_max), np.nan)
        total = np.full((len(images), n_max), np.nan)

        def one_image(i: int) -> None:
            messages = ([{"role": "system", "content": system}] if system else []) + [self._user(question, images[i])]
            n_ctx = self._context_tokens(messages)
            for c, answer in enumerate(answers_per_image[i]):
                values = self._answer_logprobs(messages, answer)
                n_answer = len(values) - n_ctx
                if n_answer <= 0:
                    raise ValueError(f"the answer {answer!r} adds no token to the prompt; check the answer template")
                tail = np.asarray(values[n_ctx:], dtype=np.float64)
                if not np.isfinite(tail).all():
                    raise EndpointError(f"{self.base_url}: non-finite prompt log-probabilities for {answer!r}")
                total[i, c] = -tail.sum()
                mean[i, c] = total[i, c] / n_answer
            if progress is not None:
                progress(1)

        with ThreadPoolExecutor(self.workers) as pool:
            for future in [pool.submit(one_image, i) for i in range(len(images))]:
                future.result()
        return mean, total

    # -- chat
    def chat(self, messages: Sequence[dict[str, Any]], *, max_tokens: int = 256, temperature: float = 0.0,
             images: Sequence[Image.Image] | None = None) -> str:
        """The assistant's reply to ``messages`` (``[{"role", "content"}]``); ``images`` are put before
        the text of the last user message as inline PNGs."""
        sent = [dict(m) for m in messages]
        if images:
            last = max((i for i, m in enumerate(sent) if m.get("role") == "user"), default=None)
            if last is None:
                raise ValueError("images need a user message to go with")
            content = sent[last].get("content")
            parts = list(content) if isinstance(content, list) else [{"type": "text", "text": str(content or "")}]
            sent[last]["content"] = [{"type": "image_url", "image_url": {"url": image_data_url(im)}}
                                     for im in images] + parts
        reply = self._post("chat/completions", {"model": self.model, "messages": sent, "max_tokens": int(max_tokens),
                                                "temperature": float(temperature)})
        try:
            text = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"{self.base_url}: the reply has no choices[0].message.content") from None
        if not isinstance(text, str):
            raise EndpointError(f"{self.base_url}: choices[0].message.content is {type(text).__name__}, not text")
        return text

    def generate(self, images: Sequence[Image.Image | None], prompts: Sequence[str], *, max_new_tokens: int = 64,
                 system: str | None = None) -> list[str]:
        """Greedy answers, one per (image, prompt), like :meth:`curate.lvlm.hf.HFLvlm.generate`."""
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} images but {len(prompts)} prompts")

        def one(pair: tuple[Image.Image | None, str]) -> str:
            image, prompt = pair
            messages = ([{"role": "system", "content": system}] if system else []) + [self._user(prompt, image)]
            return self.chat(messages, max_tokens=max_new_tokens).strip()

        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(one, zip(images, prompts)))

    def close(self) -> None:
        self.http.close()

    def __repr__(self) -> str:
        return f"EndpointClient(base_url={self.base_url!r}, model={self.model!r}, token_env={self.token_env!r})"


def load_endpoint_backend(request: Any) -> EndpointClient:
    """The ``endpoint`` backend of :mod:`curate.models.registry`
    (``load_model("endpoint:http://HOST:PORT/v1#NAME")``; no token: use :class:`EndpointClient`
    or ``curate evaluate --token-env`` for a server that needs one)."""
    base, name = parse_endpoint_name(request.arch)
    return EndpointClient(base, name)

