"""Start a checkpointed Gym server through Gym's own start-up, as one process.

``python -m rollout_checkpoint.integrations.nemo_gym.launch ROLE CLASS`` with Gym's usual
environment (``NEMO_GYM_CONFIG_DICT``: the resolved config; ``NEMO_GYM_CONFIG_PATH``: this
server's name in it) plus ``ROLLOUT_CHECKPOINT_TOKEN`` and ``ROLLOUT_CHECKPOINT_STORE``:

* ``resources module:Class`` - ``checkpointed(Class).run_webserver()``; when the server's Gym
  config has ``num_workers`` > 1 (or ``ROLLOUT_CHECKPOINT_WORKERS`` says so) the SDK's worker
  group serves it instead of uvicorn's bare workers (one Gym server object per worker process,
  one merged participant, sessions routed to their worker);
* ``agent`` - :class:`~.agent.CheckpointedGymnasiumAgent`;
* ``model`` - :class:`~.model.ScriptedResponsesModel`;
* ``openai-model`` - :class:`~.openai_model.CheckpointedOpenAIModel` (Gym's ``openai_model`` in
  front of the backend its config's ``openai_base_url`` names).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from ...server import ServedApp, WorkerContext, run_server
from .resources import attach, checkpointed

__all__ = ["build_resources", "load_class", "main"]

WORKERS_ENV = "ROLLOUT_CHECKPOINT_WORKERS"
CLASS_ENV = "ROLLOUT_CHECKPOINT_GYM_CLASS"


def load_class(spec: str) -> Any:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"a server class is 'package.module:Class', got {spec!r}")
    return getattr(importlib.import_module(module), name)


def _gym_server(cls: Any) -> Any:
    """Build a Gym server object as Gym's ``run_webserver()`` does (config from the environment)."""
    from nemo_gym.global_config import get_global_config_dict
    from nemo_gym.server_utils import ServerClient

    config = cls.load_config_from_global_config()
    client = ServerClient(
        head_server_config=ServerClient.load_head_server_config(), global_config_dict=get_global_config_dict()
    )
    return cls(config=config, server_client=client)


def build_resources(context: WorkerContext) -> ServedApp:
    """The worker group's build function: one Gym resources server per worker process."""
    server = _gym_server(load_class(os.environ[CLASS_ENV]))
    app = server.setup_webserver()
    server.setup_liveness(app)
    participant = attach(server, app, mount_control=False)
    return ServedApp(app=app, participant=participant)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("resources", "agent", "model", "openai-model"):
        print("usage: launch resources module:Class | agent | model | openai-model", file=sys.stderr)
        return 2
    role = args[0]
    if role == "resources":
        if len(args) < 2:
            print("usage: launch resources module:Class", file=sys.stderr)
            return 2
        from nemo_gym.global_config import get_global_config_dict

        conf = get_global_config_dict()[os.environ["NEMO_GYM_CONFIG_PATH"]]
        inner = next(iter(next(iter(conf.values())).values()))
        workers = int(os.environ.get(WORKERS_ENV) or inner.get("num_workers") or 1)
        if workers > 1:
            os.environ[CLASS_ENV] = args[1]
            run_server(
                "rollout_checkpoint.integrations.nemo_gym.launch:build_resources",
                store=os.environ["ROLLOUT_CHECKPOINT_STORE"],
                host=str(inner["host"]),
                port=int(inner["port"]),
                token=os.environ["ROLLOUT_CHECKPOINT_TOKEN"],
                workers=workers,
                accept_unsafe_store=os.environ.get("ROLLOUT_CHECKPOINT_ACCEPT_UNSAFE_STORE") == "1",
            )
            return 0
        checkpointed(load_class(args[1])).run_webserver()
    elif role == "agent":
        from .agent import CheckpointedGymnasiumAgent

        CheckpointedGymnasiumAgent.run_webserver()
    elif role == "openai-model":
        from .openai_model import CheckpointedOpenAIModel

        CheckpointedOpenAIModel.run_webserver()
    else:
        from .model import ScriptedResponsesModel

        ScriptedResponsesModel.run_webserver()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
