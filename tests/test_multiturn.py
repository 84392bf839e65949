"""A multi-turn agent over each reference environment and the fake policy model, crashed at
every boundary and in the middle of a generation, restored and finished: the same final state
and rewards as the uninterrupted run, no completed model or tool call repeated, and the dead
attempt's late writes refused by the restored process."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from rollout_checkpoint.demo import DemoWorld, Ledger, RolloutSpec, rollout_specs, run_rollout
from rollout_checkpoint.errors import StaleAttemptError
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.store import MemoryStore

TURNS = 4
SEED = 11
MAX_TOKENS = 120  # long enough that a checkpoint lands inside a generation (2 ms per token)
ENVS = ["blackjack", "inventory", "live-stream"]


class _CrashNow(BaseException):
    pass


def _store() -> MemoryStore:
    return MemoryStore(f"multiturn-{uuid.uuid4().hex}")


def _world(store: MemoryStore, token_delay: float = 0.0, **kwargs: Any) -> DemoWorld:
    return DemoWorld(store, seed=SEED, token_delay=token_delay, concurrency=4, **kwargs)


def _spec(env: str) -> RolloutSpec:
    [spec] = [s for s in rollout_specs(len(ENVS), TURNS, SEED, ENVS) if s.env == env]
    return spec


def _wait(predicate: Callable[[], bool]) -> None:
    end = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.001)


def _dispatch(world: DemoWorld, spec: RolloutSpec) -> ExecutionId:
    env = world.envs[spec.env]
    execution = world.registry.dispatch(
        spec.rollout_id, input_digest=spec.digest, restart_only=env.mode == "restart_only"
    )
    world.registry.start(execution)
    return execution


def _uninterrupted(spec: RolloutSpec) -> tuple[dict[str, Any], Ledger]:
    world = _world(_store())
    ledger = Ledger()
    run_rollout(world, spec, _dispatch(world, spec), ledger, max_tokens=MAX_TOKENS)
    world.close()
    return ledger.results[spec.rollout_id], ledger


def _boundaries(spec: RolloutSpec) -> int:
    """How many boundaries the uninterrupted rollout reports (turn 0 included)."""
    _, ledger = _uninterrupted(spec)
    return sum(ledger.tool.values())  # one boundary before each step; the last step finishes


def _crash_and_finish(
    spec: RolloutSpec, stop_at: int, *, mid_generation: bool, delivery: str
) -> dict[str, Any]:
    store = _store()
    marks: list[str] = []

    def hook(step: str) -> None:
        if step.startswith("resume:") and marks:
            raise _CrashNow(step)

    first = _world(store, token_delay=0.002 if mid_generation else 0.0, fault_hook=hook, delivery=delivery)
    execution = _dispatch(first, spec)
    before = Ledger()
    at_boundary, go_on = threading.Event(), threading.Event()

    def on_boundary(turn: int) -> None:
        if turn == stop_at:
            at_boundary.set()
            assert go_on.wait(30)

    def body() -> None:
        try:
            run_rollout(first, spec, execution, before, on_boundary=on_boundary, max_tokens=MAX_TOKENS)
        except Exception:
            assert first.store.dead.is_set()

    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    assert at_boundary.wait(30)
    if mid_generation:  # let the next turn start and checkpoint a few tokens into its generation
        tokens = first.backend.stats()["tokens_generated"]
        go_on.set()
        _wait(lambda: first.backend.stats()["tokens_generated"] >= tokens + 3)
    marks.append("crash")
    with pytest.raises(_CrashNow):
        first.coordinator.checkpoint("ckpt-crash")
    first.crash("ckpt-crash")
    go_on.set()
    worker.join(30)

    second = _world(store, delivery=delivery)
    restored = second.coordinator.restore("ckpt-crash")
    second.coordinator.resume(restored.restore_id)
    item = restored.plan.rollouts[spec.rollout_id]
    after = Ledger()
    nxt = item.execution.next_attempt()
    if second.envs[spec.env].mode == "restart_only":
        assert item.disposition == "fresh_dispatch" and "restart-only" in item.reason
        second.registry.start(nxt)
        run_rollout(second, spec, nxt, after, max_tokens=MAX_TOKENS)
    else:
        assert item.disposition == "continue", item.reason
        _late_writes_of_the_dead_attempt_are_refused(second, spec, item.execution)
        boundary = second.agent.begin(nxt)
        assert boundary is not None and boundary.turn_index == stop_at
        if mid_generation:
            assert boundary.pending_model_call_id == f"call-{stop_at + 1}"
        run_rollout(second, spec, nxt, after, restored=boundary, max_tokens=MAX_TOKENS)
        for done in ("model", "tool"):
            repeated = set(getattr(before, done)) & set(getattr(after, done))
            assert not repeated, f"repeated {done} calls: {repeated}"
        if mid_generation:
            assert second.model.stats()["cuts_continued"] == 1
    second.close()
    return after.results[spec.rollout_id]


def _late_boundary(old: ExecutionId) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=old.rollout_id, attempt=old.attempt, boundary_index=99, turn_index=99
    )


def _late_writes_of_the_dead_attempt_are_refused(
    world: DemoWorld, spec: RolloutSpec, old: ExecutionId
) -> None:
    """Requests of attempt N reaching the restored process are stale and change nothing."""
    before = [p.status() for p in world.participants]
    resources = world.resources[spec.env]
    attempts: list[Callable[[], object]] = [
        lambda: resources.mutate(old, "env", lambda s: s, wait=0),
        lambda: world.model.generate(old, "call-late", [1, 2], max_tokens=2, wait=0),
        lambda: world.agent.begin(old),
        lambda: world.agent.boundary(
            old,
            AgentBoundaryRecord(
                rollout_id=old.rollout_id, attempt=old.attempt, boundary_index=99, turn_index=99
            ),
        ),
        lambda: world.registry.check(old),
    ]
    for attempt in attempts:
        with pytest.raises(StaleAttemptError):
            attempt()
    assert [p.status() for p in world.participants] == before


@pytest.mark.parametrize("delivery", ["inline", "staged"])
@pytest.mark.parametrize("env", ENVS)
def test_crash_at_every_boundary_and_mid_generation_then_finish(env: str, delivery: str) -> None:
    spec = _spec(env)
    expected, _ = _uninterrupted(spec)
    for stop_at in range(_boundaries(spec)):
        for mid_generation in (False, True):
            got = _crash_and_finish(spec, stop_at, mid_generation=mid_generation, delivery=delivery)
            assert got == expected, (stop_at, mid_generation)
