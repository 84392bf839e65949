"""Where every object of a checkpoint lives, relative to the store root.

This module is the single source of object keys (``docs/format.md`` describes the same layout
as a spec). Every id that becomes part of a key is validated here.

::

    latest.json                                              pointer (compare-and-swap)
    published/<checkpoint_id>.json                           global checkpoint record (commit point)
    sequence/<20-digit sequence>.json                        sequence claim (create-only, names a record)
    checkpoints/<checkpoint_id>/aggregate.json               aggregate manifest
    checkpoints/<checkpoint_id>/components/<kind>/<instance>/manifest.json
    checkpoints/<checkpoint_id>/components/<kind>/<instance>/index-<writer_id>.parquet
    checkpoints/<checkpoint_id>/components/<kind>/<instance>/shards/<writer_id>-<seq>.parquet
    checkpoints/<checkpoint_id>/components/<kind>/<instance>/parts/<part_id>/...   a part (worker)
    tokens/...                                               reference token store
    gc/leftovers.json                                        retention's ledger of unpublished prefixes
"""

from __future__ import annotations

from ..archive._names import MANIFEST_NAME, PARTS_DIR, part_prefix
from ..ids import validate_id

__all__ = [
    "AGGREGATE_NAME",
    "CHECKPOINTS_PREFIX",
    "GC_LEDGER_KEY",
    "LATEST_KEY",
    "MANIFEST_NAME",
    "PARTS_DIR",
    "PUBLISHED_PREFIX",
    "SEQUENCE_PREFIX",
    "TOKENS_PREFIX",
    "aggregate_key",
    "checkpoint_prefix",
    "component_part_prefix",
    "component_prefix",
    "published_key",
    "sequence_key",
    "sequence_of_key",
]

LATEST_KEY = "latest.json"
PUBLISHED_PREFIX = "published/"
SEQUENCE_PREFIX = "sequence/"
SEQUENCE_DIGITS = 20
CHECKPOINTS_PREFIX = "checkpoints/"
TOKENS_PREFIX = "tokens"
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


def component_part_prefix(checkpoint_id: str, kind: str, instance: str, part_id: str) -> str:
    """A part of a component archive: an archive of its own, written by one worker of a worker
    group, that the component's manifest refers to (``docs/format.md``, "Parts")."""
    return part_prefix(component_prefix(checkpoint_id, kind, instance), validate_id(part_id, "part id"))


def sequence_key(sequence: int) -> str:
    """``sequence/<n>.json`` with ``n`` zero-padded to 20 digits, so keys sort by sequence."""
    if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 1:
        raise ValueError(f"sequence must be a positive integer, got {sequence!r}")
    return f"{SEQUENCE_PREFIX}{sequence:0{SEQUENCE_DIGITS}d}.json"


def sequence_of_key(key: str) -> int | None:
    """The sequence a ``sequence/<n>.json`` key names, ``None`` for any other key."""
    if not key.startswith(SEQUENCE_PREFIX) or not key.endswith(".json"):
        return None
    digits = key[len(SEQUENCE_PREFIX) : -len(".json")]
    if len(digits) != SEQUENCE_DIGITS or not digits.isdigit() or int(digits) < 1:
        return None
    return int(digits)
