"""What makes a Gym agent server the agent participant, shared by :mod:`.agent` and
:mod:`.simple_agent`."""

from __future__ import annotations

import os
from typing import Any

from ...participants import AgentParticipant
from ...server import install_error_handlers, install_participant
from .resources import start_paused_if_asked

__all__ = ["install_agent_participant"]


def install_agent_participant(app: Any, name: str, what: str) -> AgentParticipant:
    """A new :class:`~rollout_checkpoint.participants.AgentParticipant` ``name`` (started paused
    when asked), its error handlers and control routes (``ROLLOUT_CHECKPOINT_TOKEN``, else a
    ``ValueError`` naming ``what``; ``ROLLOUT_CHECKPOINT_STORE``) mounted on the agent's ``app``,
    and kept as ``app.state.rollout_checkpoint_participant``."""
    participant = AgentParticipant(name)
    start_paused_if_asked(participant)
    install_error_handlers(app)
    token = os.environ.get("ROLLOUT_CHECKPOINT_TOKEN")
    if not token:
        raise ValueError(f"{what} needs ROLLOUT_CHECKPOINT_TOKEN")
    install_participant(app, participant, token=token, store=os.environ.get("ROLLOUT_CHECKPOINT_STORE"))
    app.state.rollout_checkpoint_participant = participant
    return participant
