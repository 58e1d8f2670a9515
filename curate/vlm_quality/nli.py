"""Entailment models for Contrastiveness (papers/001 Alg. 2 line 5), loaded offline with ``transformers``.

Two kinds, told apart by the checkpoint's config:

- **sequence classification** (``AutoModelForSequenceClassification``: an MNLI-style
  DeBERTa / RoBERTa / BERT): ``Pr(P entails h) = softmax(logits(P, h))[entailment]``, where the
  entailment class is the ``id2label`` entry whose name starts with "entail" (case-insensitive).
  A model without one is refused with the labels it has.
- **seq2seq verifier** (``config.is_encoder_decoder``: a T5-style entailment verifier such as the
  one papers/001 uses): the input is :data:`SEQ2SEQ_TEMPLATE` and
  ``Pr = p(yes) / (p(yes) + p(no))`` from the first decoder step's distribution over the first
  token of "Yes" and of "No".

Nothing is downloaded: a Hub name resolves only from the local Hugging Face cache.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["HFNli", "load_nli", "SEQ2SEQ_TEMPLATE", "entailment_index"]

log = logging.getLogger(__name__)

SEQ2SEQ_TEMPLATE = "Premise: {premise}\nHypothesis: {hypothesis}\nGiven the premise, is the hypothesis correct?\nAnswer:"


def entailment_index(id2label: dict[Any, str], where: str = "the model") -> int:
    """The class index whose label starts with "entail"; ``ValueError`` naming the labels otherwise."""
    labels = {int(k): str(v) for k, v in (id2label or {}).items()}
    hits = [i for i, name in labels.items() if name.strip().casefold().startswith("entail")]
    if len(hits) != 1:
        have = ", ".join(f"{i}: {n!r}" for i, n in sorted(labels.items())) or "none"
        raise ValueError(f"{where} is not an entailment classifier curate can read: its id2label has "
                         f"{'no' if not hits else 'several'} 'entailment' label(s) (labels: {have}); use an NLI "
                         "checkpoint whose config names its entailment class, or fix id2label in its config.json")
    return hits[0]


def _resolve(path_or_repo: str | Path) -> Path:
    path = Path(path_or_repo).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(path_or_repo), local_files_only=True))
    except Exception as error:  # noqa: BLE001 - the hub raises several types; the message says what to do
        raise FileNotFoundError(f"entailment model {path_or_repo!r} is neither a folder nor in the local Hugging "
                                f"Face cache ({type(error).__name__}); download it first (huggingface-cli download "
                                f"{path_or_repo}) or pass hf:/path/to/folder") from None


def _fingerprint(folder: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(folder.glob("*")):
        if f.is_file() and f.suffix in (".safetensors", ".bin", ".json"):
            stat = f.stat()
            digest.update(f"{f.name}:{stat.st_size}".encode())
            if f.suffix == ".json" or stat.st_size < 1 << 20:
                digest.update(f.read_bytes())
    return digest.hexdigest()[:12]


class HFNli:
    """A loaded entailment model: :meth:`entailment` gives ``Pr(premise entails h)`` per hypothesis."""

    def __init__(self, folder: Path, name: str, *, device: str = "cpu", batch_size: int = 32) -> None:
        import torch
        from transformers import AutoConfig, AutoTokenizer

        self.folder, self.batch_size = folder, batch_size
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                                   ("cpu" if device == "auto" else device))
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.seq2seq = bool(getattr(config, "is_encoder_decoder", False))
        if self.seq2seq:
            from transformers import AutoModelForSeq2SeqLM

            self.module = AutoModelForSeq2SeqLM.from_pretrained(folder, local_files_only=True)
            self.yes_id, self.no_id = (self._first_token(w) for w in ("Yes", "No"))
            self.label_index = None
        else:
            from transformers import AutoModelForSequenceClassification

            self.label_index = entailment_index(config.id2label, f"the NLI model {name}")
            self.module = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True)
        self.module = self.module.to(self.device).eval()
        self.model_id = f"hf:{name}:file-{_fingerprint(folder)}"
        self.info = {"kind": "seq2seq" if self.seq2seq else "sequence-classification", "folder": str(folder),
                     "entailment_label": None if self.seq2seq else config.id2label[self.label_index]}

    def _first_token(self, word: str) -> int:
        ids = self.tokenizer(word, add_special_tokens=False)["input_ids"]
        if not ids or ids[0] == self.tokenizer.unk_token_id:
            raise ValueError(f"the seq2seq entailment model's tokenizer cannot encode {word!r}")
        return int(ids[0])

    def entailment(self, premise: str, hypotheses: Sequence[str]) -> list[float]:
        """``Pr(premise entails h)`` for each hypothesis (batches of :attr:`batch_size`)."""
        import torch

        out: list[float] = []
        for start in range(0, len(hypotheses), self.batch_size):
            chunk = list(hypotheses[start:start + self.batch_size])
            with torch.no_grad():
                if self.seq2seq:
                    texts = [SEQ2SEQ_TEMPLATE.format(premise=premise, hypothesis=h) for h in chunk]
                    enc = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True).to(self.device)
                    start_ids = torch.full((len(chunk), 1), self.module.config.decoder_start_token_id,
                                           dtype=torch.long, device=self.device)
                    logits = self.module(**enc, decoder_input_ids=start_ids).logits[:, 0]
                    two = torch.softmax(logits[:, [self.yes_id, self.no_id]].float(), dim=-1)
                    out.extend(two[:, 0].cpu().tolist())
                else:
                    enc = self.tokenizer([premise] * len(chunk), chunk, return_tensors="pt", padding=True,
                                         truncation=True).to(self.device)
                    probs = torch.softmax(self.module(**enc).logits.float(), dim=-1)
                    out.extend(probs[:, self.label_index].cpu().tolist())
        return out

    def __call__(self, premise: str, hypotheses: Sequence[str]) -> list[float]:
        return self.entailment(premise, hypotheses)


def load_nli(path_or_repo: str | Path, *, device: str = "cpu", batch_size: int = 32) -> HFNli:
    """Load an entailment model from a folder or the local HF cache (see the module docstring)."""
    from transformers.utils import logging as tlog

    folder = _resolve(path_or_repo)
    enabled = tlog.is_progress_bar_enabled()
    tlog.disable_progress_bar()  # no "Loading weights" bars on the CLI's stderr
    try:
        return HFNli(folder, str(path_or_repo), device=device, batch_size=batch_size)
    except ValueError:
        raise
    except (OSError, KeyError) as error:
        raise ValueError(f"{folder} does not load as a transformers entailment model: {error}") from None
    finally:
        if enabled:
            tlog.enable_progress_bar()
