"""The resources/environment participant: per-session state, mutations serialized per session."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ..control import CheckpointMode, WorkerTopology
from ..control_plane import (
    DEFAULT_LEASE_GRACE_SECONDS,
    Export,
    Participant,
    Readiness,
    execution_key,
    wrong_kind,
)
from ..errors import IdentityConflictError, InvalidRecordError, InvalidValueError, UnknownExecutionError
from ..ids import ExecutionId, validate_id
from ..records import Record, ResourceSnapshotRecord
from .codecs import JsonCodec, StateCodec

__all__ = ["ResourcesParticipant"]


@dataclass
class _Session:
    state: Any
    revision: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    inflight: int = 0


class ResourcesParticipant(Participant):
    """Per-session environment state, keyed by ``(rollout_id, attempt, session_id)``.

    Modes: ``exported`` (sessions are exported through ``codec`` and restored under attempt
    N+1; in-flight mutations block prepare), ``stateless`` (nothing to export, never blocks),
    ``restart_only`` (the default, fail closed: never blocks prepare, and every live execution
    is reported as a restart, so the reader dispatches it afresh).

    Mutations are serialized per session by a lock and bump a monotonic revision only when they
    succeed. End a session with :meth:`end_session` once it is terminal and verified; after a
    failed verification keep it (its state stays exported) so verification can be retried.
    """

    def __init__(
        self,
        instance: str = "resources",
        *,
        kind: Literal["resources", "environment"] = "resources",
        mode: CheckpointMode = "restart_only",
        codec: StateCodec | None = None,
        topology: WorkerTopology = "single_process",
        lease_grace_seconds: float = DEFAULT_LEASE_GRACE_SECONDS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if mode not in get_args(CheckpointMode):
            raise InvalidValueError(
                f"ResourcesParticipant mode must be one of {list(get_args(CheckpointMode))}, got {mode!r}",
                field="mode",
                value=repr(mode),
            )
        super().__init__(
            kind=kind,
            instance=instance,
            mode=mode,
            topology=topology,
            concurrency="per_session_serialized",
            lease_grace_seconds=lease_grace_seconds,
            clock=clock,
        )
        self.codec: StateCodec = codec if codec is not None else JsonCodec()
        self._sessions: dict[tuple[ExecutionId, str], _Session] = {}
        self._by_execution: dict[ExecutionId, set[str]] = {}
        self._inflight: set[tuple[ExecutionId, str]] = set()  # sessions with accepted mutations

    def open_session(self, execution: ExecutionId, session_id: str, state: Any, *, wait: float = 0.0) -> int:
        """Seed a session (new work: refused, or parked up to ``wait`` s, while closed); revision 0."""
        validate_id(session_id, "session_id")
        with self._cond:
            self._admit(execution, wait=wait)
            if (execution, session_id) in self._sessions:
                raise IdentityConflictError(f"session {session_id} of {execution} is already open")
            self._register(execution)
            self._add_session(execution, session_id, _Session(state=state, revision=0))
            return 0

    def mutate(
        self, execution: ExecutionId, session_id: str, fn: Callable[[Any], Any], *, wait: float = 0.0
    ) -> int:
        """Apply ``fn(state) -> new_state`` under the session lock; returns the new revision.

        Treat the state as immutable inside ``fn`` (return a new value): if ``fn`` raises, the
        old state and revision stay. Refused (or parked up to ``wait`` s) while closed.
        """
        with self._cond:
            self._admit(execution, wait=wait)
            session = self._session(execution, session_id)
            session.inflight += 1
            self._inflight.add((execution, session_id))
        try:
            with session.lock:
                with self._cond:
                    self._still_current(execution, session_id, session)
                    state = session.state
                new_state = fn(state)
                with self._cond:
                    self._still_current(execution, session_id, session)
                    session.state = new_state
                    session.revision += 1
                    return session.revision
        finally:
            with self._cond:
                session.inflight -= 1
                if not session.inflight:
                    self._inflight.discard((execution, session_id))
                self._changed()

    def state(self, execution: ExecutionId, session_id: str) -> tuple[Any, int]:
        """The session's current state and revision."""
        with self._cond:
            self._require_live(execution)
            session = self._session(execution, session_id)
            return session.state, session.revision

    def end_session(self, execution: ExecutionId, session_id: str) -> None:
        """A terminal, verified session: drop it (allowed while admission is closed)."""
        with self._cond:
            self._require_live(execution)
            session = self._session(execution, session_id)
        # Taking the session lock first lets an accepted mutation finish.
        with session.lock, self._cond:
            if self._sessions.get((execution, session_id)) is session:
                self._drop_session(execution, session_id)
                if execution not in self._by_execution:
                    self._unregister(execution)
            self._changed()

    def sessions(self, execution: ExecutionId) -> list[str]:
        with self._cond:
            return sorted(self._by_execution.get(execution, ()))

    def _add_session(self, execution: ExecutionId, session_id: str, session: _Session) -> None:
        self._sessions[(execution, session_id)] = session
        self._by_execution.setdefault(execution, set()).add(session_id)

    def _drop_session(self, execution: ExecutionId, session_id: str) -> None:
        self._sessions.pop((execution, session_id), None)
        self._inflight.discard((execution, session_id))
        ids = self._by_execution.get(execution)
        if ids is not None:
            ids.discard(session_id)
            if not ids:
                del self._by_execution[execution]

    def _session(self, execution: ExecutionId, session_id: str) -> _Session:
        session = self._sessions.get((execution, session_id))
        if session is None:
            raise UnknownExecutionError(
                f"session {session_id} of {execution} is not open at {self.kind}/{self.instance}"
            )
        return session

    def _still_current(self, execution: ExecutionId, session_id: str, session: _Session) -> None:
        """A retire (or end) while the mutation waited voids it: fail instead of writing."""
        self.fence.check(execution)
        if self._sessions.get((execution, session_id)) is not session:
            raise UnknownExecutionError(f"session {session_id} of {execution} ended meanwhile")

    # -- hooks ------------------------------------------------------------------------------
    def _live_executions(self) -> list[ExecutionId]:
        return sorted(self._by_execution, key=execution_key)

    def _readiness(self) -> Readiness:
        inflight = sorted(self._inflight, key=lambda k: (execution_key(k[0]), k[1]))
        counts = {"sessions": len(self._sessions), "inflight": len(inflight)}
        if self.mode == "exported":
            return Readiness(blockers=[f"{e}/{s}" for e, s in inflight], counts=counts)
        restarts = self._live_executions() if self.mode == "restart_only" else []
        return Readiness(counts=counts, restarts=restarts)

    def _export(self, scope: frozenset[ExecutionId] | None) -> Export:
        if self.mode == "stateless":
            return Export(records=[], executions=[])
        if self.mode == "restart_only":
            live = [e for e in self._live_executions() if self._in_scope(e, scope)]
            return Export(records=[], executions=[], restarts=live)
        records: list[Record] = []
        executions: set[ExecutionId] = set()
        for (execution, session_id), session in sorted(
            self._sessions.items(), key=lambda item: (execution_key(item[0][0]), item[0][1])
        ):
            if not self._in_scope(execution, scope):
                continue
            try:
                data = self.codec.encode(session.state)
            except (TypeError, ValueError) as exc:
                raise InvalidRecordError(
                    f"{self.codec.name} codec cannot encode session {session_id} of {execution}: {exc}"
                ) from exc
            records.append(
                ResourceSnapshotRecord(
                    rollout_id=execution.rollout_id,
                    attempt=execution.attempt,
                    session_id=session_id,
                    revision=session.revision,
                    codec=self.codec.name,
                    state=data,
                )
            )
            executions.add(execution)
        return Export(records=records, executions=sorted(executions, key=execution_key))

    def _validate_restore(self, records: Sequence[Record]) -> Callable[[], list[ExecutionId]]:
        if records and self.mode != "exported":
            raise InvalidRecordError(f"a {self.mode} {self.kind} participant has no state to restore")
        decoded: dict[tuple[ExecutionId, str], tuple[Any, int]] = {}
        for record in records:
            if not isinstance(record, ResourceSnapshotRecord):
                raise wrong_kind(record, self.kind)
            if record.codec != self.codec.name:
                raise InvalidRecordError(
                    f"session {record.session_id} of {record.execution} uses codec {record.codec!r}; "
                    f"this participant decodes {self.codec.name!r}"
                )
            key = (record.execution, record.session_id)
            if key in decoded:
                raise InvalidRecordError(f"session {record.session_id} of {record.execution} appears twice")
            try:
                decoded[key] = (self.codec.decode(record.state), record.revision)
            except (TypeError, ValueError) as exc:
                raise InvalidRecordError(
                    f"session {record.session_id} of {record.execution} does not decode: {exc}"
                ) from exc

        def install() -> list[ExecutionId]:
            restored: set[ExecutionId] = set()
            for (execution, session_id), (state, revision) in decoded.items():
                nxt = execution.next_attempt()
                self._add_session(nxt, session_id, _Session(state=state, revision=revision))
                restored.add(nxt)
            return list(restored)

        return install

    def _retire_state(self, executions: Sequence[ExecutionId]) -> None:
        for execution in self._covered_live(executions):
            for session_id in list(self._by_execution.get(execution, ())):
                self._drop_session(execution, session_id)
