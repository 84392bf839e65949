"""Test-only Gym servers for the simple agent (imported by server processes through PYTHONPATH).

* :class:`ToolCallingModel` - the SDK's scripted Gym model server (its policy-model participant,
  its gate: while ``hold_file`` exists ``step-2`` and later calls wait and are lines of
  ``hold_log``) whose reply is a pure function of the conversation: while it holds fewer than
  ``increments`` tool outputs it asks for ``increment_counter`` with ``count = <outputs so far> +
  1``, then answers with a message. Each delivered reply is a line of ``call_log`` (capture key,
  ``x-rc-call-id``, step).
* :class:`LoggedCounter` - Gym's ``example_session_state_mgmt`` counter whose ``/increment_counter``
  is a line of ``$RC_TEST_TOOL_LOG`` (the capture key and the count) once it changed the counter.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastapi import Body, Request
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollout_correlation import current_rollout_id
from resources_servers.example_session_state_mgmt.app import (
    IncrementCounterRequest,
    StatefulCounterResourcesServer,
)

from rollout_checkpoint.errors import CheckpointError
from rollout_checkpoint.integrations.nemo_gym.identity import execution_from_capture_key
from rollout_checkpoint.integrations.nemo_gym.model import ScriptedModelConfig, ScriptedResponsesModel
from rollout_checkpoint.participants import PolicyModelParticipant
from rollout_checkpoint.server import AsyncAdmission, error_response, run_blocking, status_for

_BODY = Body()


class ToolCallingModelConfig(ScriptedModelConfig):
    increments: int = 3


def _append(path: str | None, line: dict[str, Any]) -> None:
    if path:
        with open(path, "a") as log:
            log.write(json.dumps(line) + "\n")


class ToolCallingModel(ScriptedResponsesModel):
    """The scripted model's participant, gate and logs; tool-calling replies."""

    config: ToolCallingModelConfig

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming = _BODY) -> Any:
        key = current_rollout_id()
        call_id = request.headers.get("x-rc-call-id")
        if key is None or not call_id:
            return error_response(400, "rollout_id_required", "a capture key and x-rc-call-id are needed")
        items = body.model_dump(mode="json")["input"]
        done = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")
        await self._held(key, call_id)  # the gate: step-2 and later wait while hold_file exists
        if done < self.config.increments:
            output: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc-{done + 1}",
                "call_id": f"call-{done + 1}",
                "name": "increment_counter",
                "arguments": json.dumps({"count": done + 1}),
                "status": "completed",
            }
        else:
            output = {
                "type": "message",
                "id": "msg-final",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": f"done after {done}", "annotations": []}],
            }
        participant: PolicyModelParticipant = self.__dict__["_rc_participant"]
        admission: AsyncAdmission = self.__dict__["_rc_admission"]
        try:
            execution = execution_from_capture_key(key)
            call = await admission.call(lambda: participant.admit(execution, call_id), timeout=300)
            try:
                await run_blocking(
                    lambda: call.stage(
                        prompt_token_ids=[1] * len(items),
                        generation_token_ids=[2],
                        generation_log_probs=[0.0],
                    )
                )
            finally:
                call.close()
        except CheckpointError as exc:
            return error_response(status_for(exc), exc.code, exc.message)
        _append(self.config.call_log, {"key": key, "call_id": call_id, "step": done + 1})
        return NeMoGymResponse.model_validate(
            {
                "id": f"resp-{key}-{done + 1}",
                "created_at": 0,
                "model": "tool-calling",
                "object": "response",
                "output": [output],
                "parallel_tool_calls": False,
                "tool_choice": "auto",
                "tools": [],
                "usage": {
                    "input_tokens": len(items),
                    "output_tokens": 1,
                    "total_tokens": len(items) + 1,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens_details": {"reasoning_tokens": 0},
                },
            }
        )


class LoggedCounter(StatefulCounterResourcesServer):
    async def increment_counter(self, request: Request, body: IncrementCounterRequest) -> Any:
        result = await super().increment_counter(request, body)
        _append(os.environ.get("RC_TEST_TOOL_LOG"), {"key": current_rollout_id(), "count": body.count})
        return result
