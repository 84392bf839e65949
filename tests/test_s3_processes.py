"""Real server processes on the moto S3 server (over HTTP on 127.0.0.1): the multi-process demo
with a SIGKILLed agent server, and ``--accept-unsafe-store`` carried to a server's worker
processes. An endpoint whose conditional puts are not atomic is moto behind a proxy that strips
If-None-Match / If-Match (the endpoint probe then refuses it): a server started on it without
the flag refuses in one line with the stable code and never listens; with the flag its workers
skip the probe and a checkpoint taken through it is published."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from _procs import kill_group, kill_mentioning, start_group
from conftest import _free_port
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX, RemoteParticipant
from rollout_checkpoint.store import open_store
from test_store_s3 import ProxyState, _make_handler

CLI = shutil.which("rollout-checkpoint", path=str(Path(sys.executable).parent)) or "rollout-checkpoint"
TOKEN = "tok-s3-processes-secret"

pytestmark = [pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(autouse=True)
def no_process_left(tmp_path: Path) -> Iterator[None]:
    yield
    left = kill_mentioning(str(tmp_path))  # every child names tmp_path (its TMPDIR)
    assert left == [], f"processes left running: {left}"


@pytest.fixture()
def unsafe_endpoint(s3_endpoint: str) -> Iterator[str]:
    """moto behind a proxy that drops the conditional-put headers: puts are not atomic there."""
    state = ProxyState(upstream=s3_endpoint, strip_headers=frozenset({"if-none-match", "if-match"}))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_CHECKPOINT_TOKEN"}
    env.update({"TMPDIR": str(tmp_path), "AWS_ENDPOINT_URL": endpoint})
    return env


def test_the_multi_process_demo_on_s3_continues_after_the_agent_server_is_killed(
    tmp_path: Path, s3_bucket: str, s3_endpoint: str
) -> None:
    url = f"s3://{s3_bucket}/demo"
    out = subprocess.run(
        [CLI, "demo", url, "--kill", "agent", "--json"],
        capture_output=True,
        text=True,
        timeout=400,
        env=_env(tmp_path, s3_endpoint),
    )
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    # why it failed first (a long summary is cut off in the assertion message)
    assert out.returncode == 0 and summary["ok"], (summary.get("failures"), summary, out.stderr[-3000:])
    assert summary["failures"] == [] and summary["mode"] == "processes" and summary["url"] == url
    assert summary["killed"] == ["agent"] and summary["restarted"] == [["agent"]]
    assert summary["full_restarts"] == 0 and summary["continued"] > 0
    assert summary["completed"] == summary["rollouts"] == 6 and summary["lost_results"] == 0
    assert summary["matches_uninterrupted"] and summary["generation_cuts_continued"] > 0, summary[
        "not_demonstrated"
    ]
    assert summary["demonstrated"] == dict.fromkeys(
        ("crash", "rollouts_continued", "generation_cuts_continued"), True
    )
    published = list_published(open_store(url, endpoint_url=s3_endpoint))
    assert summary["checkpoint_id"] == published[0].checkpoint_id


def _serve(tmp_path: Path, endpoint: str, url: str, *flags: str) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    env = {**_env(tmp_path, endpoint), "ROLLOUT_CHECKPOINT_TOKEN": TOKEN}
    proc = start_group(
        [CLI, "serve", "resources", "--store", url, "--port", str(port), "--workers", "2", *flags],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return proc, port


def _stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    kill_group(proc)  # any worker the main process left behind


def test_a_server_refuses_a_non_atomic_s3_endpoint_unless_the_risk_is_accepted(
    tmp_path: Path, s3_bucket: str, unsafe_endpoint: str
) -> None:
    url = f"s3://{s3_bucket}/unsafe"
    refused, _ = _serve(tmp_path, unsafe_endpoint, url)
    out, err = refused.communicate(timeout=120)
    lines = [line for line in (out + err).decode().splitlines() if line.strip()]
    assert refused.returncode == 1 and len(lines) == 1, lines
    assert "conditional_writes_unsupported" in lines[0] and "--accept-unsafe-store" in lines[0]
    assert "Traceback" not in lines[0] and TOKEN not in lines[0]

    proc, port = _serve(tmp_path, unsafe_endpoint, url, "--accept-unsafe-store")
    try:
        remote = RemoteParticipant(f"http://127.0.0.1:{port}", token=TOKEN)
        end = time.monotonic() + 120
        while True:  # both workers registered with the group
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            try:
                status = httpx.get(
                    f"http://127.0.0.1:{port}{CHECKPOINT_ROUTE_PREFIX}/status",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    trust_env=False,
                )
                if status.status_code == 200 and status.json().get("workers") == 2:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < end, "the server did not start"
            time.sleep(0.1)
        store = open_store(url, endpoint_url=unsafe_endpoint, accept_unsafe_store=True)
        coordinator = Coordinator(
            store, [remote], LiveExecutionRegistry(), accept_unsafe_store=True, run_id="test-run"
        )
        outcome = coordinator.checkpoint("ck-unsafe", deadline_s=120)
        assert outcome.clean
        assert [p.checkpoint_id for p in list_published(store)] == ["ck-unsafe"]
        remote.close()
    finally:
        _stop(proc)
