"""No orphan keeps a port: a SIGKILLed ``serve --workers N`` takes its workers with it, and a
SIGKILLed ``demo`` its servers; a replacement then binds the port. And the reference build
functions served under ``--token-file`` (the token reaches them through ``WorkerContext``),
started paused."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from _procs import group, kill_mentioning, processes_mentioning, worker_server
from conftest import _free_port, _wait_listening
from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX, RemoteParticipant, WorkerContext
from rollout_checkpoint.store import LocalStore

TOKEN = "tok-orphans-secret"
HERE = Path(__file__).parent
CLI = shutil.which("rollout-checkpoint", path=str(Path(sys.executable).parent)) or "rollout-checkpoint"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(autouse=True)
def no_process_left(tmp_path: Path) -> Iterator[None]:
    yield
    assert kill_mentioning(str(tmp_path)) == [], "processes left running"


def _until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_workers_die_with_their_sigkilled_main_process_and_free_the_port(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with worker_server(store, 2, token=TOKEN, env={"TMPDIR": str(tmp_path)}) as server:
        everyone = processes_mentioning(str(store))
        workers = [pid for pid in everyone if pid != server.proc.pid]
        assert len(workers) >= 2 and not _port_free(server.port)
        os.kill(server.proc.pid, signal.SIGKILL)  # the main process only, not its group
        server.proc.wait(10)
        _until(lambda: processes_mentioning(str(store)) == [], f"orphan workers left: {workers}")
        assert _port_free(server.port)


def test_a_sigkilled_demo_leaves_no_server_running(tmp_path: Path) -> None:
    args = [CLI, "demo", str(tmp_path / "store"), "--rollouts", "2", "--kill", "none", "--workers", "2"]
    with group(
        args,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as demo:

        def coordinator_started() -> bool:
            assert demo.poll() is None, "the demo ended before its coordinator started"
            return bool(
                set(processes_mentioning("coordinator_main")) & set(processes_mentioning(str(tmp_path)))
            )

        _until(coordinator_started, "the demo never started its coordinator", timeout=180)
        started = processes_mentioning(str(tmp_path))
        assert len(started) > 6  # servers, their workers, the coordinator
        os.kill(demo.pid, signal.SIGKILL)  # the demo only: its children must follow by themselves
        demo.wait(10)
        _until(lambda: processes_mentioning(str(tmp_path)) == [], "the demo's processes outlived it")


def test_reference_builds_take_the_token_from_the_token_file_and_start_paused(tmp_path: Path) -> None:
    assert TOKEN not in repr(WorkerContext("w0", LocalStore(tmp_path / "s"), 1, TOKEN))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_CHECKPOINT_TOKEN"}
    env["TMPDIR"] = str(tmp_path)
    store = str(tmp_path / "store")
    tokens_port, model_port = _free_port(), _free_port()
    common = ["--store", store, "--token-file", str(token_file)]
    with group([CLI, "serve", "tokens", *common, "--port", str(tokens_port)], env=env) as tokens:
        _wait_listening(tokens_port, tokens)
        env["ROLLOUT_CHECKPOINT_DEMO_TOKENS_URL"] = f"http://127.0.0.1:{tokens_port}"
        model_args = [CLI, "serve", "model", *common, "--port", str(model_port), "--start-paused"]
        with group(model_args, env=env, stderr=subprocess.PIPE) as model:
            _wait_listening(model_port, model)  # it built its model: no KeyError on the token
            url = f"http://127.0.0.1:{model_port}"
            status = httpx.get(
                f"{url}{CHECKPOINT_ROUTE_PREFIX}/status", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert status.status_code == 200 and status.json()["accepting"] is False  # paused
            with RemoteParticipant(url, token=TOKEN) as remote:
                remote.resume("open-it", time.time() + 30)  # an explicit resume opens admission
                assert remote.status().accepting is True
