"""The SDK launcher: serve a Gym config's checkpointed servers and restart only a dead one, paused.

    python -m rollout_checkpoint.integrations.nemo_gym.launcher "+config_paths=[a.yaml,b.yaml]" \\
        [++key=value ...] [--workdir DIR] [--token-file FILE] [--accept-unsafe-store]

reads the same config ``ng_run`` reads, through Gym's own parser (Hydra overrides, ``config_paths``
found under ``NEMO_GYM_EXTRA_ROOTS`` / the cwd / Gym's install; the SDK's component root is
added to the search roots), runs Gym's head server (so ``ng_collect_rollouts`` and the servers
find each other as under ``ng_run``), a local Ray cluster when the config has servers of Gym's
own (its environment servers, which join Ray), and every server as its own process
(:class:`~.deployment.GymDeployment`). Where ``ng_run`` tears everything down when one server
dies, the launcher restarts that server alone, **paused**: it admits nothing until the run's
coordinator restores it (``Coordinator.recover()``, which also retires the attempts the crash
cut and restores the survivors), so no request of a dead attempt is served from a blank state.
``<workdir>/launcher.json`` says, after every start and restart, each server's url, pid and
start count, and the restarts so far. SIGTERM / SIGINT stop every server.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .component import component_root
from .deployment import GymDeployment

__all__ = ["GymLauncher", "load_gym_config", "main"]


def load_gym_config(overrides: list[str]) -> dict[str, Any]:
    """The Gym config ``ng_run overrides...`` would run, resolved by Gym's own parser (once per
    process: Gym caches it), with the SDK's component root among the search roots."""
    import nemo_gym
    from nemo_gym.global_config import get_global_config_dict
    from omegaconf import OmegaConf

    roots = os.environ.get(nemo_gym.NEMO_GYM_EXTRA_ROOTS_ENV_VAR_NAME, "")
    root = str(component_root())
    if root not in roots.split(os.pathsep):
        os.environ[nemo_gym.NEMO_GYM_EXTRA_ROOTS_ENV_VAR_NAME] = os.pathsep.join(
            p for p in (root, roots) if p
        )
    saved = sys.argv
    sys.argv = [saved[0], *overrides]
    try:
        config = OmegaConf.to_container(get_global_config_dict(), resolve=True)
    finally:
        sys.argv = saved
    if not isinstance(config, dict):
        raise ValueError("the Gym config is not a mapping")
    return {str(k): v for k, v in config.items()}


class GymLauncher:
    """A :class:`GymDeployment` whose supervisor restarts a dead server alone, paused, and keeps
    ``launcher.json`` current; optionally with Gym's head server in this process."""

    def __init__(self, config: Mapping[str, Any], *, workdir: str | Path, **deployment: Any) -> None:
        self.deployment = GymDeployment(config, workdir=workdir, **deployment)
        self.state_path = self.deployment.workdir / "launcher.json"
        self._head: Any = None
        self._ray = False

    def start(self, *, head_server: bool = False) -> None:
        """Start Gym's head server and, when the config has servers of Gym's own (its environment
        servers join Ray) and no ``ray_head_node_address``, a local Ray cluster as ``ng_run``
        does (``head_server``: both need the config parsed by :func:`load_gym_config` in this
        process); then every server, and the supervisor."""
        dep = self.deployment
        if head_server:
            from nemo_gym.global_config import get_global_config_dict
            from nemo_gym.server_utils import HeadServer, initialize_ray

            if dep.other_servers and not dep.config.get("ray_head_node_address"):
                initialize_ray()  # sets ray_head_node_address in Gym's config, which the head serves
                self._ray = True
                dep.config["ray_head_node_address"] = get_global_config_dict()["ray_head_node_address"]
            self._head = HeadServer.run_webserver()
        dep.start_all()
        if self._head is not None:
            self._head[2].mark_ready()
        self.write_state()
        dep.supervise(on_restart=self._restarted)

    def _restarted(self, name: str) -> None:
        self.write_state()
        print(f"restarted {name} (paused): recover it with the run's Coordinator.recover()", flush=True)

    def state(self) -> dict[str, Any]:
        dep = self.deployment
        return {
            "servers": {
                n: {"url": dep.url(n), "role": s.role, "pid": dep.pid(n), "starts": dep.starts[n]}
                for n, s in dep.servers.items()
            },
            "gym_servers": {
                n: {"url": dep.url(n), "pid": dep.pid(n), "starts": dep.starts[n]} for n in dep.other_servers
            },
            "restarts": list(dep.restarts),
            "store": dep.store,
        }

    def write_state(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state(), sort_keys=True))
        tmp.replace(self.state_path)

    def stop(self) -> None:
        self.deployment.stop()
        if self._head is not None:
            self._head[0].should_exit = True
            self._head[1].join(10)
            self._head = None
        if self._ray:
            from nemo_gym.server_utils import maybe_ray_cluster_exit

            maybe_ray_cluster_exit()
            self._ray = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="Gym's Hydra overrides: +config_paths=[...] ++key=value")
    parser.add_argument("--workdir", default=None, help="logs and launcher.json (default: a new directory)")
    parser.add_argument(
        "--token-file", default=None, help="the control token (else ROLLOUT_CHECKPOINT_TOKEN)"
    )
    parser.add_argument("--store", default=None, help="the store (else the config's checkpoint_store)")
    parser.add_argument("--accept-unsafe-store", action="store_true")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rollout-checkpoint-gym-"))
    try:
        config = load_gym_config(args.overrides)
        launcher = GymLauncher(
            config,
            workdir=workdir,
            store=args.store,
            token_file=args.token_file,
            accept_unsafe_store=args.accept_unsafe_store,
        )
    except Exception as exc:  # a config mistake: one line, never a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1
    done = threading.Event()

    def on_signal(*_: object) -> None:
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        launcher.start(head_server=True)
        for sig in (signal.SIGTERM, signal.SIGINT):  # again: ray.init installs its own handlers
            signal.signal(sig, on_signal)
        print(f"serving {', '.join(launcher.deployment.servers)}; state in {launcher.state_path}", flush=True)
        done.wait()
    except Exception as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        launcher.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
