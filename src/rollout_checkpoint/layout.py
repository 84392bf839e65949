"""Where every object of a checkpoint lives, relative to the store root.

This module is the single source of object keys (``docs/format.md`` describes the same layout
as a spec). Every id that becomes part of a key is validated here.

::

    latest.json                                              pointer (compare-and-swap)
    published/<checkpoint_id>.json                           global checkpoint record (commit point)
    checkpoints/<checkpoint_id>/aggregate.json               aggregate manifest
    checkpoints/<checkpoint_id>/components/<kind>/<instance>/manifest.json
    checkpoints/<checkpoint_id>/components/<kind>/<instance>/index-<writer_id>.parquet
    checkpoints/<checkpoint_id>/components/<kind>/<instance>/shards/<writer_id>-<seq>.parquet
    tokens/...                                               reference token store
    gc/leftovers.json                                        retention's ledger of unpublished prefixes
"""

from __future__ import annotations

from .ids import validate_id

__all__ = [
    "AGGREGATE_NAME",
    "CHECKPOINTS_PREFIX",
    "GC_LEDGER_KEY",
    "LATEST_KEY",
    "MANIFEST_NAME",
    "PUBLISHED_PREFIX",
    "TOKENS_PREFIX",
    "aggregate_key",
    "checkpoint_prefix",
    "component_prefix",
    "published_key",
]

LATEST_KEY = "latest.json"
PUBLISHED_PREFIX = "published/"
CHECKPOINTS_PREFIX = "checkpoints/"
TOKENS_PREFIX = "tokens"
MANIFEST_NAME = "manifest.json"
AGGREGATE_NAME = "aggregate.json"
GC_LEDGER_KEY = "gc/leftovers.json"


def published_key(checkpoint_id: str) -> str:
    return f"{PUBLISHED_PREFIX}{validate_id(checkpoint_id, 'checkpoint_id')}.json"


def checkpoint_prefix(checkpoint_id: str) -> str:
    return f"{CHECKPOINTS_PREFIX}{validate_id(checkpoint_id, 'checkpoint_id')}"


def aggregate_key(checkpoint_id: str) -> str:
    return f"{checkpoint_prefix(checkpoint_id)}/{AGGREGATE_NAME}"


def component_prefix(checkpoint_id: str, kind: str, instance: str) -> str:
    return (
        f"{checkpoint_prefix(checkpoint_id)}/components/"
        f"{validate_id(kind, 'participant kind')}/{validate_id(instance, 'instance')}"
    )
