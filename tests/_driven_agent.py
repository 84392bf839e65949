"""An agent server driven step by step by a test (build function for ``_serve_main.py``).

The reference agent runs whole rollouts in a thread; this one exposes each agent-participant
step as a route, so a test decides exactly where a rollout is when a checkpoint starts (in the
middle of its last turn, say) without sleeping. Every blocking call runs off the event loop.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import AgentParticipant
from rollout_checkpoint.server import (
    AsyncAdmission,
    ServedApp,
    WorkerContext,
    install_error_handlers,
    run_blocking,
)


class Attempt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attempt: int


class Boundary(Attempt):
    turn: int
    call_id: str | None
    instance: str
    revision: int


def build(context: WorkerContext) -> ServedApp:
    agent = AgentParticipant("agent")
    admission = AsyncAdmission(agent)
    app = FastAPI()
    install_error_handlers(app)

    def ex(rollout_id: str, body: Attempt) -> ExecutionId:
        return ExecutionId(rollout_id=rollout_id, attempt=body.attempt)

    @app.post("/ng-rollout/{rollout_id}/begin")
    async def begin(rollout_id: str, body: Attempt) -> dict[str, Any]:
        restored = await admission.call(lambda: agent.begin(ex(rollout_id, body)), timeout=60)
        return {"restored_turn": None if restored is None else restored.turn_index}

    @app.post("/ng-rollout/{rollout_id}/boundary")
    async def boundary(rollout_id: str, body: Boundary) -> dict[str, bool]:
        execution = ex(rollout_id, body)
        record = AgentBoundaryRecord(
            rollout_id=rollout_id,
            attempt=body.attempt,
            boundary_index=body.turn,
            turn_index=body.turn,
            last_model_call_id=body.call_id,
            resource_revisions={body.instance: {"env": body.revision}},
        )
        await run_blocking(agent.boundary, execution, record)
        return {"ok": True}

    @app.post("/ng-rollout/{rollout_id}/start_turn")
    async def start_turn(rollout_id: str, body: Attempt) -> dict[str, bool]:
        await admission.call(lambda: agent.start_turn(ex(rollout_id, body)), timeout=60)
        return {"ok": True}

    @app.post("/ng-rollout/{rollout_id}/finish")
    async def finish(rollout_id: str, body: Attempt) -> dict[str, bool]:
        await run_blocking(agent.finish, ex(rollout_id, body))
        return {"ok": True}

    return ServedApp(app=app, participant=agent)
