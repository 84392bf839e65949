"""The in-process participant control plane: phases, admission gate, lease and idempotency.

:class:`Participant` implements :class:`~rollout_checkpoint.control.ParticipantControl` once
for every kind of server; a subclass only says what "ready" means, what it exports and how it
validates and installs restored state (the hooks at the bottom of the class, in the spirit of
NeMo Gym's ``CheckpointParticipant``).

Phases::

    idle --prepare--> preparing --(ready)--> prepared --commit--> committed
    idle --restore--> restored
    any  --resume---> idle          (resume is also abort; a lease expiry is a resume)

Rules every operation follows (see ``docs/participants.md``):

* it carries a ``checkpoint_id`` (validated as an id) and an absolute ``deadline`` (epoch
  seconds); an already expired deadline raises ``deadline_exceeded`` and changes nothing;
* repeating it for the same id is idempotent and returns the same answer (commit exports and
  writes its manifest exactly once);
* a different active id is ``checkpoint_conflict``; an id already resumed is
  ``stale_checkpoint`` forever after (the last :data:`RESUMED_IDS_KEPT` ids are remembered), so a
  late prepare can never close admission again;
* while a checkpoint is active a lease (latest deadline + ``lease_grace_seconds``) runs; when it
  expires the participant resumes by itself, checked lazily on every call and by a timer thread.

One condition variable (``self._cond``) guards all state, the subclass's included: subclasses
mutate their state while holding it and call :meth:`Participant._changed` when work reaches a
safe boundary, which wakes a waiting prepare (no busy-wait).
"""

from __future__ import annotations

import abc
import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from . import layout
from .control import (
    Capabilities,
    CheckpointMode,
    CommitReply,
    ConcurrencyContract,
    ParticipantKind,
    ParticipantStatus,
    Phase,
    PrepareReport,
    RestoreReply,
    ResumeReply,
    UnsafeEffect,
    WorkerTopology,
)
from .errors import (
    AdmissionClosedError,
    CheckpointConflictError,
    DeadlineExceededError,
    IdentityConflictError,
    InvalidPhaseError,
    InvalidRecordError,
    ManifestConflictError,
    ObjectExistsError,
    StaleCheckpointError,
    UnknownExecutionError,
)
from .fencing import AttemptFence
from .ids import ExecutionId, validate_id
from .records import Record
from .store import ObjectStore, open_store

__all__ = [
    "BLOCKERS_REPORTED",
    "DEFAULT_LEASE_GRACE_SECONDS",
    "RESUMED_IDS_KEPT",
    "Export",
    "Participant",
    "Readiness",
    "execution_key",
    "restamp",
]

log = logging.getLogger(__name__)

RESUMED_IDS_KEPT = 1024
"""How many resumed checkpoint ids a participant remembers (``stale_checkpoint``). An id older
than the last 1024 resumed ones is forgotten; coordinators never reuse ids, so this only bounds
memory, it does not reopen a real hole."""

BLOCKERS_REPORTED = 100
"""A prepare report names at most this many blockers; ``blocker_count`` is never capped."""

DEFAULT_LEASE_GRACE_SECONDS = 600.0


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
    executions that must restart from their input instead (restart-only state)."""

    records: Sequence[Record]
    executions: Sequence[ExecutionId]
    restarts: Sequence[ExecutionId] = ()


def _check_deadline(deadline: float, now: float, operation: str) -> None:
    if isinstance(deadline, bool) or not isinstance(deadline, int | float) or math.isnan(deadline):
        raise DeadlineExceededError(f"{operation}: deadline must be epoch seconds, got {deadline!r}")
    if deadline <= now:
        raise DeadlineExceededError(
            f"{operation}: deadline {deadline:.3f} already passed (now {now:.3f}); nothing changed",
            deadline=deadline,
        )


class Participant(abc.ABC):
    """Base class of every in-process participant; see the module docstring for the rules."""

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
    ) -> None:
        if lease_grace_seconds < 0:
            raise ValueError("lease_grace_seconds must be >= 0")
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
        self._lease_expires: float | None = None
        self._lease_timer: threading.Timer | None = None
        self._resumed: OrderedDict[str, None] = OrderedDict()
        self._prepare_reply: PrepareReport | None = None
        self._commit_reply: CommitReply | None = None
        self._restore_reply: RestoreReply | None = None
        self._live: dict[str, ExecutionId] = {}
        self._effects: dict[str, list[UnsafeEffect]] = {}

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

    def capabilities(self) -> Capabilities:
        return self._capabilities

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

    # -- control operations ---------------------------------------------------------------------
    def prepare(self, checkpoint_id: str, deadline: float) -> PrepareReport:
        """Close admission, wait (until ``deadline``) for accepted work to reach a safe boundary.

        Not ready by the deadline is an answer (``ready=False``), not an error: admission stays
        closed until resume (or lease expiry). A repeat for the same id waits again, or returns
        the cached report once ready.
        """
        validate_id(checkpoint_id, "checkpoint_id")
        with self._cond:
            now = self._clock()
            self._check_lease()
            _check_deadline(deadline, now, "prepare")
            self._refuse_stale(checkpoint_id)
            if self._active is None:
                self._active = checkpoint_id
                self._phase = Phase.PREPARING
                self._set_accepting(False)
            elif self._active != checkpoint_id:
                raise self._conflict(checkpoint_id, "prepare")
            elif self._phase is Phase.RESTORED or self._restoring():
                raise InvalidPhaseError(
                    f"{checkpoint_id} is a restore here; resume it before preparing a checkpoint",
                    phase=self._phase.value,
                )
            self._extend_lease(deadline)
            try:
                return self._wait_ready(checkpoint_id, deadline)
            except BaseException:
                if self._active == checkpoint_id and self._phase is Phase.PREPARING:
                    self._end_checkpoint("prepare failed")
                raise

    def commit(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
    ) -> CommitReply:
        """Re-check readiness, export once through the archive writer, write the manifest last.

        ``scope`` limits the exported executions (those the coordinator continues); executions
        the participant does not track are ignored. A retry after a lost answer returns the
        cached reply, or adopts a manifest that the lost try already wrote with the same content.
        """
        validate_id(checkpoint_id, "checkpoint_id")
        _check_deadline(deadline, self._clock(), "commit")
        scope_set = frozenset(scope) if scope is not None else None
        self._acquire_gate(deadline, "commit")
        try:
            with self._cond:
                self._check_lease()
                _check_deadline(deadline, self._clock(), "commit")
                self._refuse_stale(checkpoint_id)
                if self._active is None:
                    raise InvalidPhaseError(f"commit {checkpoint_id}: prepare it first", phase="idle")
                if self._active != checkpoint_id:
                    raise self._conflict(checkpoint_id, "commit")
                if self._phase is Phase.COMMITTED and self._commit_reply is not None:
                    return self._commit_reply
                if self._phase is not Phase.PREPARED:
                    raise InvalidPhaseError(
                        f"commit {checkpoint_id}: phase is {self._phase.value}, not prepared",
                        phase=self._phase.value,
                    )
                readiness = self._readiness()
                if readiness.blockers:
                    # Readiness regressed (a blocker appeared): a new prepare must wait again.
                    self._phase = Phase.PREPARING
                    self._prepare_reply = None
                    raise InvalidPhaseError(
                        f"commit {checkpoint_id}: no longer ready ({len(readiness.blockers)} blockers)",
                        phase=self._phase.value,
                        blockers=list(readiness.blockers[:BLOCKERS_REPORTED]),
                    )
                self._extend_lease(deadline)
                export = self._export(scope_set)
                restarts = sorted(set(export.restarts), key=execution_key)
                executions = sorted(set(export.executions), key=execution_key)
                effects = self._effects_in(scope_set)
                extra: dict[str, JsonValue] = {
                    "capabilities": self._capabilities.model_dump(mode="json"),
                    "tombstones": dict(self.fence.snapshot()),
                    "executions": [[e.rollout_id, e.attempt] for e in executions],
                    "restarts": [[e.rollout_id, e.attempt] for e in restarts],
                    "unsafe_effects": [u.model_dump(mode="json") for u in effects],
                }
                for name, value in self._manifest_extra().items():
                    extra.setdefault(name, value)
                generation = self._generation
            ref = self._write_component(checkpoint_id, store, deadline, export.records, extra, generation)
            with self._cond:
                reply = CommitReply(
                    checkpoint_id=checkpoint_id,
                    phase=Phase.COMMITTED,
                    kind=self.kind,
                    instance=self.instance,
                    manifest_key=ref[0],
                    manifest_sha256=ref[1],
                    manifest_bytes=ref[2],
                    executions=tuple(executions),
                    restarts=tuple(restarts),
                    unsafe_effects=tuple(effects),
                )
                self._phase = Phase.COMMITTED
                self._commit_reply = reply
                return reply
        finally:
            self._op_gate.release()

    def restore(
        self,
        checkpoint_id: str,
        source_checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
    ) -> RestoreReply:
        """Install the source checkpoint's state under attempt N+1 and tombstone N.

        ``checkpoint_id`` is a new id naming this restore; ``scope`` names the *source*
        executions (attempt N) to restore (default: all). The whole set is read, verified and
        validated before any of it is installed: a failure changes nothing and reopens
        admission. Success leaves the participant paused (phase ``restored``) until resume.
        """
        validate_id(checkpoint_id, "checkpoint_id")
        validate_id(source_checkpoint_id, "source_checkpoint_id")
        _check_deadline(deadline, self._clock(), "restore")
        scope_set = frozenset(scope) if scope is not None else None
        self._acquire_gate(deadline, "restore")
        try:
            with self._cond:
                self._check_lease()
                _check_deadline(deadline, self._clock(), "restore")
                self._refuse_stale(checkpoint_id)
                if self._active == checkpoint_id and self._restore_reply is not None:
                    if self._restore_reply.source_checkpoint_id != source_checkpoint_id:
                        raise CheckpointConflictError(
                            f"restore {checkpoint_id} already restored "
                            f"{self._restore_reply.source_checkpoint_id}, not {source_checkpoint_id}"
                        )
                    return self._restore_reply
                if self._active is not None:
                    raise self._conflict(checkpoint_id, "restore")
                if self._live:
                    raise InvalidPhaseError(
                        f"restore {checkpoint_id}: {len(self._live)} live executions here; restore needs "
                        "a participant with none (retire them first)",
                        phase=self._phase.value,
                        live=len(self._live),
                    )
                self._active = checkpoint_id
                self._set_accepting(False)
                self._extend_lease(deadline)
                generation = self._generation
            try:
                return self._restore(
                    checkpoint_id, source_checkpoint_id, store, deadline, scope_set, generation
                )
            except BaseException:
                with self._cond:
                    if self._active == checkpoint_id and self._phase is not Phase.RESTORED:
                        # Nothing was installed: forget this try so the same id may be retried.
                        self._active = None
                        self._clear_lease()
                        self._set_accepting(True)
                raise
        finally:
            self._op_gate.release()

    def resume(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        """Return to idle and reopen admission (also the abort). Fences the id for good, even on
        a participant that never saw it, so a delayed prepare cannot close admission later."""
        validate_id(checkpoint_id, "checkpoint_id")
        with self._cond:
            self._check_lease()
            _check_deadline(deadline, self._clock(), "resume")
            if checkpoint_id in self._resumed:
                return ResumeReply(checkpoint_id=checkpoint_id, phase=Phase.IDLE, idempotent=True)
            if self._active is None:
                self._remember_resumed(checkpoint_id)
                return ResumeReply(checkpoint_id=checkpoint_id, phase=self._phase, idempotent=True)
            if self._active != checkpoint_id:
                raise self._conflict(checkpoint_id, "resume")
            self._end_checkpoint("resume")
            return ResumeReply(checkpoint_id=checkpoint_id, phase=Phase.IDLE, idempotent=False)

    def renew(self, checkpoint_id: str, deadline: float) -> None:
        """Extend the lease of the active checkpoint to ``deadline + lease_grace_seconds``."""
        validate_id(checkpoint_id, "checkpoint_id")
        with self._cond:
            self._check_lease()
            _check_deadline(deadline, self._clock(), "renew")
            self._refuse_stale(checkpoint_id)
            if self._active != checkpoint_id:
                raise self._conflict(checkpoint_id, "renew")
            self._extend_lease(deadline)

    def retire(self, executions: Sequence[ExecutionId], deadline: float) -> None:
        """Tombstone these attempts and drop their live state (only in idle/restored).

        Retiring an attempt below its rollout's tombstone is ``stale_attempt`` (nothing
        changes); retiring exactly the tombstoned attempt again is an idempotent no-op, so a
        retry after a lost answer succeeds.
        """
        with self._cond:
            self._check_lease()
            _check_deadline(deadline, self._clock(), "retire")
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
            if self._lease_timer is not None:
                self._lease_timer.cancel()
                self._lease_timer = None

    # -- helpers for subclasses (call with ``self._cond`` held) ------------------------------------
    def _changed(self) -> None:
        """Wake waiters (prepare, parked work): some state they wait on changed."""
        self._cond.notify_all()

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

    # -- hooks ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def _readiness(self) -> Readiness:
        """Blockers (accepted work not at a safe boundary), counts and restarts. Lock held."""

    @abc.abstractmethod
    def _export(self, scope: frozenset[ExecutionId] | None) -> Export:
        """Snapshot the state to commit (immutable records). Lock held; no I/O here."""

    @abc.abstractmethod
    def _validate_restore(self, records: Sequence[Record]) -> Callable[[], list[ExecutionId]]:
        """Validate the whole restored set (attempt N records) and return an installer.

        Raise (``InvalidRecordError``, ``IdentityConflictError``...) on any problem: nothing is
        installed then. The installer runs with the lock held, must not fail, installs every
        execution under attempt N+1 and returns those next attempts. No lock held here.
        """

    @abc.abstractmethod
    def _retire_state(self, executions: Sequence[ExecutionId]) -> None:
        """Drop the live state of these attempts (and of earlier attempts of their rollouts).

        Subclass state exists only for registered executions, so ``self._covered_live(executions)``
        names exactly what to drop (still registered while this hook runs). Lock held.
        """

    def _manifest_extra(self) -> Mapping[str, JsonValue]:
        """Additional JSON for the component manifest (cannot override the standard keys)."""
        return {}

    def _on_admission(self, accepting: bool) -> None:  # noqa: B027 - optional hook
        """Called (lock held) whenever admission opens or closes."""

    # -- internals ----------------------------------------------------------------------------
    def _wait_ready(self, checkpoint_id: str, deadline: float) -> PrepareReport:
        while True:
            if self._active != checkpoint_id:
                # The checkpoint ended (resume or lease expiry) while this prepare waited.
                return PrepareReport(checkpoint_id=checkpoint_id, phase=Phase.IDLE, ready=False)
            if self._phase in (Phase.PREPARED, Phase.COMMITTED) and self._prepare_reply is not None:
                return self._prepare_reply
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
            )
            if ready:
                self._phase = Phase.PREPARED
                self._prepare_reply = report
                return report
            remaining = deadline - self._clock()
            if remaining <= 0:
                self.events["prepare_not_ready"] += 1
                return report
            self._cond.wait(self._wait_slice(remaining))
            self._check_lease()

    def _write_component(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        records: Sequence[Record],
        extra: dict[str, JsonValue],
        generation: int,
    ) -> tuple[str, str, int]:
        from .archive import ArchiveWriter

        target = open_store(store)
        prefix = layout.component_prefix(checkpoint_id, self.kind, self.instance)
        adopted = self._adopt_manifest(target, prefix, checkpoint_id, extra)
        if adopted is not None:
            return adopted
        writer = ArchiveWriter(
            target, prefix, checkpoint_id=checkpoint_id, participant_kind=self.kind, instance=self.instance
        )
        try:
            for record in records:
                self._check_still_active(checkpoint_id, generation, deadline, "commit")
                writer.write(record)
        except BaseException:
            writer.abort()  # no manifest: the uploaded shards stay unreferenced garbage
            raise
        with self._cond:
            # Decided under the lock: a resume either happens before (no manifest, ever) or after.
            self._check_still_active(checkpoint_id, generation, deadline, "commit")
            try:
                writer.commit(extra=extra)
            except (ObjectExistsError, ManifestConflictError):
                adopted = self._adopt_manifest(target, prefix, checkpoint_id, extra)
                if adopted is None:
                    raise
                return adopted
            ref = writer.manifest_ref
            return (ref.key, ref.sha256, ref.bytes)

    def _adopt_manifest(
        self, store: ObjectStore, prefix: str, checkpoint_id: str, extra: dict[str, JsonValue]
    ) -> tuple[str, str, int] | None:
        """A manifest a lost try already wrote is ours iff it commits exactly this content."""
        from .archive import ArchiveReader

        if not store.exists(f"{prefix}/{layout.MANIFEST_NAME}"):
            return None
        reader = ArchiveReader.open(store, prefix)
        manifest = reader.manifest
        if manifest.checkpoint_id != checkpoint_id or dict(manifest.extra) != extra:
            raise ManifestConflictError(
                f"{store.url}/{prefix} already holds a different commit of {self.kind}/{self.instance}",
                key=f"{prefix}/{layout.MANIFEST_NAME}",
            )
        ref = reader.manifest_ref
        return (ref.key, ref.sha256, ref.bytes)

    def _restore(
        self,
        checkpoint_id: str,
        source_checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: frozenset[ExecutionId] | None,
        generation: int,
    ) -> RestoreReply:
        from .archive import ArchiveReader

        source = open_store(store)
        prefix = layout.component_prefix(source_checkpoint_id, self.kind, self.instance)
        reader = ArchiveReader.open(source, prefix)
        manifest = reader.manifest
        if (manifest.checkpoint_id, manifest.participant_kind, manifest.instance) != (
            source_checkpoint_id,
            self.kind,
            self.instance,
        ):
            raise InvalidRecordError(
                f"{prefix}: manifest is {manifest.participant_kind}/{manifest.instance} of checkpoint "
                f"{manifest.checkpoint_id}, not {self.kind}/{self.instance} of {source_checkpoint_id}"
            )
        # Digest-checks the member index; iter_records below checks every shard before its rows.
        indexed = sum(1 for _ in reader.members())
        extra = dict(manifest.extra)
        tombstones = AttemptFence()
        raw_tombstones = extra.get("tombstones", {})
        if not isinstance(raw_tombstones, dict):
            raise InvalidRecordError(f"{prefix}: manifest extra 'tombstones' must be an object")
        tombstones.load(raw_tombstones)  # type: ignore[arg-type]  # validated inside
        committed = _parse_executions(extra.get("executions", []), "executions")
        restarts = _parse_executions(extra.get("restarts", []), "restarts")
        wanted = {e for e in committed if self._in_scope(e, scope)}
        records: list[Record] = []
        for record in reader.iter_records():
            self._check_still_active(checkpoint_id, generation, deadline, "restore")
            execution = record.execution
            if not self._in_scope(execution, scope):
                continue
            if execution not in wanted:
                raise InvalidRecordError(
                    f"{prefix}: record {record.kind}/{record.record_key} of {execution} is not one of the "
                    "manifest's executions"
                )
            if tombstones.is_retired(execution):
                raise InvalidRecordError(f"{prefix}: {execution} is committed but also tombstoned")
            records.append(record)
        if scope is None and len(records) != indexed:
            raise InvalidRecordError(f"{prefix}: read {len(records)} records, the index lists {indexed}")
        fenced = sorted(wanted | {e for e in restarts if self._in_scope(e, scope)}, key=execution_key)
        by_rollout: dict[str, ExecutionId] = {}
        for execution in fenced:
            other = by_rollout.setdefault(execution.rollout_id, execution)
            if other != execution:
                raise IdentityConflictError(
                    f"{prefix}: rollout {execution.rollout_id!r} has attempts {other.attempt} and "
                    f"{execution.attempt} in one checkpoint"
                )
            self.fence.check(execution.next_attempt())
        install = self._validate_restore(records)
        with self._cond:
            self._check_still_active(checkpoint_id, generation, deadline, "restore")
            before = self.fence.snapshot()
            self.fence.load(tombstones.snapshot())
            self.fence.retire(fenced)
            try:
                restored = sorted(install(), key=execution_key)
                for execution in restored:
                    self._register(execution)
            except BaseException:
                self.fence = AttemptFence(before)
                raise
            reply = RestoreReply(
                checkpoint_id=checkpoint_id,
                source_checkpoint_id=source_checkpoint_id,
                phase=Phase.RESTORED,
                restored=tuple(restored),
            )
            self._phase = Phase.RESTORED
            self._restore_reply = reply
            self._changed()
            return reply

    def _check_still_active(self, checkpoint_id: str, generation: int, deadline: float, op: str) -> None:
        with self._cond:
            self._check_lease()
            if self._generation != generation or self._active != checkpoint_id:
                raise StaleCheckpointError(
                    f"{op} {checkpoint_id}: the checkpoint was resumed (or its lease expired) meanwhile; "
                    "nothing was published",
                    checkpoint_id=checkpoint_id,
                )
        if self._clock() >= deadline:
            raise DeadlineExceededError(f"{op} {checkpoint_id}: deadline passed before it finished")

    def _restoring(self) -> bool:
        """A restore is reading: an active id while the phase is still idle."""
        return self._active is not None and self._phase is Phase.IDLE

    def _acquire_gate(self, deadline: float, op: str) -> None:
        if not self._op_gate.acquire(timeout=max(0.0, deadline - self._clock())):
            raise DeadlineExceededError(f"{op}: another commit/restore still runs at the deadline")

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

    def _remember_resumed(self, checkpoint_id: str) -> None:
        self._resumed[checkpoint_id] = None
        self._resumed.move_to_end(checkpoint_id)
        while len(self._resumed) > RESUMED_IDS_KEPT:
            self._resumed.popitem(last=False)

    def _set_accepting(self, accepting: bool) -> None:
        if self._accepting != accepting:
            self._accepting = accepting
            self._on_admission(accepting)
        self._changed()

    def _end_checkpoint(self, reason: str) -> None:
        """Resume: back to idle, admission open, the id fenced, in-flight writes voided."""
        if self._active is not None:
            self._remember_resumed(self._active)
            log.debug("%s/%s: checkpoint %s ended (%s)", self.kind, self.instance, self._active, reason)
        self._active = None
        self._phase = Phase.IDLE
        self._generation += 1
        self._prepare_reply = None
        self._commit_reply = None
        self._restore_reply = None
        self._clear_lease()
        self._set_accepting(True)

    def _extend_lease(self, deadline: float) -> None:
        expires = deadline + self.lease_grace_seconds
        if self._lease_expires is None or expires > self._lease_expires:
            self._lease_expires = expires
            self._arm_timer(expires)

    def _clear_lease(self) -> None:
        self._lease_expires = None
        if self._lease_timer is not None:
            self._lease_timer.cancel()
            self._lease_timer = None

    def _arm_timer(self, expires: float) -> None:
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        delay = max(0.0, expires - self._clock()) + 0.01
        timer = threading.Timer(delay, self._on_lease_timer)
        timer.daemon = True
        timer.name = f"lease-{self.kind}-{self.instance}"
        self._lease_timer = timer
        timer.start()

    def _on_lease_timer(self) -> None:
        with self._cond:
            self._check_lease()

    def _check_lease(self) -> None:
        """The coordinator vanished if the lease ran out: resume by ourselves."""
        expires = self._lease_expires
        if expires is not None and self._active is not None and self._clock() > expires:
            self.events["lease_expired"] += 1
            log.warning(
                "%s/%s: lease of checkpoint %s expired; resuming by itself",
                self.kind,
                self.instance,
                self._active,
            )
            self._end_checkpoint("lease expired")

    def _wait_slice(self, remaining: float | None) -> float | None:
        """Wake no later than the lease expiry, so a waiter notices it (the timer also notifies)."""
        if self._lease_expires is None:
            return remaining
        until_lease = max(0.0, self._lease_expires - self._clock()) + 0.01
        return until_lease if remaining is None else min(remaining, until_lease)

    def _effects_in(self, scope: frozenset[ExecutionId] | None) -> list[UnsafeEffect]:
        rollouts = None if scope is None else {e.rollout_id for e in scope}
        return [
            effect
            for rollout_id in sorted(self._effects)
            if rollouts is None or rollout_id in rollouts
            for effect in self._effects[rollout_id]
        ]


def _parse_executions(value: Any, what: str) -> list[ExecutionId]:
    """``[[rollout_id, attempt], ...]`` from a manifest's extra, validated."""
    if not isinstance(value, list):
        raise InvalidRecordError(f"manifest extra {what!r} must be a list")
    out: list[ExecutionId] = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or isinstance(item[1], bool)
            or not isinstance(item[1], int)
        ):
            raise InvalidRecordError(f"manifest extra {what!r} entries must be [rollout_id, attempt]")
        try:
            out.append(ExecutionId(rollout_id=item[0], attempt=item[1]))
        except ValueError as exc:
            raise InvalidRecordError(f"manifest extra {what!r}: {exc}") from None
    return out


def restamp(record: Record, attempt: int) -> Record:
    """The same record under another attempt (restore installs attempt N's state as N+1)."""
    return record.model_copy(update={"attempt": attempt})
