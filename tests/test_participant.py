"""The participant control plane: phases, refusals and their codes, idempotency, deadlines,
leases, admission and concurrency. Uses the agent participant (and a toy one where a
controllable readiness is needed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from rollout_checkpoint import archive
from rollout_checkpoint.errors import (
    AdmissionClosedError,
    CheckpointError,
    DeadlineExceededError,
    IdentityConflictError,
    InvalidIdentifierError,
    InvalidPhaseError,
    StaleAttemptError,
    TransientStoreError,
    UnknownExecutionError,
)
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.format.records import AgentBoundaryRecord, Record
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import AgentParticipant
from rollout_checkpoint.protocol import (
    BLOCKERS_REPORTED,
    RESUMED_IDS_KEPT,
    Export,
    Participant,
    ParticipantControl,
    Phase,
    Readiness,
)
from rollout_checkpoint.store import MemoryStore, ObjectStore, PutResult
from rollout_checkpoint.store._counting import CountingStore


def ex(rollout: str, attempt: int = 0) -> ExecutionId:
    return ExecutionId(rollout_id=rollout, attempt=attempt)


def soon(seconds: float = 10.0) -> float:
    return time.time() + seconds


def past() -> float:
    return time.time() - 1.0


def boundary(execution: ExecutionId, index: int = 0, **fields: Any) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=execution.rollout_id,
        attempt=execution.attempt,
        boundary_index=index,
        turn_index=index,
        **fields,
    )


def at_boundary(agent: AgentParticipant, *executions: ExecutionId) -> None:
    for execution in executions:
        agent.begin(execution)
        agent.boundary(execution, boundary(execution))


def code_of(fn: Callable[[], object]) -> str:
    with pytest.raises(CheckpointError) as info:
        fn()
    return info.value.code


@pytest.fixture()
def agent() -> Iterator[AgentParticipant]:
    participant = AgentParticipant("a1")
    yield participant
    participant.close()


@pytest.fixture()
def store() -> MemoryStore:
    return MemoryStore(f"t-{time.time_ns()}")


class Toy(Participant):
    """A participant whose readiness the test sets directly."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(kind="environment", instance="toy", mode="exported", **kwargs)
        self.blocked = False

    def set_blocked(self, blocked: bool) -> None:
        with self._cond:
            self.blocked = blocked
            self._changed()

    def _readiness(self) -> Readiness:
        return Readiness(blockers=["toy-work"] if self.blocked else [])

    def _export(self, scope: frozenset[ExecutionId] | None) -> Export:
        return Export(records=[], executions=[])

    def _validate_restore(self, records: Sequence[Record]) -> Callable[[], list[ExecutionId]]:
        return list

    def _retire_state(self, executions: Sequence[ExecutionId]) -> None:
        return None


# -- protocol and phases -----------------------------------------------------------------------


def test_reference_participants_satisfy_the_control_protocol(agent: AgentParticipant) -> None:
    assert isinstance(agent, ParticipantControl)
    assert isinstance(Toy(), ParticipantControl)
    caps = agent.capabilities()
    assert (caps.kind, caps.instance, caps.mode) == ("agent", "a1", "exported")


def test_full_cycle_idle_preparing_prepared_committed_idle(
    agent: AgentParticipant, store: MemoryStore
) -> None:
    agent.begin(ex("r1"))  # running: blocks
    report = agent.prepare("c1", soon(0.05))
    assert (report.ready, report.phase, report.blockers) == (False, Phase.PREPARING, ("r1#0",))
    status = agent.status()
    assert (status.phase, status.checkpoint_id, status.accepting) == (Phase.PREPARING, "c1", False)
    agent.boundary(ex("r1"), boundary(ex("r1")))
    report = agent.prepare("c1", soon())
    assert (report.ready, report.phase, report.blocker_count) == (True, Phase.PREPARED, 0)
    reply = agent.commit("c1", store, soon())
    assert reply.phase is Phase.COMMITTED and agent.phase is Phase.COMMITTED
    assert reply.executions == (ex("r1"),)
    resumed = agent.resume("c1", soon())
    assert (resumed.phase, resumed.idempotent) == (Phase.IDLE, False)
    assert agent.status().accepting and agent.status().checkpoint_id is None


def test_idle_restored_idle(agent: AgentParticipant, store: MemoryStore) -> None:
    at_boundary(agent, ex("r1"))
    agent.prepare("c1", soon())
    agent.commit("c1", store, soon())
    agent.resume("c1", soon())
    fresh = AgentParticipant("a1")
    reply = fresh.restore("restore-1", "c1", store, soon())
    assert reply.phase is Phase.RESTORED and reply.restored == (ex("r1", 1),)
    status = fresh.status()
    assert (status.phase, status.accepting, status.live) == (Phase.RESTORED, False, 1)
    assert code_of(lambda: fresh.begin(ex("r1", 1))) == "admission_closed"  # paused until resume
    fresh.resume("restore-1", soon())
    assert fresh.begin(ex("r1", 1)) == boundary(ex("r1", 1))


@pytest.mark.parametrize("phase", [Phase.PREPARING, Phase.PREPARED, Phase.COMMITTED, Phase.RESTORED])
def test_resume_returns_every_phase_to_idle(phase: Phase, store: MemoryStore) -> None:
    source = AgentParticipant("a1")
    at_boundary(source, ex("r1"))
    source.prepare("src", soon())
    source.commit("src", store, soon())
    source.resume("src", soon())

    agent = AgentParticipant("a1")
    if phase is Phase.RESTORED:
        agent.restore("c1", "src", store, soon())
    else:
        agent.begin(ex("r2"))
        if phase is not Phase.PREPARING:
            agent.boundary(ex("r2"), boundary(ex("r2")))
        agent.prepare("c1", soon(0.05))
        if phase is Phase.COMMITTED:
            agent.commit("c1", store, soon())
    assert agent.phase is phase and not agent.accepting
    assert agent.resume("c1", soon()).phase is Phase.IDLE
    assert agent.phase is Phase.IDLE and agent.accepting
    assert code_of(lambda: agent.prepare("c1", soon())) == "stale_checkpoint"


def test_refusals_and_their_codes(agent: AgentParticipant, store: MemoryStore) -> None:
    assert code_of(lambda: agent.commit("c1", store, soon())) == "invalid_phase"  # never prepared
    agent.begin(ex("r1"))
    agent.prepare("c1", soon(0.02))  # not ready
    assert code_of(lambda: agent.commit("c1", store, soon())) == "invalid_phase"
    assert code_of(lambda: agent.prepare("c2", soon())) == "checkpoint_conflict"
    assert code_of(lambda: agent.commit("c2", store, soon())) == "checkpoint_conflict"
    assert code_of(lambda: agent.resume("c2", soon())) == "checkpoint_conflict"
    assert code_of(lambda: agent.restore("c2", "c0", store, soon())) == "checkpoint_conflict"
    assert code_of(lambda: agent.renew("c2", soon())) == "checkpoint_conflict"
    assert code_of(lambda: agent.retire([ex("r1")], soon())) == "invalid_phase"  # resume first
    assert code_of(lambda: agent.begin(ex("r2"))) == "admission_closed"
    assert code_of(lambda: agent.prepare("../x", soon())) == "invalid_id"
    assert agent.phase is Phase.PREPARING  # none of the refusals changed anything
    agent.resume("c1", soon())
    for op in (
        lambda: agent.prepare("c1", soon()),
        lambda: agent.commit("c1", store, soon()),
        lambda: agent.restore("c1", "c0", store, soon()),
        lambda: agent.renew("c1", soon()),
    ):
        assert code_of(op) == "stale_checkpoint"
    # restore needs a participant without live executions
    assert code_of(lambda: agent.restore("c3", "c0", store, soon())) == "invalid_phase"
    assert agent.phase is Phase.IDLE and agent.accepting


def test_prepare_on_a_restore_id_is_invalid_phase(store: MemoryStore) -> None:
    source = AgentParticipant("a1")
    at_boundary(source, ex("r1"))
    source.prepare("c1", soon())
    source.commit("c1", store, soon())
    fresh = AgentParticipant("a1")
    fresh.restore("r-1", "c1", store, soon())
    assert code_of(lambda: fresh.prepare("r-1", soon())) == "invalid_phase"
    assert code_of(lambda: fresh.commit("r-1", store, soon())) == "invalid_phase"
    assert code_of(lambda: fresh.restore("r-1", "other", store, soon())) == "checkpoint_conflict"


def test_expired_deadlines_change_nothing(agent: AgentParticipant, store: MemoryStore) -> None:
    at_boundary(agent, ex("r1"))
    assert code_of(lambda: agent.prepare("c1", past())) == "deadline_exceeded"
    assert agent.phase is Phase.IDLE and agent.accepting and agent.status().checkpoint_id is None
    agent.prepare("c1", soon())
    assert code_of(lambda: agent.commit("c1", store, past())) == "deadline_exceeded"
    assert agent.phase is Phase.PREPARED and store.list() == []
    assert code_of(lambda: agent.resume("c1", past())) == "deadline_exceeded"
    assert agent.phase is Phase.PREPARED
    agent.resume("c1", soon())
    assert code_of(lambda: agent.retire([ex("r1")], past())) == "deadline_exceeded"
    assert agent.status().live == 1
    fresh = AgentParticipant("a1")
    assert code_of(lambda: fresh.restore("r-1", "c1", store, past())) == "deadline_exceeded"
    assert fresh.phase is Phase.IDLE and fresh.accepting
    with pytest.raises(DeadlineExceededError):
        agent.prepare("c2", float("nan"))


# -- idempotency and lost acknowledgements -----------------------------------------------------


class CountingWriter(archive.ArchiveWriter):
    created = 0
    commits = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).created += 1
        super().__init__(*args, **kwargs)

    def commit(self, extra: Any = None) -> Any:
        type(self).commits += 1
        return super().commit(extra)


@pytest.fixture()
def counting_writer(monkeypatch: pytest.MonkeyPatch) -> type[CountingWriter]:
    CountingWriter.created = CountingWriter.commits = 0
    monkeypatch.setattr(archive, "ArchiveWriter", CountingWriter)
    return CountingWriter


def test_repeated_operations_give_the_same_answer_and_export_once(
    agent: AgentParticipant, store: MemoryStore, counting_writer: type[CountingWriter]
) -> None:
    at_boundary(agent, ex("r1"), ex("r2"))
    first = agent.prepare("c1", soon())
    assert agent.prepare("c1", soon()) == first
    reply = agent.commit("c1", store, soon())
    assert agent.commit("c1", store, soon()) == reply
    assert agent.commit("c1", store, soon(), scope=[ex("r1")]) == reply  # the same answer
    assert agent.prepare("c1", soon()) == first  # even after commit
    assert (counting_writer.created, counting_writer.commits) == (1, 1)
    assert [i.key for i in store.list() if i.key.endswith("manifest.json")] == [reply.manifest_key]
    assert agent.resume("c1", soon()).idempotent is False
    assert agent.resume("c1", soon()).idempotent is True

    fresh = AgentParticipant("a1")
    restored = fresh.restore("r-1", "c1", store, soon())
    assert fresh.restore("r-1", "c1", store, soon()) == restored
    assert fresh.status().live == 2


class LoseManifestAck(CountingStore):
    """Applies the manifest's create-only put, then drops the answer (once)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.dropped = 0

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        result = super().put_if_absent(key, data)
        if key.endswith("manifest.json") and not self.dropped:
            self.dropped += 1
            raise TransientStoreError("connection reset after the manifest was written")
        return result


def test_commit_retried_after_a_lost_acknowledgement_adopts_the_written_manifest(
    agent: AgentParticipant, store: MemoryStore
) -> None:
    flaky = LoseManifestAck(store)
    at_boundary(agent, ex("r1"))
    agent.prepare("c1", soon())
    with pytest.raises(TransientStoreError):
        agent.commit("c1", flaky, soon())
    assert agent.phase is Phase.PREPARED  # the participant does not know it was applied
    writes = flaky.requests["put_if_absent"]
    reply = agent.commit("c1", flaky, soon())
    assert flaky.requests["put_if_absent"] == writes  # adopted: no second manifest, no rewrite
    reader = ArchiveReader.open(store, reply.manifest_key.rsplit("/", 1)[0])
    assert reader.manifest_ref.sha256 == reply.manifest_sha256
    assert reader.manifest.extra["executions"] == [["r1", 0]]


def test_a_different_manifest_at_the_key_is_a_conflict(agent: AgentParticipant, store: MemoryStore) -> None:
    other = AgentParticipant("a1")
    at_boundary(other, ex("r9"))
    other.prepare("c1", soon())
    other.commit("c1", store, soon())
    at_boundary(agent, ex("r1"))
    agent.prepare("c1", soon())
    assert code_of(lambda: agent.commit("c1", store, soon())) == "manifest_conflict"


# -- commit content ------------------------------------------------------------------------------


def test_commit_extra_holds_capabilities_tombstones_executions_and_effects(
    agent: AgentParticipant, store: MemoryStore
) -> None:
    at_boundary(agent, ex("r1"), ex("r2"), ex("r3"))
    agent.retire([ex("old", 4)], soon())
    effect = agent.declare_unsafe_effect(ex("r2"), "sent an e-mail to a real user")
    agent.prepare("c1", soon())
    reply = agent.commit("c1", store, soon(), scope=[ex("r1"), ex("r2"), ex("not-here")])
    assert reply.executions == (ex("r1"), ex("r2"))
    assert reply.unsafe_effects == (effect,)
    extra = ArchiveReader.open(store, reply.manifest_key.rsplit("/", 1)[0]).manifest.extra
    assert extra["capabilities"] == agent.capabilities().model_dump(mode="json")
    assert extra["tombstones"] == {"old": 4}
    assert extra["executions"] == [["r1", 0], ["r2", 0]]
    assert extra["restarts"] == []
    assert extra["unsafe_effects"] == [effect.model_dump(mode="json")]


def test_forget_drops_tombstones_and_effects(agent: AgentParticipant) -> None:
    agent.begin(ex("r1"))
    agent.declare_unsafe_effect(ex("r1"), "charged a card")
    agent.retire([ex("r1")], soon())
    assert agent.status().tombstones == 1
    assert code_of(lambda: agent.declare_unsafe_effect(ex("r1"), "x")) == "stale_attempt"
    agent.forget(["r1"])
    assert agent.status().tombstones == 0 and agent._effects == {}
    agent.begin(ex("r1"))  # a forgotten rollout id may be used again


# -- admission, readiness, leases --------------------------------------------------------------


def test_prepare_not_ready_by_its_deadline_keeps_admission_closed_until_resume(
    agent: AgentParticipant,
) -> None:
    agent.begin(ex("r1"))
    report = agent.prepare("c1", soon(0.05))
    assert not report.ready and report.blockers == ("r1#0",)
    assert agent.events["prepare_not_ready"] == 1
    assert not agent.accepting
    with pytest.raises(AdmissionClosedError):
        agent.begin(ex("r2"))
    agent.resume("c1", soon())
    agent.begin(ex("r2"))


def test_blockers_are_capped_but_counted(agent: AgentParticipant) -> None:
    for i in range(BLOCKERS_REPORTED + 50):
        agent.begin(ex(f"r{i:03d}"))
    report = agent.prepare("c1", soon(0.02))
    assert len(report.blockers) == BLOCKERS_REPORTED
    assert report.blocker_count == BLOCKERS_REPORTED + 50
    assert report.counts["running"] == BLOCKERS_REPORTED + 50


def test_commit_rechecks_readiness() -> None:
    toy = Toy()
    assert toy.prepare("c1", soon()).ready
    toy.set_blocked(True)
    assert code_of(lambda: toy.commit("c1", MemoryStore("unused"), soon())) == "invalid_phase"
    assert toy.phase is Phase.PREPARING and not toy.accepting
    toy.set_blocked(False)
    assert toy.prepare("c1", soon()).ready


def test_a_late_prepare_cannot_close_admission_again(agent: AgentParticipant) -> None:
    assert agent.resume("c1", soon()).idempotent  # never prepared here: still fences the id
    assert code_of(lambda: agent.prepare("c1", soon())) == "stale_checkpoint"
    assert agent.accepting


def test_the_resumed_id_set_is_bounded() -> None:
    toy = Toy()
    for i in range(RESUMED_IDS_KEPT + 5):
        toy.resume(f"c{i}", soon())
    assert len(toy._resumed) == RESUMED_IDS_KEPT
    assert code_of(lambda: toy.prepare(f"c{RESUMED_IDS_KEPT + 4}", soon())) == "stale_checkpoint"
    assert toy.prepare("c0", soon()).ready  # forgotten: documented limit


def test_lease_expiry_reopens_admission_by_itself() -> None:
    toy = Toy(lease_grace_seconds=0.2)
    toy.set_blocked(True)
    assert not toy.prepare("c1", soon(0.05)).ready
    assert not toy.accepting
    # Nobody calls in: the lease timer thread must reopen (wait_open only waits on the condition).
    with toy._cond:
        reopened = toy._cond.wait_for(lambda: toy._accepting, timeout=30)
    assert reopened
    assert toy.events["lease_expired"] == 1
    assert toy.status().phase is Phase.IDLE
    assert code_of(lambda: toy.prepare("c1", soon())) == "stale_checkpoint"


def test_lease_expiry_is_also_checked_lazily_on_every_call() -> None:
    offset = [0.0]
    toy = Toy(lease_grace_seconds=60, clock=lambda: time.time() + offset[0])
    toy.set_blocked(True)
    toy.prepare("c1", soon(0.05) + offset[0])
    toy.close()  # no timer: only the lazy check remains
    offset[0] = 3600.0
    assert toy.status().phase is Phase.IDLE and toy.status().accepting
    assert toy.events["lease_expired"] == 1


def test_renew_extends_the_lease() -> None:
    offset = [0.0]
    toy = Toy(lease_grace_seconds=10, clock=lambda: time.time() + offset[0])
    toy.set_blocked(True)
    toy.prepare("c1", time.time() + 0.05)
    toy.renew("c1", time.time() + 100)
    offset[0] = 50.0  # past the first lease, inside the renewed one
    assert toy.phase is Phase.PREPARING
    offset[0] = 200.0
    assert toy.phase is Phase.IDLE


def test_a_prepare_whose_checkpoint_ends_while_it_waits_answers_idle(agent: AgentParticipant) -> None:
    agent.begin(ex("r1"))
    answers: list[Any] = []
    waiter = threading.Thread(target=lambda: answers.append(agent.prepare("c1", soon(60))))
    waiter.start()
    with agent._cond:
        assert agent._cond.wait_for(lambda: agent._active == "c1", timeout=30)
    agent.resume("c1", soon())
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert answers[0].phase is Phase.IDLE and not answers[0].ready
    assert agent.accepting


def test_prepare_waits_while_worker_threads_reach_boundaries(
    agent: AgentParticipant, store: MemoryStore
) -> None:
    """Workers run turns concurrently; prepare waits (no busy loop) until all are parked."""
    workers = 8
    turns = 6
    started = threading.Barrier(workers + 1)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        execution = ex(f"w{i}")
        try:
            agent.begin(execution)
            started.wait()
            for turn in range(turns):
                if turn:
                    agent.start_turn(execution, wait=60)  # parks while a checkpoint holds admission
                time.sleep(0.001)  # the turn's "work"
                agent.boundary(execution, boundary(execution, turn))
            agent.finish(execution)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    started.wait()
    report = agent.prepare("c1", soon(60))
    assert report.ready
    reply = agent.commit("c1", store, soon())
    # Every worker not yet finished is parked at a boundary and exported; none is running.
    assert report.counts["running"] == 0
    assert len(reply.executions) == report.counts["runs"] == report.counts["at_boundary"]
    agent.resume("c1", soon())
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert agent.status().live == 0


# -- identity, retire ----------------------------------------------------------------------------


def test_two_live_attempts_of_one_rollout_conflict(agent: AgentParticipant) -> None:
    agent.begin(ex("r1", 0))
    with pytest.raises(IdentityConflictError) as info:
        agent.begin(ex("r1", 1))
    assert info.value.code == "identity_conflict"
    with pytest.raises(IdentityConflictError):
        agent.begin(ex("r1", 0))  # the same attempt dispatched twice
    with pytest.raises(IdentityConflictError):
        agent.boundary(ex("r1", 0), boundary(ex("r1", 1)))  # record of another attempt
    with pytest.raises(UnknownExecutionError):
        agent.boundary(ex("nobody"), boundary(ex("nobody")))


def test_retire_tombstones_and_drops_state(agent: AgentParticipant) -> None:
    at_boundary(agent, ex("r1", 2))
    agent.retire([ex("r1", 2)], soon())
    assert agent.status().live == 0
    for op in (
        lambda: agent.begin(ex("r1", 2)),
        lambda: agent.begin(ex("r1", 1)),
        lambda: agent.boundary(ex("r1", 2), boundary(ex("r1", 2), 1)),
        lambda: agent.finish(ex("r1", 2)),
    ):
        assert code_of(op) == "stale_attempt"
    agent.retire([ex("r1", 2)], soon())  # a retried retire (lost answer) is a no-op
    with pytest.raises(StaleAttemptError):
        agent.retire([ex("r1", 1), ex("r9", 0)], soon())  # below the tombstone: nothing changes
    assert "r9" not in agent.fence
    agent.begin(ex("r1", 3))


def test_invalid_ids_are_refused(agent: AgentParticipant, store: MemoryStore) -> None:
    with pytest.raises(InvalidIdentifierError):
        agent.resume("", soon())
    with pytest.raises(InvalidIdentifierError):
        agent.restore("ok", "a/b", store, soon())
    with pytest.raises(InvalidIdentifierError):
        agent.forget([".."])
    with pytest.raises(InvalidPhaseError):
        agent.commit("c1", store, soon())


def test_new_work_waits_a_bounded_time_for_admission(agent: AgentParticipant) -> None:
    """``wait`` bounds how long new work parks behind a checkpoint; it never blocks forever, and
    parked work is admitted as soon as the checkpoint resumes."""
    at_boundary(agent, ex("r1"))
    agent.prepare("c1", soon())
    with pytest.raises(AdmissionClosedError) as info:
        agent.begin(ex("r2"), wait=0.05)
    assert info.value.code == "admission_closed" and info.value.details["checkpoint_id"] == "c1"
    assert code_of(lambda: agent.start_turn(ex("r1"), wait=0.05)) == "admission_closed"
    assert agent.status().live == 1  # the refused begin registered nothing
    admitted: list[object] = []
    parked = threading.Thread(target=lambda: admitted.append(agent.begin(ex("r2"), wait=60)))
    parked.start()
    agent.resume("c1", soon())
    parked.join(timeout=60)
    assert not parked.is_alive() and admitted == [None]
    assert agent.status().live == 2
