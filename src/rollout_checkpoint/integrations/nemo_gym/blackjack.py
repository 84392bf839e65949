"""The blackjack deployment of the example and the tests: the scripted model, a checkpointed
resources server (Gym's blackjack, seeded, by default) and the checkpointed gymnasium agent, as
a Gym config of the component root's folders (:func:`blackjack_config`), run by a
:class:`~.deployment.GymDeployment` that also opens and closes the scripted model's gate."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .deployment import GymDeployment

__all__ = [
    "AGENT_NAME",
    "MODEL_NAME",
    "PROMPT",
    "RESOURCES_NAME",
    "BlackjackDeployment",
    "GymServers",
    "blackjack_config",
]

PROMPT = "You are playing blackjack."
MODEL_NAME = "policy_model"
RESOURCES_NAME = "blackjack"
AGENT_NAME = "blackjack_agent"
FOLDER = "checkpointed"  # the SDK component root's entrypoint folders


@dataclass
class GymServers:
    """The blackjack deployment's settings: the resources server class (and spec), the
    scripted model's seed and delay, workers, the agent's step limit."""

    store: str
    workdir: Path
    resources_class: str = "rollout_checkpoint.integrations.nemo_gym.seeded:SeededBlackjackEnv"
    resources_spec: str | None = None
    seed: int = 0
    workers: int = 1
    model_delay_s: float = 0.3
    max_steps: int = 6
    observability: bool = True
    accept_unsafe_store: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)

    def gym_config(self) -> dict[str, Any]:
        return blackjack_config(self)

    def deployment(self) -> BlackjackDeployment:
        return BlackjackDeployment(self)


def blackjack_config(s: GymServers) -> dict[str, Any]:
    """The Gym config of the scripted model, the checkpointed resources server and the
    checkpointed gymnasium agent (the component root's folders; ports left to the deployment)."""
    workdir = Path(s.workdir).absolute()
    resources: dict[str, Any] = {
        "entrypoint": "app.py",
        "checkpoint_class": s.resources_class,
        "domain": "games",
        "num_workers": s.workers,
        "allowed_agents": [FOLDER],
    }
    if s.resources_spec:
        resources["checkpoint_spec"] = s.resources_spec
    return {
        "dry_run": False,
        "observability_enabled": s.observability,
        "model_call_capture_dir": str(workdir / "capture"),
        MODEL_NAME: {
            "responses_api_models": {
                FOLDER: {
                    "entrypoint": "app.py",
                    "checkpoint_class": "rollout_checkpoint.integrations.nemo_gym:ScriptedResponsesModel",
                    "seed": s.seed,
                    "delay_s": s.model_delay_s,
                    "call_log": str(workdir / "model-calls.jsonl"),
                    "hold_file": str(workdir / "model-gate"),
                    "hold_log": str(workdir / "model-held.jsonl"),
                }
            }
        },
        RESOURCES_NAME: {"resources_servers": {FOLDER: resources}},
        AGENT_NAME: {
            "responses_api_agents": {
                FOLDER: {
                    "entrypoint": "app.py",
                    "checkpoint_class": "rollout_checkpoint.integrations.nemo_gym:CheckpointedGymnasiumAgent",
                    "resources_server": {"type": "resources_servers", "name": RESOURCES_NAME},
                    "model_server": {"type": "responses_api_models", "name": MODEL_NAME},
                    "max_steps": s.max_steps,
                }
            }
        },
    }


class BlackjackDeployment(GymDeployment):
    """The blackjack :class:`GymDeployment` plus the scripted model's gate and call log."""

    def __init__(self, servers: GymServers) -> None:
        self.settings = servers
        super().__init__(
            servers.gym_config(),
            workdir=servers.workdir,
            store=servers.store,
            accept_unsafe_store=servers.accept_unsafe_store,
            env={"TMPDIR": str(Path(servers.workdir).absolute()), **servers.extra_env},
        )
        model = self.server("model").config
        self.call_log = Path(model["call_log"])
        self.model_gate = Path(model["hold_file"])  # while it exists, later model calls wait
        self.hold_log = Path(model["hold_log"])

    def hold_model(self) -> None:
        """Close the scripted model's gate: each rollout's second and later model calls wait
        (before generating) until :meth:`release_model`, so rollouts stay mid-episode."""
        self.model_gate.touch()

    def release_model(self) -> None:
        """Open the gate: held calls (and later ones) go on."""
        self.model_gate.unlink(missing_ok=True)

    def held_calls(self) -> list[dict[str, Any]]:
        """The model calls the gate held (``rollout_id``, ``attempt``, ``call_id``), oldest first."""
        return _lines(self.hold_log)

    def model_calls(self) -> list[dict[str, Any]]:
        return _lines(self.call_log)


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):  # a line still being appended
            out.append(json.loads(line))
    return out
