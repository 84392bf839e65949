"""The admission gate: which work a participant accepts, and which executions it tracks.

New work passes :meth:`AdmissionGate._admit` (fenced attempts, identity conflicts, then closed
admission, where it is refused or parks until resume); work on a tracked execution passes
:meth:`AdmissionGate._require_live`. Subclasses call these with ``self._cond`` held.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..errors import AdmissionClosedError, IdentityConflictError, UnknownExecutionError
from ..ids import ExecutionId
from ._phases import PhaseMachine

__all__ = ["AdmissionGate"]


class AdmissionGate(PhaseMachine):
    """Admission and live-execution tracking on top of the phase state."""

    def wait_open(self, timeout: float | None = None) -> bool:
        """Block until admission is open (or ``timeout`` seconds pass); ``True`` if open.

        A server parks new work here instead of failing it while a checkpoint is active.
        """
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._check_lease()
                if self._accepting:
                    return True
                remaining = None if end is None else end - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(self._wait_slice(remaining))

    # -- helpers for subclasses (call with ``self._cond`` held) ------------------------------------
    def _admit(self, execution: ExecutionId, *, wait: float = 0.0) -> None:
        """Gate for *new* work: fenced attempts, identity conflicts, then closed admission.

        With ``wait > 0`` new work parks up to ``wait`` seconds for admission to reopen.
        """
        self._check_lease()
        self.fence.check(execution)
        self._check_identity(execution)
        end = time.monotonic() + wait
        parked = False
        while not self._accepting:
            parked = True
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise AdmissionClosedError(
                    f"{self.kind}/{self.instance} is paused for checkpoint {self._active} "
                    f"({self._phase.value}); retry after resume",
                    checkpoint_id=self._active,
                    rollout_id=execution.rollout_id,
                    attempt=execution.attempt,
                )
            self._cond.wait(self._wait_slice(remaining))
            self._check_lease()
        if parked:
            # The world may have changed while parked (a retire, a restore of this rollout).
            self.fence.check(execution)
            self._check_identity(execution)

    def _check_identity(self, execution: ExecutionId) -> None:
        live = self._live.get(execution.rollout_id)
        if live is not None and live.attempt != execution.attempt:
            raise IdentityConflictError(
                f"rollout {execution.rollout_id!r} already has live attempt {live.attempt} here; "
                f"attempt {execution.attempt} conflicts (retire the other attempt first)",
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                live_attempt=live.attempt,
            )

    def _require_live(self, execution: ExecutionId) -> None:
        """Gate for work on an execution already tracked here (boundaries, finishing)."""
        self._check_lease()
        self.fence.check(execution)
        self._check_identity(execution)
        if self._live.get(execution.rollout_id) != execution:
            raise UnknownExecutionError(
                f"{execution} is not live at {self.kind}/{self.instance}",
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
            )

    def _register(self, execution: ExecutionId) -> None:
        self._check_identity(execution)
        self._live[execution.rollout_id] = execution

    def _unregister(self, execution: ExecutionId) -> None:
        if self._live.get(execution.rollout_id) == execution:
            del self._live[execution.rollout_id]

    def _in_scope(self, execution: ExecutionId, scope: frozenset[ExecutionId] | None) -> bool:
        return scope is None or execution in scope

    def _covered_live(self, batch: Sequence[ExecutionId]) -> list[ExecutionId]:
        """The live executions a retire of ``batch`` covers (same rollout, attempt at or below)."""
        covered = []
        for execution in batch:
            live = self._live.get(execution.rollout_id)
            if live is not None and live.attempt <= execution.attempt:
                covered.append(live)
        return covered
