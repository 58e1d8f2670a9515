"""Explanation quality for vision-language models (papers/001): Visual Fidelity, Contrastiveness,
their combinations, and how well a score warns of a wrong answer (Discriminability, ECE).

The two algorithms are plain functions over plain inputs and role callables, usable without a
dataset folder::

    from curate.vlm_quality import visual_fidelity, contrastiveness
    vf = visual_fidelity(explanation, image, question, answer, qgen=..., verifier=...)
    c = contrastiveness(explanation, question, options, answer, paraphraser=..., nli=...)

Modules: ``text`` (whole-word matching, reply parsing), ``visual_fidelity`` (Alg. 1),
``contrastiveness`` (Alg. 2), ``calibration`` (combinations, Discriminability, ECE, reliability
diagram), ``background`` (does an explanation name the background), ``roles`` (endpoint, in-process
LVLM and ``transformers`` NLI roles), ``cache`` (on-disk cache of every role call). The stages are
:mod:`curate.stages.vlm_explain` and :mod:`curate.stages.vlm_quality`. Definitions:
``docs/design.md#explanation-quality``.
"""
from __future__ import annotations

from curate.lazy import lazy_exports

_LAZY = {
    "visual_fidelity": "curate.vlm_quality.visual_fidelity",
    "VisualFidelity": "curate.vlm_quality.visual_fidelity",
    "VerifierReply": "curate.vlm_quality.visual_fidelity",
    "contrastiveness": "curate.vlm_quality.contrastiveness",
    "Contrastiveness": "curate.vlm_quality.contrastiveness",
    "mask_options": "curate.vlm_quality.contrastiveness",
    "combine": "curate.vlm_quality.calibration",
    "discriminability": "curate.vlm_quality.calibration",
    "expected_calibration_error": "curate.vlm_quality.calibration",
    "reliability_png": "curate.vlm_quality.calibration",
    "parse_questions": "curate.vlm_quality.text",
    "parse_yes_no": "curate.vlm_quality.text",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
__all__ = sorted(_LAZY)
