"""A resumable variant of Gym's gymnasium agent.

Gym's ``GymnasiumAgent.run`` keeps a whole rollout in one coroutine (``/reset``, then per step
a model call and a ``/step``) and records no boundary, so a crash loses the rollout. This
subclass (no change to Gym) runs the same loop with Gym's own client, request and response
types, and:

* keys the run by the rollout identity of its ``/run`` body (``_ng_rollout_id`` or
  ``<task index>-<rollout index>``, plus ``_ng_attempt_index``) and admits it through an
  :class:`~rollout_checkpoint.participants.AgentParticipant` (parked while a checkpoint runs);
* reports an :class:`~rollout_checkpoint.records.AgentBoundaryRecord` after the reset and after
  each completed step: output items, usage, the resources server's cookies, the last model call
  id, the resources session's revision (from the ``x-rc-revision`` reply header);
* parks while it waits on the model (the first call since a boundary), and a reply that arrives
  while a checkpoint is open waits for resume before the step runs;
* resumes a restored rollout at its boundary: no ``/reset``, the same session cookie (the
  resources server restored that session under the new attempt), and the next step's model call
  (``step-<n>``, sent as ``x-rc-call-id``) is the first one issued, so no completed model call or
  tool call is repeated.

Every wait is awaited (no thread is held while a run is parked).
"""

from __future__ import annotations

import json
from contextlib import suppress
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from ...errors import CheckpointError
from ...format.records import AgentBoundaryRecord
from ...ids import ExecutionId
from ...participants import AgentParticipant
from ...server import AsyncAdmission, error_response, run_blocking
from ._agent_setup import install_agent_participant
from .identity import IDENTITY_SETTING, execution_from_run_body
from .resources import INSTANCE_HEADER, REVISION_HEADER, SESSION_HEADER

__all__ = ["CALL_ID_HEADER", "CheckpointedGymnasiumAgent"]

CALL_ID_HEADER = "x-rc-call-id"
FINISH_PATH = "/rollout_checkpoint/finish"  # the scripted model's route (404 elsewhere: ignored)
WAIT_SECONDS = 300.0

from nemo_gym.openai_utils import (  # noqa: E402  (Gym is imported lazily: this module needs it)
    NeMoGymEasyInputMessage,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.server_utils import get_response_json, raise_for_status  # noqa: E402
from resources_servers.gymnasium import EnvResetResponse, EnvStepResponse  # noqa: E402
from responses_api_agents.gymnasium_agent.app import (  # noqa: E402
    GymnasiumAgent,
    GymnasiumAgentRunRequest,
    GymnasiumRunResponse,
)


def _cookies(jar: Any) -> dict[str, str]:
    return {k: (v.value if hasattr(v, "value") else str(v)) for k, v in dict(jar or {}).items()}


def _revision(response: Any) -> dict[str, dict[str, int]]:
    instance = response.headers.get(INSTANCE_HEADER)
    session = response.headers.get(SESSION_HEADER)
    revision = response.headers.get(REVISION_HEADER)
    if instance and session and revision is not None:
        return {instance: {session: int(revision)}}
    return {}


def _add_usage(total: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, Any] | None:
    if more is None:
        return total
    if total is None:
        return dict(more)
    out = dict(total)
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        out[key] = int(out.get(key) or 0) + int(more.get(key) or 0)
    return out


class CheckpointedGymnasiumAgent(GymnasiumAgent):
    """Gym's gymnasium agent, checkpointed (see the module docstring)."""

    def setup_webserver(self) -> Any:
        app = super().setup_webserver()
        participant = install_agent_participant(app, str(self.config.name), "the checkpointed agent")
        self._rc_participant = participant  # kept outside pydantic's fields (see __setattr__)
        return app

    @property
    def participant(self) -> AgentParticipant:
        value: AgentParticipant = self.__dict__["_rc_participant"]
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_rc_participant":  # keep it out of pydantic's fields
            self.__dict__[name] = value
            self.__dict__["_rc_admission"] = AsyncAdmission(value)
            return
        super().__setattr__(name, value)

    async def run(self, request: Request, body: GymnasiumAgentRunRequest) -> Any:
        fields = {**(body.model_extra or {}), "_ng_rollout_id": body.capture_rollout_id}
        try:
            execution = execution_from_run_body(fields)
        except CheckpointError as exc:
            return error_response(400, exc.code, exc.message)
        if execution is None:
            return error_response(
                400,
                "rollout_id_required",
                f"a checkpointed /run needs a rollout identity: {IDENTITY_SETTING}",
            )
        participant = self.participant
        admission: AsyncAdmission = self.__dict__["_rc_admission"]
        restored = await admission.call(lambda: participant.begin(execution), timeout=WAIT_SECONDS)
        try:
            result = await self._run_checkpointed(request, body, execution, restored)
        except BaseException:
            with suppress(CheckpointError):
                participant.finish(execution)
            raise
        with suppress(CheckpointError):
            participant.finish(execution)
        with suppress(Exception):  # the model drops the finished rollout's lineage (best effort)
            await self.server_client.post(
                server_name=self.config.model_server.name,
                url_path=self.url_path_for_run(FINISH_PATH, body),
                json={},
            )
        return result

    async def _post(self, server: str, path: str, **kwargs: Any) -> Any:
        response = await self.server_client.post(server_name=server, url_path=path, **kwargs)
        if response.status >= 400:
            try:
                error = (await get_response_json(response))["error"]
                code, detail = str(error["code"]), str(error["detail"])
            except Exception:
                await raise_for_status(response)
                raise
            return JSONResponse({"error": {"code": code, "detail": detail}}, status_code=response.status)
        return response

    async def _run_checkpointed(
        self,
        request: Request,
        body: GymnasiumAgentRunRequest,
        execution: ExecutionId,
        restored: AgentBoundaryRecord | None,
    ) -> Any:
        participant = self.participant
        admission: AsyncAdmission = self.__dict__["_rc_admission"]
        resources = self.config.resources_server.name
        model = self.config.model_server.name
        model_path = self.url_path_for_run("/v1/responses", body)
        if restored is None:
            env_cookies = _cookies(request.cookies)
            reset = await self._post(resources, "/reset", json=body.model_dump(), cookies=env_cookies)
            if isinstance(reset, JSONResponse):
                return reset
            env_cookies.update(_cookies(reset.cookies))
            reset_data = EnvResetResponse.model_validate(await get_response_json(reset))
            params = body.responses_create_params.model_copy(deep=True)
            if isinstance(params.input, str):
                params.input = [NeMoGymEasyInputMessage(role="user", content=params.input)]
            if reset_data.observation:
                params.input = [
                    *params.input,
                    NeMoGymEasyInputMessage(role="user", content=reset_data.observation),
                ]
            state: dict[str, Any] = {
                "params": params.model_dump(mode="json", exclude_unset=True),
                "outputs": [],
                "reward": 0.0,
                "usage": None,
                "env_cookies": env_cookies,
                "model_cookies": {},
                "turn": 0,
                "revisions": _revision(reset),
                "last_call": None,
                "steps": [],
            }
            self._boundary(execution, state)
        else:
            state = json.loads(restored.agent_state or b"{}")
        step_data = EnvStepResponse(terminated=False, truncated=True, reward=0.0)
        last_response: dict[str, Any] | None = state.get("last_response")
        finished = False
        while state["turn"] < self.config.max_steps:
            turn = state["turn"] + 1
            await admission.call(lambda: participant.start_turn(execution), timeout=WAIT_SECONDS)
            call_id = f"step-{turn}"
            params_doc = {**state["params"], "input": [*state["params"]["input"], *state["outputs"]]}
            waiting = participant.awaiting_model(execution, call_id)
            waiting.__enter__()
            try:
                model_resp = await self._post(
                    model,
                    model_path,
                    json=params_doc,
                    cookies=state["model_cookies"],
                    headers={CALL_ID_HEADER: call_id},
                )
                if isinstance(model_resp, JSONResponse):
                    raise _Refused(model_resp)
                model_doc = await get_response_json(model_resp)
            except BaseException as exc:
                await run_blocking(waiting.__exit__, type(exc), exc, exc.__traceback__)
                if isinstance(exc, _Refused):
                    return exc.response
                raise
            await admission.wait_open(WAIT_SECONDS)  # a reply during a checkpoint waits for resume
            await run_blocking(waiting.__exit__, None, None, None)
            model_response = NeMoGymResponse.model_validate(model_doc)
            state["model_cookies"] = {**state["model_cookies"], **_cookies(model_resp.cookies)}
            outputs = [item.model_dump(mode="json", exclude_unset=True) for item in model_response.output]
            state["outputs"] = [*state["outputs"], *outputs]
            usage = model_response.usage.model_dump(mode="json") if model_response.usage else None
            state["usage"] = _add_usage(state["usage"], usage)
            last_response = model_response.model_dump(mode="json")
            step_body = body.model_dump() | {"response": model_response.model_dump()}
            step = await self._post(resources, "/step", json=step_body, cookies=state["env_cookies"])
            if isinstance(step, JSONResponse):
                return step
            step_data = EnvStepResponse.model_validate(await get_response_json(step))
            state["env_cookies"] = {**state["env_cookies"], **_cookies(step.cookies)}
            state["reward"] += step_data.reward
            state["turn"] = turn
            state["last_call"] = call_id
            state["steps"] = [*state["steps"], {"turn": turn, "attempt": execution.attempt}]
            if step_data.terminated or step_data.truncated:
                finished = True
                break
            for tool_output in (step_data.info or {}).get("tool_outputs", []):
                state["outputs"].append(
                    {
                        "type": "function_call_output",
                        "call_id": tool_output["call_id"],
                        "output": tool_output["output"],
                    }
                )
            if step_data.observation:
                state["outputs"].append({"role": "user", "content": step_data.observation, "type": "message"})
            state["revisions"] = _revision(step) or state["revisions"]
            state["last_response"] = last_response
            self._boundary(execution, state)
        if not finished:
            step_data = step_data.model_copy(update={"truncated": True})
        if last_response is None:
            raise RuntimeError("the rollout ended without a model response")
        final = NeMoGymResponse.model_validate(
            {**last_response, "output": state["outputs"], "usage": state["usage"]}
        )
        return GymnasiumRunResponse(
            responses_create_params=NeMoGymResponseCreateParamsNonStreaming.model_validate(state["params"]),
            response=final,
            reward=state["reward"],
            terminated=step_data.terminated,
            truncated=step_data.truncated,
            info=step_data.info,
            rollout_checkpoint={
                "attempt": execution.attempt,
                "restored_turn": None if restored is None else restored.turn_index,
                "steps": state["steps"],
            },
        )

    def _boundary(self, execution: ExecutionId, state: dict[str, Any]) -> None:
        usage = {k: int(v) for k, v in (state["usage"] or {}).items() if isinstance(v, int)}
        self.participant.boundary(
            execution,
            AgentBoundaryRecord(
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                boundary_index=state["turn"],
                turn_index=state["turn"],
                last_model_call_id=state["last_call"],
                resource_revisions=state["revisions"],
                output_items=state["outputs"],
                usage=usage,
                cookies=state["env_cookies"],
                agent_state=json.dumps(state, separators=(",", ":"), sort_keys=True).encode(),
            ),
        )


class _Refused(Exception):
    def __init__(self, response: JSONResponse) -> None:
        super().__init__("refused")
        self.response = response
