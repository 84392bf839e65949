"""Token store contracts: the entry a model call stores, its receipts, the snapshot a checkpoint
binds, and the sink/source/lineage protocols a framework implements.

Training tokens (token ids, masks, log-probs) never enter a checkpoint manifest: the policy
model participant stores them through a framework-provided :class:`TokenSink`, commits only
token-free lineage plus a receipt (key, digest, length) per model call, and the coordinator
binds a :class:`TokenSource` snapshot to the global checkpoint. The reader compares the
receipts with the snapshot: any mismatch rejects the checkpoint.

:func:`prefix_digest` is the canonical digest of a token-id sequence that generation cuts carry
(``docs/format.md``, "Model lineage and generation cuts").
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from pydantic import ConfigDict, Field, model_validator

from ..errors import InvalidRecordError, ObjectExistsError
from ..format._validation import TypedModel
from ..format.records import ModelCallLineageRecord
from ..ids import ExecutionId, Identifier, validate_id

__all__ = [
    "TOKEN_ENTRY_SCHEMA_VERSION",
    "TOKEN_SNAPSHOT_FORMAT",
    "InMemoryLineageStore",
    "LineageStore",
    "TokenEntry",
    "TokenPutReceipt",
    "TokenSink",
    "TokenSnapshotEntry",
    "TokenSnapshotReceipt",
    "TokenSource",
    "prefix_digest",
    "token_key",
]

TOKEN_ENTRY_SCHEMA_VERSION = 1
TOKEN_SNAPSHOT_FORMAT = "rollout-checkpoint/token-snapshot/1"


class _Model(TypedModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenEntry(_Model):
    """The training tokens of one model call.

    ``generation_log_probs`` and ``mask`` align with ``generation_token_ids`` (same length);
    ``mask`` is 1 for tokens trained on, 0 for tokens that are not (e.g. injected text).
    """

    schema_version: int = Field(default=TOKEN_ENTRY_SCHEMA_VERSION, ge=1, le=TOKEN_ENTRY_SCHEMA_VERSION)
    rollout_id: Identifier
    attempt: int = Field(ge=0)
    call_id: Identifier
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    mask: list[int]

    @model_validator(mode="after")
    def _aligned(self) -> TokenEntry:
        n = len(self.generation_token_ids)
        if len(self.generation_log_probs) != n or len(self.mask) != n:
            raise ValueError(
                f"generation_token_ids ({n}), generation_log_probs ({len(self.generation_log_probs)}) "
                f"and mask ({len(self.mask)}) must have the same length"
            )
        if any(t < 0 for t in self.prompt_token_ids) or any(t < 0 for t in self.generation_token_ids):
            raise ValueError("token ids must be non-negative")
        if any(m not in (0, 1) for m in self.mask):
            raise ValueError("mask values must be 0 or 1")
        if any(not math.isfinite(p) for p in self.generation_log_probs):
            raise ValueError("log-probs must be finite")
        return self

    @property
    def execution(self) -> ExecutionId:
        return ExecutionId(rollout_id=self.rollout_id, attempt=self.attempt)

    @property
    def key(self) -> str:
        """The token-store key of this call: ``<rollout_id>/a<attempt>/<call_id>``."""
        return token_key(self.rollout_id, self.attempt, self.call_id)

    def canonical_bytes(self) -> bytes:
        """The bytes the digest and length of a receipt are computed over."""
        return self.model_dump_json().encode()

    def receipt(self) -> TokenPutReceipt:
        data = self.canonical_bytes()
        return TokenPutReceipt(key=self.key, digest=hashlib.sha256(data).hexdigest(), length=len(data))


def prefix_digest(token_ids: Sequence[int]) -> str:
    """sha256 (lowercase hex) of the token ids as a compact JSON array of decimal integers.

    ``[17,4,250]`` is hashed as the ASCII bytes ``[17,4,250]`` (no spaces; ``[]`` for none), so a
    second implementation reproduces it with any JSON encoder set to compact separators.
    """
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in token_ids):
        raise InvalidRecordError("token ids must be non-negative integers")
    return hashlib.sha256(("[" + ",".join(str(t) for t in token_ids) + "]").encode()).hexdigest()


def token_key(rollout_id: str, attempt: int, call_id: str) -> str:
    return f"{validate_id(rollout_id, 'rollout_id')}/a{attempt}/{validate_id(call_id, 'call_id')}"


class TokenPutReceipt(_Model):
    """What a sink returns once an entry is durable: key, sha256 and length of its bytes."""

    key: str = Field(min_length=1, max_length=512)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    length: int = Field(ge=0)


class TokenSnapshotEntry(_Model):
    """One key of a snapshot: its digest and length, and where the reference store keeps it."""

    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    length: int = Field(ge=0)
    shard: str | None = None
    row: int | None = Field(default=None, ge=0)


class TokenSnapshotReceipt(_Model):
    """Identity and integrity of a token-store snapshot, bound into the global checkpoint.

    ``key``/``digest``/``length`` locate and pin the snapshot manifest; ``entries`` counts keys.
    """

    store: str = Field(min_length=1, max_length=1024)
    checkpoint_id: Identifier
    snapshot_id: Identifier
    key: str = Field(min_length=1)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    length: int = Field(ge=0)
    entries: int = Field(ge=0)


@runtime_checkable
class TokenSink(Protocol):
    """Where the policy model stages a call's tokens; ``put`` is idempotent per call id and
    returns only once the entry is durable."""

    @property
    def name(self) -> str:
        """Identity of the store (goes into every ``TokenStoreReceipt.store``)."""
        ...

    def put(self, entry: TokenEntry) -> TokenPutReceipt: ...


@runtime_checkable
class TokenSource(Protocol):
    """Read side: a snapshot bound to a checkpoint, and entries by key."""

    @property
    def name(self) -> str: ...

    def snapshot(self, checkpoint_id: str) -> TokenSnapshotReceipt: ...

    def get(self, key: str) -> TokenEntry: ...


@runtime_checkable
class LineageStore(Protocol):
    """Where a framework keeps token-free model-call lineage outside the model server."""

    def record(self, lineage: ModelCallLineageRecord) -> None: ...

    def lineage(self, execution: ExecutionId) -> list[ModelCallLineageRecord]: ...

    def drop(self, execution: ExecutionId) -> None: ...


class InMemoryLineageStore:
    """A process-local :class:`LineageStore` (tests, single-process frameworks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[ExecutionId, dict[str, ModelCallLineageRecord]] = {}

    def record(self, lineage: ModelCallLineageRecord) -> None:
        with self._lock:
            rows = self._rows.setdefault(lineage.execution, {})
            existing = rows.get(lineage.call_id)
            if existing is not None and existing != lineage:
                raise ObjectExistsError(
                    f"lineage of call {lineage.call_id} of {lineage.execution} already differs",
                    call_id=lineage.call_id,
                )
            rows[lineage.call_id] = lineage

    def lineage(self, execution: ExecutionId) -> list[ModelCallLineageRecord]:
        with self._lock:
            return list(self._rows.get(execution, {}).values())

    def drop(self, execution: ExecutionId) -> None:
        with self._lock:
            self._rows.pop(execution, None)
