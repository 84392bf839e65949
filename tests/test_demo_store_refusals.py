"""The multi-process demo (``rollout-checkpoint demo STORE``) refuses a store it could not
publish to with one clear line and a non-zero exit, before any server process starts (so none
is left behind): an unwritable directory, an unreachable S3 endpoint, a backend whose
conditional puts are emulated or an S3 endpoint that ignores the preconditions (unless
``--accept-unsafe-store``, which the reference servers then take too)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from _procs import kill_mentioning
from test_store_errors_cli import _read_only
from test_store_s3 import ProxyState, _make_handler

CLI = shutil.which("rollout-checkpoint", path=str(Path(sys.executable).parent)) or "rollout-checkpoint"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def no_process_left(tmp_path: Path) -> Iterator[None]:
    yield
    left = kill_mentioning(str(tmp_path))  # every child names tmp_path (its TMPDIR)
    assert left == [], f"processes left running: {left}"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _demo(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "TMPDIR": str(tmp_path), **env}
    environ.pop("ROLLOUT_CHECKPOINT_TOKEN", None)
    return subprocess.run(
        [CLI, "demo", *args, "--rollouts", "2"], capture_output=True, text=True, timeout=90, env=environ
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


def _json_error(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    error: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    return error


def test_an_unwritable_directory_is_one_line_and_no_process(tmp_path: Path) -> None:
    target = tmp_path / "ro"
    target.mkdir()
    with _read_only(target):
        text = _demo(tmp_path, str(target))
        assert text.returncode == 1
        line = _one_line(text)
        assert "permission_denied" in line and str(target) in line
        as_json = _demo(tmp_path, str(target), "--json")
        assert as_json.returncode == 1 and _json_error(as_json)["code"] == "permission_denied"
    assert list(target.iterdir()) == []  # nothing was written, not even a probe


@pytest.mark.s3
def test_an_unreachable_s3_endpoint_is_one_line_and_no_process(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    env = {
        "ROLLOUT_CHECKPOINT_STORE_RETRY_ATTEMPTS": "2",
        "ROLLOUT_CHECKPOINT_STORE_RETRY_MAX_WAIT": "0.05",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    text = _demo(tmp_path, "s3://bucket/demo", "--endpoint-url", endpoint, **env)
    assert text.returncode == 1
    assert "store_unreachable" in _one_line(text)
    as_json = _demo(tmp_path, "s3://bucket/demo", "--endpoint-url", endpoint, "--json", **env)
    assert as_json.returncode == 1 and _json_error(as_json)["code"] == "store_unreachable"


def test_an_emulated_conditional_put_backend_needs_accept_unsafe_store(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    url = f"dir::file://{tmp_path / 'store'}"
    text = _demo(tmp_path, url)
    assert text.returncode == 1
    line = _one_line(text)
    assert "conditional_writes_unsupported" in line and "--accept-unsafe-store" in line
    as_json = _demo(tmp_path, url, "--json")
    assert as_json.returncode == 1 and _json_error(as_json)["code"] == "conditional_writes_unsupported"
    with contextlib.suppress(FileNotFoundError):
        assert list((tmp_path / "store").rglob("*.json")) == []  # nothing was published


@pytest.mark.s3
def test_an_s3_endpoint_without_atomic_conditional_puts_needs_accept_unsafe_store(
    tmp_path: Path, s3_bucket: str, s3_endpoint: str
) -> None:
    # moto behind a proxy that drops If-None-Match / If-Match: the probe refuses it
    state = ProxyState(upstream=s3_endpoint, strip_headers=frozenset({"if-none-match", "if-match"}))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        result = _demo(tmp_path, f"s3://{s3_bucket}/demo", "--endpoint-url", endpoint)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 1
    line = _one_line(result)
    assert "conditional_writes_unsupported" in line and "--accept-unsafe-store" in line
