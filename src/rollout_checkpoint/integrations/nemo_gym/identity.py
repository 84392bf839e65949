"""The rollout identity a Gym request carries, as this SDK's :class:`ExecutionId`.

Gym names one attempt of a rollout by its *capture key*: the rollout id for attempt 0,
``<rollout_id>-a<N>`` after. A resources server learns it only (a) from the
``/ng-rollout/<capture key>/`` route prefix, which Gym's clients add when
``observability_enabled: true`` and Gym's own middleware strips into a context variable, or
(b) from a typed request body carrying ``episode_id: {rollout_id, attempt}``. Gym forbids rollout
ids that end in ``-a<N>``, which keeps the capture key unambiguous; this module refuses them too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...errors import CheckpointError
from ...ids import ExecutionId

__all__ = [
    "IDENTITY_SETTING",
    "RolloutIdentityRequiredError",
    "execution_from_capture_key",
    "execution_from_episode_id",
    "execution_from_run_body",
]

_ATTEMPT_SUFFIX = re.compile(r"^(?P<rollout>.+)-a(?P<attempt>[1-9][0-9]*)$")

IDENTITY_SETTING = (
    "set `observability_enabled: true` in the NeMo Gym config (Gym's clients then prefix every "
    "call with /ng-rollout/<rollout id>/), or send a typed body with `episode_id`"
)


class RolloutIdentityRequiredError(CheckpointError):
    """A session request carried no rollout identity (HTTP 400: nothing was changed)."""

    code = "rollout_id_required"


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
