"""What a Gym user's ``ng_run`` gives the collection tests: the checkpointed blackjack deployment
(scripted model, checkpointed blackjack, checkpointed gymnasium agent) plus the two processes Gym
itself adds, each started through Gym's own start-up: the head server (the collector reads the
servers' addresses from it) and the ``legacy_agent`` environment server that relays ``/run`` to
the agent (Gym 0.7.0 reaches an agent only through an environment server)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from rollout_checkpoint.integrations.nemo_gym.blackjack import (
    AGENT_NAME,
    PROMPT,
    BlackjackDeployment,
    GymServers,
)

RELAY_NAME = "blackjack_environment_server"
_HEAD = (
    "from nemo_gym.server_utils import HeadServer; _, thread, _ = HeadServer.run_webserver(); thread.join()"
)
_RELAY = (
    "from environment_servers.legacy_agent.app import LegacyAgentEnvironmentServer as S\n"
    "class Relay(S):\n    ray_enabled = False\n"  # a relay needs no Ray cluster
    "Relay.run_webserver()"
)


class CollectServers(GymServers):
    """The blackjack servers' config plus Gym's ``legacy_agent`` relay in front of the agent."""

    def gym_config(self) -> dict[str, Any]:
        config = super().gym_config()
        config[RELAY_NAME] = {
            "environment_servers": {
                "legacy_agent": {
                    "entrypoint": "app.py",
                    "agent_server": {"type": "responses_api_agents", "name": AGENT_NAME},
                }
            }
        }
        return config

    def deployment(self) -> CollectDeployment:
        return CollectDeployment(self)


class CollectDeployment(BlackjackDeployment):
    """The three checkpointed servers, Gym's head server and the relay (without the Ray cluster
    Gym would start for it)."""

    def __init__(self, servers: CollectServers) -> None:
        super().__init__(servers)
        self.other_servers = {}  # the relay starts below, Ray-free
        self.extras: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def head_port(self) -> int:
        return int(self.config["head_server"]["port"])

    def extra_url(self, name: str) -> str:
        if name == "head":
            return f"http://127.0.0.1:{self.head_port}"
        port = self.config[RELAY_NAME]["environment_servers"]["legacy_agent"]["port"]
        return f"http://127.0.0.1:{port}"

    def start_all(self) -> None:
        super().start_all()
        for name, code in (("head", _HEAD), ("relay", _RELAY)):
            env = self.environment("agent")
            env["NEMO_GYM_CONFIG_PATH"] = RELAY_NAME if name == "relay" else "head_server"
            log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (owned by the process)
            self.extras[name] = subprocess.Popen(
                [self.python, "-c", code],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            self.procs[f"extra-{name}"] = self.extras[name]  # stop() ends it with the servers
        end = time.monotonic() + 90
        for name, path in (("head", "/global_config_dict_yaml"), ("relay", "/docs")):
            while True:
                if self.extras[name].poll() is not None or time.monotonic() > end:
                    text = (self.workdir / f"{name}.log").read_text()[-2000:]
                    raise RuntimeError(f"{name} did not start: {text}")
                try:
                    if (
                        httpx.get(f"{self.extra_url(name)}{path}", timeout=2, trust_env=False).status_code
                        == 200
                    ):
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)


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
        f"+head_server.port={dep.head_port}",
        f"+input_jsonl_fpath={inp}",
        f"+output_jsonl_fpath={out}",
        f"+agent_name={AGENT_NAME}",
        f"+rollout_checkpoint.store={dep.store}",
    ]
    args += [f"+rollout_checkpoint.{k}={v}" for k, v in extra.items()]
    return args


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
