"""Prompt templates for zero-shot classification (papers/003 §2.1 and App. F).

- ``simple``: the paper's default, ``"A photo of {}."``.
- ``openai``: the 80 templates of OpenAI's ImageNet evaluation, averaged (App. F); taken from
  open_clip's ``OPENAI_IMAGENET_TEMPLATES`` so they match CLIP_benchmark's exactly.
- a file: one template per line, each containing ``{}`` (blank lines and ``#`` comments skipped).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SIMPLE_TEMPLATE = "A photo of {}."


@dataclass(frozen=True)
class PromptSet:
    """A named, ordered tuple of templates; ``name`` goes into cache keys and run configs."""

    name: str
    templates: tuple[str, ...]

    def fill(self, class_name: str) -> list[str]:
        return [t.format(class_name) for t in self.templates]

    def to_config(self) -> dict:
        return {"name": self.name, "templates": list(self.templates)}


def openai_templates() -> tuple[str, ...]:
    """The 80 OpenAI ImageNet templates as format strings (``"a bad photo of a {}."``, ...)."""
    from open_clip import OPENAI_IMAGENET_TEMPLATES

    return tuple(t("{}") for t in OPENAI_IMAGENET_TEMPLATES)


def load_prompts(spec: str | Path) -> PromptSet:
    """``"simple"``, ``"openai"`` or a path to a template file (see module docstring)."""
    if str(spec) == "simple":
        return PromptSet("simple", (SIMPLE_TEMPLATE,))
    if str(spec) == "openai":
        return PromptSet("openai", openai_templates())
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--prompts {spec!r} is neither 'simple', 'openai' nor a template file")
    templates = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.count("{}") != 1:
            raise ValueError(f"{path}:{number}: a template needs exactly one '{{}}' for the class name: {line!r}")
        templates.append(line)
    if not templates:
        raise ValueError(f"{path} holds no templates")
    return PromptSet(f"file:{path.name}", tuple(templates))
