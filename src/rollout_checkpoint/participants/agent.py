"""The whitebox agent participant: one active run per rollout attempt, parked, never cancelled.

A run is *parked* (ready for a checkpoint) when it sits at a completed non-terminal turn, or
while it waits on its first model call since that boundary (the policy model cuts or queues
that call, so nothing the agent did since the boundary is lost). A run in the middle of its
turn (tool calls, its own computation) blocks prepare; prepare never cancels it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, cast

from ..errors import IdentityConflictError, InvalidPhaseError, InvalidRecordError, UnknownExecutionError
from ..format.chunks import DEFAULT_MAX_CHUNKS
from ..format.records import AgentBoundaryRecord, Record
from ..ids import ExecutionId, validate_id
from ..protocol import (
    DEFAULT_LEASE_GRACE_SECONDS,
    DeferredBatches,
    Export,
    ExportRows,
    Readiness,
    RowsExport,
    ScopeSource,
    WorkerTopology,
    execution_key,
    resolve_scope,
    restamp,
    scope_test,
    wrong_kind,
)
from ._boundaries import Chunk, SavedBoundary, boundary_batch, chunked_batches, seal_chunks

__all__ = ["AgentMode", "AgentParticipant"]

AgentMode = Literal["exported", "restart_only"]


_Row = tuple[SavedBoundary, str | None, tuple[Chunk, ...], bytes]
"""What an export takes of a run: ``(boundary, awaited model call, chunks, payload)`` (format 2;
format 1 keeps ``()`` and ``b""`` for the last two)."""


@dataclass
class _AgentRun:
    running: bool
    saved: SavedBoundary | None = None  # the latest boundary, encoded when reported
    restored: bool = False  # restored and not yet picked up by its replacement
    restart_only: bool = False  # this run cannot continue: reported as a restart, never exported
    awaiting: str | None = None  # the model call the run is parked on (first since its boundary)
    calls_since_boundary: int = 0
    chunks: tuple[Chunk, ...] = ()  # format 2: sealed chunks of a prefix of saved.items
    chunked: tuple[SavedBoundary, tuple[Chunk, ...], str | None, bytes] | None = None  # last payload
    sealed: tuple[SavedBoundary, tuple[Chunk, ...], tuple[Chunk, ...]] | None = None
    """Format 2: ``(saved, chunks, seal_chunks(saved, chunks))`` computed when ``saved`` was
    reported, so that a commit of an unchanged run seals nothing inside the pause."""

    @property
    def boundary(self) -> AgentBoundaryRecord | None:
        return None if self.saved is None else self.saved.record()


class AgentParticipant(RowsExport):
    """A whitebox agent: one active run per rollout attempt, parked at safe points.

    Integration: ``begin`` when a run starts (returns the restored boundary to continue from,
    if any), ``boundary`` after every completed non-terminal turn, ``start_turn`` before the next
    turn, ``awaiting_model`` around each model call, ``finish`` when the run ends (terminal runs
    are never exported).

    Modes: ``exported`` (boundaries are committed and restored as attempt N+1) or
    ``restart_only`` (the agent cannot continue a run: it never blocks prepare, exports nothing
    and reports every live run as a restart, so the reader dispatches it afresh). A single run
    can declare itself restart-only with ``begin(..., restart_only=True)`` (say, its environment
    cannot export state).
    """

    def __init__(
        self,
        instance: str = "agent",
        *,
        mode: AgentMode = "exported",
        topology: WorkerTopology = "single_process",
        lease_grace_seconds: float = DEFAULT_LEASE_GRACE_SECONDS,
        clock: Callable[[], float] | None = None,
        start_paused: bool = False,
    ) -> None:
        if mode not in ("exported", "restart_only"):
            raise ValueError(f"agent mode must be 'exported' or 'restart_only', not {mode!r}")
        super().__init__(
            kind="agent",
            instance=instance,
            mode=mode,
            topology=topology,
            concurrency="per_session_serialized",
            lease_grace_seconds=lease_grace_seconds,
            clock=clock,
            start_paused=start_paused,
        )
        self._runs: dict[ExecutionId, _AgentRun] = {}
        # Indexes kept in step with ``_runs`` so readiness costs O(blockers), not O(runs).
        self._running: set[ExecutionId] = set()  # in a turn and not parked
        self._awaiting: set[ExecutionId] = set()  # parked on a model call
        self._pending: set[ExecutionId] = set()
        self._restart_only: set[ExecutionId] = set()  # live runs that can only restart
        # The export, kept up to date incrementally (see ``_export``): the runs whose row may
        # have changed since the last export, and each exported run's row.
        self._rows_chunked: bool | None = None  # the format the rows were built for
        self._dirty: set[ExecutionId] = set()
        self._rows: ExportRows[ExecutionId, _Row] = ExportRows(execution_key)

    def begin(
        self, execution: ExecutionId, *, wait: float = 0.0, restart_only: bool = False
    ) -> AgentBoundaryRecord | None:
        """Start a run (new work: refused while admission is closed, or parked up to ``wait`` s).

        Returns the boundary a restore installed for this attempt (the run continues from it,
        at that boundary), else ``None`` (the run starts from its input, already running).
        ``restart_only`` marks a run that can only restart from its input.
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
                run.restart_only = restart_only or self.mode == "restart_only"
                self._pending.discard(execution)
                self._mark(execution)
                return run.boundary
            self._register(execution)
            self._runs[execution] = _AgentRun(
                running=True, restart_only=restart_only or self.mode == "restart_only"
            )
            self._mark(execution)
            return None

    def start_turn(self, execution: ExecutionId, *, wait: float = 0.0) -> None:
        """Leave the boundary and run the next turn (refused or parked while admission is closed)."""
        with self._cond:
            self._admit(execution, wait=wait)
            run = self._run(execution)
            if run.running:
                raise InvalidPhaseError(f"{execution}: a turn is already running")
            run.running = True
            run.calls_since_boundary = 0
            self._mark(execution)

    @contextmanager
    def awaiting_model(self, execution: ExecutionId, call_id: str) -> Iterator[None]:
        """Mark the time a running turn waits on model call ``call_id``.

        The first model call since the boundary parks the run: prepare counts it ready (the
        model cuts or queues the call; after a restore attempt N+1 re-issues ``call_id`` from
        the boundary). On leaving, a run that was parked does not go on while a checkpoint is
        open: it waits for resume, so nothing it does after the call escapes the checkpoint.
        Later calls in the same turn do not park the run (their predecessors' results would be
        lost): end the turn with a boundary first.
        """
        validate_id(call_id, "call_id")
        with self._cond:
            self._require_live(execution)
            run = self._run(execution)
            if not run.running:
                raise InvalidPhaseError(f"{execution}: awaiting a model call outside a turn (start a turn)")
            if run.awaiting is not None:
                raise InvalidPhaseError(f"{execution}: already awaiting model call {run.awaiting}")
            parks = run.calls_since_boundary == 0 and run.saved is not None
            run.calls_since_boundary += 1
            if parks:
                run.awaiting = call_id
                self._mark(execution)
                self._changed()
        try:
            yield
        finally:
            if parks:
                self._leave_model_wait(execution, run)

    def _leave_model_wait(self, execution: ExecutionId, run: _AgentRun) -> None:
        with self._cond:
            # Parked: stay parked until the checkpoint ends (resume or lease expiry).
            while not self._accepting and self._runs.get(execution) is run:
                self._cond.wait(self._wait_slice(None))
                self._check_lease()
            if self._runs.get(execution) is run:
                run.awaiting = None
                self._mark(execution)
                self._changed()
            self.fence.check(execution)  # retired while parked: the run is void

    def boundary(self, execution: ExecutionId, record: AgentBoundaryRecord) -> None:
        """A completed non-terminal turn: keep ``record`` as the run's latest safe boundary."""
        if record.execution != execution:
            raise IdentityConflictError(
                f"boundary record of {record.execution} reported for {execution}",
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
            )
        if record.pending_model_call_id is not None:
            raise InvalidRecordError(
                f"{execution}: pending_model_call_id is set by the agent participant, not reported"
            )
        known = self._runs.get(execution)  # only to share unchanged item bytes; checked below
        # encoded once, here, not inside a checkpoint's pause
        saved = SavedBoundary.of(record, None if known is None else known.saved)
        sealed = None
        if self.incremental_commits:  # format 2: the chunks a commit would seal, sealed here
            base = () if known is None else known.chunks
            if base and not _extends(saved, None if known is None else known.saved, base[-1].end):
                base = ()  # the history was rewritten: sealed afresh (as the lock's check finds)
            sealed = (saved, base, seal_chunks(saved, base, self.max_chunks))
            payload = saved.chunked_payload(sealed[2], None)
        with self._cond:
            self._require_live(execution)
            run = self._run(execution)
            if run.awaiting is not None:
                raise InvalidPhaseError(f"{execution}: boundary while awaiting model call {run.awaiting}")
            if run.saved is not None and record.boundary_index <= run.saved.boundary_index:
                raise InvalidRecordError(
                    f"{execution}: boundary_index {record.boundary_index} does not advance past "
                    f"{run.saved.boundary_index}"
                )
            if run.chunks and not _extends(saved, run.saved, run.chunks[-1].end):
                run.chunks = ()  # the history was rewritten, not extended: chunk it afresh
            run.saved = saved
            # kept only if sealed on top of the chunks the run holds (a commit or a rewrite of
            # the history since then changed them: the commit seals afresh)
            run.sealed = sealed if sealed is not None and sealed[1] is run.chunks else None
            if run.sealed is not None:
                run.chunked = (saved, run.sealed[2], None, payload)
            run.running = False
            run.calls_since_boundary = 0
            self._mark(execution)
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

    def _mark(self, execution: ExecutionId) -> None:
        """Keep the readiness indexes (and the export's dirty set) in step with the run's state."""
        run = self._runs.get(execution)
        self._dirty.add(execution)
        self._running.discard(execution)
        self._awaiting.discard(execution)
        if run is not None and run.restart_only:
            self._restart_only.add(execution)
        else:
            self._restart_only.discard(execution)
        if run is None or run.restart_only:
            return
        if run.awaiting is not None:
            self._awaiting.add(execution)
        elif run.running:
            self._running.add(execution)

    def _drop_run(self, execution: ExecutionId) -> None:
        self._runs.pop(execution, None)
        self._running.discard(execution)
        self._awaiting.discard(execution)
        self._pending.discard(execution)
        self._restart_only.discard(execution)
        self._dirty.add(execution)

    def _run(self, execution: ExecutionId) -> _AgentRun:
        run = self._runs.get(execution)
        if run is None:
            raise UnknownExecutionError(f"{execution} has no run at agent/{self.instance}")
        return run

    def _restarts(self, scope: frozenset[ExecutionId] | None) -> list[ExecutionId]:
        if not self._restart_only:
            return []
        in_scope = scope_test(scope)
        return sorted((e for e in self._restart_only if in_scope(e)), key=execution_key)

    # -- hooks ------------------------------------------------------------------------------
    def _readiness(self) -> Readiness:
        running = sorted(self._running, key=execution_key)
        restarts = self._restarts(None)
        return Readiness(
            blockers=[str(e) for e in running],
            counts={
                "runs": len(self._runs),
                "running": len(running),
                "awaiting_model": len(self._awaiting),
                "at_boundary": len(self._runs) - len(running) - len(self._awaiting),
                "restored_pending": len(self._pending),
                "restart_only": len(restarts),
            },
            restarts=restarts,
        )

    def _export_rows(self, scope: ScopeSource) -> Export:
        """Incremental: only the runs that changed since the last export are looked at (their
        rows rebuilt: a format-2 boundary seals its new chunk here, as it always did); the
        others keep the row the last export built, which is still exactly what they would build
        (a run's row changes only through ``_mark`` / ``_drop_run``, which mark it dirty). The
        batches are built from the rows after the freeze (:class:`DeferredBatches`)."""
        runs = self._runs
        chunked = self.incremental_commits
        rows = self._rows
        changed: list[tuple[ExecutionId, _AgentRun | None]]
        if self._rows_chunked is not chunked:  # first export, or the format changed: every run
            changed = list(runs.items())
            self._rows_chunked = chunked
            rows.clear()
        else:
            get = runs.get
            changed = [(e, get(e)) for e in self._dirty]
        for execution, run in changed:
            if run is None or run.restart_only or run.saved is None:  # dropped, or not exported
                rows.discard(execution)
            else:
                rows.set(execution, self._chunked(run) if chunked else (run.saved, run.awaiting, (), b""))
        self._dirty = set()
        frozen = rows.freeze(scope)  # sorted and filtered by scope when first used
        restarts = self._restarts(resolve_scope(scope)) if self._restart_only else []
        if chunked:
            records = DeferredBatches(lambda: chunked_batches(frozen.kept()[1]))
        else:
            records = DeferredBatches(lambda: [boundary_batch([(b, a) for b, a, _, _ in frozen.kept()[1]])])
        executions = frozen.executions()
        return Export(records=records, executions=executions, restarts=restarts, sorted_unique=True)

    max_chunks: int = DEFAULT_MAX_CHUNKS
    """Format 2: a boundary lists at most this many ``output_chunk`` members (then one)."""

    def _chunked(self, run: _AgentRun) -> tuple[SavedBoundary, str | None, tuple[Chunk, ...], bytes]:
        """The run's boundary in format 2: its history's chunks sealed up to now (only the new
        items are encoded) and its schema-2 payload (the same bytes object while nothing changed,
        so the commit refers to the earlier copy without comparing bytes)."""
        saved = run.saved
        assert saved is not None
        sealed = run.sealed
        if sealed is not None and sealed[0] is saved and sealed[1] is run.chunks:
            run.chunks = sealed[2]  # sealed when the boundary was reported
        else:
            run.chunks = seal_chunks(saved, run.chunks, self.max_chunks)
        run.sealed = None
        cached = run.chunked
        if (
            cached is not None
            and cached[0] is saved
            and cached[1] is run.chunks
            and cached[2] == run.awaiting
        ):
            return saved, run.awaiting, run.chunks, cached[3]
        payload = saved.chunked_payload(run.chunks, run.awaiting)
        run.chunked = (saved, run.chunks, run.awaiting, payload)
        return saved, run.awaiting, run.chunks, payload

    def _validate_restore(self, records: Sequence[Record]) -> Callable[[], list[ExecutionId]]:
        if records and self.mode == "restart_only":
            raise InvalidRecordError(f"a restart_only agent/{self.instance} has no boundaries to restore")
        boundaries: dict[ExecutionId, AgentBoundaryRecord] = {}
        for record in records:
            if not isinstance(record, AgentBoundaryRecord):
                raise wrong_kind(record, "agent")
            if record.execution in boundaries:
                raise InvalidRecordError(f"{record.execution} has more than one boundary in the checkpoint")
            boundaries[record.execution] = record
        saved = {
            execution: SavedBoundary.of(cast(AgentBoundaryRecord, restamp(record, execution.attempt + 1)))
            for execution, record in boundaries.items()
        }

        def install() -> list[ExecutionId]:
            restored = []
            for execution in boundaries:
                nxt = execution.next_attempt()
                self._runs[nxt] = _AgentRun(
                    running=False,
                    saved=saved[execution],
                    restored=True,
                )
                self._pending.add(nxt)
                self._mark(nxt)
                restored.append(nxt)
            return restored

        return install

    def _retire_state(self, executions: Sequence[ExecutionId]) -> None:
        for execution in self._covered_live(executions):
            self._drop_run(execution)


def _extends(saved: SavedBoundary, before: SavedBoundary | None, end: int) -> bool:
    """``saved``'s history keeps the first ``end`` items of ``before``'s (it was extended)."""
    return before is not None and saved.items[:end] == before.items[:end]
