"""The SDK's Gym component root: checkpointed Gym servers that ``ng_run`` starts from a config.

The root (:func:`component_root`, shipped in the package) holds one entrypoint folder per
server type, each with the same generic ``app.py``, a ``requirements.txt`` naming the SDK and
example configs::

    resources_servers/checkpointed/     responses_api_agents/checkpointed/
    responses_api_models/checkpointed/

Add it with ``ng_run --search-dir $(python -m rollout_checkpoint.integrations.nemo_gym.component
--root)`` (or ``NEMO_GYM_EXTRA_ROOTS``). ``app.py`` calls :func:`main`, which reads its own
server config (``NEMO_GYM_CONFIG_DICT`` / ``NEMO_GYM_CONFIG_PATH``, as every Gym server does):

* ``checkpoint_class: module:Class`` - a resources server is any Gym resources server class,
  served as :func:`~.resources.checkpointed` (``checkpoint_spec: module:NAME`` picks its
  :class:`~.specs.SessionSpec`; ``num_workers`` > 1 runs the SDK's worker group); an agent or a
  model server is a class that is already checkpointed (``CheckpointedGymnasiumAgent``,
  ``ScriptedResponsesModel``, ...), served by its own ``run_webserver()``;
* ``checkpoint_store`` - the store URL (else ``ROLLOUT_CHECKPOINT_STORE``);
* ``checkpoint_token_file`` - a file holding the control token (else
  ``ROLLOUT_CHECKPOINT_TOKEN_FILE``, else ``ROLLOUT_CHECKPOINT_TOKEN``);
* ``checkpoint_accept_unsafe_store`` - ``true`` to write where conditional puts are emulated.

``ROLLOUT_CHECKPOINT_START_PAUSED=1`` starts it paused (a replacement after a crash).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import InvalidValueError
from ...server import ServedApp, WorkerContext, run_server
from .resources import attach, checkpointed

__all__ = [
    "FOLDER",
    "SERVER_TYPES",
    "ServerSettings",
    "component_root",
    "layered_server_venvs",
    "load_object",
    "main",
    "server_settings",
]

FOLDER = "checkpointed"
_ROLE_OF_TYPE = {
    "resources_servers": "resources",
    "responses_api_agents": "agent",
    "responses_api_models": "model",
}


def component_root() -> Path:
    """The folder to add to Gym's component search roots (``--search-dir`` /
    ``NEMO_GYM_EXTRA_ROOTS``): it holds ``<server type>/checkpointed/``."""
    return Path(str(resources.files(__package__) / "gym_root"))


SERVER_TYPES = tuple(_ROLE_OF_TYPE)


def layered_server_venvs(
    uv_venv_dir: str | Path, config: Mapping[str, Any] | None = None, python: str | None = None
) -> list[Path]:
    """Pre-built per-server environments for ``ng_run`` that reuse the current one.

    ``ng_run`` runs each server from ``<uv_venv_dir>/<server type>/<folder>/.venv`` and, with
    ``skip_venv_if_present: true``, installs nothing when that environment exists. This makes one
    for every server folder of the Gym ``config`` (default: the component root's folders and
    Gym's ``environment_servers/legacy_agent``): a virtual environment (no pip) whose
    ``site-packages`` adds this environment's (the SDK, Gym and their dependencies), so
    ``ng_run`` starts in seconds and offline. Returns the environments' folders."""
    import site
    import subprocess

    if config is None:
        folders = [(t, FOLDER) for t in SERVER_TYPES] + [("environment_servers", "legacy_agent")]
    else:
        folders = []
        for value in config.values():
            if isinstance(value, Mapping) and len(value) == 1:
                server_type, inner = next(iter(value.items()))
                if isinstance(inner, Mapping) and len(inner) == 1:
                    folder, conf = next(iter(inner.items()))
                    if isinstance(conf, Mapping) and "entrypoint" in conf:
                        folders.append((str(server_type), str(folder)))
    exe = python or sys.executable
    parents = [p for p in site.getsitepackages() if Path(p).is_dir()]
    made = []
    for server_type, folder in dict.fromkeys(folders):
        target = Path(uv_venv_dir) / server_type / folder / ".venv"
        if not (target / "bin" / "python").exists():
            subprocess.run([exe, "-m", "venv", "--without-pip", str(target)], check=True)
        lib = target / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in parents)
        (lib / "_rollout_checkpoint_parent.pth").write_text(lines)
        made.append(target)
    return made


def load_object(spec: str, what: str = "a server class") -> Any:
    """``package.module:Name`` imported; a clear error for anything else."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise InvalidValueError(f"{what} is 'package.module:Name', got {spec!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise InvalidValueError(f"cannot load {what} {spec!r}: {exc}") from exc


class ServerSettings:
    """This process's Gym server: its name, type, role and own config (a plain dict)."""

    def __init__(self, name: str, server_type: str, config: dict[str, Any]) -> None:
        self.name = name
        self.server_type = server_type
        self.role = _ROLE_OF_TYPE.get(server_type, "")
        self.config = config
        if not self.role:
            raise InvalidValueError(
                f"server {name!r} has type {server_type!r}; the component root serves "
                f"{', '.join(_ROLE_OF_TYPE)}"
            )

    @property
    def class_spec(self) -> str:
        spec = self.config.get("checkpoint_class")
        if not spec:
            raise InvalidValueError(
                f"server {self.name!r} names no checkpoint_class: set it to the Gym server class "
                "to checkpoint, as module:Class"
            )
        return str(spec)

    @property
    def workers(self) -> int:
        return int(self.config.get("num_workers") or 1)


def server_settings() -> ServerSettings:
    """Read this server's settings as Gym's ``run_webserver()`` does (from the environment)."""
    from nemo_gym.global_config import get_global_config_dict
    from omegaconf import DictConfig, OmegaConf

    name = os.environ.get("NEMO_GYM_CONFIG_PATH", "")
    instance = get_global_config_dict().get(name)
    if not name or not isinstance(instance, DictConfig) or len(instance) != 1:
        raise InvalidValueError(f"NEMO_GYM_CONFIG_PATH names no server instance of the Gym config: {name!r}")
    server_type = str(next(iter(instance)))
    inner = instance[server_type]
    config = OmegaConf.to_container(next(iter(inner.values())), resolve=True)
    if not isinstance(config, dict):
        raise InvalidValueError(f"server {name!r} has no config mapping")
    return ServerSettings(name, server_type, {str(k): v for k, v in config.items()})


def _apply_settings(settings: ServerSettings) -> None:
    """Bring the store, the token and the unsafe-store choice into the environment the SDK's
    server code reads (the config wins over the environment)."""
    conf = settings.config
    if conf.get("checkpoint_store"):
        os.environ["ROLLOUT_CHECKPOINT_STORE"] = str(conf["checkpoint_store"])
    token_file = conf.get("checkpoint_token_file") or os.environ.get("ROLLOUT_CHECKPOINT_TOKEN_FILE")
    if token_file:
        try:
            token = Path(str(token_file)).read_text().strip()
        except OSError as exc:
            raise InvalidValueError(f"cannot read the checkpoint token file {token_file}: {exc}") from exc
        if not token:
            raise InvalidValueError(f"the checkpoint token file {token_file} is empty")
        os.environ["ROLLOUT_CHECKPOINT_TOKEN"] = token
    if conf.get("checkpoint_accept_unsafe_store") in (True, "true", "1", 1):
        os.environ["ROLLOUT_CHECKPOINT_ACCEPT_UNSAFE_STORE"] = "1"
    missing = [v for v in ("ROLLOUT_CHECKPOINT_STORE", "ROLLOUT_CHECKPOINT_TOKEN") if not os.environ.get(v)]
    if missing:
        raise InvalidValueError(
            f"server {settings.name!r} has no {' or '.join(missing)}: set checkpoint_store / "
            "checkpoint_token_file in its config, or the environment variables"
        )


def _resources_class(settings: ServerSettings) -> Any:
    cls = load_object(settings.class_spec)
    spec_name = settings.config.get("checkpoint_spec")
    spec = load_object(str(spec_name), "a session spec") if spec_name else True
    return cls, spec


def build_resources(context: WorkerContext) -> ServedApp:
    """The worker group's build function: one Gym resources server per worker process."""
    from nemo_gym.global_config import get_global_config_dict
    from nemo_gym.server_utils import ServerClient

    cls, spec = _resources_class(server_settings())
    config = cls.load_config_from_global_config()
    client = ServerClient(
        head_server_config=ServerClient.load_head_server_config(), global_config_dict=get_global_config_dict()
    )
    server = cls(config=config, server_client=client)
    app = server.setup_webserver()
    server.setup_liveness(app)
    participant = attach(server, app, mount_control=False, spec=spec)
    return ServedApp(app=app, participant=participant)


def serve(settings: ServerSettings) -> None:
    """Serve this Gym server checkpointed until it is stopped."""
    _apply_settings(settings)
    if settings.role == "resources":
        cls, spec = _resources_class(settings)
        if settings.workers > 1:
            run_server(
                f"{__name__}:build_resources",
                store=os.environ["ROLLOUT_CHECKPOINT_STORE"],
                host=str(settings.config["host"]),
                port=int(settings.config["port"]),
                token=os.environ["ROLLOUT_CHECKPOINT_TOKEN"],
                workers=settings.workers,
                accept_unsafe_store=os.environ.get("ROLLOUT_CHECKPOINT_ACCEPT_UNSAFE_STORE") == "1",
            )
            return
        checkpointed(cls, spec=spec).run_webserver()
        return
    cls = load_object(settings.class_spec)
    if not _is_checkpointed(cls):
        raise InvalidValueError(
            f"server {settings.name!r}: checkpoint_class {settings.class_spec!r} is not a checkpointed "
            f"{settings.role} (use CheckpointedGymnasiumAgent, ScriptedResponsesModel or a subclass)"
        )
    cls.run_webserver()


def _is_checkpointed(cls: Any) -> bool:
    """An agent or model class of this integration (or a subclass of one)."""
    return isinstance(cls, type) and any(
        c.__module__.startswith("rollout_checkpoint.integrations.nemo_gym.") for c in cls.__mro__
    )


def main(argv: list[str] | None = None) -> int:
    """``app.py``'s body; ``--root`` prints the component root instead."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--root"]:
        print(component_root())
        return 0
    try:
        serve(server_settings())
    except InvalidValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
