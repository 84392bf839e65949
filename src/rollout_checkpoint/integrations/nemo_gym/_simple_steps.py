"""The pieces of :class:`~.simple_agent.CheckpointedSimpleAgent`'s loop that need no agent: the
episode a request serves, one tool call as Gym's loop makes it, stored items made typed again,
and the trajectory record rebuilt from the state a boundary keeps."""

from __future__ import annotations

import json
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse

from ...format.records import AgentBoundaryRecord
from ...ids import ExecutionId
from .agent import _cookies, _revision

__all__ = [
    "EPISODE",
    "Episode",
    "Refused",
    "build_trajectory",
    "item_json",
    "now",
    "raise_refusal",
    "tool_call",
    "typed_items",
]

from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollout_observability import (
    AgentInvocation,
    ModelCallRef,
    ObservationGap,
    TrajectoryRecord,
    TrajectoryToolCall,
    TrajectoryTurn,
)
from nemo_gym.server_utils import get_response_json, rollout_path_prefix
from nemo_gym.server_utils import request as http_request
from nemo_gym.tool_access import DirectHTTPToolAccess


@dataclass
class Episode:
    """The run ``_create_episode`` serves (set by ``run`` / ``responses`` in this task)."""

    execution: ExecutionId
    restored: AgentBoundaryRecord | None
    seed_revisions: dict[str, dict[str, int]]
    steps: list[dict[str, int]] = field(default_factory=list)
    """Every step the rollout took (``{"step", "attempt"}``), earlier attempts' included."""


EPISODE: ContextVar[Episode | None] = ContextVar("rollout_checkpoint_simple_agent_episode", default=None)


class Refused(Exception):
    """A downstream SDK refusal, answered to the caller as it came."""

    def __init__(self, response: JSONResponse) -> None:
        super().__init__("refused")
        self.response = response


async def tool_call(
    server_client: Any,
    resources_server: str | None,
    fn_call: Any,
    tool_access: DirectHTTPToolAccess | None,
    in_session: bool,
    cookies: dict[str, str],
    capture_key: str,
) -> tuple[str, str, str | None, dict[str, dict[str, int]]]:
    """One tool call as Gym's loop makes it (``cookies`` is updated in place), under the
    rollout's ``/ng-rollout/<capture key>/`` prefix: the output, its trajectory status and error
    type, and the resources session's revision."""
    try:
        arguments = json.loads(fn_call.arguments)
    except (json.JSONDecodeError, TypeError) as e:
        return json.dumps({"error": f"Invalid tool call arguments: {e!r}"}), "failed", type(e).__name__, {}
    if tool_access is not None:
        response = await http_request(
            method="POST",
            url=f"{str(tool_access.base_url).rstrip('/')}/{fn_call.name}",
            json=arguments,
            cookies=cookies,
            headers=dict(tool_access.headers),
            _internal=True,
        )
    else:
        if in_session:
            raise RuntimeError(
                f"Model called tool {fn_call.name!r}, but this agent session has no direct HTTP tool access"
            )
        if resources_server is None:
            raise RuntimeError(
                "Simple Agent received a tool call without direct HTTP tool access "
                "or a legacy resources_server configuration"
            )
        response = await server_client.post(
            server_name=resources_server,
            url_path=f"{rollout_path_prefix(capture_key)}/{fn_call.name}",
            json=arguments,
            cookies=cookies,
        )
        if response.status == 409:  # an SDK refusal (a stale attempt, an unknown session)
            await raise_refusal(response)
    output = (await response.read()).decode()
    cookies.update(_cookies(response.cookies))
    completed = 200 <= response.status < 400
    status = "completed" if completed else "failed"
    return output, status, None if completed else f"http_{response.status}", _revision(response)


def build_trajectory(
    traj: dict[str, list[Any]],
    *,
    invocation_id: str,
    status: str,
    conversation: list[Any],
    task_id: str,
    rollout_id: str,
) -> TrajectoryRecord:
    """Gym's trajectory record from the JSON a boundary keeps (turns an earlier attempt took are
    re-labelled with this attempt's identity, as Gym's record requires)."""
    invocation = AgentInvocation(
        invocation_id=invocation_id,
        status=status,
        model_calls=[ModelCallRef.model_validate(c) for c in traj["model_calls"]],
        conversation=conversation,
    )
    return TrajectoryRecord(
        task_id=task_id,
        rollout_id=rollout_id,
        invocations=[invocation],
        turns=[
            TrajectoryTurn.model_validate({**t, "task_id": task_id, "rollout_id": rollout_id})
            for t in traj["turns"]
        ],
        tool_calls=[TrajectoryToolCall.model_validate(t) for t in traj["tool_calls"]],
        gaps=[ObservationGap.model_validate(g) for g in traj["gaps"]],
    )


async def raise_refusal(response: Any) -> None:
    if response.status < 400:
        return
    try:
        error = (await get_response_json(response))["error"]
        code, detail = str(error["code"]), str(error["detail"])
    except Exception:
        return  # not the SDK's shape: the caller handles it as Gym does
    raise Refused(JSONResponse({"error": {"code": code, "detail": detail}}, status_code=response.status))


def item_json(item: Any) -> Any:
    if hasattr(item, "model_dump"):
        return item.model_dump(mode="json", exclude_unset=True)
    return item


def typed_items(params: dict[str, Any], items: list[Any]) -> list[Any]:
    """Stored output items as the typed input items Gym's loop appends (``[]`` for none)."""
    if not items:
        return []
    typed = NeMoGymResponseCreateParamsNonStreaming.model_validate(
        {**params, "input": [*params["input"], *items]}
    )
    assert isinstance(typed.input, list)
    return list(typed.input[len(params["input"]) :])


def now() -> float:
    return time.time()
