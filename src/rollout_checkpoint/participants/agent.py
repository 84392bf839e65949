"""The whitebox agent participant: one active run per rollout attempt, parked at completed turns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from ..control import WorkerTopology
from ..control_plane import (
    DEFAULT_LEASE_GRACE_SECONDS,
    Export,
    Participant,
    Readiness,
    execution_key,
    restamp,
    wrong_kind,
)
from ..errors import IdentityConflictError, InvalidPhaseError, InvalidRecordError, UnknownExecutionError
from ..ids import ExecutionId
from ..records import AgentBoundaryRecord, Record

__all__ = ["AgentParticipant"]


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
                raise wrong_kind(record, "agent")
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
