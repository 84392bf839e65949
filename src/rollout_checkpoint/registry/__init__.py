"""The framework's live-execution registry (its dispatch ledger) and the registry component it
writes into every checkpoint. Layer: beside ``participants``, above ``tokens``/``protocol``;
never imports participants, the reader, the coordinator or anything above them."""

from __future__ import annotations

from ._entries import REGISTRY_INSTANCE, REGISTRY_KIND, ExecutionInfo, RegistryEntry
from ._live import LiveExecutionRegistry

__all__ = ["REGISTRY_INSTANCE", "REGISTRY_KIND", "ExecutionInfo", "LiveExecutionRegistry", "RegistryEntry"]
