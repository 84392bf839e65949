"""A resumable variant of Gym's ``simple_agent``.

Gym's ``SimpleAgent`` keeps a rollout in one coroutine (``/seed_session``, then per step a model
call and the tool calls it asks for, then ``/verify``) and records no boundary, so a crash loses
the rollout. This subclass (no change to Gym) runs the same loop with Gym's own client, request
and response types (``SimpleAgentRunRequest``, ``NeMoGymResponse``, ``SimpleAgentVerifyResponse``)
and:

* keys ``/run`` by the rollout identity of its body (``_ng_rollout_id`` or ``<task index>-<rollout
  index>``, plus ``_ng_attempt_index``) and a direct ``/ng-rollout/<capture key>/v1/responses``
  by its path, and admits the run through an
  :class:`~rollout_checkpoint.participants.AgentParticipant` (parked while a checkpoint runs);
* sends every downstream call under the ``/ng-rollout/<capture key>/`` prefix itself, so the
  model and the resources server learn the identity whether or not ``observability_enabled`` is
  set, and each model call carries ``x-rc-call-id: step-<n>``;
* reports an :class:`~rollout_checkpoint.records.AgentBoundaryRecord` after ``/seed_session``
  (boundary 0) and after each completed model call and its tool calls: output items, usage, the
  model's and the resources server's cookies, the last model call id, the resources session's
  revision (``x-rc-revision``);
* parks while it waits on the model (the first call since a boundary); a reply that arrives while
  a checkpoint is open waits for resume before its tool calls run;
* resumes a restored rollout (attempt N+1) at its boundary: no new ``/seed_session``, the same
  cookies, the next step's model call is the first one issued, so no completed model or tool call
  is repeated; ``max_steps`` counts the steps the earlier attempts took.

A run that ends (its final model reply, ``max_steps``, an error) is finished before it answers,
so a terminal run is never exported. An agent-session activation (``/v1/agent_sessions``, then
``/v1/responses`` under the session cookie) lives in the agent's own session table, which a
restore cannot rebuild: it is tracked restart-only (its rollout is dispatched afresh).
"""

from __future__ import annotations

import json
from contextlib import suppress
from typing import Any

from fastapi import Request, Response

from ...errors import CheckpointError
from ...format.records import AgentBoundaryRecord
from ...ids import ExecutionId
from ...participants import AgentParticipant
from ...server import AsyncAdmission, error_response, run_blocking
from ._agent_setup import install_agent_participant
from ._simple_steps import (
    EPISODE,
    Episode,
    Refused,
    build_trajectory,
    item_json,
    now,
    raise_refusal,
    tool_call,
    typed_items,
)
from .agent import CALL_ID_HEADER, FINISH_PATH, WAIT_SECONDS, _cookies, _revision
from .identity import execution_from_capture_key, execution_from_run_body

__all__ = ["CheckpointedSimpleAgent"]

from nemo_gym.base_responses_api_agent import Body
from nemo_gym.openai_utils import (
    NeMoGymEasyInputMessage,
    NeMoGymFunctionCallOutput,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseUsage,
    accumulate_response_usage,
)
from nemo_gym.rollout_observability import (
    ModelCallRef,
    ObservationGap,
    TrajectoryRecord,
    TrajectoryToolCall,
    TrajectoryTurn,
)
from nemo_gym.server_utils import get_response_json, raise_for_status, rollout_path_prefix
from nemo_gym.tool_access import DirectHTTPToolAccess
from responses_api_agents.simple_agent.app import (
    SimpleAgent,
    SimpleAgentRunRequest,
    SimpleAgentVerifyResponse,
)

_BODY = Body()
_RUN_IDENTITY = (
    "a checkpointed /run needs a rollout identity in its body: `_ng_rollout_id` (or "
    "`_ng_task_index` and `_ng_rollout_index`), plus `_ng_attempt_index` after the first attempt"
)
_RESPONSES_IDENTITY = (
    "a checkpointed /v1/responses needs a rollout identity: call /ng-rollout/<rollout id>/v1/responses "
    "(/ng-rollout/<rollout id>-a<N>/... for attempt N), seed an agent session with an episode_id, "
    "or use /run"
)


class CheckpointedSimpleAgent(SimpleAgent):
    """Gym's simple agent, checkpointed (see the module docstring)."""

    def setup_webserver(self) -> Any:
        app = super().setup_webserver()
        participant = install_agent_participant(app, str(self.config.name), "the checkpointed simple agent")
        self.__dict__["_rc_participant"] = participant  # kept outside pydantic's fields
        self.__dict__["_rc_admission"] = AsyncAdmission(participant)
        return app

    @property
    def participant(self) -> AgentParticipant:
        value: AgentParticipant = self.__dict__["_rc_participant"]
        return value

    @property
    def _admission(self) -> AsyncAdmission:
        value: AsyncAdmission = self.__dict__["_rc_admission"]
        return value

    # -- entry points -------------------------------------------------------------------------------
    async def run(self, request: Request, body: SimpleAgentRunRequest) -> Any:
        if not self.config.execute_tools or self.config.resources_server is None:
            return await super().run(request, body)  # Gym's own refusal, unchanged
        try:
            execution = execution_from_run_body(
                {**(body.model_extra or {}), "_ng_rollout_id": body.capture_rollout_id}
            )
        except CheckpointError as exc:
            return error_response(400, exc.code, exc.message)
        if execution is None:
            return error_response(400, "rollout_id_required", _RUN_IDENTITY)
        restored = await self._begin(execution, restart_only=False)
        try:
            result = await self._run_checkpointed(request, body, execution, restored)
        except Refused as refused:
            result = refused.response
        finally:
            self._finish(execution)
        with suppress(Exception):  # a model that keeps lineage drops the finished rollout's (best effort)
            await self.server_client.post(
                server_name=self.config.model_server.name,
                url_path=f"{rollout_path_prefix(execution.capture_key)}{FINISH_PATH}",
                json={},
            )
        return result

    async def responses(
        self,
        request: Request,
        response: Response,
        body: NeMoGymResponseCreateParamsNonStreaming = _BODY,
    ) -> Any:
        path_params = getattr(request, "path_params", None) or {}
        key = path_params.get("rollout_id")
        session_id = self._agent_session_id_from_request(request)
        execution = None
        try:
            if isinstance(key, str):
                execution = execution_from_capture_key(key)
            elif session_id is not None:
                record = self._session_records.get(session_id)
                episode = None if record is None else record.episode_id
                if episode is not None:
                    execution = ExecutionId(rollout_id=episode.rollout_id, attempt=episode.attempt)
        except CheckpointError as exc:
            return error_response(400, exc.code, exc.message)
        if execution is None:
            return error_response(400, "rollout_id_required", _RESPONSES_IDENTITY)
        # an agent session's state lives in Gym's session table, which no restore rebuilds
        restored = await self._begin(execution, restart_only=session_id is not None)
        token = EPISODE.set(Episode(execution, restored, {}))
        try:
            return await super().responses(request, response, body)
        except Refused as refused:
            return refused.response
        finally:
            EPISODE.reset(token)
            self._finish(execution)

    async def _begin(self, execution: ExecutionId, *, restart_only: bool) -> AgentBoundaryRecord | None:
        participant = self.participant
        return await self._admission.call(
            lambda: participant.begin(execution, restart_only=restart_only), timeout=WAIT_SECONDS
        )

    def _finish(self, execution: ExecutionId) -> None:
        with suppress(CheckpointError):
            self.participant.finish(execution)

    async def _post(self, server: str, path: str, **kwargs: Any) -> Any:
        """``server_client.post``; an SDK refusal downstream (``{"error": {code, detail}}``) is
        raised as :class:`Refused` and answered as it came."""
        response = await self.server_client.post(server_name=server, url_path=path, **kwargs)
        await raise_refusal(response)
        return response

    # -- /run ---------------------------------------------------------------------------------------
    async def _run_checkpointed(
        self,
        request: Request,
        body: SimpleAgentRunRequest,
        execution: ExecutionId,
        restored: AgentBoundaryRecord | None,
    ) -> Any:
        assert self.config.resources_server is not None
        resources = self.config.resources_server.name
        prefix = rollout_path_prefix(execution.capture_key)
        seed_revisions: dict[str, dict[str, int]] = {}
        cookies: dict[str, str] = _cookies(request.cookies)
        if restored is None:
            seeded = await self._post(
                resources, f"{prefix}/seed_session", json=body.model_dump(), cookies=cookies
            )
            cookies = _cookies(seeded.cookies)
            seed_revisions = _revision(seeded)
        token_capture = self._token_id_capture_enabled()
        collect = self._model_call_capture_enabled()
        episode = Episode(execution, restored, seed_revisions)
        episode_token = EPISODE.set(episode)
        try:
            model_response, trajectory, model_cookies, resources_cookies = await self._create_episode(
                body.responses_create_params,
                model_url_path=f"{rollout_path_prefix(execution.capture_key, token_capture=token_capture)}"
                "/v1/responses",
                resources_server_cookies=cookies,
                execute_tools=True,
                rollout_id=execution.capture_key,
                collect_trajectory=collect,
            )
        finally:
            EPISODE.reset(episode_token)
        model_response_json = model_response.model_dump(mode="json")
        cookies = {**dict(resources_cookies or {}), **_cookies(model_cookies)}
        if trajectory is not None:
            extra = body.model_extra or {}
            task_id = next(
                (
                    str(extra[key])
                    for key in ("task_id", "problem_id", "instance_id", "_ng_task_index")
                    if extra.get(key) is not None
                ),
                "unknown",
            )
            rollout_id = execution.capture_key
            trajectory = trajectory.model_copy(
                update={
                    "task_id": task_id,
                    "rollout_id": rollout_id,
                    "turns": [
                        turn.model_copy(update={"task_id": task_id, "rollout_id": rollout_id})
                        for turn in trajectory.turns
                    ],
                }
            )
        if self.config.skip_verification:
            result = body.model_dump() | {
                "response": model_response_json,
                "reward": float(self.config.skip_verification_reward),
                "verification_skipped": True,
            }
        else:
            verify = await self._post(
                resources,
                f"{prefix}/verify",
                json=body.model_dump() | {"response": model_response_json},
                cookies=cookies,
            )
            await raise_for_status(verify)
            result = await get_response_json(verify)
        if trajectory is not None:
            resolved = result.get("resolved")
            if isinstance(resolved, bool) and trajectory.turns:
                trajectory.turns[-1].resolved = resolved
            else:
                trajectory.gaps.append(ObservationGap(code="resolution_unavailable", invocation_id="root"))
            result["ng_trajectory"] = trajectory.model_dump(mode="json")
        result["rollout_checkpoint"] = {
            "attempt": execution.attempt,
            "restored_turn": None if restored is None else restored.turn_index,
            "steps": episode.steps,
        }
        return SimpleAgentVerifyResponse.model_validate(result)

    # -- the episode loop ---------------------------------------------------------------------------
    async def _create_episode(
        self,
        body: NeMoGymResponseCreateParamsNonStreaming,
        *,
        model_url_path: str,
        resources_server_cookies: Any = None,
        tool_access: DirectHTTPToolAccess | None = None,
        in_session: bool = False,
        execute_tools: bool = True,
        invocation_id: str = "root",
        task_id: str = "unscoped",
        rollout_id: str = "unscoped",
        collect_trajectory: bool = False,
    ) -> tuple[NeMoGymResponse, TrajectoryRecord | None, Any, Any]:
        episode = EPISODE.get()
        if episode is None:
            raise RuntimeError(
                "the checkpointed simple agent runs an episode only inside /run or /v1/responses"
            )
        execution, participant, admission = episode.execution, self.participant, self._admission
        if not model_url_path.startswith("/ng-rollout/"):  # an agent session's identity: its episode_id
            token_capture = self._token_id_capture_enabled()
            model_url_path = (
                f"{rollout_path_prefix(execution.capture_key, token_capture=token_capture)}{model_url_path}"
            )
        body = body.model_copy(deep=True)
        if isinstance(body.input, str):
            body.input = [NeMoGymEasyInputMessage(role="user", content=body.input)]
        params = body.model_dump(mode="json", exclude_unset=True)
        if episode.restored is None:
            state: dict[str, Any] = {
                "step": 0,
                "outputs": [],
                "usage": None,
                "model_cookies": {},
                "resources_cookies": dict(resources_server_cookies or {}),
                "revisions": episode.seed_revisions,
                "last_call": None,
                "trajectory": {"turns": [], "tool_calls": [], "model_calls": [], "gaps": []},
                "steps": [],
            }
            self._boundary(execution, state)
        else:
            state = json.loads(episode.restored.agent_state or b"{}")
        new_outputs = typed_items(params, state["outputs"])
        usage = None if state["usage"] is None else NeMoGymResponseUsage.model_validate(state["usage"])
        traj = state["trajectory"]
        model_server_cookies: dict[str, str] = dict(state["model_cookies"])
        resources_server_cookies = dict(state["resources_cookies"])
        invocation_status = "completed"
        model_response: NeMoGymResponse | None = None
        while True:
            step = state["step"] + 1
            await admission.call(lambda: participant.start_turn(execution), timeout=WAIT_SECONDS)
            call_id = f"step-{step}"
            new_body = body.model_copy(update={"input": body.input + new_outputs})
            started = now()
            waiting = participant.awaiting_model(execution, call_id)
            waiting.__enter__()
            try:
                raw = await self._post(
                    self.config.model_server.name,
                    model_url_path,
                    json=new_body,
                    cookies=model_server_cookies,
                    headers={CALL_ID_HEADER: call_id},
                )
                await raise_for_status(raw)
                model_json = await get_response_json(raw)
            except BaseException as exc:
                await run_blocking(waiting.__exit__, type(exc), exc, exc.__traceback__)
                raise
            await admission.wait_open(WAIT_SECONDS)  # a reply during a checkpoint waits for resume
            await run_blocking(waiting.__exit__, None, None, None)
            model_server_cookies = {**model_server_cookies, **_cookies(raw.cookies)}
            try:
                model_response = NeMoGymResponse.model_validate(model_json)
            except ValueError as e:
                raise RuntimeError(
                    f"Received an invalid response from model server: {json.dumps(model_json)}"
                ) from e
            output = model_response.output
            new_outputs.extend(output)
            if collect_trajectory:
                refs = []
                if model_response.id:
                    ref = ModelCallRef(model_ref=self.config.model_server, response_id=model_response.id)
                    traj["model_calls"].append(ref.model_dump(mode="json"))
                    refs.append(ref)
                else:
                    gap = ObservationGap(
                        code="model_call_reference_unavailable",
                        invocation_id=invocation_id,
                        detail=f"turn:{step}",
                    )
                    traj["gaps"].append(gap.model_dump(mode="json"))
                turn = TrajectoryTurn(
                    invocation_id=invocation_id,
                    task_id=task_id,
                    rollout_id=rollout_id,
                    turn_no=step,
                    timestamp=started,
                    question=new_body.input,
                    answer=[item for item in output if item.type != "reasoning"],
                    reasoning_content=[i.model_dump(mode="json") for i in output if i.type == "reasoning"]
                    or None,
                    step_count=len(traj["tool_calls"]),
                    model_calls=refs,
                )
                traj["turns"].append(turn.model_dump(mode="json"))
            usage = accumulate_response_usage(usage, model_response.usage)
            model_response.usage = None
            if model_response.incomplete_details:
                invocation_status = "incomplete"
                break
            calls = [o for o in output if o.type == "function_call"]
            messages = [o for o in output if o.type == "message" and o.role == "assistant"]
            if not calls:
                if not messages:
                    invocation_status = "incomplete"
                    model_response.status = "incomplete"
                    model_response.metadata = {
                        **(model_response.metadata or {}),
                        "ng_termination_reason": "incomplete_reasoning" if output else "empty_output",
                        "ng_termination_message": "Ending trajectory: model returned no assistant message or "
                        "tool calls (reasoning-only or empty output) without reported truncation.",
                    }
                break
            if not execute_tools:
                break
            for fn_call in calls:
                started = now()
                tool_output, status, error_type, revision = await tool_call(
                    self.server_client,
                    None if self.config.resources_server is None else self.config.resources_server.name,
                    fn_call,
                    tool_access,
                    in_session,
                    resources_server_cookies,
                    execution.capture_key,
                )
                if revision:
                    state["revisions"] = revision
                if collect_trajectory:
                    traj["tool_calls"].append(
                        TrajectoryToolCall(
                            invocation_id=invocation_id,
                            tool_call_id=fn_call.call_id,
                            tool_name=fn_call.name,
                            started_at=started,
                            completed_at=max(started, now()),
                            duration_ms=max(0.0, (now() - started) * 1000),
                            timing_source="executor",
                            status=status,
                            error_type=error_type,
                            output=tool_output,
                        ).model_dump(mode="json")
                    )
                new_outputs.append(
                    NeMoGymFunctionCallOutput(
                        type="function_call_output", call_id=fn_call.call_id, output=tool_output
                    )
                )
            if collect_trajectory:
                traj["turns"][-1]["step_count"] = len(traj["tool_calls"])
            state["steps"] = [*state["steps"], {"step": step, "attempt": execution.attempt}]
            if self.config.max_steps and step >= self.config.max_steps:  # steps of earlier attempts count
                invocation_status = "incomplete"
                break
            state.update(
                step=step,
                outputs=[item_json(item) for item in new_outputs],
                usage=None if usage is None else usage.model_dump(mode="json"),
                model_cookies=model_server_cookies,
                resources_cookies=resources_server_cookies,
                last_call=call_id,
            )
            self._boundary(execution, state)
        assert model_response is not None
        model_response.output = new_outputs
        model_response.usage = usage
        trajectory = None
        if collect_trajectory:
            trajectory = build_trajectory(
                traj,
                invocation_id=invocation_id,
                status=invocation_status,
                conversation=[*body.input, *new_outputs],
                task_id=task_id,
                rollout_id=rollout_id,
            )
        episode.steps = state["steps"]
        return model_response, trajectory, model_server_cookies, resources_server_cookies

    def _boundary(self, execution: ExecutionId, state: dict[str, Any]) -> None:
        usage = {k: int(v) for k, v in (state["usage"] or {}).items() if isinstance(v, int)}
        cookies = {
            **{f"resources:{k}": str(v) for k, v in state["resources_cookies"].items()},
            **{f"model:{k}": str(v) for k, v in state["model_cookies"].items()},
        }
        self.participant.boundary(
            execution,
            AgentBoundaryRecord(
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                boundary_index=state["step"],
                turn_index=state["step"],
                last_model_call_id=state["last_call"],
                resource_revisions=state["revisions"],
                output_items=state["outputs"],
                usage=usage,
                cookies=cookies,
                agent_state=json.dumps(state, separators=(",", ":"), sort_keys=True).encode(),
            ),
        )
