"""A participant's state and its phase transitions, under one condition variable.

::

    idle --prepare--> preparing --(ready)--> prepared --commit--> committed
                                                      --commit(async)--> frozen (upload starts)
    idle --restore--> restored
    any  --resume---> idle          (resume is also abort; a lease expiry is a resume)

A resume of a ``frozen`` checkpoint leaves its background upload running (it is bound to its own
checkpoint id and generation, see ``_publication``); a lease expiry while ``frozen`` cancels it.

:class:`PhaseMachine` holds everything the control plane tracks (phase, active checkpoint id,
admission flag, lease, resumed ids, cached replies, live executions, tombstones) and the
transitions every operation shares: ending a checkpoint, fencing a resumed id, noticing an
expired lease. The operations themselves are in :class:`~rollout_checkpoint.protocol.Participant`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from ..errors import CheckpointConflictError, StaleCheckpointError
from ..format.fencing import AttemptFence
from ..ids import ExecutionId, validate_id
from ..telemetry import log_fields
from ._idempotency import ReplyCache, ResumedIds
from ._lease import DEFAULT_LEASE_GRACE_SECONDS, MAX_DEADLINE_SECONDS, Lease
from ._publication import Uploads
from ._types import (
    Capabilities,
    CheckpointMode,
    ConcurrencyContract,
    ParticipantKind,
    ParticipantStatus,
    Phase,
    UnsafeEffect,
    WorkerTopology,
    new_incarnation,
)

__all__ = ["PhaseMachine"]

log = logging.getLogger(__name__)


class PhaseMachine:
    """The state every participant holds; ``self._cond`` guards all of it (the subclass's too)."""

    def __init__(
        self,
        *,
        kind: ParticipantKind,
        instance: str,
        mode: CheckpointMode,
        topology: WorkerTopology = "single_process",
        concurrency: ConcurrencyContract = "per_session_serialized",
        lease_grace_seconds: float = DEFAULT_LEASE_GRACE_SECONDS,
        clock: Callable[[], float] | None = None,
        max_deadline_seconds: float = MAX_DEADLINE_SECONDS,
        start_paused: bool = False,
    ) -> None:
        if lease_grace_seconds < 0:
            raise ValueError("lease_grace_seconds must be >= 0")
        if not max_deadline_seconds > 0:
            raise ValueError("max_deadline_seconds must be > 0")
        # how far ahead a prepare/renew/commit/collect/restore deadline may lie (deadline_too_far)
        self.max_deadline_seconds = float(max_deadline_seconds)
        self._capabilities = Capabilities(
            kind=kind,
            instance=validate_id(instance, "instance"),
            mode=mode,
            topology=topology,
            concurrency=concurrency,
        )
        self.lease_grace_seconds = float(lease_grace_seconds)
        self._clock = clock if clock is not None else time.time
        self._cond = threading.Condition(threading.RLock())
        # Serializes commit and restore, whose object-store I/O runs outside ``_cond``.
        self._op_gate = threading.Lock()
        self.fence = AttemptFence()
        self.events: Counter[str] = Counter()
        self._phase = Phase.IDLE
        self._active: str | None = None
        self._accepting = True
        self._generation = 0  # bumped by every resume: work started before it is void
        self._lease = Lease(self._clock, self._on_lease_timer, f"lease-{self.kind}-{self.instance}")
        self._resumed = ResumedIds()
        self._replies = ReplyCache()
        # what an installed, not yet resumed restore changed: (restore id, tombstones before it,
        # the attempts it installed), so ``abort_restore`` can put everything back
        self._restore_undo: tuple[str, dict[str, int], tuple[ExecutionId, ...]] | None = None
        self._live: dict[str, ExecutionId] = {}
        self._waiting = 0  # prepares inside their wait right now (each holds a thread)
        self._effects: dict[str, list[UnsafeEffect]] = {}
        self._uploads = Uploads(f"{kind}/{instance}", self._clock)
        # drawn once per build: a restarted process answers with another (``docs/protocol.md``)
        self._incarnation = new_incarnation()
        # admission held closed since start, until a restore or an explicit resume (no hook
        # runs here: a subclass's state is not built yet, and its admission starts as this says)
        self._held = bool(start_paused)
        self._accepting = not self._held

    # -- identity -------------------------------------------------------------------------
    @property
    def kind(self) -> ParticipantKind:
        return self._capabilities.kind

    @property
    def instance(self) -> str:
        return self._capabilities.instance

    @property
    def mode(self) -> CheckpointMode:
        return self._capabilities.mode

    @property
    def incarnation(self) -> str:
        """This participant's incarnation id, drawn when it was built; every control reply
        carries it."""
        return self._incarnation

    def capabilities(self) -> Capabilities:
        return self._capabilities

    def start_paused(self) -> None:
        """Hold admission closed (new work parks or is refused) until a restore is resumed or
        an explicit resume of any id: what a replacement process does before a coordinator
        restores it, so a retried request of a dead attempt is never served on empty state.
        A no-op while a checkpoint or restore is active (its resume opens admission)."""
        with self._cond:
            if self._active is None:
                self._held = True
                self._set_accepting(False)

    def status(self) -> ParticipantStatus:
        with self._cond:
            self._check_lease()
            return ParticipantStatus(
                capabilities=self._capabilities,
                phase=self._phase,
                checkpoint_id=self._active,
                accepting=self._accepting,
                live=len(self._live),
                tombstones=len(self.fence),
                uploading=self._uploads.running(),
                waiting=self._waiting,
                incarnation=self._incarnation,
            )

    @property
    def phase(self) -> Phase:
        with self._cond:
            self._check_lease()
            return self._phase

    @property
    def accepting(self) -> bool:
        with self._cond:
            self._check_lease()
            return self._accepting

    # -- helpers for subclasses (call with ``self._cond`` held) ------------------------------------
    def _changed(self) -> None:
        """Wake waiters (prepare, parked work): some state they wait on changed."""
        self._cond.notify_all()

    def _on_admission(self, accepting: bool) -> None:
        """Called (lock held) whenever admission opens or closes."""

    # -- transitions (lock held) ------------------------------------------------------------------
    def _restoring(self) -> bool:
        """A restore is reading: an active id while the phase is still idle."""
        return self._active is not None and self._phase is Phase.IDLE

    def _refuse_stale(self, checkpoint_id: str) -> None:
        if checkpoint_id in self._resumed:
            raise StaleCheckpointError(
                f"checkpoint {checkpoint_id} was already resumed here; it can never become active again",
                checkpoint_id=checkpoint_id,
            )

    def _conflict(self, checkpoint_id: str, op: str) -> CheckpointConflictError:
        return CheckpointConflictError(
            f"{op} {checkpoint_id}: checkpoint {self._active} is active here ({self._phase.value})",
            checkpoint_id=checkpoint_id,
            active=self._active,
        )

    def _set_accepting(self, accepting: bool, *, notify: bool = False) -> None:
        """Open or close admission; the hook runs on a change (or always with ``notify``: a
        checkpoint starting on a participant whose admission was held closed since start)."""
        if self._accepting != accepting or notify:
            self._accepting = accepting
            self._on_admission(accepting)
        self._changed()

    def _end_checkpoint(self, reason: str, *, release: bool = False) -> None:
        """Resume: back to idle, admission open, the id fenced, in-flight writes voided.

        A participant started paused keeps admission closed unless ``release`` (the resume of
        a restore, or an explicit resume while nothing is active)."""
        if self._active is not None:
            self._resumed.remember(self._active)
            log.debug(
                "%s/%s: checkpoint %s ended (%s)",
                self.kind,
                self.instance,
                self._active,
                reason,
                extra=log_fields(self._active, f"{self.kind}/{self.instance}"),
            )
        self._active = None
        self._phase = Phase.IDLE
        self._generation += 1
        self._replies.clear()
        self._restore_undo = None
        self._lease.clear()
        if release:
            self._held = False
        self._set_accepting(not self._held)

    def _extend_lease(self, deadline: float) -> None:
        self._lease.extend(deadline, self.lease_grace_seconds)

    def _on_lease_timer(self) -> None:
        with self._cond:
            self._check_lease()

    def _check_lease(self) -> None:
        """The coordinator vanished if the lease ran out: resume by ourselves."""
        if self._active is not None and self._lease.expired():
            self.events["lease_expired"] += 1
            log.warning(
                "%s/%s: lease of checkpoint %s expired; resuming by itself",
                self.kind,
                self.instance,
                self._active,
                extra=log_fields(self._active, f"{self.kind}/{self.instance}"),
            )
            if self._phase is Phase.FROZEN:  # the coordinator vanished: nobody will collect it
                self._uploads.cancel(self._active)
            self._end_checkpoint("lease expired")

    def _wait_slice(self, remaining: float | None) -> float | None:
        """Wake no later than the lease expiry, so a waiter notices it (the timer also notifies)."""
        return self._lease.wait_slice(remaining)
