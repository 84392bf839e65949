"""A test-only Gym server for the simple agent (imported by a server process through PYTHONPATH):
Gym's ``example_session_state_mgmt`` counter whose ``/increment_counter`` is a line of
``$RC_TEST_TOOL_LOG`` (the capture key and the count) once it changed the counter, so a test
counts tool calls where they are served."""

from __future__ import annotations

import json
import os
from typing import Any

from fastapi import Request
from nemo_gym.rollout_correlation import current_rollout_id
from resources_servers.example_session_state_mgmt.app import (
    IncrementCounterRequest,
    StatefulCounterResourcesServer,
)


class LoggedCounter(StatefulCounterResourcesServer):
    async def increment_counter(self, request: Request, body: IncrementCounterRequest) -> Any:
        result = await super().increment_counter(request, body)
        with open(os.environ["RC_TEST_TOOL_LOG"], "a") as log:
            log.write(json.dumps({"key": current_rollout_id(), "count": body.count}) + "\n")
        return result
