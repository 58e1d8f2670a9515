"""Interventions on images: keep the object, change the background (docs/design.md#interventions)."""
from __future__ import annotations
