"""``rollout-checkpoint serve``: real server processes on 127.0.0.1, the token never on a
command line, one clear line for a user's mistake."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from _procs import group, kill_group, start_group
from conftest import _free_port, _wait_listening
from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX, RemoteTokenStore
from rollout_checkpoint.tokens import ObjectStoreTokenStore, TokenEntry

TOKEN = "tok-cli-serve-secret"
HERE = Path(__file__).parent
CLI = shutil.which("rollout-checkpoint", path=str(Path(sys.executable).parent)) or "rollout-checkpoint"


def _serve(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    proc = start_group(
        [CLI, "serve", *args, "--port", str(port)],
        env={**os.environ, "PYTHONPATH": str(HERE), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_listening(port, proc)
    except BaseException:
        kill_group(proc)
        raise
    return proc, port


def _stop(proc: subprocess.Popen[bytes]) -> str:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    kill_group(proc)  # any worker the main process left behind
    return err.decode()


def test_help_and_errors_never_show_the_token(tmp_path: Path) -> None:
    env = {**os.environ, "ROLLOUT_CHECKPOINT_TOKEN": TOKEN}
    shown = subprocess.run([CLI, "serve", "--help"], env=env, capture_output=True, text=True, check=True)
    assert "--token-file" in shown.stdout and TOKEN not in shown.stdout
    assert "--token " not in shown.stdout  # no option takes the token itself
    refused = subprocess.run(
        [CLI, "serve", "tokens", "--store", str(tmp_path), "--port", "1", "--token", TOKEN],
        env=env,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and TOKEN not in refused.stdout + refused.stderr
    missing = subprocess.run(
        [CLI, "serve", "tokens", "--store", str(tmp_path), "--port", "1"],
        env={k: v for k, v in os.environ.items() if k != "ROLLOUT_CHECKPOINT_TOKEN"},
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        "error (token_missing): no control token: set ROLLOUT_CHECKPOINT_TOKEN or pass --token-file"
    ]
    unknown = subprocess.run(
        [CLI, "serve", "nonsense", "--store", str(tmp_path), "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert unknown.returncode == 1 and len(unknown.stderr.strip().splitlines()) == 1
    assert "unknown server kind 'nonsense'" in unknown.stderr and "Traceback" not in unknown.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_serve_tokens_from_a_token_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    store = tmp_path / "store"
    proc, port = _serve("tokens", "--store", str(store), "--token-file", str(token_file), "--workers", "2")
    try:
        remote = RemoteTokenStore(f"http://127.0.0.1:{port}", token=TOKEN)
        entries = [
            TokenEntry(
                rollout_id=f"r{i}",
                attempt=0,
                call_id="c1",
                prompt_token_ids=[1],
                generation_token_ids=[2, 3],
                generation_log_probs=[-0.1, -0.2],
                mask=[1, 1],
            )
            for i in range(8)
        ]
        for entry in entries:  # new connections: any of the 2 workers may take each put
            remote.put(entry)
        receipt = remote.snapshot("ck-1")
        assert receipt.entries == 8  # a snapshot sees what every worker stored
        assert ObjectStoreTokenStore(str(store)).get("r7/a0/c1").generation_token_ids == [2, 3]
        remote.close()
    finally:
        err = _stop(proc)
    assert TOKEN not in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_serve_a_build_function_with_two_workers(tmp_path: Path) -> None:
    proc, port = _serve(
        "_worker_build:build",
        "--store",
        str(tmp_path / "store"),
        "--workers",
        "2",
        "--worker-healthcheck-timeout",
        "30",
        env={"ROLLOUT_CHECKPOINT_TOKEN": TOKEN},
    )
    try:
        url = f"http://127.0.0.1:{port}{CHECKPOINT_ROUTE_PREFIX}/status"
        end = time.monotonic() + 60
        status: dict[str, object] = {}
        while time.monotonic() < end and status.get("workers") != 2:
            response = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"})
            status = response.json() if response.status_code == 200 else {}
            time.sleep(0.1)
        assert status["workers"] == 2 and status["capabilities"]["topology"] == "coordinated_workers"  # type: ignore[index]
        assert httpx.get(url).status_code == 401
    finally:
        err = _stop(proc)
    assert TOKEN not in err


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize(
    ("build", "expected"),
    [
        ("_bad_build:returns_a_dict", "must return rollout_checkpoint.server.ServedApp"),
        ("_bad_build:NOT_A_FUNCTION", "not a function"),
        ("_bad_build:raises", "failed: RuntimeError: the model weights are not where the config says"),
    ],
)
@pytest.mark.timeout(180)
def test_a_build_of_the_wrong_type_is_one_line(
    tmp_path: Path, build: str, expected: str, workers: str
) -> None:
    """Issue 18, item 10: with worker processes too, the main process says it in one line and
    stops (the workers used to crash and be restarted in a loop, each printing a traceback)."""
    args = [
        CLI,
        "serve",
        build,
        "--store",
        str(tmp_path / "s"),
        "--port",
        str(_free_port()),
        "--workers",
        workers,
    ]
    with group(
        args,
        env={
            **os.environ,
            "PYTHONPATH": str(HERE),
            "ROLLOUT_CHECKPOINT_TOKEN": TOKEN,
            "TMPDIR": str(tmp_path),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        out, err = proc.communicate(timeout=150)
    result = subprocess.CompletedProcess(args, proc.returncode, out, err)
    assert result.returncode == 1, result
    assert not list(tmp_path.glob("rc-workers-*"))  # its scratch folder went with it
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
