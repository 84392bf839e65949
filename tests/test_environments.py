"""The reference environments: codecs that refuse bad bytes, snapshots that continue exactly,
and a restart-only environment that never exports."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from rollout_checkpoint.errors import InvalidRecordError
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import JsonCodec, ResourcesParticipant
from rollout_checkpoint.participants.environments import (
    BlackjackEnvironment,
    Environment,
    InventoryEnvironment,
    LiveStreamEnvironment,
    make_participant,
    reference_environments,
)
from rollout_checkpoint.store import MemoryStore


def soon() -> float:
    return time.time() + 10


def policy(step: int) -> int:
    return (step * 7 + 3) // 2


def play(env: Environment, seed: int, limit: int = 200) -> list[Any]:
    """Every state of one episode under a fixed action sequence."""
    state = env.reset(seed)
    states = [state]
    for step in range(limit):
        if env.done(state):
            break
        state = env.step(state, policy(step))
        states.append(state)
    return states


@pytest.mark.parametrize("env", [BlackjackEnvironment(hands=8), InventoryEnvironment()], ids=lambda e: e.name)
def test_a_snapshot_at_every_step_continues_exactly(env: Environment) -> None:
    codec = env.codec
    assert codec is not None and env.mode == "exported"
    for seed in (1, 2, 99):
        straight = play(env, seed)
        assert env.done(straight[-1])
        for cut in range(len(straight)):
            state = codec.decode(codec.encode(straight[cut]))  # the snapshot round trip
            for step in range(cut, len(straight) - 1):
                state = env.step(state, policy(step))
            assert state == straight[-1]
            assert env.reward(state) == env.reward(straight[-1])


def test_blackjack_state_holds_deck_order_and_rng() -> None:
    env = BlackjackEnvironment(hands=10)
    states = play(env, 5)
    rngs = {s["rng"] for s in states}
    assert len(rngs) > 1, "ten hands run through more than one deck: the RNG reshuffled"
    first = states[0]
    assert len(first["deck"]) == 48 and len(first["player"]) == 2
    assert env.reset(5) == first and env.reset(6) != first


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s.update(deck=[*s["deck"], s["player"][0]]),  # a card twice
        lambda s: s.update(rng=-1),
        lambda s: s.update(rng=1 << 64),
        lambda s: s.update(wins=True),
        lambda s: s.pop("done"),
        lambda s: s.update(extra=1),
        lambda s: s.update(deck=[52]),
    ],
)
def test_blackjack_codec_refuses_damaged_state(damage: Any) -> None:
    env = BlackjackEnvironment()
    state = json.loads(env.codec.encode(env.reset(3)))
    damage(state)
    with pytest.raises(ValueError):
        env.codec.decode(json.dumps(state).encode())


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s["items"].update(apples=-1),
        lambda s: s["items"].update(apples=99),  # beyond capacity
        lambda s: s["target"].pop("bolts"),
        lambda s: s.update(ops="3"),
    ],
)
def test_inventory_codec_refuses_damaged_state(damage: Any) -> None:
    env = InventoryEnvironment()
    state = json.loads(env.codec.encode(env.reset(3)))
    damage(state)
    with pytest.raises(ValueError):
        env.codec.decode(json.dumps(state).encode())


def test_inventory_revision_moves_with_the_session_revision() -> None:
    env = InventoryEnvironment()
    res = make_participant(env)
    execution = ExecutionId(rollout_id="r", attempt=0)
    res.open_session(execution, "bins", env.reset(11))
    for step in range(5):
        action = policy(step)
        revision = res.mutate(execution, "bins", lambda s, a=action: env.step(s, a))
        state, held = res.state(execution, "bins")
        assert revision == held == state["ops"] == step + 1


def test_restart_only_environment_never_exports() -> None:
    env = LiveStreamEnvironment()
    assert env.codec is None and env.mode == "restart_only"
    assert play(env, 4)[-1].steps == env.limit
    first, second = play(env, 4), play(env, 4)
    assert env.summary(first[-1]) == env.summary(second[-1])  # the input reproduces the episode
    res = make_participant(env)
    execution = ExecutionId(rollout_id="r", attempt=0)
    res.open_session(execution, "stream", env.reset(4))
    res.mutate(execution, "stream", lambda s: env.step(s, 1))
    assert res.prepare("c1", soon()).restarts == (execution,)
    reply = res.commit("c1", MemoryStore(f"env-{uuid.uuid4().hex}"), soon())
    assert reply.restarts == (execution,) and reply.executions == ()
    res.resume("c1", soon())


def test_exported_environment_restores_through_its_participant() -> None:
    store = MemoryStore(f"env-{uuid.uuid4().hex}")
    for env in reference_environments():
        if env.codec is None:
            continue
        res = make_participant(env)
        execution = ExecutionId(rollout_id="r", attempt=0)
        res.open_session(execution, "s", env.reset(8))
        res.mutate(execution, "s", lambda s, e=env: e.step(s, 1))
        assert res.prepare(f"c-{env.name}", soon()).ready
        res.commit(f"c-{env.name}", store, soon())
        res.resume(f"c-{env.name}", soon())
        fresh = make_participant(env)
        fresh.restore(f"r-{env.name}", f"c-{env.name}", store, soon())
        fresh.resume(f"r-{env.name}", soon())
        assert fresh.state(execution.next_attempt(), "s") == res.state(execution, "s")


class _LaxCodec(JsonCodec):
    """Writes under the blackjack codec's name without its checks (a buggy older writer)."""

    name = "blackjack-v1"


def test_a_session_that_does_not_decode_refuses_the_whole_restore() -> None:
    store = MemoryStore(f"env-{uuid.uuid4().hex}")
    env = BlackjackEnvironment()
    writer = ResourcesParticipant("blackjack", mode="exported", codec=_LaxCodec())
    good, bad = ExecutionId(rollout_id="a", attempt=0), ExecutionId(rollout_id="b", attempt=0)
    writer.open_session(good, "s", env.reset(1))
    broken = env.reset(2)
    writer.open_session(bad, "s", {**broken, "deck": [*broken["deck"], broken["deck"][0]]})
    assert writer.prepare("c1", soon()).ready
    writer.commit("c1", store, soon())
    writer.resume("c1", soon())
    fresh = make_participant(env)
    with pytest.raises(InvalidRecordError, match="does not decode"):
        fresh.restore("r1", "c1", store, soon())
    assert fresh.status().live == 0 and fresh.accepting  # nothing of the set was activated
