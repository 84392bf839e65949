"""Checkpointed Gym servers as real processes, from a Gym-style config.

:class:`GymDeployment` takes the config ``ng_run`` reads (top-level server instances, each
``{<server type>: {<folder>: {entrypoint, host, port, ..., checkpoint_class}}}``) and runs every
instance whose config names a ``checkpoint_class`` as one process through Gym's own start-up
(:mod:`.component`, the code behind the SDK's Gym component root): settings reach it as Gym's
do (``NEMO_GYM_CONFIG_DICT`` / ``NEMO_GYM_CONFIG_PATH``) plus the checkpoint token (in the
environment, or a file the process reads) and the store. It can SIGKILL a server, start a
replacement **paused**, and :meth:`GymDeployment.recover` brings every server back to the last
published checkpoint through the public :meth:`~rollout_checkpoint.coordinator.Coordinator.recover`.
:meth:`GymDeployment.supervise` restarts a server that died, paused, on its own (the SDK launcher,
:mod:`.launcher`).

A server is named by its top-level config key, or by its role (``resources``, ``agent``,
``model``) when exactly one server has that role.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ...coordinator import Coordinator, RestoreOutcome
from ...ids import ExecutionId
from ...registry import LiveExecutionRegistry
from ...server import RemoteParticipant
from ...tokens import ObjectStoreTokenStore

__all__ = [
    "ROLES",
    "ROLE_OF_TYPE",
    "GymDeployment",
    "GymServer",
    "free_port",
    "gym_servers",
]

ROLE_OF_TYPE = {
    "resources_servers": "resources",
    "responses_api_agents": "agent",
    "responses_api_models": "model",
}
ROLES = ("model", "resources", "agent")
_COMPONENT = "rollout_checkpoint.integrations.nemo_gym.component"
_READY_S = 90.0
_STATUS = "/ng-control/v1/checkpoint/status"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class GymServer:
    """One server instance of a Gym config: ``config[name][server_type][folder]``."""

    name: str
    server_type: str
    folder: str
    config: Mapping[str, Any]

    @property
    def role(self) -> str:
        """``resources``, ``agent`` or ``model``; another server type's name for Gym's own servers."""
        return ROLE_OF_TYPE.get(self.server_type, self.server_type)

    @property
    def checkpointed(self) -> bool:
        return bool(self.config.get("checkpoint_class"))

    @property
    def workers(self) -> int:
        return int(self.config.get("num_workers") or 1)

    @property
    def url(self) -> str:
        return f"http://{self.config['host']}:{self.config['port']}"


def gym_servers(config: Mapping[str, Any]) -> dict[str, GymServer]:
    """The server instances of a Gym config (top-level keys whose value is ``{type: {folder:
    {entrypoint: ...}}}`` with a known server type), by name, as ``ng_run`` finds them."""
    out: dict[str, GymServer] = {}
    for name, value in config.items():
        if not isinstance(value, Mapping) or len(value) != 1:
            continue
        server_type, inner = next(iter(value.items()))
        if server_type not in ROLE_OF_TYPE or not isinstance(inner, Mapping) or len(inner) != 1:
            continue
        folder, conf = next(iter(inner.items()))
        if isinstance(conf, Mapping) and "entrypoint" in conf:
            out[str(name)] = GymServer(str(name), str(server_type), str(folder), conf)
    return out


def _all_instances(config: Mapping[str, Any]) -> dict[str, GymServer]:
    """Every server instance with an entrypoint, of any server type (Gym's environment servers too)."""
    out: dict[str, GymServer] = {}
    for name, value in config.items():
        if isinstance(value, Mapping) and len(value) == 1:
            server_type, inner = next(iter(value.items()))
            if isinstance(inner, Mapping) and len(inner) == 1:
                folder, conf = next(iter(inner.items()))
                if isinstance(conf, Mapping) and "entrypoint" in conf:
                    out[str(name)] = GymServer(str(name), str(server_type), str(folder), conf)
    return out


def gym_folder(server: GymServer) -> Path:
    """The server's entrypoint folder, found as ``ng_run`` finds it: the first of Gym's component
    search roots (``NEMO_GYM_EXTRA_ROOTS``, the cwd, Gym's install) that holds
    ``<server type>/<folder>/`` with a ``requirements.txt`` or ``pyproject.toml``."""
    import nemo_gym

    for root in nemo_gym.component_search_roots():
        folder = Path(root) / server.server_type / server.folder
        if (folder / "requirements.txt").exists() or (folder / "pyproject.toml").exists():
            return folder
    raise ValueError(
        f"server {server.name!r}: no folder {server.server_type}/{server.folder} in Gym's search roots"
    )


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


class GymDeployment:
    """Start, kill, restart (paused) and recover the checkpointed servers of a Gym config.

    ``config`` is a Gym config as a mapping (what ``ng_run`` resolves from its YAML files;
    :func:`~.launcher.load_gym_config` reads them). Checkpointed servers without ``host`` /
    ``port`` get ``127.0.0.1`` and a free port; so does ``head_server``.

    * ``store``: the checkpoint store URL; default: the servers' ``checkpoint_store`` (one
      value for all), else ``ROLLOUT_CHECKPOINT_STORE``.
    * ``token`` / ``token_file``: the control routes' bearer token; with ``token_file`` the
      servers read the file (``ROLLOUT_CHECKPOINT_TOKEN_FILE``), the token never enters their
      environment. Default: ``ROLLOUT_CHECKPOINT_TOKEN``, else a new random token.
    * ``env``: more environment for every server (``PYTHONPATH`` for your own classes, ...).
    * ``run_other_servers``: also start the config's servers that have no ``checkpoint_class``
      (Gym's environment servers, ...) from their own folder, as ``ng_run`` does; they are not
      participants. Those that join Ray need ``ray_head_node_address`` in the config
      (:class:`~.launcher.GymLauncher` starts a cluster as ``ng_run`` does).

    Each process writes ``<workdir>/<name>-<n>.log``.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        workdir: str | Path,
        store: str | None = None,
        token: str | None = None,
        token_file: str | Path | None = None,
        accept_unsafe_store: bool = False,
        env: Mapping[str, str] | None = None,
        python: str | None = None,
        ready_timeout_s: float = _READY_S,
        run_other_servers: bool = True,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config: dict[str, Any] = json.loads(json.dumps(copy.deepcopy(dict(config))))
        self.servers = {n: s for n, s in gym_servers(self.config).items() if s.checkpointed}
        if not self.servers:
            raise ValueError(
                "the Gym config has no checkpointed server (a server instance whose config names "
                "checkpoint_class: module:Class)"
            )
        head = self.config.setdefault("head_server", {})
        head.setdefault("host", "127.0.0.1")
        head.setdefault("port", free_port())
        for server in _all_instances(self.config).values():
            conf = self.config[server.name][server.server_type][server.folder]
            conf.setdefault("host", "127.0.0.1")
            conf["port"] = conf.get("port") or free_port()
        self.servers = {n: s for n, s in gym_servers(self.config).items() if s.checkpointed}
        # the config's servers without a checkpoint (Gym's environment servers: the relays from
        # the collector to an agent), started unchanged from their folder when ``run_other_servers``
        self.other_servers = (
            {n: s for n, s in _all_instances(self.config).items() if n not in self.servers}
            if run_other_servers
            else {}
        )
        self.store = store or self._store_from_config() or os.environ.get("ROLLOUT_CHECKPOINT_STORE")
        if not self.store:
            raise ValueError(
                "no checkpoint store: pass one (store=, --store), set checkpoint_store in the "
                "servers' config, or ROLLOUT_CHECKPOINT_STORE"
            )
        self.token_file = Path(token_file) if token_file else None
        if self.token_file is not None:
            self.token = self.token_file.read_text().strip()
        else:
            self.token = token or os.environ.get("ROLLOUT_CHECKPOINT_TOKEN") or secrets.token_hex(16)
        if not self.token:
            raise ValueError(f"the token file {self.token_file} is empty")
        self.accept_unsafe_store = accept_unsafe_store
        self.extra_env = dict(env or {})
        self.python = python or sys.executable
        self.ready_timeout_s = ready_timeout_s
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: dict[str, int] = {name: 0 for name in self.all_names()}
        self.restarts: list[str] = []  # the servers supervise() restarted, in order
        self.restart_errors: list[str] = []  # why a replacement did not come up
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def _store_from_config(self) -> str | None:
        stores = {
            str(s.config["checkpoint_store"])
            for s in self.servers.values()
            if s.config.get("checkpoint_store")
        }
        if len(stores) > 1:
            raise ValueError(f"the servers name different checkpoint stores: {sorted(stores)}")
        return next(iter(stores), None)

    # -- naming -------------------------------------------------------------------------------------
    def all_names(self) -> list[str]:
        """The checkpointed servers, then Gym's own others."""
        return [*self.servers, *self.other_servers]

    def name(self, server: str) -> str:
        """The server's config name; a role (``resources``, ``agent``, ``model``) names the one
        server that has it."""
        if server in self.servers or server in self.other_servers:
            return server
        matches = [n for n, s in self.servers.items() if s.role == server]
        if len(matches) == 1:
            return matches[0]
        known = ", ".join(sorted(self.servers))
        if matches:
            raise KeyError(
                f"{len(matches)} servers have the role {server!r} ({', '.join(matches)}): name one"
            )
        raise KeyError(f"no checkpointed server {server!r} in the Gym config (it has: {known})")

    def server(self, server: str) -> GymServer:
        name = self.name(server)
        return self.servers[name] if name in self.servers else self.other_servers[name]

    def url(self, server: str) -> str:
        return self.server(server).url

    def log_path(self, server: str) -> Path:
        name = self.name(server)
        return self.workdir / f"{name}-{self.starts[name]}.log"

    # -- processes ----------------------------------------------------------------------------------
    def environment(self, server: str, *, paused: bool = False) -> dict[str, str]:
        """The environment a server process starts with."""
        name = self.name(server)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("NEMO_GYM_CONFIG", "ROLLOUT_CHECKPOINT_"))
        }
        env.update(
            {
                "NEMO_GYM_CONFIG_DICT": json.dumps(self.config),
                "NEMO_GYM_CONFIG_PATH": name,
                "ROLLOUT_CHECKPOINT_STORE": str(self.store),
                "ROLLOUT_CHECKPOINT_START_PAUSED": "1" if paused else "0",
                "ROLLOUT_CHECKPOINT_ACCEPT_UNSAFE_STORE": "1" if self.accept_unsafe_store else "0",
                "PYTHONUNBUFFERED": "1",
                "NO_PROXY": "127.0.0.1,localhost",
            }
        )
        if self.token_file is not None:
            env["ROLLOUT_CHECKPOINT_TOKEN_FILE"] = str(self.token_file)
        else:
            env["ROLLOUT_CHECKPOINT_TOKEN"] = self.token
        env.update(self.extra_env)
        return env

    def start(self, server: str, *, paused: bool = False) -> None:
        """Start the server's process (its own process group); ``paused``: it admits nothing
        until a coordinator restores (or resumes) it."""
        name = self.name(server)
        env = self.environment(name, paused=paused)
        args: list[str] = [self.python, "-m", _COMPONENT]
        cwd: Path | None = None
        if name in self.other_servers:  # Gym's own entrypoint, as ng_run starts it
            other = self.other_servers[name]
            cwd = gym_folder(other)
            args = [self.python, str(cwd / str(other.config["entrypoint"]))]
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(cwd), env.get("PYTHONPATH", "")) if p)
        with self._lock:
            self.starts[name] += 1
            log = open(self.log_path(name), "wb")  # noqa: SIM115 (owned by the process)
            self.procs[name] = subprocess.Popen(
                args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            log.close()

    def start_all(self) -> None:
        """Start every server and wait until each answers."""
        for name in self.all_names():
            self.start(name)
        for name in self.all_names():
            self.wait_ready(name)

    def alive(self, server: str) -> bool:
        proc = self.procs.get(self.name(server))
        return proc is not None and proc.poll() is None

    def pid(self, server: str) -> int:
        return self.procs[self.name(server)].pid

    def wait_ready(self, server: str, timeout_s: float | None = None) -> None:
        """Until the server's control routes answer (every worker of a worker group started);
        raises, with the end of its log, when it exits or ``timeout_s`` passes."""
        name = self.name(server)
        limit = self.ready_timeout_s if timeout_s is None else timeout_s
        end = time.monotonic() + limit
        headers = {"Authorization": f"Bearer {self.token}"}
        plain = name in self.other_servers  # not a participant: Gym's readiness route
        workers = self.server(name).workers
        while time.monotonic() < end:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"the {name} server exited ({proc.returncode}): {self.log_tail(name)}")
            try:
                path = "/healthz" if plain else _STATUS
                r = httpx.get(f"{self.url(name)}{path}", headers=headers, timeout=2, trust_env=False)
                if r.status_code == 200 and (plain or int(r.json().get("workers", 1)) >= workers):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the {name} server did not answer within {limit:.0f} s: {self.log_tail(name)}")

    def log_tail(self, server: str, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path(server).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self, server: str) -> None:
        """SIGKILL the server (its whole process group: a worker group's workers too)."""
        _end_group(self.procs[self.name(server)])

    def restart(self, server: str) -> None:
        """Start a replacement that admits nothing until it is restored (or resumed), and wait
        until it answers."""
        self.start(server, paused=True)
        self.wait_ready(server)

    def supervise(self, on_restart: Callable[[str], None] | None = None, poll_s: float = 0.2) -> None:
        """Watch the servers from a background thread: one that exits (crash, SIGKILL) is
        restarted alone, paused (Gym's own servers: restarted), and ``on_restart(name)`` is
        called once it answers (then :meth:`recover`). :meth:`stop` ends the watch."""
        if self._watcher is not None:
            return

        def watch() -> None:
            while not self._stopping.wait(poll_s):
                for name in self.all_names():
                    with self._lock:
                        proc = self.procs.get(name)
                        if proc is None or proc.poll() is None or self._stopping.is_set():
                            continue
                        _end_group(proc)  # a worker group's workers go with it
                        try:
                            self.restart(name)
                        except Exception as exc:  # it died at start: tried again at the next poll
                            self.restart_errors.append(f"{name}: {exc}")
                            print(f"restarting {name} failed: {exc}", file=sys.stderr, flush=True)
                            continue
                        self.restarts.append(name)
                    if on_restart is not None:
                        on_restart(name)

        self._watcher = threading.Thread(target=watch, name="gym-deployment-supervisor", daemon=True)
        self._watcher.start()

    def wait_restarted(self, server: str, count: int = 1, timeout_s: float | None = None) -> None:
        """Until :meth:`supervise` restarted ``server`` ``count`` times (and it answers)."""
        name = self.name(server)
        end = time.monotonic() + (self.ready_timeout_s if timeout_s is None else timeout_s)
        while self.restarts.count(name) < count:
            if time.monotonic() > end:
                raise RuntimeError(f"the {name} server was not restarted in time: {self.log_tail(name)}")
            time.sleep(0.05)

    def stop(self) -> None:
        """End the watch, SIGTERM every server's process group, then SIGKILL what is left of
        each group (a worker group's workers may outlive their main process for a moment)."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(self.ready_timeout_s + 15)
        with self._lock:
            for proc in self.procs.values():
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
            for proc in self.procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
                _end_group(proc)

    def __enter__(self) -> GymDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- control ------------------------------------------------------------------------------------
    def remote(self, server: str) -> RemoteParticipant:
        """The server's control routes, as a participant a :class:`Coordinator` drives."""
        return RemoteParticipant(self.url(server), token=self.token)

    def remotes(self) -> list[RemoteParticipant]:
        return [self.remote(name) for name in self.servers]

    def coordinator(self, registry: LiveExecutionRegistry, **kwargs: Any) -> Coordinator:
        """A coordinator over every checkpointed server, with the token store under the store."""
        kwargs.setdefault("accept_unsafe_store", self.accept_unsafe_store)
        return Coordinator(
            str(self.store), self.remotes(), registry, ObjectStoreTokenStore(str(self.store)), **kwargs
        )

    def recover(
        self, coordinator: Coordinator, retire: Iterable[ExecutionId] = (), **kwargs: Any
    ) -> RestoreOutcome:
        """After a crash (the dead servers restarted paused): :meth:`Coordinator.recover` - abort
        what is open, retire the live attempts, restore the latest checkpoint into survivors
        and replacements, resume (unless ``resume=False``)."""
        return coordinator.recover(retire, **kwargs)
