"""A small counter environment served by the SDK's server machinery (tests' build function).

Each rollout has one session ``s`` whose state is ``{"n": ...}``; every response says which
worker process served it, so tests can check that a session's requests reach its owner.
"""

from __future__ import annotations

import os
import time
from typing import Any

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel

from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import ResourcesParticipant
from rollout_checkpoint.server import (
    AsyncAdmission,
    ServedApp,
    WorkerContext,
    install_error_handlers,
    run_blocking,
)


class Call(BaseModel):
    attempt: int
    hold_s: float = 0.0


def build(context: WorkerContext) -> ServedApp:
    participant = ResourcesParticipant("counter-0", mode="exported")
    admission = AsyncAdmission(participant)
    app = FastAPI()
    install_error_handlers(app)

    def reply(n: int, revision: int) -> dict[str, Any]:
        return {"worker": context.worker_id, "pid": os.getpid(), "n": n, "revision": revision}

    @app.get("/whoami")
    async def whoami() -> dict[str, Any]:
        return {"worker": context.worker_id, "pid": os.getpid()}

    @app.post("/ng-rollout/{rollout_id}/sessions")
    async def open_session(rollout_id: str, call: Call) -> dict[str, Any]:
        execution = ExecutionId(rollout_id=rollout_id, attempt=call.attempt)
        await admission.call(lambda: participant.open_session(execution, "s", {"n": 0}), timeout=60)
        return reply(0, 0)

    @app.post("/ng-rollout/{rollout_id}/inc")
    async def inc(rollout_id: str, call: Call) -> dict[str, Any]:
        execution = ExecutionId(rollout_id=rollout_id, attempt=call.attempt)

        def step(state: Any) -> Any:
            time.sleep(call.hold_s)  # a slow environment step: an in-flight mutation
            return {"n": state["n"] + 1}

        revision = await admission.call(lambda: participant.mutate(execution, "s", step), timeout=60)
        state, _ = await run_blocking(participant.state, execution, "s")
        return reply(state["n"], revision)

    @app.get("/ng-rollout/{rollout_id}/state")
    async def state(rollout_id: str, attempt: int) -> dict[str, Any]:
        execution = ExecutionId(rollout_id=rollout_id, attempt=attempt)
        value, revision = await run_blocking(participant.state, execution, "s")
        return reply(value["n"], revision)

    @app.post("/ng-rollout/{rollout_id}/cookie")
    async def cookie(rollout_id: str, request: Request, response: Response) -> dict[str, Any]:
        """Sets an app cookie and echoes the cookies the request carried."""
        response.set_cookie("app_session", rollout_id)
        return {"worker": context.worker_id, "cookies": dict(request.cookies)}

    return ServedApp(app=app, participant=participant)
