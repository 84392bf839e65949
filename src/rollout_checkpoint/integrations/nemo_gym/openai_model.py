"""Gym's own ``openai_model`` server, unchanged, checkpointed as the policy model.

:class:`CheckpointedOpenAIModel` is Gym's ``SimpleModelServer``
(``responses_api_models/openai_model/app.py``): a subclass whose ``responses`` and
``chat_completions`` run Gym's own code (its client, retries, ``extra_body``, concurrency cap) to
reach the backend at ``openai_base_url``, then make the reply a policy participant's call before
the agent sees it:

* identity: the rollout from Gym's capture key (the ``/ng-rollout/<capture key>/`` prefix Gym's
  clients add with ``observability_enabled: true``), the call id from the ``x-rc-call-id`` header
  when the SDK's agents send it, else ``turn-<n>`` counted from the conversation Gym's own agents
  send (:func:`~.identity.model_call_identity`). A call with no capture key is refused with
  ``400 rollout_id_required`` before the backend is asked;
* lineage: once the reply is computed, the call is admitted (held while a checkpoint runs, so
  prepare never waits for the backend), its tokens are staged durably in the token store, then it
  joins the rollout's lineage keyed ``(rollout, attempt, call id)``;
* token receipts hold the backend's token ids: Gym's ``prompt_token_ids`` /
  ``generation_token_ids`` / ``generation_log_probs`` on Responses output items; on chat
  completions vLLM's ``prompt_token_ids`` and ``choices[0].token_ids`` (ask for them with
  ``extra_body: {return_token_ids: true}``) or ``token_id:<n>`` logprobs. A backend that returns
  none gets an empty receipt (the lineage is still kept).

Gym's ``vllm_model`` speaks chat completions to its backend (it converts Responses itself); the
SDK's deterministic backend (:mod:`.backend`) serves both dialects, so ``openai_model`` covers the
policy path in tests and examples. Extra config keys, as the scripted model's: ``call_log``,
``hold_file``, ``hold_from_call``, ``hold_log`` (the gate tests hold rollouts mid-episode with)
and ``policy_version``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Body, Request

from ...errors import CheckpointError
from ...server import error_response, status_for
from ._policy import FINISH_PATH, PolicyServing, TokenIds
from .identity import CALL_ID_HEADER, model_call_identity

__all__ = [
    "CheckpointedOpenAIModel",
    "CheckpointedOpenAIModelConfig",
    "token_ids_of_chat",
    "token_ids_of_response",
]

_BODY = Body()

from nemo_gym.openai_utils import (  # noqa: E402
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.rollout_correlation import current_rollout_id  # noqa: E402
from responses_api_models.openai_model.app import SimpleModelServer, SimpleModelServerConfig  # noqa: E402


class CheckpointedOpenAIModelConfig(SimpleModelServerConfig):
    policy_version: str = "v1"
    call_log: str | None = None
    hold_file: str | None = None
    hold_from_call: int = 2
    hold_log: str | None = None


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(type(v) is int for v in value):
        return list(value)
    return None


def token_ids_of_response(response: Mapping[str, Any]) -> TokenIds:
    """A Responses reply's token ids: the first output item's prompt, every item's generation."""
    prompt: list[int] | None = None
    generation: list[int] = []
    log_probs: list[float] = []
    for item in response.get("output") or []:
        if not isinstance(item, Mapping):
            continue
        if prompt is None:
            prompt = _ints(item.get("prompt_token_ids"))
        ids = _ints(item.get("generation_token_ids")) or []
        probs = item.get("generation_log_probs")
        generation.extend(ids)
        if isinstance(probs, list) and len(probs) == len(ids):
            log_probs.extend(float(p) for p in probs)
        else:
            log_probs.extend([0.0] * len(ids))
    return TokenIds(prompt or [], generation, log_probs)


def _logprob_ids(choice: Mapping[str, Any]) -> tuple[list[int], list[float]] | None:
    content = (
        (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), Mapping) else None
    )
    if not isinstance(content, Sequence) or not content:
        return None
    ids, probs = [], []
    for entry in content:
        token = entry.get("token") if isinstance(entry, Mapping) else None
        if not isinstance(token, str) or not token.startswith("token_id:"):
            return None
        try:
            ids.append(int(token.removeprefix("token_id:")))
        except ValueError:
            return None
        probs.append(float(entry.get("logprob") or 0.0))
    return ids, probs


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def token_ids_of_chat(completion: Mapping[str, Any]) -> TokenIds:
    """A chat completion's token ids, as vLLM returns them (see the module docstring)."""
    choices = completion.get("choices") or []
    choice = _mapping(choices[0] if choices else None)
    message = _mapping(choice.get("message"))
    prompt = (
        _ints(completion.get("prompt_token_ids"))
        or _ints(choice.get("prompt_token_ids"))
        or _ints(message.get("prompt_token_ids"))
        or []
    )
    from_logprobs = _logprob_ids(choice)
    generation = _ints(choice.get("token_ids")) or _ints(message.get("generation_token_ids"))
    if generation is None and from_logprobs is not None:
        generation = from_logprobs[0]
    generation = generation or []
    log_probs: Sequence[float] = [0.0] * len(generation)
    message_probs = message.get("generation_log_probs")
    if from_logprobs is not None and len(from_logprobs[1]) == len(generation):
        log_probs = from_logprobs[1]
    elif isinstance(message_probs, list) and len(message_probs) == len(generation):
        log_probs = [float(p) for p in message_probs]
    return TokenIds(prompt, generation, log_probs)


def _dump(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    dumped: dict[str, Any] = value.model_dump(mode="json")
    return dumped


class CheckpointedOpenAIModel(SimpleModelServer):
    """See the module docstring."""

    config: CheckpointedOpenAIModelConfig

    def setup_webserver(self) -> Any:
        app = super().setup_webserver()
        c = self.config
        self.__dict__["_rc_serving"] = PolicyServing(
            app, str(c.name), policy_version=c.policy_version, call_log=c.call_log, hold_file=c.hold_file,
            hold_from_call=c.hold_from_call, hold_log=c.hold_log,
        )  # fmt: skip
        app.post(FINISH_PATH)(self.finish_rollout)
        return app

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming = _BODY) -> Any:
        items = body.model_dump(mode="json", exclude_unset=True).get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        return await self._serve(
            request, items, lambda: SimpleModelServer.responses(self, body), token_ids_of_response
        )

    async def chat_completions(
        self, request: Request, body: NeMoGymChatCompletionCreateParamsNonStreaming = _BODY
    ) -> Any:
        messages = body.model_dump(mode="json", exclude_unset=True).get("messages")
        return await self._serve(
            request, messages, lambda: SimpleModelServer.chat_completions(self, body), token_ids_of_chat
        )

    async def _serve(self, request: Request, conversation: Any, generate: Any, token_ids: Any) -> Any:
        serving: PolicyServing = self.__dict__["_rc_serving"]
        key = current_rollout_id()
        try:
            execution, call_id = model_call_identity(
                key, request.headers.get(CALL_ID_HEADER), conversation, path=request.url.path
            )
        except CheckpointError as exc:
            return error_response(400, exc.code, f"model server {self.config.name}: {exc.message}")
        await serving.held(str(key), call_id)
        reply = await generate()  # Gym's own code asks the backend: nothing to cut, nothing durable yet
        try:
            await serving.deliver(execution, call_id, token_ids(_dump(reply)))
        except CheckpointError as exc:
            return error_response(status_for(exc), exc.code, exc.message)
        return reply

    async def finish_rollout(self) -> dict[str, bool]:
        """The rollout is done with the model (its lineage is not exported again)."""
        serving: PolicyServing = self.__dict__["_rc_serving"]
        return await serving.finish(current_rollout_id())


if __name__ == "__main__":
    CheckpointedOpenAIModel.run_webserver()
