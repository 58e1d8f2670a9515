"""Large vision-language models (LLaVA-style) scored by answer likelihood (papers/003 App. C.4).

>>> from curate.lvlm import load_hf_lvlm, build_tiny_llava
>>> lvlm = load_hf_lvlm(build_tiny_llava("tiny-llava/"))            # or a llava-hf folder / cached repo
>>> mean, total = lvlm.answer_losses(images, "What is the main object in the image?",
...                                  [["A tench.", "A goldfish."]] * len(images))
>>> mean.argmin(axis=1)                                               # the prediction: lowest loss

Modules: :mod:`.hf` (transformers models: KV-cache and naive scoring, generation), :mod:`.endpoint`
(an OpenAI-compatible server's prompt log-probabilities, chat), :mod:`.scoring` (the evaluate
stage's LVLM branch), :mod:`.tiny` (a tiny random LLaVA saved like a real one), :mod:`.train`
(fine-tuning it on a synthetic world). Definitions: docs/design.md#lvlm-scoring.

Importing this package does not import torch or transformers.
"""
from __future__ import annotations

from curate.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "HFLvlm": "curate.lvlm.hf",
    "load_hf_lvlm": "curate.lvlm.hf",
    "DEFAULT_QUESTION": "curate.lvlm.defaults",
    "DEFAULT_ANSWER_TEMPLATE": "curate.lvlm.defaults",
    "EndpointClient": "curate.lvlm.endpoint",
    "EndpointError": "curate.lvlm.endpoint",
    "build_tiny_llava": "curate.lvlm.tiny",
    "TinyLlavaSize": "curate.lvlm.tiny",
    "lvlm_scores": "curate.lvlm.scoring",
})
