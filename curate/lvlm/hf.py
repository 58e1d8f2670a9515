"""LLaVA-family models through Hugging Face ``transformers``, scored by answer likelihood.

``load_hf_lvlm(path_or_repo)`` loads an image-text-to-text model (``AutoModelForImageTextToText``
with its ``AutoProcessor``; the llava-hf LLaVA-1.5 layout, or any model those Auto classes
load) from a local folder or the local Hugging Face cache; nothing is downloaded.

The score of an answer ``a`` (tokens ``a_1 .. a_n``) for an image ``x`` and question ``q`` is the
language-model loss of the answer given the chat-formatted context (papers/003 App. C.4,
docs/design.md#lvlm-scoring):

```
ctx      = chat_template([user: <image>, q], add_generation_prompt=True)
mean_nll = -(1/n) sum_j log p(a_j | x, ctx, a_<j)        (the paper's "loss"; this ranks)
sum_nll  = -sum_j log p(a_j | x, ctx, a_<j)               (stored beside it)
```

Context tokens are masked out of the loss (``labels = -100``). Two routes compute it:

- :meth:`HFLvlm.answer_losses`: the image-and-question prefix runs once per image (images
  batched; a batch whose prefixes differ in length, for models whose image-token count depends
  on the image size, is split by image size), its key/value cache is copied once per candidate and
  every candidate's answer tokens go through one batched forward against it. The first answer
  token's log-probability comes from the prefix's last position. Out of memory halves the batch
  and goes on.
- :meth:`HFLvlm.answer_losses_naive`: one full forward per (image, candidate) with ``labels``,
  as lmms-eval and most research code do; the reference for tests and ``benchmarks/lvlm.py``.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from curate.engine.base import halving  # re-exported: the chunked halving every model batch uses
from curate.lvlm.defaults import DEFAULT_ANSWER_TEMPLATE, DEFAULT_QUESTION  # re-exported (papers/003 App. C.4)
from curate.models.base import LoadedModel, ModelError, check_precision, resolve_device
from curate.models.hf_folders import precision_dtype, quiet_transformers, resolve_hf_source, weights_fingerprint

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["HFLvlm", "LvlmIdentity", "load_hf_lvlm", "lvlm_identity", "DEFAULT_QUESTION", "DEFAULT_ANSWER_TEMPLATE", "is_oom", "halving"]

log = logging.getLogger(__name__)


def is_oom(error: BaseException) -> bool:
    """Whether ``error`` is a device out-of-memory error (CUDA, MPS or CPU allocator)."""
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


# The folder helpers live in curate.models.hf_folders (shared with the mask proposers); these two
# aliases keep the names curate.lvlm.tiny and curate.lvlm.train still import from here.


class HFLvlm(LoadedModel):
    """A loaded LLaVA-style model: answer losses (two routes) and greedy generation.

    Attributes (beyond :class:`curate.models.base.LoadedModel`): ``processor`` (the
    ``AutoProcessor``), ``revision`` (the cache snapshot's commit, or ``file-<hash>`` for a local
    folder), ``chat_template``, ``batch_size`` (images per prefix forward) and
    ``candidate_batch`` (answer rows per candidate forward); both shrink on out of memory.
    """

    kind = "lvlm"

    def __init__(self, *, module: Any, processor: Any, model_id: str, revision: str, device: Any,
                 precision: str = "fp32", info: dict[str, Any] | None = None, batch_size: int = 8,
                 candidate_batch: int = 160) -> None:
        self.processor = processor
        self.revision = revision
        image_processor = getattr(processor, "image_processor", None)
        crop = getattr(image_processor, "crop_size", None) or getattr(image_processor, "size", None) or {}
        if isinstance(crop, dict):
            side = crop.get("height") or crop.get("shortest_edge") or 336
            image_size = (int(crop.get("height") or side), int(crop.get("width") or side))
        else:
            image_size = (336, 336)
        super().__init__(module=module, model_id=model_id, preprocess=self._pixel_values, image_size=image_size,
                         device=device, precision=precision, tokenizer=processor.tokenizer, cache_safe=True, info=info)
        self.batch_size = batch_size
        self.candidate_batch = candidate_batch
        self._answer_ids: dict[tuple[str, str], list[int]] = {}

    # -- LoadedModel's abstract parts (an LVLM is not scored through embeddings)
    @property
    def embed_dim(self) -> int:
        raise TypeError(f"{self.model_id} is a vision-language model scored by answer likelihood; it has no "
                        "embedding to encode (use answer_losses)")

    def _image_features(self, batch):  # pragma: no cover - guarded by embed_dim's message
        raise TypeError(f"{self.model_id} is scored by answer likelihood (answer_losses), not by image features")

    def _pixel_values(self, image: Image.Image):
        return self.processor.image_processor(image.convert("RGB"), return_tensors="pt")["pixel_values"][0]

    @property
    def chat_template(self) -> str:
        return str(self.processor.chat_template)

    # -- prompts
    def context(self, question: str, *, system: str | None = None, image: bool = True) -> str:
        """The chat-formatted context: ``[system,] user: <image> question``, then the assistant's turn."""
        content: list[dict[str, str]] = [{"type": "image"}] if image else []
        content.append({"type": "text", "text": question})
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": [{"type": "text", "text": system}]})
        messages.append({"role": "user", "content": content})
        return self.processor.apply_chat_template(messages, add_generation_prompt=True)

    @staticmethod
    def separator(context: str) -> str:
        """What joins the context and the answer: a space after ``ASSISTANT:``-style prompts, nothing
        after a template that already ends in whitespace (``...assistant\\n``)."""
        return "" if not context or context[-1].isspace() else " "

    def answer_token_ids(self, context: str, answer: str) -> list[int]:
        """Token ids of ``answer`` as they follow ``context`` (the tokens of ``context + sep + answer``
        beyond those of ``context``; a tokenizer that merges across the boundary falls back to the
        answer encoded alone). Raises ``ValueError`` when the answer tokenises to nothing."""
        key = (context, answer)
        cached = self._answer_ids.get(key)
        if cached is not None:
            return cached
        tok = self.processor.tokenizer
        ctx_ids = tok(context)["input_ids"]
        full_ids = tok(context + self.separator(context) + answer)["input_ids"]
        if full_ids[:len(ctx_ids)] == ctx_ids:
            ids = list(full_ids[len(ctx_ids):])
        else:
            ids = list(tok(self.separator(context) + answer, add_special_tokens=False)["input_ids"])
        if not ids or not answer.strip():
            raise ValueError(f"the answer {answer!r} tokenises to nothing; check the answer template and the "
                             "label names (an empty label?)")
        self._answer_ids[key] = ids
        return ids

    def _prefix_inputs(self, images: Sequence[Image.Image], context: str) -> dict[str, Any]:
        inputs = self.processor(images=[im.convert("RGB") for im in images], text=[context] * len(images),
                                return_tensors="pt")
        return {k: (v.to(self.device, dtype=self.input_dtype) if v.is_floating_point() else v.to(self.device))
                for k, v in inputs.items()}

    # -- the KV-cache route
    def answer_losses(self, images: Sequence[Image.Image], question: str, answers_per_image: Sequence[Sequence[str]],
                      *, system: str | None = None, progress: Callable[[int], None] | None = None,
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and summed answer NLL per (image, candidate), KV-cache route (module docstring).

        Args:
            images: PIL images.
            question: the user's question (chat-formatted with the model's template).
            answers_per_image: per image, the answer texts to score (already formatted, e.g. "A tench.").
            progress: called with the number of images finished after each prefix batch.

        Returns:
            ``(mean_nll, sum_nll)``, float64 arrays ``[N, C_max]`` (NaN where an image has fewer answers).
        """
        context, mean, total = self._loss_arrays(images, question, answers_per_image, system)
        ids = [[self.answer_token_ids(context, a) for a in answers] for answers in answers_per_image]

        def run(batch: Sequence[int]) -> None:
            self._kv_batch([images[i] for i in batch], context, [ids[i] for i in batch], mean, total, batch)
            if progress is not None:
                progress(len(batch))

        self.batch_size = halving(list(range(len(images))), self.batch_size, run, what="prefix batch of images")
        return mean, total

    def _kv_batch(self, images: Sequence[Image.Image], context: str, ids: Sequence[Sequence[list[int]]],
                  mean: np.ndarray, total: np.ndarray, rows: Sequence[int]) -> None:
        import torch
        from transformers import DynamicCache

        try:
            inputs = self._prefix_inputs(images, context)
        except ValueError:  # prefixes of different lengths (image tokens depend on the image size)
            by_size: dict[tuple[int, int], list[int]] = {}
            for k, image in enumerate(images):
                by_size.setdefault(image.size, []).append(k)
            if len(by_size) == 1:
                raise
            for ks in by_size.values():
                self._kv_batch([images[k] for k in ks], context, [ids[k] for k in ks], mean, total, [rows[k] for k in ks])
            return
        with torch.no_grad(), self.autocast():
            out = self.module(**inputs, use_cache=True, logits_to_keep=1)
        first = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # [B, V]
        cache = out.past_key_values
        prefix_mask = inputs["attention_mask"]
        pairs = [(b, c) for b, answers in enumerate(ids) for c in range(len(answers))]
        pad = self.processor.tokenizer.pad_token_id or 0

        def run(chunk: Sequence[tuple[int, int]]) -> None:
            seqs = [ids[b][c] for b, c in chunk]
            length = max(len(s) for s in seqs)
            tokens = torch.full((len(chunk), length), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), length), dtype=torch.long)
            for r, s in enumerate(seqs):
                tokens[r, :len(s)] = torch.tensor(s)
                mask[r, :len(s)] = 1
            tokens, mask = tokens.to(self.device), mask.to(self.device)
            index = torch.tensor([b for b, _ in chunk], device=self.device)
            logp = torch.zeros((len(chunk), length), dtype=torch.float32, device=self.device)
            logp[:, 0] = first[index].gather(1, tokens[:, :1]).squeeze(1)
            if length > 1:
                sub = DynamicCache()
                for layer_idx, layer in enumerate(cache.layers):  # one copy of the prefix per candidate
                    sub.update(layer.keys.index_select(0, index), layer.values.index_select(0, index), layer_idx)
                attention = torch.cat([prefix_mask.index_select(0, index), mask[:, :-1]], dim=1)
                with torch.no_grad(), self.autocast():
                    logits = self.module(input_ids=tokens[:, :-1], attention_mask=attention, past_key_values=sub,
                                         use_cache=True).logits
                logp[:, 1:] = torch.log_softmax(logits.float(), dim=-1).gather(2, tokens[:, 1:, None]).squeeze(2)
            nll = -(logp * mask).sum(dim=1).double().cpu().numpy()
            counts = mask.sum(dim=1).cpu().numpy()
            for r, (b, c) in enumerate(chunk):
                total[rows[b], c] = nll[r]
                mean[rows[b], c] = nll[r] / counts[r]

        self.candidate_batch = halving(pairs, self.candidate_batch, run, what="candidate batch")

    # -- the naive route (reference)
    def _loss_arrays(self, images: Sequence[Any], question: str, answers_per_image: Sequence[Sequence[str]],
                     system: str | None) -> tuple[str, np.ndarray, np.ndarray]:
        """The chat context and the NaN-filled ``(mean, sum)`` arrays ``[N, C_max]`` both loss routes fill."""
        if len(images) != len(answers_per_image):
            raise ValueError(f"{len(images)} images but {len(answers_per_image)} answer lists")
        n_max = max((len(a) for a in answers_per_image), default=0)
        shape = (len(images), n_max)
        return self.context(question, system=system), np.full(shape, np.nan), np.full(shape, np.nan)

    def answer_losses_naive(self, images: Sequence[Image.Image], question: str,
                            answers_per_image: Sequence[Sequence[str]], *, system: str | None = None,
                            ) -> tuple[np.ndarray, np.ndarray]:
        """The same numbers as :meth:`answer_losses`, one full forward per (image, candidate) with
        ``labels = -100`` on the context (the lmms-eval way); ``mean`` is the model's own loss."""
        import torch

        context, mean, total = self._loss_arrays(images, question, answers_per_image, system)
        for i, (image, answers) in enumerate(zip(images, answers_per_image)):
            n_prefix = self._prefix_inputs([image], context)["input_ids"].shape[1]
            for c, answer in enumerate(answers):
                n_answer = len(self.answer_token_ids(context, answer))
                inputs = self._prefix_inputs([image], context + self.separator(context) + answer)
                labels = inputs["input_ids"].clone()
                labels[:, :n_prefix] = -100
                with torch.no_grad(), self.autocast():
                    loss = self.module(**inputs, labels=labels).loss
                mean[i, c] = float(loss)
                total[i, c] = float(loss) * n_answer
        return mean, total

    # -- generation
    def generate(self, images: Sequence[Image.Image | None], prompts: Sequence[str], *, max_new_tokens: int = 64,
                 system: str | None = None) -> list[str]:
        """Greedy answers, one per (image, prompt); an image may be ``None`` (text only)."""
        import torch

        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} images but {len(prompts)} prompts")
        tok = self.processor.tokenizer
        answers: list[str] = []
        for image, prompt in zip(images, prompts):  # one at a time: no padding subtleties, exact greedy
            context = self.context(prompt, system=system, image=image is not None)
            if image is None:
                inputs = {k: v.to(self.device) for k, v in tok([context], return_tensors="pt").items()}
            else:
                inputs = self._prefix_inputs([image], context)
            with torch.no_grad(), self.autocast():
                out = self.module.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens,
                                           pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                                           else tok.eos_token_id)
            answers.append(tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip())
        return answers


def load_hf_lvlm(path_or_repo: str | Path, *, device: Any = "cpu", precision: str = "fp32",
                 batch_size: int = 8, candidate_batch: int = 160) -> HFLvlm:
    """Load a LLaVA-family model offline from a folder or the local Hugging Face cache.

    Raises:
        WeightsNotFoundError: no such folder / not in the cache (the message says where to put it).
        ModelError: the folder does not load, or has no chat template.
    """
    check_precision(precision)
    identity = lvlm_identity(path_or_repo, precision=precision)
    folder, revision = Path(identity.info["folder"]), identity.revision
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch_device = resolve_device(device)
    try:
        with quiet_transformers():
            processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
            module = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True,
                                                                 dtype=precision_dtype(precision))
    except (OSError, ValueError, KeyError) as error:
        raise ModelError(f"{folder} does not load as an image-text-to-text model with transformers: {error}") from None
    if not getattr(processor, "chat_template", None):
        raise ModelError(f"{folder} has no chat template (processor.chat_template is empty): curate builds the "
                         "question with the model's own template; add chat_template.jinja (or chat_template.json) "
                         "from the model's original repository to the folder")
    if getattr(processor, "tokenizer", None) is None or getattr(processor, "image_processor", None) is None:
        raise ModelError(f"{folder}: the processor has no tokenizer or no image processor")
    module = module.to(torch_device).eval()
    info = dict(identity.info, architecture=identity.info["architecture"] or type(module).__name__)
    return HFLvlm(module=module, processor=processor, model_id=identity.model_id, revision=revision,
                  device=torch_device, precision=precision, info=info, batch_size=batch_size,
                  candidate_batch=candidate_batch)


@dataclass(frozen=True)
class LvlmIdentity:
    """What names an LVLM in a run record, known without loading its weights (the Ray engine's
    driver uses it; :func:`load_hf_lvlm` builds its model's id and info from the same function)."""

    model_id: str  # lvlm:<name>:<revision>
    revision: str  # the cache snapshot's commit, or file-<fingerprint> for a local folder
    info: dict[str, Any]
    precision: str = "fp32"
    kind: str = "lvlm"


def lvlm_identity(path_or_repo: str | Path, *, precision: str = "fp32") -> LvlmIdentity:
    """The :class:`LvlmIdentity` of a local folder or cached repo: its config and a fingerprint
    of its weights files (:func:`curate.models.hf_folders.weights_fingerprint`), no weights loaded.

    Raises:
        WeightsNotFoundError: as :func:`load_hf_lvlm`.
    """
    folder, name, revision = resolve_hf_source(path_or_repo, flag="--model lvlm:PATH")
    revision = revision or f"file-{weights_fingerprint(folder)}"
    try:
        architectures = json.loads((folder / "config.json").read_text()).get("architectures") or [None]
    except (OSError, ValueError, AttributeError):
        architectures = [None]
    info = {"backend": "lvlm", "source": str(path_or_repo), "folder": str(folder), "revision": revision,
            "architecture": architectures[0], "dtype": str(precision_dtype(precision)).replace("torch.", "")}
    model_id = f"lvlm:{name}:{revision}"
    return LvlmIdentity(model_id=model_id, revision=revision, info={**info, "model_id": model_id}, precision=precision)


def load_lvlm_backend(request: Any) -> HFLvlm:
    """The ``lvlm`` backend of :mod:`curate.models.registry` (``load_model("lvlm:PATH_OR_REPO")``)."""
    return load_hf_lvlm(request.arch, device=request.device, precision=request.precision)
