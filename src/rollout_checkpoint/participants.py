"""Reference participants for each kind: agent, resources/environment, policy model.

Each has a small integration API a server calls from its request handlers (``docs/participants.md``
shows the calls in context). All of them inherit the control plane of
:class:`~rollout_checkpoint.participant.Participant`: the coordinator drives ``prepare`` /
``commit`` / ``restore`` / ``resume`` / ``retire`` / ``forget``; the server's worker threads
call the methods below concurrently.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast, get_args, runtime_checkable

from pydantic import JsonValue

from .control import CheckpointMode, WorkerTopology
from .errors import (
    IdentityConflictError,
    InvalidPhaseError,
    InvalidRecordError,
    InvalidValueError,
    StaleAttemptError,
    UnknownExecutionError,
)
from .ids import ExecutionId, validate_id
from .participant import DEFAULT_LEASE_GRACE_SECONDS, Export, Participant, Readiness, execution_key, restamp
from .records import (
    AgentBoundaryRecord,
    GenerationCut,
    ModelCallLineageRecord,
    Record,
    ResourceSnapshotRecord,
    TokenStoreReceipt,
)
from .tokens import LineageStore, TokenEntry, TokenPutReceipt, TokenSink

__all__ = [
    "AgentParticipant",
    "JsonCodec",
    "ModelCall",
    "PolicyModelParticipant",
    "ResourcesParticipant",
    "StateCodec",
]


def _wrong_kind(record: Record, expected: str) -> InvalidRecordError:
    return InvalidRecordError(
        f"{record.kind} record of {record.execution} cannot be restored by a {expected} participant",
        kind=record.kind,
    )


# ============================================================================================
# Agent
# ============================================================================================


@dataclass
class _AgentRun:
    running: bool
    boundary: AgentBoundaryRecord | None = None
    restored: bool = False  # restored and not yet picked up by its replacement


class AgentParticipant(Participant):
    """A whitebox agent: one active run per rollout attempt, parked at completed turns.

    Integration: ``begin`` when a run starts (returns the restored boundary to continue from,
    if any), ``boundary`` after every completed non-terminal turn, ``start_turn`` before the next
    turn, ``finish`` when the run ends (terminal runs are never exported). A running turn blocks
    prepare; a run at a boundary is ready. Prepare never cancels a turn midway.
    """

    def __init__(
        self,
        instance: str = "agent",
        *,
        topology: WorkerTopology = "single_process",
        lease_grace_seconds: float = DEFAULT_LEASE_GRACE_SECONDS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(
            kind="agent",
            instance=instance,
            mode="exported",
            topology=topology,
            concurrency="per_session_serialized",
            lease_grace_seconds=lease_grace_seconds,
            clock=clock,
        )
        self._runs: dict[ExecutionId, _AgentRun] = {}
        # Indexes kept in step with ``_runs`` so readiness costs O(blockers), not O(runs).
        self._running: set[ExecutionId] = set()
        self._pending: set[ExecutionId] = set()

    def begin(self, execution: ExecutionId, *, wait: float = 0.0) -> AgentBoundaryRecord | None:
        """Start a run (new work: refused while admission is closed, or parked up to ``wait`` s).

        Returns the boundary a restore installed for this attempt (the run continues from it,
        at that boundary), else ``None`` (the run starts from its input, already running).
        """
        with self._cond:
            self._admit(execution, wait=wait)
            run = self._runs.get(execution)
            if run is not None:
                if not run.restored:
                    raise IdentityConflictError(
                        f"{execution} already runs at agent/{self.instance} (dispatched twice?)",
                        rollout_id=execution.rollout_id,
                        attempt=execution.attempt,
                    )
                run.restored = False
                self._pending.discard(execution)
                return run.boundary
            self._register(execution)
            self._runs[execution] = _AgentRun(running=True)
            self._running.add(execution)
            return None

    def start_turn(self, execution: ExecutionId, *, wait: float = 0.0) -> None:
        """Leave the boundary and run the next turn (refused or parked while admission is closed)."""
        with self._cond:
            self._admit(execution, wait=wait)
            run = self._run(execution)
            if run.running:
                raise InvalidPhaseError(f"{execution}: a turn is already running")
            run.running = True
            self._running.add(execution)

    def boundary(self, execution: ExecutionId, record: AgentBoundaryRecord) -> None:
        """A completed non-terminal turn: keep ``record`` as the run's latest safe boundary."""
        if record.execution != execution:
            raise IdentityConflictError(
                f"boundary record of {record.execution} reported for {execution}",
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
            )
        with self._cond:
            self._require_live(execution)
            run = self._run(execution)
            if run.boundary is not None and record.boundary_index <= run.boundary.boundary_index:
                raise InvalidRecordError(
                    f"{execution}: boundary_index {record.boundary_index} does not advance past "
                    f"{run.boundary.boundary_index}"
                )
            run.boundary = record
            run.running = False
            self._running.discard(execution)
            self._changed()

    def finish(self, execution: ExecutionId) -> None:
        """The run ended (result produced or failed): it is no longer resumable."""
        with self._cond:
            self._require_live(execution)
            self._drop_run(execution)
            self._unregister(execution)
            self._changed()

    def latest_boundary(self, execution: ExecutionId) -> AgentBoundaryRecord | None:
        with self._cond:
            self._require_live(execution)
            return self._run(execution).boundary

    def _drop_run(self, execution: ExecutionId) -> None:
        self._runs.pop(execution, None)
        self._running.discard(execution)
        self._pending.discard(execution)

    def _run(self, execution: ExecutionId) -> _AgentRun:
        run = self._runs.get(execution)
        if run is None:
            raise UnknownExecutionError(f"{execution} has no run at agent/{self.instance}")
        return run

    # -- hooks ------------------------------------------------------------------------------
    def _readiness(self) -> Readiness:
        running = sorted(self._running, key=execution_key)
        return Readiness(
            blockers=[str(e) for e in running],
            counts={
                "runs": len(self._runs),
                "running": len(running),
                "at_boundary": len(self._runs) - len(running),
                "restored_pending": len(self._pending),
            },
        )

    def _export(self, scope: frozenset[ExecutionId] | None) -> Export:
        records: list[Record] = []
        executions: list[ExecutionId] = []
        for execution, run in sorted(self._runs.items(), key=lambda item: execution_key(item[0])):
            if run.boundary is not None and self._in_scope(execution, scope):
                records.append(run.boundary)
                executions.append(execution)
        return Export(records=records, executions=executions)

    def _validate_restore(self, records: Sequence[Record]) -> Callable[[], list[ExecutionId]]:
        boundaries: dict[ExecutionId, AgentBoundaryRecord] = {}
        for record in records:
            if not isinstance(record, AgentBoundaryRecord):
                raise _wrong_kind(record, "agent")
            if record.execution in boundaries:
                raise InvalidRecordError(f"{record.execution} has more than one boundary in the checkpoint")
            boundaries[record.execution] = record

        def install() -> list[ExecutionId]:
            restored = []
            for execution, record in boundaries.items():
                nxt = execution.next_attempt()
                self._runs[nxt] = _AgentRun(
                    running=False,
                    boundary=cast(AgentBoundaryRecord, restamp(record, nxt.attempt)),
                    restored=True,
                )
                self._pending.add(nxt)
                restored.append(nxt)
            return restored

        return install

    def _retire_state(self, executions: Sequence[ExecutionId]) -> None:
        for execution in self._covered_live(executions):
            self._drop_run(execution)


# ============================================================================================
# Resources / environment
# ============================================================================================


@runtime_checkable
class StateCodec(Protocol):
    """Encodes a session's state to bytes and back (never pickle: restored bytes are data)."""

    @property
    def name(self) -> str: ...

    def encode(self, state: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class JsonCodec:
    """Canonical JSON (sorted keys, no NaN): for states made of dicts, lists, strings, numbers."""

    name = "json"

    def encode(self, state: Any) -> bytes:
        return json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    def decode(self, data: bytes) -> Any:
        return json.loads(data)


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
                raise _wrong_kind(record, self.kind)
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


# ============================================================================================
# Policy model
# ============================================================================================


@dataclass
class _Chain:
    """One execution's token-free lineage, in staging order."""

    calls: list[ModelCallLineageRecord] = field(default_factory=list)
    receipts: dict[str, TokenPutReceipt] = field(default_factory=dict)  # by call id
    inflight: set[str] = field(default_factory=set)


class ModelCall:
    """An admitted policy-model call; :meth:`stage` its tokens once generation is done (or cut)."""

    def __init__(
        self, participant: PolicyModelParticipant, execution: ExecutionId, call_id: str, policy_version: str
    ) -> None:
        self.participant = participant
        self.execution = execution
        self.call_id = call_id
        self.policy_version = policy_version
        self.lineage: ModelCallLineageRecord | None = None
        self._closed = False

    def stage(
        self,
        *,
        prompt_token_ids: Sequence[int],
        generation_token_ids: Sequence[int],
        generation_log_probs: Sequence[float],
        mask: Sequence[int] | None = None,
        cut: GenerationCut | None = None,
    ) -> ModelCallLineageRecord:
        """Store the tokens durably through the sink, then record lineage and the receipt.

        From here on the call no longer blocks prepare, even if its response is still being
        delivered. ``cut`` marks a generation cut at a durable prefix.
        """
        return self.participant._stage(
            self, prompt_token_ids, generation_token_ids, generation_log_probs, mask, cut
        )

    def close(self) -> None:
        """End the call; an unstaged call is dropped (the agent re-issues it from its boundary)."""
        if not self._closed:
            self._closed = True
            self.participant._close_call(self)


class PolicyModelParticipant(Participant):
    """The policy (training-token) model server.

    Integration: wrap each generation in ``with model.call(execution, call_id, policy_version=...)
    as call:`` and call ``call.stage(...)`` with its tokens. New calls are refused while admission
    is closed; admitted calls block prepare until they are staged (durable) or closed. Commits
    token-free lineage plus one ``TokenStoreReceipt`` per call (``snapshot_id`` = the checkpoint id:
    the coordinator snapshots the token store under the same id). After restore, the replacement
    attempt's first call gets the last restored call as parent.
    """

    def __init__(
        self,
        token_sink: TokenSink,
        instance: str = "policy",
        *,
        lineage_store: LineageStore | None = None,
        topology: WorkerTopology = "single_process",
        lease_grace_seconds: float = DEFAULT_LEASE_GRACE_SECONDS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(
            kind="model",
            instance=instance,
            mode="exported",
            topology=topology,
            concurrency="declared_safe",
            lease_grace_seconds=lease_grace_seconds,
            clock=clock,
        )
        self.token_sink = token_sink
        self.lineage_store = lineage_store
        self._chains: dict[ExecutionId, _Chain] = {}
        self._inflight: set[tuple[ExecutionId, str]] = set()  # admitted, not yet staged or closed

    @contextmanager
    def call(
        self, execution: ExecutionId, call_id: str, *, policy_version: str, wait: float = 0.0
    ) -> Iterator[ModelCall]:
        """Admit a model call (refused, or parked up to ``wait`` s, while closed) for its lifetime."""
        handle = self.admit(execution, call_id, policy_version=policy_version, wait=wait)
        try:
            yield handle
        finally:
            handle.close()

    def admit(
        self, execution: ExecutionId, call_id: str, *, policy_version: str, wait: float = 0.0
    ) -> ModelCall:
        """The non-context form of :meth:`call`: close the returned call when done."""
        validate_id(call_id, "call_id")
        with self._cond:
            self._admit(execution, wait=wait)
            chain = self._chains.get(execution)
            if chain is not None and (call_id in chain.receipts or call_id in chain.inflight):
                raise IdentityConflictError(f"model call {call_id} of {execution} was already admitted")
            if chain is None:
                self._register(execution)
                chain = self._chains[execution] = _Chain()
            chain.inflight.add(call_id)
            self._inflight.add((execution, call_id))
        return ModelCall(self, execution, call_id, policy_version)

    def finish(self, execution: ExecutionId) -> None:
        """The rollout is done with the model: drop its lineage (it is not exported again)."""
        with self._cond:
            self._require_live(execution)
            chain = self._chains.pop(execution)
            if chain.inflight:
                self._chains[execution] = chain
                raise InvalidPhaseError(f"{execution} still has {len(chain.inflight)} model calls in flight")
            self._unregister(execution)
            if self.lineage_store is not None:
                self.lineage_store.drop(execution)
            self._changed()

    def lineage(self, execution: ExecutionId) -> list[ModelCallLineageRecord]:
        with self._cond:
            chain = self._chains.get(execution)
            return list(chain.calls) if chain else []

    def _stage(
        self,
        call: ModelCall,
        prompt_token_ids: Sequence[int],
        generation_token_ids: Sequence[int],
        generation_log_probs: Sequence[float],
        mask: Sequence[int] | None,
        cut: GenerationCut | None,
    ) -> ModelCallLineageRecord:
        execution = call.execution
        with self._cond:
            self.fence.check(execution)
            chain = self._chains.get(execution)
            if chain is None or call.call_id not in chain.inflight or call._closed:
                raise UnknownExecutionError(f"model call {call.call_id} of {execution} is not in flight")
        entry = TokenEntry(
            rollout_id=execution.rollout_id,
            attempt=execution.attempt,
            call_id=call.call_id,
            prompt_token_ids=list(prompt_token_ids),
            generation_token_ids=list(generation_token_ids),
            generation_log_probs=list(generation_log_probs),
            mask=list(mask) if mask is not None else [1] * len(generation_token_ids),
        )
        receipt = self.token_sink.put(entry)  # durable before it counts; no lock held
        with self._cond:
            # A retire or restore while the tokens were staged voids the call: it never joins
            # the lineage, so a dead attempt cannot publish a winning model-call root.
            self.fence.check(execution)
            if self._chains.get(execution) is not chain or call.call_id not in chain.inflight:
                raise StaleAttemptError(f"model call {call.call_id} of {execution} was retired meanwhile")
            record = ModelCallLineageRecord(
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                call_id=call.call_id,
                parent_call_id=chain.calls[-1].call_id if chain.calls else None,
                policy_version=call.policy_version,
                token_key=receipt.key,
                cut=cut,
            )
            if self.lineage_store is not None:
                self.lineage_store.record(record)
            chain.calls.append(record)
            chain.receipts[call.call_id] = receipt
            chain.inflight.discard(call.call_id)
            self._inflight.discard((execution, call.call_id))
            call.lineage = record
            self._changed()
            return record

    def _close_call(self, call: ModelCall) -> None:
        with self._cond:
            chain = self._chains.get(call.execution)
            if chain is not None and call.call_id in chain.inflight:
                chain.inflight.discard(call.call_id)
                self._inflight.discard((call.execution, call.call_id))
                if not chain.calls and not chain.inflight:
                    # Nothing staged: the execution leaves no trace here.
                    del self._chains[call.execution]
                    self._unregister(call.execution)
                self._changed()

    # -- hooks ------------------------------------------------------------------------------
    def _readiness(self) -> Readiness:
        blockers = [f"{e}/{c}" for e, c in sorted(self._inflight, key=lambda k: (execution_key(k[0]), k[1]))]
        return Readiness(
            blockers=blockers,
            counts={"executions": len(self._chains), "inflight": len(blockers)},
        )

    def _manifest_extra(self) -> Mapping[str, JsonValue]:
        return {"token_store": self.token_sink.name}

    def _export(self, scope: frozenset[ExecutionId] | None) -> Export:
        snapshot_id = self._active
        if snapshot_id is None:  # commit exports only while its checkpoint is active
            raise InvalidPhaseError("model lineage is exported only during a commit")
        records: list[Record] = []
        executions: list[ExecutionId] = []
        for execution, chain in sorted(self._chains.items(), key=lambda item: execution_key(item[0])):
            if not chain.calls or not self._in_scope(execution, scope):
                continue
            executions.append(execution)
            for lineage in chain.calls:
                records.append(lineage)
                receipt = chain.receipts[lineage.call_id]
                records.append(
                    TokenStoreReceipt(
                        rollout_id=execution.rollout_id,
                        attempt=execution.attempt,
                        store=self.token_sink.name,
                        snapshot_id=snapshot_id,
                        key=receipt.key,
                        digest=receipt.digest,
                        length=receipt.length,
                    )
                )
        return Export(records=records, executions=executions)

    def _validate_restore(self, records: Sequence[Record]) -> Callable[[], list[ExecutionId]]:
        calls: dict[ExecutionId, dict[str, ModelCallLineageRecord]] = {}
        receipts: dict[ExecutionId, dict[str, TokenStoreReceipt]] = {}
        for record in records:
            if isinstance(record, ModelCallLineageRecord):
                by_id = calls.setdefault(record.execution, {})
                if record.call_id in by_id:
                    raise InvalidRecordError(
                        f"model call {record.call_id} of {record.execution} appears twice"
                    )
                by_id[record.call_id] = record
            elif isinstance(record, TokenStoreReceipt):
                by_key = receipts.setdefault(record.execution, {})
                if record.key in by_key:
                    raise InvalidRecordError(
                        f"token receipt {record.key} of {record.execution} appears twice"
                    )
                by_key[record.key] = record
            else:
                raise _wrong_kind(record, "model")
        chains: dict[ExecutionId, _Chain] = {}
        for execution in set(calls) | set(receipts):
            ordered = _ordered_chain(execution, calls.get(execution, {}))
            by_key = receipts.get(execution, {})
            used: set[str] = set()
            chain = _Chain()
            for lineage in ordered:
                receipt = by_key.get(lineage.token_key) if lineage.token_key else None
                if receipt is None:
                    raise InvalidRecordError(
                        f"model call {lineage.call_id} of {execution} has no token receipt for "
                        f"{lineage.token_key!r}"
                    )
                used.add(receipt.key)
                nxt = execution.next_attempt()
                chain.calls.append(cast(ModelCallLineageRecord, restamp(lineage, nxt.attempt)))
                chain.receipts[lineage.call_id] = TokenPutReceipt(
                    key=receipt.key, digest=receipt.digest, length=receipt.length
                )
            if set(by_key) - used:
                raise InvalidRecordError(f"{execution} has token receipts no model call refers to")
            chains[execution.next_attempt()] = chain

        def install() -> list[ExecutionId]:
            for execution, chain in chains.items():
                self._chains[execution] = chain
                if self.lineage_store is not None:
                    for lineage in chain.calls:
                        self.lineage_store.record(lineage)
            return list(chains)

        return install

    def _retire_state(self, executions: Sequence[ExecutionId]) -> None:
        for execution in self._covered_live(executions):
            chain = self._chains.pop(execution, None)
            if chain is not None:
                self._inflight.difference_update((execution, c) for c in chain.inflight)
            if self.lineage_store is not None:
                self.lineage_store.drop(execution)


def _ordered_chain(
    execution: ExecutionId, calls: Mapping[str, ModelCallLineageRecord]
) -> list[ModelCallLineageRecord]:
    """The calls of one execution as one linear chain from its root, or ``InvalidRecordError``.

    A restored chain must have exactly one root and one tip, so that the replacement attempt's
    first call has exactly one parent to continue from.
    """
    if not calls:
        raise InvalidRecordError(f"{execution} has token receipts but no model calls")
    children: dict[str | None, list[str]] = {}
    for call in calls.values():
        if call.parent_call_id is not None and call.parent_call_id not in calls:
            raise InvalidRecordError(
                f"model call {call.call_id} of {execution} names parent {call.parent_call_id}, "
                "which is not in the checkpoint"
            )
        children.setdefault(call.parent_call_id, []).append(call.call_id)
    ordered: list[ModelCallLineageRecord] = []
    parent: str | None = None
    while True:
        nxt = children.get(parent, [])
        if len(nxt) > 1:
            raise InvalidRecordError(f"model lineage of {execution} branches after {parent!r}: {sorted(nxt)}")
        if not nxt:
            break
        parent = nxt[0]
        ordered.append(calls[parent])
    if len(ordered) != len(calls):
        raise InvalidRecordError(f"model lineage of {execution} is not one chain from a single root")
    return ordered
