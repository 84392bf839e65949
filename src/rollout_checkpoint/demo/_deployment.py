"""A populated deployment for the checkpoint-cycle benchmark: many live rollouts parked at a
boundary, created directly (no workload runs), so one cycle can be timed at scale."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..coordinator import CheckpointOutcome, Coordinator, RestoreOutcome
from ..format.records import AgentBoundaryRecord
from ..ids import ExecutionId
from ..participants import AgentParticipant, PolicyModelParticipant, ResourcesParticipant
from ..registry import LiveExecutionRegistry
from ..store import ObjectStore, open_store
from ..tokens import BatchingTokenSink, ObjectStoreTokenStore

__all__ = ["DemoDeployment"]


class DemoDeployment:
    """In-process participants of each kind (agent, policy model, resources) with a registry,
    a reference token store and a coordinator, all on one store."""

    def __init__(
        self, store: str | ObjectStore, *, accept_unsafe_store: bool = False, run_id: str | None = None
    ) -> None:
        self.store = open_store(store)
        self.tokens = ObjectStoreTokenStore(self.store)
        # group commit: concurrent stagings share one shard, and each receipt waits for it
        self.sink = BatchingTokenSink(self.tokens)
        self.agent = AgentParticipant("agent-0")
        self.model = PolicyModelParticipant(self.sink, "policy-0")
        self.resources = ResourcesParticipant("resources-0", mode="exported")
        self.participants = [self.agent, self.model, self.resources]
        self.registry = LiveExecutionRegistry()
        # a demo deployment takes its store over explicitly (an earlier run may own it)
        self.coordinator = Coordinator(
            self.store,
            self.participants,
            self.registry,
            self.tokens,
            accept_unsafe_store=accept_unsafe_store,
            # each deployment is a new run unless told otherwise (its participants are new: the
            # incarnations an earlier run's checkpoint recorded are not theirs to answer with)
            run_id=run_id or f"demo-deployment-{uuid.uuid4().hex[:12]}",
            takeover=True,
        )

    def close(self) -> None:
        for participant in self.participants:
            participant.close()

    def populate(
        self, rollouts: int, *, prefix: str = "rollout", agent_states: Iterator[bytes] | None = None
    ) -> dict[str, int]:
        """Live rollouts of every kind: 20% finished and handed off, 10% never started, 10%
        restart-only, 60% mid-rollout parked at a turn boundary (one model call with tokens, one
        resources session at revision 1). ``agent_states`` supplies each parked agent's opaque
        state (a conversation history, say). Returns how many of each."""
        counts = {"handed_off": 0, "queued": 0, "restart_only": 0, "at_boundary": 0}
        registry = self.registry
        turns: list[tuple[ExecutionId, bytes]] = []
        for i in range(rollouts):
            rollout_id = f"{prefix}-{i:07d}"
            kind = i % 10
            if kind in (0, 1):
                e = registry.dispatch(rollout_id, input_digest=rollout_id)
                registry.start(e)
                registry.finish(e)
                registry.hand_off(e, {"reward_text": "ok"}, reward=1.0)
                counts["handed_off"] += 1
            elif kind == 2:
                registry.dispatch(rollout_id, input_digest=rollout_id)
                counts["queued"] += 1
            elif kind == 3:
                # its environment cannot export state: the agent parks, the plan restarts it
                e = registry.dispatch(rollout_id, input_digest=rollout_id, restart_only=True)
                registry.start(e)
                self.agent.begin(e)
                self.agent.boundary(
                    e,
                    AgentBoundaryRecord(rollout_id=rollout_id, attempt=0, boundary_index=1, turn_index=1),
                )
                counts["restart_only"] += 1
            else:
                e = registry.dispatch(rollout_id, input_digest=rollout_id)
                registry.start(e)
                state = next(agent_states) if agent_states is not None else b'{"scratch": 1}'
                turns.append((e, state))
                counts["at_boundary"] += 1
        with ThreadPoolExecutor(max_workers=64) as pool:  # concurrent turns batch their tokens
            list(pool.map(lambda item: self._turn(*item), turns))
        return counts

    def _turn(self, e: ExecutionId, agent_state: bytes) -> None:
        self.agent.begin(e)
        with self.model.call(e, "call-1", policy_version="v1") as call:
            call.stage(
                prompt_token_ids=[1, 2, 3, 4], generation_token_ids=[5, 6], generation_log_probs=[-0.1, -0.2]
            )
        self.resources.open_session(e, "env", {"board": [0, 0, 0], "turn": 0})
        revision = self.resources.mutate(e, "env", lambda s: {"board": [1, 0, 0], "turn": 1})
        self.agent.boundary(
            e,
            AgentBoundaryRecord(
                rollout_id=e.rollout_id,
                attempt=e.attempt,
                boundary_index=1,
                turn_index=1,
                last_model_call_id="call-1",
                resource_revisions={"resources-0": {"env": revision}},
                output_items=[{"role": "assistant", "content": "move 1"}],
                usage={"input_tokens": 4, "output_tokens": 2},
                agent_state=agent_state,
            ),
        )

    def checkpoint(self, checkpoint_id: str | None = None, **kwargs: Any) -> CheckpointOutcome:
        return self.coordinator.checkpoint(checkpoint_id, **kwargs)

    def restore(self, checkpoint_id: str | None = None) -> RestoreOutcome:
        return self.coordinator.restore(checkpoint_id)
