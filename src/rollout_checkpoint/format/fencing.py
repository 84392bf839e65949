"""Attempt tombstones: once an attempt is retired (or replaced by a restore), nothing it sends
can change state again.

A restore creates attempt N+1 and tombstones N. A delayed request, write or retire from any
attempt ``<= N`` then gets a typed ``stale_attempt`` error. Tombstones are kept until the
integrating framework says the rollout is forgotten (:meth:`AttemptFence.forget`), and they are
part of what a participant commits (manifest ``extra["tombstones"]``), so fencing survives a
restore into a fresh process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from ..errors import InvalidRecordError, StaleAttemptError
from ..ids import ExecutionId, validate_id

__all__ = ["AttemptFence"]


class AttemptFence:
    """Thread-safe map ``rollout_id -> highest retired attempt``.

    Tombstones only ever rise (retire and load keep the maximum), so no sequence of calls can
    re-admit an attempt that was once retired, short of :meth:`forget`.
    """

    def __init__(self, tombstones: Mapping[str, int] | None = None) -> None:
        self._lock = threading.Lock()
        self._marks: dict[str, int] = {}
        if tombstones:
            self.load(tombstones)

    def check(self, execution: ExecutionId) -> None:
        """Raise :class:`StaleAttemptError` if ``execution`` is at or below its tombstone."""
        with self._lock:
            mark = self._marks.get(execution.rollout_id)
        if mark is not None and execution.attempt <= mark:
            raise StaleAttemptError(
                f"attempt {execution.attempt} of rollout {execution.rollout_id!r} is retired "
                f"(every attempt <= {mark} is); use a later attempt",
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                retired_through=mark,
            )

    def is_retired(self, execution: ExecutionId) -> bool:
        with self._lock:
            mark = self._marks.get(execution.rollout_id)
        return mark is not None and execution.attempt <= mark

    def highest(self, rollout_id: str) -> int | None:
        """The highest retired attempt of ``rollout_id``, or ``None`` if it has no tombstone."""
        with self._lock:
            return self._marks.get(rollout_id)

    def retire(self, executions: Iterable[ExecutionId]) -> None:
        """Tombstone every given attempt (and thereby every earlier attempt of its rollout)."""
        with self._lock:
            for execution in executions:
                current = self._marks.get(execution.rollout_id, -1)
                if execution.attempt > current:
                    self._marks[execution.rollout_id] = execution.attempt

    def forget(self, rollout_ids: Iterable[str]) -> None:
        """Drop the tombstones of rollouts the framework will never run again."""
        with self._lock:
            for rollout_id in rollout_ids:
                self._marks.pop(rollout_id, None)

    def snapshot(self) -> dict[str, int]:
        """A copy of the tombstones, sorted by rollout id (JSON-ready; goes into a commit)."""
        with self._lock:
            return dict(sorted(self._marks.items()))

    def load(self, tombstones: Mapping[str, int]) -> None:
        """Merge committed tombstones in, keeping the higher mark per rollout.

        The whole mapping is validated before anything is merged: a malformed entry raises
        :class:`InvalidRecordError` and changes nothing.
        """
        checked: list[tuple[str, int]] = []
        for rollout_id, attempt in tombstones.items():
            if not isinstance(rollout_id, str):
                raise InvalidRecordError("tombstone rollout ids must be strings", rollout_id=rollout_id)
            try:
                validate_id(rollout_id, "rollout_id")
            except Exception as exc:
                raise InvalidRecordError(f"invalid tombstone: {exc}", rollout_id=rollout_id) from None
            if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
                raise InvalidRecordError(
                    f"tombstone of {rollout_id!r} must be a non-negative integer, got {attempt!r}",
                    rollout_id=rollout_id,
                )
            checked.append((rollout_id, attempt))
        self.retire(ExecutionId(rollout_id=r, attempt=a) for r, a in checked)

    def __len__(self) -> int:
        with self._lock:
            return len(self._marks)

    def __contains__(self, rollout_id: object) -> bool:
        with self._lock:
            return rollout_id in self._marks
