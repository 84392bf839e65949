"""The commit, collect and restore operations: the ones that move state through the object store.

They live apart from :mod:`._participant` because they share a shape the other operations do not:
each is serialized by ``self._op_gate``, checks its phase under ``self._cond``, then runs archive
I/O (:mod:`._component`) *outside* the lock and re-checks, via :meth:`_check_still_active`, that
its checkpoint was not resumed (or its lease did not expire) meanwhile before anything is
published or installed. The hooks they call (what to export, how to validate restored state)
are declared here; :class:`~._participant.Participant` adds the in-lock operations.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from pydantic import JsonValue

from .._runtime import gc_paused
from ..errors import (
    CheckpointConflictError,
    DeadlineExceededError,
    IdentityConflictError,
    InvalidPhaseError,
    StaleCheckpointError,
)
from ..format.fencing import AttemptFence
from ..format.records import Record
from ..ids import ExecutionId, PackedExecutions, validate_id
from ..store import ObjectStore
from ..telemetry import Attr, Measured, Span, bound, instruments, operation, participant_operation
from ._admission import AdmissionGate
from ._component import read_component, write_component
from ._export_rows import DeferredExecutions
from ._hooks import (
    BLOCKERS_REPORTED,
    DeferredBatches,
    Export,
    ExportRecords,
    Readiness,
    execution_key,
    scope_attempts,
    scope_frozenset,
)
from ._increments import BaseCatalog
from ._lease import check_deadline
from ._types import CommitReply, Phase, Publication, RestoreReply, UnsafeEffect

__all__ = ["CommitRestore"]


class CommitRestore(AdmissionGate, abc.ABC):
    """Commit (sync or async), collect and restore, and the hooks they call."""

    @participant_operation("commit")
    def commit(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
        *,
        publication: Publication = "sync",
        part: str | None = None,
    ) -> CommitReply:
        """Re-check readiness, export once through the archive writer, write the manifest last.

        ``scope`` limits the exported executions (those the coordinator continues); executions
        the participant does not track are ignored. A retry after a lost answer returns the
        cached reply, or adopts a manifest that the lost try already wrote with the same content.

        ``publication="async"`` freezes the export and answers ``frozen`` at once; the archive
        is written by a background upload that the resume starts (:meth:`collect`). Either
        mode first waits (until ``deadline``) for a previous checkpoint's upload to end.

        ``part`` (a worker group's worker id) writes the archive as that part of the component
        (``<component prefix>/parts/<part>``), which the group's manifest then refers to.
        """
        validate_id(checkpoint_id, "checkpoint_id")
        if part is not None:
            validate_id(part, "part id")
        check_deadline(deadline, self._clock(), "commit", limit=self.max_deadline_seconds)
        if publication not in ("sync", "async"):
            raise ValueError(f"publication must be 'sync' or 'async', not {publication!r}")
        # No cycle collection inside the pause: a full pass walks every object the participant
        # holds (a third of a 10,000-rollout synchronous pause) and the export makes no cycles;
        # the collector runs again once the commit answered (``_runtime.gc_paused``).
        with gc_paused():
            return self._commit(checkpoint_id, store, deadline, _immutable(scope), publication, part)

    def _commit(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None,
        publication: Publication,
        part: str | None,
    ) -> CommitReply:
        """:meth:`commit` once its arguments were checked."""
        self._acquire_gate(deadline, "commit")
        try:
            self._uploads.wait_others(checkpoint_id, deadline)
            with self._cond:
                self._check_lease()
                check_deadline(deadline, self._clock(), "commit", limit=self.max_deadline_seconds)
                self._refuse_stale(checkpoint_id)
                if self._active is None:
                    raise InvalidPhaseError(f"commit {checkpoint_id}: prepare it first", phase="idle")
                if self._active != checkpoint_id:
                    raise self._conflict(checkpoint_id, "commit")
                if self._phase in (Phase.COMMITTED, Phase.FROZEN) and self._replies.commit is not None:
                    if (self._phase is Phase.FROZEN) != (publication == "async"):
                        raise InvalidPhaseError(
                            f"commit {checkpoint_id}: already {self._phase.value} by a commit of the "
                            "other publication mode",
                            phase=self._phase.value,
                        )
                    return self._replies.commit
                if self._phase is not Phase.PREPARED:
                    raise InvalidPhaseError(
                        f"commit {checkpoint_id}: phase is {self._phase.value}, not prepared",
                        phase=self._phase.value,
                    )
                readiness = self._readiness()
                if readiness.blockers:
                    # Readiness regressed (a blocker appeared): a new prepare must wait again.
                    self._phase = Phase.PREPARING
                    self._replies.prepare = None
                    raise InvalidPhaseError(
                        f"commit {checkpoint_id}: no longer ready ({len(readiness.blockers)} blockers)",
                        phase=self._phase.value,
                        blockers=list(readiness.blockers[:BLOCKERS_REPORTED]),
                    )
                self._extend_lease(deadline)
                with operation(Span.participant("export")) as exporting:
                    export = self._export_for(scope)
                    if not isinstance(export.records, DeferredBatches):  # built after the freeze
                        exporting.set(Attr.RECORDS, len(export.records))
                # a built-in export lists its executions after the freeze (DeferredExecutions)
                restarts = _listing(export.restarts, export.sorted_unique)
                executions = _listing(export.executions, export.sorted_unique)
                effects = self._effects_in(scope)
                # the manifest's JSON: the per-execution lists are built with the archive (after
                # the freeze for an asynchronous commit), from the immutable lists fixed here
                extra = _ManifestExtra(
                    capabilities=self._capabilities.model_dump(mode="json"),
                    tombstones=dict(self.fence.snapshot()),
                    executions=executions,
                    restarts=restarts,
                    unsafe_effects=[u.model_dump(mode="json") for u in effects],
                    more=dict(self._manifest_extra()),
                )
                generation = self._generation

                def reply(phase: Phase, ref: tuple[str, str, int] | None) -> CommitReply:
                    # a frozen reply lists what the freeze fixed; a deferred listing is in the
                    # committed reply (collect) only: building it is what the freeze defers
                    listed = _listed if phase is Phase.FROZEN else tuple
                    return CommitReply(
                        checkpoint_id=checkpoint_id,
                        phase=phase,
                        kind=self.kind,
                        instance=self.instance,
                        manifest_key=None if ref is None else ref[0],
                        manifest_sha256=None if ref is None else ref[1],
                        manifest_bytes=None if ref is None else ref[2],
                        executions=listed(executions),
                        restarts=listed(restarts),
                        unsafe_effects=tuple(effects),
                        incarnation=self._incarnation,
                    )

                if publication == "async":
                    # The export is immutable from here on (the ``_export`` contract), so the
                    # upload may run while the participant takes new work after the resume.
                    records = export.records
                    self._uploads.register(
                        checkpoint_id,
                        generation,
                        deadline,
                        bound(  # the upload's spans join the commit's trace
                            lambda _: reply(
                                Phase.COMMITTED,
                                self._write_component(
                                    checkpoint_id, store, deadline, records, extra, generation, part
                                ),
                            )
                        ),
                    )
                    frozen = reply(Phase.FROZEN, None)
                    self._phase = Phase.FROZEN
                    self._replies.commit = frozen
                    self.events["frozen"] += 1
                    return frozen
            ref = self._write_component(
                checkpoint_id, store, deadline, export.records, extra, generation, part
            )
            with self._cond:
                if self._generation != generation or self._active != checkpoint_id:
                    # resumed (or the lease expired) after the manifest write: the phase belongs
                    # to whatever came next, never to this commit (linearizable with resume)
                    raise StaleCheckpointError(
                        f"commit {checkpoint_id}: the checkpoint was resumed meanwhile; its phase is "
                        "not committed",
                        checkpoint_id=checkpoint_id,
                    )
                committed = reply(Phase.COMMITTED, ref)
                self._phase = Phase.COMMITTED
                self._replies.commit = committed
                return committed
        finally:
            self._op_gate.release()

    @participant_operation("collect")
    def collect(self, checkpoint_id: str, deadline: float) -> CommitReply:
        """Wait (until ``deadline``) for the background upload of an asynchronous commit and
        return its committed reply. Idempotent; answers after the resume, which is the point.
        ``publication_failed`` if the upload failed or was cancelled, ``publication_unknown``
        if this participant never froze ``checkpoint_id`` (or restarted since)."""
        validate_id(checkpoint_id, "checkpoint_id")
        check_deadline(deadline, self._clock(), "collect", limit=self.max_deadline_seconds)
        return self._uploads.collect(checkpoint_id, deadline)

    @participant_operation("restore")
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
        check_deadline(deadline, self._clock(), "restore", limit=self.max_deadline_seconds)
        scope_set = frozenset(scope) if scope is not None else None
        self._acquire_gate(deadline, "restore")
        try:
            with self._cond:
                self._check_lease()
                check_deadline(deadline, self._clock(), "restore", limit=self.max_deadline_seconds)
                self._refuse_stale(checkpoint_id)
                if self._active == checkpoint_id and self._replies.restore is not None:
                    if self._replies.restore.source_checkpoint_id != source_checkpoint_id:
                        raise CheckpointConflictError(
                            f"restore {checkpoint_id} already restored "
                            f"{self._replies.restore.source_checkpoint_id}, not {source_checkpoint_id}"
                        )
                    return self._replies.restore
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
                        self._lease.clear()
                        self._set_accepting(not self._held)
                raise
        finally:
            self._op_gate.release()

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

    def _check_references(
        self,
        store: str | ObjectStore,
        source_checkpoint_id: str,
        records: Sequence[Record],
        scope: frozenset[ExecutionId] | None,
    ) -> None:
        """Check the replacement set against what other components of the source checkpoint say
        about it (raise to refuse the restore). Runs before :meth:`_validate_restore`; no lock."""

    def _manifest_extra(self) -> Mapping[str, JsonValue]:
        """Additional JSON for the component manifest (cannot override the standard keys)."""
        return {}

    # -- internals ----------------------------------------------------------------------------
    def _write_component(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        records: ExportRecords,
        extra: _ManifestExtra,
        generation: int,
        part: str | None = None,
    ) -> tuple[str, str, int]:
        with operation(Span.participant("write"), attributes={Attr.CHECKPOINT_ID: checkpoint_id}) as writing:
            return write_component(
                store,
                checkpoint_id,
                self.kind,
                self.instance,
                records,
                extra.json(),
                lock=self._write_lock(checkpoint_id, generation),
                check_active=lambda: self._check_still_active(checkpoint_id, generation, deadline, "commit"),
                written=partial(_count, writing, "write", self.kind),
                catalog=self._base_catalog(),
                part=part,
            )

    incremental_commits: bool = True
    """Write format version 2: members unchanged since the last published checkpoint are referred
    to, not written again (``False``: every commit writes every member, format version 1)."""

    def _base_catalog(self) -> BaseCatalog:
        """The component's last committed archive (created on first use; commits are serialized)."""
        catalog: BaseCatalog | None = getattr(self, "_catalog", None)
        if catalog is None:
            catalog = self._catalog = BaseCatalog()
        catalog.enabled = self.incremental_commits
        return catalog

    def _restore(
        self,
        checkpoint_id: str,
        source_checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: frozenset[ExecutionId] | None,
        generation: int,
    ) -> RestoreReply:
        with operation(
            Span.participant("read"), attributes={Attr.CHECKPOINT_ID: source_checkpoint_id}
        ) as reading:
            source = read_component(
                store,
                source_checkpoint_id,
                self.kind,
                self.instance,
                scope,
                lambda: self._check_still_active(checkpoint_id, generation, deadline, "restore"),
            )
            _count(reading, "read", self.kind, len(source.records), source.bytes)
        by_rollout: dict[str, ExecutionId] = {}
        for execution in source.fenced:
            other = by_rollout.setdefault(execution.rollout_id, execution)
            if other != execution:
                raise IdentityConflictError(
                    f"{source.prefix}: rollout {execution.rollout_id!r} has attempts {other.attempt} and "
                    f"{execution.attempt} in one checkpoint"
                )
            self.fence.check(execution.next_attempt())
        self._check_references(store, source_checkpoint_id, source.records, scope)
        install = self._validate_restore(source.records)
        with self._cond:
            self._check_still_active(checkpoint_id, generation, deadline, "restore")
            before = self.fence.snapshot()
            self.fence.load(source.tombstones.snapshot())
            self.fence.retire(source.fenced)
            try:
                with operation(Span.participant("install")) as installing:
                    restored = sorted(install(), key=execution_key)
                    installing.set(Attr.EXECUTIONS, len(restored))
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
                incarnation=self._incarnation,
            )
            self._phase = Phase.RESTORED
            self._replies.restore = reply
            self._restore_undo = (checkpoint_id, before, tuple(restored))
            self._changed()
            return reply

    def _write_lock(self, checkpoint_id: str, generation: int) -> threading.Condition:
        """The lock a component's manifest write is decided under: the participant's own for a
        synchronous commit (a resume is before or after it), the upload's for an asynchronous
        one (the participant takes work meanwhile; a lease expiry voids it at its next check)."""
        upload = self._uploads.get(checkpoint_id)
        if upload is not None and upload.generation == generation:
            return upload.lock
        return self._cond

    def _check_still_active(self, checkpoint_id: str, generation: int, deadline: float, op: str) -> None:
        with self._cond:
            self._check_lease()
            upload = self._uploads.get(checkpoint_id) if op == "commit" else None
            if upload is not None and upload.generation == generation:
                upload.check()  # an asynchronous upload outlives the resume: fenced by itself
            elif self._generation != generation or self._active != checkpoint_id:
                raise StaleCheckpointError(
                    f"{op} {checkpoint_id}: the checkpoint was resumed (or its lease expired) meanwhile; "
                    "nothing was published",
                    checkpoint_id=checkpoint_id,
                )
        if self._clock() >= deadline:
            raise DeadlineExceededError(f"{op} {checkpoint_id}: deadline passed before it finished")

    def _acquire_gate(self, deadline: float, op: str) -> None:
        if not self._op_gate.acquire(timeout=max(0.0, deadline - self._clock())):
            raise DeadlineExceededError(f"{op}: another commit/restore still runs at the deadline")

    def _export_for(self, scope: Sequence[ExecutionId] | None) -> Export:
        """The export of ``scope`` as the commit received it (immutable; ``None``: all). The
        default builds the frozenset :meth:`_export` takes; a kind whose export filters after
        the freeze overrides this to build it only then (unpacking and hashing a scope of
        100,000 ids costs tens of milliseconds, inside the pause)."""
        return self._export(scope_frozenset(scope))

    def _effects_in(self, scope: Sequence[ExecutionId] | None) -> list[UnsafeEffect]:
        if not self._effects:
            return []
        rollouts: Container[str] | None = None
        if scope is not None:
            scope_set = scope_frozenset(scope)
            assert scope_set is not None
            rollouts = scope_attempts(scope_set)
            if rollouts is None:
                rollouts = {e.rollout_id for e in scope_set}
        return [
            effect
            for rollout_id in sorted(self._effects)
            if rollouts is None or rollout_id in rollouts
            for effect in self._effects[rollout_id]
        ]


@dataclass(frozen=True)
class _ManifestExtra:
    """A commit's manifest ``extra``, fixed under the lock; :meth:`json` builds the JSON (the
    same keys in the same order as ever) when the archive is written."""

    capabilities: JsonValue
    tombstones: dict[str, int]
    executions: Sequence[ExecutionId]  # a tuple, or a DeferredExecutions built on first use
    restarts: Sequence[ExecutionId]
    unsafe_effects: list[JsonValue]
    more: dict[str, JsonValue]

    def json(self) -> dict[str, JsonValue]:
        extra: dict[str, JsonValue] = {
            "capabilities": self.capabilities,
            "tombstones": dict(self.tombstones),
            "executions": [[e.rollout_id, e.attempt] for e in self.executions],
            "restarts": [[e.rollout_id, e.attempt] for e in self.restarts],
            "unsafe_effects": list(self.unsafe_effects),
        }
        for name, value in self.more.items():
            extra.setdefault(name, value)
        return extra


def _listing(executions: Sequence[ExecutionId], sorted_unique: bool) -> Sequence[ExecutionId]:
    """An export's executions (or restarts) as the commit keeps them: a tuple, distinct and in
    order; a :class:`DeferredExecutions` stays deferred (sorted when it is built, if need be)."""
    if isinstance(executions, DeferredExecutions):
        if sorted_unique:
            return executions
        return DeferredExecutions(partial(_unique_sorted, executions))
    return tuple(executions) if sorted_unique else tuple(_unique_sorted(executions))


def _listed(executions: Sequence[ExecutionId]) -> tuple[ExecutionId, ...]:
    """What a ``frozen`` reply lists: a listing fixed at the freeze, not a deferred one."""
    return () if isinstance(executions, DeferredExecutions) else tuple(executions)


def _immutable(scope: Sequence[ExecutionId] | None) -> Sequence[ExecutionId] | None:
    """The scope as a value nothing can change after the commit read it (an export may use it
    after the freeze): a tuple, frozenset or packed scope as it is, anything else copied."""
    if scope is None or isinstance(scope, tuple | frozenset | PackedExecutions):
        return scope
    return tuple(scope)


def _unique_sorted(executions: Iterable[ExecutionId]) -> list[ExecutionId]:
    """Distinct executions in (rollout id, attempt) order, keyed by plain tuples: hashing
    pydantic ids (the ``set`` of them) was a measurable part of the pause at 10k rollouts."""
    unique = {execution_key(e): e for e in executions}
    return [unique[key] for key in sorted(unique)]


def _count(measured: Measured, direction: str, kind: str, records: int, size: int) -> None:
    """Records and bytes an archive write or read moved: on its span and in the metrics."""
    measured.set(Attr.RECORDS, records)
    measured.set(Attr.BYTES, size)
    attributes = {Attr.DIRECTION: direction, Attr.PARTICIPANT_KIND: kind}
    instruments().records.add(records, attributes)
    instruments().io.add(size, attributes)
