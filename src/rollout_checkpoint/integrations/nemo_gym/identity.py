"""The rollout identity a Gym request carries, as this SDK's :class:`ExecutionId`.

Gym names one attempt of a rollout by its *capture key*: the rollout id for attempt 0,
``<rollout_id>-a<N>`` after. A resources server learns it only (a) from the
``/ng-rollout/<capture key>/`` route prefix, which Gym's clients add when
``observability_enabled: true`` and Gym's own middleware strips into a context variable, or
(b) from a typed request body carrying ``episode_id: {rollout_id, attempt}``. Gym forbids rollout
ids that end in ``-a<N>``, which keeps the capture key unambiguous; this module refuses them too.

A model call's identity (:func:`model_call_identity`) is the capture key plus a call id: the
``x-rc-call-id`` header when the SDK's agents send one, else derived from what Gym's own agents
send. Gym's ``simple_agent`` and ``gymnasium_agent`` send, on every call of a rollout, the task's
input followed by every earlier model output (and the tool outputs or observations between them),
so the number of model turns already in the conversation names the call: ``turn-<n>`` is the n-th
model call of the rollout. That is stable across a restore (an agent resuming at a boundary sends
the same conversation as the uninterrupted run) and across a retry of the same call, and needs no
state in the model server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import CheckpointError
from ...ids import ExecutionId

__all__ = [
    "CALL_ID_HEADER",
    "IDENTITY_SETTING",
    "RolloutIdentityRequiredError",
    "call_id_from_conversation",
    "execution_from_capture_key",
    "execution_from_episode_id",
    "execution_from_run_body",
    "missing_identity_advice",
    "model_call_identity",
    "model_turns",
]

CALL_ID_HEADER = "x-rc-call-id"
_PREFIXED = re.compile(r"^/ng-rollout/[A-Za-z0-9][A-Za-z0-9._-]*/")
_MODEL_ITEM_TYPES = frozenset({"function_call", "reasoning"})

_ATTEMPT_SUFFIX = re.compile(r"^(?P<rollout>.+)-a(?P<attempt>[1-9][0-9]*)$")

IDENTITY_SETTING = (
    "set `observability_enabled: true` in the NeMo Gym config (Gym's clients then prefix every "
    "call with /ng-rollout/<rollout id>/), or send a typed body with `episode_id`"
)


class RolloutIdentityRequiredError(CheckpointError):
    """A session request carried no rollout identity (HTTP 400: nothing was changed)."""

    code = "rollout_id_required"


def missing_identity_advice(path: str | None) -> str:
    """What to do about a request without a rollout identity: turning observability on only
    helps a request whose path lacks the ``/ng-rollout/<id>/`` prefix."""
    if path and _PREFIXED.match(path):
        return (
            "the path carries /ng-rollout/<id>/ but this server does not take the rollout id from it "
            "(Gym strips that prefix only on resources and model servers; an agent server reads it "
            "as a path parameter): do not attach the resources checkpointing to an agent server"
        )
    return IDENTITY_SETTING


def _is_model_item(item: Any) -> bool:
    if not isinstance(item, Mapping):
        return False
    return item.get("type") in _MODEL_ITEM_TYPES or item.get("role") == "assistant"


def model_turns(messages: Any) -> list[list[Mapping[str, Any]]]:
    """The model turns already in a conversation (Responses items or chat messages): each maximal
    run of consecutive model items (assistant messages, function calls, reasoning) is one turn."""
    turns: list[list[Mapping[str, Any]]] = []
    previous = False
    for item in messages if isinstance(messages, list) else []:
        current = _is_model_item(item)
        if current:
            if not previous:
                turns.append([])
            turns[-1].append(item)
        previous = current
    return turns


def call_id_from_conversation(messages: Sequence[Any] | str | None) -> str:
    """``turn-<n>``: the call that answers this conversation is the rollout's n-th model call."""
    return f"turn-{len(model_turns(messages if isinstance(messages, list) else [])) + 1}"


def model_call_identity(
    key: str | None, header_call_id: str | None, messages: Any, *, path: str | None = None
) -> tuple[ExecutionId, str]:
    """A model call's execution (from Gym's capture key) and call id (the ``x-rc-call-id``
    header, else :func:`call_id_from_conversation`). Raises
    :class:`RolloutIdentityRequiredError` when the request carries no capture key or the
    conversation is not a list of items (nothing to count turns in)."""
    if key is None:
        raise RolloutIdentityRequiredError(
            f"this model call carries no rollout identity: {missing_identity_advice(path)}"
        )
    execution = execution_from_capture_key(key)
    if header_call_id:
        return execution, header_call_id
    if not isinstance(messages, list):
        raise RolloutIdentityRequiredError(
            f"model call of {key}: no {CALL_ID_HEADER} header and the conversation is not a list of "
            "items, so the call cannot be numbered: send the conversation as a list or the header",
            rollout_id=execution.rollout_id,
        )
    return execution, call_id_from_conversation(messages)


def execution_from_capture_key(key: str) -> ExecutionId:
    """``r`` -> ``r#0``; ``r-a2`` -> ``r#2``."""
    match = _ATTEMPT_SUFFIX.match(key)
    if match is None:
        return ExecutionId(rollout_id=key, attempt=0)
    return ExecutionId(rollout_id=match["rollout"], attempt=int(match["attempt"]))


def execution_from_episode_id(value: Any) -> ExecutionId | None:
    """Gym's ``EpisodeId`` (a mapping ``{rollout_id, attempt}``) as an execution, if well formed."""
    if not isinstance(value, Mapping):
        return None
    rollout_id, attempt = value.get("rollout_id"), value.get("attempt", 0)
    if not isinstance(rollout_id, str) or type(attempt) is not int or attempt < 0:
        return None
    if _ATTEMPT_SUFFIX.match(rollout_id):
        raise RolloutIdentityRequiredError(
            f"rollout id {rollout_id!r} ends in the reserved attempt suffix -a<N>", rollout_id=rollout_id
        )
    return ExecutionId(rollout_id=rollout_id, attempt=attempt)


def execution_from_run_body(body: Mapping[str, Any]) -> ExecutionId | None:
    """An agent ``/run`` body's identity: ``_ng_rollout_id`` (else ``<task index>-<rollout
    index>``) plus ``_ng_attempt_index`` (default 0), as Gym derives its capture key."""
    rollout_id = body.get("_ng_rollout_id")
    if rollout_id is None:
        task, rollout = body.get("_ng_task_index"), body.get("_ng_rollout_index")
        if task is None or rollout is None:
            return None
        rollout_id = f"{task}-{rollout}"
    attempt = body.get("_ng_attempt_index") or 0
    return execution_from_episode_id({"rollout_id": str(rollout_id), "attempt": int(attempt)})
