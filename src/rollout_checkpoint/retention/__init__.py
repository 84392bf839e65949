"""Retention: keep the last K published checkpoints and collect everything else crash-safely
(``_gc``; the rules are in its docstring and ``docs/protocol.md``). Layer: above ``format``;
never imports the reader, the coordinator, the server or anything above them."""

from __future__ import annotations

from ._gc import DEFAULT_MIN_AGE_S, LEDGER_SCHEMA_VERSION, GcReport, collect_garbage

__all__ = ["DEFAULT_MIN_AGE_S", "LEDGER_SCHEMA_VERSION", "GcReport", "collect_garbage"]
