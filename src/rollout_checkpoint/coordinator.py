"""The framework-side coordinator: the checkpoint cycle, restore and explicit resume.

The cycle (``docs/protocol.md``, "Checkpoint cycle")::

    freeze dispatch -> prepare (stage by stage, PREPARE_ORDER) -> commit -> validate components
    -> registry component -> aggregate manifest (create-only) -> token-store snapshot
    -> GLOBAL CHECKPOINT RECORD (create-only: the commit point) -> latest pointer (CAS)
    -> resume (reverse order)

Any failure before the commit point aborts: every participant touched is resumed, nothing is
published, leftovers stay invisible (readers only trust ``published/*.json``). A failure after
it never un-publishes: the outcome reports it. ``fault_hook(step)`` runs before every object
write, every participant call, the commit point and the pointer move, so tests can fail or
kill the process at each step.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, BinaryIO, Protocol, TypeVar

from pydantic import BaseModel, JsonValue

from . import layout
from .archive import ArchiveReader
from .control import (
    PREPARE_ORDER,
    CommitReply,
    ParticipantControl,
    ParticipantKind,
    PrepareReport,
    ResumeReply,
)
from .errors import (
    CheckpointError,
    DeadlineExceededError,
    IntegrityError,
    InvalidPhaseError,
    ManifestConflictError,
    ObjectExistsError,
    SequenceTakenError,
    TransientStoreError,
)
from .ids import ExecutionId, validate_id
from .manifests import (
    AggregateManifest,
    ComponentRef,
    GlobalCheckpointRecord,
    LatestUpdate,
    ObjectRef,
    advance_latest,
    new_checkpoint_id,
    new_commit_token,
    publish_record,
    write_aggregate,
)
from .published import iter_candidates, next_sequence
from .recovery import RecoveryPlan, TokenSnapshotLoader, load_checkpoint
from .registry import REGISTRY_INSTANCE, REGISTRY_KIND, LiveExecutionRegistry
from .store import DelegatingStore, ObjectInfo, ObjectStore, PutResult, open_store

__all__ = [
    "RETIRE_ORDER",
    "CheckpointCancelledError",
    "CheckpointNotReadyError",
    "CheckpointOutcome",
    "Coordinator",
    "FaultHook",
    "MissingParticipantError",
    "RestoreFailedError",
    "RestoreOutcome",
    "TokenSnapshotSource",
]

log = logging.getLogger(__name__)

FaultHook = Callable[[str], None]
"""Called with a step name before every step a crash could interrupt (tests raise or exit)."""

RETIRE_ORDER: tuple[tuple[ParticipantKind, ...], ...] = (("environment",), ("agent",), ("model", "resources"))
"""Retire callers before callees, so a retired caller cannot re-issue work to a callee."""

_RETRYABLE: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, TransientStoreError)
"""Transport failures: the operation may have been applied and only its answer lost, so the
(idempotent) call is repeated. A ``CheckpointError`` is an answer and is never retried."""

T = TypeVar("T")

_SEQUENCE_ATTEMPTS = 32


class CheckpointNotReadyError(CheckpointError):
    """A prepare stage did not reach a safe boundary by the deadline; the checkpoint was aborted."""

    code = "checkpoint_not_ready"


class CheckpointCancelledError(CheckpointError):
    """:meth:`Coordinator.cancel` stopped the cycle before its commit point; it was aborted."""

    code = "checkpoint_cancelled"


class RestoreFailedError(CheckpointError):
    """A participant refused the restore: new attempts were retired everywhere and resumed."""

    code = "restore_failed"


class MissingParticipantError(CheckpointError):
    """The checkpoint lists a participant this coordinator does not have: restoring (or resuming)
    without it would continue rollouts on state that was never restored. Nothing was touched."""

    code = "missing_participant"


class TokenSnapshotSource(Protocol):
    """What the coordinator needs of a token store: a snapshot bound to the checkpoint id."""

    def snapshot(self, checkpoint_id: str) -> Any: ...


@dataclass(frozen=True)
class CheckpointOutcome:
    """A published checkpoint. ``post_commit_errors`` lists what failed after the commit point
    (pointer move, resume): the checkpoint stays published regardless."""

    checkpoint_id: str
    record: GlobalCheckpointRecord
    record_ref: ObjectRef
    latest: LatestUpdate | None
    post_commit_errors: tuple[str, ...]
    pause_seconds: float
    publish_seconds: float
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def latest_moved(self) -> bool:
        return self.latest is not None and self.latest.moved

    @property
    def clean(self) -> bool:
        return not self.post_commit_errors


@dataclass(frozen=True)
class RestoreOutcome:
    """A restore that succeeded everywhere; participants stay paused until :meth:`Coordinator.resume`."""

    restore_id: str
    source_checkpoint_id: str
    plan: RecoveryPlan
    restored: dict[str, tuple[ExecutionId, ...]]


class _HookedStore(DelegatingStore):
    """Calls the step hook before every write it forwards (fault injection at each object)."""

    def __init__(self, inner: ObjectStore, step: Callable[[str], None]) -> None:
        super().__init__(inner)
        self._step = step

    def put(self, key: str, data: bytes) -> ObjectInfo:
        self._step(f"put:{key}")
        return self.inner.put(key, data)

    def open_write(self, key: str) -> AbstractContextManager[BinaryIO]:
        self._step(f"open_write:{key}")
        return self.inner.open_write(key)

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        self._step(f"put_if_absent:{key}")
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        self._step(f"put_if_match:{key}")
        return self.inner.put_if_match(key, data, version)

    def delete(self, key: str) -> None:
        self._step(f"delete:{key}")
        self.inner.delete(key)


def _name(participant: ParticipantControl) -> str:
    caps = participant.capabilities()
    return f"{caps.kind}/{caps.instance}"


def _receipt_json(receipt: Any) -> dict[str, JsonValue]:
    if isinstance(receipt, BaseModel):
        dumped: dict[str, JsonValue] = receipt.model_dump(mode="json")
        return dumped
    if isinstance(receipt, Mapping):
        return dict(receipt)
    raise TypeError(
        f"token snapshot receipt must be a pydantic model or a mapping, got {type(receipt).__name__}"
    )


class Coordinator:
    """Runs checkpoint cycles and restores over a fixed set of participants.

    ``participants`` are any :class:`~rollout_checkpoint.control.ParticipantControl` (in-process
    or remote clients), unique by ``(kind, instance)``. ``token_source`` (optional) is snapshotted
    under each checkpoint id and its receipt bound into the global record. One cycle runs at a
    time per coordinator; two coordinators racing on one checkpoint id cannot both publish.
    """

    def __init__(
        self,
        store: str | ObjectStore,
        participants: Sequence[ParticipantControl],
        registry: LiveExecutionRegistry,
        token_source: TokenSnapshotSource | None = None,
        *,
        accept_unsafe_store: bool = False,
        fault_hook: FaultHook | None = None,
        clock: Callable[[], float] = time.time,
        token_snapshot_loader: TokenSnapshotLoader | None = None,
        cleanup_grace_s: float = 30.0,
        call_retries: int = 2,
        writer_options: Mapping[str, Any] | None = None,
        coordinator_id: str | None = None,
    ) -> None:
        self.store = open_store(store)
        self.participants = list(participants)
        self.registry = registry
        self.token_source = token_source
        self.accept_unsafe_store = accept_unsafe_store
        self.fault_hook = fault_hook
        self.clock = clock
        self.token_snapshot_loader = token_snapshot_loader
        self.cleanup_grace_s = cleanup_grace_s
        self.call_retries = call_retries
        self.writer_options = dict(writer_options or {})
        self.coordinator_id = coordinator_id or uuid.uuid4().hex
        self._names = [_name(p) for p in self.participants]
        if len(set(self._names)) != len(self._names):
            raise ValueError(f"participants must be unique by kind/instance: {self._names}")
        unknown = [n for n in self._names if n.split("/", 1)[0] not in PREPARE_ORDER]
        if unknown:
            raise ValueError(f"participants of unknown kind: {unknown}")
        self._cycle = threading.Lock()
        self._cancel = threading.Event()
        self._last_sequence = 0
        self._refused: dict[str, tuple[str, list[str]]] = {}  # restore id -> (source, lacking)

    # -- the checkpoint cycle -------------------------------------------------------------------
    def checkpoint(
        self,
        checkpoint_id: str | None = None,
        *,
        deadline_s: float = 60.0,
        framework_state: JsonValue = None,
    ) -> CheckpointOutcome:
        """Run one cycle and publish ``checkpoint_id`` (default ``ckpt-<UTC time>-<8 hex>``).

        Raises (after aborting: every participant resumed, nothing published) on any failure
        before the commit point: :class:`CheckpointNotReadyError`, :class:`CheckpointCancelledError`,
        :class:`~rollout_checkpoint.errors.ManifestConflictError` when another coordinator
        published this id, or the participant's / store's own error.
        """
        cid = validate_id(checkpoint_id or new_checkpoint_id(), "checkpoint_id")
        self.store.require_atomic_commits(accept_risk=self.accept_unsafe_store)
        with self._cycle:
            self._cancel.clear()
            return self._run_cycle(cid, deadline_s, framework_state)

    def cancel(self) -> None:
        """Stop the running cycle at its next step if it has not reached the commit point."""
        self._cancel.set()

    def _step(self, name: str) -> None:
        if self._cancel.is_set():
            raise CheckpointCancelledError(f"checkpoint cancelled before step {name!r}", step=name)
        if self.fault_hook is not None:
            self.fault_hook(name)

    def _ordered(self) -> list[tuple[str, ParticipantControl]]:
        ranked = sorted(
            zip(self._names, self.participants, strict=True),
            key=lambda item: (PREPARE_ORDER.index(item[0].split("/", 1)[0]), item[0]),
        )
        return ranked

    def _call(self, name: str, step: str, fn: Callable[..., T], *args: Any, hook: bool = True) -> T:
        if hook:
            self._step(f"{step}:{name}")
        for attempt in range(self.call_retries + 1):
            try:
                return fn(*args)
            except _RETRYABLE:
                if attempt >= self.call_retries:
                    raise
                log.warning("%s %s: answer lost, repeating the idempotent call", step, name)
        raise AssertionError("unreachable")

    def _fan_out(self, calls: Sequence[tuple[str, Callable[[], T]]]) -> list[tuple[str, T]]:
        """Run the calls of one stage concurrently (a remote participant answers slowly); every
        call has finished when this returns, and the first failure, in stage order, is raised."""
        if len(calls) <= 1:
            return [(name, fn()) for name, fn in calls]
        with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="coordinator") as pool:
            futures = [pool.submit(fn) for _, fn in calls]
            wait(futures)
        failures = [
            (name, f.exception()) for (name, _), f in zip(calls, futures, strict=True) if f.exception()
        ]
        for name, error in failures[1:]:
            log.warning("%s also failed in the same stage: %s", name, error)
        if failures:
            error = failures[0][1]
            assert error is not None
            raise error
        return [(name, f.result()) for (name, _), f in zip(calls, futures, strict=True)]

    def _check_deadline(self, cid: str, deadline: float, step: str) -> None:
        if self.clock() >= deadline:
            raise DeadlineExceededError(
                f"checkpoint {cid}: deadline passed before {step}; aborted", checkpoint_id=cid, step=step
            )

    def _run_cycle(self, cid: str, deadline_s: float, framework_state: JsonValue) -> CheckpointOutcome:
        timings: dict[str, float] = {}
        started = time.perf_counter()
        deadline = self.clock() + deadline_s
        hooked = _HookedStore(self.store, self._step)
        ordered = self._ordered()
        touched: list[tuple[str, ParticipantControl]] = []
        mark = started
        self._step("freeze")
        with self.registry.frozen(cid) as live:
            try:
                # 1. prepare, stage by stage; stop at the first stage that is not ready
                for kind in PREPARE_ORDER:
                    stage = [(n, p) for n, p in ordered if n.split("/", 1)[0] == kind]
                    touched.extend(stage)
                    reports: list[tuple[str, PrepareReport]] = self._fan_out(
                        [
                            (name, partial(self._call, name, "prepare", participant.prepare, cid, deadline))
                            for name, participant in stage
                        ]
                    )
                    blocked = [(n, r) for n, r in reports if not r.ready]
                    if blocked:
                        raise CheckpointNotReadyError(
                            f"checkpoint {cid}: stage {kind!r} not ready: "
                            + "; ".join(
                                f"{n}: {r.blocker_count} blockers {list(r.blockers[:5])}" for n, r in blocked
                            ),
                            checkpoint_id=cid,
                            stage=kind,
                            blockers={n: list(r.blockers) for n, r in blocked},
                        )
                now = time.perf_counter()
                timings["prepare"], mark = now - mark, now
                commit_started = now

                # 2. commit every participant under the frozen membership, stage by stage, the
                # participants of one stage concurrently
                groups = [
                    [(n, p) for n, p in ordered if n.split("/", 1)[0] == kind] for kind in PREPARE_ORDER
                ]
                replies: list[tuple[str, ParticipantControl, CommitReply]] = []
                for group in groups:
                    committed = self._fan_out(
                        [
                            (name, partial(self._call, name, "commit", p.commit, cid, hooked, deadline, live))
                            for name, p in group
                        ]
                    )
                    replies.extend(
                        (name, p, reply) for (name, p), (_, reply) in zip(group, committed, strict=True)
                    )
                now = time.perf_counter()
                timings["commit"], mark = now - mark, now

                # 3. validate every component manifest (digest named by the reply) and its bytes
                components: list[ComponentRef] = []
                for name, participant, reply in replies:
                    self._step(f"validate:{name}")
                    components.append(self._validate(cid, participant, reply))
                now = time.perf_counter()
                timings["validate"], mark = now - mark, now

                # 4. the framework's own component: the live-execution registry
                self._check_deadline(cid, deadline, "registry")
                _, registry_ref = self.registry.write_component(hooked, cid, **self.writer_options)
                self._step(f"validate:{REGISTRY_KIND}/{REGISTRY_INSTANCE}")
                components.append(
                    self._validate_ref(cid, REGISTRY_KIND, REGISTRY_INSTANCE, "framework", None, registry_ref)
                )
                now = time.perf_counter()
                timings["registry"], mark = now - mark, now

                # 5. aggregate manifest, create-only
                token = new_commit_token()
                created_at = datetime.fromtimestamp(self.clock(), tz=UTC)
                aggregate = AggregateManifest(
                    checkpoint_id=cid,
                    commit_token=token,
                    created_at=created_at,
                    prepare_order=list(PREPARE_ORDER),
                    components=components,
                    dispatched=len(self.registry),
                )
                aggregate_ref = write_aggregate(hooked, aggregate)
                now = time.perf_counter()
                timings["aggregate"], mark = now - mark, now

                # 6. token-store snapshot bound to this checkpoint id, validated before use
                receipt: dict[str, JsonValue] | None = None
                if self.token_source is not None:
                    self._step("token_snapshot")
                    source = self.token_source
                    receipt = _receipt_json(
                        self._call("tokens", "snapshot", source.snapshot, cid, hook=False)
                    )
                    self._validate_snapshot(receipt)
                now = time.perf_counter()
                timings["tokens"], mark = now - mark, now

                # 7. THE COMMIT POINT: sequence claim, then the global record (both create-only)
                self._check_deadline(cid, deadline, "publish")
                self._step("publish")
                record, record_ref = self._publish(
                    cid, token, created_at, aggregate_ref, components, receipt, framework_state
                )
                sequence = record.sequence
            except BaseException as exc:
                self._abort(cid, touched, deadline)
                if isinstance(exc, ObjectExistsError):
                    raise ManifestConflictError(
                        f"checkpoint {cid}: another writer already committed here ({exc})", checkpoint_id=cid
                    ) from exc
                raise
            self._last_sequence = sequence
            now = time.perf_counter()
            timings["publish"], mark = now - mark, now
            publish_seconds = now - commit_started

            # after the commit point nothing un-publishes: failures are reported, not raised
            errors: list[str] = []
            latest: LatestUpdate | None = None
            try:
                self._step("latest")
                latest = advance_latest(self.store, record, record_ref, now=self.clock)
            except Exception as exc:
                errors.append(f"latest pointer not moved: {exc}")
                log.warning("checkpoint %s published but the latest pointer was not moved: %s", cid, exc)
            now = time.perf_counter()
            timings["latest"], mark = now - mark, now
            errors.extend(self._resume_all(cid, ordered, deadline, hook=True))
            now = time.perf_counter()
            timings["resume"] = now - mark
        return CheckpointOutcome(
            checkpoint_id=cid,
            record=record,
            record_ref=record_ref,
            latest=latest,
            post_commit_errors=tuple(errors),
            pause_seconds=now - started,
            publish_seconds=publish_seconds,
            timings=timings,
        )

    def _publish(
        self,
        cid: str,
        token: str,
        created_at: datetime,
        aggregate_ref: ObjectRef,
        components: list[ComponentRef],
        receipt: dict[str, JsonValue] | None,
        framework_state: JsonValue,
    ) -> tuple[GlobalCheckpointRecord, ObjectRef]:
        """Claim the next sequence (derived from the published log, never from ``latest.json``)
        and create the record; a sequence another publisher won is retried one later."""
        for _ in range(_SEQUENCE_ATTEMPTS):
            newest = next(iter_candidates(self.store), None)
            record = GlobalCheckpointRecord(
                checkpoint_id=cid,
                sequence=next_sequence(self.store, self._last_sequence),
                created_at=created_at,
                commit_token=token,
                coordinator_id=self.coordinator_id,
                previous_checkpoint_id=newest.checkpoint_id if newest is not None else None,
                aggregate=aggregate_ref,
                components=components,
                token_snapshot=receipt,
                framework_state=framework_state,
                counts=self.registry.counts(),
            ).sealed()
            try:
                return record, publish_record(self.store, record)
            except SequenceTakenError:
                log.info("checkpoint %s: sequence %d taken by another publisher", cid, record.sequence)
        raise ManifestConflictError(
            f"checkpoint {cid}: lost the race for a sequence number {_SEQUENCE_ATTEMPTS} times in a row",
            checkpoint_id=cid,
        )

    def _validate(self, cid: str, participant: ParticipantControl, reply: CommitReply) -> ComponentRef:
        caps = participant.capabilities()
        if (reply.checkpoint_id, reply.kind, reply.instance) != (cid, caps.kind, caps.instance):
            raise IntegrityError(
                f"commit reply of {caps.kind}/{caps.instance} names {reply.kind}/{reply.instance} "
                f"of checkpoint {reply.checkpoint_id}",
                checkpoint_id=cid,
            )
        ref = ObjectRef(key=reply.manifest_key, sha256=reply.manifest_sha256, bytes=reply.manifest_bytes)
        return self._validate_ref(cid, caps.kind, caps.instance, "participant", caps.mode, ref)

    def _validate_ref(
        self, cid: str, kind: str, instance: str, role: str, mode: str | None, ref: Any
    ) -> ComponentRef:
        prefix = layout.component_prefix(cid, kind, instance)
        if ref.key != f"{prefix}/{layout.MANIFEST_NAME}":
            raise IntegrityError(f"{kind}/{instance}: manifest {ref.key} is not at {prefix}", key=ref.key)
        reader = ArchiveReader.open(self.store, prefix, expected_sha256=ref.sha256)
        if reader.manifest_ref.bytes != ref.bytes:
            raise IntegrityError(
                f"{ref.key}: {reader.manifest_ref.bytes} bytes, expected {ref.bytes}", key=ref.key
            )
        manifest = reader.manifest
        if (manifest.checkpoint_id, manifest.participant_kind, manifest.instance) != (cid, kind, instance):
            raise IntegrityError(f"{ref.key}: manifest names another component", key=ref.key)
        reader.verify()
        return ComponentRef(
            kind=kind,
            instance=instance,
            role="participant" if role == "participant" else "framework",
            mode=mode,
            prefix=prefix,
            manifest=ObjectRef(key=ref.key, sha256=ref.sha256, bytes=ref.bytes),
        )

    def _validate_snapshot(self, receipt: dict[str, JsonValue]) -> None:
        if self.token_snapshot_loader is not None:
            self.token_snapshot_loader(self.store, receipt)
            return
        from .recovery import default_token_snapshot_loader

        default_token_snapshot_loader(self.store, receipt)

    def _abort(self, cid: str, touched: Sequence[tuple[str, ParticipantControl]], deadline: float) -> None:
        """Resume (= abort) every participant prepare reached, in reverse order; never raises."""
        errors = self._resume_all(cid, list(touched), deadline, hook=False)
        for error in errors:
            log.warning("abort of checkpoint %s: %s", cid, error)

    def _resume_all(
        self, cid: str, ordered: Sequence[tuple[str, ParticipantControl]], deadline: float, *, hook: bool
    ) -> list[str]:
        def resume_one(name: str, participant: ParticipantControl) -> str | None:
            first = hook
            for attempt in range(self.call_retries + 1):
                try:
                    if first:
                        first = False
                        self._step(f"resume:{name}")
                    participant.resume(cid, max(deadline, self.clock() + self.cleanup_grace_s))
                    return None
                except Exception as exc:
                    if attempt >= self.call_retries:
                        return f"resume of {name} failed: {exc}"
            return None

        errors: list[str] = []
        for kind in reversed(PREPARE_ORDER):
            stage = [(n, p) for n, p in ordered if n.split("/", 1)[0] == kind]
            outcomes = self._fan_out([(name, partial(resume_one, name, p)) for name, p in reversed(stage)])
            errors.extend(error for _, error in outcomes if error is not None)
        return errors

    # -- restore ---------------------------------------------------------------------------------
    def restore(
        self,
        checkpoint_id: str | None = None,
        *,
        deadline_s: float = 60.0,
        restore_id: str | None = None,
        verify: bool = False,
        fallback: bool = False,
    ) -> RestoreOutcome:
        """Restore a published checkpoint (latest by default) into the participants.

        All-or-nothing: the checkpoint is loaded and classified first (a rejected checkpoint
        touches nothing); then every participant restores the ``continue`` executions as attempt
        N+1 under a new ``restore_id``. If any participant fails, the new attempts are retired
        everywhere, every participant is resumed, the registry is left unchanged and
        :class:`RestoreFailedError` is raised. On success the registry holds the rebuilt plan
        and the participants stay paused until :meth:`resume` ``(restore_id)``.
        ``verify`` / ``fallback`` are those of :func:`~rollout_checkpoint.recovery.load_checkpoint`:
        digest-check everything first, and use the newest checkpoint that loads (verifies) when
        the requested one is damaged (``outcome.plan.skipped`` says what was passed over).
        """
        with self._cycle:
            plan = load_checkpoint(
                self.store,
                checkpoint_id,
                verify=verify,
                fallback=fallback,
                token_snapshot_loader=self.token_snapshot_loader,
            )
            rid = validate_id(restore_id or new_checkpoint_id("restore"), "restore_id")
            listed = sorted(f"{c.kind}/{c.instance}" for c in plan.participant_components())
            missing = [name for name in listed if name not in self._names]
            if missing:
                self._refused[rid] = (plan.checkpoint_id, missing)
                raise self._missing(rid, plan.checkpoint_id, missing)
            entries, retired = plan.registry_entries()
            if self.registry.frozen_by is not None:
                raise InvalidPhaseError(f"restore: checkpoint {self.registry.frozen_by} holds the registry")
            deadline = self.clock() + deadline_s
            continued = [p.execution for p in plan.continued]
            fresh = [p.execution for p in plan.fresh]
            ordered = self._ordered()
            touched: list[tuple[str, ParticipantControl]] = []
            restored: dict[str, tuple[ExecutionId, ...]] = {}
            try:
                for kind in PREPARE_ORDER:
                    group = [(n, p) for n, p in ordered if n.split("/", 1)[0] == kind]
                    touched.extend(group)
                    for name, reply in self._fan_out(
                        [
                            (
                                name,
                                partial(
                                    self._call,
                                    name,
                                    "restore",
                                    participant.restore,
                                    rid,
                                    plan.checkpoint_id,
                                    self.store,
                                    deadline,
                                    continued,
                                ),
                            )
                            for name, participant in group
                        ]
                    ):
                        restored[name] = tuple(reply.restored)
                # Fence attempt N of every non-completed rollout at every participant that did not
                # restore it (a restoring participant fenced its own), so a late request from N
                # is refused everywhere.
                for stage in RETIRE_ORDER:
                    for name, participant in ordered:
                        if name.split("/", 1)[0] not in stage:
                            continue
                        mine = {e.rollout_id for e in restored.get(name, ())}
                        batch = fresh + [e for e in continued if e.rollout_id not in mine]
                        if batch:
                            self._call(name, "retire", participant.retire, batch, deadline)
                self.registry.install(entries, retired)
            except BaseException as exc:
                self._undo_restore(rid, touched, continued, deadline)
                if isinstance(exc, CheckpointError):
                    raise RestoreFailedError(
                        f"restore {rid} of {plan.checkpoint_id} failed and was rolled back: {exc.message}; "
                        "the new attempts are retired here, so restart those rollouts from their input "
                        "or restore into fresh participants",
                        restore_id=rid,
                        checkpoint_id=plan.checkpoint_id,
                        cause=exc.code,
                    ) from exc
                raise
            return RestoreOutcome(rid, plan.checkpoint_id, plan, restored)

    def _undo_restore(
        self,
        rid: str,
        touched: Sequence[tuple[str, ParticipantControl]],
        continued: Sequence[ExecutionId],
        deadline: float,
    ) -> None:
        cleanup = max(deadline, self.clock() + self.cleanup_grace_s)
        new_attempts = [e.next_attempt() for e in continued]
        for stage in RETIRE_ORDER:
            for name, participant in touched:
                if name.split("/", 1)[0] in stage and new_attempts:
                    try:
                        participant.retire(new_attempts, cleanup)
                    except Exception as exc:
                        log.warning("restore %s: retiring new attempts at %s failed: %s", rid, name, exc)
        for error in self._resume_all(rid, list(touched), cleanup, hook=False):
            log.warning("restore %s: %s", rid, error)

    def _missing(self, rid: str, source: str, missing: Sequence[str]) -> MissingParticipantError:
        return MissingParticipantError(
            f"restore {rid} of {source} refused: the checkpoint lists participant(s) "
            f"{', '.join(missing)}, which this coordinator does not have; nothing was restored "
            "or resumed",
            restore_id=rid,
            checkpoint_id=source,
            missing=list(missing),
        )

    def resume(self, checkpoint_id: str, *, deadline_s: float = 30.0) -> list[ResumeReply]:
        """Resume every participant (reverse prepare order): ends a restore's pause.

        A restore refused for a missing participant cannot be resumed either
        (:class:`MissingParticipantError`): nothing of it may run.
        """
        refused = self._refused.get(checkpoint_id)
        if refused is not None:
            raise self._missing(checkpoint_id, *refused)
        deadline = self.clock() + deadline_s
        replies: list[ResumeReply] = []
        for name, participant in reversed(self._ordered()):
            replies.append(
                self._call(name, "resume", participant.resume, checkpoint_id, deadline, hook=False)
            )
        return replies

    # -- retire / forget ---------------------------------------------------------------------------
    def retire(self, executions: Iterable[ExecutionId], *, deadline_s: float = 30.0) -> None:
        """Retire attempts everywhere (callers before callees, :data:`RETIRE_ORDER`) and in the
        registry (where they are still live there)."""
        batch = list(executions)
        if not batch:
            return
        deadline = self.clock() + deadline_s
        ordered = self._ordered()
        for stage in RETIRE_ORDER:
            self._fan_out(
                [
                    (
                        name,
                        partial(self._call, name, "retire", participant.retire, batch, deadline, hook=False),
                    )
                    for name, participant in ordered
                    if name.split("/", 1)[0] in stage
                ]
            )
        for execution in batch:
            with contextlib.suppress(CheckpointError):
                self.registry.retire(execution)

    def forget(self, rollout_ids: Iterable[str]) -> None:
        """The framework is done with these rollouts for good: drop tombstones everywhere, and
        their token data from later token-store snapshots (if the token source can forget)."""
        ids = list(rollout_ids)
        ordered = self._ordered()
        for stage in RETIRE_ORDER:
            for name, participant in ordered:
                if name.split("/", 1)[0] in stage:
                    self._call(name, "forget", participant.forget, ids, hook=False)
        self.registry.forget(ids)
        forget_tokens = getattr(self.token_source, "forget", None)
        if callable(forget_tokens):  # later snapshots leave their token data out: gc can drop it
            forget_tokens(ids)
