"""Reference participants: agent, resources/environment (exported, stateless, restart-only) and
policy model; restore round trips, all-or-nothing restore, fencing after restore, concurrency."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from rollout_checkpoint.archive import ArchiveWriter
from rollout_checkpoint.errors import (
    AdmissionClosedError,
    CheckpointError,
    IdentityConflictError,
    IntegrityError,
    InvalidRecordError,
    StaleAttemptError,
)
from rollout_checkpoint.format import ArchiveReader, layout
from rollout_checkpoint.format.chunks import component_records
from rollout_checkpoint.format.records import (
    AgentBoundaryRecord,
    ModelCallLineageRecord,
    Record,
    ResourceSnapshotRecord,
    TokenStoreReceipt,
)
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import (
    AgentParticipant,
    JsonCodec,
    PolicyModelParticipant,
    ResourcesParticipant,
)
from rollout_checkpoint.protocol import Participant, Phase
from rollout_checkpoint.store import MemoryStore, ObjectStore
from rollout_checkpoint.tokens import InMemoryLineageStore, ObjectStoreTokenStore, load_snapshot


def ex(rollout: str, attempt: int = 0) -> ExecutionId:
    return ExecutionId(rollout_id=rollout, attempt=attempt)


def soon(seconds: float = 10.0) -> float:
    return time.time() + seconds


def code_of(fn: Any) -> str:
    with pytest.raises(CheckpointError) as info:
        fn()
    return str(info.value.code)


def checkpoint(participant: Participant, store: ObjectStore, checkpoint_id: str) -> Any:
    assert participant.prepare(checkpoint_id, soon()).ready
    reply = participant.commit(checkpoint_id, store, soon())
    participant.resume(checkpoint_id, soon())
    return reply


def restore(participant: Participant, store: ObjectStore, source: str, restore_id: str = "restore-1") -> Any:
    reply = participant.restore(restore_id, source, store, soon())
    participant.resume(restore_id, soon())
    return reply


def records_of(store: ObjectStore, reply: Any) -> list[Record]:
    return component_records(ArchiveReader.open(store, reply.manifest_key.rsplit("/", 1)[0]))


@pytest.fixture()
def store() -> MemoryStore:
    return MemoryStore(f"t-{time.time_ns()}")


def boundary(execution: ExecutionId, index: int, **fields: Any) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=execution.rollout_id,
        attempt=execution.attempt,
        boundary_index=index,
        turn_index=index,
        **fields,
    )


# -- agent ----------------------------------------------------------------------------------------


def test_agent_exports_latest_boundaries_of_live_runs_only(store: MemoryStore) -> None:
    agent = AgentParticipant("a1")
    for name in ("parked", "done"):
        agent.begin(ex(name))
        agent.boundary(ex(name), boundary(ex(name), 0))
        agent.start_turn(ex(name))
        agent.boundary(ex(name), boundary(ex(name), 1, output_items=["turn 1"]))
    agent.finish(ex("done"))  # terminal: omitted from the resumable set
    with pytest.raises(InvalidRecordError):
        agent.boundary(ex("parked"), boundary(ex("parked"), 1))  # must advance
    reply = checkpoint(agent, store, "c1")
    assert reply.executions == (ex("parked"),)
    assert records_of(store, reply) == [boundary(ex("parked"), 1, output_items=["turn 1"])]


def test_agent_restore_hands_the_boundary_to_the_next_attempt_and_fences_the_old(store: MemoryStore) -> None:
    agent = AgentParticipant("a1")
    agent.begin(ex("r1"))
    agent.boundary(ex("r1"), boundary(ex("r1"), 3, last_model_call_id="call-3", agent_state=b"\x00opaque"))
    checkpoint(agent, store, "c1")

    fresh = AgentParticipant("a1")
    restore(fresh, store, "c1")
    restored = fresh.begin(ex("r1", 1))
    assert restored == boundary(ex("r1", 1), 3, last_model_call_id="call-3", agent_state=b"\x00opaque")
    # The dead attempt is refused everywhere.
    assert code_of(lambda: fresh.begin(ex("r1", 0))) == "stale_attempt"
    assert code_of(lambda: fresh.boundary(ex("r1", 0), boundary(ex("r1", 0), 4))) == "stale_attempt"
    assert code_of(lambda: fresh.finish(ex("r1", 0))) == "stale_attempt"
    assert code_of(lambda: fresh.declare_unsafe_effect(ex("r1", 0), "late")) == "stale_attempt"
    assert code_of(lambda: fresh.begin(ex("r1", 2))) == "identity_conflict"
    fresh.start_turn(ex("r1", 1))
    fresh.boundary(ex("r1", 1), boundary(ex("r1", 1), 4))


def test_tombstones_survive_commit_and_restore_into_fresh_participants(store: MemoryStore) -> None:
    first = AgentParticipant("a1")
    first.begin(ex("gone", 0))
    first.retire([ex("gone", 0)], soon())  # retired before the checkpoint
    first.begin(ex("r1"))
    first.boundary(ex("r1"), boundary(ex("r1"), 0))
    checkpoint(first, store, "c1")

    second = AgentParticipant("a1")
    restore(second, store, "c1", "restore-1")
    assert second.fence.snapshot() == {"gone": 0, "r1": 0}
    second.begin(ex("r1", 1))
    reply = checkpoint(second, store, "c2")  # the restored run is exported again, under attempt 1
    assert reply.executions == (ex("r1", 1),)

    third = AgentParticipant("a1")
    restore(third, store, "c2", "restore-2")
    assert third.fence.snapshot() == {"gone": 0, "r1": 1}
    for stale in (ex("gone", 0), ex("r1", 0), ex("r1", 1)):
        assert code_of(lambda stale=stale: third.begin(stale)) == "stale_attempt"
    assert third.begin(ex("r1", 2)) == boundary(ex("r1", 2), 0)
    third.begin(ex("gone", 1))  # a fresh dispatch of the retired rollout is fine


def test_restore_scope_limits_what_is_installed(store: MemoryStore) -> None:
    agent = AgentParticipant("a1")
    for name in ("a", "b"):
        agent.begin(ex(name))
        agent.boundary(ex(name), boundary(ex(name), 0))
    checkpoint(agent, store, "c1")
    fresh = AgentParticipant("a1")
    reply = fresh.restore("r-1", "c1", store, soon(), scope=[ex("b")])
    assert reply.restored == (ex("b", 1),)
    fresh.resume("r-1", soon())
    fresh.begin(ex("a", 0))  # not restored, not fenced


# -- restore is all-or-nothing ------------------------------------------------------------------------


def write_component(
    store: ObjectStore, checkpoint_id: str, participant: Participant, records: Sequence[Record], **extra: Any
) -> None:
    writer = ArchiveWriter(
        store,
        layout.component_prefix(checkpoint_id, participant.kind, participant.instance),
        checkpoint_id=checkpoint_id,
        participant_kind=participant.kind,
        instance=participant.instance,
    )
    for record in records:
        writer.write(record)
    executions = sorted({(r.rollout_id, r.attempt) for r in records})
    writer.commit(
        extra={
            "capabilities": participant.capabilities().model_dump(mode="json"),
            "tombstones": {},
            "executions": [list(e) for e in executions],
            "restarts": [],
            "unsafe_effects": [],
            **extra,
        }
    )


def snapshot(
    execution: ExecutionId, session: str, state: bytes, codec: str = "json"
) -> ResourceSnapshotRecord:
    return ResourceSnapshotRecord(
        rollout_id=execution.rollout_id,
        attempt=execution.attempt,
        session_id=session,
        revision=2,
        codec=codec,
        state=state,
    )


def assert_untouched(participant: Participant) -> None:
    status = participant.status()
    assert (status.phase, status.accepting, status.live, status.tombstones) == (Phase.IDLE, True, 0, 0)


@pytest.mark.parametrize(
    ("bad", "extra"),
    [
        (snapshot(ex("r3"), "s", b"{not json"), {}),
        (snapshot(ex("r3"), "s", b"{}", codec="msgpack"), {}),
        (AgentBoundaryRecord(rollout_id="r3", attempt=0, boundary_index=0, turn_index=0), {}),
        (snapshot(ex("r3"), "s", b"{}"), {"executions": [["r1", 0], ["r2", 0]]}),  # not listed
        (snapshot(ex("r3"), "s", b"{}"), {"tombstones": {"r3": 0}}),  # committed yet tombstoned
        (snapshot(ex("r1", 1), "t", b"{}"), {}),  # two attempts of r1 in one checkpoint
    ],
    ids=["undecodable", "codec", "kind", "unlisted", "tombstoned", "two-attempts"],
)
def test_an_invalid_record_anywhere_installs_nothing(
    store: MemoryStore, bad: Record, extra: dict[str, Any]
) -> None:
    resources = ResourcesParticipant("env", mode="exported")
    good = [snapshot(ex("r1"), "s", b'{"n": 1}'), snapshot(ex("r2"), "s", b'{"n": 2}')]
    write_component(store, "bad", resources, [*good, bad], **extra)
    with pytest.raises((InvalidRecordError, IdentityConflictError)):
        resources.restore("restore-1", "bad", store, soon())
    assert_untouched(resources)
    # Still usable: the same restore id may be retried against a good checkpoint.
    write_component(store, "good", resources, good)
    assert resources.restore("restore-1", "good", store, soon()).restored == (ex("r1", 1), ex("r2", 1))


def test_a_corrupt_shard_installs_nothing(store: MemoryStore) -> None:
    agent = AgentParticipant("a1")
    agent.begin(ex("r1"))
    agent.boundary(ex("r1"), boundary(ex("r1"), 0))
    reply = checkpoint(agent, store, "c1")
    prefix = reply.manifest_key.rsplit("/", 1)[0]
    [shard] = [i.key for i in store.list(f"{prefix}/shards/")]
    data = bytearray(store.get(shard))
    data[len(data) // 2] ^= 0xFF
    store.put(shard, bytes(data))
    fresh = AgentParticipant("a1")
    with pytest.raises(IntegrityError):
        fresh.restore("r-1", "c1", store, soon())
    assert_untouched(fresh)


def test_restore_of_a_missing_component_reopens(store: MemoryStore) -> None:
    fresh = AgentParticipant("a1")
    with pytest.raises(CheckpointError):
        fresh.restore("r-1", "never-written", store, soon())
    assert_untouched(fresh)


# -- resources ------------------------------------------------------------------------------------


def test_resources_mutations_bump_revisions_only_on_success() -> None:
    res = ResourcesParticipant("env", mode="exported")
    assert res.open_session(ex("r1"), "s1", {"count": 0}) == 0
    assert res.mutate(ex("r1"), "s1", lambda s: {"count": s["count"] + 1}) == 1

    def boom(state: Any) -> Any:
        raise RuntimeError("tool failed")

    with pytest.raises(RuntimeError):
        res.mutate(ex("r1"), "s1", boom)
    assert res.state(ex("r1"), "s1") == ({"count": 1}, 1)
    assert code_of(lambda: res.open_session(ex("r1"), "s1", {})) == "identity_conflict"
    assert code_of(lambda: res.open_session(ex("r1", 1), "s2", {})) == "identity_conflict"
    assert code_of(lambda: res.mutate(ex("r1"), "nope", lambda s: s)) == "unknown_execution"


def test_in_flight_mutation_blocks_prepare_and_terminal_sessions_are_not_exported(store: MemoryStore) -> None:
    res = ResourcesParticipant("env", mode="exported")
    res.open_session(ex("r1"), "s1", {"n": 0})
    res.open_session(ex("r2"), "s1", {"n": 0})
    entered, release = threading.Event(), threading.Event()

    def slow(state: Any) -> Any:
        entered.set()
        assert release.wait(30)
        return {"n": state["n"] + 1}

    worker = threading.Thread(target=lambda: res.mutate(ex("r1"), "s1", slow))
    worker.start()
    assert entered.wait(30)
    report = res.prepare("c1", soon(0.05))
    assert not report.ready and report.blockers == ("r1#0/s1",)
    assert code_of(lambda: res.mutate(ex("r2"), "s1", lambda s: s, wait=0)) == "admission_closed"
    release.set()
    worker.join(30)
    res.end_session(ex("r1"), "s1")  # terminal during prepare: allowed while closed
    assert res.prepare("c1", soon()).ready
    reply = res.commit("c1", store, soon())
    assert reply.executions == (ex("r2"),)
    [record] = records_of(store, reply)
    assert isinstance(record, ResourceSnapshotRecord)
    assert (record.session_id, record.revision, record.codec) == ("s1", 0, "json")


def test_resources_restore_keeps_state_and_revision_under_the_next_attempt(store: MemoryStore) -> None:
    res = ResourcesParticipant("env", kind="environment", mode="exported", codec=JsonCodec())
    res.open_session(ex("r1"), "board", {"cells": [1, 2]})
    res.mutate(ex("r1"), "board", lambda s: {"cells": [*s["cells"], 3]})
    checkpoint(res, store, "c1")
    res.retire([ex("r1")], soon())

    fresh = ResourcesParticipant("env", kind="environment", mode="exported")
    restore(fresh, store, "c1")
    assert fresh.state(ex("r1", 1), "board") == ({"cells": [1, 2, 3]}, 1)
    assert fresh.mutate(ex("r1", 1), "board", lambda s: {"cells": []}) == 2
    assert code_of(lambda: fresh.mutate(ex("r1", 0), "board", lambda s: s)) == "stale_attempt"
    assert code_of(lambda: fresh.open_session(ex("r1", 0), "x", {})) == "stale_attempt"


def test_restart_only_never_blocks_and_reports_restarts(store: MemoryStore) -> None:
    res = ResourcesParticipant("sandbox")  # default: restart_only, fail closed
    assert res.mode == "restart_only"
    res.open_session(ex("r1"), "s1", object())  # state need not be serializable
    entered, release = threading.Event(), threading.Event()
    worker = threading.Thread(
        target=lambda: res.mutate(ex("r1"), "s1", lambda s: (entered.set(), release.wait(30), s)[2])
    )
    worker.start()
    assert entered.wait(30)
    report = res.prepare("c1", soon())
    assert report.ready and report.restarts == (ex("r1"),)
    reply = res.commit("c1", store, soon())
    release.set()
    worker.join(30)
    assert reply.restarts == (ex("r1"),) and reply.executions == ()
    assert records_of(store, reply) == []
    extra = ArchiveReader.open(store, reply.manifest_key.rsplit("/", 1)[0]).manifest.extra
    assert extra["restarts"] == [["r1", 0]]
    capabilities = extra["capabilities"]
    assert isinstance(capabilities, dict) and capabilities["mode"] == "restart_only"
    res.resume("c1", soon())

    fresh = ResourcesParticipant("sandbox")
    assert restore(fresh, store, "c1").restored == ()
    assert code_of(lambda: fresh.open_session(ex("r1", 0), "s1", {})) == "stale_attempt"
    fresh.open_session(ex("r1", 1), "s1", {})  # the fresh dispatch


def test_stateless_exports_nothing_and_never_blocks(store: MemoryStore) -> None:
    res = ResourcesParticipant("verifier", mode="stateless")
    res.open_session(ex("r1"), "s1", {})
    entered, release = threading.Event(), threading.Event()
    worker = threading.Thread(
        target=lambda: res.mutate(ex("r1"), "s1", lambda s: (entered.set(), release.wait(30), s)[2])
    )
    worker.start()
    assert entered.wait(30)
    report = res.prepare("c1", soon())
    reply = res.commit("c1", store, soon())
    release.set()
    worker.join(30)
    assert report.ready and report.restarts == ()
    assert (reply.executions, reply.restarts, records_of(store, reply)) == ((), (), [])


def test_worker_threads_mutate_while_prepare_waits(store: MemoryStore) -> None:
    res = ResourcesParticipant("env", mode="exported")
    sessions = [ex(f"r{i}") for i in range(6)]
    for execution in sessions:
        res.open_session(execution, "s", {"n": 0})
    stop = threading.Event()
    applied = {e: 0 for e in sessions}
    errors: list[BaseException] = []

    def work(execution: ExecutionId) -> None:
        while not stop.is_set():
            try:
                res.mutate(execution, "s", lambda s: {"n": s["n"] + 1}, wait=30)
                applied[execution] += 1
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=work, args=(e,)) for e in sessions]
    for t in threads:
        t.start()
    assert res.prepare("c1", soon(60)).ready
    reply = res.commit("c1", store, soon())
    exported = {r.rollout_id: r for r in records_of(store, reply) if isinstance(r, ResourceSnapshotRecord)}
    res.resume("c1", soon())
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors
    for execution in sessions:
        record = exported[execution.rollout_id]
        # The exported state is consistent with its revision: n counts the applied mutations.
        assert JsonCodec().decode(record.state) == {"n": record.revision}
        assert res.state(execution, "s") == ({"n": applied[execution]}, applied[execution])


# -- policy model -------------------------------------------------------------------------------


def stage(call: Any, n: int = 2) -> ModelCallLineageRecord:
    record: ModelCallLineageRecord = call.stage(
        prompt_token_ids=[1, 2],
        generation_token_ids=list(range(n)),
        generation_log_probs=[-0.5] * n,
    )
    return record


def test_model_lineage_receipts_and_token_snapshot_agree(store: MemoryStore) -> None:
    tokens = ObjectStoreTokenStore(store)
    lineage = InMemoryLineageStore()
    model = PolicyModelParticipant(tokens, "policy", lineage_store=lineage)
    for i in range(3):
        with model.call(ex("r1"), f"c{i}", policy_version="v7") as call:
            stage(call)
    with model.call(ex("r2"), "c0", policy_version="v7"):
        pass  # cut before staging: leaves no trace
    assert [(c.call_id, c.parent_call_id) for c in model.lineage(ex("r1"))] == [
        ("c0", None),
        ("c1", "c0"),
        ("c2", "c1"),
    ]
    assert lineage.lineage(ex("r1")) == model.lineage(ex("r1"))
    reply = checkpoint(model, store, "c1")
    assert reply.executions == (ex("r1"),)
    snap = tokens.snapshot("c1")  # the coordinator's step after the commits
    listed = load_snapshot(store, snap)
    receipts = [r for r in records_of(store, reply) if isinstance(r, TokenStoreReceipt)]
    assert len(receipts) == 3
    for receipt in receipts:
        assert receipt.snapshot_id == snap.snapshot_id and receipt.store == snap.store
        assert (listed[receipt.key].digest, listed[receipt.key].length) == (receipt.digest, receipt.length)
    extra = ArchiveReader.open(store, reply.manifest_key.rsplit("/", 1)[0]).manifest.extra
    assert extra["token_store"] == tokens.name
    manifest_bytes = store.get(reply.manifest_key)
    assert b"generation_token_ids" not in manifest_bytes


def test_in_flight_model_call_blocks_prepare_until_staged(store: MemoryStore) -> None:
    model = PolicyModelParticipant(ObjectStoreTokenStore(store))
    call = model.admit(ex("r1"), "c0", policy_version="v1")
    report = model.prepare("c1", soon(0.05))
    assert not report.ready and report.blockers == ("r1#0/c0",)
    with pytest.raises(AdmissionClosedError):
        model.admit(ex("r2"), "c0", policy_version="v1")
    done: list[Any] = []
    waiter = threading.Thread(target=lambda: done.append(model.prepare("c1", soon(60))))
    waiter.start()
    stage(call)  # durable staging wakes the waiting prepare
    waiter.join(30)
    assert done[0].ready
    call.close()
    assert model.commit("c1", store, soon()).executions == (ex("r1"),)


def test_model_restore_continues_the_parent_chain_and_fences_the_dead_attempt(store: MemoryStore) -> None:
    tokens = ObjectStoreTokenStore(store)
    model = PolicyModelParticipant(tokens)
    for i in range(2):
        with model.call(ex("r1"), f"c{i}", policy_version="v1") as call:
            stage(call)
    checkpoint(model, store, "c1")

    fresh = PolicyModelParticipant(tokens)
    fresh.restore("restore-1", "c1", store, soon())
    assert fresh.status().phase is Phase.RESTORED  # paused after restore
    assert code_of(lambda: fresh.admit(ex("r1", 1), "c2", policy_version="v1")) == "admission_closed"
    fresh.resume("restore-1", soon())
    assert code_of(lambda: fresh.admit(ex("r1", 0), "late", policy_version="v1")) == "stale_attempt"
    with fresh.call(ex("r1", 1), "c2", policy_version="v2") as call:
        record = stage(call)
    assert (record.attempt, record.parent_call_id) == (1, "c1")
    chain = fresh.lineage(ex("r1", 1))
    assert [(c.call_id, c.parent_call_id, c.attempt) for c in chain] == [
        ("c0", None, 1),
        ("c1", "c0", 1),
        ("c2", "c1", 1),
    ]
    reply = checkpoint(fresh, store, "c2")
    assert reply.executions == (ex("r1", 1),)


def test_model_call_retired_while_staging_never_joins_the_lineage(store: MemoryStore) -> None:
    class SlowSink(ObjectStoreTokenStore):
        def __init__(self, inner: ObjectStore) -> None:
            super().__init__(inner)
            self.entered, self.release = threading.Event(), threading.Event()

        def put(self, entry: Any) -> Any:
            self.entered.set()
            assert self.release.wait(30)
            return super().put(entry)

    sink = SlowSink(store)
    model = PolicyModelParticipant(sink)
    call = model.admit(ex("r1"), "c0", policy_version="v1")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            stage(call)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    assert sink.entered.wait(30)
    model.retire([ex("r1")], soon())
    sink.release.set()
    worker.join(30)
    assert len(errors) == 1 and isinstance(errors[0], StaleAttemptError)
    assert model.lineage(ex("r1")) == [] and model.status().live == 0


@pytest.mark.parametrize("defect", ["missing-parent", "branch", "no-receipt", "stray-receipt"])
def test_model_restore_refuses_broken_lineage(store: MemoryStore, defect: str) -> None:
    model = PolicyModelParticipant(ObjectStoreTokenStore(store))

    def lineage(call: str, parent: str | None, rollout: str = "r1") -> ModelCallLineageRecord:
        return ModelCallLineageRecord(
            rollout_id=rollout,
            attempt=0,
            call_id=call,
            parent_call_id=parent,
            policy_version="v1",
            token_key=f"{rollout}/a0/{call}",
        )

    def receipt(call: str, rollout: str = "r1") -> TokenStoreReceipt:
        return TokenStoreReceipt(
            rollout_id=rollout,
            attempt=0,
            store="s",
            snapshot_id="bad",
            key=f"{rollout}/a0/{call}",
            digest="0" * 64,
            length=1,
        )

    good = [lineage("g0", None, "ok"), receipt("g0", "ok")]
    broken: list[Record] = {
        "missing-parent": [lineage("c1", "c0"), receipt("c1")],
        "branch": [lineage("c0", None), lineage("c1", "c0"), lineage("c2", "c0")]
        + [receipt(c) for c in ("c0", "c1", "c2")],
        "no-receipt": [lineage("c0", None)],
        "stray-receipt": [lineage("c0", None), receipt("c0"), receipt("zz")],
    }[defect]
    write_component(store, "bad", model, [*good, *broken])
    with pytest.raises(InvalidRecordError):
        model.restore("restore-1", "bad", store, soon())
    assert_untouched(model)


def test_unsafe_effect_declared_by_a_participant_reaches_the_manifest(store: MemoryStore) -> None:
    res = ResourcesParticipant("mailer", mode="exported")
    res.open_session(ex("r1"), "s", {})
    res.declare_unsafe_effect(ex("r1"), "POST https://payments.example/charge")
    reply = checkpoint(res, store, "c1")
    assert [(e.rollout_id, e.description) for e in reply.unsafe_effects] == [
        ("r1", "POST https://payments.example/charge")
    ]
    extra = ArchiveReader.open(store, reply.manifest_key.rsplit("/", 1)[0]).manifest.extra
    assert extra["unsafe_effects"] == [
        {"rollout_id": "r1", "attempt": 0, "description": "POST https://payments.example/charge"}
    ]


def test_runs_ending_during_a_waiting_prepare_and_a_failed_verification(store: MemoryStore) -> None:
    """While prepare waits: one rollout's verification passes (terminal: agent finishes, session
    ends) and unblocks it; another's verification fails (its session is kept). Only the second is
    exported, and it restores with its state so the verification can be retried."""
    agent = AgentParticipant("a1")
    env = ResourcesParticipant("env", mode="exported")
    passed, failed = ex("passed"), ex("failed")
    for execution in (passed, failed):
        agent.begin(execution)
        env.open_session(execution, "s", {"answer": None})
    env.mutate(failed, "s", lambda s: {"answer": "wrong"})
    agent.boundary(failed, boundary(failed, 0))  # failed waits at a boundary to retry verification
    # `passed` is still in its last turn: it blocks the agent's prepare
    assert env.prepare("c1", soon()).ready
    answers: list[Any] = []
    waiter = threading.Thread(target=lambda: answers.append(agent.prepare("c1", soon(60))))
    waiter.start()
    with agent._cond:
        assert agent._cond.wait_for(lambda: agent._active == "c1", timeout=30)
    # verification while admission is closed: reading state and ending sessions are allowed
    assert env.state(failed, "s") == ({"answer": "wrong"}, 1)  # judged wrong: kept for a retry
    assert env.state(passed, "s")[1] == 0
    env.end_session(passed, "s")  # judged right: terminal
    agent.finish(passed)  # terminal: no longer blocks
    waiter.join(timeout=30)
    assert not waiter.is_alive() and answers[0].ready and answers[0].counts["runs"] == 1
    agent_reply = agent.commit("c1", store, soon())
    env_reply = env.commit("c1", store, soon())
    assert agent_reply.executions == env_reply.executions == (failed,)
    [snap] = records_of(store, env_reply)
    assert isinstance(snap, ResourceSnapshotRecord) and (snap.rollout_id, snap.revision) == ("failed", 1)
    for participant in (agent, env):
        participant.resume("c1", soon())
        participant.close()

    fresh_agent, fresh_env = AgentParticipant("a1"), ResourcesParticipant("env", mode="exported")
    restore(fresh_agent, store, "c1")
    restore(fresh_env, store, "c1")
    assert fresh_agent.begin(ex("failed", 1)) == boundary(ex("failed", 1), 0)
    assert fresh_env.state(ex("failed", 1), "s") == ({"answer": "wrong"}, 1)
    assert code_of(lambda: fresh_env.state(ex("passed", 1), "s")) == "unknown_execution"
    assert code_of(lambda: fresh_env.mutate(failed, "s", lambda s: s)) == "stale_attempt"
