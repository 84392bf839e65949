"""Versioned record models that participants stream into a checkpoint.

Every record names its execution (``rollout_id`` + ``attempt``), has a ``kind`` and a
``record_key`` unique within (kind, execution), and a ``schema_version``. A reader refuses a
``schema_version`` newer than it knows with :class:`~rollout_checkpoint.errors.UnsupportedSchemaError`.
Opaque payloads (agent state, environment state) are ``bytes`` (base64 in JSON) or JSON values,
never pickles.
"""

from __future__ import annotations

import abc
import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from ._validation import TypedModel, describe_validation_error
from .errors import InvalidRecordError, refuse_newer_schema
from .ids import ExecutionId, Identifier

__all__ = [
    "RECORD_SCHEMA_VERSION",
    "RECORD_TYPES",
    "AgentBoundaryRecord",
    "CompletedResultRecord",
    "DispatchRecord",
    "DispatchState",
    "GenerationCut",
    "ModelCallLineageRecord",
    "Record",
    "RecordKind",
    "ResourceSnapshotRecord",
    "TokenStoreReceipt",
    "decode_record",
]

RECORD_SCHEMA_VERSION = 1

RecordKind = Literal[
    "agent_boundary",
    "resource_snapshot",
    "model_lineage",
    "token_receipt",
    "completed_result",
    "dispatch",
]


class Record(TypedModel, abc.ABC):
    """Common fields of every record kind."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    kind: ClassVar[str]
    schema_version: int = Field(default=RECORD_SCHEMA_VERSION, ge=1)
    rollout_id: Identifier
    attempt: int = Field(ge=0)

    @model_validator(mode="before")
    @classmethod
    def _refuse_newer_schema(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refuse_newer_schema(cls.__name__, data.get("schema_version"), RECORD_SCHEMA_VERSION)
        return data

    @property
    def execution(self) -> ExecutionId:
        return ExecutionId(rollout_id=self.rollout_id, attempt=self.attempt)

    @property
    @abc.abstractmethod
    def record_key(self) -> str:
        """Unique within (kind, rollout_id, attempt); each record kind says which field it is."""

    def to_payload(self) -> bytes:
        """The canonical JSON bytes stored in a shard's ``payload`` column."""
        return self.model_dump_json().encode()

    def index_revision(self) -> int | None:
        """A small integer copied into the member index (so readers need no payload)."""
        return None

    def index_refs(self) -> dict[str, JsonValue] | None:
        """Cross-component references copied into the member index as JSON.

        Recovery classification decides agreement from these alone: it never downloads
        shard payloads.
        """
        return None


class AgentBoundaryRecord(Record):
    """An agent's state after a completed, non-terminal turn: enough to continue from it."""

    kind: ClassVar[str] = "agent_boundary"
    boundary_index: int = Field(ge=0)
    turn_index: int = Field(ge=0)
    last_model_call_id: Identifier | None = None
    resource_revisions: dict[str, int] = Field(default_factory=dict)
    output_items: list[JsonValue] = Field(default_factory=list)
    usage: dict[str, int] = Field(default_factory=dict)
    agent_state: bytes | None = None

    @property
    def record_key(self) -> str:
        return f"{self.boundary_index:08d}"

    def index_revision(self) -> int | None:
        return self.boundary_index

    def index_refs(self) -> dict[str, JsonValue] | None:
        resources: dict[str, JsonValue] = dict(self.resource_revisions)
        return {"model_call": self.last_model_call_id, "resources": resources}


class ResourceSnapshotRecord(Record):
    """A resources/environment session's exported state at a monotonic revision."""

    kind: ClassVar[str] = "resource_snapshot"
    session_id: Identifier
    revision: int = Field(ge=0)
    codec: str = Field(min_length=1, max_length=128)
    state: bytes

    @property
    def record_key(self) -> str:
        return self.session_id

    def index_revision(self) -> int | None:
        return self.revision


class GenerationCut(BaseModel):
    """Where an active generation was cut at a durable token boundary."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cut_kind: Literal["active_prefix", "terminal_completion"]
    prefix_token_count: int = Field(ge=0)
    prefix_digest: str = Field(min_length=1)


class ModelCallLineageRecord(Record):
    """Token-free identity of one policy-model call and where it sits in the rollout's lineage."""

    kind: ClassVar[str] = "model_lineage"
    call_id: Identifier
    parent_call_id: Identifier | None = None
    policy_version: str = Field(min_length=1, max_length=256)
    token_key: str | None = Field(default=None, description="key of the call's rows in the token store")
    cut: GenerationCut | None = None

    @property
    def record_key(self) -> str:
        return self.call_id

    def index_refs(self) -> dict[str, JsonValue] | None:
        return {"parent": self.parent_call_id, "token_key": self.token_key}


class TokenStoreReceipt(Record):
    """Proof that the token store durably holds the tokens under ``key`` in ``snapshot_id``."""

    kind: ClassVar[str] = "token_receipt"
    store: str = Field(min_length=1, max_length=256)
    snapshot_id: Identifier
    key: str = Field(min_length=1, max_length=512)
    digest: str = Field(min_length=1)
    length: int = Field(ge=0)

    @property
    def record_key(self) -> str:
        return self.key

    def index_refs(self) -> dict[str, JsonValue] | None:
        return {
            "store": self.store,
            "snapshot_id": self.snapshot_id,
            "digest": self.digest,
            "length": self.length,
        }


class CompletedResultRecord(Record):
    """A finished rollout's result, durably acknowledged by the framework before the checkpoint."""

    kind: ClassVar[str] = "completed_result"
    result: JsonValue = None
    reward: float | None = None
    acknowledged: bool = True

    @property
    def record_key(self) -> str:
        return "result"


DispatchState = Literal["queued", "running", "finished", "handed_off", "consumed"]


class DispatchRecord(Record):
    """The framework's live-execution registry entry for one dispatched attempt.

    ``input_digest`` identifies the original input a fresh dispatch restarts from;
    ``restart_only`` marks executions whose environment cannot export state.
    """

    kind: ClassVar[str] = "dispatch"
    state: DispatchState
    input_digest: str | None = None
    restart_only: bool = False

    @property
    def record_key(self) -> str:
        return "dispatch"

    def index_refs(self) -> dict[str, JsonValue] | None:
        return {"state": self.state, "restart_only": self.restart_only}


RECORD_TYPES: dict[str, type[Record]] = {
    cls.kind: cls
    for cls in (
        AgentBoundaryRecord,
        ResourceSnapshotRecord,
        ModelCallLineageRecord,
        TokenStoreReceipt,
        CompletedResultRecord,
        DispatchRecord,
    )
}


def decode_record(kind: str, payload: bytes | str) -> Record:
    """Parse a stored payload of ``kind``; typed errors for unknown kinds, bad JSON, newer schemas."""
    cls = RECORD_TYPES.get(kind)
    if cls is None:
        raise InvalidRecordError(f"unknown record kind {kind!r}", kind=kind)
    try:
        return cls.model_validate_json(payload)
    except ValidationError as exc:
        raise InvalidRecordError(
            f"invalid {kind} record: {describe_validation_error(exc)}", kind=kind
        ) from None


def record_payload_json(record: Record) -> dict[str, Any]:
    """The record as a JSON-compatible dict (bytes as base64), for CLI output."""
    loaded: dict[str, Any] = json.loads(record.to_payload())
    return loaded
