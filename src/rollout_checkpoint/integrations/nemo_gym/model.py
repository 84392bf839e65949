"""A deterministic, scripted Responses-API model server, checkpointed as the policy model.

Gym ships no fake model (its model servers are real backends). This one is a Gym model server
(``SimpleResponsesAPIModel``, started by Gym's own ``run_webserver()``) whose "generation" is a
pure function of the seed and the conversation (:func:`blackjack_move`: hit below a threshold,
else stand), so an uninterrupted run and a resumed run can be compared exactly. Every call goes
through a :class:`~rollout_checkpoint.participants.PolicyModelParticipant`: admitted under the
rollout identity of its ``/ng-rollout/<capture key>/`` prefix and the agent's ``x-rc-call-id``
once its reply is computed (so a reply that is ready while a checkpoint runs is held until
resume, and prepare never waits for the model's latency), its tokens (the UTF-8 bytes of prompt
and reply) staged durably in the token store, then delivered into the rollout's lineage, so
lineage and receipts in a checkpoint are real. ``delay_s`` is the time each reply takes (a slow
model, so checkpoints find rollouts waiting on it); ``call_log`` appends one JSON line per
delivered call. ``hold_file`` is a gate the caller controls: while that file exists, a call
whose ``x-rc-call-id`` ends in a number at or above ``hold_from_call`` (``step-2``: a rollout's
second model call) waits before it generates (nothing durable yet, so a checkpoint does not wait
for it), for :data:`HOLD_SECONDS` at most; ``hold_log`` appends one JSON line per call held.
A run that must checkpoint a rollout mid-episode
holds it there, on any machine, instead of racing the rollouts to their end.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from fastapi import Body, Request

from ...errors import CheckpointError
from ...participants import PolicyModelParticipant
from ...server import (
    AsyncAdmission,
    error_response,
    install_error_handlers,
    install_participant,
    run_blocking,
    status_for,
)
from ...store import open_store
from ...tokens import BatchingTokenSink, ObjectStoreTokenStore
from .identity import IDENTITY_SETTING, execution_from_capture_key
from .resources import start_paused_if_asked

__all__ = ["FINISH_PATH", "HOLD_SECONDS", "ScriptedModelConfig", "ScriptedResponsesModel", "blackjack_move"]

FINISH_PATH = "/rollout_checkpoint/finish"
WAIT_SECONDS = 300.0
HOLD_SECONDS = 300.0
"""How long a held call waits for its gate to open at most (then it goes on)."""
_BODY = Body()
_HAND = re.compile(r"Your hand: \[[^\]]*\] = (\d+)")

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


def blackjack_move(seed: int, items: list[Any]) -> str:
    """The scripted policy: hit while the hand's value is below ``16 + seed % 3``, else stand."""
    value = None
    for item in items:
        match = _HAND.search(_text(item))
        if match is not None:
            value = int(match.group(1))
    action = "hit" if value is not None and value < 16 + seed % 3 else "stand"
    return f"<action>{action}</action>"


class ScriptedResponsesModel(SimpleResponsesAPIModel):
    """See the module docstring."""

    ray_enabled = False
    config: ScriptedModelConfig

    def setup_webserver(self) -> Any:
        app = super().setup_webserver()
        store_url = os.environ.get("ROLLOUT_CHECKPOINT_STORE")
        if not store_url:
            raise ValueError(
                "the scripted model needs ROLLOUT_CHECKPOINT_STORE (its token store lives there)"
            )
        token = os.environ.get("ROLLOUT_CHECKPOINT_TOKEN")
        if not token:
            raise ValueError("the scripted model needs ROLLOUT_CHECKPOINT_TOKEN")
        # group commit: replies released together at a resume share one durable shard write
        tokens = BatchingTokenSink(ObjectStoreTokenStore(open_store(store_url)))
        participant = PolicyModelParticipant(tokens, str(self.config.name), policy_version="scripted-v1")
        start_paused_if_asked(participant)
        self.__dict__["_rc_participant"] = participant
        self.__dict__["_rc_admission"] = AsyncAdmission(participant)
        install_error_handlers(app)
        install_participant(app, participant, token=token, store=store_url)
        app.post(FINISH_PATH)(self.finish_rollout)
        app.state.rollout_checkpoint_participant = participant
        return app

    async def chat_completions(self, body: Any = _BODY) -> Any:
        return error_response(
            400, "unsupported_operation", "the scripted model speaks the Responses API only"
        )

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming = _BODY) -> Any:
        key = current_rollout_id()
        call_id = request.headers.get("x-rc-call-id")
        if key is None or not call_id:
            return error_response(
                400,
                "rollout_id_required",
                f"the scripted model needs a rollout identity and x-rc-call-id: {IDENTITY_SETTING}",
            )
        participant: PolicyModelParticipant = self.__dict__["_rc_participant"]
        admission: AsyncAdmission = self.__dict__["_rc_admission"]
        items = body.model_dump(mode="json")["input"]
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        text = blackjack_move(self.config.seed, items)
        prompt = _text(items[-1]).encode()[:1024] if items else b""
        generated = text.encode()
        if self.config.delay_s:  # "generating": nothing to cut, nothing durable yet
            await asyncio.sleep(self.config.delay_s)
        await self._held(key, call_id)
        try:
            execution = execution_from_capture_key(key)
            # the reply joins the lineage only once admitted: while a checkpoint runs it waits
            # here for resume (held), so prepare never waits for the model's latency
            call = await admission.call(lambda: participant.admit(execution, call_id), timeout=WAIT_SECONDS)
            try:
                await run_blocking(
                    lambda: call.stage(
                        prompt_token_ids=list(prompt),
                        generation_token_ids=list(generated),
                        generation_log_probs=[0.0] * len(generated),
                    )
                )
            finally:
                call.close()
        except CheckpointError as exc:
            return error_response(status_for(exc), exc.code, exc.message)
        if self.config.call_log:
            line = {
                "rollout_id": execution.rollout_id,
                "attempt": execution.attempt,
                "call_id": call_id,
                "pid": os.getpid(),
            }
            with open(self.config.call_log, "a") as log:
                log.write(json.dumps(line) + "\n")
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

    async def _held(self, key: str, call_id: str) -> None:
        """Wait while the gate (``hold_file``) is closed for this call, :data:`HOLD_SECONDS` at most."""
        gate = self.config.hold_file
        number = call_id.rsplit("-", 1)[-1]
        if gate is None or not number.isdigit() or int(number) < self.config.hold_from_call:
            return
        if not os.path.exists(gate):
            return
        if self.config.hold_log:
            try:
                execution = execution_from_capture_key(key)
            except CheckpointError:
                pass  # refused below, as any call without a rollout identity
            else:
                line = {"rollout_id": execution.rollout_id, "attempt": execution.attempt, "call_id": call_id}
                with open(self.config.hold_log, "a") as log:
                    log.write(json.dumps(line) + "\n")
        loop = asyncio.get_running_loop()
        end = loop.time() + HOLD_SECONDS
        while os.path.exists(gate) and loop.time() < end:
            await asyncio.sleep(0.02)

    async def finish_rollout(self) -> dict[str, bool]:
        """The rollout is done with the model (its lineage is not exported again)."""
        key = current_rollout_id()
        if key is None:
            return {"finished": False}
        participant: PolicyModelParticipant = self.__dict__["_rc_participant"]
        try:
            await run_blocking(participant.finish, execution_from_capture_key(key))
        except CheckpointError:
            return {"finished": False}
        return {"finished": True}
