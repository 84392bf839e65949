"""Process-level helpers below every layer: what a bulk operation asks of the interpreter."""

from __future__ import annotations

from ._gc import gc_paused

__all__ = ["gc_paused"]
