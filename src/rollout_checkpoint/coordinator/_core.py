"""What every coordinator operation shares: the participants in prepare order, the fault hook,
retried idempotent calls, concurrent stages, deadlines and resume-everyone (also the abort)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from opentelemetry.trace import SpanKind

from ..errors import CheckpointError, DeadlineExceededError, InvalidArgumentError, ParticipantRestartedError
from ..format.commit_log import iter_candidates, read_record
from ..format.manifests import GlobalCheckpointRecord
from ..format.ownership import OwnerEpoch, check_epoch, take_epoch
from ..ids import validate_id
from ..protocol import PREPARE_ORDER, ParticipantControl
from ..protocol._increments import BaseCatalog
from ..reader import TokenSnapshotLoader
from ..registry import LiveExecutionRegistry
from ..store import ObjectStore, open_store
from ..telemetry import Attr, Measured, Span, bound, log_fields, operation
from ._types import RETRYABLE, CheckpointCancelledError, FaultHook, TokenSnapshotSource, participant_name

__all__ = ["CoordinatorCore", "Steps"]

log = logging.getLogger("rollout_checkpoint.coordinator")

T = TypeVar("T")


class Steps:
    """The measured steps of one operation: each a span (``rollout_checkpoint.coordinator.<step>``,
    a child of the current one) whose seconds are also ``CheckpointOutcome.timings[step]``, so
    the outcome and the trace report one measurement."""

    def __init__(self, checkpoint_id: str) -> None:
        self.checkpoint_id = checkpoint_id
        self.timings: dict[str, float] = {}
        self.marks: dict[str, Measured] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[Measured]:
        with operation(
            Span.coordinator(name), attributes={Attr.CHECKPOINT_ID: self.checkpoint_id}
        ) as measured:
            yield measured
        self.timings[name] = self.timings.get(name, 0.0) + measured.seconds
        self.marks[name] = measured


class CoordinatorCore:
    """The coordinator's state and shared helpers (the operations live in the subclasses)."""

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
        run_id: str | None = None,
        takeover: bool = False,
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
        # format 2: the registry component refers to its unchanged members of the last published
        # checkpoint (``enabled = False``: every checkpoint writes the whole registry, format 1)
        self.registry_catalog = BaseCatalog()
        self.coordinator_id = coordinator_id or uuid.uuid4().hex
        self.run_id = validate_id(run_id or f"run-{uuid.uuid4().hex}", "run_id")
        self.takeover = takeover
        self._epoch: OwnerEpoch | None = None
        self._names = [participant_name(p) for p in self.participants]
        if len(set(self._names)) != len(self._names):
            raise InvalidArgumentError(f"participants must be unique by kind/instance: {self._names}")
        unknown = [n for n in self._names if n.split("/", 1)[0] not in PREPARE_ORDER]
        if unknown:
            raise InvalidArgumentError(f"participants of unknown kind: {unknown}")
        # Held by a cycle until its publication ends (an asynchronous one releases it from its
        # background thread), so a checkpoint or restore waits for the previous publication.
        self._cycle = threading.Lock()
        self._cancel = threading.Event()
        self._last_sequence = 0
        self._refused: dict[str, tuple[str, list[str]]] = {}  # restore id -> (source, lacking)
        # kind/instance -> the incarnation of its last published checkpoint or restore
        self._incarnations: dict[str, str] = {}
        # kind/instance -> the checkpoint (of an earlier coordinator of this run) whose record
        # the kept incarnation was seeded from; gone once this coordinator keeps its own
        self._recorded_in: dict[str, str] = {}
        self._seeded = False  # kept incarnations seeded, or set by a publish or restore

    # -- incarnations (``docs/protocol.md``, "Incarnations") --------------------------------------
    @property
    def incarnations(self) -> dict[str, str]:
        """``kind/instance`` -> the incarnation each participant had in this coordinator's last
        published checkpoint or restore, or, from its first checkpoint on until then, as the
        run's latest checkpoint recorded it (a participant in none of these is absent)."""
        return dict(self._incarnations)

    def _keep(self, incarnations: Mapping[str, str]) -> None:
        """Keep these (a published cycle's or a successful restore's)."""
        self._incarnations.update(incarnations)
        for name in incarnations:
            self._recorded_in.pop(name, None)
        self._seeded = True

    def _latest_record_of_run(self) -> GlobalCheckpointRecord | None:
        """The record of the newest checkpoint this run (``run_id``) published, or ``None``; a
        damaged record is passed over (a restore of it would be refused)."""
        for candidate in iter_candidates(self.store):
            try:
                record, _ = read_record(self.store, candidate.checkpoint_id)
            except CheckpointError:
                continue
            if record.run_id == self.run_id:
                return record
        return None

    def _seed_incarnations(self) -> None:
        """Before this coordinator's first checkpoint (no publish or restore yet): keep the
        incarnations this run's latest checkpoint recorded, so a participant restarted before
        this coordinator started (a new driver over a silently restarted one) is refused as if
        this coordinator had published that checkpoint. A run with no checkpoint, or whose
        latest predates recorded incarnations, keeps none (every participant taken as it
        answers)."""
        if self._seeded:
            return
        record = self._latest_record_of_run()
        if record is not None and record.incarnations:
            mine = {n: i for n, i in record.incarnations.items() if n in self._names}
            self._incarnations.update(mine)
            self._recorded_in.update(dict.fromkeys(mine, record.checkpoint_id))
            log.info(
                "coordinator %s: incarnations of %d participants kept from checkpoint %s",
                self.coordinator_id,
                len(mine),
                record.checkpoint_id,
                extra=log_fields(checkpoint_id=record.checkpoint_id),
            )
        self._seeded = True

    def _check_incarnations(self, cid: str, seen: dict[str, str], replies: Sequence[tuple[str, Any]]) -> None:
        """Refuse (``participant_restarted``) a reply from another incarnation than this cycle's
        first reply of that participant, or than its last published checkpoint or restore.
        ``seen`` collects the cycle's incarnations (kept once it publishes)."""
        for name, reply in replies:
            now: str = reply.incarnation
            before = seen.get(name)
            if before is None:
                seen[name] = now
                before = self._incarnations.get(name)
                if before is None or before == now:
                    continue
                source = self._recorded_in.get(name)
                when = (
                    "since its last published checkpoint or restore"
                    if source is None
                    else f"since checkpoint {source}, this run's latest (its incarnation recorded there)"
                )
            elif before == now:
                continue
            else:
                when = f"during checkpoint {cid}"
            raise ParticipantRestartedError(
                f"checkpoint {cid}: participant {name} restarted {when} (incarnation {before} -> "
                f"{now}): its live state is gone, so nothing was published; recover (restore the "
                "latest checkpoint) before the next one",
                checkpoint_id=cid,
                participant=name,
                expected=before,
                actual=now,
            )

    # -- ownership of the store (``format.ownership``) -------------------------------------------
    @property
    def epoch(self) -> OwnerEpoch | None:
        """The owner epoch this coordinator holds (taken by its first checkpoint or restore)."""
        return self._epoch

    def _own(self) -> OwnerEpoch:
        """Take an owner epoch once: refused (``store_owned``) when another run owns the store,
        unless ``takeover``; a replacement of the same run fences its predecessor this way."""
        if self._epoch is None:
            newest = next(iter_candidates(self.store), None)
            if self.fault_hook is not None:
                self.fault_hook("take_epoch")
            self._epoch = take_epoch(
                self.store,
                run_id=self.run_id,
                coordinator_id=self.coordinator_id,
                created_at=datetime.fromtimestamp(self.clock(), tz=UTC),
                published_through=0 if newest is None or newest.sequence is None else newest.sequence,
                takeover=self.takeover,
            )
            log.info(
                "coordinator %s owns %s: run %s, epoch %d",
                self.coordinator_id,
                self.store.url,
                self.run_id,
                self._epoch.epoch,
            )
        return self._epoch

    def _check_owner(self, mine: OwnerEpoch) -> None:
        check_epoch(self.store, mine)

    def cancel(self) -> None:
        """Stop the running cycle (or its background publication) at its next step if it has
        not reached the commit point."""
        self._cancel.set()

    def _step(self, name: str) -> None:
        if self._cancel.is_set():
            raise CheckpointCancelledError(f"checkpoint cancelled before step {name!r}", step=name)
        if self.fault_hook is not None:
            self.fault_hook(name)

    def _ordered(self) -> list[tuple[str, ParticipantControl]]:
        return sorted(
            zip(self._names, self.participants, strict=True),
            key=lambda item: (PREPARE_ORDER.index(item[0].split("/", 1)[0]), item[0]),
        )

    @staticmethod
    def _stage(
        ordered: Sequence[tuple[str, ParticipantControl]], kind: str
    ) -> list[tuple[str, ParticipantControl]]:
        return [(n, p) for n, p in ordered if n.split("/", 1)[0] == kind]

    def _call(self, name: str, step: str, fn: Callable[..., T], *args: Any, hook: bool = True) -> T:
        if hook:
            self._step(f"{step}:{name}")
        with _call_span(name, step) as call:
            for attempt in range(self.call_retries + 1):
                try:
                    return fn(*args)
                except RETRYABLE:
                    if attempt >= self.call_retries:
                        raise
                    if call.recording:
                        call.span.add_event("retry", {"attempt": attempt + 1})
                    log.warning(
                        "%s %s: answer lost, repeating the idempotent call",
                        step,
                        name,
                        extra=log_fields(participant=name),
                    )
        raise AssertionError("unreachable")

    def _fan_out(self, calls: Sequence[tuple[str, Callable[[], T]]]) -> list[tuple[str, T]]:
        """Run the calls concurrently (a remote participant answers slowly): one stage's, or every
        commit; every call has finished when this returns, and the first failure in the order
        given (prepare order) is raised."""
        if len(calls) <= 1:
            return [(name, fn()) for name, fn in calls]
        with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="coordinator") as pool:
            futures = [pool.submit(bound(fn)) for _, fn in calls]  # each call joins this trace
            wait(futures)
        failures = [
            (name, f.exception()) for (name, _), f in zip(calls, futures, strict=True) if f.exception()
        ]
        for name, error in failures[1:]:
            if isinstance(error, Exception):  # not an exit or interrupt ending this process
                log.warning(
                    "%s also failed in the same stage: %s", name, error, extra=log_fields(participant=name)
                )
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

    def _abort(self, cid: str, touched: Sequence[tuple[str, ParticipantControl]], deadline: float) -> None:
        """Resume (= abort) every participant prepare reached, in reverse order; never raises."""
        errors = self._resume_all(cid, list(touched), deadline, hook=False)
        for error in errors:
            log.warning("abort of checkpoint %s: %s", cid, error, extra=log_fields(checkpoint_id=cid))

    def _resume_all(
        self, cid: str, ordered: Sequence[tuple[str, ParticipantControl]], deadline: float, *, hook: bool
    ) -> list[str]:
        def resume_one(name: str, participant: ParticipantControl) -> str | None:
            first = hook
            with _call_span(name, "resume"):
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
            stage = self._stage(ordered, kind)
            outcomes = self._fan_out([(name, partial(resume_one, name, p)) for name, p in reversed(stage)])
            errors.extend(error for _, error in outcomes if error is not None)
        return errors


def _call_span(name: str, op: str) -> AbstractContextManager[Measured]:
    """The client span of one participant call (``name`` is ``kind/instance``)."""
    kind, _, instance = name.partition("/")  # the token store is called "tokens"
    attributes = {Attr.PARTICIPANT_KIND: kind}
    if instance:
        attributes[Attr.PARTICIPANT_INSTANCE] = instance
    return operation(
        Span.call(op), kind=SpanKind.CLIENT, attributes=attributes, metric={Attr.PARTICIPANT_KIND: kind}
    )
