"""Gym servers as real processes on 127.0.0.1: the scripted model, a checkpointed resources
server and the checkpointed gymnasium agent, each started through Gym's own start-up
(``run_webserver()`` reading ``NEMO_GYM_CONFIG_DICT``), SIGKILLed and restarted one at a time.

Used by ``examples/nemo_gym_blackjack.py`` and the integration tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ...server import RemoteParticipant

__all__ = ["ROLES", "GymDeployment", "GymServers", "free_port"]

ROLES = ("model", "resources", "agent")
MODEL_NAME = "policy_model"
RESOURCES_NAME = "blackjack"
AGENT_NAME = "blackjack_agent"
_NAMES = {"model": MODEL_NAME, "resources": RESOURCES_NAME, "agent": AGENT_NAME}
_LAUNCH = "rollout_checkpoint.integrations.nemo_gym.launch"
_READY_S = 90.0


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group ``proc`` leads (started with its own session) and wait, bounded,
    until no live member is left."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(0.1)
        if not _group_members(proc.pid):
            return


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class GymServers:
    """What to run: the resources server class and the deployment's settings."""

    store: str
    workdir: Path
    resources_class: str = "rollout_checkpoint.integrations.nemo_gym.seeded:SeededBlackjackEnv"
    seed: int = 0
    workers: int = 1
    model_delay_s: float = 0.3
    max_steps: int = 6
    observability: bool = True
    accept_unsafe_store: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)


class GymDeployment:
    """Start, kill and restart the three Gym processes; talk to their control routes."""

    def __init__(self, servers: GymServers) -> None:
        self.servers = servers
        self.workdir = servers.workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(16)
        self.ports = {"head": free_port(), **{role: free_port() for role in ROLES}}
        self.call_log = self.workdir / "model-calls.jsonl"
        self.model_gate = self.workdir / "model-gate"  # while it exists, later model calls wait
        self.hold_log = self.workdir / "model-held.jsonl"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: dict[str, int] = {role: 0 for role in ROLES}

    # -- configuration ------------------------------------------------------------------------------
    def gym_config(self) -> dict[str, Any]:
        s = self.servers
        host = "127.0.0.1"
        resources: dict[str, Any] = {
            "entrypoint": "app.py",
            "host": host,
            "port": self.ports["resources"],
            "domain": "games",
            "num_workers": s.workers,
        }
        return {
            "head_server": {"host": host, "port": self.ports["head"]},
            "dry_run": False,
            "observability_enabled": s.observability,
            "model_call_capture_dir": str(self.workdir / "capture"),
            MODEL_NAME: {
                "responses_api_models": {
                    "scripted": {
                        "entrypoint": "app.py",
                        "host": host,
                        "port": self.ports["model"],
                        "seed": s.seed,
                        "delay_s": s.model_delay_s,
                        "call_log": str(self.call_log),
                        "hold_file": str(self.model_gate),
                        "hold_log": str(self.hold_log),
                    }
                }
            },
            RESOURCES_NAME: {"resources_servers": {"blackjack": resources}},
            AGENT_NAME: {
                "responses_api_agents": {
                    "gymnasium_agent": {
                        "entrypoint": "app.py",
                        "host": host,
                        "port": self.ports["agent"],
                        "resources_server": {"type": "resources_servers", "name": RESOURCES_NAME},
                        "model_server": {"type": "responses_api_models", "name": MODEL_NAME},
                        "max_steps": s.max_steps,
                    }
                }
            },
        }

    def url(self, role: str) -> str:
        return f"http://127.0.0.1:{self.ports[role]}"

    def _env(self, role: str, paused: bool) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_GYM_", "ROLLOUT_CHECKPOINT_"))}
        env.update(
            {
                "NEMO_GYM_CONFIG_DICT": json.dumps(self.gym_config()),
                "NEMO_GYM_CONFIG_PATH": _NAMES[role],
                "ROLLOUT_CHECKPOINT_TOKEN": self.token,
                "ROLLOUT_CHECKPOINT_STORE": self.servers.store,
                "ROLLOUT_CHECKPOINT_START_PAUSED": "1" if paused else "0",
                "ROLLOUT_CHECKPOINT_ACCEPT_UNSAFE_STORE": "1" if self.servers.accept_unsafe_store else "0",
                "PYTHONUNBUFFERED": "1",
                "TMPDIR": str(self.workdir),
                "NO_PROXY": "127.0.0.1,localhost",
            }
        )
        env.update(self.servers.extra_env)
        return env

    # -- processes ----------------------------------------------------------------------------------
    def start(self, role: str, *, paused: bool = False) -> None:
        args = [sys.executable, "-m", _LAUNCH, role]
        if role == "resources":
            args.append(self.servers.resources_class)
        self.starts[role] += 1
        log = open(self.workdir / f"{role}-{self.starts[role]}.log", "wb")  # noqa: SIM115 (owned by the process)
        self.procs[role] = subprocess.Popen(
            args, env=self._env(role, paused), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def start_all(self) -> None:
        for role in ROLES:
            self.start(role)
        for role in ROLES:
            self.wait_ready(role)

    def wait_ready(self, role: str) -> None:
        end = time.monotonic() + _READY_S
        headers = {"Authorization": f"Bearer {self.token}"}
        while time.monotonic() < end:
            proc = self.procs[role]
            if proc.poll() is not None:
                raise RuntimeError(f"the {role} server exited ({proc.returncode}): {self.log_tail(role)}")
            try:
                r = httpx.get(
                    f"{self.url(role)}/ng-control/v1/checkpoint/status",
                    headers=headers,
                    timeout=2,
                    trust_env=False,
                )
                if r.status_code == 200 and (
                    role != "resources" or r.json().get("workers", 1) >= self.servers.workers
                ):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the {role} server did not answer within {_READY_S:.0f} s: {self.log_tail(role)}")

    def log_tail(self, role: str, lines: int = 15) -> str:
        path = self.workdir / f"{role}-{self.starts[role]}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self, role: str) -> None:
        """SIGKILL the server (its whole process group: a worker group's workers too)."""
        _end_group(self.procs[role])

    def restart(self, role: str) -> None:
        """Start a replacement that admits nothing until it is restored (or resumed)."""
        self.start(role, paused=True)
        self.wait_ready(role)

    def stop(self) -> None:
        """SIGTERM every server's process group, then SIGKILL what is left of each group (a
        worker group's workers may outlive their main process for a moment)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            _end_group(proc)

    # -- control ------------------------------------------------------------------------------------
    def remote(self, role: str) -> RemoteParticipant:
        return RemoteParticipant(self.url(role), token=self.token)

    def hold_model(self) -> None:
        """Close the scripted model's gate: each rollout's second and later model calls wait
        (before generating) until :meth:`release_model`, so rollouts stay mid-episode."""
        self.model_gate.touch()

    def release_model(self) -> None:
        """Open the gate: held calls (and later ones) go on."""
        self.model_gate.unlink(missing_ok=True)

    def held_calls(self) -> list[dict[str, Any]]:
        """The model calls the gate held (``rollout_id``, ``attempt``, ``call_id``), oldest first."""
        return self._lines(self.hold_log)

    def model_calls(self) -> list[dict[str, Any]]:
        return self._lines(self.call_log)

    @staticmethod
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
