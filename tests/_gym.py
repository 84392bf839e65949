"""NeMo Gym for the integration tests: skip (printing why) only where Gym cannot be imported;
with ``ROLLOUT_CHECKPOINT_REQUIRE_GYM=1`` (``.ci/run`` sets it) a missing Gym fails instead."""

from __future__ import annotations

import os

import pytest

REQUIRE_ENV = "ROLLOUT_CHECKPOINT_REQUIRE_GYM"


def require_gym() -> None:
    """Call at module level before importing anything that needs Gym."""
    try:
        import nemo_gym  # noqa: F401
        import resources_servers.blackjack.app  # noqa: F401
        import responses_api_agents.gymnasium_agent.app  # noqa: F401
    except Exception as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            raise
        pytest.skip(
            f"NeMo Gym cannot be imported here ({type(exc).__name__}: {exc}); "
            "install it with `bash .ci/install-nemo-gym.sh .venv/bin/python`",
            allow_module_level=True,
        )
