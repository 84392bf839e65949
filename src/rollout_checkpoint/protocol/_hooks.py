"""What a participant kind hands the control plane (:class:`Readiness`, :class:`Export`) and the
small execution helpers the kinds share."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, TypeVar

from ..errors import InvalidRecordError
from ..format.columnar import RecordBatch, RecordBatches
from ..format.records import Record
from ..ids import ExecutionId, ScopeMemo

__all__ = [
    "BLOCKERS_REPORTED",
    "DeferredBatches",
    "Export",
    "ExportRecords",
    "Readiness",
    "RecordBatch",
    "RecordBatches",
    "execution_key",
    "in_scope_items",
    "restamp",
    "scope_frozenset",
    "scope_test",
    "wrong_kind",
]

BLOCKERS_REPORTED = 100
"""A prepare report (or a commit's not-ready error) names at most this many of a
:class:`Readiness`'s blockers; ``blocker_count`` is never capped."""

ExportRecords = Sequence[Record] | RecordBatches
"""What an export commits: record models, or pre-encoded columnar batches (the fast path)."""


class DeferredBatches(RecordBatches):
    """Batches an export builds **after** the freeze, from a snapshot it took under the lock.

    ``build`` must read only what the export captured (immutable values: encoded payloads,
    frozen records, tuples), never the participant's live state, so building later, in an
    asynchronous commit's upload after the resume, gives exactly the batches the export would
    have built at the freeze. The pause then holds only the snapshot's cost (proportional to
    what changed since the previous export, plus C-level copies); the column building, the
    per-column checks and the sort run outside it. Built once, on first use (thread-safe); an
    error raised by ``build`` is raised by that use (the commit's write: the upload fails and
    nothing is published).
    """

    def __init__(self, build: Callable[[], Iterable[RecordBatch]]) -> None:
        self._build: Callable[[], Iterable[RecordBatch]] | None = build
        self._lock = threading.Lock()
        self._batches: tuple[RecordBatch, ...] | None = None

    @property
    def batches(self) -> tuple[RecordBatch, ...]:  # type: ignore[override]
        with self._lock:
            if self._batches is None:
                assert self._build is not None
                built = RecordBatches(self._build())
                self._batches, self._count, self._build = built.batches, len(built), None
            return self._batches

    def __len__(self) -> int:
        self.batches  # noqa: B018 (built on first use)
        return self._count

    def __repr__(self) -> str:
        if self._batches is None:
            return "DeferredBatches(not built)"
        return super().__repr__()


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
    and ``restarts`` may come in any order and repeat: the commit dedupes and sorts them. Either
    may be a :class:`DeferredExecutions` listed after the freeze from an immutable snapshot
    (:meth:`ExportRows.freeze`); an asynchronous commit's ``frozen`` reply then lists none.
    """

    records: ExportRecords
    executions: Sequence[ExecutionId]
    restarts: Sequence[ExecutionId] = ()
    sorted_unique: bool = False
    """``executions`` and ``restarts`` are already distinct and in :func:`execution_key` order
    (an export that keeps them sorted spares the commit a sort of every live execution)."""

    def __post_init__(self) -> None:
        if not isinstance(self.records, RecordBatches | tuple):
            object.__setattr__(self, "records", tuple(self.records))


_scope_index: tuple[frozenset[ExecutionId], dict[str, int] | None] | None = None
_scope_index_lock = threading.Lock()


def scope_test(scope: frozenset[ExecutionId] | None) -> Callable[[ExecutionId], bool]:
    """``execution in scope`` (everything when ``scope`` is None), by rollout id and attempt:
    an export tests every live execution, and a rollout id (a string, its hash cached) is
    looked up much faster than an execution id is hashed. The index is built once per scope
    (the participants of one process that commit one scope share it)."""
    if scope is None:
        return lambda execution: True
    index: list[dict[str, int] | None] = []  # built on the first test, not for an unused test

    def test(execution: ExecutionId) -> bool:
        if not index:
            index.append(scope_attempts(scope))
        attempts = index[0]
        if attempts is None:
            return execution in scope
        return attempts.get(execution.rollout_id) == execution.attempt

    return test


_Item = TypeVar("_Item")
_first: Any = itemgetter(0)  # an item's first element: its execution, by default


def in_scope_items(
    scope: frozenset[ExecutionId] | None,
    items: Sequence[_Item],
    execution_of: Callable[[_Item], ExecutionId] | None = None,
) -> list[_Item]:
    """The items whose execution (``execution_of(item)``; by default the item's first element)
    is in ``scope``, in order: one pass, the rollout id looked up in the scope's index (no
    execution-id hash per item: an export filters every live execution with it)."""
    if scope is None:
        return list(items)
    of: Callable[[_Item], ExecutionId] = _first if execution_of is None else execution_of
    attempts = scope_attempts(scope)
    if attempts is None:
        return [item for item in items if of(item) in scope]
    get = attempts.get
    out = []
    for item in items:
        execution = of(item)
        if get(execution.rollout_id) == execution.attempt:
            out.append(item)
    return out


def scope_attempts(scope: frozenset[ExecutionId]) -> dict[str, int] | None:
    """Rollout id -> attempt of every execution in ``scope`` (``None`` when a rollout has more
    than one attempt in it), built once per scope object (do not change the result)."""
    global _scope_index
    with _scope_index_lock:  # held while building: the other participants wait for one build
        memo = _scope_index
        if memo is not None and memo[0] is scope:
            return memo[1]
        built = {e.rollout_id: e.attempt for e in scope}
        attempts = built if len(built) == len(scope) else None  # one attempt per rollout
        _scope_index = (scope, attempts)
        return attempts


def restamp(record: Record, attempt: int) -> Record:
    """The same record under another attempt (restore installs attempt N's state as N+1)."""
    return record.model_copy(update={"attempt": attempt})


def wrong_kind(record: Record, expected: str) -> InvalidRecordError:
    """The error for a restored record this kind of participant does not hold."""
    return InvalidRecordError(
        f"{record.kind} record of {record.execution} cannot be restored by a {expected} participant",
        kind=record.kind,
    )


_frozen_scope: ScopeMemo[frozenset[ExecutionId]] = ScopeMemo(frozenset)


def scope_frozenset(scope: Sequence[ExecutionId] | None) -> frozenset[ExecutionId] | None:
    """``frozenset(scope)``, built once for the participants of one process that commit the same
    scope **tuple** (a coordinator hands every in-process participant its one tuple of live
    executions: hashing 100,000 of them three times was a measurable part of the pause)."""
    if scope is None:
        return None
    if isinstance(scope, frozenset):
        return scope
    if isinstance(scope, tuple):
        return _frozen_scope(scope)
    return frozenset(scope)
