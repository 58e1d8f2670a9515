"""Prompts encoded at the batch's longest length equal the full 77-token encoding (exact up
to float rounding: fp32, atol 1e-5), and towers where that is not exact fall back."""
from __future__ import annotations

import copy

import pytest
import torch

from curate.models import load_model
from curate.zeroshot.text_tower import can_trim, encode_text_trimmed, trimmed_length

PROMPTS = ["A photo of tench.", "A photo of great white shark, white shark, man-eater, man-eating shark.",
           "A photo of a.", "A photo of " + "very " * 30 + "long.", "A photo of ox."]


def _full(model, texts):
    with torch.no_grad():
        return model.module.encode_text(model.tokenizer(texts)).float()


@pytest.mark.parametrize("name", ["curate-tiny-vit", "curate-tiny-clip-rn", "curate-tiny-clip", "ViT-B-32"])
def test_trimmed_equals_full_length(name) -> None:
    model = load_model(name, None, seed=0)
    assert can_trim(model.module)
    tokens = model.tokenizer([PROMPTS[0], PROMPTS[2], PROMPTS[4]])
    assert trimmed_length(tokens) < tokens.shape[1]  # the trim does cut something
    with torch.no_grad():
        trimmed = encode_text_trimmed(model.module, tokens)
    torch.testing.assert_close(trimmed, _full(model, [PROMPTS[0], PROMPTS[2], PROMPTS[4]]), atol=1e-5, rtol=0)
    # through the public path: sorted by length, mixed batches, unsorted back
    torch.testing.assert_close(model.encode_text(PROMPTS, normalize=False, batch_size=2), _full(model, PROMPTS),
                               atol=1e-5, rtol=0)


def test_a_non_causal_last_pooled_tower_is_not_trimmed() -> None:
    import open_clip
    from open_clip.factory import _MODEL_CONFIGS

    from curate.models.tiny import TINY_CONFIGS, register_tiny_configs

    register_tiny_configs()
    cfg = copy.deepcopy(TINY_CONFIGS["curate-tiny-vit"])
    cfg["text_cfg"].update({"no_causal_mask": True, "pool_type": "last"})
    _MODEL_CONFIGS["curate-test-noncausal"] = cfg
    try:
        module = open_clip.create_model("curate-test-noncausal", pretrained=None).eval()
        assert not can_trim(module)
        tokens = open_clip.get_tokenizer("curate-test-noncausal")(PROMPTS[:2])
        with torch.no_grad():
            assert torch.equal(encode_text_trimmed(module, tokens), module.encode_text(tokens))
    finally:
        _MODEL_CONFIGS.pop("curate-test-noncausal", None)
