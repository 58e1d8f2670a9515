"""A tiny random LLaVA built locally, saved like a real ``llava-hf`` model (tests, demo, benchmark).

No weights can be downloaded here, so tests, the demo and ``benchmarks/lvlm.py`` build a
LLaVA-1.5-shaped model from configs (``LlavaConfig``: a tiny CLIP vision tower, a two-layer
projector, a tiny Llama language model) with a word-level tokenizer built with the
``tokenizers`` library, a ``LlavaProcessor`` and a chat template in the llava-hf style
(``USER: <image>\\n<question> ASSISTANT:``). Everything is written with ``save_pretrained`` so
it loads through :func:`curate.lvlm.hf.load_hf_lvlm`, the code path of a real model
(docs/design.md#lvlm-scoring).

The vocabulary holds the special tokens, the image token, the chat words, every word of the
default question and answer template, every word of the 1000 ImageNet-1K names
(``curate.labels.imagenet1k``), digits and punctuation, and any ``extra_words``. Words outside
it encode as ``<unk>``.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["build_tiny_llava", "TINY_CHAT_TEMPLATE", "tiny_vocabulary", "TinyLlavaSize"]

from dataclasses import dataclass

IMAGE_TOKEN = "<image>"
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>", IMAGE_TOKEN)

#: llava-hf's LLaVA-1.5 template, with a system message rendered as plain text first.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}"
    "{% else %}{% for c in message['content'] | selectattr('type', 'equalto', 'text') %}{{ c['text'] + ' ' }}"
    "{% endfor %}{% endif %}"
    "{% else %}{{ message['role'].upper() + ': ' }}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}"
    "{% else %}"
    "{% for c in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for c in message['content'] | selectattr('type', 'equalto', 'text') %}{{ c['text'] + ' ' }}{% endfor %}"
    "{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

_CHAT_WORDS = ("USER", "ASSISTANT", "SYSTEM", "user", "assistant", "system")
_PROMPT_TEXT = (
    "What is the main object in the image? A An a an The the photo of this is it Yes yes No no "
    "Describe image in detail Answer with one word because background object animal on shown picture "
    "explanation explain why label correct"
)
_PUNCT = list(".,?!:;'\"-()/&+*%#@[]{}<>|=_~`$^\\")


@dataclass(frozen=True)
class TinyLlavaSize:
    """Widths of the tiny model (the benchmark asks for a bigger text side than the tests)."""

    vision_hidden: int = 32
    vision_layers: int = 2
    vision_heads: int = 2
    patch_size: int = 8
    text_hidden: int = 64
    text_layers: int = 2
    text_heads: int = 4
    text_intermediate: int = 128


def _pre_tokenizer():
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
    ])


def tiny_vocabulary(extra_words: Iterable[str] = ()) -> list[str]:
    """The word list: specials first, then every piece of the prompts, ImageNet names and extras."""
    from curate.labels import imagenet1k

    pre = _pre_tokenizer()
    words: list[str] = list(SPECIALS)
    seen = set(words)

    def add(text: str) -> None:
        for piece, _ in pre.pre_tokenize_str(text.lower()):
            if piece and piece not in seen:
                seen.add(piece)
                words.append(piece)

    for text in (*_CHAT_WORDS, _PROMPT_TEXT, *_PUNCT, *"0123456789", *imagenet1k().names, *extra_words):
        add(text)
    return words


def _tokenizer(extra_words: Iterable[str]):
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(tiny_vocabulary(extra_words))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = _pre_tokenizer()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # joins words with spaces, tidies punctuation
    from tokenizers import processors

    core.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                        special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        extra_special_tokens={"image_token": IMAGE_TOKEN}, padding_side="right",
    ), vocab


def build_tiny_llava(path: Path, *, seed: int = 0, image_size: int = 32, extra_words: Sequence[str] = (),
                     size: TinyLlavaSize | None = None) -> Path:
    """Build a random tiny LLaVA and save model, tokenizer, processor and chat template to ``path``.

    Args:
        path: the folder to write (created; existing files of the same names are replaced).
        seed: torch seed of the random weights (same seed, same weights).
        image_size: the processor's input size (a multiple of the patch size).
        extra_words: more words for the vocabulary (class names of a custom label space, ...).
        size: layer widths and depths (:class:`TinyLlavaSize`).

    Returns:
        ``path``, loadable with :func:`curate.lvlm.hf.load_hf_lvlm`.
    """
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    size = size or TinyLlavaSize()
    if image_size % size.patch_size:
        raise ValueError(f"image_size {image_size} must be a multiple of the patch size {size.patch_size}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer, vocab = _tokenizer(extra_words)
    vision = CLIPVisionConfig(hidden_size=size.vision_hidden, intermediate_size=2 * size.vision_hidden,
                              num_hidden_layers=size.vision_layers, num_attention_heads=size.vision_heads,
                              image_size=image_size, patch_size=size.patch_size, projection_dim=size.vision_hidden)
    text = LlamaConfig(vocab_size=len(vocab), hidden_size=size.text_hidden, intermediate_size=size.text_intermediate,
                       num_hidden_layers=size.text_layers, num_attention_heads=size.text_heads,
                       num_key_value_heads=size.text_heads, max_position_embeddings=512,
                       bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"], pad_token_id=vocab["<pad>"])
    n_patches = (image_size // size.patch_size) ** 2
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=vocab[IMAGE_TOKEN],
                         image_seq_length=n_patches, vision_feature_select_strategy="default",
                         vision_feature_layer=-1)
    config.pad_token_id = vocab["<pad>"]
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    model.generation_config.pad_token_id = vocab["<pad>"]
    model.generation_config.eos_token_id = vocab["</s>"]
    model.generation_config.bos_token_id = vocab["<s>"]
    image_processor = CLIPImageProcessor(size={"shortest_edge": image_size},
                                         crop_size={"height": image_size, "width": image_size},
                                         do_center_crop=True, do_resize=True)
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=size.patch_size,
                               vision_feature_select_strategy="default", chat_template=TINY_CHAT_TEMPLATE,
                               image_token=IMAGE_TOKEN, num_additional_image_tokens=1)  # CLS, dropped as in LLaVA-1.5
    from curate.models.hf_folders import quiet_transformers

    with quiet_transformers():
        model.save_pretrained(path)
        processor.save_pretrained(path)
    (path / "curate_tiny.json").write_text(json.dumps({"seed": seed, "image_size": image_size,
                                                       "size": size.__dict__, "vocab": len(vocab)}) + "\n")
    return path
