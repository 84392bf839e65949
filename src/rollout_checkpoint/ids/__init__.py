"""Identifiers that become parts of object keys, and the execution identity of a rollout.

A base package every layer imports; it imports only ``errors``. The checks (``validate_id``,
``validate_key``) load without pydantic, so the store and the archive write path stay light;
the pydantic types (``Identifier``, ``CheckpointId``, ``ExecutionId``) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from ._keys import ID_MAX_LENGTH, ID_PATTERN, validate_id, validate_key

if TYPE_CHECKING:
    from ._compact import (
        LazyExecutions,
        PackedExecutions,
        check_packed,
        check_packed_text,
        checked_pairs,
        execution_ids,
        pack_executions,
        pack_text,
        unpack_executions,
    )
    from ._models import CheckpointId, ExecutionId, Identifier
    from ._scope_memo import ScopeMemo

__getattr__ = lazy_getattr(
    __name__,
    {
        **dict.fromkeys(("CheckpointId", "ExecutionId", "Identifier"), "._models"),
        "ScopeMemo": "._scope_memo",
        **dict.fromkeys(
            (
                "LazyExecutions",
                "PackedExecutions",
                "check_packed",
                "check_packed_text",
                "checked_pairs",
                "execution_ids",
                "pack_executions",
                "pack_text",
                "unpack_executions",
            ),
            "._compact",
        ),
    },
)

__all__ = [
    "ID_MAX_LENGTH",
    "ID_PATTERN",
    "CheckpointId",
    "ExecutionId",
    "Identifier",
    "LazyExecutions",
    "PackedExecutions",
    "ScopeMemo",
    "check_packed",
    "check_packed_text",
    "checked_pairs",
    "execution_ids",
    "pack_executions",
    "pack_text",
    "unpack_executions",
    "validate_id",
    "validate_key",
]
