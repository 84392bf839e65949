"""Start a checkpointed Gym server through Gym's own start-up, as one process.

``python -m rollout_checkpoint.integrations.nemo_gym.launch ROLE CLASS`` with Gym's usual
environment (``NEMO_GYM_CONFIG_DICT``: the resolved config; ``NEMO_GYM_CONFIG_PATH``: this
server's name in it) plus ``ROLLOUT_CHECKPOINT_TOKEN`` and ``ROLLOUT_CHECKPOINT_STORE``:

* ``resources module:Class [--spec module:NAME]`` - ``checkpointed(Class, spec=NAME).run_webserver()``
  (without ``--spec`` the built-in spec of the class, else restart-only); when the server's Gym
  config has ``num_workers`` > 1 (or ``ROLLOUT_CHECKPOINT_WORKERS`` says so) the SDK's worker
  group serves it instead of uvicorn's bare workers (one Gym server object per worker process,
  one merged participant, sessions routed to their worker);
* ``agent`` - :class:`~.agent.CheckpointedGymnasiumAgent`;
* ``model`` - the server type the Gym config names, as Gym picks its folder:
  ``responses_api_models: openai_model:`` starts :class:`~.openai_model.CheckpointedOpenAIModel`
  (Gym's ``openai_model`` in front of the backend its ``openai_base_url`` names),
  ``vllm_model`` starts :class:`~.vllm_model.CheckpointedVLLMModel`, any other type
  :class:`~.model.ScriptedResponsesModel`;
* ``openai-model`` - :class:`~.openai_model.CheckpointedOpenAIModel` whatever the type's name.
* ``simple-agent`` - :class:`~.simple_agent.CheckpointedSimpleAgent`.

A mistake (a class that is already checkpointed, an agent or model class given as
``resources``, a ``--spec`` that is not a :class:`~.specs.SessionSpec`) is one line on stderr
and exit status 2, before any server or worker starts.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from ...errors import CheckpointError
from ...server import ServedApp, WorkerContext, run_server
from .resources import _refuse_role, attach, checkpointed, is_checkpointed
from .specs import SessionSpec

__all__ = ["build_resources", "load_class", "load_spec", "main"]

WORKERS_ENV = "ROLLOUT_CHECKPOINT_WORKERS"
CLASS_ENV = "ROLLOUT_CHECKPOINT_GYM_CLASS"
SPEC_ENV = "ROLLOUT_CHECKPOINT_GYM_SPEC"
_ROLES = ("resources", "agent", "simple-agent", "model", "openai-model")
_USAGE = (
    "usage: launch resources module:Class [--spec module:NAME] | agent | simple-agent | model | openai-model"
)


class LaunchError(Exception):
    """A launcher argument that cannot work: reported as one line, exit status 2."""


def _load(ref: str, what: str) -> Any:
    module, _, name = ref.partition(":")
    if not module or not name:
        raise LaunchError(f"a {what} is 'package.module:NAME', got {ref!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise LaunchError(f"cannot import the {what} {ref!r}: {exc}") from None
    except AttributeError:
        raise LaunchError(f"{module} has no {name!r} (the {what} {ref!r})") from None


def load_class(ref: str) -> Any:
    """The class ``package.module:Class``."""
    return _load(ref, "server class")


def load_spec(ref: str) -> SessionSpec:
    """The :class:`SessionSpec` ``package.module:NAME``."""
    spec = _load(ref, "spec")
    if not isinstance(spec, SessionSpec):
        raise LaunchError(f"{ref} is a {type(spec).__name__}, not a SessionSpec")
    return spec


def _resources_class(ref: str) -> Any:
    cls = load_class(ref)
    if not isinstance(cls, type):
        raise LaunchError(f"{ref} is not a class")
    if is_checkpointed(cls):
        raise LaunchError(
            f"{ref} is already checkpointed: give the launcher the Gym class itself (it attaches once)"
        )
    try:
        _refuse_role(cls)
    except CheckpointError as exc:
        raise LaunchError(exc.message) from None
    return cls


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
    spec_ref = os.environ.get(SPEC_ENV)
    participant = attach(server, app, mount_control=False, spec=load_spec(spec_ref) if spec_ref else True)
    return ServedApp(app=app, participant=participant)


def _model_type() -> str | None:
    """The model server's type in the Gym config (``responses_api_models: <type>:``)."""
    from nemo_gym.global_config import get_global_config_dict

    conf = get_global_config_dict()[os.environ["NEMO_GYM_CONFIG_PATH"]]
    models = conf.get("responses_api_models") or {}
    return str(next(iter(models))) if models else None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(args)
    except LaunchError as exc:
        print(f"launch: {exc}", file=sys.stderr)
        return 2


def _main(args: list[str]) -> int:
    if not args or args[0] not in _ROLES:
        print(_USAGE, file=sys.stderr)
        return 2
    role = args[0]
    if role == "resources":
        rest = args[1:]
        spec: SessionSpec | None = None
        spec_ref = None
        if "--spec" in rest:
            at = rest.index("--spec")
            if at + 1 >= len(rest):
                raise LaunchError("--spec needs module:NAME")
            spec_ref = rest[at + 1]
            spec = load_spec(spec_ref)
            del rest[at : at + 2]
        if len(rest) != 1:
            print(_USAGE, file=sys.stderr)
            return 2
        cls = _resources_class(rest[0])
        from nemo_gym.global_config import get_global_config_dict

        conf = get_global_config_dict()[os.environ["NEMO_GYM_CONFIG_PATH"]]
        inner = next(iter(next(iter(conf.values())).values()))
        workers = int(os.environ.get(WORKERS_ENV) or inner.get("num_workers") or 1)
        if workers > 1:
            os.environ[CLASS_ENV] = rest[0]
            if spec_ref is not None:
                os.environ[SPEC_ENV] = spec_ref
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
        checkpointed(cls, spec=spec if spec is not None else True).run_webserver()
    elif role == "agent":
        from .agent import CheckpointedGymnasiumAgent

        CheckpointedGymnasiumAgent.run_webserver()
    elif role == "simple-agent":
        from .simple_agent import CheckpointedSimpleAgent

        CheckpointedSimpleAgent.run_webserver()
    elif role == "openai-model" or _model_type() == "openai_model":
        from .openai_model import CheckpointedOpenAIModel

        CheckpointedOpenAIModel.run_webserver()
    elif _model_type() == "vllm_model":
        from .vllm_model import CheckpointedVLLMModel

        CheckpointedVLLMModel.run_webserver()
    else:
        from .model import ScriptedResponsesModel

        ScriptedResponsesModel.run_webserver()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
