"""The coordinator's public types: its errors, outcomes, the publication handle, the fault hook
and the token-source protocol; plus the store wrapper that runs the fault hook before writes."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

from pydantic import BaseModel, JsonValue

from ..errors import CheckpointError, TransientStoreError
from ..format.commit_log import LatestUpdate
from ..format.manifests import GlobalCheckpointRecord, ObjectRef
from ..ids import ExecutionId
from ..protocol import ParticipantControl, ParticipantKind, Publication
from ..reader import RecoveryPlan
from ..store import DelegatingStore, ObjectInfo, ObjectStore, PutResult

__all__ = [
    "RETIRE_ORDER",
    "CheckpointCancelledError",
    "CheckpointNotReadyError",
    "CheckpointOutcome",
    "FaultHook",
    "MissingParticipantError",
    "PublicationHandle",
    "RestoreFailedError",
    "RestoreOutcome",
    "TokenSnapshotSource",
]

FaultHook = Callable[[str], None]
"""Called with a step name before every step a crash could interrupt (tests raise or exit)."""

RETIRE_ORDER: tuple[tuple[ParticipantKind, ...], ...] = (("environment",), ("agent",), ("model", "resources"))
"""Retire callers before callees, so a retired caller cannot re-issue work to a callee."""

RETRYABLE: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, TransientStoreError)
"""Transport failures: the operation may have been applied and only its answer lost, so the
(idempotent) call is repeated. A ``CheckpointError`` is an answer and is never retried."""


class CheckpointNotReadyError(CheckpointError):
    """A prepare stage did not reach a safe boundary by the deadline; the checkpoint was aborted."""

    code = "checkpoint_not_ready"


class CheckpointCancelledError(CheckpointError):
    """:meth:`Coordinator.cancel` stopped the cycle before its commit point; it was aborted."""

    code = "checkpoint_cancelled"


class RestoreFailedError(CheckpointError):
    """A participant refused the restore: new attempts were retired everywhere and resumed."""

    code = "restore_failed"


class MissingParticipantError(CheckpointError):
    """The checkpoint lists a participant this coordinator does not have: restoring (or resuming)
    without it would continue rollouts on state that was never restored. Nothing was touched."""

    code = "missing_participant"


class TokenSnapshotSource(Protocol):
    """What the coordinator needs of a token store: a snapshot bound to the checkpoint id."""

    def snapshot(self, checkpoint_id: str) -> Any: ...


@dataclass(frozen=True)
class CheckpointOutcome:
    """A published checkpoint. ``post_commit_errors`` lists what failed after the commit point
    (pointer move, resume): the checkpoint stays published regardless. ``pause_seconds`` is
    from the freeze of dispatch to the last resume; with ``publication="async"`` the resume
    comes before the upload, and ``publish_seconds`` runs from the commit to the record.
    ``timings`` are the seconds of the cycle's steps; all of these are the durations of the
    coordinator's spans (``docs/observability.md``), one measurement for trace and outcome."""

    checkpoint_id: str
    record: GlobalCheckpointRecord
    record_ref: ObjectRef
    latest: LatestUpdate | None
    post_commit_errors: tuple[str, ...]
    pause_seconds: float
    publish_seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    publication: Publication = "sync"

    @property
    def latest_moved(self) -> bool:
        return self.latest is not None and self.latest.moved

    @property
    def clean(self) -> bool:
        return not self.post_commit_errors


class PublicationHandle:
    """The background half of an asynchronous checkpoint (like Orbax's async save): the
    participants were resumed when this is returned; :meth:`result` waits for the publication
    and returns its :class:`CheckpointOutcome` or raises why nothing was published."""

    def __init__(self, checkpoint_id: str, pause_seconds: float) -> None:
        self.checkpoint_id = checkpoint_id
        self.pause_seconds = pause_seconds
        self._future: concurrent.futures.Future[CheckpointOutcome] = concurrent.futures.Future()

    def __repr__(self) -> str:
        return f"PublicationHandle({self.checkpoint_id!r}, done={self.done()})"

    def done(self) -> bool:
        """The publication ended (published, or failed with nothing published)."""
        return self._future.done()

    def result(self, timeout: float | None = None) -> CheckpointOutcome:
        """Wait (``timeout`` seconds, ``None`` = until it ends) for the published outcome;
        raises the failure (nothing was published) or ``TimeoutError``."""
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception(timeout)

    def _settle(self, work: Callable[[], CheckpointOutcome]) -> None:
        try:
            self._future.set_result(work())
        except BaseException as exc:
            self._future.set_exception(exc)


@dataclass(frozen=True)
class RestoreOutcome:
    """A restore that succeeded everywhere; participants stay paused until :meth:`Coordinator.resume`."""

    restore_id: str
    source_checkpoint_id: str
    plan: RecoveryPlan
    restored: dict[str, tuple[ExecutionId, ...]]


class HookedStore(DelegatingStore):
    """Calls the step hook before every write it forwards (fault injection at each object)."""

    def __init__(self, inner: ObjectStore, step: Callable[[str], None]) -> None:
        super().__init__(inner)
        self._step = step

    def put(self, key: str, data: bytes) -> ObjectInfo:
        self._step(f"put:{key}")
        return self.inner.put(key, data)

    def open_write(self, key: str) -> AbstractContextManager[BinaryIO]:
        self._step(f"open_write:{key}")
        return self.inner.open_write(key)

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        self._step(f"put_if_absent:{key}")
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        self._step(f"put_if_match:{key}")
        return self.inner.put_if_match(key, data, version)

    def delete(self, key: str) -> None:
        self._step(f"delete:{key}")
        self.inner.delete(key)


def participant_name(participant: ParticipantControl) -> str:
    caps = participant.capabilities()
    return f"{caps.kind}/{caps.instance}"


def receipt_json(receipt: Any) -> dict[str, JsonValue]:
    if isinstance(receipt, BaseModel):
        dumped: dict[str, JsonValue] = receipt.model_dump(mode="json")
        return dumped
    if isinstance(receipt, Mapping):
        return dict(receipt)
    raise TypeError(
        f"token snapshot receipt must be a pydantic model or a mapping, got {type(receipt).__name__}"
    )
