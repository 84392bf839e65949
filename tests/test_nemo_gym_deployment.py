"""The deployment API's config handling and the component root, without starting servers: which
servers a Gym config has, ports, store and token sources, names and roles, the one-line errors
of the generic ``app.py``, and that the component root ships in the wheel (package data)."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from rollout_checkpoint.integrations.nemo_gym import GymDeployment, component_root, gym_servers

REPO = Path(__file__).resolve().parents[1]
AGENT = "rollout_checkpoint.integrations.nemo_gym:CheckpointedGymnasiumAgent"


def _config(**resources: Any) -> dict[str, Any]:
    bj = {"entrypoint": "app.py", "checkpoint_class": "m:C", **resources}
    agent = {"entrypoint": "app.py", "checkpoint_class": AGENT}
    return {
        "observability_enabled": True,
        "bj": {"resources_servers": {"checkpointed": bj}},
        "bj_agent": {"responses_api_agents": {"checkpointed": agent}},
        "relay": {"environment_servers": {"legacy_agent": {"entrypoint": "app.py"}}},
        "not_a_server": {"x": 1},
    }


def test_a_gym_config_s_servers_roles_and_free_ports(tmp_path: Path) -> None:
    assert set(gym_servers(_config())) == {"bj", "bj_agent"}  # environment servers have no role here
    dep = GymDeployment(_config(), workdir=tmp_path, store="memory://d", run_other_servers=False)
    assert set(dep.servers) == {"bj", "bj_agent"} and dep.other_servers == {}
    assert dep.name("resources") == "bj" and dep.name("agent") == "bj_agent" and dep.name("bj") == "bj"
    assert dep.url("resources").startswith("http://127.0.0.1:")
    assert dep.config["head_server"]["host"] == "127.0.0.1" and dep.config["head_server"]["port"] > 0
    with pytest.raises(KeyError, match="no checkpointed server 'model'"):
        dep.name("model")
    env = dep.environment("agent", paused=True)
    assert env["NEMO_GYM_CONFIG_PATH"] == "bj_agent" and env["ROLLOUT_CHECKPOINT_START_PAUSED"] == "1"
    assert json.loads(env["NEMO_GYM_CONFIG_DICT"])["bj"]["resources_servers"]["checkpointed"]["port"] > 0
    assert env["ROLLOUT_CHECKPOINT_TOKEN"] == dep.token and len(dep.token) >= 16
    with_relay = GymDeployment(_config(), workdir=tmp_path, store="memory://d")
    assert list(with_relay.other_servers) == ["relay"] and with_relay.all_names() == [
        "bj",
        "bj_agent",
        "relay",
    ]


def test_the_store_comes_from_the_argument_the_config_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROLLOUT_CHECKPOINT_STORE", raising=False)
    with pytest.raises(ValueError, match="no checkpoint store"):
        GymDeployment(_config(), workdir=tmp_path)
    assert GymDeployment(_config(checkpoint_store="s3://b/x"), workdir=tmp_path).store == "s3://b/x"
    monkeypatch.setenv("ROLLOUT_CHECKPOINT_STORE", "memory://env")
    assert GymDeployment(_config(), workdir=tmp_path).store == "memory://env"
    assert GymDeployment(_config(), workdir=tmp_path, store="memory://arg").store == "memory://arg"
    config = _config(checkpoint_store="s3://b/x")
    config["bj_agent"]["responses_api_agents"]["checkpointed"]["checkpoint_store"] = "s3://b/y"
    with pytest.raises(ValueError, match="different checkpoint stores"):
        GymDeployment(config, workdir=tmp_path)


def test_a_token_file_stays_out_of_the_servers_environment(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s" * 32 + "\n")
    dep = GymDeployment(_config(), workdir=tmp_path, store="memory://d", token_file=token)
    env = dep.environment("resources")
    assert dep.token == "s" * 32 and "ROLLOUT_CHECKPOINT_TOKEN" not in env
    assert env["ROLLOUT_CHECKPOINT_TOKEN_FILE"] == str(token)


def test_a_config_without_a_checkpointed_server_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checkpoint_class"):
        GymDeployment(
            {"relay": {"environment_servers": {"legacy_agent": {"entrypoint": "app.py"}}}}, workdir=tmp_path
        )


def test_the_component_root_ships_in_the_wheel() -> None:
    root = component_root()
    files = [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for server_type in ("resources_servers", "responses_api_agents", "responses_api_models"):
        folder = root / server_type / "checkpointed"
        assert (folder / "app.py").is_file() and "rollout-checkpoint" in (
            folder / "requirements.txt"
        ).read_text()
        assert list((folder / "configs").glob("*.yaml"))
        assert (folder / "app.py").read_text() == (root / "resources_servers/checkpointed/app.py").read_text()
    package = REPO / "src" / "rollout_checkpoint"
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for path in files:  # every file of the root matches a package-data glob, so it lands in a wheel
        relative = str(path.relative_to(package))
        assert any(fnmatch.fnmatch(relative, g) for g in globs["rollout_checkpoint"]), relative


def _app(tmp_path: Path, server: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """The generic app.py with this server's config, as ng_run starts it (no server comes up:
    every case here is refused before it listens)."""
    config = {"head_server": {"host": "127.0.0.1", "port": 1}, "srv": server}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_CHECKPOINT_", "NEMO_GYM_"))}
    env.update({"NEMO_GYM_CONFIG_DICT": json.dumps(config), "NEMO_GYM_CONFIG_PATH": "srv"})
    env.update({"ROLLOUT_CHECKPOINT_TOKEN": "t" * 32, "ROLLOUT_CHECKPOINT_STORE": str(tmp_path / "store")})
    app = component_root() / "responses_api_agents" / "checkpointed" / "app.py"
    return subprocess.run(
        [sys.executable, str(app)], cwd=app.parent, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("inner", "says"),
    [
        ({}, "names no checkpoint_class"),
        ({"checkpoint_class": "nowhere"}, "is 'package.module:Name'"),
        ({"checkpoint_class": "json:Nothing"}, "cannot load a server class 'json:Nothing'"),
        ({"checkpoint_class": "json:JSONDecoder"}, "is not a checkpointed agent"),
        ({"checkpoint_class": AGENT, "checkpoint_token_file": "/nonexistent/token"},
         "cannot read the checkpoint token file"),
    ],
)  # fmt: skip
def test_the_generic_app_refuses_a_bad_server_config_with_one_line(
    tmp_path: Path, inner: dict[str, Any], says: str
) -> None:
    pytest.importorskip("nemo_gym")
    out = _app(tmp_path, {"responses_api_agents": {"checkpointed": {"entrypoint": "app.py", **inner}}})
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and says in lines[-1] and "Traceback" not in out.stderr, out.stderr


def test_the_launcher_refuses_a_config_without_a_store_with_one_line(tmp_path: Path) -> None:
    pytest.importorskip("nemo_gym")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_CHECKPOINT_", "NEMO_GYM_"))}
    out = subprocess.run(
        [sys.executable, "-m", "rollout_checkpoint.integrations.nemo_gym.launcher",
         "+config_paths=[resources_servers/checkpointed/configs/blackjack.yaml,"
         "responses_api_models/checkpointed/configs/scripted.yaml]", "--workdir", str(tmp_path / "w")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith("error: no checkpoint store: pass one (store=, --store)")
    )
    assert not (tmp_path / "w" / "launcher.json").exists()  # nothing started
