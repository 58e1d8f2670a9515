"""Tiny random mask models built locally, saved like real Hugging Face folders (tests and the demo).

No weights can be downloaded here, so tests and the demo build CLIPSeg, SAM 3, SAM, SAM 2, OWLv2
and Grounding DINO from their ``transformers`` configs at toy widths (tens to hundreds of thousands
of parameters, 32-128 px inputs), with a word-level tokenizer built with the ``tokenizers``
library. Each builder writes what ``hf download`` of the real model gives: ``config.json``,
``model.safetensors``, the processor's config and the tokenizer files (``save_pretrained`` of
the model and of its processor), so the folders load through
:func:`curate.masks.backends.load_mask_model`, the code path of a real model, plus a
``curate_tiny.json`` with the seed and sizes.

The vocabulary (:func:`tiny_mask_vocabulary`) holds the special tokens, every word of the tiny
LLaVA's vocabulary (prompt words, the 1000 ImageNet-1K names: :func:`curate.lvlm.tiny.tiny_vocabulary`)
and any ``extra_words``. The CLIP-style tokenizer puts ``</s>`` at id 3: CLIP text towers pool at
the first end-of-text token, except that a config whose ``eos_token_id`` is 2 takes the arg-max
token id instead (a transformers legacy rule), so id 2 is avoided. Grounding DINO's tokenizer
places ``[CLS]``, ``[SEP]``, ``.`` and ``?`` at BERT's ids (101, 102, 1012, 1029), because the
model hard-codes those ids to split the text into phrases.

Weights are random (a fixed seed gives the same weights), so the tiny models' masks are noise
until trained (:mod:`curate.masks.train` fine-tunes the tiny CLIPSeg).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from curate.lvlm.tiny import SPECIALS as LLAVA_SPECIALS
from curate.lvlm.tiny import tiny_vocabulary

__all__ = ["TINY_META", "tiny_mask_vocabulary", "tiny_clip_tokenizer", "tiny_bert_tokenizer", "build_tiny_clipseg",
           "build_tiny_sam3", "build_tiny_sam", "build_tiny_sam2", "build_tiny_owlv2", "build_tiny_grounding_dino", "parameter_count"]

#: The file each builder writes beside the model: seed, sizes, parameter count.
TINY_META = "curate_tiny.json"
CLIP_SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
#: CLIP's normalisation (CLIPSeg's and OWLv2's processors use it).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: BERT ids Grounding DINO hard-codes (``SPECIAL_TOKENS`` in its modeling file).
_BERT_FIXED = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]", 1012: ".", 1029: "?"}


def tiny_mask_vocabulary(extra_words: Iterable[str] = ()) -> list[str]:
    """The words (no special tokens): the tiny LLaVA's vocabulary and ``extra_words``, lower case."""
    from curate.collect.synthetic import DEFAULT_CLASSES

    words = [w for w in tiny_vocabulary([*extra_words, *(c.name for c in DEFAULT_CLASSES)])
             if w not in LLAVA_SPECIALS]
    return list(dict.fromkeys(words))


def _pre_tokenizer() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
    ])


def tiny_clip_tokenizer(extra_words: Iterable[str] = (), *, max_length: int = 16) -> tuple[Any, dict[str, int]]:
    """A word-level CLIP-style tokenizer (``<s> words </s>``, pad ``<pad>`` = 0, ``</s>`` = 3) and its vocab."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate([*CLIP_SPECIALS, *tiny_mask_vocabulary(extra_words)])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = _pre_tokenizer()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B </s>", special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                        pad_token="<pad>", padding_side="right", model_max_length=max_length)
    return tokenizer, vocab


def tiny_bert_tokenizer(extra_words: Iterable[str] = (), *, max_length: int = 32) -> tuple[Any, dict[str, int]]:
    """A BERT WordPiece tokenizer whose special tokens sit at BERT's ids (see the module docstring)."""
    from transformers import BertTokenizer

    words = [w for w in tiny_mask_vocabulary(extra_words) if w not in _BERT_FIXED.values()]
    table = [_BERT_FIXED.get(i, f"[unused{i}]") for i in range(104)]  # [PAD], [unused1..99], [UNK], [CLS], ...
    for word in words:
        while len(table) in _BERT_FIXED:
            table.append(_BERT_FIXED[len(table)])
        table.append(word)
    while len(table) <= max(_BERT_FIXED):
        table.append(_BERT_FIXED.get(len(table), f"[unused{len(table)}]"))
    vocab = {w: i for i, w in enumerate(table)}
    return BertTokenizer(vocab=vocab, do_lower_case=True, model_max_length=max_length), vocab


def parameter_count(module: Any) -> int:
    """Number of parameters of a torch module."""
    return int(sum(p.numel() for p in module.parameters()))


def _save(path: Path, model: Any, processor: Any, meta: dict[str, Any]) -> Path:
    from curate.models.hf_folders import quiet_transformers

    path.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(path)
        processor.save_pretrained(path)
    (path / TINY_META).write_text(json.dumps({**meta, "parameters": parameter_count(model)}, sort_keys=True) + "\n")
    return path


def build_tiny_clipseg(path: Path, *, seed: int = 0, size: str = "tiny", image_size: int | None = None,
                       patch_size: int | None = None, extra_words: Sequence[str] = ()) -> Path:
    """A random CLIPSeg (``CLIPSegForImageSegmentation`` + ``CLIPSegProcessor``) in ``path``.

    ``size="tiny"``: CLIP towers of width 32 (vision: 3 layers, ``image_size / patch_size``
    patches a side, default 32 / 4; text: 2 layers), the decoder reading all three vision layers
    at width 16; about 0.1 M parameters. ``size="base"``: the architecture of
    ``CIDAS/clipseg-rd64-refined`` (ViT-B/16 CLIP, 352 px input, decoder width 64 reading layers
    3, 6, 9, the "refined" transposed convolutions) with random weights and the tiny vocabulary
    (126 M parameters; 150 M with CLIP's 49,408-token vocabulary), for timing the real model's
    cost without downloading it.
    """
    import torch
    from transformers import CLIPSegConfig, CLIPSegForImageSegmentation, CLIPSegProcessor, ViTImageProcessor

    if size not in ("tiny", "base"):
        raise ValueError(f"size must be 'tiny' or 'base', got {size!r}")
    base = size == "base"
    image_size = image_size or (352 if base else 32)
    patch_size = patch_size or (16 if base else 4)
    if image_size % patch_size:
        raise ValueError(f"image_size {image_size} must be a multiple of the patch size {patch_size}")
    max_length = 77 if base else 16
    tokenizer, vocab = tiny_clip_tokenizer(extra_words, max_length=max_length)
    ids = {"pad_token_id": vocab["<pad>"], "bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"]}
    if base:  # CIDAS/clipseg-rd64-refined's config.json, but our vocabulary
        text = {"vocab_size": len(vocab), "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
                "num_attention_heads": 8, "max_position_embeddings": max_length, **ids}
        vision = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "image_size": 224, "patch_size": patch_size}
        head = {"projection_dim": 512, "extract_layers": [3, 6, 9], "reduce_dim": 64, "decoder_num_attention_heads": 4,
                "decoder_intermediate_size": 2048, "use_complex_transposed_convolution": True}
        mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    else:
        text = {"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 2, "max_position_embeddings": max_length, **ids}
        vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
                  "image_size": image_size, "patch_size": patch_size}
        head = {"projection_dim": 32, "extract_layers": [0, 1, 2], "reduce_dim": 16, "decoder_num_attention_heads": 2,
                "decoder_intermediate_size": 32}
        mean, std = CLIP_MEAN, CLIP_STD
    torch.manual_seed(seed)
    model = CLIPSegForImageSegmentation(CLIPSegConfig(text_config=text, vision_config=vision, **head)).eval()
    image_processor = ViTImageProcessor(size={"height": image_size, "width": image_size}, image_mean=list(mean),
                                        image_std=list(std))
    processor = CLIPSegProcessor(image_processor=image_processor, tokenizer=tokenizer)
    return _save(Path(path), model, processor, {"model": "clipseg", "size": size, "seed": seed,
                                                "image_size": image_size, "patch_size": patch_size, "vocab": len(vocab)})


def build_tiny_sam3(path: Path, *, seed: int = 0, image_size: int = 56, num_queries: int = 8,
                    extra_words: Sequence[str] = ()) -> Path:
    """A random tiny SAM 3 (``Sam3Model`` + ``Sam3Processor``) in ``path``.

    Width 32 everywhere: a 2-layer ViT (patch 14, ``image_size / 14`` patches a side, windows of
    half that, the last layer global), a 2-level FPN, one-layer text, geometry, DETR encoder and
    decoder (``num_queries`` queries), a 2-stage mask decoder. About 0.25 M parameters.
    """
    import torch
    from transformers import Sam3Config, Sam3ImageProcessor, Sam3Model, Sam3Processor
    from transformers.models.sam3.configuration_sam3 import (
        Sam3DETRDecoderConfig,
        Sam3DETREncoderConfig,
        Sam3GeometryEncoderConfig,
        Sam3MaskDecoderConfig,
        Sam3VisionConfig,
        Sam3ViTConfig,
    )

    patch = 14
    if image_size % patch or (image_size // patch) % 2:
        raise ValueError(f"image_size {image_size} must be an even multiple of the patch size {patch} (e.g. 56)")
    side = image_size // patch
    tokenizer, vocab = tiny_clip_tokenizer(extra_words, max_length=32)  # Sam3Processor pads text to 32 tokens
    backbone = Sam3ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             image_size=image_size, patch_size=patch, window_size=side // 2, global_attn_indexes=[1],
                             pretrain_image_size=image_size)
    vision = Sam3VisionConfig(backbone_config=backbone, fpn_hidden_size=32, scale_factors=[2.0, 1.0],
                              backbone_feature_sizes=[[2 * side, 2 * side], [side, side]])
    text = {"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64, "projection_dim": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32, "hidden_act": "gelu",
            "pad_token_id": vocab["<pad>"], "bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"]}
    config = Sam3Config(
        vision_config=vision, text_config=text,
        geometry_encoder_config=Sam3GeometryEncoderConfig(hidden_size=32, num_layers=1, num_attention_heads=2,
                                                          intermediate_size=64),
        detr_encoder_config=Sam3DETREncoderConfig(hidden_size=32, num_layers=1, num_attention_heads=2,
                                                  intermediate_size=64),
        detr_decoder_config=Sam3DETRDecoderConfig(hidden_size=32, num_layers=1, num_queries=num_queries,
                                                  num_attention_heads=2, intermediate_size=64),
        mask_decoder_config=Sam3MaskDecoderConfig(hidden_size=32, num_upsampling_stages=2, num_attention_heads=2))
    torch.manual_seed(seed)
    model = Sam3Model(config).eval()
    image_processor = Sam3ImageProcessor(size={"height": image_size, "width": image_size},
                                         mask_size={"height": 4 * side, "width": 4 * side})
    processor = Sam3Processor(image_processor=image_processor, tokenizer=tokenizer)
    return _save(Path(path), model, processor, {"model": "sam3", "seed": seed, "image_size": image_size,
                                                "num_queries": num_queries, "vocab": len(vocab)})


def build_tiny_sam(path: Path, *, seed: int = 0, image_size: int = 64, patch_size: int = 8) -> Path:
    """A random tiny SAM (``SamModel`` + ``SamProcessor``; no text) in ``path``.

    A 2-layer ViT of width 32 (windows of 4 patches, the last layer global), prompt encoder and
    2-layer two-way mask decoder of width 32. The vision tower is initialised with std 0.02, not
    SAM's 1e-10 (meant for loading trained weights over it), so random mask logits are not all
    about 0. About 0.08 M parameters.
    """
    import torch
    from transformers import (
        SamConfig,
        SamImageProcessor,
        SamMaskDecoderConfig,
        SamModel,
        SamProcessor,
        SamPromptEncoderConfig,
        SamVisionConfig,
    )

    vision = SamVisionConfig(hidden_size=32, output_channels=32, num_hidden_layers=2, num_attention_heads=2,
                             image_size=image_size, patch_size=patch_size, window_size=4, global_attn_indexes=[1],
                             num_pos_feats=16, mlp_dim=64, initializer_range=0.02)
    prompt = SamPromptEncoderConfig(hidden_size=32, image_size=image_size, patch_size=patch_size, mask_input_channels=4)
    decoder = SamMaskDecoderConfig(hidden_size=32, mlp_dim=64, num_hidden_layers=2, num_attention_heads=2,
                                   iou_head_hidden_dim=32)
    torch.manual_seed(seed)
    model = SamModel(SamConfig(vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder)).eval()
    low = image_size // 2  # SAM's low-resolution masks: 4x the embedding grid
    processor = SamProcessor(image_processor=SamImageProcessor(
        size={"longest_edge": image_size}, pad_size={"height": image_size, "width": image_size},
        mask_size={"longest_edge": low}, mask_pad_size={"height": low, "width": low}))
    return _save(Path(path), model, processor, {"model": "sam", "seed": seed, "image_size": image_size,
                                                "patch_size": patch_size})


def build_tiny_sam2(path: Path, *, seed: int = 0, image_size: int = 64) -> Path:
    """A random tiny SAM 2 (``Sam2Model`` + ``Sam2Processor``; no text) in ``path``.

    A 4-stage Hiera of widths 8-64 (one block a stage, two in the third, whose second is the
    global one: a stage's first block pools its queries and needs a window), an FPN neck, prompt
    encoder and 2-layer mask decoder of width 32. About 0.12 M parameters.
    """
    import torch
    from transformers import Sam2Config, Sam2ImageProcessor, Sam2Model, Sam2Processor
    from transformers.models.sam2.configuration_sam2 import (
        Sam2HieraDetConfig,
        Sam2MaskDecoderConfig,
        Sam2PromptEncoderConfig,
        Sam2VisionConfig,
    )

    if image_size % 32:
        raise ValueError(f"image_size {image_size} must be a multiple of 32 (Hiera's stride)")
    side = image_size
    backbone = Sam2HieraDetConfig(hidden_size=8, num_attention_heads=1, image_size=[side, side],
                                  blocks_per_stage=[1, 1, 2, 1], embed_dim_per_stage=[8, 16, 32, 64],
                                  num_attention_heads_per_stage=[1, 1, 1, 1], window_size_per_stage=[4, 4, 4, 2],
                                  global_attention_blocks=[3], window_positional_embedding_background_size=[4, 4])
    vision = Sam2VisionConfig(backbone_config=backbone, backbone_channel_list=[64, 32, 16, 8],
                              backbone_feature_sizes=[[side // 4] * 2, [side // 8] * 2, [side // 16] * 2],
                              fpn_hidden_size=32)
    prompt = Sam2PromptEncoderConfig(hidden_size=32, image_size=side, patch_size=16, mask_input_channels=4)
    decoder = Sam2MaskDecoderConfig(hidden_size=32, mlp_dim=64, num_hidden_layers=2, num_attention_heads=2,
                                    iou_head_hidden_dim=32)
    torch.manual_seed(seed)
    model = Sam2Model(Sam2Config(vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder)).eval()
    processor = Sam2Processor(image_processor=Sam2ImageProcessor(size={"height": side, "width": side},
                                                                 mask_size={"height": side // 4, "width": side // 4}))
    return _save(Path(path), model, processor, {"model": "sam2", "seed": seed, "image_size": image_size})


def build_tiny_owlv2(path: Path, *, seed: int = 0, image_size: int = 64, patch_size: int = 8,
                     extra_words: Sequence[str] = ()) -> Path:
    """A random tiny OWLv2 (``Owlv2ForObjectDetection`` + ``Owlv2Processor``) in ``path``.

    CLIP towers of width 32 (2 layers each); a box per patch. The class head's learned logit
    shift and scale are set to 0 and 1 (weights and biases 0; the scale is ``elu(0) + 1``), so a
    box's logit is the cosine of its embedding and the query's and random scores stay within
    ``sigmoid([-1, 1]) = [0.27, 0.73]`` instead of saturating (tests need thresholds that pass
    and fail). The box head's last layer is zeroed too, so each patch's box is OWLv2's prior for
    it (the patch's own cell) rather than a random, often empty, box. About 0.09 M parameters.
    """
    import torch
    from transformers import Owlv2Config, Owlv2ForObjectDetection, Owlv2ImageProcessor, Owlv2Processor

    tokenizer, vocab = tiny_clip_tokenizer(extra_words, max_length=16)
    config = Owlv2Config(
        text_config={"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "max_position_embeddings": 16, "pad_token_id": vocab["<pad>"],
                     "bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"]},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": image_size, "patch_size": patch_size},
        projection_dim=32)
    torch.manual_seed(seed)
    model = Owlv2ForObjectDetection(config).eval()
    with torch.no_grad():
        for head in (model.class_head.logit_scale, model.class_head.logit_shift, model.box_head.dense2):
            head.weight.zero_()
            head.bias.zero_()
    processor = Owlv2Processor(image_processor=Owlv2ImageProcessor(size={"height": image_size, "width": image_size}),
                               tokenizer=tokenizer)
    return _save(Path(path), model, processor, {"model": "owlv2", "seed": seed, "image_size": image_size,
                                                "patch_size": patch_size, "vocab": len(vocab)})


def build_tiny_grounding_dino(path: Path, *, seed: int = 0, image_size: int = 128, num_queries: int = 8,
                              extra_words: Sequence[str] = ()) -> Path:
    """A random tiny Grounding DINO (``GroundingDinoForObjectDetection`` + ``GroundingDinoProcessor``).

    Images are resized to ``image_size`` (128: the fourth feature level, at stride 64, must be
    larger than 1x1 for its GroupNorm). A 4-stage Swin of width 8 (window 2; transformers' own
    Swin, no timm), a 1-layer BERT of width
    16, a deformable encoder (1 layer) and decoder (2 layers: transformers ties the box heads of
    the decoder layers and needs two) of width 32, ``num_queries`` queries, 32 text tokens. About
    0.18 M parameters.
    """
    import torch
    from transformers import (
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessor,
        GroundingDinoProcessor,
        SwinConfig,
    )

    tokenizer, vocab = tiny_bert_tokenizer(extra_words, max_length=32)
    swin = SwinConfig(window_size=2, embed_dim=8, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], image_size=image_size,
                      out_indices=[2, 3, 4])
    text = {"model_type": "bert", "vocab_size": len(vocab), "hidden_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}
    config = GroundingDinoConfig(
        d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=num_queries, num_feature_levels=4, encoder_n_points=2,
        decoder_n_points=2, use_timm_backbone=False, backbone_config=swin, max_text_len=32, text_config=text)
    torch.manual_seed(seed)
    model = GroundingDinoForObjectDetection(config).eval()
    image_processor = GroundingDinoImageProcessor(size={"shortest_edge": image_size, "longest_edge": image_size})
    processor = GroundingDinoProcessor(image_processor=image_processor, tokenizer=tokenizer)
    return _save(Path(path), model, processor, {"model": "grounding-dino", "seed": seed, "image_size": image_size,
                                                "num_queries": num_queries, "vocab": len(vocab)})
