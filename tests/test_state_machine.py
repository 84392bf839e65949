"""A hypothesis state machine over the whole protocol with the reference participants.

Rules: start, step (one agent turn: a staged model call, a resources mutation, a boundary),
finish, hand off (and consume), checkpoint, crash (drop every in-memory participant), restore
(with verification and fallback), retire, forget, lose or damage ``latest.json`` (delete it,
write garbage, move it back to an older checkpoint), and damage a published object (flip a
byte, truncate or delete any object one checkpoint owns: record, aggregate, manifests,
indexes, shards, token snapshot). Invariants after every step: participants are open whenever
no checkpoint is running; a retired attempt is refused everywhere (also after a restore from a
checkpoint that committed its tombstone, until the rollout is forgotten); every undamaged
published checkpoint verifies, and in it completed and continued rollouts are disjoint and,
with fresh dispatches, cover exactly the dispatched ones; and a reader never resumes from any
checkpoint other than the newest one that verifies (without fallback it refuses a damaged
newest one instead of stepping back).
"""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from _reference_world import RealWorld
from rollout_checkpoint import layout
from rollout_checkpoint.control import Phase
from rollout_checkpoint.errors import CheckpointNotFoundError, CheckpointRejectedError, StaleAttemptError
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.published import list_published
from rollout_checkpoint.recovery import load_checkpoint, verify_checkpoint
from rollout_checkpoint.store import MemoryStore

ROLLOUTS = [f"r{i}" for i in range(5)]
SESSION = "s"


class World(RealWorld):
    """The reference deployment plus the number of turns each rollout has taken."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.turns: dict[str, int] = {}


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore(f"sm-{uuid.uuid4().hex}")
        self.world = World(self.store)
        self.crashed = False
        self.retired: set[ExecutionId] = set()
        # what had been retired when each checkpoint was published: its tombstones are committed
        # and must be refused again after a restore from it, until forgotten
        self.retired_at: dict[str, set[ExecutionId]] = {}
        self.calls = 0
        self.order: list[str] = []  # checkpoint ids in publish order (the model of the log)
        self.damaged: set[str] = set()  # checkpoints with an object damaged or removed
        self.pointers: dict[str, bytes] = {}  # latest.json as it was right after each publish

    def teardown(self) -> None:
        self.world.close()

    # -- helpers ------------------------------------------------------------------------------
    def _entries(self, *states: str) -> list[Any]:
        return self.world.registry.executions(states)

    def _published(self) -> list[str]:
        return [p.checkpoint_id for p in list_published(self.store)]

    # -- rules --------------------------------------------------------------------------------
    @precondition(lambda self: not self.crashed)
    @rule(rollout=st.sampled_from(ROLLOUTS), restart_only=st.booleans())
    def start(self, rollout: str, restart_only: bool) -> None:
        """Dispatch (or pick up a queued fresh dispatch) and run the first turn to a boundary."""
        world = self.world
        if rollout in world.registry:
            info = world.registry.get(rollout)
            if info.state != "queued":
                return
            execution = info.execution
        else:
            execution = world.registry.dispatch(rollout, input_digest=rollout, restart_only=restart_only)
        world.registry.start(execution)
        world.agent.begin(execution)
        world.resources.open_session(execution, SESSION, {"n": 0})
        world.turns[rollout] = 0
        self._turn(execution)

    def _turn(self, execution: ExecutionId) -> None:
        world = self.world
        self.calls += 1
        call_id = f"c{self.calls}"
        index = world.turns.get(execution.rollout_id, 0) + 1
        world.turns[execution.rollout_id] = index
        world.turn(execution, call_id, index)  # model call, resources mutation, agent boundary

    @precondition(lambda self: not self.crashed)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        running = self._entries("running")
        if not running:
            return
        info = data.draw(st.sampled_from(running))
        world = self.world
        execution = info.execution
        if world.agent.latest_boundary(execution) is None:
            return
        world.agent.start_turn(execution)
        self._turn(execution)

    @precondition(lambda self: not self.crashed)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        running = self._entries("running")
        if not running:
            return
        execution = data.draw(st.sampled_from(running)).execution
        world = self.world
        world.agent.finish(execution)
        world.model.finish(execution)
        world.resources.end_session(execution, SESSION)
        world.registry.finish(execution)

    @precondition(lambda self: not self.crashed)
    @rule(data=st.data(), consume=st.booleans())
    def hand_off(self, data: st.DataObject, consume: bool) -> None:
        finished = self._entries("finished")
        if not finished:
            return
        execution = data.draw(st.sampled_from(finished)).execution
        self.world.registry.hand_off(execution, {"rollout": execution.rollout_id}, reward=1.0)
        if consume:
            self.world.registry.consume(execution)

    @precondition(lambda self: not self.crashed)
    @rule()
    def checkpoint(self) -> None:
        world = self.world
        expected = {e.rollout_id: e for e in world.registry.executions()}
        outcome = world.coordinator.checkpoint()
        assert outcome.clean and outcome.latest_moved  # a lost or damaged pointer never blocks
        # the sequence counts every publish, whatever happened to latest.json meanwhile
        assert outcome.record.sequence == len(self.order) + 1
        self.order.append(outcome.checkpoint_id)
        self.pointers[outcome.checkpoint_id] = self.store.get(layout.LATEST_KEY)
        self.retired_at[outcome.checkpoint_id] = set(self.retired)
        plan = load_checkpoint(self.store, outcome.checkpoint_id)
        assert set(plan.rollouts) == set(expected)
        for rollout_id, item in plan.rollouts.items():
            info = expected[rollout_id]
            assert item.attempt == info.attempt
            if info.state in ("handed_off", "consumed"):
                assert item.disposition == "completed"
            elif info.state == "queued" or info.restart_only:
                assert item.disposition == "fresh_dispatch"
            elif info.state == "running" and world.agent.latest_boundary(info.execution) is not None:
                assert item.disposition == "continue", item.reason
            else:
                assert item.disposition == "fresh_dispatch", item.reason

    @rule()
    def crash(self) -> None:
        """Every in-memory participant, the registry and the coordinator are gone."""
        self.world.close()
        self.world = World(self.store)
        self.crashed = bool(self._published())
        self.retired = set()

    @precondition(lambda self: self.crashed)
    @rule()
    def restore(self) -> None:
        world = self.world
        intact = [c for c in self.order if c not in self.damaged]
        if not intact:
            try:
                world.coordinator.restore(verify=True, fallback=True)
            except CheckpointRejectedError:
                self.crashed = False  # nothing to resume from: the framework starts afresh
                return
            raise AssertionError("restored although every published checkpoint is damaged")
        outcome = world.coordinator.restore(verify=True, fallback=True)
        assert outcome.source_checkpoint_id == intact[-1]
        assert all(p.status().phase is Phase.RESTORED for p in world.participants)
        world.coordinator.resume(outcome.restore_id)
        self.crashed = False
        self.retired = set(self.retired_at[outcome.source_checkpoint_id])
        for item in outcome.plan.rollouts.values():
            if item.disposition != "completed":
                self.retired.add(item.execution)
            if item.disposition == "continue":
                nxt = item.execution.next_attempt()
                boundary = world.agent.begin(nxt)
                assert boundary is not None and boundary.attempt == nxt.attempt
                world.turns[item.rollout_id] = boundary.boundary_index

    @precondition(lambda self: not self.crashed)
    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        live = self._entries("queued", "running", "finished")
        if not live:
            return
        execution = data.draw(st.sampled_from(live)).execution
        self.world.coordinator.retire([execution])
        self.retired.add(execution)

    @precondition(lambda self: not self.crashed)
    @rule(rollout=st.sampled_from(ROLLOUTS))
    def forget(self, rollout: str) -> None:
        registry = self.world.registry
        if rollout in registry and registry.get(rollout).state != "consumed":
            return  # only rollouts that are done for good (or only retired) are forgotten
        self.world.coordinator.forget([rollout])
        self.retired = {e for e in self.retired if e.rollout_id != rollout}

    @precondition(lambda self: bool(self.order))
    @rule(how=st.sampled_from(["delete", "garbage", "stale"]), data=st.data())
    def lose_or_damage_latest(self, how: str, data: st.DataObject) -> None:
        if how == "delete":
            self.store.delete(layout.LATEST_KEY)
        elif how == "garbage":
            self.store.put(layout.LATEST_KEY, b"garbage{\n")
        else:
            older = data.draw(st.sampled_from(self.order))
            self.store.put(layout.LATEST_KEY, self.pointers[older])

    @precondition(lambda self: bool(set(self.order) - self.damaged))
    @rule(
        data=st.data(),
        how=st.sampled_from(["flip", "truncate", "delete"]),
        where=st.floats(0.0, 1.0, exclude_max=True),  # a fraction: object sizes vary between runs
    )
    def damage_published_object(self, data: st.DataObject, how: str, where: float) -> None:
        cid = data.draw(st.sampled_from(sorted(set(self.order) - self.damaged)))
        keys = [i.key for i in self.store.list(layout.checkpoint_prefix(cid) + "/")]
        keys.append(layout.published_key(cid))
        if self.store.exists(f"{layout.TOKENS_PREFIX}/snapshots/{cid}.json"):
            keys.append(f"{layout.TOKENS_PREFIX}/snapshots/{cid}.json")
        key = data.draw(st.sampled_from(sorted(keys)))
        if how == "delete":
            self.store.delete(key)
        else:
            body = bytearray(self.store.get(key))
            at = int(where * len(body))
            if how == "flip":
                body[at] ^= 0x01
            else:
                del body[at:]
            self.store.put(key, bytes(body))
        self.damaged.add(cid)

    # -- invariants ---------------------------------------------------------------------------------
    @invariant()
    def readers_resume_from_the_newest_checkpoint_that_verifies(self) -> None:
        intact = [c for c in self.order if c not in self.damaged]
        if not self.order:
            return
        try:
            plan = load_checkpoint(self.store, verify=True, fallback=True)
        except (CheckpointRejectedError, CheckpointNotFoundError):
            assert not intact, "a reader refused although an intact checkpoint exists"
        else:
            assert intact and plan.checkpoint_id == intact[-1], (plan.checkpoint_id, intact)
            assert [s.checkpoint_id for s in plan.skipped] == [
                c
                for c in self.order[self.order.index(intact[-1]) + 1 :]
                if self.store.exists(layout.published_key(c))
            ]
        # without fallback a reader takes the newest published checkpoint or refuses: never an older one
        newest = next((c for c in reversed(self.order) if self.store.exists(layout.published_key(c))), None)
        try:
            plain = load_checkpoint(self.store, verify=True)
        except (CheckpointRejectedError, CheckpointNotFoundError):
            assert newest is None or newest in self.damaged
        else:
            assert plain.checkpoint_id == newest and newest not in self.damaged

    @invariant()
    def participants_open_when_no_checkpoint_runs(self) -> None:
        for participant in self.world.participants:
            status = participant.status()
            assert status.accepting and status.phase is Phase.IDLE, status

    @invariant()
    def retired_attempts_are_refused_everywhere(self) -> None:
        world = self.world
        for execution in self.retired:
            for participant in world.participants:
                assert participant.fence.is_retired(execution), (participant.kind, execution)
            # and the public entry points of every server refuse it
            for attempt in (
                lambda e=execution: world.agent.begin(e),
                lambda e=execution: world.resources.open_session(e, "probe", {"n": 0}),
                lambda e=execution: world.model.admit(e, "probe", policy_version="v1"),
            ):
                try:
                    attempt()
                except StaleAttemptError:
                    pass
                else:
                    raise AssertionError(f"a participant admitted retired {execution}")
            try:
                world.registry.check(execution)
            except StaleAttemptError:
                pass
            else:
                raise AssertionError(f"registry accepts retired {execution}")

    @invariant()
    def every_undamaged_published_checkpoint_verifies(self) -> None:
        for cid in self._published():
            if cid in self.damaged:
                continue
            report = verify_checkpoint(self.store, cid)
            plan = load_checkpoint(self.store, cid)
            completed = {p.rollout_id for p in plan.completed}
            continued = {p.rollout_id for p in plan.continued}
            fresh = {p.rollout_id for p in plan.fresh}
            assert not completed & continued
            assert completed | continued | fresh == set(plan.rollouts)
            assert sum(report.counts.values()) == len(plan.rollouts)


ProtocolMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestProtocol = ProtocolMachine.TestCase
