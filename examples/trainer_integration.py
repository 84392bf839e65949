"""Trainer integration, end to end: checkpoint from a training loop, crash, then load, decide,
restore and resume. ``docs/trainer-integration.md`` walks through it; the test suite runs it
(``tests/test_trainer_integration.py``).

    python examples/trainer_integration.py [STORE_URL]

Prints one JSON summary line. Everything runs in this process with the reference participants;
in a deployment the participants are remote servers and only the coordinator lives here.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from rollout_checkpoint import (
    AgentBoundaryRecord,
    AgentParticipant,
    Coordinator,
    ExecutionId,
    LiveExecutionRegistry,
    ObjectStore,
    ObjectStoreTokenStore,
    PolicyModelParticipant,
    RecoveryPlan,
    ResourcesParticipant,
    load_checkpoint,
    open_store,
)

RUN_ID = "trainer-run-1"  # your run's name: the same in every process of this run


@dataclass
class Deployment:
    """The participants, the framework's registry and the coordinator, on one store."""

    agent: AgentParticipant
    model: PolicyModelParticipant
    resources: ResourcesParticipant
    registry: LiveExecutionRegistry
    coordinator: Coordinator

    @classmethod
    def start(cls, store: ObjectStore) -> Deployment:
        tokens = ObjectStoreTokenStore(store)
        agent = AgentParticipant("agent-0")
        model = PolicyModelParticipant(tokens, "policy-0")
        resources = ResourcesParticipant("resources-0", mode="exported")
        registry = LiveExecutionRegistry()
        # the trainer's run: a replacement coordinator of the same run takes the store over (the
        # next owner epoch); a coordinator of another run is refused (``store_owned``)
        coordinator = Coordinator(store, [agent, model, resources], registry, tokens, run_id=RUN_ID)
        return cls(agent, model, resources, registry, coordinator)

    def close(self) -> None:
        for participant in (self.agent, self.model, self.resources):
            participant.close()


def turn(dep: Deployment, execution: ExecutionId, index: int) -> None:
    """One agent turn: a model call (its tokens go to the token store), one environment step,
    then the agent's boundary, which a checkpoint can continue from."""
    call_id = f"call-{index}"
    with dep.model.call(execution, call_id, policy_version="step-3") as call:
        call.stage(prompt_token_ids=[1, 2, 3], generation_token_ids=[4, 5], generation_log_probs=[-0.2, -0.1])
    if index == 1:
        dep.resources.open_session(execution, "env", {"moves": []})
    revision = dep.resources.mutate(execution, "env", lambda s: {"moves": [*s["moves"], index]})
    dep.agent.boundary(
        execution,
        AgentBoundaryRecord(
            rollout_id=execution.rollout_id,
            attempt=execution.attempt,
            boundary_index=index,
            turn_index=index,
            last_model_call_id=call_id,
            resource_revisions={"resources-0": {"env": revision}},
        ),
    )


def train_until_crash(store: ObjectStore) -> str:
    """The trainer's loop until its last checkpoint; then the process "crashes"."""
    dep = Deployment.start(store)
    registry = dep.registry
    for i in range(6):
        execution = registry.dispatch(f"prompt-{i}", input_digest=f"sha256-of-prompt-{i}")
        if i == 0:
            continue  # still queued: never started
        registry.start(execution)
        dep.agent.begin(execution)
        turn(dep, execution, 1)
        if i == 1:  # finished and handed to the trainer: its result must never run again
            dep.agent.finish(execution)
            dep.model.finish(execution)
            dep.resources.end_session(execution, "env")
            registry.finish(execution)
            registry.hand_off(execution, {"completion": "..."}, reward=1.0)
    # the trainer's own state goes into the checkpoint, next to the rollouts it belongs to
    framework_state: dict[str, Any] = {
        "trainer_step": 3,
        "trainer_checkpoint": "trainer/step-000003",
        "data_epoch": 0,
    }
    outcome = dep.coordinator.checkpoint(framework_state=framework_state)
    dep.close()  # the crash: every in-memory participant and the registry are gone
    return outcome.checkpoint_id


def decide(plan: RecoveryPlan) -> dict[str, list[str]]:
    """What the trainer does with each dispatched rollout of the checkpoint."""
    decisions: dict[str, list[str]] = {"keep_result": [], "continue": [], "rerun_from_input": []}
    for item in plan.rollouts.values():
        if item.disposition == "completed":
            decisions["keep_result"].append(item.rollout_id)  # already counted by the trainer
        elif item.disposition == "continue":
            decisions["continue"].append(item.rollout_id)  # resumes at its boundary as attempt N+1
        else:
            decisions["rerun_from_input"].append(item.rollout_id)  # fresh_dispatch: attempt N+1
    return decisions


def recover(store: ObjectStore) -> dict[str, Any]:
    # 1. load: the newest checkpoint that verifies (every object's digest checked)
    plan = load_checkpoint(store, verify=True, fallback=True)
    for skipped in plan.skipped:
        print(f"skipped {skipped.checkpoint_id}: {skipped.reason}", file=sys.stderr)
    # 2. decide: reload the trainer from framework_state; classify the rollouts
    trainer = plan.record.framework_state
    assert isinstance(trainer, dict)  # what train_until_crash stored: reload the trainer from it
    decisions = decide(plan)
    # 3. restore into fresh participants (all or nothing; they stay paused)
    dep = Deployment.start(store)
    restored = dep.coordinator.restore(plan.checkpoint_id)
    # 4. resume once the trainer is ready (reopens every participant), then continue rollouts
    #    from their boundaries and run the fresh dispatches again from their input
    dep.coordinator.resume(restored.restore_id)
    continued = []
    for item in restored.plan.continued:
        execution = item.execution.next_attempt()
        boundary = dep.agent.begin(execution)
        assert boundary is not None and boundary.attempt == execution.attempt
        dep.agent.start_turn(execution)
        turn(dep, execution, boundary.boundary_index + 1)
        continued.append(execution.rollout_id)
    rerun = []
    for info in dep.registry.executions(["queued"]):
        dep.registry.start(info.execution)  # the framework runs it again from its input
        rerun.append(info.rollout_id)
    after = dep.coordinator.checkpoint(framework_state={**trainer, "trainer_step": 4})
    dep.close()
    return {
        "checkpoint_id": plan.checkpoint_id,
        "trainer": trainer,
        "decisions": decisions,
        "continued": sorted(continued),
        "rerun": sorted(rerun),
        "next_checkpoint": after.checkpoint_id,
        "next_sequence": after.record.sequence,
    }


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else tempfile.mkdtemp(prefix="trainer-integration-")
    store = open_store(url)
    checkpoint_id = train_until_crash(store)
    summary = recover(store)
    assert summary["checkpoint_id"] == checkpoint_id
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
