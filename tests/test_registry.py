"""The live-execution registry: attempts, states, fencing, freezing, persistence."""

from __future__ import annotations

import threading

import pytest

from rollout_checkpoint.errors import (
    AdmissionClosedError,
    IdentityConflictError,
    InvalidPhaseError,
    StaleAttemptError,
)
from rollout_checkpoint.format import ArchiveReader, layout
from rollout_checkpoint.format.records import CompletedResultRecord, DispatchRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.registry import LiveExecutionRegistry, RegistryEntry
from rollout_checkpoint.store import ObjectStore


def test_lifecycle_and_results() -> None:
    reg = LiveExecutionRegistry()
    e = reg.dispatch("r1", input_digest="d1")
    assert e == ExecutionId(rollout_id="r1", attempt=0)
    assert reg.get("r1").state == "queued"
    reg.start(e)
    reg.finish(e)
    result = reg.hand_off(e, {"text": "ok"}, reward=0.5)
    assert result.acknowledged and reg.get("r1").state == "handed_off"
    assert reg.pending_results() == [result]
    assert reg.consume(e) == result
    assert reg.get("r1").state == "consumed" and reg.pending_results() == []
    assert reg.counts() == {"consumed": 1}


def test_illegal_transitions_are_refused() -> None:
    reg = LiveExecutionRegistry()
    e = reg.dispatch("r1")
    with pytest.raises(InvalidPhaseError):
        reg.finish(e)
    with pytest.raises(InvalidPhaseError):
        reg.hand_off(e)
    reg.start(e)
    with pytest.raises(InvalidPhaseError):
        reg.start(e)


def test_duplicate_live_attempt_is_refused() -> None:
    reg = LiveExecutionRegistry()
    reg.dispatch("r1")
    with pytest.raises(IdentityConflictError):
        reg.dispatch("r1")


def test_retire_then_redispatch_gets_next_attempt_and_fences_the_old() -> None:
    reg = LiveExecutionRegistry()
    e0 = reg.dispatch("r1", input_digest="d", restart_only=True)
    reg.start(e0)
    e1 = reg.redispatch(e0)
    assert e1.attempt == 1
    info = reg.get("r1")
    assert (info.state, info.input_digest, info.restart_only) == ("queued", "d", True)
    with pytest.raises(StaleAttemptError):
        reg.start(e0)
    reg.retire(e1)
    assert reg.dispatch("r1").attempt == 2
    with pytest.raises(IdentityConflictError):
        reg.start(ExecutionId(rollout_id="r1", attempt=7))
    assert reg.retired() == {"r1": 1}


def test_completed_results_are_not_retired_or_redispatched() -> None:
    reg = LiveExecutionRegistry()
    e = reg.dispatch("r1")
    reg.start(e)
    reg.finish(e)
    reg.hand_off(e, "x")
    with pytest.raises(InvalidPhaseError):
        reg.retire(e)
    with pytest.raises(InvalidPhaseError):
        reg.redispatch(e)


def test_forget_restarts_at_attempt_zero() -> None:
    reg = LiveExecutionRegistry()
    reg.retire(reg.dispatch("r1"))
    reg.forget(["r1"])
    assert reg.dispatch("r1").attempt == 0


def test_freeze_refuses_new_dispatch_but_not_progress() -> None:
    reg = LiveExecutionRegistry()
    e = reg.dispatch("r1")
    with reg.frozen("ck") as live:
        assert live == [e]
        with pytest.raises(AdmissionClosedError):
            reg.dispatch("r2")
        with pytest.raises(AdmissionClosedError), reg.frozen("other"):
            pass
        reg.start(e)
    reg.dispatch("r2")
    assert reg.frozen_by is None


def test_concurrent_dispatch_gives_one_attempt_per_rollout() -> None:
    reg = LiveExecutionRegistry()
    barrier = threading.Barrier(8)
    wins: list[ExecutionId] = []
    conflicts: list[str] = []

    def worker() -> None:
        barrier.wait()
        for i in range(50):
            try:
                wins.append(reg.dispatch(f"r{i}"))
            except IdentityConflictError:
                conflicts.append(f"r{i}")

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(w.rollout_id for w in wins) == sorted(f"r{i}" for i in range(50))
    assert len(conflicts) == 7 * 50


def test_write_component_round_trip(memory_store: ObjectStore) -> None:
    reg = LiveExecutionRegistry()
    queued = reg.dispatch("q", input_digest="dq")
    running = reg.dispatch("run", restart_only=True)
    reg.start(running)
    done = reg.dispatch("done")
    reg.start(done)
    reg.finish(done)
    reg.hand_off(done, {"a": 1}, reward=2.0)
    eaten = reg.dispatch("eaten")
    reg.start(eaten)
    reg.finish(eaten)
    reg.hand_off(eaten, 1)
    reg.consume(eaten)
    reg.retire(reg.redispatch(queued))
    manifest, ref = reg.write_component(memory_store, "ck-1")
    prefix = layout.component_prefix("ck-1", "framework", "registry")
    reader = ArchiveReader.open(memory_store, prefix, expected_sha256=ref.sha256)
    reader.verify()
    assert manifest.extra["retired"] == {"q": 1}
    dispatch = {r.rollout_id: r for r in reader.iter_records("dispatch") if isinstance(r, DispatchRecord)}
    assert {k: v.state for k, v in dispatch.items()} == {
        "done": "handed_off",
        "eaten": "consumed",
        "run": "running",
    }
    assert dispatch["run"].restart_only
    results = [r for r in reader.iter_records("completed_result") if isinstance(r, CompletedResultRecord)]
    assert [(r.rollout_id, r.result, r.reward) for r in results] == [("done", {"a": 1}, 2.0)]
    refs = {m.rollout_id: m.refs for m in reader.members("dispatch")}
    assert refs["run"] == {"state": "running", "restart_only": True}


def test_install_is_validated_before_replacing() -> None:
    reg = LiveExecutionRegistry()
    reg.dispatch("keep")
    with pytest.raises(IdentityConflictError):
        reg.install([RegistryEntry("a", 1, "queued"), RegistryEntry("a", 2, "queued")])
    with pytest.raises(InvalidPhaseError):
        reg.install([RegistryEntry("a", 1, "handed_off")])
    assert "keep" in reg
    reg.install([RegistryEntry("a", 3, "running")], {"a": 2})
    assert "keep" not in reg and reg.get("a").attempt == 3
    with pytest.raises(StaleAttemptError):
        reg.start(ExecutionId(rollout_id="a", attempt=2))


def test_a_registry_entry_clone_copies_every_slot() -> None:
    """``_Entry.clone`` (the asynchronous snapshot, inside the pause) copies field by field: a slot
    added later must be copied too."""
    from rollout_checkpoint.registry._entries import _Entry

    entry = _Entry("r-1", 2, "dispatched", "digest-1", False)
    twin = entry.clone()
    assert twin is not entry
    for name in _Entry.__slots__:
        assert getattr(twin, name) is getattr(entry, name), name


def test_a_snapshot_shares_entries_until_either_side_changes_one() -> None:
    """The asynchronous snapshot copies only the mapping (copy on write): a change after it,
    in the registry or in the snapshot, never shows on the other side."""
    reg = LiveExecutionRegistry()
    a, b, c = (reg.dispatch(r) for r in ("a", "b", "c"))
    reg.start(a)
    reg.start(b)
    reg.finish(b)
    snap = reg.snapshot()
    reg.finish(a)  # running -> finished
    reg.hand_off(b, {"answer": 1})
    reg.start(c)
    reg.finish(c)
    d = reg.dispatch("d")
    assert {e.rollout_id: e.state for e in snap.executions()} == {
        "a": "running",
        "b": "finished",
        "c": "queued",
    }
    assert {e.rollout_id: e.state for e in reg.executions()} == {
        "a": "finished",
        "b": "handed_off",
        "c": "finished",
        "d": "queued",
    }
    second = reg.snapshot()
    reg.consume(b)
    reg.start(d)
    assert second.get("b").state == "handed_off" and second.get("d").state == "queued"
    snap.start(c)  # a change to a snapshot clones too
    assert reg.get("c").state == "finished" and snap.get("c").state == "running"
