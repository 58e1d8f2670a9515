"""Pluggable judges for the explanation-quality scores: which model plays which role.

A *role spec* names a backend:

- ``endpoint:http://HOST:PORT/v1#MODEL``: an OpenAI-compatible chat server (vLLM, TGI, ...)
  through :class:`curate.lvlm.endpoint.EndpointClient` (retries with backoff on 429 / 5xx /
  timeouts; the token only from the environment variable named by ``token_env``);
- ``lvlm:PATH_OR_REPO``: an in-process LLaVA-family model (:func:`curate.lvlm.hf.load_hf_lvlm`),
  greedy generation; as a verifier it can also answer by likelihood, ``P(yes)`` against ``P(no)``;
- ``hf:PATH_OR_REPO``: a local ``transformers`` entailment model (:class:`curate.vlm_quality.nli.HFNli`),
  only for the NLI role.

The role objects are the callables the algorithms take (:func:`curate.vlm_quality.visual_fidelity`,
:func:`curate.vlm_quality.contrastiveness`); every call goes through a :class:`RoleCache` keyed
by (role, model id, full prompt, image key), so a re-run calls nothing and an interrupted run
resumes.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from curate.vlm_quality.cache import RoleCache
from curate.vlm_quality.prompts import JudgePrompts
from curate.vlm_quality.visual_fidelity import VerifierReply

__all__ = ["RoleSpec", "parse_role_spec", "ImageRef", "TextBackend", "EndpointBackend", "LvlmBackend",
           "QuestionGeneratorRole", "VerifierRole", "ParaphraserRole", "NliRole", "BackendPool", "VERIFIER_MODES"]

SCHEMES = ("endpoint", "lvlm", "hf")
VERIFIER_MODES = ("text", "likelihood")


@dataclass(frozen=True)
class RoleSpec:
    """A parsed role spec: ``scheme`` (endpoint | lvlm | hf), ``target`` (URL or path), ``model`` (endpoint)."""

    scheme: str
    target: str
    model: str | None = None

    @property
    def text(self) -> str:
        return f"{self.scheme}:{self.target}" + (f"#{self.model}" if self.model else "")


def parse_role_spec(spec: str, *, allowed: Sequence[str] = SCHEMES, role: str = "role") -> RoleSpec:
    """``endpoint:URL#MODEL`` | ``lvlm:PATH_OR_REPO`` | ``hf:PATH_OR_REPO`` (a clear error otherwise)."""
    text = str(spec or "").strip()
    scheme, sep, rest = text.partition(":")
    if not sep or scheme not in SCHEMES or not rest:
        raise ValueError(f"{role} {spec!r}: expected endpoint:http://HOST:PORT/v1#MODEL, lvlm:PATH_OR_REPO "
                         "or hf:PATH_OR_REPO")
    if scheme not in allowed:
        raise ValueError(f"{role} {spec!r}: a {scheme}: model cannot play this role (allowed: "
                         f"{', '.join(s + ':' for s in allowed)})")
    if scheme == "endpoint":
        url, hash_, model = rest.partition("#")
        if not hash_ or not model.strip():
            raise ValueError(f"{role} {spec!r}: an endpoint needs the served model's name after '#', "
                             "e.g. endpoint:http://127.0.0.1:8000/v1#llava-hf/llava-1.5-7b-hf")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{role} {spec!r}: the endpoint must be an http(s) URL")
        return RoleSpec("endpoint", url.rstrip("/"), model.strip())
    return RoleSpec(scheme, rest)


@dataclass(frozen=True)
class ImageRef:
    """An image the verifier sees: a stable ``key`` (the sample's sha256) and where to read it."""

    key: str
    path: Path | None = None
    image: Any = None  # a PIL image, when already in memory

    def pil(self):
        from PIL import Image

        if self.image is not None:
            return self.image.convert("RGB")
        with Image.open(self.path) as img:
            return img.convert("RGB")

    @classmethod
    def of(cls, value: Any) -> ImageRef:
        """An :class:`ImageRef` from itself, a path, or a PIL image (keyed by a hash of its pixels)."""
        if isinstance(value, ImageRef):
            return value
        if isinstance(value, (str, Path)):
            data = Path(value).read_bytes()
            return cls(hashlib.sha256(data).hexdigest(), Path(value))
        rgb = value.convert("RGB")
        digest = hashlib.sha256(rgb.tobytes() + repr(rgb.size).encode()).hexdigest()
        return cls(digest, None, rgb)


class TextBackend(Protocol):
    """Something that answers a prompt (with an optional image and system message)."""

    model_id: str

    def complete(self, prompt: str, *, system: str | None = None, image: Any = None,
                 max_tokens: int = 256) -> str: ...  # pragma: no cover


class EndpointBackend:
    """An OpenAI-compatible chat server (greedy: temperature 0)."""

    def __init__(self, spec: RoleSpec, *, token_env: str | None = None, timeout: float | None = None,
                 retries: int | None = None, backoff_base: float | None = None) -> None:
        from curate.lvlm.endpoint import EndpointClient

        kwargs: dict[str, Any] = {"token_env": token_env}
        if backoff_base is not None:
            kwargs["backoff_base"] = backoff_base
        if timeout is not None:
            kwargs["timeout"] = timeout
        if retries is not None:
            kwargs["retries"] = retries
        self.client = EndpointClient(spec.target, str(spec.model), **kwargs)
        self.model_id = self.client.model_id  # the served model's name; the URL may change between runs
        self.spec = spec

    def complete(self, prompt: str, *, system: str | None = None, image: Any = None, max_tokens: int = 256) -> str:
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        images = [ImageRef.of(image).pil()] if image is not None else None
        return str(self.client.chat(messages, max_tokens=max_tokens, temperature=0.0, images=images) or "")

    def answer_losses(self, images: Sequence[Any], question: str, answers: Sequence[Sequence[str]], *,
                      system: str | None = None):
        return self.client.answer_losses([ImageRef.of(i).pil() for i in images], question, answers)


class LvlmBackend:
    """An in-process LLaVA-family model (:class:`curate.lvlm.hf.HFLvlm`), greedy generation."""

    def __init__(self, lvlm: Any) -> None:
        self.lvlm = lvlm
        self.model_id = str(lvlm.model_id)

    @classmethod
    def load(cls, spec: RoleSpec, *, device: str = "cpu", precision: str = "fp32") -> LvlmBackend:
        from curate.lvlm.hf import load_hf_lvlm

        return cls(load_hf_lvlm(spec.target, device=device, precision=precision))

    def complete(self, prompt: str, *, system: str | None = None, image: Any = None, max_tokens: int = 256) -> str:
        pil = ImageRef.of(image).pil() if image is not None else None
        return self.lvlm.generate([pil], [prompt], max_new_tokens=max_tokens, system=system)[0]

    def answer_losses(self, images: Sequence[Any], question: str, answers: Sequence[Sequence[str]], *,
                      system: str | None = None):
        return self.lvlm.answer_losses([ImageRef.of(i).pil() for i in images], question, answers, system=system)


@dataclass
class BackendPool:
    """Loads each spec once (a model playing several roles is loaded once)."""

    device: str = "cpu"
    precision: str = "fp32"
    token_env: str | None = None
    timeout: float | None = None
    retries: int | None = None
    backoff_base: float | None = None
    loaded: dict[str, Any] = field(default_factory=dict)

    def text_backend(self, spec: RoleSpec) -> Any:
        if spec.text not in self.loaded:
            if spec.scheme == "endpoint":
                self.loaded[spec.text] = EndpointBackend(spec, token_env=self.token_env, timeout=self.timeout,
                                                         retries=self.retries, backoff_base=self.backoff_base)
            elif spec.scheme == "lvlm":
                self.loaded[spec.text] = LvlmBackend.load(spec, device=self.device, precision=self.precision)
            else:
                raise ValueError(f"{spec.text}: an hf: model is an entailment classifier; it cannot generate text")
        return self.loaded[spec.text]

    def nli(self, spec: RoleSpec) -> Any:
        if spec.text not in self.loaded:
            if spec.scheme != "hf":
                raise ValueError(f"{spec.text}: the entailment model must be hf:PATH_OR_REPO (a transformers "
                                 "sequence-classification or seq2seq model)")
            from curate.vlm_quality.nli import load_nli

            self.loaded[spec.text] = load_nli(spec.target, device=self.device)
        return self.loaded[spec.text]


def _first_line(text: str) -> str:
    for line in str(text or "").splitlines():
        if line.strip():
            return line.strip().strip('"').strip()
    return ""


@dataclass
class QuestionGeneratorRole:
    """``qgen(question, answer, explanation) -> reply`` (papers/001 Alg. 1 line 1), cached."""

    backend: Any
    cache: RoleCache
    template: str = JudgePrompts().qgen
    max_tokens: int = 512
    name: str = "qgen"

    def __call__(self, question: str, answer: str, explanation: str) -> str:
        prompt = self.template.format(question=question, answer=answer, explanation=explanation)
        return str(self.cache.call(self.name, self.backend.model_id, prompt,
                                   lambda: self.backend.complete(prompt, max_tokens=self.max_tokens)) or "")


@dataclass
class VerifierRole:
    """``verifier(image, question) -> VerifierReply`` (papers/001 Alg. 1 line 3), cached per image.

    ``mode="text"`` reads the generated reply as yes / no; ``mode="likelihood"`` (backends with
    ``answer_losses``) gives ``p_yes = exp(-L_yes) / (exp(-L_yes) + exp(-L_no))`` with ``L`` the
    summed answer NLL of ``yes_text`` / ``no_text`` after the prompt.
    """

    backend: Any
    cache: RoleCache
    template: str = JudgePrompts().verify
    mode: str = "text"
    max_tokens: int = 8
    yes_text: str = "Yes"
    no_text: str = "No"
    name: str = "verifier"

    def __post_init__(self) -> None:
        if self.mode not in VERIFIER_MODES:
            raise ValueError(f"verifier mode must be one of {VERIFIER_MODES}, got {self.mode!r}")
        if self.mode == "likelihood" and not hasattr(self.backend, "answer_losses"):
            raise ValueError(f"{self.backend.model_id} cannot score answers by likelihood; use the text verifier")

    def __call__(self, image: Any, question: str) -> VerifierReply:
        ref = ImageRef.of(image)
        prompt = self.template.format(question=question)
        if self.mode == "text":
            text = self.cache.call(self.name, self.backend.model_id, prompt,
                                   lambda: self.backend.complete(prompt, image=ref, max_tokens=self.max_tokens),
                                   image=ref.key)
            return VerifierReply(str(text or ""))

        def score() -> list[float]:
            _, total = self.backend.answer_losses([ref], prompt, [[self.yes_text, self.no_text]])
            return [float(total[0][0]), float(total[0][1])]

        key = {"prompt": prompt, "answers": [self.yes_text, self.no_text], "mode": "likelihood"}
        l_yes, l_no = self.cache.call(self.name, self.backend.model_id, key, score, image=ref.key)
        if not (math.isfinite(l_yes) and math.isfinite(l_no)):
            return VerifierReply("likelihood", float("nan"))
        m = min(l_yes, l_no)
        p_yes = math.exp(m - l_yes) / (math.exp(m - l_yes) + math.exp(m - l_no))
        return VerifierReply(f"P(yes)={p_yes:.4f}", p_yes)


@dataclass
class ParaphraserRole:
    """``paraphraser(question, option) -> hypothesis`` (papers/001 Alg. 2 line 3): the reply's first
    non-empty line, cached (the same (question, option) is paraphrased once for every sample)."""

    backend: Any
    cache: RoleCache
    template: str = JudgePrompts().paraphrase
    max_tokens: int = 64
    name: str = "paraphraser"

    def __call__(self, question: str, option: str) -> str:
        prompt = self.template.format(question=question, answer=option)
        reply = self.cache.call(self.name, self.backend.model_id, prompt,
                                lambda: self.backend.complete(prompt, max_tokens=self.max_tokens))
        return _first_line(reply)


@dataclass
class NliRole:
    """``nli(premise, hypotheses) -> [Pr(premise entails h)]`` (papers/001 Alg. 2 line 5), cached per pair;
    only the pairs not in the cache go to the model, in one batch."""

    model: Any
    cache: RoleCache
    name: str = "nli"

    def __call__(self, premise: str, hypotheses: Sequence[str]) -> list[float]:
        out: list[float | None] = []
        todo: list[int] = []
        for i, h in enumerate(hypotheses):
            found, value = self.cache.get(self.name, self.model.model_id, [premise, h])
            out.append(float(value) if found else None)
            if not found:
                todo.append(i)
        if todo:
            probs = self.model.entailment(premise, [hypotheses[i] for i in todo])
            for i, p in zip(todo, probs):
                out[i] = float(p)
                self.cache.put(self.name, self.model.model_id, [premise, hypotheses[i]], float(p))
        return [float(p) for p in out]  # type: ignore[arg-type]
