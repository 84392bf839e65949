"""The SDK never needs NeMo Gym: importing it (and the integration's package) imports no Gym
module, and using a Gym-backed name where Gym is missing is one typed error with the recipe.
Runs with or without Gym installed (a fresh interpreter that hides Gym's packages)."""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = """
import sys
for name in ("nemo_gym", "resources_servers", "responses_api_agents"):
    sys.modules[name] = None  # as if not installed
import rollout_checkpoint
import rollout_checkpoint.integrations.nemo_gym as gym
assert not any(m.split(".")[0] in ("nemo_gym", "resources_servers", "responses_api_agents")
               for m in sys.modules if sys.modules[m] is not None)
try:
    gym.CheckpointedGymnasiumAgent
except gym.GymNotInstalledError as exc:
    print("refused:", exc)
else:
    raise SystemExit("the agent was importable without Gym")
"""


def test_the_sdk_and_the_integration_package_import_without_gym_and_say_how_to_install_it() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: NeMo Gym is not installed" in out.stdout
    assert "rollout-checkpoint[nemo-gym]" in out.stdout and "docs/nemo-gym.md" in out.stdout
