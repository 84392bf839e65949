"""Reference participants behind HTTP for ``demo_scale.py``: one build function per kind, and
the populate step shared with the in-process baseline (so both measure the same state).

Every parked rollout has what ``checkpoint_cycle.py`` gives it: an agent boundary with
``--state-bytes`` of opaque state, one staged model call, one resources session at revision 1.
Run as a script it serves one kind: ``python _scale_servers.py KIND STORE PORT WORKERS``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from fastapi import FastAPI
from pydantic import BaseModel

from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import AgentParticipant, PolicyModelParticipant, ResourcesParticipant
from rollout_checkpoint.server import (
    ServedApp,
    WorkerContext,
    install_error_handlers,
    run_blocking,
    run_server,
)
from rollout_checkpoint.tokens import ObjectStoreTokenStore, TokenEntry

STATE_BYTES = int(os.environ.get("DEMO_SCALE_STATE_BYTES", "2048"))


class Populate(BaseModel):
    rollout_ids: list[str]


def _e(rollout_id: str) -> ExecutionId:
    return ExecutionId(rollout_id=rollout_id, attempt=0)


def populate_agent(agent: AgentParticipant, ids: Sequence[str]) -> None:
    for rollout_id in ids:
        agent.begin(_e(rollout_id))
        agent.boundary(
            _e(rollout_id),
            AgentBoundaryRecord(
                rollout_id=rollout_id,
                attempt=0,
                boundary_index=1,
                turn_index=1,
                last_model_call_id="call-1",
                resource_revisions={"env": 1},
                output_items=[{"role": "assistant", "content": "move 1"}],
                usage={"input_tokens": 4, "output_tokens": 2},
                agent_state=os.urandom(STATE_BYTES),
            ),
        )


def populate_model(model: PolicyModelParticipant, tokens: ObjectStoreTokenStore, ids: Sequence[str]) -> None:
    # one shard for the whole batch first; the per-call puts below then find their entry stored
    tokens.put_many([_entry(r) for r in ids])
    for rollout_id in ids:
        with model.call(_e(rollout_id), "call-1", policy_version="v1") as call:
            call.stage(
                prompt_token_ids=[1, 2, 3, 4], generation_token_ids=[5, 6], generation_log_probs=[-0.1, -0.2]
            )


def _entry(rollout_id: str, call_id: str = "call-1") -> TokenEntry:
    return TokenEntry(
        rollout_id=rollout_id,
        attempt=0,
        call_id=call_id,
        prompt_token_ids=[1, 2, 3, 4],
        generation_token_ids=[5, 6],
        generation_log_probs=[-0.1, -0.2],
        mask=[1, 1],
    )


def populate_resources(resources: ResourcesParticipant, ids: Sequence[str]) -> None:
    for rollout_id in ids:
        resources.open_session(_e(rollout_id), "env", {"board": [0, 0, 0], "turn": 0})
        resources.mutate(_e(rollout_id), "env", lambda s: {"board": [1, 0, 0], "turn": 1})


def advance_agent(agent: AgentParticipant, ids: Sequence[str], turn: int) -> None:
    """Move every rollout in ``ids`` one turn on (to ``turn``): a new boundary with new state."""
    for rollout_id in ids:
        agent.start_turn(_e(rollout_id))
        agent.boundary(
            _e(rollout_id),
            AgentBoundaryRecord(
                rollout_id=rollout_id,
                attempt=0,
                boundary_index=turn,
                turn_index=turn,
                last_model_call_id=f"call-{turn}",
                resource_revisions={"env": turn},
                output_items=[{"role": "assistant", "content": f"move {turn}"}],
                usage={"input_tokens": 4 * turn, "output_tokens": 2 * turn},
                agent_state=os.urandom(STATE_BYTES),
            ),
        )


def advance_model(
    model: PolicyModelParticipant, tokens: ObjectStoreTokenStore, ids: Sequence[str], turn: int
) -> None:
    """One more staged model call (``call-TURN``) for every rollout in ``ids``."""
    tokens.put_many([_entry(r, f"call-{turn}") for r in ids])
    for rollout_id in ids:
        with model.call(_e(rollout_id), f"call-{turn}", policy_version="v1") as call:
            call.stage(
                prompt_token_ids=[1, 2, 3, 4], generation_token_ids=[5, 6], generation_log_probs=[-0.1, -0.2]
            )


def advance_resources(resources: ResourcesParticipant, ids: Sequence[str], turn: int) -> None:
    """One more revision of every session in ``ids``."""
    for rollout_id in ids:
        resources.mutate(_e(rollout_id), "env", lambda s, t=turn: {"board": [1, t, 0], "turn": t})


class Advance(BaseModel):
    rollout_ids: list[str]
    turn: int


def _app(participant: object, populate: object, advance: object = None) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/ng-rollout/{rollout_id}/bench/populate")
    async def populate_route(rollout_id: str, body: Populate) -> dict[str, int]:
        await run_blocking(populate, body.rollout_ids)  # type: ignore[arg-type]
        return {"populated": len(body.rollout_ids)}

    @app.post("/ng-rollout/{rollout_id}/bench/advance")
    async def advance_route(rollout_id: str, body: Advance) -> dict[str, int]:
        await run_blocking(advance, body.rollout_ids, body.turn)  # type: ignore[arg-type]
        return {"advanced": len(body.rollout_ids)}

    return app


def warm_store(context: WorkerContext) -> None:
    """Pay the store's first-use costs (S3: the client session and the conditional-put probe,
    cached per process) when the worker starts, not inside the first checkpoint's pause; the
    reference servers do the same."""
    probe = getattr(context.store, "probe_conditional_writes", None)
    if callable(probe):
        probe()


def build_agent(context: WorkerContext) -> ServedApp:
    warm_store(context)
    agent = AgentParticipant("agent-0")
    return ServedApp(
        app=_app(
            agent,
            lambda ids: populate_agent(agent, ids),
            lambda ids, turn: advance_agent(agent, ids, turn),
        ),
        participant=agent,
    )


def build_model(context: WorkerContext) -> ServedApp:
    warm_store(context)
    tokens = ObjectStoreTokenStore(context.store)
    model = PolicyModelParticipant(tokens, "policy-0")
    return ServedApp(
        app=_app(
            model,
            lambda ids: populate_model(model, tokens, ids),
            lambda ids, turn: advance_model(model, tokens, ids, turn),
        ),
        participant=model,
    )


def build_resources(context: WorkerContext) -> ServedApp:
    warm_store(context)
    resources = ResourcesParticipant("resources-0", mode="exported")
    return ServedApp(
        app=_app(
            resources,
            lambda ids: populate_resources(resources, ids),
            lambda ids, turn: advance_resources(resources, ids, turn),
        ),
        participant=resources,
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    kind, store, port, workers = sys.argv[1:5]
    run_server(
        f"_scale_servers:build_{kind}",
        store=store,
        host="127.0.0.1",
        port=int(port),
        token=os.environ["ROLLOUT_CHECKPOINT_TOKEN"],
        workers=int(workers),
    )
