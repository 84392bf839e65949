"""The demo workload: multi-turn agents playing the reference environments with the fake policy.

One :class:`DemoWorld` is one "process": an agent participant, a policy model over the fake
generation backend, one resources participant per reference environment, a registry, the
reference token store and a coordinator. :func:`run_rollout` is the agent loop of one rollout:
each turn asks the policy for tokens (parked while it waits), turns them into an action, applies
it to its environment session (a tool call) and reports a boundary. Everything a rollout does is
a pure function of the demo seed and the rollout's index, so any run of the same seed, however
it is interrupted, must end in the same environment states and rewards.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from ..coordinator import Coordinator, FaultHook
from ..format.records import AgentBoundaryRecord
from ..ids import ExecutionId
from ..participants import AgentParticipant, FakeGenerationBackend, PolicyModelParticipant
from ..participants.environments import Environment, make_participant, reference_environments
from ..participants.model import Delivery
from ..protocol import Participant, ParticipantKind
from ..registry import LiveExecutionRegistry
from ..store import DelegatingStore, ObjectInfo, ObjectStore, PutResult
from ..tokens import ObjectStoreTokenStore

__all__ = ["Crashed", "DemoWorld", "Ledger", "MortalStore", "RolloutSpec", "rollout_specs", "run_rollout"]

SESSION = "env"
POLICY_VERSION = "v1"
WAIT_SECONDS = 120.0  # how long a parked request waits for a checkpoint to end


class Crashed(Exception):
    """The simulated process died: whatever its threads were doing is void."""


class MortalStore(DelegatingStore):
    """The store as one process sees it: after :meth:`kill` every operation fails, so a thread
    of a "crashed" process cannot write anything more (a real crash stops it the same way)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.dead = threading.Event()

    def kill(self) -> None:
        self.dead.set()

    def _alive(self) -> None:
        if self.dead.is_set():
            raise Crashed("the process crashed")

    def put(self, key: str, data: bytes) -> ObjectInfo:
        self._alive()
        return super().put(key, data)

    def open_write(self, key: str) -> Any:
        self._alive()
        return super().open_write(key)

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        self._alive()
        return super().put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        self._alive()
        return super().put_if_match(key, data, version)

    def delete(self, key: str) -> None:
        self._alive()
        super().delete(key)


@dataclass(frozen=True)
class RolloutSpec:
    """One rollout's input: its id, environment and seed (the input a fresh dispatch reruns)."""

    rollout_id: str
    env: str
    seed: int
    turns: int

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.env}:{self.seed}:{self.turns}".encode()).hexdigest()[:16]


def rollout_specs(
    rollouts: int, turns: int, seed: int, envs: Iterable[str], *, prefix: str = "rollout"
) -> list[RolloutSpec]:
    """Rollouts spread round-robin over ``envs``, each with a seed derived from the demo seed.

    ``prefix`` names the run: rollout ids (and so token-store keys) must not repeat between
    runs that share a store.
    """
    names = list(envs)
    out = []
    for i in range(rollouts):
        derived = int.from_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:8], "big")
        out.append(RolloutSpec(f"{prefix}-{i:04d}", names[i % len(names)], derived, turns))
    return out


@dataclass
class Ledger:
    """Operations whose results a rollout consumed, kept outside the worlds (which crash).

    ``model`` and ``tool`` count ``(rollout_id, operation)``; a count above one after a restore
    is a repeated completed operation. ``results`` holds each finished rollout's outcome.
    """

    model: Counter[tuple[str, str]] = field(default_factory=Counter)
    tool: Counter[tuple[str, str]] = field(default_factory=Counter)
    results: dict[str, dict[str, JsonValue]] = field(default_factory=dict)
    in_model: set[str] = field(default_factory=set)  # rollouts waiting on a model call now
    lock: threading.Lock = field(default_factory=threading.Lock)


class DemoWorld:
    """Everything one demo process holds in memory (``skip`` leaves one kind out)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        seed: int,
        token_delay: float,
        concurrency: int,
        delivery: Delivery = "inline",
        skip: ParticipantKind | None = None,
        fault_hook: FaultHook | None = None,
        accept_unsafe_store: bool = False,
        run_id: str = "demo",
    ) -> None:
        self.store = MortalStore(store)
        self.tokens = ObjectStoreTokenStore(self.store)
        self.backend = FakeGenerationBackend(
            seed=seed, token_delay=token_delay, concurrency=concurrency, token_source=self.tokens
        )
        self.model = PolicyModelParticipant(
            self.tokens,
            "policy",
            backend=self.backend,
            delivery=delivery,
        )
        self.agent = AgentParticipant("agent")
        self.envs: dict[str, Environment] = {env.name: env for env in reference_environments()}
        self.resources = {name: make_participant(env) for name, env in self.envs.items()}
        self.registry = LiveExecutionRegistry()
        everyone: list[Participant] = [self.agent, self.model, *self.resources.values()]
        self.participants = [p for p in everyone if p.kind != skip]
        self.coordinator = Coordinator(
            self.store,
            self.participants,
            self.registry,
            self.tokens,
            fault_hook=fault_hook,
            accept_unsafe_store=accept_unsafe_store,
            run_id=run_id,  # the process after the crash is the same run: it takes the next epoch
            takeover=True,  # a demo takes its store over explicitly (an earlier run may own it)
        )

    def crash(self, checkpoint_id: str | None) -> None:
        """Die: no write gets through any more; parked threads are released to find that out."""
        self.store.kill()
        for participant in self.participants:
            if checkpoint_id is not None:
                with contextlib.suppress(Exception):  # a dying process ignores what fails
                    participant.resume(checkpoint_id, _far())
            participant.close()

    def close(self) -> None:
        for participant in self.participants:
            participant.close()


def _far() -> float:
    return time.time() + 60


def _agent_state(obs: list[int], actions: list[int], reward: float) -> bytes:
    return json.dumps({"obs": obs, "actions": actions, "reward": reward}, separators=(",", ":")).encode()


def run_rollout(
    world: DemoWorld,
    spec: RolloutSpec,
    execution: ExecutionId,
    ledger: Ledger,
    *,
    restored: AgentBoundaryRecord | None = None,
    max_tokens: int = 12,
    on_boundary: Callable[[int], None] | None = None,
) -> None:
    """The agent loop of one rollout attempt, from its input or from ``restored``.

    ``on_boundary(turn)`` runs after each boundary is reported (tests stop a rollout there).
    Raises :class:`Crashed` (or a participant's error) when its world died under it.
    """
    env = world.envs[spec.env]
    resources = world.resources[spec.env]
    instance = resources.instance
    agent, model = world.agent, world.model
    restart_only = env.mode == "restart_only"
    dead = world.store.dead
    if restored is None:
        agent.begin(execution, wait=WAIT_SECONDS, restart_only=restart_only)
        resources.open_session(execution, SESSION, env.reset(spec.seed))
        state, revision = resources.state(execution, SESSION)
        obs, turn = list(env.observe(state)), 0
        actions: list[int] = []
        agent.boundary(
            execution,
            _boundary(execution, 0, None, instance, revision, obs, actions, 0.0, usage=0),
        )
        if on_boundary is not None:
            on_boundary(0)
    else:
        saved = json.loads(restored.agent_state or b"{}")
        obs, actions, turn = list(saved["obs"]), list(saved["actions"]), restored.turn_index
    usage = sum(1 for _ in actions) * max_tokens
    while True:
        turn += 1
        call_id = f"call-{turn}"
        agent.start_turn(execution, wait=WAIT_SECONDS)
        prompt = [spec.seed % 997, turn, *obs, *actions[-4:]]
        with ledger.lock:
            ledger.in_model.add(spec.rollout_id)
        try:
            with agent.awaiting_model(execution, call_id):
                result = model.generate(
                    execution,
                    call_id,
                    prompt,
                    max_tokens=max_tokens,
                    policy_version=POLICY_VERSION,
                    wait=WAIT_SECONDS,
                )
        finally:
            with ledger.lock:
                ledger.in_model.discard(spec.rollout_id)
        if dead.is_set():
            raise Crashed(f"{execution}: the process crashed during {call_id}")
        with ledger.lock:
            ledger.model[(spec.rollout_id, call_id)] += 1
        action = sum(result.token_ids) % env.actions
        revision = resources.mutate(execution, SESSION, _stepper(env, action), wait=WAIT_SECONDS)
        if dead.is_set():
            raise Crashed(f"{execution}: the process crashed during step {turn}")
        with ledger.lock:
            ledger.tool[(spec.rollout_id, f"step-{turn}")] += 1
        state, _ = resources.state(execution, SESSION)
        obs, actions = list(env.observe(state)), [*actions, action]
        usage += len(result.token_ids)
        if env.done(state) or turn >= spec.turns:
            _finish(world, spec, execution, ledger, env.summary(state), env.reward(state))
            return
        agent.boundary(
            execution,
            _boundary(execution, turn, call_id, instance, revision, obs, actions, env.reward(state), usage),
        )
        if on_boundary is not None:
            on_boundary(turn)


def _stepper(env: Environment, action: int) -> Callable[[Any], Any]:
    return lambda state: env.step(state, action)


def _boundary(
    execution: ExecutionId,
    turn: int,
    call_id: str | None,
    instance: str,
    revision: int,
    obs: list[int],
    actions: list[int],
    reward: float,
    usage: int,
) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=execution.rollout_id,
        attempt=execution.attempt,
        boundary_index=turn,
        turn_index=turn,
        last_model_call_id=call_id,
        resource_revisions={instance: {SESSION: revision}},
        output_items=[{"turn": turn, "action": a} for a in actions[-3:]],
        usage={"output_tokens": usage},
        cookies={"affinity": instance},
        agent_state=_agent_state(obs, actions, reward),
    )


def _finish(
    world: DemoWorld,
    spec: RolloutSpec,
    execution: ExecutionId,
    ledger: Ledger,
    summary: Any,
    reward: float,
) -> None:
    resources = world.resources[spec.env]
    resources.end_session(execution, SESSION)
    world.model.finish(execution)
    world.agent.finish(execution)
    if world.store.dead.is_set():
        raise Crashed(f"{execution}: the process crashed before its result was handed off")
    outcome: dict[str, JsonValue] = {"summary": dict(summary), "reward": reward}
    world.registry.finish(execution)
    world.registry.hand_off(execution, outcome, reward=reward)
    with ledger.lock:
        ledger.results[spec.rollout_id] = outcome
