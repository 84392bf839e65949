"""What a Gym user's ``ng_run`` gives the collection tests: the checkpointed blackjack deployment
(scripted model, checkpointed blackjack, checkpointed gymnasium agent) plus the two processes Gym
itself adds, each started through Gym's own start-up: the head server (the collector reads the
servers' addresses from it) and the ``legacy_agent`` environment server that relays ``/run`` to
the agent (Gym 0.7.0 reaches an agent only through an environment server)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from rollout_checkpoint.integrations.nemo_gym.deployment import AGENT_NAME, GymDeployment, free_port
from rollout_checkpoint.integrations.nemo_gym.scenario import PROMPT

RELAY_NAME = "blackjack_environment_server"
_HEAD = (
    "from nemo_gym.server_utils import HeadServer; _, thread, _ = HeadServer.run_webserver(); thread.join()"
)
_RELAY = (
    "from environment_servers.legacy_agent.app import LegacyAgentEnvironmentServer as S\n"
    "class Relay(S):\n    ray_enabled = False\n"  # a relay needs no Ray cluster
    "Relay.run_webserver()"
)


class CollectDeployment(GymDeployment):
    """The three checkpointed servers, Gym's head server and the relay."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ports["relay"] = free_port()
        self.extras: dict[str, subprocess.Popen[bytes]] = {}

    def gym_config(self) -> dict[str, Any]:
        config = super().gym_config()
        config[RELAY_NAME] = {
            "environment_servers": {
                "legacy_agent": {
                    "entrypoint": "app.py",
                    "host": "127.0.0.1",
                    "port": self.ports["relay"],
                    "agent_server": {"type": "responses_api_agents", "name": AGENT_NAME},
                }
            }
        }
        return config

    def start_all(self) -> None:
        super().start_all()
        for name, code in (("head", _HEAD), ("relay", _RELAY)):
            env = self._env("agent", False)
            env["NEMO_GYM_CONFIG_PATH"] = RELAY_NAME if name == "relay" else "head_server"
            log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (owned by the process)
            self.extras[name] = subprocess.Popen(
                [sys.executable, "-c", code],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
        end = time.monotonic() + 90
        for name, path in (("head", "/global_config_dict_yaml"), ("relay", "/docs")):
            while True:
                if self.extras[name].poll() is not None or time.monotonic() > end:
                    raise RuntimeError(
                        f"{name} did not start: {(self.workdir / f'{name}.log').read_text()[-2000:]}"
                    )
                try:
                    if httpx.get(f"{self.url(name)}{path}", timeout=2, trust_env=False).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)

    def stop(self) -> None:
        self.procs.update({f"extra-{k}": v for k, v in self.extras.items()})
        super().stop()


def write_input(path: Path, seeds: dict[str, int]) -> Path:
    """A Gym input JSONL of blackjack tasks: ``{rollout id: seed}`` (the seed makes each deal
    reproducible; explicit ``_ng_rollout_id`` s keep runs on one deployment apart)."""
    path.write_text(
        "".join(
            json.dumps({"responses_create_params": {"input": PROMPT}, "seed": seed, "_ng_rollout_id": rid})
            + "\n"
            for rid, seed in seeds.items()
        )
    )
    return path


def collect_args(dep: CollectDeployment, inp: Path, out: Path, **extra: Any) -> list[str]:
    """The Hydra overrides of ``ng_collect_rollouts`` plus the checkpointing block."""
    args = [
        "+head_server.host=127.0.0.1",
        f"+head_server.port={dep.ports['head']}",
        f"+input_jsonl_fpath={inp}",
        f"+output_jsonl_fpath={out}",
        f"+agent_name={AGENT_NAME}",
        f"+rollout_checkpoint.store={dep.servers.store}",
    ]
    args += [f"+rollout_checkpoint.{k}={v}" for k, v in extra.items()]
    return args


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
