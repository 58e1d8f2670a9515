"""Discovering backgrounds nobody listed (curate discover; docs/design.md#discover)."""
