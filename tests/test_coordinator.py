"""The checkpoint cycle: commit point, aborts, fault injection at every step, races, restore."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest

from _protocol_fakes import (
    Deployment,
    FakeTokens,
    InjectedFault,
    ScriptedParticipant,
    ex,
    latest_id,
    memory_store,
    populate,
    published_ids,
)
from _reference_world import RealWorld
from rollout_checkpoint.coordinator import (
    CheckpointCancelledError,
    CheckpointNotReadyError,
    Coordinator,
    RestoreFailedError,
)
from rollout_checkpoint.errors import (
    CheckpointError,
    CheckpointRejectedError,
    ConditionalWriteUnsupportedError,
    DeadlineExceededError,
    IntegrityError,
    InvalidRecordError,
    ManifestConflictError,
    StaleAttemptError,
    StaleCheckpointError,
    StaleCoordinatorError,
)
from rollout_checkpoint.format import layout
from rollout_checkpoint.protocol import ParticipantControl, Phase
from rollout_checkpoint.reader import load_checkpoint, verify_checkpoint
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.store import CountingStore, FsspecStore, ObjectStore


@pytest.fixture()
def dep() -> Iterator[Deployment]:
    store = memory_store("coord")
    deployment = Deployment(store, token_source=FakeTokens(store))
    yield deployment
    deployment.close()


def test_cycle_publishes_a_verifiable_checkpoint(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    first = dep.coordinator.checkpoint(framework_state={"trainer_step": 7})
    assert first.clean and first.latest_moved and first.record.sequence == 1
    assert first.pause_seconds >= first.publish_seconds > 0
    second = dep.coordinator.checkpoint()
    assert second.record.sequence == 2 and second.record.previous_checkpoint_id == first.checkpoint_id
    assert latest_id(dep.store) == second.checkpoint_id
    report = verify_checkpoint(dep.store, first.checkpoint_id)
    assert report.counts == {"completed": 1, "continue": 1, "fresh_dispatch": 2}
    plan = load_checkpoint(dep.store, first.checkpoint_id)
    assert plan.record.framework_state == {"trainer_step": 7}
    assert plan.record.token_snapshot is not None
    assert dep.all_open() and dep.registry.frozen_by is None


def test_unsafe_store_is_refused_unless_accepted() -> None:
    store = FsspecStore(fsspec.filesystem("memory"), f"/unsafe-{uuid.uuid4().hex}", "memory://unsafe")
    registry = LiveExecutionRegistry()
    with pytest.raises(ConditionalWriteUnsupportedError):
        Coordinator(store, [], registry, run_id="test-run").checkpoint()
    assert Coordinator(store, [], registry, accept_unsafe_store=True, run_id="test-run").checkpoint().clean


def test_duplicate_participants_are_refused(dep: Deployment) -> None:
    with pytest.raises(ValueError, match="unique"):
        Coordinator(dep.store, [dep.agent, dep.agent], dep.registry, run_id="test-run")


# -- fault injection at every step, in-process ---------------------------------------------------


_HEX = re.compile("[0-9a-f]{32}")


class _StepKeys:
    """Names each fault step stably: the checkpoint id and the writer's random object names
    replaced, and the occurrence of that name counted (the participants commit concurrently,
    so steps of different components interleave in any order, but each component's own steps
    come in one order)."""

    def __init__(self, cid: str) -> None:
        self.cid = cid
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()

    def key(self, step: str) -> str:
        name = _HEX.sub("*", step.replace(self.cid, "<cid>"))
        with self.lock:
            n = self.seen.get(name, 0)
            self.seen[name] = n + 1
        return f"{name}#{n}"


def _steps() -> list[str]:
    store = memory_store("coord")
    steps: list[str] = []
    dep = Deployment(store, token_source=FakeTokens(store))
    populate(dep, dep.coordinator.token_source)
    dep.coordinator.checkpoint()
    keys = _StepKeys("ck-steps")
    dep.coordinator.fault_hook = lambda step: steps.append(keys.key(step))
    dep.coordinator.checkpoint("ck-steps")
    dep.close()
    return steps


STEPS = _steps()
# the steps up to the commit point (a fault there publishes nothing); their order among
# themselves varies with the commit threads, whether one comes before "publish" does not
BEFORE_PUBLISH = frozenset(STEPS[: STEPS.index("publish#0") + 1])


def test_the_step_list_covers_every_write_call_and_the_commit_point() -> None:
    kinds = {s.split(":", 1)[0].split("#")[0] for s in STEPS}
    assert {
        "freeze",
        "prepare",
        "commit",
        "put",
        "put_if_absent",
        "open_write",
        "validate",
        "token_snapshot",
        "publish",
        "latest",
        "resume",
    } <= kinds
    assert STEPS.index("publish#0") < STEPS.index("latest#0")
    assert sum(s.startswith("put_if_absent:") and s.endswith("/manifest.json#0") for s in STEPS) == 4
    assert len(set(STEPS)) == len(STEPS)
    # every participant's commit is called before any component is validated
    last_commit = max(i for i, s in enumerate(STEPS) if s.startswith("commit:"))
    assert last_commit < min(i for i, s in enumerate(STEPS) if s.startswith("validate:"))


@pytest.mark.parametrize(
    "step",
    sorted(STEPS),
    # every pytest-xdist worker must collect the same tests in the same order
    ids=[s.split("/")[-1][:40] for s in sorted(STEPS)],
)
def test_fault_at_every_step(step: str) -> None:
    store = memory_store("coord")
    tokens = FakeTokens(store)
    dep = Deployment(store, token_source=tokens)
    populate(dep, tokens)
    baseline = dep.coordinator.checkpoint().checkpoint_id
    cid = "ck-steps"
    keys = _StepKeys(cid)
    fired: list[str] = []

    def hook(name: str) -> None:
        if keys.key(name) == step and not fired:
            fired.append(name)
            raise InjectedFault(name)

    dep.coordinator.fault_hook = hook
    if step.startswith("open_write:"):
        # a member-index stream that fails to open is rebuilt by the archive writer from the
        # shards it already uploaded: the cycle recovers and publishes a complete checkpoint
        outcome = dep.coordinator.checkpoint(cid)
        assert outcome.clean and fired
        assert published_ids(store) == sorted([baseline, cid])
        verify_checkpoint(store, cid)
        assert latest_id(store) == cid
    elif step in BEFORE_PUBLISH:
        with pytest.raises(InjectedFault):
            dep.coordinator.checkpoint(cid)
        assert fired, step
        assert published_ids(store) == [baseline]
        assert latest_id(store) == baseline
    else:
        outcome = dep.coordinator.checkpoint(cid)
        # a failed pointer move is reported; a failed resume is retried (and succeeds here)
        assert fired, step
        assert outcome.clean == (step != "latest#0")
        assert published_ids(store) == sorted([baseline, cid])
        verify_checkpoint(store, cid)
        assert latest_id(store) in (baseline, cid)
    # invariants: participants open, registry thawed, completed result kept, the latest verifies
    assert dep.all_open(), [p.status() for p in dep.participants]
    assert dep.registry.frozen_by is None
    assert [r.rollout_id for r in dep.registry.pending_results()] == ["done"]
    assert load_checkpoint(store).rollouts["done"].disposition == "completed"
    # and the next cycle works
    dep.coordinator.fault_hook = None
    after = dep.coordinator.checkpoint()
    assert after.clean and latest_id(store) == after.checkpoint_id
    dep.close()


# -- lost acknowledgements, deadlines, cancellation, verification ------------------------------------


class LossyParticipant:
    """Applies each listed operation, then loses its answer once (a transport failure)."""

    def __init__(self, inner: ScriptedParticipant, lose: set[str]) -> None:
        self.inner = inner
        self.lose = set(lose)
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if name not in ("prepare", "commit", "resume", "restore", "retire"):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            result = target(*args, **kwargs)
            if name in self.lose:
                self.lose.discard(name)
                raise ConnectionError(f"answer of {name} lost")
            return result

        return call


def test_lost_acknowledgements_are_retried(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    lossy = LossyParticipant(dep.agent, {"prepare", "commit", "resume"})
    proxy: Any = lossy
    participants: list[ParticipantControl] = [proxy, dep.model, dep.resources]
    coordinator = Coordinator(
        dep.store, participants, dep.registry, dep.coordinator.token_source, run_id="test-run"
    )
    outcome = coordinator.checkpoint()
    assert outcome.clean and lossy.calls == {"prepare": 2, "commit": 2, "resume": 2}
    # the repeated commit did not export twice: one manifest, one index, one shard
    prefix = layout.component_prefix(outcome.checkpoint_id, "agent", "agent-0")
    assert len(dep.store.list(prefix)) == 3
    assert dep.all_open()
    verify_checkpoint(dep.store, outcome.checkpoint_id)


def test_not_ready_by_the_deadline_aborts(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    dep.agent.set_blockers(["cont#0 mid-turn"])
    with pytest.raises(CheckpointNotReadyError) as info:
        dep.coordinator.checkpoint(deadline_s=0.2)
    assert info.value.details["stage"] == "agent"
    assert published_ids(dep.store) == [] and dep.all_open()
    # resources (the stage after the blocked one) was never asked to prepare
    assert dep.resources.status().phase.value == "idle"


def test_deadline_passing_between_steps_aborts(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    offset = [0.0]
    dep.coordinator.clock = lambda: time.time() + offset[0]

    def hook(step: str) -> None:
        if step == "validate:resources/res-0":
            offset[0] = 120.0

    dep.coordinator.fault_hook = hook
    with pytest.raises(DeadlineExceededError):
        dep.coordinator.checkpoint(deadline_s=60)
    assert published_ids(dep.store) == [] and dep.all_open()


def test_cancellation_before_the_commit_point_aborts(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)

    def hook(step: str) -> None:
        if step == "commit:agent/agent-0":
            dep.coordinator.cancel()

    dep.coordinator.fault_hook = hook
    with pytest.raises(CheckpointCancelledError):
        dep.coordinator.checkpoint()
    assert published_ids(dep.store) == [] and dep.all_open()
    dep.coordinator.fault_hook = None
    assert dep.coordinator.checkpoint().clean  # a cancel does not stick to the next cycle


def test_component_corrupted_before_the_aggregate_fails_validation(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)

    def hook(step: str) -> None:
        if step == "validate:agent/agent-0":
            shard = next(
                i.key for i in dep.store.list("checkpoints/") if "/agent/" in i.key and "/shards/" in i.key
            )
            dep.store.put(shard, dep.store.get(shard)[:-7])

    dep.coordinator.fault_hook = hook
    with pytest.raises(IntegrityError):
        dep.coordinator.checkpoint()
    assert published_ids(dep.store) == [] and dep.all_open()
    assert not [i for i in dep.store.list("checkpoints/") if i.key.endswith("aggregate.json")]


def test_reused_checkpoint_id_is_stale(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    cid = dep.coordinator.checkpoint().checkpoint_id
    record = dep.store.get(layout.published_key(cid))
    with pytest.raises(StaleCheckpointError):
        dep.coordinator.checkpoint(cid)
    assert dep.store.get(layout.published_key(cid)) == record and dep.all_open()


def test_failure_after_the_commit_point_is_reported_not_raised(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    baseline = dep.coordinator.checkpoint().checkpoint_id

    def hook(step: str) -> None:
        if step == "latest":
            raise InjectedFault(step)

    dep.coordinator.fault_hook = hook
    outcome = dep.coordinator.checkpoint()
    assert not outcome.latest_moved and "latest pointer not moved" in outcome.post_commit_errors[0]
    assert latest_id(dep.store) == baseline
    verify_checkpoint(dep.store, outcome.checkpoint_id)
    dep.coordinator.fault_hook = None
    third = dep.coordinator.checkpoint()
    assert (
        third.record.sequence == outcome.record.sequence + 1 and latest_id(dep.store) == third.checkpoint_id
    )


# -- two coordinators, one checkpoint id -----------------------------------------------------------


@pytest.mark.parametrize("backend", ["memory_store", "local_store", "s3_store"])
def test_two_coordinators_publishing_one_id(backend: str, request: pytest.FixtureRequest) -> None:
    store: ObjectStore = request.getfixturevalue(backend)
    deployments = [Deployment(store) for _ in range(2)]
    for i, d in enumerate(deployments):
        d.running(f"only-{i}")
        d.completed("done")
    barrier = threading.Barrier(2)
    results: list[object] = [None, None]

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = deployments[i].coordinator.checkpoint("ck-race")
        except CheckpointError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in enumerate(results) if not isinstance(r, CheckpointError)]
    # the second coordinator of the run takes the next owner epoch, which fences the first at its
    # publication (stale_coordinator); the id race may fell the second as well: at most one wins
    assert len(winners) <= 1, results
    for loser in (r for r in results if isinstance(r, CheckpointError)):
        assert isinstance(
            loser,
            ManifestConflictError
            | StaleCheckpointError
            | InvalidRecordError
            | IntegrityError
            | StaleCoordinatorError,
        ), loser
    if not winners:
        assert all(d.all_open() for d in deployments)
        return
    plan = load_checkpoint(store, "ck-race")
    assert set(plan.rollouts) == {f"only-{winners[0]}", "done"}
    verify_checkpoint(store, "ck-race")
    assert all(d.all_open() for d in deployments)
    for d in deployments:
        d.close()


# -- restore -----------------------------------------------------------------------------------------


def test_restore_rebuilds_registry_and_fences_old_attempts(dep: Deployment) -> None:
    tokens = dep.coordinator.token_source
    populate(dep, tokens)
    cid = dep.coordinator.checkpoint().checkpoint_id
    dep.close()
    fresh = Deployment(dep.store, token_source=tokens)  # the crash: new, empty participants
    outcome = fresh.coordinator.restore()
    assert outcome.source_checkpoint_id == cid
    assert outcome.restored["agent/agent-0"] == (ex("cont", 1),)
    assert not fresh.all_open()  # restore leaves participants paused
    got = {e.rollout_id: (e.attempt, e.state) for e in fresh.registry.executions()}
    assert got == {
        "cont": (1, "running"),
        "done": (0, "handed_off"),
        "queued": (1, "queued"),
        "ronly": (1, "queued"),
    }
    assert fresh.registry.get("done").result is not None
    fresh.coordinator.resume(outcome.restore_id)
    assert fresh.all_open()
    # attempt 0 is refused everywhere; attempt 1 of the fresh dispatches is admitted
    for participant in fresh.participants:
        for rollout in ("cont", "queued", "ronly"):
            assert participant.refuses(ex(rollout, 0))
            assert not participant.refuses(ex(rollout, 1))
    with pytest.raises(StaleAttemptError):
        fresh.registry.start(ex("queued", 0))
    fresh.registry.start(ex("queued", 1))
    fresh.agent.track(ex("queued", 1))
    with pytest.raises(StaleAttemptError):
        fresh.agent.track(ex("cont", 0))
    # the restored deployment checkpoints again and the continuation survives
    plan = load_checkpoint(dep.store, fresh.coordinator.checkpoint().checkpoint_id)
    assert plan.rollouts["cont"].disposition == "continue" and plan.rollouts["cont"].attempt == 1
    fresh.close()


def test_failed_restore_is_all_or_nothing(dep: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = dep.coordinator.token_source
    populate(dep, tokens)
    dep.coordinator.checkpoint()
    fresh = Deployment(dep.store, token_source=tokens)

    def refuse(records: Any) -> Any:
        raise InvalidRecordError("resources cannot decode its sessions")

    before = [p.fence.snapshot() for p in fresh.participants]
    monkeypatch.setattr(fresh.resources, "_validate_restore", refuse)
    with pytest.raises(RestoreFailedError, match="undone"):
        fresh.coordinator.restore()
    assert fresh.all_open()
    assert len(fresh.registry) == 0
    # what the agent and model installed was undone: no live state, tombstones as before
    for participant in (fresh.agent, fresh.model):
        assert not participant.refuses(ex("cont", 1)) and participant.live() == {}
    assert [p.fence.snapshot() for p in fresh.participants] == before
    # so the same participants can take the same checkpoint once the cause is gone
    monkeypatch.undo()
    outcome = fresh.coordinator.restore()
    fresh.coordinator.resume(outcome.restore_id)
    assert fresh.agent.live() == {"cont": ex("cont", 1)}
    fresh.close()


def test_restore_of_a_rejected_checkpoint_touches_nothing(dep: Deployment) -> None:
    e = dep.resumable("r", tokens=dep.coordinator.token_source)
    dep.agent.declare_unsafe_effect(e, "paid an invoice")
    dep.coordinator.checkpoint()
    fresh = Deployment(dep.store, token_source=dep.coordinator.token_source)
    with pytest.raises(CheckpointError, match="unsafe"):
        fresh.coordinator.restore()
    assert fresh.all_open() and all(p.status().tombstones == 0 for p in fresh.participants)
    fresh.close()


# -- the same guarantees with the reference participants (no scripted fakes) ------------------------


def test_reference_participants_fence_restored_attempts_and_keep_tombstones_across_restores() -> None:
    store = memory_store("coord")
    first = RealWorld(store)
    cont = first.start("cont")
    first.turn(cont, "c1", 1)
    gone = first.start("gone")
    first.coordinator.retire([gone])  # retired before the checkpoint: its tombstone is committed
    done = first.start("done")
    first.agent.finish(done)
    first.resources.end_session(done, "s")
    first.registry.finish(done)
    first.registry.hand_off(done, {"answer": 1}, reward=1.0)
    c1 = first.coordinator.checkpoint().checkpoint_id
    first.close()  # the crash

    second = RealWorld(store)
    restored = second.coordinator.restore()
    assert restored.source_checkpoint_id == c1
    assert {p.rollout_id: p.disposition for p in restored.plan.rollouts.values()} == {
        "cont": "continue",
        "done": "completed",
    }
    # paused until resume: new work is refused with admission_closed, not silently admitted
    with pytest.raises(CheckpointError) as info:
        second.agent.begin(ex("cont", 1))
    assert info.value.code == "admission_closed"
    second.coordinator.resume(restored.restore_id)
    for stale in (cont, gone):
        second.refused_everywhere(stale)
    # a late retire from the dead attempt changes nothing either
    second.coordinator.retire([cont])
    assert second.agent.status().live == second.model.status().live == second.resources.status().live == 1
    # the replacement continues where attempt 0 stopped, in every participant
    nxt = ex("cont", 1)
    boundary = second.agent.begin(nxt)
    assert boundary is not None and boundary.boundary_index == 1
    assert boundary.resource_revisions == {"res-0": {"s": 1}}
    assert second.resources.state(nxt, "s") == ({"n": 1}, 1)
    second.agent.start_turn(nxt)
    second.turn(nxt, "c2", 2)
    assert [(c.call_id, c.parent_call_id) for c in second.model.lineage(nxt)][-1] == ("c2", "c1")
    c2 = second.coordinator.checkpoint().checkpoint_id
    second.close()  # the second crash

    third = RealWorld(store)
    again = third.coordinator.restore()
    assert again.source_checkpoint_id == c2 and again.plan.rollouts["cont"].disposition == "continue"
    third.coordinator.resume(again.restore_id)
    for stale in (ex("cont", 0), ex("cont", 1), gone):  # committed tombstones survived both restores
        third.refused_everywhere(stale)
    assert third.agent.begin(ex("cont", 2)) is not None
    # forget drops the tombstone everywhere: the rollout id may be used from attempt 0 again
    third.coordinator.forget(["gone"])
    for participant in third.participants:
        assert "gone" not in participant.fence
    third.agent.begin(gone)
    third.resources.open_session(gone, "s", {"n": 0})
    third.model.admit(gone, "g1", policy_version="v1").close()
    third.close()


def test_failed_restore_with_reference_participants_is_rolled_back() -> None:
    store = memory_store("coord")
    first = RealWorld(store)
    cont = first.start("cont")
    first.turn(cont, "c1", 1)
    cid = first.coordinator.checkpoint().checkpoint_id
    first.close()
    # damage the resources payload: classification (indexes only) still accepts the checkpoint,
    # the resources participant's restore (which checks every shard digest) refuses it
    [shard] = [i.key for i in store.list(layout.component_prefix(cid, "resources", "res-0") + "/shards/")]
    data = bytearray(store.get(shard))
    data[len(data) // 2] ^= 0xFF
    store.put(shard, bytes(data))
    assert load_checkpoint(store, cid, verify=False).rollouts["cont"].disposition == "continue"
    with pytest.raises(CheckpointRejectedError):  # the default restore verifies first: touches nothing
        RealWorld(store).coordinator.restore()

    second = RealWorld(store)
    with pytest.raises(RestoreFailedError) as info:
        second.coordinator.restore(verify=False)  # the cheap plan: the participant's read refuses
    assert info.value.code == "restore_failed" and info.value.details["cause"] == "integrity_error"
    # nothing stays installed, everything is open, no tombstone was added (the restore is undone)
    for participant in second.participants:
        status = participant.status()
        assert (status.phase, status.accepting, status.live, status.tombstones) == (Phase.IDLE, True, 0, 0)
        assert not participant.fence.is_retired(ex("cont", 1))
    assert len(second.registry) == 0
    second.close()


def test_end_to_end_with_reference_participants_on_every_backend(any_store: ObjectStore) -> None:
    """The whole story on local disk, memory and S3 (moto server): live rollouts -> checkpoint ->
    crash -> classify from indexes only -> restore at attempt N+1 -> resume -> next checkpoint."""
    first = RealWorld(any_store)
    cont = first.start("cont")
    first.turn(cont, "c1", 1)
    first.turn(cont, "c2", 2)
    queued = first.registry.dispatch("queued")
    done = first.start("done")
    first.agent.finish(done)
    first.resources.end_session(done, "s")
    first.registry.finish(done)
    first.registry.hand_off(done, {"answer": 42}, reward=1.0)
    outcome = first.coordinator.checkpoint()
    assert outcome.clean
    first.close()  # the crash: every in-memory participant is gone

    counting = CountingStore(any_store)
    plan = load_checkpoint(counting, verify=False)
    assert {r: p.disposition for r, p in plan.rollouts.items()} == {
        "cont": "continue",
        "done": "completed",
        "queued": "fresh_dispatch",
    }
    assert not [k for k in counting.keys_read if "/shards/" in k], "classification read a shard payload"
    verify_checkpoint(any_store, outcome.checkpoint_id)

    second = RealWorld(any_store)
    restored = second.coordinator.restore()
    second.coordinator.resume(restored.restore_id)
    nxt = ex("cont", 1)
    boundary = second.agent.begin(nxt)
    assert boundary is not None and boundary.boundary_index == 2 and boundary.last_model_call_id == "c2"
    assert second.resources.state(nxt, "s") == ({"n": 2}, 2)
    second.agent.start_turn(nxt)
    second.turn(nxt, "c3", 3)
    assert [c.parent_call_id for c in second.model.lineage(nxt) if c.call_id == "c3"] == ["c2"]
    second.refused_everywhere(cont)
    fresh = second.registry.get("queued")
    assert (fresh.attempt, fresh.state) == (queued.attempt + 1, "queued")  # re-dispatched from its input
    assert (second.registry.get("done").state, second.registry.get("cont").attempt) == ("handed_off", 1)
    again = second.coordinator.checkpoint()
    assert again.record.sequence == outcome.record.sequence + 1
    later = load_checkpoint(any_store)
    assert later.checkpoint_id == again.checkpoint_id
    assert later.rollouts["cont"].attempt == 1 and later.rollouts["cont"].disposition == "continue"
    assert later.rollouts["done"].disposition == "completed"
    second.close()


def test_cycle_streams_member_indexes_to_the_store(local_store: ObjectStore) -> None:
    """The coordinator's fault-injection wrapper forwards streamed writes: each component's member
    index reaches the backend through ``open_write``, never buffered whole into one ``put``."""
    counting = CountingStore(local_store)
    world = RealWorld(counting)
    world.turn(world.start("cont"), "c1", 1)
    steps: list[str] = []
    world.coordinator.fault_hook = steps.append
    outcome = world.coordinator.checkpoint()
    world.close()
    components = len(outcome.record.components)
    assert components == 4  # agent, model, resources, framework registry
    opened = [s for s in steps if s.startswith("open_write:")]
    assert counting.requests["open_write"] == len(opened)
    assert len([s for s in opened if "/index-" in s]) == components
    # on local disk the shards are streamed into their objects too (ArchiveWriter.stream_shards)
    assert all("/index-" in s or "/shards/" in s for s in opened)
