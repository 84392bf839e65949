"""Recovery after a crash or a restart: :meth:`RecoverOperations.recover`.

What a supervisor's coordinator does once every replacement process answers (``docs/protocol.md``,
"Recovery"): abort whatever checkpoint or restore a participant still holds open, retire the
attempts still live in the survivors (their loops stop at the fence), restore this run's latest
published checkpoint into survivors and replacements alike, and resume. The restore resets the
incarnations the coordinator keeps, so the next checkpoint publishes again.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from ..errors import CheckpointNotFoundError
from ..format.manifests import new_checkpoint_id
from ..ids import ExecutionId
from ..protocol import ParticipantControl, ParticipantStatus, Phase
from ..telemetry import Attr, Span, log_fields, operation
from ._core import log
from ._restore import RestoreOperations
from ._types import RestoreOutcome

__all__ = ["RecoverOperations"]

_LIVE_STATES = ("queued", "running", "finished")


class RecoverOperations(RestoreOperations):
    """``recover`` and ``latest_of_run``."""

    def recover(
        self,
        retire: Iterable[ExecutionId] = (),
        *,
        checkpoint_id: str | None = None,
        deadline_s: float = 60.0,
        restore_id: str | None = None,
        verify: bool = True,
        fallback: bool = False,
        resume: bool = True,
    ) -> RestoreOutcome:
        """Bring every participant back to this run's latest checkpoint after a crash.

        1. Waits for a pending asynchronous publication, then aborts any checkpoint or restore a
           participant still holds open (a checkpoint is resumed, a restore undone).
        2. Retires, everywhere, the attempts still live: those the registry holds as queued,
           running or finished, plus ``retire`` (the attempts a replacement coordinator knows
           it dispatched). The survivors drop their state and refuse them from then on.
        3. Restores ``checkpoint_id`` (default: the newest checkpoint this run published, see
           :meth:`latest_of_run`) into survivors and replacements alike, as :meth:`restore`
           does (all or nothing; ``verify`` / ``fallback`` / ``restore_id`` are its).
        4. Resumes (unless ``resume=False``: then call :meth:`resume` with the restore id).

        The coordinator keeps the restored incarnations, so the next checkpoint publishes
        again. Raises :class:`~rollout_checkpoint.errors.CheckpointNotFoundError` when this run
        published nothing (after steps 1 and 2 and, unless ``resume=False``, an explicit resume
        that also opens replacements started paused: dispatch every rollout afresh), and the
        errors of :meth:`restore` (nothing restored then; call ``recover`` again once the
        cause is gone). A participant that cannot be reached fails it: recovery needs them all.
        """
        with operation(Span.coordinator("recover")) as recovering:
            self.wait_until_finished()
            deadline = self.clock() + deadline_s
            self._close_open(deadline)
            batch = {e.rollout_id: e for e in retire}
            for info in self.registry.executions(_LIVE_STATES):
                known = batch.get(info.rollout_id)
                if known is None or known.attempt < info.attempt:
                    batch[info.rollout_id] = info.execution
            if batch:
                self._retire_everywhere(sorted(batch.values(), key=lambda e: e.rollout_id), deadline_s)
            source = checkpoint_id if checkpoint_id is not None else self.latest_of_run()
            if source is None:
                if resume:  # an explicit resume: opens a replacement that started paused too
                    self.resume(new_checkpoint_id("recover"), deadline_s=deadline_s)
                raise CheckpointNotFoundError(
                    f"recover: run {self.run_id} published no checkpoint in {self.store.url}; every "
                    "participant was resumed and the live attempts retired: dispatch afresh",
                    run_id=self.run_id,
                )
            recovering.set(Attr.SOURCE_CHECKPOINT_ID, source)
            outcome = self.restore(
                source, deadline_s=deadline_s, restore_id=restore_id, verify=verify, fallback=fallback
            )
            if resume:
                self.resume(outcome.restore_id, deadline_s=deadline_s)
            return outcome

    def latest_of_run(self) -> str | None:
        """The newest checkpoint published by this coordinator's run (``run_id``), or ``None``
        (another run sharing the store never counts)."""
        record = self._latest_record_of_run()
        return None if record is None else record.checkpoint_id

    def _close_open(self, deadline: float) -> None:
        """End every checkpoint or restore a participant holds open (the crash interrupted it)."""

        def close(name: str, participant: ParticipantControl) -> None:
            status: ParticipantStatus = self._call(name, "status", participant.status, hook=False)
            active = status.checkpoint_id
            if active is None:
                return
            cleanup = max(deadline, self.clock() + self.cleanup_grace_s)
            log.info(
                "recover: %s holds %s open (%s); closing it",
                name,
                active,
                status.phase.value,
                extra=log_fields(checkpoint_id=active, participant=name),
            )
            # a restore (installed, or still reading: active while idle) is undone, not resumed
            if status.phase is Phase.RESTORED or status.phase is Phase.IDLE:
                self._call(name, "abort_restore", participant.abort_restore, active, cleanup, hook=False)
            else:
                self._call(name, "resume", participant.resume, active, cleanup, hook=False)

        ordered = self._ordered()
        self._fan_out([(name, partial(close, name, p)) for name, p in reversed(ordered)])
