"""Zero-shot scoring: prompts, text classifiers, label spaces (1-vs-1000, 1-vs-20), 1-vs-N.

papers/003 §2.1 and App. C/F. Image embeddings come from :mod:`curate.features` (cached); all
label spaces, prompt sets and top-k variants are matrix work on those features.
"""
from curate.zeroshot.classifier import (
    LOGIT_SCALE,
    build_text_classifier,
    cached_text_classifier,
    classifier_key,
    zero_shot_logits,
)
from curate.zeroshot.prompts import SIMPLE_TEMPLATE, PromptSet, load_prompts, openai_templates

__all__ = [
    "LOGIT_SCALE", "SIMPLE_TEMPLATE", "PromptSet", "build_text_classifier", "cached_text_classifier",
    "classifier_key", "load_prompts", "openai_templates", "zero_shot_logits",
]
