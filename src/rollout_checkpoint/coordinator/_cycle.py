"""The checkpoint cycle, synchronous or asynchronous (``docs/protocol.md``, "Checkpoint cycle"
and "Asynchronous publication").

Synchronous: freeze dispatch -> prepare -> commit -> publication (``_publication``) -> latest
-> resume. Asynchronous: freeze dispatch -> prepare -> commit(``async``: each participant
freezes an in-memory snapshot and answers ``frozen``) -> registry snapshot -> resume, which ends
the pause; then, on a background thread: collect every upload -> publication -> latest.
Either way a failure before the commit point publishes nothing; a failure after it never
un-publishes (the outcome reports it).

From the commit to the end of the pause the cycle collector is paused (``_runtime.gc_paused``):
the commit builds many objects and no reference cycle, and a full collection landing in the
pause walked every object the process holds (a third of a 10,000-rollout synchronous pause).
Prepare, which may wait for long calls to finish, runs with the collector on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from functools import partial
from typing import cast

from opentelemetry import context as otel_context
from pydantic import JsonValue

from .._runtime import gc_paused
from ..errors import IntegrityError, ManifestConflictError, ObjectExistsError
from ..format.commit_log import LatestUpdate, advance_latest
from ..format.manifests import GlobalCheckpointRecord, ObjectRef, new_checkpoint_id
from ..ids import ExecutionId, validate_id
from ..protocol import (
    PREPARE_ORDER,
    AsyncParticipantControl,
    CommitReply,
    ParticipantControl,
    Phase,
    PrepareReport,
    Publication,
)
from ..registry import LiveExecutionRegistry
from ..store import ObjectStore
from ..telemetry import Attr, Measured, Span, bound, instruments, log_fields, operation
from ._core import Steps, log
from ._publication import Committed, Publisher, registry_snapshot
from ._types import CheckpointNotReadyError, CheckpointOutcome, HookedStore, PublicationHandle

__all__ = ["CheckpointCycle"]

Ordered = list[tuple[str, ParticipantControl]]


class CheckpointCycle(Publisher):
    """``checkpoint`` / ``checkpoint_async`` / ``wait_until_finished``."""

    _pending: PublicationHandle | None = None

    def checkpoint(
        self,
        checkpoint_id: str | None = None,
        *,
        deadline_s: float = 60.0,
        framework_state: JsonValue = None,
        publication: Publication = "sync",
    ) -> CheckpointOutcome:
        """Run one cycle and publish ``checkpoint_id`` (default ``ckpt-<UTC time>-<8 hex>``).

        Raises (after aborting: every participant resumed, nothing published) on any failure
        before the commit point: :class:`CheckpointNotReadyError`, :class:`CheckpointCancelledError`,
        :class:`~rollout_checkpoint.errors.ManifestConflictError` when another coordinator
        published this id, or the participant's / store's own error.

        ``publication="async"`` resumes the participants as soon as every snapshot is frozen
        and publishes in the background; this call still waits for the publication (see
        :meth:`checkpoint_async` for the handle). ``deadline_s`` bounds the whole cycle,
        background publication included.
        """
        if publication == "async":
            return self.checkpoint_async(
                checkpoint_id, deadline_s=deadline_s, framework_state=framework_state
            ).result()
        if publication != "sync":
            raise ValueError(f"publication must be 'sync' or 'async', not {publication!r}")
        cid = validate_id(checkpoint_id or new_checkpoint_id(), "checkpoint_id")
        self.store.require_atomic_commits(accept_risk=self.accept_unsafe_store)
        with self._cycle:
            self._cancel.clear()
            self._own()
            self._seed_incarnations()
            return self._run_sync(cid, deadline_s, framework_state)

    def checkpoint_async(
        self,
        checkpoint_id: str | None = None,
        *,
        deadline_s: float = 60.0,
        framework_state: JsonValue = None,
    ) -> PublicationHandle:
        """Pause, freeze every participant, resume them, and return while the publication runs.

        Waits first for the previous publication to end (one at a time, as Orbax does). A
        failure before the resume raises here (aborted, nothing published); a failure of the
        background publication is raised by :meth:`PublicationHandle.result` (nothing
        published; the previous checkpoint stays the newest)."""
        lacking = [n for n, p in self._ordered() if not isinstance(p, AsyncParticipantControl)]
        if lacking:
            raise ValueError(f"asynchronous publication needs commit(publication=) and collect: {lacking}")
        cid = validate_id(checkpoint_id or new_checkpoint_id(), "checkpoint_id")
        self.store.require_atomic_commits(accept_risk=self.accept_unsafe_store)
        self._cycle.acquire()
        try:
            self._cancel.clear()
            self._own()
            self._seed_incarnations()
            handle = self._run_async(cid, deadline_s, framework_state)
        except BaseException:
            self._cycle.release()
            raise
        return handle

    def wait_until_finished(self, timeout: float | None = None) -> bool:
        """Wait for the running background publication (if any); ``False`` on timeout. Its
        failure is not raised here: :meth:`PublicationHandle.result` reports it."""
        pending = self._pending
        if pending is None:
            return True
        try:
            pending.result(timeout)
        except TimeoutError:
            return pending.done()
        except BaseException:
            pass
        return True

    # -- shared steps ------------------------------------------------------------------------------
    def _prepare_all(
        self, cid: str, deadline: float, ordered: Ordered, touched: Ordered, seen: dict[str, str]
    ) -> None:
        """Prepare stage by stage; stop at the first stage that is not ready (or whose
        participant answers from another incarnation)."""
        for kind in PREPARE_ORDER:
            stage = self._stage(ordered, kind)
            touched.extend(stage)
            reports: list[tuple[str, PrepareReport]] = self._fan_out(
                [
                    (name, partial(self._call, name, "prepare", participant.prepare, cid, deadline))
                    for name, participant in stage
                ]
            )
            self._check_incarnations(cid, seen, reports)
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

    def _commit_all(
        self,
        cid: str,
        deadline: float,
        ordered: Ordered,
        hooked: ObjectStore,
        live: list[ExecutionId],
        publication: Publication,
        seen: dict[str, str],
    ) -> Committed:
        """Commit every participant under the frozen membership, all of them concurrently (as
        NeMo Gym fans its commit out): every stage is prepared, so no participant's state moves
        while another writes, and over HTTP the servers' commits overlap instead of adding up.
        The first failure in prepare order is raised after every commit has returned."""
        calls = []
        scope = tuple(live)  # one immutable scope for every participant (hashed once in process)
        for name, p in ordered:
            commit = p.commit if publication == "sync" else partial(_async(p).commit, publication="async")
            calls.append((name, partial(self._call, name, "commit", commit, cid, hooked, deadline, scope)))
        committed: list[tuple[str, CommitReply]] = self._fan_out(calls)
        self._check_incarnations(cid, seen, committed)
        return [(name, p, reply) for (name, p), (_, reply) in zip(ordered, committed, strict=True)]

    def _latest(
        self, cid: str, record: GlobalCheckpointRecord, ref: ObjectRef, errors: list[str]
    ) -> LatestUpdate | None:
        """After the commit point nothing un-publishes: failures are reported, not raised."""
        try:
            self._step("latest")
            return advance_latest(self.store, record, ref, now=self.clock)
        except Exception as exc:
            errors.append(f"latest pointer not moved: {exc}")
            log.warning(
                "checkpoint %s published but the latest pointer was not moved: %s",
                cid,
                exc,
                extra=log_fields(checkpoint_id=cid),
            )
            return None

    # -- synchronous -------------------------------------------------------------------------------
    def _run_sync(self, cid: str, deadline_s: float, framework_state: JsonValue) -> CheckpointOutcome:
        steps = Steps(cid)
        with _cycle_span(cid, "sync") as cycle:
            deadline = self.clock() + deadline_s
            hooked = HookedStore(self.store, self._step)
            ordered = self._ordered()
            touched: Ordered = []
            seen: dict[str, str] = {}  # this cycle's incarnations
            self._step("freeze")
            with self.registry.frozen(cid) as live, ExitStack() as collector:
                try:
                    with steps.step("prepare"):
                        self._prepare_all(cid, deadline, ordered, touched, seen)
                    collector.enter_context(gc_paused())  # see the module docstring
                    with steps.step("commit"):
                        committed = self._commit_all(cid, deadline, ordered, hooked, live, "sync", seen)
                    record, ref = self._complete(
                        cid, deadline, hooked, committed, self.registry, framework_state, steps, seen
                    )
                    self._keep(seen)  # published: these are the kept ones now
                except BaseException as exc:
                    self._abort(cid, touched, deadline)
                    if isinstance(exc, ObjectExistsError):
                        raise _conflict(cid, exc) from exc
                    raise
                errors: list[str] = []
                with steps.step("latest"):
                    latest = self._latest(cid, record, ref, errors)
                with steps.step("resume"):
                    errors.extend(self._resume_all(cid, ordered, deadline, hook=True))
        return self._outcome(
            cid, record, ref, latest, errors, cycle, steps, publication="sync", pause=cycle.seconds
        )

    def _outcome(
        self,
        cid: str,
        record: GlobalCheckpointRecord,
        ref: ObjectRef,
        latest: LatestUpdate | None,
        errors: list[str],
        cycle: Measured,
        steps: Steps,
        *,
        publication: Publication,
        pause: float,
    ) -> CheckpointOutcome:
        """The outcome, from the step spans' measurements (and their metrics)."""
        published = steps.marks["publish"].end_ns
        lag = (published - cycle.start_ns) / 1e9
        attributes = {Attr.PUBLICATION: publication}
        instruments().pause_duration.record(pause, attributes)
        instruments().publication_lag.record(lag, attributes)
        return CheckpointOutcome(
            checkpoint_id=cid,
            record=record,
            record_ref=ref,
            latest=latest,
            post_commit_errors=tuple(errors),
            pause_seconds=pause,
            publish_seconds=(published - steps.marks["commit"].start_ns) / 1e9,
            timings=dict(steps.timings),
            publication=publication,
        )

    # -- asynchronous ------------------------------------------------------------------------------
    def _run_async(self, cid: str, deadline_s: float, framework_state: JsonValue) -> PublicationHandle:
        steps = Steps(cid)
        with _cycle_span(cid, "async") as cycle:
            trace_context = otel_context.get_current()  # the background steps are children of this
            deadline = self.clock() + deadline_s
            hooked = HookedStore(self.store, self._step)
            ordered = self._ordered()
            touched: Ordered = []
            seen: dict[str, str] = {}  # this cycle's incarnations
            self._step("freeze")
            with self.registry.frozen(cid) as live, ExitStack() as collector:
                try:
                    with steps.step("prepare"):
                        self._prepare_all(cid, deadline, ordered, touched, seen)
                    collector.enter_context(gc_paused())  # see the module docstring
                    with steps.step("commit"):
                        frozen = self._commit_all(cid, deadline, ordered, hooked, live, "async", seen)
                        for name, _, reply in frozen:
                            if reply.phase is not Phase.FROZEN or reply.checkpoint_id != cid:
                                raise IntegrityError(
                                    f"{name}: asynchronous commit of {cid} answered {reply.phase.value} "
                                    f"for {reply.checkpoint_id}",
                                    checkpoint_id=cid,
                                )
                    with steps.step("registry_snapshot"):
                        self._step("registry_snapshot")
                        snapshot = registry_snapshot(self.registry)
                except BaseException:
                    self._abort(cid, touched, deadline)
                    raise
            # every snapshot is frozen: end the pause before any encoding or upload waits on it
            with steps.step("resume"):
                resume_errors = self._resume_all(cid, ordered, deadline, hook=True)
        handle = PublicationHandle(cid, cycle.seconds)
        self._pending = handle

        def background() -> None:
            try:
                handle._settle(
                    lambda: self._publish_async(
                        cid,
                        deadline,
                        hooked,
                        frozen,
                        snapshot,
                        framework_state,
                        steps,
                        cycle,
                        handle,
                        resume_errors,
                        seen,
                    )
                )
            finally:
                self._cycle.release()

        threading.Thread(target=bound(background, trace_context), name=f"publish-{cid}").start()
        return handle

    def _publish_async(
        self,
        cid: str,
        deadline: float,
        hooked: ObjectStore,
        frozen: Committed,
        snapshot: LiveExecutionRegistry,
        framework_state: JsonValue,
        steps: Steps,
        cycle: Measured,
        handle: PublicationHandle,
        resume_errors: list[str],
        seen: dict[str, str],
    ) -> CheckpointOutcome:
        try:
            with steps.step("collect"):
                collected: list[tuple[str, CommitReply]] = self._fan_out(
                    [
                        (
                            name,
                            partial(
                                self._call,
                                name,
                                "collect",
                                cast(AsyncParticipantControl, p).collect,
                                cid,
                                deadline,
                            ),
                        )
                        for name, p, _ in frozen
                    ]
                )
            self._check_incarnations(cid, seen, collected)
            committed = [(name, p, reply) for (name, p, _), (_, reply) in zip(frozen, collected, strict=True)]
            record, ref = self._complete(
                cid, deadline, hooked, committed, snapshot, framework_state, steps, seen
            )
            self._keep(seen)
        except BaseException as exc:
            log.warning(
                "checkpoint %s: background publication failed, nothing published: %s",
                cid,
                exc,
                extra=log_fields(checkpoint_id=cid, error_code=getattr(exc, "code", None)),
            )
            if isinstance(exc, ObjectExistsError):
                raise _conflict(cid, exc) from exc
            raise
        errors: list[str] = []
        with steps.step("latest"):
            latest = self._latest(cid, record, ref, errors)
        return self._outcome(
            cid,
            record,
            ref,
            latest,
            resume_errors + errors,
            cycle,
            steps,
            publication="async",
            pause=handle.pause_seconds,
        )


def _cycle_span(cid: str, publication: Publication) -> AbstractContextManager[Measured]:
    """The root span of a cycle: from the freeze of dispatch to the last resume (the pause)."""
    return operation(
        Span.coordinator("checkpoint"),
        attributes={Attr.CHECKPOINT_ID: cid, Attr.PUBLICATION: publication},
        metric={Attr.PUBLICATION: publication},
    )


def _async(participant: ParticipantControl) -> AsyncParticipantControl:
    return cast(AsyncParticipantControl, participant)  # checked by checkpoint_async


def _collect(participant: ParticipantControl) -> Callable[[str, float], CommitReply]:
    return _async(participant).collect


def _conflict(cid: str, exc: ObjectExistsError) -> ManifestConflictError:
    return ManifestConflictError(
        f"checkpoint {cid}: another writer already committed here ({exc})", checkpoint_id=cid
    )
