"""The resources/environment participant: per-session state, mutations serialized per session.

While a checkpoint runs, new sessions and mutations wait for resume (bounded by
``admission_wait`` seconds, then ``admission_closed``) instead of failing at once. Restore
validates the complete replacement set (every session decodes; every revision agrees with the
agent boundaries of the source checkpoint that name this instance) before activating any of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, get_args

from ..errors import (
    CheckpointNotFoundError,
    IdentityConflictError,
    InvalidRecordError,
    InvalidValueError,
    UnknownExecutionError,
)
from ..format import layout
from ..format.columnar import b64, check_ids, check_lengths, check_non_negative, encode_docs
from ..format.commit_log import read_record
from ..format.record_reader import ArchiveReader
from ..format.records import RECORD_SCHEMA_VERSION, Record, ResourceSnapshotRecord
from ..ids import ExecutionId, validate_id
from ..protocol import (
    DEFAULT_LEASE_GRACE_SECONDS,
    CheckpointMode,
    DeferredBatches,
    Export,
    ExportRows,
    Readiness,
    RecordBatch,
    RowsExport,
    ScopeSource,
    WorkerTopology,
    execution_key,
    resolve_scope,
    scope_test,
    wrong_kind,
)
from ..store import ObjectStore, open_store
from ._session_work import SessionWork, _Session, session_work
from .codecs import JsonCodec, StateCodec

__all__ = ["DEFAULT_ADMISSION_WAIT_SECONDS", "ResourcesParticipant", "SessionWork"]

DEFAULT_ADMISSION_WAIT_SECONDS = 300.0
"""How long a session request waits for a checkpoint to end before ``admission_closed``."""


class ResourcesParticipant(RowsExport):
    """Per-session environment state, keyed by ``(rollout_id, attempt, session_id)``.

    Modes: ``exported`` (sessions are exported through ``codec`` and restored under attempt
    N+1; in-flight mutations block prepare), ``stateless`` (nothing to export, never blocks),
    ``restart_only`` (the default, fail closed: never blocks prepare, and every live execution
    is reported as a restart, so the reader dispatches it afresh).

    Mutations are serialized per session by a lock and bump a monotonic revision only when they
    succeed. While a checkpoint runs they wait for resume (``wait``, default ``admission_wait``
    seconds; the wait is bounded, then ``admission_closed``). End a session with
    :meth:`end_session` once it is terminal and verified; after a
    failed verification keep it (its state stays exported) so verification can be retried.
    """

    def __init__(
        self,
        instance: str = "resources",
        *,
        kind: Literal["resources", "environment"] = "resources",
        mode: CheckpointMode = "restart_only",
        codec: StateCodec | None = None,
        admission_wait: float = DEFAULT_ADMISSION_WAIT_SECONDS,
        topology: WorkerTopology = "single_process",
        lease_grace_seconds: float = DEFAULT_LEASE_GRACE_SECONDS,
        clock: Callable[[], float] | None = None,
        start_paused: bool = False,
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
            start_paused=start_paused,
        )
        if admission_wait < 0:
            raise ValueError("admission_wait must be >= 0")
        self.codec: StateCodec = codec if codec is not None else JsonCodec()
        self.admission_wait = float(admission_wait)
        self._sessions: dict[tuple[ExecutionId, str], _Session] = {}
        self._by_execution: dict[ExecutionId, set[str]] = {}
        self._inflight: set[tuple[ExecutionId, str]] = set()  # sessions with accepted mutations
        # The export, kept up to date incrementally (see ``_export``): the sessions changed
        # since the last export (``_touch``) and each exported session's (payload, revision).
        self._dirty: set[tuple[ExecutionId, str]] = set()
        self._rows: ExportRows[tuple[ExecutionId, str], tuple[bytes, int]] = ExportRows(
            _session_order, _session_execution
        )
        self._opening: dict[tuple[ExecutionId, str], int] = {}  # async work on sessions not open yet

    def open_session(
        self, execution: ExecutionId, session_id: str, state: Any, *, wait: float | None = None
    ) -> int:
        """Seed a session at revision 0 (new work: waits up to ``wait`` s while a checkpoint runs)."""
        validate_id(session_id, "session_id")
        encoded = self._encode(execution, session_id, 0, state)
        with self._cond:
            self._admit(execution, wait=self._wait(wait))
            if (execution, session_id) in self._sessions:
                raise IdentityConflictError(f"session {session_id} of {execution} is already open")
            self._register(execution)
            self._add_session(execution, session_id, _Session(state=state, revision=0, encoded=encoded))
            return 0

    def mutate(
        self,
        execution: ExecutionId,
        session_id: str,
        fn: Callable[[Any], Any],
        *,
        wait: float | None = None,
    ) -> int:
        """Apply ``fn(state) -> new_state`` under the session lock; returns the new revision.

        Treat the state as immutable inside ``fn`` (return a new value): if ``fn`` raises, the
        old state and revision stay. An exported session's new state is encoded here, under the
        session lock, so a commit only gathers bytes (a codec error is raised by the commit).
        While a checkpoint runs the mutation waits for resume, up to ``wait`` s (default
        ``admission_wait``; ``0`` refuses at once).
        """
        with self._cond:
            self._admit(execution, wait=self._wait(wait))
            session = self._session(execution, session_id)
            session.inflight += 1
            self._inflight.add((execution, session_id))
        try:
            with session.lock:
                with self._cond:
                    self._still_current(execution, session_id, session)
                    state, revision = session.state, session.revision  # fixed while we hold the lock
                new_state = fn(state)
                encoded = self._encode(execution, session_id, revision + 1, new_state)
                with self._cond:
                    self._still_current(execution, session_id, session)
                    session.state = new_state
                    session.encoded = encoded
                    session.revision += 1
                    self._touch(execution, session_id)
                    return session.revision
        finally:
            with self._cond:
                session.inflight -= 1
                if not session.inflight:
                    self._inflight.discard((execution, session_id))
                self._changed()

    def session_work(
        self, execution: ExecutionId, session_id: str, *, wait: float | None = None
    ) -> AbstractAsyncContextManager[SessionWork]:
        """The awaitable form of :meth:`open_session` / :meth:`mutate` / :meth:`end_session` for
        ``async`` handlers: ``async with participant.session_work(e, s) as work:`` admits the work
        (awaiting, never blocking a thread, up to ``wait`` s while a checkpoint runs), counts it in
        flight (prepare waits for it) and holds the session lock; inside, run the handler and
        report ``work.set(new_state)`` (opens the session or bumps its revision) or
        ``work.end()``. See :mod:`._session_work`."""
        return session_work(self, execution, session_id, wait=self._wait(wait))

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

    def _encode(
        self, execution: ExecutionId, session_id: str, revision: int, state: Any
    ) -> bytes | Exception | None:
        """The ``resource_snapshot`` payload of ``state`` at ``revision`` (``None`` unless
        exported); a codec error is kept, not raised (the commit raises it)."""
        if self.mode != "exported":
            return None
        try:
            data: Any = self.codec.encode(state)
        except (TypeError, ValueError) as exc:
            return exc
        if isinstance(data, bytearray | memoryview):
            data = bytes(data)
        if type(data) is not bytes:
            return TypeError(f"the codec returned {type(data).__name__}, not bytes")
        return snapshot_payload(execution, session_id, revision, self.codec.name, data)

    def _wait(self, wait: float | None) -> float:
        return self.admission_wait if wait is None else wait

    def sessions(self, execution: ExecutionId) -> list[str]:
        with self._cond:
            return sorted(self._by_execution.get(execution, ()))

    def _add_session(self, execution: ExecutionId, session_id: str, session: _Session) -> None:
        self._sessions[(execution, session_id)] = session
        self._by_execution.setdefault(execution, set()).add(session_id)
        self._touch(execution, session_id)

    def _touch(self, execution: ExecutionId, session_id: str) -> None:
        """The session's state, revision or existence changed: the next export re-reads it.
        Every change of ``_sessions`` or of a session's ``encoded`` / ``revision`` calls this
        (lock held)."""
        self._dirty.add((execution, session_id))

    def _drop_session(self, execution: ExecutionId, session_id: str) -> None:
        self._touch(execution, session_id)
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

    def _export_rows(self, scope: ScopeSource) -> Export:
        if self.mode == "stateless":
            return Export(records=[], executions=[])
        if self.mode == "restart_only":
            in_scope = scope_test(resolve_scope(scope))
            live = [e for e in self._live_executions() if in_scope(e)]
            return Export(records=[], executions=[], restarts=live)
        # Incremental: only the sessions touched since the last export are read again; the
        # others keep the (payload, revision) the last export took, which is still theirs.
        sessions = self._sessions
        rows = self._rows
        for key in self._dirty:
            session = sessions.get(key)
            if session is None:  # ended since
                rows.discard(key)
                continue
            encoded = session.encoded
            if not isinstance(encoded, bytes):  # stays dirty: every export refuses it until fixed
                raise InvalidRecordError(
                    f"{self.codec.name} codec cannot encode session {key[1]} of {key[0]}: {encoded}"
                ) from (encoded if isinstance(encoded, Exception) else None)
            rows.set(key, (encoded, session.revision))
        self._dirty = set()
        # the rows as of now (immutable tuples; a session's row is replaced, never changed),
        # sorted and filtered by scope when the batches are built
        frozen = rows.freeze(scope)
        codec = self.codec.name

        def build() -> list[RecordBatch]:
            keys, kept = frozen.kept()
            return [
                snapshot_batch(
                    codec,
                    [(e, sid, row[1]) for (e, sid), row in zip(keys, kept, strict=True)],
                    [row[0] for row in kept],
                )
            ]

        executions = frozen.executions()  # one entry per execution, in order
        return Export(records=DeferredBatches(build), executions=executions, sorted_unique=True)

    def _check_references(
        self,
        store: str | ObjectStore,
        source_checkpoint_id: str,
        records: Sequence[Record],
        scope: frozenset[ExecutionId] | None,
    ) -> None:
        """Every session revision an agent boundary of the source checkpoint names at this
        instance must be in the replacement set at exactly that revision."""
        have = {
            (r.execution, r.session_id): r.revision for r in records if isinstance(r, ResourceSnapshotRecord)
        }
        referenced = _referenced_revisions(open_store(store), source_checkpoint_id, self.instance)
        for execution, sessions in referenced:
            if scope is not None and execution not in scope:
                continue
            for session_id, revision in sorted(sessions.items()):
                held = have.get((execution, session_id))
                if held != revision:
                    found = "missing" if held is None else f"at revision {held}"
                    raise InvalidRecordError(
                        f"agent boundary of {execution} needs session {session_id} of {self.kind}/"
                        f"{self.instance} at revision {revision}; the checkpoint has it {found}",
                        rollout_id=execution.rollout_id,
                        attempt=execution.attempt,
                        session_id=session_id,
                    )

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
                encoded = self._encode(nxt, session_id, revision, state)
                session = _Session(state=state, revision=revision, encoded=encoded)
                self._add_session(nxt, session_id, session)
                restored.add(nxt)
            return list(restored)

        return install

    def _retire_state(self, executions: Sequence[ExecutionId]) -> None:
        for execution in self._covered_live(executions):
            for session_id in list(self._by_execution.get(execution, ())):
                self._drop_session(execution, session_id)


def _referenced_revisions(
    store: ObjectStore, checkpoint_id: str, instance: str
) -> list[tuple[ExecutionId, dict[str, int]]]:
    """``(execution, {session: revision})`` that the agent boundaries of ``checkpoint_id`` name
    at resources ``instance``, read from the agent components' member indexes (no payloads).

    A published checkpoint's agent components come from its global record (pinned by digest);
    an unpublished one's (a participant-level restore) from the listing of its prefix.
    """
    readers: list[ArchiveReader] = []
    try:
        record, _ = read_record(store, checkpoint_id)
    except CheckpointNotFoundError:
        agents = f"{layout.checkpoint_prefix(checkpoint_id)}/components/agent/"
        for info in store.list(agents):
            if info.key.endswith(f"/{layout.MANIFEST_NAME}"):
                readers.append(ArchiveReader.open(store, info.key.rsplit("/", 1)[0]))
    else:
        for ref in record.components:
            if ref.kind == "agent":
                readers.append(ArchiveReader.open(store, ref.prefix, expected_sha256=ref.manifest.sha256))
    out: list[tuple[ExecutionId, dict[str, int]]] = []
    for reader in readers:
        for member in reader.members(kind="agent_boundary"):
            resources = (member.refs or {}).get("resources")
            sessions = resources.get(instance) if isinstance(resources, dict) else None
            if isinstance(sessions, dict) and sessions:
                execution = ExecutionId(rollout_id=member.rollout_id, attempt=member.attempt)
                out.append((execution, {str(k): int(v) for k, v in sessions.items() if isinstance(v, int)}))
    return out


def snapshot_payload(
    execution: ExecutionId, session_id: str, revision: int, codec: str, state: bytes
) -> bytes:
    """One ``resource_snapshot`` payload: orjson of the model's JSON shape (state as base64)."""
    doc = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "rollout_id": execution.rollout_id,
        "attempt": execution.attempt,
        "session_id": session_id,
        "revision": revision,
        "codec": codec,
        "state": b64(state),
    }
    return encode_docs([doc])[0]


def snapshot_batch(
    codec: str, sessions: Sequence[tuple[ExecutionId, str, int]], payloads: Sequence[bytes]
) -> RecordBatch:
    """The ``resource_snapshot`` members of ``(execution, session_id, revision)`` with their
    payloads (:func:`snapshot_payload`, built when the state was set): what
    ``ResourceSnapshotRecord`` validates is checked per column."""
    check_lengths([codec], "codec", 1, 128)
    check_ids((s for _, s, _ in sessions), "session_id")
    check_non_negative((r for _, _, r in sessions), "revision")
    return RecordBatch(
        kind=ResourceSnapshotRecord.kind,
        rollout_ids=tuple(e.rollout_id for e, _, _ in sessions),
        attempts=tuple(e.attempt for e, _, _ in sessions),
        keys=tuple(s for _, s, _ in sessions),
        payloads=tuple(payloads),
        revisions=tuple(r for _, _, r in sessions),
    )


def _session_order(key: tuple[ExecutionId, str]) -> tuple[str, int, str]:
    return (key[0].rollout_id, key[0].attempt, key[1])


def _session_execution(key: tuple[ExecutionId, str]) -> ExecutionId:
    return key[0]
