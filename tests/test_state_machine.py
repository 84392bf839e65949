"""A hypothesis state machine over the whole protocol with the reference participants.

Rules: start, step (one agent turn: a staged model call, a resources mutation, a boundary),
finish, hand off (and consume), checkpoint (synchronous or asynchronous publication), crash
(drop every in-memory participant), restore (with verification and fallback), retire, forget,
lose or damage ``latest.json`` (delete it, write garbage, move it back to an older
checkpoint), and damage a published object (flip a
byte, truncate or delete any object one checkpoint owns: record, aggregate, manifests,
indexes, shards, token snapshot). Invariants after every step: participants are open whenever
no checkpoint is running; a retired attempt is refused everywhere (also after a restore from a
checkpoint that committed its tombstone, until the rollout is forgotten); every undamaged
published checkpoint verifies, and in it completed and continued rollouts are disjoint and,
with fresh dispatches, cover exactly the dispatched ones; and a reader never resumes from any
checkpoint other than the newest one that verifies (without fallback it refuses a damaged
newest one instead of stepping back). Also park-while-waiting (a checkpoint while a run waits
on its next model call), finish-during-prepare (an episode ends while the agent stage
prepares) and cut (a checkpoint while a policy call generates: the call is cut at a durable
prefix, and a restore from it continues that prefix exactly).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from _reference_world import RealWorld
from rollout_checkpoint.archive import find_component_prefixes, parse_component_manifest
from rollout_checkpoint.coordinator import RestoreFailedError
from rollout_checkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointRejectedError,
    StaleAttemptError,
)
from rollout_checkpoint.format import layout
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import FakeGenerationBackend, GenerationResult
from rollout_checkpoint.protocol import Phase
from rollout_checkpoint.reader import load_checkpoint, verify_checkpoint
from rollout_checkpoint.retention import collect_garbage
from rollout_checkpoint.store import MemoryStore

ROLLOUTS = [f"r{i}" for i in range(5)]
SESSION = "s"


class GatedBackend(FakeGenerationBackend):
    """The fake backend whose generations stop after ``allow`` tokens until ``gate`` opens, so a
    checkpoint deterministically finds them mid-generation."""

    def __init__(self) -> None:
        super().__init__(seed=1)
        self.gate = threading.Event()
        self.gate.set()
        self.allow = 0
        self.blocked = threading.Event()
        self._issued = 0

    def _token(self, state: bytes) -> tuple[int, float]:
        if not self.gate.is_set():
            self._issued += 1
            if self._issued > self.allow:
                self.blocked.set()
                self.gate.wait(30)
        return super()._token(state)

    def hold_after(self, tokens: int) -> None:
        self.allow, self._issued = tokens, 0
        self.blocked.clear()
        self.gate.clear()


class World(RealWorld):
    """The reference deployment plus the number of turns each rollout has taken."""

    history = True  # growing histories: format 2 writes them in chunks

    def __init__(self, store: MemoryStore, *, incremental: bool = True) -> None:
        self.gated = GatedBackend()
        super().__init__(store, backend=self.gated, incremental=incremental)
        self.turns: dict[str, int] = {}


class ProtocolMachine(RuleBasedStateMachine):
    incremental = True
    """Format 2 (incremental checkpoints); the subclass below runs the same rules with full ones:
    both must classify every rollout as the model of the world says, so they classify alike."""

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore(f"sm-{uuid.uuid4().hex}")
        self.world = World(self.store, incremental=self.incremental)
        self.crashed = False
        self.retired: set[ExecutionId] = set()
        # what had been retired when each checkpoint was published: its tombstones are committed
        # and must be refused again after a restore from it, until forgotten
        self.retired_at: dict[str, set[ExecutionId]] = {}
        self.calls = 0
        self.order: list[str] = []  # checkpoint ids in publish order (the model of the log)
        self.publishes = 0  # every publish so far (the log's sequence), collected ones included
        self.damaged: set[str] = set()  # checkpoints with an object damaged or removed
        self.pointers: dict[str, bytes] = {}  # latest.json as it was right after each publish
        self.cut_calls: dict[str, tuple[list[int], int]] = {}  # call id -> prompt, max_tokens
        # checkpoints verified since the last rule that changed or removed stored objects (damage,
        # gc): published objects are create-only, so only those rules can break a verified one;
        # teardown verifies every undamaged checkpoint again, whatever the rules did
        self.verified: set[str] = set()

    def teardown(self) -> None:
        try:
            self.verified.clear()
            self.every_undamaged_published_checkpoint_verifies()
        finally:
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
    @rule(publication=st.sampled_from(["sync", "async"]))
    def checkpoint(self, publication: Any = "sync") -> None:
        world = self.world
        expected = {e.rollout_id: e for e in world.registry.executions()}
        outcome = world.coordinator.checkpoint(publication=publication)
        assert outcome.publication == publication
        self._published_now(outcome.checkpoint_id, outcome.record.sequence)
        assert outcome.clean and outcome.latest_moved  # a lost or damaged pointer never blocks
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

    def _published_now(self, checkpoint_id: str, sequence: int) -> None:
        """Every rule that publishes records it in the model of the log."""
        # the sequence counts every publish, whatever happened to latest.json meanwhile
        assert sequence == self.publishes + 1
        self.publishes += 1
        self.order.append(checkpoint_id)
        self.pointers[checkpoint_id] = self.store.get(layout.LATEST_KEY)
        self.retired_at[checkpoint_id] = set(self.retired)

    # -- issue 6: parking while waiting on the model, finishing during prepare ----------------------
    def _running_at_boundary(self, data: st.DataObject) -> ExecutionId | None:
        candidates = [
            info.execution
            for info in self._entries("running")
            if self.world.agent.latest_boundary(info.execution) is not None
        ]
        return data.draw(st.sampled_from(candidates)) if candidates else None

    @precondition(lambda self: not self.crashed)
    @rule(data=st.data())
    def checkpoint_while_waiting_on_the_model(self, data: st.DataObject) -> None:
        """A run waits on its next model call (queued at the model) while a checkpoint runs: it
        is parked, the checkpoint publishes, and the run then completes its turn."""
        world = self.world
        execution = self._running_at_boundary(data)
        if execution is None:
            return
        self.calls += 1
        call_id = f"c{self.calls}"
        world.agent.start_turn(execution)
        waiting, answered, left = threading.Event(), threading.Event(), threading.Event()

        def await_model() -> None:
            with world.agent.awaiting_model(execution, call_id):
                waiting.set()
                answered.wait(30)
            left.set()

        worker = threading.Thread(target=await_model)
        worker.start()
        assert waiting.wait(30)
        restart_only = world.registry.get(execution.rollout_id).restart_only
        outcome = world.coordinator.checkpoint()
        self._published_now(outcome.checkpoint_id, outcome.record.sequence)
        item = load_checkpoint(self.store, outcome.checkpoint_id).rollouts[execution.rollout_id]
        assert item.disposition == ("fresh_dispatch" if restart_only else "continue"), item.reason
        answered.set()
        worker.join(30)
        assert left.is_set()
        index = world.turns[execution.rollout_id] + 1
        world.turns[execution.rollout_id] = index
        world.turn(execution, call_id, index)  # the call returns: the turn completes

    @precondition(lambda self: not self.crashed)
    @rule(data=st.data())
    def finish_during_prepare(self, data: st.DataObject) -> None:
        """The last turn of an episode is running when the checkpoint starts; the episode ends and
        hands off its result while the agent stage prepares: the checkpoint holds it completed."""
        world = self.world
        execution = self._running_at_boundary(data)
        if execution is None:
            return
        world.agent.start_turn(execution)  # blocks the agent stage until the run ends
        outcome: list[Any] = []
        runner = threading.Thread(target=lambda: outcome.append(world.coordinator.checkpoint()))
        runner.start()
        end = time.monotonic() + 30
        while world.agent.phase is not Phase.PREPARING and time.monotonic() < end:
            time.sleep(0.001)
        world.agent.finish(execution)
        world.model.finish(execution)
        world.resources.end_session(execution, SESSION)
        world.registry.finish(execution)
        world.registry.hand_off(execution, {"rollout": execution.rollout_id}, reward=2.0)
        runner.join(60)
        [published] = outcome
        cid = published.checkpoint_id
        self._published_now(cid, published.record.sequence)
        plan = load_checkpoint(self.store, cid)
        assert plan.rollouts[execution.rollout_id].disposition == "completed"
        results = {r.rollout_id: r for r in plan.registry_records() if r.kind == "completed_result"}
        assert results[execution.rollout_id].reward == 2.0  # neither lost nor to be redone

    @rule()
    def crash(self) -> None:
        """Every in-memory participant, the registry and the coordinator are gone."""
        self.world.close()
        self.world = World(self.store, incremental=self.incremental)
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
            except CheckpointNotFoundError as exc:
                # every record was removed: a sequence claim without its record cannot be told
                # from an interrupted publish, so nothing is published (and the error says so)
                assert not self._published(), exc
                assert "no published record" in exc.message, exc.message
                self.crashed = False
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
                self._continue_cuts(nxt)

    @precondition(lambda self: not self.crashed and bool(self.order))
    @rule(fallback=st.booleans())
    def restore_that_must_be_refused(self, fallback: bool) -> None:
        """A restore into participants that hold live work is refused and changes nothing: every
        participant, the registry and the store stay as they were; live attempts still work."""
        world = self.world
        if not any(p.status().live for p in world.participants):
            return

        def state() -> object:
            return (
                [(p.status(), p.fence.snapshot()) for p in world.participants],
                [(i.execution, i.state) for i in world.registry.executions()],
                sorted(i.key for i in self.store.list("") if not i.key.startswith("owner/")),
            )

        before = state()
        try:
            world.coordinator.restore(verify=True, fallback=fallback)
        except (RestoreFailedError, CheckpointRejectedError, CheckpointNotFoundError):
            pass
        else:
            raise AssertionError("a restore into participants with live work was not refused")
        assert state() == before
        for info in self._entries("queued", "running", "finished"):
            world.registry.check(info.execution)
            for participant in world.participants:
                assert not participant.fence.is_retired(info.execution), (participant.kind, info)

    @precondition(lambda self: not self.crashed)
    @rule(data=st.data(), cut_at=st.integers(0, 6), crash=st.booleans())
    def cut(self, data: st.DataObject, cut_at: int, crash: bool) -> None:
        """A checkpoint while a policy call generates: it is cut after ``cut_at`` tokens. The
        response is held until resume, then equals the uninterrupted generation and the turn
        completes. With ``crash`` (or a later crash restoring this checkpoint) the restored next
        attempt re-issues the call and continues from the prefix (``_continue_cuts``)."""
        world = self.world
        execution = self._running_at_boundary(data)
        if execution is None:
            return
        self.calls += 1
        call_id = f"c{self.calls}"
        prompt, max_tokens = [len(execution.rollout_id), self.calls], 12
        self.cut_calls[call_id] = (prompt, max_tokens)
        world.gated.hold_after(cut_at)
        world.agent.start_turn(execution)
        out: list[GenerationResult] = []

        def call() -> None:
            with world.agent.awaiting_model(execution, call_id):
                out.append(world.model.generate(execution, call_id, prompt, max_tokens=max_tokens))

        thread = threading.Thread(target=call)
        thread.start()
        assert world.gated.blocked.wait(30)
        try:
            self.checkpoint()  # the same expectations as any checkpoint, plus the cut:
            assert world.model.stats()["cuts"] >= 1
        finally:
            world.gated.gate.set()
            thread.join(30)
        reference = FakeGenerationBackend(seed=1).generate(prompt, max_tokens)
        assert out and out[0].token_ids == reference.token_ids
        if crash:
            self.crash()
            self.restore()
        else:
            self._complete_turn(execution, call_id)

    def _continue_cuts(self, execution: ExecutionId) -> None:
        """After a restore: re-issue each cut call; it continues from its prefix, exactly."""
        world = self.world
        for call_id, cut in world.model.pending_cuts(execution).items():
            prompt, max_tokens = self.cut_calls[call_id]
            world.agent.start_turn(execution)
            with world.agent.awaiting_model(execution, call_id):
                result = world.model.generate(execution, call_id, prompt, max_tokens=max_tokens)
            assert result.continued_from == cut and result.prefix_token_count == cut.prefix_token_count
            assert result.token_ids == FakeGenerationBackend(seed=1).generate(prompt, max_tokens).token_ids
            self._complete_turn(execution, call_id)

    def _complete_turn(self, execution: ExecutionId, call_id: str) -> None:
        """The running turn whose model call ``call_id`` returned reaches its boundary."""
        world = self.world
        index = world.turns.get(execution.rollout_id, 0) + 1
        world.turns[execution.rollout_id] = index
        revision = world.resources.mutate(execution, SESSION, lambda s: {"n": s["n"] + 1})
        world.agent.boundary(
            execution,
            AgentBoundaryRecord(
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                boundary_index=index,
                turn_index=index,
                last_model_call_id=call_id,
                resource_revisions={world.resources.instance: {SESSION: revision}},
            ),
        )

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
        # a fraction, not sampled_from(keys): how many objects a checkpoint has varies between runs
        # (generation timing), and hypothesis needs the same draws when it replays an example
        pick = data.draw(st.floats(0.0, 1.0, exclude_max=True))
        key = sorted(keys)[int(pick * len(keys))]
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
        self.damaged.update(self._referring_to(key))
        self.verified.clear()

    def _referring_to(self, key: str) -> set[str]:
        """Format 2: published checkpoints with a component that refers into the archive holding
        ``key`` (they depend on its manifest, index and shards, not on its reference table)."""
        if "/components/" not in key or key.rsplit("/", 1)[-1].startswith("refs-"):
            return set()
        parts = key.split("/")
        prefix = "/".join(parts[:5])  # checkpoints/<id>/components/<kind>/<instance>
        out = set()
        for cid in self.order:
            for p in find_component_prefixes(self.store, layout.checkpoint_prefix(cid) + "/"):
                try:
                    manifest = parse_component_manifest(self.store.get(f"{p}/manifest.json"))
                except CheckpointError:
                    continue  # damaged itself: that checkpoint is marked already
                if prefix in {b.prefix for b in manifest.bases or []}:
                    out.add(cid)
        return out

    @rule(keep=st.integers(1, 3))
    def collect_garbage(self, keep: int) -> None:
        """Retention: keep the newest ``keep`` (no leftover waits). Whatever a kept checkpoint
        refers into stays (the invariants verify every one that is not damaged)."""
        report = collect_garbage(self.store, keep=keep, min_age_s=0)
        published = set(self._published())
        assert set(report.unpublished).isdisjoint(published)
        self.order = [c for c in self.order if c in published]
        self.damaged &= published
        self.verified.clear()

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
            # whatever the reader skipped on the way is newer than what it chose, and damaged
            newer = set(self.order[self.order.index(intact[-1]) + 1 :])
            for skipped in plan.skipped:
                assert skipped.checkpoint_id in newer and skipped.checkpoint_id in self.damaged, skipped
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
            if cid in self.damaged or cid in self.verified:
                continue
            report = verify_checkpoint(self.store, cid)
            plan = load_checkpoint(self.store, cid)  # verifies again: the reader's own path
            completed = {p.rollout_id for p in plan.completed}
            continued = {p.rollout_id for p in plan.continued}
            fresh = {p.rollout_id for p in plan.fresh}
            assert not completed & continued
            assert completed | continued | fresh == set(plan.rollouts)
            assert sum(report.counts.values()) == len(plan.rollouts)
            self.verified.add(cid)


ProtocolMachine.TestCase.settings = settings(
    # soak runs raise it: RC_STATE_MACHINE_EXAMPLES=2000 pytest tests/test_state_machine.py
    max_examples=int(os.environ.get("RC_STATE_MACHINE_EXAMPLES", "25")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestProtocol = ProtocolMachine.TestCase


class FullProtocolMachine(ProtocolMachine):
    incremental = False


FullProtocolMachine.TestCase.settings = ProtocolMachine.TestCase.settings
TestProtocolFullCheckpoints = FullProtocolMachine.TestCase
