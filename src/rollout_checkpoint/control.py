"""Transport-neutral control-plane types shared by participants, the coordinator and (later)
the HTTP server: phases, capabilities, reports and replies, and the ``ParticipantControl``
protocol that an in-process participant or a remote client both satisfy."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from .ids import ExecutionId, Identifier
from .store import ObjectStore

__all__ = [
    "CONTROL_SCHEMA_VERSION",
    "PREPARE_ORDER",
    "Capabilities",
    "CheckpointMode",
    "CommitReply",
    "ConcurrencyContract",
    "ParticipantControl",
    "ParticipantKind",
    "ParticipantStatus",
    "Phase",
    "PrepareReport",
    "RestoreReply",
    "ResumeReply",
    "UnsafeEffect",
    "WorkerTopology",
]

CONTROL_SCHEMA_VERSION = 1

ParticipantKind = Literal["environment", "model", "agent", "resources"]
"""NeMo Gym's participant kinds: environment server, policy model, agent, resources server."""

PREPARE_ORDER: tuple[ParticipantKind, ...] = ("environment", "model", "agent", "resources")
"""Prepare stage by stage in this order; resume in the reverse order (NeMo Gym's order)."""

CheckpointMode = Literal["exported", "stateless", "restart_only"]
WorkerTopology = Literal["single_process", "coordinated_workers"]
ConcurrencyContract = Literal["per_session_serialized", "single_threaded", "declared_safe"]


class Phase(enum.StrEnum):
    """idle -> preparing -> prepared -> committed; idle -> restored; resume: any -> idle."""

    IDLE = "idle"
    PREPARING = "preparing"
    PREPARED = "prepared"
    COMMITTED = "committed"
    RESTORED = "restored"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Capabilities(_Model):
    """What a participant declares about itself (the ``capabilities`` route)."""

    kind: ParticipantKind
    instance: Identifier
    mode: CheckpointMode
    schema_version: int = CONTROL_SCHEMA_VERSION
    topology: WorkerTopology = "single_process"
    concurrency: ConcurrencyContract = "per_session_serialized"
    admission_states: tuple[str, ...] = ("open", "closed")


class ParticipantStatus(_Model):
    capabilities: Capabilities
    phase: Phase
    checkpoint_id: str | None = None
    accepting: bool
    live: int = Field(ge=0, description="executions the participant currently tracks")
    tombstones: int = Field(ge=0)
    workers: int = Field(default=1, ge=0, description="worker processes whose answers are merged here")


class UnsafeEffect(_Model):
    """An external effect a participant cannot roll back (declared in its commit): the reader
    rejects the whole checkpoint when any is present."""

    rollout_id: Identifier
    attempt: int = Field(ge=0)
    description: str = Field(max_length=2000)


class PrepareReport(_Model):
    """Answer to ``prepare``: ready when every accepted execution reached a safe boundary."""

    checkpoint_id: Identifier
    phase: Phase
    ready: bool
    blockers: tuple[str, ...] = ()
    blocker_count: int = 0
    counts: dict[str, int] = Field(default_factory=dict)
    restarts: tuple[ExecutionId, ...] = ()


class CommitReply(_Model):
    checkpoint_id: Identifier
    phase: Phase
    kind: ParticipantKind
    instance: Identifier
    manifest_key: str
    manifest_sha256: str
    manifest_bytes: int
    executions: tuple[ExecutionId, ...] = ()
    restarts: tuple[ExecutionId, ...] = ()
    unsafe_effects: tuple[UnsafeEffect, ...] = ()


class RestoreReply(_Model):
    checkpoint_id: Identifier
    source_checkpoint_id: Identifier
    phase: Phase
    restored: tuple[ExecutionId, ...] = ()


class ResumeReply(_Model):
    checkpoint_id: Identifier
    phase: Phase
    idempotent: bool = False


@runtime_checkable
class ParticipantControl(Protocol):
    """The fenced control operations; an in-process participant and an HTTP client both fit.

    Every operation carries ``checkpoint_id`` and an absolute ``deadline`` (epoch seconds) and
    is idempotent for the same id.
    """

    def capabilities(self) -> Capabilities: ...

    def status(self) -> ParticipantStatus: ...

    def prepare(self, checkpoint_id: str, deadline: float) -> PrepareReport: ...

    def commit(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
    ) -> CommitReply: ...

    def restore(
        self,
        checkpoint_id: str,
        source_checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
    ) -> RestoreReply: ...

    def resume(self, checkpoint_id: str, deadline: float) -> ResumeReply: ...

    def retire(self, executions: Sequence[ExecutionId], deadline: float) -> None: ...

    def forget(self, rollout_ids: Sequence[str]) -> None: ...
