"""A restore that is refused or fails changes nothing (issue 18, items 1-3).

Every refusal path of ``Coordinator.restore`` (live executions, another restore or checkpoint
active, a missing participant, a checkpoint that fails verification, an expired deadline, a
participant that fails after installing) with each participant kind (model, agent, resources)
as the one that refuses, in process and over HTTP: afterwards every participant (status,
tombstones, live executions), the registry and the store are exactly as before, every live
attempt still works, the next checkpoint classifies it as before, and the same checkpoint can
be restored into the same participants once the cause is gone.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _http import served
from _reference_world import RealWorld
from rollout_checkpoint.coordinator import Coordinator, MissingParticipantError, RestoreFailedError
from rollout_checkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointRejectedError,
    InvalidRecordError,
)
from rollout_checkpoint.format import layout
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.protocol import ParticipantControl, Phase, RestoreReply
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.server import RemoteParticipant, control_app
from rollout_checkpoint.store import LocalStore, ObjectStore

TOKEN = "tok-restore-refusals"
KINDS = ["model", "agent", "resources"]
TRANSPORTS = ["in-process", "http"]


class InstallsThenFails:
    """A participant whose restore installs and then reports a failure (its answer was an
    error although the work was done): the coordinator must undo what it installed."""

    def __init__(self, inner: ParticipantControl) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def restore(self, *args: Any) -> RestoreReply:
        self.inner.restore(*args)
        raise InvalidRecordError("the participant failed after installing its share")


class Rig:
    """One deployment of the reference participants, driven in process or over HTTP."""

    def __init__(self, world: RealWorld, controls: list[ParticipantControl], store: ObjectStore) -> None:
        self.world, self.controls, self.store = world, controls, store

    def coordinator(
        self, *, skip: str | None = None, wrap: str | None = None, fault_hook: Any = None
    ) -> Coordinator:
        controls = []
        for participant, control in zip(self.world.participants, self.controls, strict=True):
            if participant.kind == skip:
                continue
            controls.append(InstallsThenFails(control) if participant.kind == wrap else control)
        return Coordinator(
            self.store,
            controls,
            self.world.registry,
            self.world.tokens,
            fault_hook=fault_hook,
            run_id="test-run",
            takeover=True,  # the source checkpoint is another run's (its participants are gone)
        )

    def fingerprint(self) -> object:
        """Everything a refused restore must leave as it was."""
        world = self.world
        participants = [
            (p.status().model_dump(), p.fence.snapshot(), sorted(p.status().model_dump().items()))
            for p in world.participants
        ]
        live = [dict(p._live) for p in world.participants]
        registry = [(i.execution, i.state) for i in world.registry.executions()]
        # aside from owner epochs: a new coordinator takes one when it starts (its first checkpoint
        # or restore), whatever the outcome; it is the coordinator starting, not the restore
        keys = sorted(i.key for i in self.store.list("") if not i.key.startswith("owner/"))
        return participants, live, registry, keys


@contextlib.contextmanager
def rig(store: ObjectStore, transport: str) -> Iterator[Rig]:
    world = RealWorld(store)
    try:
        if transport == "in-process":
            yield Rig(world, list(world.participants), store)
            return
        with contextlib.ExitStack() as stack:
            controls: list[ParticipantControl] = []
            for participant in world.participants:
                url = stack.enter_context(served(control_app(participant, token=TOKEN, store=store)))
                controls.append(stack.enter_context(RemoteParticipant(url, token=TOKEN)))
            yield Rig(world, controls, store)
    finally:
        world.close()


@pytest.fixture()
def source(tmp_path: Path) -> tuple[LocalStore, str]:
    """A published checkpoint with a rollout to continue (``r#0``) and one never started."""
    store = LocalStore(tmp_path / "store")
    world = RealWorld(store)
    # an earlier run: the rig's participants are new, so they are not this run's (a checkpoint
    # of the same run would refuse them as restarted until a restore)
    world.coordinator = Coordinator(
        store, world.participants, world.registry, world.tokens, run_id="source-run"
    )
    run = world.start("r")
    world.turn(run, "c1", 1)
    world.registry.dispatch("q", input_digest="q")
    cid = world.coordinator.checkpoint().checkpoint_id
    world.close()
    return store, cid


def _make_live(world: RealWorld, kind: str, rollout_id: str) -> ExecutionId:
    """A running execution that only ``kind`` holds (so earlier stages install first)."""
    execution = world.registry.dispatch(rollout_id, input_digest=rollout_id)
    world.registry.start(execution)
    if kind == "agent":
        world.agent.begin(execution)
        world.agent.boundary(execution, _boundary(execution, 0))
    elif kind == "resources":
        world.resources.open_session(execution, "s", {"n": 0})
    else:
        with world.model.call(execution, "x1", policy_version="v1") as call:
            call.stage(prompt_token_ids=[1], generation_token_ids=[2], generation_log_probs=[-0.1])
    return execution


def _boundary(execution: ExecutionId, index: int) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=execution.rollout_id, attempt=execution.attempt, boundary_index=index, turn_index=index
    )


def _still_works(world: RealWorld, kind: str, execution: ExecutionId) -> None:
    if kind == "agent":
        world.agent.start_turn(execution)
        world.agent.boundary(execution, _boundary(execution, 1))
    elif kind == "resources":
        world.resources.mutate(execution, "s", lambda s: {"n": s["n"] + 1})
    else:
        with world.model.call(execution, "x2", policy_version="v1") as call:
            call.stage(prompt_token_ids=[1], generation_token_ids=[3], generation_log_probs=[-0.1])


def _dispositions(store: ObjectStore, cid: str) -> dict[str, tuple[int, str, str]]:
    plan = load_checkpoint(store, cid)
    return {r: (p.attempt, p.disposition, p.reason) for r, p in plan.rollouts.items()}


def _restores_after(rig_: Rig, cid: str, coordinator: Coordinator | None = None) -> None:
    """Once the cause is gone the same participants take the same checkpoint (item 3)."""
    coordinator = coordinator or rig_.coordinator()
    outcome = coordinator.restore(cid)
    assert all(p.status().phase is Phase.RESTORED for p in rig_.world.participants)
    coordinator.resume(outcome.restore_id)
    nxt = ExecutionId(rollout_id="r", attempt=1)
    world = rig_.world
    assert world.agent.begin(nxt) is not None
    world.agent.start_turn(nxt)
    world.turn(nxt, "c9", 2)  # model, resources and agent all take the restored attempt
    assert world.registry.get("q").state == "queued"


def _refused(
    rig_: Rig, coordinator: Coordinator, cid: str, expected: type[CheckpointError], **kwargs: Any
) -> CheckpointError:
    before = rig_.fingerprint()
    with pytest.raises(expected) as info:
        coordinator.restore(cid, **kwargs)
    assert rig_.fingerprint() == before, "a refused restore changed something"
    return info.value


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", KINDS)
def test_live_executions_refuse_and_stay_live(
    source: tuple[LocalStore, str], kind: str, transport: str
) -> None:
    store, cid = source
    with rig(store, transport) as r:
        live = _make_live(r.world, kind, "live")
        checked = r.coordinator().checkpoint(deadline_s=10).checkpoint_id
        expected = _dispositions(store, checked)
        error = _refused(r, r.coordinator(), cid, RestoreFailedError)
        assert error.details["cause"] == "invalid_phase" and "live executions" in error.message
        _still_works(r.world, kind, live)
        again = r.coordinator().checkpoint(deadline_s=10).checkpoint_id
        assert _dispositions(store, again) == expected
        r.coordinator().retire([live])  # the framework retires its live work, then restores
        _restores_after(r, cid)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", KINDS)
def test_another_active_checkpoint_refuses(source: tuple[LocalStore, str], kind: str, transport: str) -> None:
    store, cid = source
    with rig(store, transport) as r:
        participant = next(p for p in r.world.participants if p.kind == kind)
        participant.prepare("ckpt-other", time.time() + 60)
        _refused(r, r.coordinator(), cid, RestoreFailedError)
        assert participant.status().checkpoint_id == "ckpt-other"
        participant.resume("ckpt-other", time.time() + 60)
        _restores_after(r, cid)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_second_restore_leaves_the_first_intact(source: tuple[LocalStore, str], transport: str) -> None:
    store, cid = source
    with rig(store, transport) as r:
        coordinator = r.coordinator()
        first = coordinator.restore(cid)
        before = r.fingerprint()
        with pytest.raises(RestoreFailedError, match="is active here"):
            coordinator.restore(cid)
        assert r.fingerprint() == before
        coordinator.resume(first.restore_id)
        nxt = ExecutionId(rollout_id="r", attempt=1)
        assert r.world.agent.begin(nxt) is not None
        r.world.agent.start_turn(nxt)
        r.world.turn(nxt, "c9", 2)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", KINDS)
def test_missing_participant_refuses_before_touching(
    source: tuple[LocalStore, str], kind: str, transport: str
) -> None:
    store, cid = source
    with rig(store, transport) as r:
        live = r.world.start("y")  # live everywhere: untouched
        error = _refused(r, r.coordinator(skip=kind), cid, MissingParticipantError)
        assert error.code == "missing_participant" and kind in error.message
        r.world.turn(live, "y1", 1)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", KINDS)
def test_verify_failure_refuses_before_touching(
    source: tuple[LocalStore, str], kind: str, transport: str
) -> None:
    store, cid = source
    instance = {"model": "policy-0", "agent": "agent-0", "resources": "res-0"}[kind]
    prefix = layout.component_prefix(cid, kind, instance) + "/shards/"
    shard = next(i.key for i in store.list(prefix))
    original = store.get(shard)
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0xFF
    store.put(shard, bytes(damaged))
    with rig(store, transport) as r:
        live = r.world.start("y")
        error = _refused(r, r.coordinator(), cid, CheckpointRejectedError, verify=True)
        assert "verification" in error.message
        r.world.turn(live, "y1", 1)
        store.put(shard, original)  # repaired: the same checkpoint restores
        r.coordinator().retire([live])
        _restores_after(r, cid)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", KINDS)
def test_deadline_at_a_later_stage_undoes_earlier_ones(
    source: tuple[LocalStore, str], kind: str, transport: str
) -> None:
    store, cid = source
    with rig(store, transport) as r:

        def slow(step: str) -> None:
            if step.startswith(f"restore:{kind}/"):
                time.sleep(1.2)

        error = _refused(r, r.coordinator(fault_hook=slow), cid, RestoreFailedError, deadline_s=1.0)
        assert error.details["cause"] == "deadline_exceeded"
        _restores_after(r, cid)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", KINDS)
def test_participant_failing_after_install_is_undone(
    source: tuple[LocalStore, str], kind: str, transport: str
) -> None:
    store, cid = source
    with rig(store, transport) as r:
        error = _refused(r, r.coordinator(wrap=kind), cid, RestoreFailedError)
        assert error.details["cause"] == "invalid_record"
        _restores_after(r, cid)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_failure_after_every_participant_installed_is_undone(
    source: tuple[LocalStore, str], transport: str
) -> None:
    """The fencing step (retire attempt N where it was not restored) fails: every participant
    had installed; all of it is undone."""
    store, cid = source
    with rig(store, transport) as r:

        def fail(step: str) -> None:
            if step.startswith("retire:"):
                raise InvalidRecordError("the fencing step failed")

        _refused(r, r.coordinator(fault_hook=fail), cid, RestoreFailedError)
        _restores_after(r, cid)


def test_a_removed_record_leaves_nothing_published(source: tuple[LocalStore, str]) -> None:
    """D6: checkpoint, crash, ``published/<id>.json`` removed: its sequence claim cannot be told
    from an interrupted publish, so nothing is published; restore says so and touches nothing."""
    store, cid = source
    store.delete(layout.published_key(cid))
    with rig(store, "in-process") as r:
        before = r.fingerprint()
        with pytest.raises(CheckpointNotFoundError) as info:
            r.coordinator().restore(verify=True, fallback=True)
        assert f"claimed by {cid} but no published record" in info.value.message
        assert r.fingerprint() == before
