"""Asynchronous publication, in-process: verifiable like a synchronous checkpoint, fault injection
at every new step, frozen state that later mutations cannot reach, participants working while
the upload runs, the rules for overlapping operations, lease/deadline fencing and lost answers."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

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
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.errors import DeadlineExceededError, InvalidPhaseError
from rollout_checkpoint.format import ArchiveReader, layout
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.protocol import (
    CommitReply,
    ParticipantControl,
    Phase,
    PublicationFailedError,
    PublicationUnknownError,
)
from rollout_checkpoint.reader import RecoveryPlan, load_checkpoint, verify_checkpoint
from rollout_checkpoint.store import ObjectStore


def _classes(plan: RecoveryPlan) -> dict[str, tuple[str, int]]:
    return {r: (p.disposition, p.attempt) for r, p in plan.rollouts.items()}


def _components(store: ObjectStore, cid: str) -> dict[str, tuple[list[dict[str, Any]], dict[str, Any]]]:
    """Every component's records (as stored) and manifest extra, by kind/instance."""
    out = {}
    for component in load_checkpoint(store, cid).record.components:
        reader = ArchiveReader.open(store, component.prefix)
        out[f"{component.kind}/{component.instance}"] = (
            list(reader.iter_dicts()),
            dict(reader.manifest.extra),
        )
    return out


@pytest.fixture()
def dep() -> Iterator[Deployment]:
    store = memory_store("async")
    deployment = Deployment(store, token_source=FakeTokens(store))
    yield deployment
    deployment.close()


# -- as verifiable as a synchronous checkpoint -------------------------------------------------------


def test_async_checkpoint_verifies_and_classifies_exactly_like_a_sync_one(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    sync = dep.coordinator.checkpoint("ck-sync")
    handle = dep.coordinator.checkpoint_async("ck-async")
    outcome = handle.result(timeout=60)
    assert handle.done() and outcome.clean and outcome.publication == "async"
    assert outcome.record.sequence == sync.record.sequence + 1 and latest_id(dep.store) == "ck-async"
    assert outcome.pause_seconds == handle.pause_seconds <= outcome.timings["resume"] + outcome.pause_seconds
    for cid in ("ck-sync", "ck-async"):
        verify_checkpoint(dep.store, cid)
    plans = [load_checkpoint(dep.store, cid, verify=True) for cid in ("ck-sync", "ck-async")]
    assert all(p.verified for p in plans)
    assert _classes(plans[0]) == _classes(plans[1])
    assert _classes(plans[1])["cont"] == ("continue", 0) and _classes(plans[1])["done"][0] == "completed"
    # the same state gives the same component archives: same records, same manifest extra
    assert _components(dep.store, "ck-sync") == _components(dep.store, "ck-async")
    assert dep.all_open() and dep.registry.frozen_by is None


def test_async_checkpoint_of_reference_participants_restores(local_store: ObjectStore) -> None:
    world = RealWorld(local_store)
    cont = world.start("cont")
    world.turn(cont, "c1", 1)
    outcome = world.coordinator.checkpoint(publication="async")
    assert outcome.clean and outcome.publication == "async"
    world.close()
    plan = load_checkpoint(local_store, verify=True)
    assert plan.verified and plan.rollouts["cont"].disposition == "continue"
    second = RealWorld(local_store)
    restored = second.coordinator.restore(verify=True)
    second.coordinator.resume(restored.restore_id)
    boundary = second.agent.begin(ex("cont", 1))
    assert boundary is not None and boundary.last_model_call_id == "c1"
    assert second.resources.state(ex("cont", 1), "s") == ({"n": 1}, 1)
    second.close()


def _soon() -> float:
    """A deadline well ahead, within the 3600 s a participant accepts (``max_deadline_seconds``)."""
    return time.time() + 600


# -- fault injection at every step of an asynchronous cycle -------------------------------------------

_HEX = re.compile(r"[0-9a-f]{32}")


def _pattern(step: str) -> str:
    """A step name without the writer's random object names (shards, index streams)."""
    return _HEX.sub("*", step)


def _async_steps() -> list[str]:
    store = memory_store("async")
    dep = Deployment(store, token_source=FakeTokens(store))
    populate(dep, dep.coordinator.token_source)
    dep.coordinator.checkpoint("ck-baseline")
    steps: list[str] = []
    lock = threading.Lock()

    def record(step: str) -> None:
        with lock:
            steps.append(_pattern(step))

    dep.coordinator.fault_hook = record
    dep.coordinator.checkpoint("ck-async", publication="async")
    dep.close()
    return list(dict.fromkeys(steps))  # upload threads interleave: each step once, first seen


ASYNC_STEPS = _async_steps()
_FOREGROUND = ("freeze", "prepare:", "commit:", "registry_snapshot")


def test_the_async_step_list_covers_every_new_step() -> None:
    kinds = {s.split(":", 1)[0] for s in ASYNC_STEPS}
    assert {"registry_snapshot", "resume", "collect", "validate", "publish", "latest"} <= kinds
    # the resume ends the pause before anything is collected, validated or published
    last_resume = max(i for i, s in enumerate(ASYNC_STEPS) if s.startswith("resume:"))
    first_collect = min(i for i, s in enumerate(ASYNC_STEPS) if s.startswith("collect:"))
    assert last_resume < first_collect < ASYNC_STEPS.index("publish") < ASYNC_STEPS.index("latest")
    assert sum(s.endswith("/manifest.json") for s in ASYNC_STEPS) == 4


# sorted: the first-seen order varies with the upload threads, and every pytest-xdist worker must
# collect the same tests in the same order
@pytest.mark.parametrize(
    "step", sorted(ASYNC_STEPS), ids=[s.split("/")[-1][:40] for s in sorted(ASYNC_STEPS)]
)
def test_fault_at_every_async_step(step: str) -> None:
    store = memory_store("async")
    tokens = FakeTokens(store)
    dep = Deployment(store, token_source=tokens)
    populate(dep, dep.coordinator.token_source)
    dep.coordinator.checkpoint("ck-baseline")
    fired: list[str] = []

    def hook(name: str) -> None:
        if _pattern(name) == step and not fired:
            fired.append(name)
            raise InjectedFault(name)

    dep.coordinator.fault_hook = hook
    if step.startswith(("open_write:", "resume:")):
        # a failed index-stream open is rebuilt by the writer; a failed resume is retried
        outcome = dep.coordinator.checkpoint("ck-async", publication="async")
        assert outcome.clean
        assert published_ids(store) == ["ck-async", "ck-baseline"] and latest_id(store) == "ck-async"
        verify_checkpoint(store, "ck-async")
    elif step == "latest":
        outcome = dep.coordinator.checkpoint("ck-async", publication="async")
        assert not outcome.clean and latest_id(store) == "ck-baseline"
        assert published_ids(store) == ["ck-async", "ck-baseline"]
        verify_checkpoint(store, "ck-async")
    else:
        if step.startswith(_FOREGROUND):
            with pytest.raises(InjectedFault):
                dep.coordinator.checkpoint_async("ck-async")
        else:
            handle = dep.coordinator.checkpoint_async("ck-async")
            # the participants were resumed before the fault: they take work meanwhile
            with pytest.raises((InjectedFault, PublicationFailedError)) as info:
                handle.result(timeout=60)
            if isinstance(info.value, PublicationFailedError):  # a participant's upload failed
                assert "/components/" in step and info.value.details["cause"] == "internal_error"
        assert fired, step
        assert published_ids(store) == ["ck-baseline"] and latest_id(store) == "ck-baseline"
        assert load_checkpoint(store).checkpoint_id == "ck-baseline"
    # invariants: participants open, registry thawed, completed result kept; the next cycle works
    assert dep.all_open(), [p.status() for p in dep.participants]
    assert dep.registry.frozen_by is None
    assert [r.rollout_id for r in dep.registry.pending_results()] == ["done"]
    dep.coordinator.fault_hook = None
    after = dep.coordinator.checkpoint(publication="async")
    assert after.clean and latest_id(store) == after.checkpoint_id
    verify_checkpoint(store, after.checkpoint_id)
    dep.close()


# -- the upload runs after the resume --------------------------------------------------------------


class Gate:
    """A fault hook that holds every write matching ``match`` until released."""

    def __init__(self, match: str) -> None:
        self.match = match
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, step: str) -> None:
        if self.match in step and not self.release.is_set():
            self.reached.set()
            assert self.release.wait(60), "the test never released the upload"


def test_participants_work_while_the_upload_runs_and_later_state_does_not_leak(
    local_store: ObjectStore,
) -> None:
    world = RealWorld(local_store)
    cont = world.start("cont")
    world.turn(cont, "c1", 1)
    gate = Gate("/components/")  # every participant's upload is held
    world.coordinator.fault_hook = gate
    handle = world.coordinator.checkpoint_async("ck-frozen")
    assert gate.reached.wait(30)
    # the upload is held: every participant is back at work, the registry takes dispatches
    assert not handle.done()
    for participant in world.participants:
        status = participant.status()
        assert status.phase is Phase.IDLE and status.accepting, status
    assert world.agent.status().uploading == ("ck-frozen",)
    other = world.start("other")
    world.agent.start_turn(cont)
    world.turn(cont, "c2", 2)  # mutates agent, model and resources state after the freeze
    world.turn(other, "o1", 1)
    gate.release.set()
    outcome = handle.result(timeout=60)
    assert outcome.clean
    plan = load_checkpoint(local_store, "ck-frozen", verify=True)
    assert set(plan.rollouts) == {"cont"}  # "other" was dispatched after the freeze
    boundary = [
        d
        for d in _components(local_store, "ck-frozen")["agent/agent-0"][0]
        if d.get("kind") == "agent_boundary" or "boundary_index" in d
    ]
    assert [d["boundary_index"] for d in boundary] == [1]
    resources = _components(local_store, "ck-frozen")["resources/res-0"][0]
    assert [d.get("revision") for d in resources if "revision" in d] == [1]
    lineage = _components(local_store, "ck-frozen")["model/policy-0"][0]
    assert "c2" not in {d.get("call_id") for d in lineage}
    # and the next checkpoint holds the later state
    after = world.coordinator.checkpoint(publication="async")
    assert set(load_checkpoint(local_store, after.checkpoint_id).rollouts) == {"cont", "other"}
    world.close()


def test_a_new_checkpoint_waits_for_the_pending_publication(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    gate = Gate("/components/model/")
    dep.coordinator.fault_hook = gate
    first = dep.coordinator.checkpoint_async("ck-1")
    assert gate.reached.wait(30)
    results: dict[str, Any] = {}
    second = threading.Thread(
        target=lambda: results.update(two=dep.coordinator.checkpoint("ck-2", publication="async"))
    )
    second.start()
    # retire goes on during the upload (the snapshots are frozen); it does not change ck-1
    dep.coordinator.retire([ex("queued", 0)])
    assert not first.done() and "two" not in results
    gate.release.set()
    second.join(60)
    one = first.result(timeout=60)
    two = results["two"]
    assert two.record.sequence == one.record.sequence + 1 and latest_id(dep.store) == "ck-2"
    assert load_checkpoint(dep.store, "ck-1").rollouts["queued"].disposition == "fresh_dispatch"
    assert "queued" not in load_checkpoint(dep.store, "ck-2").rollouts
    dep.coordinator.wait_until_finished()


def test_restore_and_forget_wait_for_the_pending_publication(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    gate = Gate("/components/resources/")
    dep.coordinator.fault_hook = gate
    handle = dep.coordinator.checkpoint_async("ck-pending")
    assert gate.reached.wait(30)
    done: list[str] = []
    forget = threading.Thread(target=lambda: (dep.coordinator.forget(["done"]), done.append("forget")))
    forget.start()
    assert not handle.done() and not done
    gate.release.set()
    forget.join(60)
    assert done == ["forget"] and handle.result(timeout=60).clean
    # the pending checkpoint still lists what was forgotten after its freeze
    assert load_checkpoint(dep.store, "ck-pending", verify=True).rollouts["done"].disposition == "completed"
    fresh = Deployment(dep.store, token_source=dep.coordinator.token_source)
    assert fresh.coordinator.restore().source_checkpoint_id == "ck-pending"
    fresh.close()


# -- participant-level rules: waiting, fencing, lease, deadline, idempotency -----------------------


class SlowAgent(ScriptedParticipant):
    """An agent whose upload is held at its first fencing check until released."""

    def __init__(self, clock: Clock | None = None, grace: float = 5.0) -> None:
        super().__init__("agent", "agent-0", lease_grace_seconds=grace, clock=clock)
        self.reached = threading.Event()
        self.release = threading.Event()
        self.add(
            AgentBoundaryRecord(
                rollout_id="r",
                attempt=0,
                boundary_index=1,
                turn_index=1,
                resource_revisions={},
                agent_state=b"x",
            )
        )

    def _check_still_active(self, checkpoint_id: str, generation: int, deadline: float, op: str) -> None:
        if op == "commit" and not self.reached.is_set():
            self.reached.set()
            assert self.release.wait(60), "the test never released the upload"
        super()._check_still_active(checkpoint_id, generation, deadline, op)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _manifests(store: ObjectStore, cid: str) -> list[str]:
    return [i.key for i in store.list(layout.checkpoint_prefix(cid) + "/") if i.key.endswith("manifest.json")]


def test_participant_async_commit_is_idempotent_and_collect_too() -> None:
    store = memory_store("async")
    agent = SlowAgent()
    agent.release.set()
    agent.prepare("ck-a", _soon())
    frozen = agent.commit("ck-a", store, _soon(), publication="async")
    assert frozen.phase is Phase.FROZEN and frozen.manifest_key is None
    assert agent.commit("ck-a", store, _soon(), publication="async") == frozen  # lost answer repeated
    with pytest.raises(InvalidPhaseError):
        agent.commit("ck-a", store, _soon())  # the other mode
    agent.resume("ck-a", _soon())
    committed = agent.collect("ck-a", _soon())
    assert committed.phase is Phase.COMMITTED and committed.executions == frozen.executions
    assert agent.collect("ck-a", _soon()) == committed
    assert len(_manifests(store, "ck-a")) == 1
    with pytest.raises(PublicationUnknownError):
        agent.collect("ck-never", _soon())
    with pytest.raises(ValueError):
        CommitReply(
            checkpoint_id="x", phase=Phase.COMMITTED, kind="agent", instance="a", incarnation="0" * 32
        )
    agent.close()


def test_next_commit_waits_for_the_previous_upload() -> None:
    store = memory_store("async")
    agent = SlowAgent()
    agent.prepare("ck-1", time.time() + 60)
    agent.commit("ck-1", store, time.time() + 60, publication="async")
    agent.resume("ck-1", time.time() + 60)
    assert agent.reached.wait(30)
    assert agent.status().uploading == ("ck-1",) and agent.accepting
    agent.prepare("ck-2", time.time() + 60)  # a prepare does not wait: admission closes at once
    assert not agent.accepting
    with pytest.raises(DeadlineExceededError, match="still runs"):
        agent.commit("ck-2", store, time.time() + 1.0, publication="async")
    assert agent.phase is Phase.PREPARED  # nothing was exported
    agent.release.set()
    assert agent.collect("ck-1", time.time() + 30).phase is Phase.COMMITTED
    assert agent.commit("ck-2", store, time.time() + 60, publication="async").phase is Phase.FROZEN
    agent.resume("ck-2", time.time() + 60)
    assert agent.collect("ck-2", time.time() + 30).phase is Phase.COMMITTED
    agent.close()


def test_deadline_passing_during_the_upload_writes_no_manifest() -> None:
    clock = Clock()
    store = memory_store("async")
    agent = SlowAgent(clock)
    agent.prepare("ck-late", clock.now + 10)
    agent.commit("ck-late", store, clock.now + 10, publication="async")
    agent.resume("ck-late", clock.now + 10)
    assert agent.reached.wait(30)
    clock.now += 11
    agent.release.set()
    with pytest.raises(PublicationFailedError) as info:
        agent.collect("ck-late", clock.now + 30)
    assert info.value.details["cause"] == "deadline_exceeded"
    assert _manifests(store, "ck-late") == []
    agent.close()


def test_lease_expiry_before_the_resume_cancels_the_upload() -> None:
    clock = Clock()
    store = memory_store("async")
    agent = SlowAgent(clock, grace=5.0)
    agent.release.set()
    agent.prepare("ck-lost", clock.now + 10)
    agent.commit("ck-lost", store, clock.now + 10, publication="async")
    assert agent.status().uploading == ("ck-lost",)  # registered, waiting for the resume
    clock.now += 16  # past the lease (deadline + grace): the coordinator vanished before resuming
    status = agent.status()
    assert status.phase is Phase.IDLE and status.accepting and agent.events["lease_expired"] == 1
    assert status.uploading == ()
    with pytest.raises(PublicationFailedError) as info:
        agent.collect("ck-lost", clock.now + 30)
    assert info.value.details["cause"] == "stale_checkpoint"
    assert not agent.reached.is_set()  # the upload never started: nothing was encoded or written
    assert store.list(layout.checkpoint_prefix("ck-lost") + "/") == []
    agent.close()


def test_collect_alone_never_starts_the_upload() -> None:
    """The upload starts only at the resume: collect alone waits (until its deadline)."""
    store = memory_store("async")
    agent = SlowAgent()
    agent.release.set()
    agent.prepare("ck-wait", time.time() + 60)
    agent.commit("ck-wait", store, time.time() + 60, publication="async")
    with pytest.raises(DeadlineExceededError):
        agent.collect("ck-wait", time.time() + 0.2)
    assert not agent.reached.is_set() and agent.phase is Phase.FROZEN
    agent.resume("ck-wait", time.time() + 60)
    assert agent.collect("ck-wait", time.time() + 30).phase is Phase.COMMITTED
    agent.close()


def test_a_resume_does_not_cancel_the_upload() -> None:
    store = memory_store("async")
    agent = SlowAgent()
    agent.prepare("ck-r", _soon())
    agent.commit("ck-r", store, _soon(), publication="async")
    agent.resume("ck-r", _soon())
    assert agent.resume("ck-r", _soon()).idempotent
    agent.release.set()
    assert agent.collect("ck-r", _soon()).phase is Phase.COMMITTED
    assert len(_manifests(store, "ck-r")) == 1
    agent.close()


def test_deadline_passing_during_the_background_publication_publishes_nothing(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    dep.coordinator.checkpoint("ck-baseline")
    offset = [0.0]
    dep.coordinator.clock = lambda: time.time() + offset[0]

    def hook(step: str) -> None:
        if step == "collect:resources/res-0":
            offset[0] = 120.0

    dep.coordinator.fault_hook = hook
    handle = dep.coordinator.checkpoint_async("ck-late", deadline_s=60)
    with pytest.raises(DeadlineExceededError):
        handle.result(timeout=60)
    assert published_ids(dep.store) == ["ck-baseline"] and dep.all_open()


class LossyParticipant:
    """Applies each listed operation, then loses its answer once (a transport failure)."""

    def __init__(self, inner: ScriptedParticipant, lose: set[str]) -> None:
        self.inner = inner
        self.lose = set(lose)
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if name not in ("prepare", "commit", "resume", "collect"):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            result = target(*args, **kwargs)
            if name in self.lose:
                self.lose.discard(name)
                raise ConnectionError(f"answer of {name} lost")
            return result

        return call


def test_lost_answers_of_every_async_step_are_retried(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    lossy = LossyParticipant(dep.agent, {"prepare", "commit", "resume", "collect"})
    proxy: Any = lossy
    participants: list[ParticipantControl] = [proxy, dep.model, dep.resources]
    coordinator = Coordinator(
        dep.store, participants, dep.registry, dep.coordinator.token_source, run_id="test-run"
    )
    outcome = coordinator.checkpoint(publication="async")
    assert outcome.clean and lossy.calls == {"prepare": 2, "commit": 2, "resume": 2, "collect": 2}
    prefix = layout.component_prefix(outcome.checkpoint_id, "agent", "agent-0")
    assert len(dep.store.list(prefix)) == 3  # exported and uploaded once
    assert dep.all_open()
    verify_checkpoint(dep.store, outcome.checkpoint_id)


def test_a_participant_without_async_support_is_refused_before_anything(dep: Deployment) -> None:
    class SyncOnly:
        def __init__(self, inner: ScriptedParticipant) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "collect":
                raise AttributeError(name)
            return getattr(self.inner, name)

    proxy: Any = SyncOnly(dep.agent)
    coordinator = Coordinator(dep.store, [proxy, dep.model], dep.registry, run_id="test-run")
    with pytest.raises(ValueError, match="collect"):
        coordinator.checkpoint_async()
    assert dep.all_open() and published_ids(dep.store) == []
    assert coordinator.checkpoint().clean  # sync still works


# -- the wire: the commit's publication field and the collect route ---------------------------------


def test_the_wire_freezes_collects_and_refuses_with_stable_codes() -> None:
    import httpx

    from _http import served
    from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX, RemoteParticipant, control_app

    store = memory_store("async")
    agent = SlowAgent()
    agent.release.set()
    auth = {"Authorization": "Bearer tok-wire-0123456789"}
    with served(control_app(agent, token="tok-wire-0123456789", store=store)) as url:
        remote = RemoteParticipant(url, token="tok-wire-0123456789")
        deadline = time.time() + 60
        body: dict[str, Any] = {"checkpoint_id": "ck-w", "deadline_ts": deadline, "publication": "later"}
        bad = httpx.post(f"{url}{CHECKPOINT_ROUTE_PREFIX}/commit", json=body, headers=auth)
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
        unauthorized = httpx.post(f"{url}{CHECKPOINT_ROUTE_PREFIX}/collect", json=body)
        assert unauthorized.status_code == 401
        remote.prepare("ck-w", deadline)
        frozen = remote.commit("ck-w", store, deadline, publication="async")
        assert frozen.phase is Phase.FROZEN and frozen.manifest_key is None
        assert remote.status().phase is Phase.FROZEN
        remote.resume("ck-w", deadline)
        committed = remote.collect("ck-w", deadline)
        assert committed.phase is Phase.COMMITTED and remote.collect("ck-w", deadline) == committed
        assert len(_manifests(store, "ck-w")) == 1
        with pytest.raises(PublicationUnknownError):
            remote.collect("ck-other", deadline)
        unknown = httpx.post(
            f"{url}{CHECKPOINT_ROUTE_PREFIX}/collect",
            json={"checkpoint_id": "ck-other", "deadline_ts": deadline},
            headers=auth,
        )
        assert unknown.status_code == 409 and unknown.json()["error"]["code"] == "publication_unknown"
        remote.close()
    agent.close()


def test_a_sync_only_participant_behind_the_router_refuses_async() -> None:
    import httpx

    from _http import served
    from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX, control_app

    class SyncOnly:
        def __init__(self, inner: ScriptedParticipant) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "collect":
                raise AttributeError(name)
            return getattr(self.inner, name)

    agent = _agent_with_record()
    proxy: Any = SyncOnly(agent)
    with served(control_app(proxy, token="tok-wire-0123456789", store=memory_store("async"))) as url:
        auth = {"Authorization": "Bearer tok-wire-0123456789"}
        body = {"checkpoint_id": "ck-s", "deadline_ts": time.time() + 60}
        refused = httpx.post(f"{url}{CHECKPOINT_ROUTE_PREFIX}/collect", json=body, headers=auth)
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "unsupported_operation"
    agent.close()


def _agent_with_record() -> ScriptedParticipant:
    agent = SlowAgent()
    agent.release.set()
    return agent


def test_an_upload_never_resumed_ends_at_its_deadline() -> None:
    """A holder without a lease (a worker group) does not wait forever for a resume that never
    comes: the registered upload ends at its deadline, unstarted."""
    from rollout_checkpoint.protocol._publication import Uploads

    clock = Clock()
    uploads = Uploads("group", clock)
    started: list[str] = []

    def work(_: Any) -> CommitReply:
        started.append("yes")
        raise AssertionError("never launched")

    uploads.register("ck-orphan", 0, clock.now + 10, work)
    assert uploads.running() == ("ck-orphan",)
    with pytest.raises(DeadlineExceededError):
        uploads.wait_others("ck-next", clock.now)  # busy: refused at once at this deadline
    clock.now += 11
    assert uploads.running() == ()
    uploads.wait_others("ck-next", clock.now + 5)  # nothing runs any more
    with pytest.raises(PublicationFailedError) as info:
        uploads.collect("ck-orphan", clock.now + 5)
    assert info.value.details["cause"] == "deadline_exceeded"
    uploads.launch("ck-orphan")  # a late resume starts nothing
    assert started == []
