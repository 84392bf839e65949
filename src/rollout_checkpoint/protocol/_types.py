"""Transport-neutral control-plane types shared by participants, the coordinator and the HTTP
server: phases, capabilities, reports and replies, the ``ParticipantControl`` protocol that an
in-process participant or a remote client both satisfy, and ``AsyncParticipantControl`` (the
two extra operations of asynchronous publication: ``commit(..., publication="async")`` and
``collect``)."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from typing import Annotated, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from ..errors import CheckpointError
from ..ids import ExecutionId, Identifier
from ..store import ObjectStore

__all__ = [
    "CONTROL_SCHEMA_VERSION",
    "PREPARE_ORDER",
    "AsyncParticipantControl",
    "Capabilities",
    "CheckpointMode",
    "INCARNATION_PATTERN",
    "Incarnation",
    "CommitReply",
    "ConcurrencyContract",
    "ParticipantControl",
    "ParticipantKind",
    "ParticipantStatus",
    "Phase",
    "PrepareReport",
    "Publication",
    "PublicationFailedError",
    "PublicationUnknownError",
    "RestoreReply",
    "ResumeReply",
    "UnsafeEffect",
    "WorkerTopology",
    "new_incarnation",
]

CONTROL_SCHEMA_VERSION = 1

ParticipantKind = Literal["environment", "model", "agent", "resources"]
"""NeMo Gym's participant kinds: environment server, policy model, agent, resources server."""

PREPARE_ORDER: tuple[ParticipantKind, ...] = ("environment", "model", "agent", "resources")
"""Prepare stage by stage in this order; resume in the reverse order (NeMo Gym's order)."""

CheckpointMode = Literal["exported", "stateless", "restart_only"]
WorkerTopology = Literal["single_process", "coordinated_workers"]
Publication = Literal["sync", "async"]
"""``sync``: commit encodes and uploads before it answers. ``async``: commit freezes an in-memory
snapshot, answers ``frozen`` and uploads in the background after the resume (``collect``)."""
ConcurrencyContract = Literal["per_session_serialized", "single_threaded", "declared_safe"]


class Phase(enum.StrEnum):
    """idle -> preparing -> prepared -> committed | frozen; idle -> restored; resume: any -> idle.

    ``frozen``: an asynchronous commit took its snapshot; the upload runs in the background and
    outlives the resume (``collect`` answers once it ended)."""

    IDLE = "idle"
    PREPARING = "preparing"
    PREPARED = "prepared"
    COMMITTED = "committed"
    FROZEN = "frozen"
    RESTORED = "restored"


class PublicationFailedError(CheckpointError):
    """The background upload of an asynchronous commit failed (``cause`` names the original
    code); no manifest of it was written, so the checkpoint can never be published."""

    code = "publication_failed"


class PublicationUnknownError(CheckpointError):
    """``collect`` names a checkpoint with no upload here: never frozen here, evicted, or the
    process restarted since the freeze (the upload died with it). Nothing of it can publish."""

    code = "publication_unknown"


INCARNATION_PATTERN = r"^[0-9a-f]{32}$"
"""An incarnation id: 32 lowercase hex digits (a valid identifier too)."""

Incarnation = Annotated[str, StringConstraints(pattern=INCARNATION_PATTERN)]
"""An incarnation id, checked by one compiled pattern as a reply is parsed (no Python call: every
control reply carries one)."""


def new_incarnation() -> str:
    """A fresh incarnation id: 128 random bits as 32 lowercase hex digits (a valid identifier).

    Drawn once when a participant is built; a restarted process draws another, so a caller that
    sees a different one knows the state it knew is gone (``docs/protocol.md``, "Incarnations")."""
    return uuid.uuid4().hex


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
    uploading: tuple[str, ...] = Field(
        default=(), description="checkpoints whose asynchronous upload still runs here"
    )
    workers: int = Field(default=1, ge=0, description="worker processes whose answers are merged here")
    waiting: int = Field(default=0, ge=0, description="prepares waiting for readiness here right now")
    incarnation: Incarnation = Field(description="the answering participant's incarnation id")


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
    incarnation: Incarnation = Field(description="the answering participant's incarnation id")


class CommitReply(_Model):
    """Answer to ``commit`` and ``collect``. ``committed`` names the written manifest;
    ``frozen`` (an asynchronous commit) names none yet: ``collect`` returns the committed reply."""

    checkpoint_id: Identifier
    phase: Phase
    kind: ParticipantKind
    instance: Identifier
    manifest_key: str | None = None
    manifest_sha256: str | None = None
    manifest_bytes: int | None = Field(default=None, ge=0)
    executions: tuple[ExecutionId, ...] = ()
    restarts: tuple[ExecutionId, ...] = ()
    unsafe_effects: tuple[UnsafeEffect, ...] = ()
    incarnation: Incarnation = Field(description="the answering participant's incarnation id")

    @model_validator(mode="after")
    def _manifest_iff_committed(self) -> CommitReply:
        named = (self.manifest_key, self.manifest_sha256, self.manifest_bytes)
        if self.phase is Phase.COMMITTED and None in named:
            raise ValueError("a committed reply names its manifest (key, sha256, bytes)")
        if self.phase is Phase.FROZEN and named != (None, None, None):
            raise ValueError("a frozen reply names no manifest yet")
        if self.phase not in (Phase.COMMITTED, Phase.FROZEN):
            raise ValueError(f"a commit reply is committed or frozen, not {self.phase.value}")
        return self


class RestoreReply(_Model):
    checkpoint_id: Identifier
    source_checkpoint_id: Identifier
    phase: Phase
    restored: tuple[ExecutionId, ...] = ()
    incarnation: Incarnation = Field(description="the answering participant's incarnation id")


class ResumeReply(_Model):
    checkpoint_id: Identifier
    phase: Phase
    idempotent: bool = False
    incarnation: Incarnation = Field(description="the answering participant's incarnation id")


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

    def abort_restore(self, checkpoint_id: str, deadline: float) -> ResumeReply: ...

    def retire(self, executions: Sequence[ExecutionId], deadline: float) -> None: ...

    def forget(self, rollout_ids: Sequence[str]) -> None: ...


@runtime_checkable
class AsyncParticipantControl(ParticipantControl, Protocol):
    """A participant that can publish asynchronously (``docs/protocol.md``, "Asynchronous
    publication"): ``commit(..., publication="async")`` freezes and answers ``frozen``;
    ``collect`` waits (until ``deadline``) for that upload and returns the committed reply."""

    def commit(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
        *,
        publication: Publication = "sync",
    ) -> CommitReply: ...

    def collect(self, checkpoint_id: str, deadline: float) -> CommitReply: ...
