"""Issue 6's agent and resources rules and the reader's reconciliation, with the reference
participants: parking while awaiting the model, restart-only agents, mutations that wait for
resume, restores that refuse disagreeing revisions or a missing participant, lineage that runs
past the boundary, and an episode that finishes during prepare."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from _reference_world import RealWorld
from rollout_checkpoint.coordinator import Coordinator, MissingParticipantError
from rollout_checkpoint.errors import (
    AdmissionClosedError,
    CheckpointError,
    InvalidPhaseError,
    InvalidRecordError,
    StaleAttemptError,
)
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import AgentParticipant, ResourcesParticipant
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.store import MemoryStore


def ex(rollout: str, attempt: int = 0) -> ExecutionId:
    return ExecutionId(rollout_id=rollout, attempt=attempt)


def mem() -> MemoryStore:
    return MemoryStore(f"recon-{uuid.uuid4().hex}")


def soon(seconds: float = 10.0) -> float:
    return time.time() + seconds


@pytest.fixture
def world() -> Iterator[RealWorld]:
    w = RealWorld(MemoryStore(f"recon-{uuid.uuid4().hex}"))
    yield w
    w.close()


def _boundary(e: ExecutionId, index: int, call: str | None = None, **fields: object) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=e.rollout_id,
        attempt=e.attempt,
        boundary_index=index,
        turn_index=index,
        last_model_call_id=call,
        **fields,  # type: ignore[arg-type]
    )


# -- agent: parked while awaiting the model -----------------------------------------------------


def test_a_run_awaiting_its_first_model_call_is_parked_and_stays_parked_until_resume() -> None:
    agent = AgentParticipant("a")
    e = ex("r1")
    agent.begin(e)
    agent.boundary(e, _boundary(e, 0, cookies={"session": "abc"}))
    agent.start_turn(e)
    entered, release, left = threading.Event(), threading.Event(), threading.Event()

    def turn() -> None:
        with agent.awaiting_model(e, "call-1"):
            entered.set()
            assert release.wait(30)  # the model call: cut or queued while the checkpoint runs
        left.set()

    worker = threading.Thread(target=turn)
    worker.start()
    assert entered.wait(30)
    report = agent.prepare("c1", soon())
    assert report.ready and report.counts["awaiting_model"] == 1
    release.set()  # the call returns during the checkpoint: the run must not go on
    assert not left.wait(0.2)
    store = mem()
    agent.commit("c1", store, soon())
    agent.resume("c1", soon())
    assert left.wait(30)
    worker.join(30)
    # the committed boundary names the call the run was parked on, and the cookies
    fresh = AgentParticipant("a")
    fresh.restore("r-1", "c1", store, soon())
    fresh.resume("r-1", soon())
    restored = fresh.begin(e.next_attempt())
    assert restored is not None and restored.pending_model_call_id == "call-1"
    assert restored.cookies == {"session": "abc"} and restored.attempt == 1


def test_a_second_model_call_in_one_turn_does_not_park() -> None:
    agent = AgentParticipant("a")
    e = ex("r1")
    agent.begin(e)
    agent.boundary(e, _boundary(e, 0))
    agent.start_turn(e)
    with agent.awaiting_model(e, "call-1"):
        pass
    with agent.awaiting_model(e, "call-2"):
        report = agent.prepare("c1", soon(0.05))
        assert not report.ready and report.blockers == ("r1#0",)
    agent.resume("c1", soon())
    with pytest.raises(InvalidRecordError, match="set by the agent participant"):
        agent.boundary(e, _boundary(e, 1, pending_model_call_id="call-2"))


def test_a_run_without_a_boundary_is_not_parked_by_a_model_wait() -> None:
    agent = AgentParticipant("a")
    e = ex("r1")
    agent.begin(e)
    with agent.awaiting_model(e, "call-1"):
        assert not agent.prepare("c1", soon(0.05)).ready
    agent.resume("c1", soon())
    agent.boundary(e, _boundary(e, 0))
    with pytest.raises(InvalidPhaseError, match="outside a turn"), agent.awaiting_model(e, "call-2"):
        pass


def test_a_parked_run_retired_meanwhile_is_void() -> None:
    agent = AgentParticipant("a")
    e = ex("r1")
    agent.begin(e)
    agent.boundary(e, _boundary(e, 0))
    agent.start_turn(e)
    with pytest.raises(StaleAttemptError), agent.awaiting_model(e, "call-1"):
        agent.retire([e], soon())


def test_restart_only_agent_never_blocks_and_reports_restarts() -> None:
    store = mem()
    agent = AgentParticipant("a", mode="restart_only")
    e = ex("r1")
    agent.begin(e)  # running mid-turn: a restart-only agent does not wait for it
    report = agent.prepare("c1", soon(0.05))
    assert report.ready and report.restarts == (e,)
    reply = agent.commit("c1", store, soon())
    assert reply.restarts == (e,) and reply.executions == ()
    agent.resume("c1", soon())
    with pytest.raises(ValueError):
        AgentParticipant("a", mode="stateless")  # type: ignore[arg-type]


def test_a_restart_only_run_of_an_exported_agent_is_fresh_dispatched(world: RealWorld) -> None:
    cont = world.start("cont")
    world.turn(cont, "c1", 1)
    ronly = world.registry.dispatch("ronly", input_digest="ronly")
    world.registry.start(ronly)
    world.agent.begin(ronly, restart_only=True)
    plan = load_checkpoint(world.coordinator.store, world.coordinator.checkpoint().checkpoint_id)
    assert plan.rollouts["cont"].disposition == "continue"
    assert plan.rollouts["ronly"].disposition == "fresh_dispatch"
    assert "agent/agent-0 reported it must restart" in plan.rollouts["ronly"].reason


# -- resources: mutations wait for resume ---------------------------------------------------------


def test_mutations_wait_for_resume_by_default_and_are_bounded() -> None:
    res = ResourcesParticipant("res", mode="exported", admission_wait=30)
    e = ex("r1")
    res.open_session(e, "s", {"n": 0})
    assert res.prepare("c1", soon()).ready
    results: list[int] = []
    worker = threading.Thread(target=lambda: results.append(res.mutate(e, "s", lambda s: {"n": s["n"] + 1})))
    worker.start()
    time.sleep(0.05)
    assert not results and worker.is_alive()  # waiting, not failed
    with pytest.raises(AdmissionClosedError):
        res.mutate(e, "s", lambda s: s, wait=0.01)  # bounded by its deadline
    res.commit("c1", mem(), soon())
    res.resume("c1", soon())
    worker.join(30)
    assert results == [1] and res.state(e, "s") == ({"n": 1}, 1)


# -- restore: revisions must agree with the agent boundaries that name them ---------------------


def test_resources_restore_refuses_a_revision_the_agent_boundary_disagrees_with(world: RealWorld) -> None:
    e = world.start("r1")
    world.resources.mutate(e, "s", lambda s: {"n": 1})
    world.resources.mutate(e, "s", lambda s: {"n": 2})  # revision 2; the boundary says 1
    world.agent.boundary(e, _boundary(e, 1, resource_revisions={"res-0": {"s": 1}}))
    cid = world.coordinator.checkpoint().checkpoint_id
    plan = load_checkpoint(world.coordinator.store, cid)
    assert plan.rollouts["r1"].disposition == "fresh_dispatch"
    assert "boundary needs revision 1, snapshot is at revision 2" in plan.rollouts["r1"].reason
    fresh = ResourcesParticipant("res-0", mode="exported")
    with pytest.raises(InvalidRecordError, match="at revision 1; the checkpoint has it at revision 2"):
        fresh.restore("r-1", cid, world.coordinator.store, soon())
    assert fresh.status().live == 0 and fresh.accepting


def test_revisions_are_matched_in_the_named_resources_instance() -> None:
    store = mem()
    agent = AgentParticipant("agent-0")
    left = ResourcesParticipant("left", mode="exported")
    right = ResourcesParticipant("right", mode="exported")
    registry = LiveExecutionRegistry()
    coordinator = Coordinator(store, [agent, left, right], registry, run_id="test-run")
    for rollout, names in (
        ("same", {"left": {"s": 1}}),
        ("other", {"right": {"s": 1}}),
        ("gone", {"x": {"s": 1}}),
    ):
        e = registry.dispatch(rollout)
        registry.start(e)
        agent.begin(e)
        left.open_session(e, "s", {})
        left.mutate(e, "s", lambda s: {"v": 1})  # left: revision 1
        right.open_session(e, "s", {})  # right: the same session id at revision 0
        agent.boundary(e, _boundary(e, 1, resource_revisions=names))
    plan = load_checkpoint(store, coordinator.checkpoint().checkpoint_id)
    assert plan.rollouts["same"].disposition == "continue"
    assert plan.rollouts["other"].disposition == "fresh_dispatch"
    assert (
        "instance 'right': boundary needs revision 1, snapshot is at revision 0"
        in plan.rollouts["other"].reason
    )
    assert plan.rollouts["gone"].reason == "resources instance 'x' is not in the checkpoint"


# -- coordinator: a participant the checkpoint lists must be there --------------------------------


def test_restore_and_resume_refuse_without_a_listed_participant(world: RealWorld) -> None:
    e = world.start("r1")
    world.turn(e, "c1", 1)
    world.coordinator.checkpoint()
    store = world.coordinator.store
    agent = AgentParticipant("agent-0")
    from rollout_checkpoint.participants import PolicyModelParticipant
    from rollout_checkpoint.tokens import ObjectStoreTokenStore

    model = PolicyModelParticipant(ObjectStoreTokenStore(store), "policy-0")
    registry = LiveExecutionRegistry()
    partial = Coordinator(store, [agent, model], registry, ObjectStoreTokenStore(store), run_id="test-run")
    with pytest.raises(MissingParticipantError) as info:
        partial.restore(restore_id="restore-1")
    assert "resources/res-0" in info.value.message and info.value.code == "missing_participant"
    assert info.value.details["missing"] == ["resources/res-0"]
    # nothing was touched: no live execution, admission open, the registry empty
    assert agent.status().live == model.status().live == 0 and agent.accepting and model.accepting
    assert len(registry) == 0
    with pytest.raises(MissingParticipantError, match="resources/res-0"):
        partial.resume("restore-1")
    assert agent.phase.value == "idle"


# -- reader: the lineage ends at the boundary's last committed call --------------------------------


def test_lineage_running_past_the_boundary_is_not_continued(world: RealWorld) -> None:
    ahead, parked = world.start("ahead"), world.start("parked")
    for e in (ahead, parked):
        world.turn(e, "c1", 1)
    # "ahead" staged c2 and c3 after its boundary named c1 (the agent did not report them)
    world.agent.start_turn(ahead)
    for call in ("c2", "c3"):
        with world.model.call(ahead, call, policy_version="v1") as handle:
            handle.stage(prompt_token_ids=[1], generation_token_ids=[2], generation_log_probs=[-0.1])
    world.agent.boundary(ahead, _boundary(ahead, 2, "c1", resource_revisions={"res-0": {"s": 1}}))
    plan = load_checkpoint(world.coordinator.store, world.coordinator.checkpoint().checkpoint_id)
    assert plan.rollouts["parked"].disposition == "continue"
    assert plan.rollouts["ahead"].disposition == "fresh_dispatch"
    assert "runs past the boundary's last committed call 'c1': ['c2', 'c3']" in plan.rollouts["ahead"].reason


# -- an episode that finishes during prepare: neither lost nor redone ------------------------------


def test_an_episode_finishing_during_prepare_is_completed_with_its_result(world: RealWorld) -> None:
    e = world.start("late")
    world.turn(e, "c1", 1)
    world.agent.start_turn(e)  # the final turn runs: the agent stage waits for it
    other = world.start("other")
    world.turn(other, "c1", 1)
    outcome: list[str] = []
    checkpointer = threading.Thread(
        target=lambda: outcome.append(world.coordinator.checkpoint().checkpoint_id)
    )
    checkpointer.start()
    deadline = time.time() + 30
    while world.agent.phase.value != "preparing" and time.time() < deadline:
        time.sleep(0.005)
    assert world.agent.phase.value == "preparing"
    world.resources.mutate(e, "s", lambda s: {"n": s["n"] + 1})  # its last tool call still runs
    world.resources.end_session(e, "s")
    world.agent.finish(e)  # terminal: the result goes to the framework, not into a boundary
    world.model.finish(e)
    world.registry.finish(e)
    world.registry.hand_off(e, {"answer": 42}, reward=1.0)
    checkpointer.join(60)
    [cid] = outcome
    world.close()

    fresh = RealWorld(world.coordinator.store)
    restored = fresh.coordinator.restore(cid)
    assert restored.plan.rollouts["late"].disposition == "completed"
    assert restored.plan.rollouts["other"].disposition == "continue"
    fresh.coordinator.resume(restored.restore_id)
    info = fresh.registry.get("late")
    assert info.state == "handed_off" and info.attempt == 0  # not redispatched
    assert info.result is not None and info.result.result == {"answer": 42} and info.result.reward == 1.0
    with pytest.raises(CheckpointError):
        fresh.registry.dispatch("late")  # its result is pending: it is not dispatched again
    assert fresh.registry.consume(info.execution).result == {"answer": 42}
    fresh.close()
