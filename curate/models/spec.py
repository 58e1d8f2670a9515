"""What a user names when they name a model: :class:`ModelSpec`.

Every stage takes a model as a :class:`ModelSpec` (or an already loaded model); the CLI builds
specs once, at its edge, from ``--model`` / ``--pretrained``. Loading is
:func:`curate.models.load_model`'s job.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ModelSpec", "FAMILIES", "family_of_kind", "parse_pretrained", "specs_from_cli"]

#: Model families; effective robustness is fitted within one family (papers/003 Fig. 2).
FAMILIES = ("clip", "classifier", "lvlm")
_WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


def family_of_kind(kind: str) -> str:
    """The family of a loaded model's ``kind`` (``clip``, ``classifier``, ``lvlm``)."""
    if kind not in FAMILIES:
        raise ValueError(f"unknown model kind {kind!r}; families are {', '.join(FAMILIES)}")
    return kind


def parse_pretrained(text: str | None) -> str | None:
    """``--pretrained`` text: ``None`` for empty or ``none`` (random weights), else the tag or file."""
    return None if (text or "").strip().lower() in ("", "none") else text


@dataclass(frozen=True)
class ModelSpec:
    """A model to load: a name (open_clip arch, zoo name, ``timm:<name>``, ``auto``) and weights."""

    name: str
    pretrained: str | None = None

    @property
    def label(self) -> str:
        """``name:tag`` (a weights file shows as its file name; ``auto`` shows only the file)."""
        if not self.pretrained:
            return self.name
        looks_like_file = "/" in self.pretrained or self.pretrained.endswith(_WEIGHT_SUFFIXES)
        weights = Path(self.pretrained).name if looks_like_file else self.pretrained
        return weights if self.name in ("auto", "") else f"{self.name}:{weights}"

    def to_dict(self) -> dict[str, str | None]:
        return {"name": self.name, "pretrained": self.pretrained}

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        return cls(str(data["name"]), data.get("pretrained"))


def specs_from_cli(models: Sequence[str], pretrained: Sequence[str], *, option: str = "--pretrained") -> list[ModelSpec]:
    """One spec per ``--model``; ``pretrained`` is empty or has one entry per model."""
    if pretrained and len(pretrained) != len(models):
        raise ValueError(f"give one {option} per --model ({len(models)} models, {len(pretrained)} weights)")
    tags = [parse_pretrained(p) for p in pretrained] if pretrained else [None] * len(models)
    return [ModelSpec(m, t) for m, t in zip(models, tags)]
