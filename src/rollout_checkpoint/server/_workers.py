"""One participant for a server with several worker processes (NeMo Gym's participant workers).

A :class:`WorkerGroup` runs in the server's main process and is what the coordinator talks to;
every worker process holds its own in-process participant and registers with the group. Each
operation reaches every worker and the answers are merged:

* ``prepare``: ready when every worker is ready; blockers united (named by worker), counts
  summed. A worker that is missing (fewer registered than expected) or dead (unreachable) fails
  the prepare, and a dead one leaves the roster so its replacement can join;
* ``commit``: every worker writes its share as a *part* of the component archive
  (``<component>/parts/<worker_id>``, incremental against its previous part like any
  participant) and answers briefly (no execution lists: the group reads them from the part's
  manifest); the group then writes the component's manifest, which stores nothing and refers
  to every member of every part (format 2), with the merged ``extra`` and ``session_owners``
  (which worker held which execution). Each record is written once, by its worker; the group
  reads only the parts' manifests, member indexes and reference tables. A failed attempt's parts
  are an unpublished checkpoint's leftovers, which retention deletes. With
  ``publication="async"`` every worker freezes first (the group answers ``frozen`` once all
  have); the resume starts the collection of the parts and the manifest write on a background
  thread (``collect`` waits for it);
* ``restore``: the executions of one pre-crash owner go to one live worker, owners spread
  evenly (fewest executions, then fewest owners); each worker restores its share from the merged
  archive, every other worker fences attempt N of it; old owners are aliased to their new
  workers so routed requests find the restored state; ``abort_restore`` reaches every worker (each
  undoes its share) and puts the routing back;
* ``resume``, ``renew``, ``retire``, ``forget``: reach every worker.

The group's incarnation (every reply carries it) is derived from one drawn when the group is
built and from the incarnations its workers answered that call with: a worker restarted inside
the group (its state gone with it) changes the group's incarnation as a restarted server would.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from ..errors import InvalidPhaseError, StaleCheckpointError
from ..format import layout
from ..format.record_reader import ArchiveReader
from ..ids import ExecutionId, validate_id
from ..protocol import (
    BLOCKERS_REPORTED,
    Cancellation,
    Capabilities,
    CommitReply,
    ParticipantStatus,
    Phase,
    PrepareReport,
    Publication,
    RestoreReply,
    ResumeReply,
    new_incarnation,
)
from ..protocol._publication import Upload, Uploads
from ..store import ObjectStore, open_store
from ._client import RemoteParticipant
from ._merge import assign_owners, commit_parts, execution_key, merged_reply, session_owners
from ._router import CONTROL_THREADS, QUICK_THREADS
from ._wire import ParticipantUnreachableError

__all__ = ["WorkerGroup", "WorkerInfo"]

log = logging.getLogger(__name__)

T = TypeVar("T")

RESUMED_IDS_KEPT = 1024


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    socket: str
    pid: int
    client: RemoteParticipant


FAN_OUT_THREADS_PER_WORKER = CONTROL_THREADS + QUICK_THREADS + 8
"""Threads a worker group may keep per worker for its calls to them: one per operation its
control router lets in at once (both limiters), and some for its background uploads."""


class WorkerGroup:
    """The participant of a multi-worker server; see the module docstring."""

    def __init__(
        self,
        store: str | ObjectStore,
        *,
        expected_workers: int,
        token: str,
        call_attempts: int = 2,
    ) -> None:
        if expected_workers < 1:
            raise ValueError("expected_workers must be >= 1")
        self.store = open_store(store)
        self.expected_workers = expected_workers
        self._token = token
        self._call_attempts = call_attempts
        self._lock = threading.Condition()
        self._roster: dict[str, WorkerInfo] = {}
        self._capabilities: Capabilities | None = None
        self._commits: dict[str, CommitReply] = {}
        self._resumed: OrderedDict[str, None] = OrderedDict()  # the last RESUMED_IDS_KEPT ids
        self._aliases: dict[str, str] = {}
        self._rollouts: dict[str, str] = {}
        # routing as it was before each restore not yet resumed (``abort_restore`` puts it back)
        self._routing_before: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        self._gone: deque[str] = deque(maxlen=16)  # recently dropped workers, named in blockers
        self._incarnation = new_incarnation()  # the group's own; replies carry a derived one
        self._derived: tuple[tuple[tuple[str, str], ...], str] | None = None  # the last derivation
        self._uploads = Uploads("worker-group", time.time)
        # One pool for every fan-out, its threads kept: a pool made per call started a thread
        # per worker each time (a quick call through an idle group: about 9 -> 7 ms). Sized so
        # that every operation the control router lets in at once (prepares waiting for their
        # deadline included) has a thread per worker, so a waiting prepare never holds up an
        # abort; threads are only started when needed.
        self._pool = ThreadPoolExecutor(
            max_workers=FAN_OUT_THREADS_PER_WORKER * (expected_workers + 1), thread_name_prefix="worker-group"
        )

    def __repr__(self) -> str:
        return f"WorkerGroup({self.store.url!r}, workers={len(self._roster)}/{self.expected_workers})"

    # -- the roster ---------------------------------------------------------------------------
    def register(self, worker_id: str, socket: str, pid: int, capabilities: Capabilities) -> None:
        """A worker process joins (its private control socket, its participant's capabilities)."""
        validate_id(worker_id, "worker_id")
        caps = capabilities.model_copy(update={"topology": "coordinated_workers"})
        self.prune()
        with self._lock:
            if self._capabilities is not None and caps != self._capabilities:
                raise InvalidPhaseError(
                    f"worker {worker_id} declares {caps.kind}/{caps.instance} ({caps.mode}); the group is "
                    f"{self._capabilities.kind}/{self._capabilities.instance} ({self._capabilities.mode})"
                )
            self._capabilities = caps
            client = RemoteParticipant(
                f"http://{worker_id}",
                token=self._token,
                uds=socket,
                attempts=self._call_attempts,
                capabilities=capabilities,
            )
            old = self._roster.pop(worker_id, None)
            if old is not None:
                old.client.close()
            self._roster[worker_id] = WorkerInfo(worker_id, socket, pid, client)
            self._lock.notify_all()
        log.info("worker %s (pid %d) joined: %d/%d", worker_id, pid, len(self._roster), self.expected_workers)

    def prune(self) -> list[str]:
        """Drop workers whose process is gone (they are this process's children, so a dead one
        has been reaped by uvicorn's supervisor before it starts the replacement)."""
        dead = []
        for worker in self.workers():
            try:
                os.kill(worker.pid, 0)
            except ProcessLookupError:
                dead.append(worker.worker_id)
                self._drop(worker)
            except PermissionError:  # alive, but not ours to signal
                pass
        return dead

    def workers(self) -> list[WorkerInfo]:
        with self._lock:
            return sorted(self._roster.values(), key=lambda w: w.worker_id)

    def wait_for_workers(self, timeout: float) -> bool:
        """Block until every expected worker registered (startup)."""
        with self._lock:
            return self._lock.wait_for(lambda: len(self._roster) >= self.expected_workers, timeout)

    def resolve_owner(self, owner: str) -> WorkerInfo | None:
        """The live worker holding what ``owner`` held (itself, or its restore alias)."""
        with self._lock:
            target = self._aliases.get(owner, owner)
            return self._roster.get(target)

    def place_rollout(self, rollout_id: str) -> WorkerInfo | None:
        """The worker that holds ``rollout_id``'s state: where a restore or an earlier request
        placed it if that worker lives, else the live worker with the fewest rollouts (so
        sessions spread over the workers instead of piling onto whichever accepts first)."""
        validate_id(rollout_id, "rollout_id")
        with self._lock:
            placed = self._rollouts.get(rollout_id)
            if placed is not None and placed in self._roster:
                return self._roster[placed]
            if not self._roster:
                return None
            load = Counter(w for w in self._rollouts.values() if w in self._roster)
            target = min(self._roster, key=lambda w: (load[w], w))
            self._rollouts[rollout_id] = target
            return self._roster[target]

    def _drop(self, worker: WorkerInfo) -> None:
        with self._lock:
            if self._roster.get(worker.worker_id) is worker:
                del self._roster[worker.worker_id]
                self._gone.append(worker.worker_id)
                log.warning("worker %s (pid %d) is gone; it left the roster", worker.worker_id, worker.pid)
        worker.client.close()

    def _each(
        self,
        call: Callable[[WorkerInfo], T],
        workers: Sequence[WorkerInfo] | None = None,
        *,
        fail_fast: bool = False,
    ) -> dict[str, T]:
        """``call`` on every worker concurrently; a worker that cannot be reached is dropped from
        the roster and the first failure (by worker id) is raised after all calls ended, or, with
        ``fail_fast``, as soon as one failed (the other calls are left to end by themselves)."""
        chosen = list(workers) if workers is not None else self.workers()
        if not chosen:
            return {}
        # the first worker's call runs on this thread unless a failure must end the wait early
        inline = None if fail_fast else chosen[0]
        futures = {w.worker_id: self._pool.submit(call, w) for w in chosen if w is not inline}
        if inline is not None:
            here: Future[T] = Future()
            try:
                here.set_result(call(inline))
            except Exception as exc:
                here.set_exception(exc)
            futures = {inline.worker_id: here, **futures}
        wait(list(futures.values()), return_when=FIRST_EXCEPTION if fail_fast else ALL_COMPLETED)
        failures: list[BaseException] = []
        for worker in chosen:
            future = futures[worker.worker_id]
            error = future.exception() if future.done() else None
            if error is None:
                continue
            if isinstance(error, ParticipantUnreachableError):
                self._drop(worker)
            failures.append(error)
        if failures:
            raise failures[0]
        return {wid: f.result() for wid, f in futures.items()}  # all done: none failed

    def _incarnation_of(self, answers: dict[str, str]) -> str:
        """The group's incarnation given its workers' (worker id -> incarnation) in one call:
        the group's own and every worker's hashed, so any worker restart changes it. The last
        derivation is kept (it changes only when a worker does)."""
        key = tuple(sorted(answers.items()))
        derived = self._derived
        if derived is not None and derived[0] == key:
            return derived[1]
        digest = hashlib.sha256(self._incarnation.encode())
        for wid, incarnation in key:
            digest.update(f"\n{wid}={incarnation}".encode())
        value = digest.hexdigest()[:32]
        self._derived = (key, value)
        return value

    @property
    def incarnation(self) -> str:
        """The group's incarnation as its registered workers last answered (no call made)."""
        derived = self._derived
        return derived[1] if derived is not None else self._incarnation_of({})

    # -- ParticipantControl ---------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        with self._lock:
            if self._capabilities is None:
                raise ParticipantUnreachableError("no worker has registered with this server yet")
            return self._capabilities

    def status(self) -> ParticipantStatus:
        statuses = self._each(lambda w: w.client.status())
        caps = self.capabilities()
        if not statuses:
            return ParticipantStatus(
                capabilities=caps,
                phase=Phase.IDLE,
                accepting=False,
                live=0,
                tombstones=0,
                workers=0,
                incarnation=self._incarnation_of({}),
            )
        phases = {s.phase for s in statuses.values()}
        ids = {s.checkpoint_id for s in statuses.values() if s.checkpoint_id is not None}
        return ParticipantStatus(
            capabilities=caps,
            phase=phases.pop() if len(phases) == 1 else Phase.PREPARING,
            checkpoint_id=min(ids) if ids else None,
            accepting=all(s.accepting for s in statuses.values()),
            live=sum(s.live for s in statuses.values()),
            tombstones=max(s.tombstones for s in statuses.values()),
            uploading=self._uploads.running(),
            workers=len(statuses),
            waiting=sum(s.waiting for s in statuses.values()),
            incarnation=self._incarnation_of({w: s.incarnation for w, s in statuses.items()}),
        )

    def prepare(
        self, checkpoint_id: str, deadline: float, *, cancel: Cancellation | None = None
    ) -> PrepareReport:
        validate_id(checkpoint_id, "checkpoint_id")
        self.prune()
        workers = self.workers()
        missing = self.expected_workers - len(workers)
        # ``cancel``: the caller went away; every worker's wait ends within a slice
        reports = self._each(lambda w: w.client.prepare(checkpoint_id, deadline, cancel=cancel), workers)
        blockers = [f"{wid}: {b}" for wid in sorted(reports) for b in reports[wid].blockers]
        count = sum(r.blocker_count for r in reports.values())
        if missing > 0:
            with self._lock:
                gone = ", ".join(self._gone) or "none registered yet"
            blockers.insert(0, f"{missing} of {self.expected_workers} workers missing (gone: {gone})")
            count += missing
        counts: dict[str, int] = {"workers": len(reports)}
        for report in reports.values():
            for name, value in report.counts.items():
                counts[name] = counts.get(name, 0) + value
        ready = missing <= 0 and all(r.ready for r in reports.values())
        restarts = sorted({e for r in reports.values() for e in r.restarts}, key=execution_key)
        return PrepareReport(
            checkpoint_id=checkpoint_id,
            phase=Phase.PREPARED if ready else Phase.PREPARING,
            ready=ready,
            blockers=tuple(blockers[:BLOCKERS_REPORTED]),
            blocker_count=count,
            counts=counts,
            restarts=tuple(restarts),
            incarnation=self._incarnation_of({w: r.incarnation for w, r in reports.items()}),
        )

    def renew(self, checkpoint_id: str, deadline: float) -> None:
        self._each(lambda w: w.client.renew(checkpoint_id, deadline))

    def commit(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
        *,
        publication: Publication = "sync",
        brief: bool = False,
    ) -> CommitReply:
        """Every worker commits its part, then the group writes the component manifest over them
        (see the module docstring). ``brief``: the reply leaves out the executions and restarts
        lists (they are in the component manifest's ``extra``)."""
        reply = self._commit(checkpoint_id, store, deadline, scope, publication)
        return reply.model_copy(update={"executions": (), "restarts": ()}) if brief else reply

    def _commit(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None,
        publication: Publication,
    ) -> CommitReply:
        validate_id(checkpoint_id, "checkpoint_id")
        target = open_store(store)
        with self._lock:
            cached = self._commits.get(checkpoint_id)
        if cached is not None:
            if (cached.phase is Phase.FROZEN) != (publication == "async"):
                raise InvalidPhaseError(
                    f"commit {checkpoint_id}: already {cached.phase.value} by a commit of the other "
                    "publication mode",
                    phase=cached.phase.value,
                )
            return cached
        workers = self.workers()
        if len(workers) < self.expected_workers:
            raise InvalidPhaseError(
                f"commit {checkpoint_id}: {self.expected_workers - len(workers)} of {self.expected_workers} "
                "workers missing"
            )
        if publication == "sync":
            replies = self._each(
                lambda w: w.client.commit(
                    checkpoint_id, target, deadline, scope, part=w.worker_id, brief=True
                ),
                workers,
            )
            fence = partial(self._not_resumed, checkpoint_id)
            reply = self._merge(checkpoint_id, target, replies, fence, self._lock)
            with self._lock:
                if checkpoint_id in self._resumed:
                    self._not_resumed(checkpoint_id)  # raises: resumed after the merge
                self._commits[checkpoint_id] = reply
            return reply
        # asynchronous: every worker freezes (all of them before the coordinator resumes any);
        # after the resume the group collects their parts and writes the manifest over them
        self._uploads.wait_others(checkpoint_id, deadline)
        frozen = self._each(
            lambda w: w.client.commit(
                checkpoint_id, target, deadline, scope, publication="async", part=w.worker_id
            ),
            workers,
        )
        reply = merged_reply(
            self.capabilities(),
            checkpoint_id,
            Phase.FROZEN,
            frozen,
            incarnation=self._incarnation_of({w: r.incarnation for w, r in frozen.items()}),
        )

        def upload(fence: Upload) -> CommitReply:
            # one worker's failed upload fails the group's at once (nothing can publish)
            parts = self._each(
                lambda w: w.client.collect(checkpoint_id, deadline, brief=True), workers, fail_fast=True
            )
            return self._merge(checkpoint_id, target, parts, fence.check, fence.lock)

        with self._lock:
            self._commits[checkpoint_id] = reply
            self._uploads.register(checkpoint_id, 0, deadline, upload)
        return reply

    def collect(self, checkpoint_id: str, deadline: float) -> CommitReply:
        """Wait (until ``deadline``) for the group's background upload: every worker's part
        collected and the component manifest written over them."""
        validate_id(checkpoint_id, "checkpoint_id")
        return self._uploads.collect(checkpoint_id, deadline)

    def _not_resumed(self, checkpoint_id: str) -> None:
        if checkpoint_id in self._resumed:
            raise StaleCheckpointError(
                f"commit {checkpoint_id}: resumed meanwhile; nothing was published",
                checkpoint_id=checkpoint_id,
            )

    def _merge(
        self,
        checkpoint_id: str,
        target: ObjectStore,
        replies: dict[str, CommitReply],
        fence: Callable[[], None],
        lock: threading.Condition,
    ) -> CommitReply:
        """Write the component manifest over the workers' parts (``commit_parts``)."""
        parts = commit_parts(target, checkpoint_id, self.capabilities(), replies, fence, lock)
        return merged_reply(
            self.capabilities(),
            checkpoint_id,
            Phase.COMMITTED,
            replies,
            parts,
            incarnation=self._incarnation_of({w: r.incarnation for w, r in replies.items()}),
        )

    def restore(
        self,
        checkpoint_id: str,
        source_checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
    ) -> RestoreReply:
        validate_id(checkpoint_id, "checkpoint_id")
        source = open_store(store)
        workers = self.workers()
        if len(workers) < self.expected_workers:
            raise InvalidPhaseError(
                f"restore {checkpoint_id}: {self.expected_workers - len(workers)} of "
                f"{self.expected_workers} workers missing"
            )
        caps = self.capabilities()
        manifest = ArchiveReader.open(
            source, layout.component_prefix(source_checkpoint_id, caps.kind, caps.instance)
        ).manifest
        owners = session_owners(manifest.extra.get("session_owners"))
        wanted = set(scope) if scope is not None else {e for es in owners.values() for e in es}
        by_owner: dict[str, list[ExecutionId]] = {}
        for owner, executions in owners.items():
            mine = [e for e in executions if e in wanted]
            if mine:
                by_owner[owner] = mine
        owned = {e for es in by_owner.values() for e in es}
        # in scope but owned by no worker (a checkpoint from a single-process server): one each
        for execution in sorted(wanted - owned, key=execution_key):
            by_owner.setdefault(f"unowned-{execution.rollout_id}", []).append(execution)
        placement = assign_owners(by_owner, [w.worker_id for w in workers])
        shares: dict[str, list[ExecutionId]] = {w.worker_id: [] for w in workers}
        for owner, target in placement.items():
            shares[target].extend(by_owner[owner])
        replies = self._each(
            lambda w: w.client.restore(
                checkpoint_id,
                source_checkpoint_id,
                source,
                deadline,
                sorted(shares[w.worker_id], key=execution_key),
            ),
            workers,
        )
        # every worker refuses attempt N of what another worker now holds as N+1
        others = {w.worker_id: sorted(wanted - set(shares[w.worker_id]), key=execution_key) for w in workers}
        self._each(lambda w: w.client.retire(others[w.worker_id], deadline), workers)
        restored = sorted({e for r in replies.values() for e in r.restored}, key=execution_key)
        with self._lock:
            self._routing_before[checkpoint_id] = (dict(self._aliases), dict(self._rollouts))
            self._aliases.update({owner: target for owner, target in placement.items()})
            for target, executions in shares.items():
                for execution in executions:
                    self._rollouts[execution.rollout_id] = target
                    # a client that names the replacement attempt by its capture key (NeMo Gym's
                    # /ng-rollout/<rollout>-a<N>/) reaches the same worker
                    self._rollouts[execution.next_attempt().capture_key] = target
        return RestoreReply(
            checkpoint_id=checkpoint_id,
            source_checkpoint_id=source_checkpoint_id,
            phase=Phase.RESTORED,
            restored=tuple(restored),
            incarnation=self._incarnation_of({w: r.incarnation for w, r in replies.items()}),
        )

    def resume(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        validate_id(checkpoint_id, "checkpoint_id")
        with self._lock:  # decided under the lock commit publishes under: before or after, never both
            self._routing_before.pop(checkpoint_id, None)
            self._resumed[checkpoint_id] = None
            while len(self._resumed) > RESUMED_IDS_KEPT:
                self._resumed.popitem(last=False)
            self._commits.pop(checkpoint_id, None)
        replies = self._each(lambda w: w.client.resume(checkpoint_id, deadline))
        self._uploads.launch(checkpoint_id)  # an asynchronous commit's merge, after the workers'
        return ResumeReply(
            checkpoint_id=checkpoint_id,
            phase=Phase.IDLE,
            idempotent=all(r.idempotent for r in replies.values()),
            incarnation=self._incarnation_of({w: r.incarnation for w, r in replies.items()}),
        )

    def abort_restore(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        """Undo a restore at every worker (each puts back what it installed) and the routing."""
        validate_id(checkpoint_id, "checkpoint_id")
        replies = self._each(lambda w: w.client.abort_restore(checkpoint_id, deadline))
        with self._lock:
            before = self._routing_before.pop(checkpoint_id, None)
            if before is not None:
                self._aliases, self._rollouts = before
        return ResumeReply(
            checkpoint_id=checkpoint_id,
            phase=Phase.IDLE,
            idempotent=all(r.idempotent for r in replies.values()),
            incarnation=self._incarnation_of({w: r.incarnation for w, r in replies.items()}),
        )

    def retire(self, executions: Sequence[ExecutionId], deadline: float) -> None:
        batch = list(executions)
        self._each(lambda w: w.client.retire(batch, deadline))

    def forget(self, rollout_ids: Sequence[str]) -> None:
        ids = list(rollout_ids)
        self._each(lambda w: w.client.forget(ids))
        with self._lock:
            for rollout_id in ids:
                self._rollouts.pop(rollout_id, None)

    def close(self) -> None:
        for worker in self.workers():
            worker.client.close()
        self._pool.shutdown(wait=False)
