"""One in-process deployment of the real reference participants, shared by protocol tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.errors import StaleAttemptError
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import (
    AgentParticipant,
    FakeGenerationBackend,
    PolicyModelParticipant,
    ResourcesParticipant,
)
from rollout_checkpoint.protocol import Participant
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.store import ObjectStore
from rollout_checkpoint.tokens import ObjectStoreTokenStore


class RealWorld:
    """One process: the three reference participants, a registry, the reference token store."""

    history = False
    """Whether each turn's boundary carries the whole history so far (one output item per turn)."""

    def __init__(
        self, store: ObjectStore, backend: FakeGenerationBackend | None = None, *, incremental: bool = True
    ) -> None:
        self.tokens = ObjectStoreTokenStore(store)
        self.agent = AgentParticipant("agent-0")
        self.backend = backend or FakeGenerationBackend(seed=1)
        self.backend.token_source = self.tokens
        self.model = PolicyModelParticipant(self.tokens, "policy-0", backend=self.backend)
        self.resources = ResourcesParticipant("res-0", mode="exported")
        self.participants: list[Participant] = [self.agent, self.model, self.resources]
        self.registry = LiveExecutionRegistry()
        # one run: every world on a store is that run's next coordinator (it takes the next epoch)
        self.coordinator = Coordinator(
            store, self.participants, self.registry, self.tokens, run_id="test-run"
        )
        for participant in self.participants:  # format 2 (incremental) or format 1 (full)
            participant.incremental_commits = incremental
        if not incremental:
            self.coordinator.registry_catalog.enabled = False

    def close(self) -> None:
        for participant in self.participants:
            participant.close()

    def turn(self, execution: ExecutionId, call_id: str, index: int) -> None:
        with self.model.call(execution, call_id, policy_version="v1") as call:
            call.stage(prompt_token_ids=[1, 2], generation_token_ids=[3], generation_log_probs=[-0.5])
        revision = self.resources.mutate(execution, "s", lambda s: {"n": s["n"] + 1})
        self.agent.boundary(
            execution,
            AgentBoundaryRecord(
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                boundary_index=index,
                turn_index=index,
                last_model_call_id=call_id,
                resource_revisions={"res-0": {"s": revision}},
                output_items=[{"turn": i, "text": f"item {i}"} for i in range(1, index + 1)]
                if self.history
                else [],
            ),
        )

    def start(self, rollout_id: str) -> ExecutionId:
        execution = self.registry.dispatch(rollout_id, input_digest=rollout_id)
        self.registry.start(execution)
        self.agent.begin(execution)
        self.resources.open_session(execution, "s", {"n": 0})
        return execution

    def refused_everywhere(self, execution: ExecutionId) -> None:
        """Every public entry point of every participant (and the registry) answers stale_attempt
        for ``execution`` and changes nothing."""
        before = [p.status() for p in self.participants]
        attempts: list[Callable[[], object]] = [
            lambda: self.agent.begin(execution),
            lambda: self.agent.start_turn(execution),
            lambda: self.agent.finish(execution),
            lambda: self.model.admit(execution, "late-call", policy_version="v1"),
            lambda: self.resources.open_session(execution, "late", {"n": 0}),
            lambda: self.resources.mutate(execution, "s", lambda s: s),
            lambda: self.resources.end_session(execution, "s"),
            lambda: self.registry.check(execution),
        ]
        attempts += [
            (lambda p=p: p.declare_unsafe_effect(execution, "late effect")) for p in self.participants
        ]
        for attempt in attempts:
            with pytest.raises(StaleAttemptError) as info:
                attempt()
            assert info.value.code == "stale_attempt"
        assert [p.status() for p in self.participants] == before
