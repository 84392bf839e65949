"""What a participant kind hands the control plane (:class:`Readiness`, :class:`Export`) and the
small execution helpers the kinds share."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import InvalidRecordError
from ..format.columnar import RecordBatch, RecordBatches
from ..format.records import Record
from ..ids import ExecutionId

__all__ = [
    "BLOCKERS_REPORTED",
    "Export",
    "ExportRecords",
    "Readiness",
    "RecordBatch",
    "RecordBatches",
    "execution_key",
    "restamp",
    "scope_test",
    "wrong_kind",
]

BLOCKERS_REPORTED = 100
"""A prepare report (or a commit's not-ready error) names at most this many of a
:class:`Readiness`'s blockers; ``blocker_count`` is never capped."""

ExportRecords = Sequence[Record] | RecordBatches
"""What an export commits: record models, or pre-encoded columnar batches (the fast path)."""


def execution_key(execution: ExecutionId) -> tuple[str, int]:
    """Sort key of an execution (rollout id, then attempt)."""
    return (execution.rollout_id, execution.attempt)


@dataclass(frozen=True)
class Readiness:
    """A subclass's answer to "may a checkpoint be taken now?": ready when nothing blocks."""

    blockers: Sequence[str] = ()
    counts: Mapping[str, int] = field(default_factory=dict)
    restarts: Sequence[ExecutionId] = ()


@dataclass(frozen=True)
class Export:
    """What a subclass commits: records to archive, the executions they cover, and the live
    executions that must restart from their input instead (restart-only state).

    ``records`` never changes once the export exists, whatever the participant does next (the
    commit may write it after the participant resumed): :class:`RecordBatches` hold encoded
    bytes; a sequence of (frozen) record models is copied into a tuple here. ``executions``
    and ``restarts`` may come in any order and repeat: the commit dedupes and sorts them.
    """

    records: ExportRecords
    executions: Sequence[ExecutionId]
    restarts: Sequence[ExecutionId] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.records, RecordBatches | tuple):
            object.__setattr__(self, "records", tuple(self.records))


def scope_test(scope: frozenset[ExecutionId] | None) -> Callable[[ExecutionId], bool]:
    """``execution in scope`` (everything when ``scope`` is None), by rollout id and attempt: an
    export tests every live execution, and plain strings and ints hash and compare much faster
    than the pydantic models (and allocate nothing the garbage collector tracks)."""
    if scope is None:
        return lambda execution: True
    attempts = {e.rollout_id: e.attempt for e in scope}
    if len(attempts) == len(scope):  # one attempt per rollout, as a coordinator's scope has
        return lambda execution: attempts.get(execution.rollout_id) == execution.attempt
    keys = {(e.rollout_id, e.attempt) for e in scope}
    return lambda execution: (execution.rollout_id, execution.attempt) in keys


def restamp(record: Record, attempt: int) -> Record:
    """The same record under another attempt (restore installs attempt N's state as N+1)."""
    return record.model_copy(update={"attempt": attempt})


def wrong_kind(record: Record, expected: str) -> InvalidRecordError:
    """The error for a restored record this kind of participant does not hold."""
    return InvalidRecordError(
        f"{record.kind} record of {record.execution} cannot be restored by a {expected} participant",
        kind=record.kind,
    )
