"""The ``demo`` command and the demo deployment it and ``benchmarks/checkpoint_cycle.py`` share."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from ..coordinator import CheckpointOutcome, Coordinator, RestoreOutcome
from ..errors import CheckpointError
from ..ids import ExecutionId
from ..participants import AgentParticipant, PolicyModelParticipant, ResourcesParticipant
from ..records import AgentBoundaryRecord
from ..recovery import load_checkpoint
from ..registry import LiveExecutionRegistry
from ..store import ObjectStore, open_store
from ..tokens import ObjectStoreTokenStore, TokenEntry, TokenPutReceipt
from ._checkpoints import render_plan
from ._common import AcceptUnsafeOpt, Command, EndpointOpt, JsonOpt
from ._common import console as _console
from ._common import fail as _fail

__all__ = ["DEFAULT_DEMO_DIR", "DemoDeployment", "demo_command", "register"]

DEFAULT_DEMO_DIR = "./demo-checkpoints"


# -- the demo deployment (shared with the benchmark) ------------------------------------------------


class _BatchingSink:
    """A token sink that hands out receipts at once and writes the entries in one shard on
    :meth:`flush`. Only for demos and benchmarks that create many calls before one checkpoint:
    call ``flush`` before the checkpoint (a real sink returns only once an entry is durable)."""

    def __init__(self, inner: ObjectStoreTokenStore) -> None:
        self.inner = inner
        self._pending: list[TokenEntry] = []

    @property
    def name(self) -> str:
        return self.inner.name

    def put(self, entry: TokenEntry) -> TokenPutReceipt:
        self._pending.append(entry)
        return entry.receipt()

    def flush(self) -> int:
        pending, self._pending = self._pending, []
        if pending:
            self.inner.put_many(pending)
        return len(pending)


class DemoDeployment:
    """In-process participants of each kind (agent, policy model, resources) with a registry,
    a reference token store and a coordinator, all on one store."""

    def __init__(self, store: str | ObjectStore, *, accept_unsafe_store: bool = False) -> None:
        self.store = open_store(store)
        self.tokens = ObjectStoreTokenStore(self.store)
        self.sink = _BatchingSink(self.tokens)
        self.agent = AgentParticipant("agent-0")
        self.model = PolicyModelParticipant(self.sink, "policy-0")
        self.resources = ResourcesParticipant("resources-0", mode="exported")
        self.participants = [self.agent, self.model, self.resources]
        self.registry = LiveExecutionRegistry()
        self.coordinator = Coordinator(
            self.store, self.participants, self.registry, self.tokens, accept_unsafe_store=accept_unsafe_store
        )
        self._agent_states: Iterator[bytes] | None = None

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
        self._agent_states = agent_states
        counts = {"handed_off": 0, "queued": 0, "restart_only": 0, "at_boundary": 0}
        registry = self.registry
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
                self._turn(e)
                counts["at_boundary"] += 1
        self.sink.flush()
        return counts

    def _turn(self, e: ExecutionId) -> None:
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
                resource_revisions={"env": revision},
                output_items=[{"role": "assistant", "content": "move 1"}],
                usage={"input_tokens": 4, "output_tokens": 2},
                agent_state=next(self._agent_states) if self._agent_states is not None else b'{"scratch": 1}',
            ),
        )

    def checkpoint(self, checkpoint_id: str | None = None, **kwargs: Any) -> CheckpointOutcome:
        self.sink.flush()
        return self.coordinator.checkpoint(checkpoint_id, **kwargs)

    def restore(self, checkpoint_id: str | None = None) -> RestoreOutcome:
        return self.coordinator.restore(checkpoint_id)


# -- demo -------------------------------------------------------------------------------------------


def demo_command(
    directory: Annotated[
        str, typer.Argument(help="Store URL or directory for the demo checkpoints.", metavar="DIRECTORY")
    ] = DEFAULT_DEMO_DIR,
    rollouts: Annotated[int, typer.Option("--rollouts", min=1, help="Live rollouts to create.")] = 20,
    endpoint_url: EndpointOpt = None,
    accept_unsafe_store: AcceptUnsafeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """The main job end to end: live rollouts -> checkpoint -> crash -> classify -> restore."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
    options: dict[str, Any] = {"accept_unsafe_store": True} if accept_unsafe_store else {}
    if directory.lower().startswith(("s3://", "s3a://")) and endpoint:
        options["endpoint_url"] = endpoint
    console = _console(stderr=as_json)
    try:
        store = open_store(directory, **options)
        live = DemoDeployment(store, accept_unsafe_store=accept_unsafe_store)
        made = live.populate(rollouts)
        console.print(f"1. {rollouts} live rollouts across agent, policy model and resources: {made}")
        outcome = live.checkpoint()
        console.print(
            f"2. published {outcome.checkpoint_id} to {store.url} "
            f"(paused {outcome.pause_seconds * 1000:.1f} ms)"
        )
        live.close()
        del live  # 3. the crash: every in-memory participant and the registry are gone
        console.print("3. crash: in-memory participants dropped")
        plan = load_checkpoint(store, outcome.checkpoint_id)
        console.print("4. recovery plan:")
        if not as_json:
            render_plan(plan, console, limit=10)
        fresh = DemoDeployment(store, accept_unsafe_store=accept_unsafe_store)
        restored = fresh.restore(outcome.checkpoint_id)
        fresh.coordinator.resume(restored.restore_id)
        continued = [p.execution.next_attempt() for p in plan.continued]
        picked_up = sum(1 for e in continued if fresh.agent.begin(e) is not None)
        console.print(
            f"5. restored into fresh participants as {restored.restore_id}: "
            f"{picked_up} rollouts continue from their boundary at attempt N+1, "
            f"{len(plan.fresh)} re-dispatched from their input, {len(plan.completed)} results kept"
        )
        fresh.close()
    except CheckpointError as exc:
        raise _fail(exc, as_json) from None
    if as_json:
        print(
            json.dumps(
                {
                    "ok": True,
                    "url": store.url,
                    "checkpoint_id": outcome.checkpoint_id,
                    "restore_id": restored.restore_id,
                    "created": made,
                    "counts": plan.counts(),
                    "continued_from_boundary": picked_up,
                }
            )
        )


def register(app: typer.Typer) -> None:
    """Add ``demo`` to ``app``."""
    app.command("demo", cls=Command)(demo_command)
