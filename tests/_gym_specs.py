"""Test-only Gym servers and specs, imported by server processes through PYTHONPATH:

* ``UnauditedMultiTurnEnv`` - a user's own server without a spec (Gym's multi-turn example's
  methods on a class of its own, so no built-in spec matches it): restart-only;
* ``CheckpointedCounter`` - a class that is already checkpointed (the launcher must refuse it);
* ``COUNTER_MISDECLARED`` - Gym's counter with ``/increment_counter`` wrongly declared a read;
* ``WORKPLACE_VERIFY_AS_READ`` - the docs' old mistake: workplace_assistant's ``/verify``
  (which pops the session) declared a read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import Field
from resources_servers.example_multi_turn_gymnasium.app import ExampleMultiTurnEnv
from resources_servers.example_session_state_mgmt.app import StatefulCounterResourcesServer
from resources_servers.gymnasium import GymnasiumServer

from rollout_checkpoint.integrations.nemo_gym import COUNTER, WORKPLACE_ASSISTANT, checkpointed


class UnauditedMultiTurnEnv(GymnasiumServer):
    ray_enabled = False
    session_turns: dict[str, int] = Field(default_factory=dict)

    reset = ExampleMultiTurnEnv.reset
    step = ExampleMultiTurnEnv.step
    _cleanup_session = ExampleMultiTurnEnv._cleanup_session


CheckpointedCounter: Any = checkpointed(StatefulCounterResourcesServer)

COUNTER_MISDECLARED = dataclasses.replace(
    COUNTER,
    name="counter-misdeclared",
    mutate_routes=frozenset({"/get_counter_value"}),
    read_routes=frozenset({"/increment_counter", "/verify"}),
)

WORKPLACE_VERIFY_AS_READ = dataclasses.replace(
    WORKPLACE_ASSISTANT,
    name="workplace-verify-as-read",
    read_routes=frozenset({"/verify"}),
    close_routes=frozenset(),
)
