"""The dispositions of a classified checkpoint as columns: ``RecoveryPlan.rollouts``.

A million rollouts are a million dispositions; holding each as a :class:`RolloutPlan` in a dict
costs about 300 bytes and a microsecond per rollout before anyone looks at one. :class:`RolloutPlans`
keeps one entry per rollout in six parallel lists (ids sorted, shared strings for dispositions,
reasons and states) and builds a :class:`RolloutPlan` only for the rollouts a caller reads. It is
a read-only ``Mapping[str, RolloutPlan]`` in rollout-id order, as the dict it replaces was.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal, cast

from pydantic import JsonValue

from ..format.records import DispatchState
from ..ids import ExecutionId

__all__ = ["DISPOSITIONS", "Disposition", "RolloutPlan", "RolloutPlans"]

Disposition = Literal["completed", "continue", "fresh_dispatch"]
DISPOSITIONS: tuple[Disposition, ...] = ("completed", "continue", "fresh_dispatch")


@dataclass(frozen=True)
class RolloutPlan:
    """The disposition of one dispatched execution (``attempt`` is the checkpointed attempt N)."""

    rollout_id: str
    attempt: int
    disposition: Disposition
    reason: str
    state: DispatchState
    restart_only: bool = False

    @property
    def execution(self) -> ExecutionId:
        return ExecutionId(rollout_id=self.rollout_id, attempt=self.attempt)

    @property
    def next_attempt(self) -> int:
        """The attempt that runs after a restore: N for ``completed`` (nothing runs), else N+1."""
        return self.attempt if self.disposition == "completed" else self.attempt + 1

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "rollout_id": self.rollout_id,
            "attempt": self.attempt,
            "disposition": self.disposition,
            "reason": self.reason,
            "state": self.state,
            "restart_only": self.restart_only,
            "next_attempt": self.next_attempt,
        }


class RolloutPlans(Mapping[str, RolloutPlan]):
    """Rollout id -> :class:`RolloutPlan`, materialised on access (ids in sorted order)."""

    __slots__ = ("_attempts", "_dispositions", "_ids", "_reasons", "_restart_only", "_states")

    def __init__(
        self,
        rollout_ids: list[str],
        attempts: list[int],
        dispositions: list[Disposition],
        reasons: list[str],
        states: list[str],
        restart_only: list[bool],
        *,
        ordered: bool = False,
    ) -> None:
        """Parallel lists, one entry per rollout, ``rollout_ids`` sorted and unique (checked,
        unless the caller says with ``ordered`` that it checked them itself)."""
        if (
            not len(rollout_ids)
            == len(attempts)
            == len(dispositions)
            == len(reasons)
            == len(states)
            == len(restart_only)
        ):
            raise ValueError("RolloutPlans: columns of different lengths")
        if not ordered and any(a >= b for a, b in pairwise(rollout_ids)):
            raise ValueError("RolloutPlans: rollout ids must be sorted and unique")
        self._ids = rollout_ids
        self._attempts = attempts
        self._dispositions = dispositions
        self._reasons = reasons
        self._states = states
        self._restart_only = restart_only

    def _position(self, rollout_id: object) -> int:
        if not isinstance(rollout_id, str):
            return -1
        i = bisect_left(self._ids, rollout_id)
        return i if i < len(self._ids) and self._ids[i] == rollout_id else -1

    def _plan(self, i: int) -> RolloutPlan:
        return RolloutPlan(
            self._ids[i],
            self._attempts[i],
            self._dispositions[i],
            self._reasons[i],
            cast(DispatchState, self._states[i]),
            self._restart_only[i],
        )

    def __getitem__(self, rollout_id: str) -> RolloutPlan:
        i = self._position(rollout_id)
        if i < 0:
            raise KeyError(rollout_id)
        return self._plan(i)

    def __contains__(self, rollout_id: object) -> bool:
        return self._position(rollout_id) >= 0

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __repr__(self) -> str:
        return f"RolloutPlans({len(self)} rollouts, {self.counts()})"

    def values(self) -> Iterator[RolloutPlan]:  # type: ignore[override]
        """Each rollout's plan, built as it is reached."""
        return (self._plan(i) for i in range(len(self._ids)))

    def items(self) -> Iterator[tuple[str, RolloutPlan]]:  # type: ignore[override]
        return ((self._ids[i], self._plan(i)) for i in range(len(self._ids)))

    def counts(self) -> dict[str, int]:
        """Rollouts per disposition (every disposition named, zeros included), without a plan each."""
        out: dict[str, int] = dict.fromkeys(DISPOSITIONS, 0)
        for disposition in DISPOSITIONS:
            out[disposition] = self._dispositions.count(disposition)
        return out

    def with_disposition(self, disposition: Disposition) -> list[RolloutPlan]:
        """The plans of one disposition, in rollout-id order."""
        return [self._plan(i) for i, d in enumerate(self._dispositions) if d == disposition]
