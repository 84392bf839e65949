"""Gym's own launcher and collector over the SDK's component root: ``ng_run --search-dir <root>``
serves the checkpointed blackjack, agent and scripted model from the shipped configs (per-server
environments pre-built, ``skip_venv_if_present: true``: nothing is installed), the token comes
from a file and the store from the Gym config, ``ng_collect_rollouts`` collects every row, a
checkpoint is published over the servers' control routes, and the whole process tree (Ray
included) is gone at the end."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from _gym import require_gym
from _procs import kill_mentioning

require_gym()

from rollout_checkpoint import Coordinator, LiveExecutionRegistry, load_checkpoint  # noqa: E402
from rollout_checkpoint.integrations.nemo_gym import (  # noqa: E402
    component_root,
    free_port,
    layered_server_venvs,
    reference_run,
)
from rollout_checkpoint.server import RemoteParticipant  # noqa: E402

pytestmark = pytest.mark.slow
_GYM = "import sys; from nemo_gym.cli.legacy import main; sys.argv[0] = sys.argv[1]; del sys.argv[1]; main()"
_ROWS = 4


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Ray's sockets live under RAY_TMPDIR: a short path keeps them under the 107-byte limit."""
    path = Path(tempfile.mkdtemp(prefix="rc-ng-", dir="/tmp"))
    yield path
    left = kill_mentioning(str(path))  # every process of the tree has it in its environment
    shutil.rmtree(path, ignore_errors=True)
    assert left == [], f"processes left running: {left}"


def _rows(path: Path) -> Path:
    agent_ref = {"type": "responses_api_agents", "name": "blackjack_checkpointed_agent"}
    path.write_text(
        "".join(
            json.dumps({"responses_create_params": {"input": "You are playing blackjack."}, "seed": 100 + i,
                        "agent_ref": agent_ref}) + "\n"
            for i in range(_ROWS)
        )
    )  # fmt: skip
    return path


def _collect(short_dir: Path, env: dict[str, str], head_port: int) -> list[dict[str, object]]:
    """``ng_collect_rollouts`` over the rows; each row's reward equals the uninterrupted run's."""
    output = short_dir / "rollouts.jsonl"
    collect = subprocess.run(
        _gym("ng_collect_rollouts", "+agent_name=blackjack_checkpointed_agent",
             f"+input_jsonl_fpath={_rows(short_dir / 'input.jsonl')}", f"+output_jsonl_fpath={output}",
             "++head_server.host=127.0.0.1", f"++head_server.port={head_port}"),
        cwd=short_dir, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert collect.returncode == 0, collect.stderr[-3000:]
    got = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["_ng_task_index"] for r in got) == list(range(_ROWS))
    reference = reference_run(0, {str(i): 100 + i for i in range(_ROWS)}, 6)
    for row in got:  # Gym's blackjack seeded by the row, the scripted policy: as uninterrupted
        assert row["reward"] == reference[str(row["_ng_task_index"])]["reward"], row
        assert row["rollout_checkpoint"]["steps"], row  # the checkpointed agent played it
    return got


def _env(short_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_CHECKPOINT_", "NEMO_GYM_"))}
    env.update(
        {"RAY_TMPDIR": str(short_dir / "ray"), "TMPDIR": str(short_dir), "NO_PROXY": "127.0.0.1,localhost"}
    )
    return env


_SEEDED = (
    "++blackjack_checkpointed.resources_servers.checkpointed.checkpoint_class="
    "rollout_checkpoint.integrations.nemo_gym.seeded:SeededBlackjackEnv"
)


def _gym(command: str, *args: str) -> list[str]:
    return [sys.executable, "-c", _GYM, command, *args]


def _wait_for(proc: subprocess.Popen[bytes], log: Path, text: str, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"ng_run exited ({proc.returncode}): {log.read_text()[-3000:]}"
        assert time.monotonic() < end, f"ng_run not ready in {timeout_s:.0f} s: {log.read_text()[-3000:]}"
        time.sleep(0.2)


def test_ng_run_serves_the_component_root_checkpointed_and_ng_collect_rollouts_collects_every_row(
    short_dir: Path,
) -> None:
    venvs = layered_server_venvs(short_dir / "venvs")
    assert all((v / "bin" / "python").exists() for v in venvs)
    token_file = short_dir / "token"
    token_file.write_text(secrets.token_hex(16))
    store = str(short_dir / "store")
    head_port = free_port()
    extra = short_dir / "extra.yaml"
    extra.write_text(
        json.dumps(  # JSON is YAML
            {
                "head_server": {"host": "127.0.0.1", "port": head_port},
                "skip_venv_if_present": True,
                "uv_venv_dir": str(short_dir / "venvs"),
                "observability_enabled": True,
                "model_call_capture_dir": str(short_dir / "capture"),  # must be absolute
            }
        )
    )
    configs = (
        "resources_servers/checkpointed/configs/blackjack.yaml,"
        f"responses_api_models/checkpointed/configs/scripted.yaml,{extra}"
    )
    servers = {
        "blackjack_checkpointed": "resources_servers",
        "blackjack_checkpointed_agent": "responses_api_agents",
        "policy_model": "responses_api_models",
    }
    overrides = [f"++{name}.{kind}.checkpointed.checkpoint_store={store}" for name, kind in servers.items()]
    overrides.append(_SEEDED)
    env = _env(short_dir)
    env["ROLLOUT_CHECKPOINT_TOKEN_FILE"] = str(token_file)  # the token never enters the environment
    log = short_dir / "ng_run.log"
    with open(log, "wb") as out:
        run = subprocess.Popen(
            _gym("ng_run", "--search-dir", str(component_root()), f"+config_paths=[{configs}]", *overrides),
            cwd=short_dir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_for(run, log, "servers ready", timeout_s=240)
        text = log.read_text()
        assert "uv pip install" not in text and "uv: command not found" not in text  # nothing installed
        _collect(short_dir, env, head_port)
        instances = httpx.get(
            f"http://127.0.0.1:{head_port}/server_instances", timeout=10, trust_env=False
        ).json()
        urls = {i["process_name"]: i["url"] for i in instances if i["process_name"] in servers}
        assert set(urls) == set(servers)
        participants = [RemoteParticipant(url, token=token_file.read_text()) for url in urls.values()]
        outcome = Coordinator(store, participants, LiveExecutionRegistry()).checkpoint(deadline_s=60)
        assert load_checkpoint(store).checkpoint_id == outcome.checkpoint_id  # the store from the config
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGINT)  # ng_run shuts its servers and Ray down
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait(10)


def test_the_sdk_launcher_serves_the_same_config_for_ng_collect_rollouts_and_restarts_only_a_killed_server(
    short_dir: Path,
) -> None:
    token = short_dir / "token"
    token.write_text(secrets.token_hex(16))
    store, workdir, head_port = str(short_dir / "store"), short_dir / "launcher", free_port()
    args = [sys.executable, "-m", "rollout_checkpoint.integrations.nemo_gym.launcher",
            "+config_paths=[resources_servers/checkpointed/configs/blackjack.yaml,"
            "responses_api_models/checkpointed/configs/scripted.yaml]",
            f"++head_server.port={head_port}", "++head_server.host=127.0.0.1", _SEEDED,
            "++observability_enabled=true", f"++model_call_capture_dir={short_dir / 'capture'}",
            "--workdir", str(workdir), "--store", store, "--token-file", str(token)]  # fmt: skip
    env = _env(short_dir)
    log = short_dir / "launcher.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(  # cwd: Hydra writes its outputs/ there
            args, cwd=short_dir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    state_path = workdir / "launcher.json"
    try:
        _wait_for(proc, log, "serving ", timeout_s=240)
        state = json.loads(state_path.read_text())
        servers = state["servers"]
        assert {s["role"] for s in servers.values()} == {"resources", "agent", "model"}
        assert list(state["gym_servers"]) == ["blackjack_checkpointed_environment_server"]  # Gym's relay
        _collect(short_dir, env, head_port)  # Gym's collector through the launcher's head server
        remotes = {n: RemoteParticipant(s["url"], token=token.read_text()) for n, s in servers.items()}
        coordinator = Coordinator(store, list(remotes.values()), LiveExecutionRegistry())
        coordinator.checkpoint(deadline_s=60)
        os.kill(servers["blackjack_checkpointed"]["pid"], signal.SIGKILL)
        end = time.monotonic() + 120
        while json.loads(state_path.read_text())["restarts"] != ["blackjack_checkpointed"]:
            assert time.monotonic() < end and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        state = json.loads(state_path.read_text())
        restarted = [n for n, s in {**state["servers"], **state["gym_servers"]}.items() if s["starts"] > 1]
        assert restarted == ["blackjack_checkpointed"]  # only the dead one
        assert remotes["blackjack_checkpointed"].status().accepting is False  # paused until recovered
        coordinator.recover(deadline_s=60)
        assert all(r.status().accepting for r in remotes.values())
    finally:
        proc.send_signal(signal.SIGTERM)  # the launcher stops its servers and Ray
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
