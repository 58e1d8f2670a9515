"""Pins: a person fixes a class's easy and hard backgrounds; pins live in ``dataset.yaml``
(``provenance.split_pins``) and survive re-runs of ``curate split``."""
from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PINS_STAGE", "load_pins", "set_pins"]

PINS_STAGE = "split_pins"


def load_pins(ds) -> dict[int, tuple[str, str]]:
    """Pinned (easy, hard) backgrounds per class, from ``dataset.yaml``."""
    raw = ds.provenance.get(PINS_STAGE) or {}
    return {int(c): (v["easy"], v["hard"]) for c, v in (raw.get("pins") or {}).items()}


def set_pins(ds, add: dict[int, tuple[str, str]] | None = None, remove: Sequence[int] = ()) -> dict[int, tuple[str, str]]:
    """Add/replace and remove pins; backgrounds must be in the vocabulary."""
    pins = load_pins(ds)
    for c, (easy, hard) in (add or {}).items():
        for b in (easy, hard):
            if b not in ds.backgrounds:
                raise ValueError(f"pin for class {c}: background {b!r} is not in the vocabulary {ds.backgrounds}")
        if easy == hard:
            raise ValueError(f"pin for class {c}: easy and hard must differ")
        ds.label_space.name_of(c)
        pins[int(c)] = (easy, hard)
    for c in remove:
        pins.pop(int(c), None)
    ds.record_provenance(PINS_STAGE, {"pins": {str(c): {"easy": e, "hard": h} for c, (e, h) in sorted(pins.items())}})
    return pins
