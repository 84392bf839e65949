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

from ..errors import InvalidRecordError, refuse_newer_schema
from ..ids import ExecutionId, Identifier
from ._validation import TypedModel, describe_validation_error
from .binary_payloads import is_binary_payload, split_binary_payload

__all__ = [
    "RECORD_SCHEMA_VERSION",
    "RECORD_TYPES",
    "AgentBoundaryRecord",
    "NEWEST_RECORD_SCHEMA_VERSION",
    "OutputChunkRecord",
    "OutputChunkRef",
    "chunk_key",
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
"""The schema version every record kind is written with, except a chunked agent boundary."""
NEWEST_RECORD_SCHEMA_VERSION = 2
"""The newest record schema a reader accepts: 2 is the agent boundary whose ``output_items``
live in ``output_chunk`` members (format version 2)."""

LEGACY_RESOURCES_INSTANCE = "legacy-unscoped"
"""The instance a pre-instance boundary's resource revisions are read under (no participant has it)."""

RecordKind = Literal[
    "agent_boundary",
    "resource_snapshot",
    "model_lineage",
    "token_receipt",
    "completed_result",
    "dispatch",
    "output_chunk",
]


class Record(TypedModel, abc.ABC):
    """Common fields of every record kind."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    kind: ClassVar[str]
    newest_schema_version: ClassVar[int] = RECORD_SCHEMA_VERSION
    schema_version: int = Field(default=RECORD_SCHEMA_VERSION, ge=1)
    rollout_id: Identifier
    attempt: int = Field(ge=0)

    @model_validator(mode="before")
    @classmethod
    def _refuse_newer_schema(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refuse_newer_schema(cls.__name__, data.get("schema_version"), cls.newest_schema_version)
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


class OutputChunkRef(TypedModel):
    """One chunk an agent boundary (schema 2) lists: the ``output_chunk`` member's key, how many
    items it holds, and the SHA-256 of its payload bytes as stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(pattern=r"^[0-9]{8}-[0-9]{8}$")
    items: int = Field(ge=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class AgentBoundaryRecord(Record):
    """An agent's state after a completed, non-terminal turn: enough to continue from it.

    ``resource_revisions`` maps a resources/environment *instance* to the sessions the agent
    depends on there and their revisions (``{"blackjack": {"table": 3}}``): a session id is
    only unique within its instance. ``last_model_call_id`` is the last model call whose result
    the agent committed; ``pending_model_call_id`` is set by the agent participant when the run
    was parked waiting on its next model call (cut or queued at the model), which attempt N+1
    re-issues under the same id. ``cookies`` are the run's HTTP cookies (session affinity).
    """

    kind: ClassVar[str] = "agent_boundary"
    newest_schema_version: ClassVar[int] = NEWEST_RECORD_SCHEMA_VERSION
    boundary_index: int = Field(ge=0)
    turn_index: int = Field(ge=0)
    last_model_call_id: Identifier | None = None
    pending_model_call_id: Identifier | None = None
    resource_revisions: dict[Identifier, dict[Identifier, int]] = Field(default_factory=dict)
    output_items: list[JsonValue] = Field(default_factory=list)
    usage: dict[str, int] = Field(default_factory=dict)
    cookies: dict[str, str] = Field(default_factory=dict)
    agent_state: bytes | None = None
    output_chunks: list[OutputChunkRef] | None = None
    """Schema 2 only: ``output_items`` is empty and the items are these ``output_chunk``
    members of the same execution, in order (``chunks.assemble_boundaries`` puts them back)."""

    def to_payload(self) -> bytes:
        """As every record, but a schema-1 boundary has no ``output_chunks`` key (its bytes are
        those version-1 writers stored)."""
        if self.output_chunks is None:
            return self.model_dump_json(exclude={"output_chunks"}).encode()
        return self.model_dump_json().encode()

    @model_validator(mode="after")
    def _chunked_is_schema_2(self) -> AgentBoundaryRecord:
        if (self.output_chunks is not None) != (self.schema_version == 2):
            raise ValueError("output_chunks is present exactly in agent_boundary schema_version 2")
        if self.output_chunks is not None and self.output_items:
            raise ValueError("a chunked agent_boundary keeps its output_items in its chunks")
        return self

    @model_validator(mode="before")
    @classmethod
    def _legacy_revisions(cls, data: Any) -> Any:
        """Boundaries written before revisions were keyed by instance held ``{session: revision}``.
        They still read, under the instance ``LEGACY_RESOURCES_INSTANCE``, which no participant
        has: such a boundary cannot prove where its sessions live, so it never continues."""
        if isinstance(data, dict):
            revisions = data.get("resource_revisions")
            if (
                isinstance(revisions, dict)
                and revisions
                and all(isinstance(v, int) and not isinstance(v, bool) for v in revisions.values())
            ):
                data = {**data, "resource_revisions": {LEGACY_RESOURCES_INSTANCE: dict(revisions)}}
        return data

    @property
    def record_key(self) -> str:
        return f"{self.boundary_index:08d}"

    def index_revision(self) -> int | None:
        return self.boundary_index

    def index_refs(self) -> dict[str, JsonValue] | None:
        resources: dict[str, JsonValue] = {
            instance: dict(sessions) for instance, sessions in self.resource_revisions.items()
        }
        return {
            "model_call": self.last_model_call_id,
            "pending_model_call": self.pending_model_call_id,
            "resources": resources,
        }


class OutputChunkRecord(Record):
    """Items ``[first_item, first_item + len(items))`` of an execution's agent history
    (``output_items``), written once and referred to by later checkpoints (format version 2)."""

    kind: ClassVar[str] = "output_chunk"
    first_item: int = Field(ge=0)
    items: list[JsonValue] = Field(min_length=1)

    @property
    def record_key(self) -> str:
        return chunk_key(self.first_item, self.first_item + len(self.items))


def chunk_key(first: int, end: int) -> str:
    """``output_chunk`` member key of items ``[first, end)``."""
    return f"{first:08d}-{end:08d}"


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


_SHA256_HEX = r"^[0-9a-f]{64}$"


class GenerationCut(BaseModel):
    """Token-free coordinates of a generation cut at a durable token boundary.

    The call, rollout and attempt come from the :class:`ModelCallLineageRecord` holding it.
    ``frozen_buffer_id`` names the backend's immutable pre-cut buffer; its first
    ``prefix_token_count`` generated tokens hash to ``prefix_digest``
    (:func:`~rollout_checkpoint.tokens.prefix_digest`). The tokens themselves stay in the token
    store under ``receipt_key``, whose entry has sha256 ``receipt_digest`` and ``receipt_length``
    bytes (the token-store receipt). ``terminal_completion`` is a call that finished generating
    but whose response had not been delivered: its "prefix" is the whole generation.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cut_kind: Literal["active_prefix", "terminal_completion"]
    frozen_buffer_id: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    prefix_token_count: int = Field(ge=0)
    prefix_digest: str = Field(pattern=_SHA256_HEX)
    receipt_key: str = Field(min_length=1, max_length=512)
    receipt_digest: str = Field(pattern=_SHA256_HEX)
    receipt_length: int = Field(ge=0)

    def index_refs(self) -> dict[str, JsonValue]:
        return {
            "kind": self.cut_kind,
            "count": self.prefix_token_count,
            "digest": self.prefix_digest,
            "receipt_digest": self.receipt_digest,
            "receipt_length": self.receipt_length,
        }


class ModelCallLineageRecord(Record):
    """Token-free identity of one policy-model call and where it sits in the rollout's lineage.

    Without ``cut`` the call was delivered (a committed call of the lineage). With ``cut`` it
    is the execution's pending call, not delivered when the checkpoint was taken: its durable
    prefix (or undelivered completion) is where the re-issued call continues. ``continued_from``
    records the cut a call itself continued from.
    """

    kind: ClassVar[str] = "model_lineage"
    call_id: Identifier
    parent_call_id: Identifier | None = None
    policy_version: str = Field(min_length=1, max_length=256)
    token_key: str | None = Field(default=None, description="key of the call's rows in the token store")
    cut: GenerationCut | None = None
    continued_from: GenerationCut | None = None

    @model_validator(mode="after")
    def _cut_names_its_tokens(self) -> ModelCallLineageRecord:
        if self.cut is not None and self.token_key != self.cut.receipt_key:
            raise ValueError(
                f"a cut call's token_key {self.token_key!r} must be its cut's receipt_key "
                f"{self.cut.receipt_key!r}"
            )
        return self

    @property
    def record_key(self) -> str:
        return self.call_id

    def index_refs(self) -> dict[str, JsonValue] | None:
        refs: dict[str, JsonValue] = {"parent": self.parent_call_id, "token_key": self.token_key}
        if self.cut is not None:  # absent (not null) for delivered calls: their refs stay as they were
            refs["cut"] = self.cut.index_refs()
        return refs


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
        OutputChunkRecord,
        ResourceSnapshotRecord,
        ModelCallLineageRecord,
        TokenStoreReceipt,
        CompletedResultRecord,
        DispatchRecord,
    )
}


def decode_record(kind: str, payload: bytes | str) -> Record:
    """Parse a stored payload of ``kind`` (JSON, or the binary form of
    :mod:`.binary_payloads`); typed errors for unknown kinds, bad JSON, newer schemas."""
    cls = RECORD_TYPES.get(kind)
    if cls is None:
        raise InvalidRecordError(f"unknown record kind {kind!r}", kind=kind)
    try:
        if is_binary_payload(payload):
            try:
                fields = split_binary_payload(kind, payload)  # type: ignore[arg-type]
            except ValueError as exc:
                raise InvalidRecordError(f"invalid {kind} record: {exc}", kind=kind) from None
            return cls.model_validate(fields)
        return cls.model_validate_json(payload)
    except ValidationError as exc:
        raise InvalidRecordError(
            f"invalid {kind} record: {describe_validation_error(exc)}", kind=kind
        ) from None


def record_payload_json(record: Record) -> dict[str, Any]:
    """The record as a JSON-compatible dict (bytes as base64), for CLI output."""
    loaded: dict[str, Any] = json.loads(record.to_payload())
    return loaded
