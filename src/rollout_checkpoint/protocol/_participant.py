"""The :class:`Participant` base class: the control operations every kind of server shares.

:class:`Participant` implements :class:`~rollout_checkpoint.protocol.ParticipantControl` once
for every kind of server; a subclass only says what "ready" means, what it exports and how it
validates and installs restored state (the hooks, declared in :mod:`._commit_restore` and
below, in the spirit of NeMo Gym's ``CheckpointParticipant``). This module holds the operations
that run wholly under the participant's lock (prepare, resume, renew, retire, forget); those that
do archive I/O (commit, collect, restore) are in :mod:`._commit_restore`. The state and phase
transitions live in :mod:`._phases`, admission in :mod:`._admission`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from ..errors import InvalidPhaseError
from ..format.fencing import AttemptFence
from ..ids import ExecutionId, validate_id
from ..telemetry import Span, operation, participant_operation
from ._cancel import Cancellation
from ._commit_restore import CommitRestore
from ._hooks import BLOCKERS_REPORTED, execution_key
from ._lease import check_deadline
from ._types import Phase, PrepareReport, ResumeReply, UnsafeEffect

__all__ = ["BLOCKERS_REPORTED", "Participant"]


class Participant(CommitRestore, abc.ABC):
    """Base class of every in-process participant; see the package docstring for the rules."""

    # -- control operations ---------------------------------------------------------------------
    @participant_operation("prepare")
    def prepare(
        self, checkpoint_id: str, deadline: float, *, cancel: Cancellation | None = None
    ) -> PrepareReport:
        """Close admission, wait (until ``deadline``) for accepted work to reach a safe boundary.

        Not ready by the deadline is an answer (``ready=False``), not an error: admission stays
        closed until resume (or lease expiry). A repeat for the same id waits again, or returns
        the cached report once ready. A deadline more than ``max_deadline_seconds`` ahead is
        ``deadline_too_far`` (nothing changes). ``cancel`` (the caller went away) ends the wait
        at once with the not-ready answer, the thread freed; nothing else changes.
        """
        validate_id(checkpoint_id, "checkpoint_id")
        if cancel is not None:
            cancel.on_cancel(self._wake)
        with self._cond:
            now = self._clock()
            self._check_lease()
            check_deadline(deadline, now, "prepare", limit=self.max_deadline_seconds)
            self._refuse_stale(checkpoint_id)
            if self._active is None:
                self._active = checkpoint_id
                self._phase = Phase.PREPARING
                self._set_accepting(False, notify=True)
            elif self._active != checkpoint_id:
                raise self._conflict(checkpoint_id, "prepare")
            elif self._phase is Phase.RESTORED or self._restoring():
                raise InvalidPhaseError(
                    f"{checkpoint_id} is a restore here; resume it before preparing a checkpoint",
                    phase=self._phase.value,
                )
            self._extend_lease(deadline)
            self._waiting += 1
            try:
                with operation(Span.participant("wait_ready")):
                    return self._wait_ready(checkpoint_id, deadline, cancel)
            except BaseException:
                if self._active == checkpoint_id and self._phase is Phase.PREPARING:
                    self._end_checkpoint("prepare failed")
                raise
            finally:
                self._waiting -= 1

    @participant_operation("resume")
    def resume(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        """Return to idle and reopen admission (also the abort). Fences the id for good, even on
        a participant that never saw it, so a delayed prepare cannot close admission later.
        Resuming a ``frozen`` checkpoint starts its background upload."""
        validate_id(checkpoint_id, "checkpoint_id")
        with self._cond:
            self._check_lease()
            check_deadline(deadline, self._clock(), "resume")
            if self._active is None and self._held:  # started paused: an explicit resume opens
                self._end_checkpoint("resume of a participant started paused", release=True)
                self._resumed.remember(checkpoint_id)
                return self._resume_reply(checkpoint_id, Phase.IDLE, idempotent=False)
            if checkpoint_id in self._resumed:
                return self._resume_reply(checkpoint_id, Phase.IDLE, idempotent=True)
            if self._active is None:
                self._resumed.remember(checkpoint_id)
                return self._resume_reply(checkpoint_id, self._phase, idempotent=True)
            if self._active != checkpoint_id:
                raise self._conflict(checkpoint_id, "resume")
            frozen = self._phase is Phase.FROZEN
            # a restore's resume opens a participant that started paused; a checkpoint's does not
            self._end_checkpoint("resume", release=self._phase is Phase.RESTORED)
            if frozen:  # encoding and upload run after the resume
                self._uploads.launch(checkpoint_id)
            return self._resume_reply(checkpoint_id, Phase.IDLE, idempotent=False)

    def abort_restore(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        """Undo the restore ``checkpoint_id`` if it installed here, and end it for good.

        A coordinator whose restore failed (another participant refused, a deadline passed)
        calls this at every participant it reached, so a refused restore changes nothing: the
        attempts it installed here are dropped and the tombstones are put back as they were
        before it (which also undoes the retires of the restore's own fencing step). A restore
        still reading is ended (it then installs nothing). Where another checkpoint or restore
        is active, or the id was never seen, only the id is fenced, so a delayed copy can never
        install: nothing else changes. Idempotent; a restore already resumed is not undone (its
        attempts may have run), the answer is idempotent then.
        """
        validate_id(checkpoint_id, "checkpoint_id")
        with self._cond:
            self._check_lease()
            check_deadline(deadline, self._clock(), "abort_restore")
            if checkpoint_id in self._resumed or self._active != checkpoint_id:
                self._resumed.remember(checkpoint_id)
                return self._resume_reply(checkpoint_id, self._phase, idempotent=True)
            if self._phase is Phase.RESTORED:
                undo = self._restore_undo
                assert undo is not None and undo[0] == checkpoint_id
                _, tombstones, installed = undo
                self._retire_state(installed)
                for execution in installed:
                    self._unregister(execution)
                self.fence = AttemptFence(tombstones)
                self.events["restore_aborted"] += 1
            elif not self._restoring():
                raise InvalidPhaseError(
                    f"abort_restore {checkpoint_id}: it is a checkpoint here ({self._phase.value}), "
                    "not a restore; resume it instead",
                    phase=self._phase.value,
                )
            self._end_checkpoint("restore aborted")
            return self._resume_reply(checkpoint_id, Phase.IDLE, idempotent=False)

    def renew(self, checkpoint_id: str, deadline: float) -> None:
        """Extend the lease of the active checkpoint to ``deadline + lease_grace_seconds``."""
        validate_id(checkpoint_id, "checkpoint_id")
        with self._cond:
            self._check_lease()
            check_deadline(deadline, self._clock(), "renew", limit=self.max_deadline_seconds)
            self._refuse_stale(checkpoint_id)
            if self._active != checkpoint_id:
                raise self._conflict(checkpoint_id, "renew")
            self._extend_lease(deadline)

    @participant_operation("retire")
    def retire(self, executions: Sequence[ExecutionId], deadline: float) -> None:
        """Tombstone these attempts and drop their live state (only in idle/restored).

        Retiring an attempt below its rollout's tombstone is ``stale_attempt`` (nothing
        changes); retiring exactly the tombstoned attempt again is an idempotent no-op, so a
        retry after a lost answer succeeds.
        """
        with self._cond:
            self._check_lease()
            check_deadline(deadline, self._clock(), "retire")
            if self._phase not in (Phase.IDLE, Phase.RESTORED) or self._restoring():
                raise InvalidPhaseError(
                    f"retire during {self._phase.value} ({self._active}): resume first",
                    phase=self._phase.value,
                )
            batch = list(executions)
            for execution in batch:
                mark = self.fence.highest(execution.rollout_id)
                if mark is not None and execution.attempt < mark:
                    self.fence.check(execution)
            self.fence.retire(batch)
            self._retire_state(batch)
            for live in self._covered_live(batch):
                self._live.pop(live.rollout_id, None)
            self._changed()

    @participant_operation("forget")
    def forget(self, rollout_ids: Sequence[str]) -> None:
        """The framework will never run these rollouts again: drop their tombstones and effects."""
        ids = [validate_id(r, "rollout_id") for r in rollout_ids]
        with self._cond:
            self._check_lease()
            self.fence.forget(ids)
            for rollout_id in ids:
                self._effects.pop(rollout_id, None)

    def declare_unsafe_effect(self, execution: ExecutionId, description: str) -> UnsafeEffect:
        """Record an external effect that cannot be rolled back (an e-mail sent, a payment made).

        It goes into every later commit covering the rollout, and the recovery reader rejects
        such a checkpoint. Kept until the rollout is forgotten.
        """
        effect = UnsafeEffect(
            rollout_id=execution.rollout_id, attempt=execution.attempt, description=description
        )
        with self._cond:
            self._check_lease()
            self.fence.check(execution)
            self._effects.setdefault(execution.rollout_id, []).append(effect)
        return effect

    def close(self) -> None:
        """Stop the lease timer (the participant stays usable; the lease is then checked lazily)."""
        with self._cond:
            self._lease.stop_timer()

    # -- hooks ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def _retire_state(self, executions: Sequence[ExecutionId]) -> None:
        """Drop the live state of these attempts (and of earlier attempts of their rollouts).

        Subclass state exists only for registered executions, so ``self._covered_live(executions)``
        names exactly what to drop (still registered while this hook runs). Lock held.
        """

    # -- internals ----------------------------------------------------------------------------
    def _resume_reply(self, checkpoint_id: str, phase: Phase, *, idempotent: bool) -> ResumeReply:
        return ResumeReply(
            checkpoint_id=checkpoint_id, phase=phase, idempotent=idempotent, incarnation=self._incarnation
        )

    def _wake(self) -> None:
        with self._cond:
            self._changed()

    def _wait_ready(
        self, checkpoint_id: str, deadline: float, cancel: Cancellation | None = None
    ) -> PrepareReport:
        while True:
            if self._active != checkpoint_id:
                # The checkpoint ended (resume or lease expiry) while this prepare waited.
                return PrepareReport(
                    checkpoint_id=checkpoint_id, phase=Phase.IDLE, ready=False, incarnation=self._incarnation
                )
            if self._phase in (Phase.PREPARED, Phase.COMMITTED, Phase.FROZEN) and self._replies.prepare:
                return self._replies.prepare
            readiness = self._readiness()
            ready = not readiness.blockers
            report = PrepareReport(
                checkpoint_id=checkpoint_id,
                phase=Phase.PREPARED if ready else Phase.PREPARING,
                ready=ready,
                blockers=tuple(readiness.blockers[:BLOCKERS_REPORTED]),
                blocker_count=len(readiness.blockers),
                counts=dict(readiness.counts),
                restarts=tuple(sorted(set(readiness.restarts), key=execution_key)),
                incarnation=self._incarnation,
            )
            if ready:
                self._phase = Phase.PREPARED
                self._replies.prepare = report
                return report
            if cancel is not None and cancel.cancelled:
                self.events["prepare_cancelled"] += 1
                return report
            remaining = deadline - self._clock()
            if remaining <= 0:
                self.events["prepare_not_ready"] += 1
                return report
            self._cond.wait(self._wait_slice(remaining))
            self._check_lease()
