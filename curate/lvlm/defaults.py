"""The LVLM prompt defaults (papers/003 App. C.4), in a module that imports nothing heavy.

The CLI's option defaults and :mod:`curate.lvlm.scoring` read them from here, so building the
command line and evaluating a CLIP import neither torch nor transformers; :mod:`curate.lvlm.hf`
re-exports them.
"""
from __future__ import annotations

__all__ = ["DEFAULT_QUESTION", "DEFAULT_ANSWER_TEMPLATE"]

#: The paper's question (papers/003 App. C.4).
DEFAULT_QUESTION = "What is the main object in the image?"
#: The answer scored per candidate label (papers/003 App. C.4: "A <label>").
DEFAULT_ANSWER_TEMPLATE = "A {}."
