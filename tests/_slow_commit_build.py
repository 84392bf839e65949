"""A build function whose participant's commit holds the interpreter (the GIL) for a while.

As many seconds as the file named by ``ROLLOUT_CHECKPOINT_TEST_HOLD_FILE`` says (0 without it),
in one native call that keeps the GIL (``ctypes.PyDLL``: libc's ``usleep`` called with the GIL
held), so no other thread of the worker process runs meanwhile, uvicorn's health-check
answering thread included: what the export of tens of thousands of rollouts looks like to
uvicorn's supervisor when one Arrow conversion or one garbage collection takes seconds on a
loaded host.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import ResourcesParticipant
from rollout_checkpoint.server import ServedApp, WorkerContext, install_error_handlers

HOLD_ENV = "ROLLOUT_CHECKPOINT_TEST_HOLD_FILE"
_LIBC = ctypes.PyDLL(None)  # PyDLL: the GIL stays held during the call


class SlowCommit(ResourcesParticipant):
    def commit(self, *args: Any, **kwargs: Any) -> Any:
        hold = Path(os.environ[HOLD_ENV]) if HOLD_ENV in os.environ else None
        seconds = float(hold.read_text()) if hold is not None and hold.exists() else 0.0
        _LIBC.usleep(ctypes.c_uint(int(seconds * 1_000_000)))
        return super().commit(*args, **kwargs)


def build(context: WorkerContext) -> ServedApp:
    participant = SlowCommit("slow-0", mode="exported")
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/whoami")
    async def whoami() -> dict[str, Any]:
        return {"worker": context.worker_id, "pid": os.getpid()}

    @app.post("/ng-rollout/{rollout_id}/sessions")
    def open_session(rollout_id: str) -> dict[str, Any]:
        participant.open_session(ExecutionId(rollout_id=rollout_id, attempt=0), "s", {"n": 0})
        return {"worker": context.worker_id}

    return ServedApp(app=app, participant=participant)
