"""A deterministic, scripted Responses-API model server, checkpointed as the policy model.

Gym ships no fake model (its model servers are real backends). This one is a Gym model server
(``SimpleResponsesAPIModel``, started by Gym's own ``run_webserver()``) whose "generation" is a
pure function of the seed and the conversation (:func:`blackjack_move`: hit below a threshold,
else stand), so an uninterrupted run and a resumed run can be compared exactly. Every call goes
through a :class:`~rollout_checkpoint.participants.PolicyModelParticipant`: admitted under the
rollout identity of its ``/ng-rollout/<capture key>/`` prefix and its call id (the agent's
``x-rc-call-id``, else ``turn-<n>`` counted from the conversation Gym's own agents send, see
:func:`~.identity.model_call_identity`) once its reply is computed (so a reply that is ready
while a checkpoint runs is held until resume, and prepare never waits for the model's
latency), its tokens (the UTF-8 bytes of prompt
and reply) staged durably in the token store, then delivered into the rollout's lineage, so
lineage and receipts in a checkpoint are real. ``delay_s`` is the time each reply takes (a slow
model, so checkpoints find rollouts waiting on it); ``call_log`` appends one JSON line per
delivered call. ``hold_file`` is a gate the caller controls: while that file exists, a call
whose call id ends in a number at or above ``hold_from_call`` (``step-2``: a rollout's
second model call) waits before it generates (nothing durable yet, so a checkpoint does not wait
for it), for :data:`HOLD_SECONDS` at most; ``hold_log`` appends one JSON line per call held.
A run that must checkpoint a rollout mid-episode
holds it there, on any machine, instead of racing the rollouts to their end.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Body, Request

from ...errors import CheckpointError
from ...server import error_response, status_for
from ._policy import FINISH_PATH, HOLD_SECONDS, PolicyServing, TokenIds
from .backend import blackjack_move
from .identity import CALL_ID_HEADER, model_call_identity

__all__ = ["FINISH_PATH", "HOLD_SECONDS", "ScriptedModelConfig", "ScriptedResponsesModel", "blackjack_move"]

_BODY = Body()

from nemo_gym.base_responses_api_model import (  # noqa: E402
    BaseResponsesAPIModelConfig,
    SimpleResponsesAPIModel,
)
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming  # noqa: E402
from nemo_gym.rollout_correlation import current_rollout_id  # noqa: E402


class ScriptedModelConfig(BaseResponsesAPIModelConfig):
    seed: int = 0
    delay_s: float = 0.0
    call_log: str | None = None
    hold_file: str | None = None
    hold_from_call: int = 2
    hold_log: str | None = None


def _text(item: Any) -> str:
    content = item.get("content") if isinstance(item, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return ""


class ScriptedResponsesModel(SimpleResponsesAPIModel):
    """See the module docstring."""

    ray_enabled = False
    config: ScriptedModelConfig

    def setup_webserver(self) -> Any:
        app = super().setup_webserver()
        c = self.config
        serving = PolicyServing(
            app, str(c.name), policy_version="scripted-v1", call_log=c.call_log, hold_file=c.hold_file,
            hold_from_call=c.hold_from_call, hold_log=c.hold_log,
        )  # fmt: skip
        self.__dict__["_rc_serving"] = serving
        app.post(FINISH_PATH)(self.finish_rollout)
        return app

    async def chat_completions(self, body: Any = _BODY) -> Any:
        return error_response(
            400, "unsupported_operation", "the scripted model speaks the Responses API only"
        )

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming = _BODY) -> Any:
        serving: PolicyServing = self.__dict__["_rc_serving"]
        items = body.model_dump(mode="json")["input"]
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        key = current_rollout_id()
        try:
            execution, call_id = model_call_identity(
                key, request.headers.get(CALL_ID_HEADER), items, path=request.url.path
            )
        except CheckpointError as exc:
            return error_response(400, exc.code, f"the scripted model: {exc.message}")
        text = blackjack_move(self.config.seed, items)
        prompt = _text(items[-1]).encode()[:1024] if items else b""
        generated = text.encode()
        if self.config.delay_s:  # "generating": nothing to cut, nothing durable yet
            await asyncio.sleep(self.config.delay_s)
        await serving.held(str(key), call_id)
        try:
            # the reply joins the lineage only once admitted: while a checkpoint runs it waits
            # here for resume (held), so prepare never waits for the model's latency
            await serving.deliver(
                execution, call_id, TokenIds(list(prompt), list(generated), [0.0] * len(generated))
            )
        except CheckpointError as exc:
            return error_response(status_for(exc), exc.code, exc.message)
        usage = {"input_tokens": len(prompt), "output_tokens": len(generated)}
        return NeMoGymResponse.model_validate(
            {
                "id": f"resp-{key}-{call_id}",
                "created_at": 0,
                "model": "scripted",
                "object": "response",
                "output": [
                    {
                        "type": "message",
                        "id": f"msg-{call_id}",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}],
                    }
                ],
                "parallel_tool_calls": False,
                "tool_choice": "auto",
                "tools": [],
                "usage": {
                    **usage,
                    "total_tokens": usage["input_tokens"] + usage["output_tokens"],
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens_details": {"reasoning_tokens": 0},
                },
            }
        )

    async def finish_rollout(self) -> dict[str, bool]:
        """The rollout is done with the model (its lineage is not exported again)."""
        serving: PolicyServing = self.__dict__["_rc_serving"]
        return await serving.finish(current_rollout_id())
