"""A tiny random entailment model built locally (tests and the offline demo of ``curate vlm-quality``).

No weights can be downloaded here, so the ``hf:`` path of the NLI role is exercised with a tiny
BERT sequence classifier built from a config (random seeded weights, ``id2label``
contradiction / neutral / entailment) and a word-level tokenizer built with ``tokenizers``
(``[CLS] premise [SEP] hypothesis [SEP]``), saved with ``save_pretrained`` and loaded back through
:func:`curate.vlm_quality.nli.load_nli`, the path a real checkpoint takes. Its probabilities are
random functions of the text: plumbing, not science.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["build_tiny_nli", "NLI_LABELS"]

NLI_LABELS = ("contradiction", "neutral", "entailment")
_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def build_tiny_nli(path: Path, *, seed: int = 0, words: Iterable[str] = (),
                   labels: Sequence[str] = NLI_LABELS) -> Path:
    """Build and save a random tiny BERT entailment classifier to ``path``; returns ``path``.

    ``words``: texts whose lowercase words join the vocabulary (the rest encode as ``[UNK]``).
    ``labels``: the ``id2label`` names (pass names without "entailment" to build a model curate
    must refuse).
    """
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {w: i for i, w in enumerate(_SPECIALS)}
    base = "the a an is in of on with image main object animal photo shows this it <mask> . , ? !"
    for text in (base, *words):
        for w in re.findall(r"\w+|[^\w\s]", str(text).lower()):
            vocab.setdefault(w, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                  pre_tokenizers.Punctuation(behavior="isolated")])
    cls_id, sep_id = vocab["[CLS]"], vocab["[SEP]"]
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                        model_max_length=256)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=256, num_labels=len(labels), initializer_range=0.5,
                        id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
