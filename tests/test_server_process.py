"""Control servers as real processes: a participant killed mid-prepare fails the checkpoint
closed, naming itself; awaitable admission waits keep the event loop free."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from _http import served
from _protocol_fakes import ScriptedParticipant, ex
from conftest import _free_port, _wait_listening
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.errors import AdmissionClosedError, StaleCheckpointError
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import (
    CHECKPOINT_ROUTE_PREFIX,
    AsyncAdmission,
    ParticipantUnreachableError,
    RemoteParticipant,
    install_participant,
)
from rollout_checkpoint.store import LocalStore

TOKEN = "tok-process-secret"
HERE = Path(__file__).parent


def _start(kind: str, instance: str, store: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_control_server.py"), kind, instance, str(port), str(store), *extra],
        env={**os.environ, "ROLLOUT_CHECKPOINT_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait_listening(port, proc)
    return proc, f"http://127.0.0.1:{port}"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_participant_killed_during_prepare_fails_the_checkpoint_closed(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = LocalStore(store_dir)
    agent = ScriptedParticipant("agent", "agent-0")
    proc, url = _start("resources", "res-0", store_dir, "session s1 mid-mutation")
    try:
        remote = RemoteParticipant(url, token=TOKEN, attempts=3)
        coordinator = Coordinator(store, [agent, remote], LiveExecutionRegistry(), run_id="test-run")
        failure: list[BaseException] = []

        def run() -> None:
            try:
                coordinator.checkpoint("ck-killed", deadline_s=60)
            except BaseException as exc:
                failure.append(exc)

        cycle = threading.Thread(target=run)
        cycle.start()
        # the resources prepare is waiting at the server once the agent stage has closed
        status = f"{url}{CHECKPOINT_ROUTE_PREFIX}/status"
        end = time.monotonic() + 60
        while httpx.get(status, headers={"Authorization": f"Bearer {TOKEN}"}).json()["accepting"]:
            assert time.monotonic() < end and cycle.is_alive(), ("prepare never reached the server", failure)
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        cycle.join(60)
        assert not cycle.is_alive()
        (error,) = failure
        assert isinstance(error, ParticipantUnreachableError)
        assert f"resources/res-0 at {url}: prepare failed" in str(error)
        assert list_published(store) == []
        assert agent.accepting  # the abort resumed the surviving participant
        assert proc.stderr is not None and TOKEN not in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        agent.close()


def test_parked_requests_wait_without_blocking_the_event_loop(tmp_path: Path) -> None:
    participant = ScriptedParticipant("agent", "agent-0")
    admission = AsyncAdmission(participant)
    app = FastAPI()
    install_participant(app, participant, token=TOKEN, store=LocalStore(tmp_path))

    @app.post("/work/{rollout_id}")
    async def work(rollout_id: str) -> dict[str, str]:
        await admission.call(lambda: participant.track(ex(rollout_id)), timeout=60)
        return {"admitted": rollout_id}

    @app.get("/ping")
    async def ping() -> dict[str, int]:
        return {"waiting": admission.waiting}

    results: dict[str, int] = {}

    def send(client: httpx.Client, rollout_id: str) -> None:
        results[rollout_id] = client.post(f"/work/{rollout_id}").status_code

    with served(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        body: dict[str, Any] = {"checkpoint_id": "ck-1", "deadline_ts": time.time() + 60}
        assert client.post(f"{CHECKPOINT_ROUTE_PREFIX}/prepare", json=body, headers=headers).json()["ready"]
        senders = [threading.Thread(target=send, args=(client, f"r{i}")) for i in range(20)]
        for sender in senders:
            sender.start()
        end = time.monotonic() + 60
        while client.get("/ping").json()["waiting"] < 20:  # the loop answers while 20 requests park
            assert time.monotonic() < end, "20 requests never parked"
            time.sleep(0.02)
        assert results == {} and participant.live() == {}
        watchers = [t for t in threading.enumerate() if t.name == "admission-watcher"]
        assert len(watchers) == 1  # one thread watches for all 20 parked requests
        assert client.post(f"{CHECKPOINT_ROUTE_PREFIX}/resume", json=body, headers=headers).status_code == 200
        for sender in senders:
            sender.join(30)
    assert results == {f"r{i}": 200 for i in range(20)}
    assert sorted(participant.live()) == sorted(f"r{i}" for i in range(20))
    participant.close()


def test_wait_open_times_out_while_closed_and_returns_at_once_when_open() -> None:
    participant = ScriptedParticipant("agent", "agent-0")
    admission = AsyncAdmission(participant)

    async def scenario() -> None:
        assert await admission.wait_open(0.0)
        participant.prepare("ck-1", time.time() + 30)
        assert not await admission.wait_open(0.05)
        assert admission.waiting == 0
        with pytest.raises(AdmissionClosedError):
            await admission.call(lambda: participant.track(ex("late")), timeout=0.05)
        participant.resume("ck-1", time.time() + 30)
        assert await admission.wait_open(0.05)
        await admission.call(lambda: participant.track(ex("late")), timeout=0.05)

    asyncio.run(scenario())
    assert list(participant.live()) == ["late"]
    participant.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_coordinator_killed_between_aggregate_and_global_record_publishes_nothing(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = LocalStore(store_dir)
    servers = [_start(kind, f"{kind}-0", store_dir) for kind in ("agent", "model", "resources")]
    try:
        urls = [url for _, url in servers]
        killed = subprocess.run(
            [sys.executable, str(HERE / "_http_coordinator.py"), str(store_dir), "ck-dead", "publish", *urls],
            env={**os.environ, "ROLLOUT_CHECKPOINT_TOKEN": TOKEN},
            capture_output=True,
            timeout=120,
        )
        assert killed.returncode == -signal.SIGKILL
        assert store.exists("checkpoints/ck-dead/aggregate.json")  # the aggregate was written...
        assert list_published(store) == []  # ...the commit point never was
        # a new coordinator finds the abandoned checkpoint active at every server, aborts it
        # (resume), and publishes its own
        remotes = [RemoteParticipant(url, token=TOKEN) for url in urls]
        assert {r.status().checkpoint_id for r in remotes} == {"ck-dead"}
        for remote in remotes:
            remote.resume("ck-dead", time.time() + 30)
        outcome = Coordinator(store, remotes, LiveExecutionRegistry(), run_id="test-run").checkpoint(
            "ck-next", deadline_s=60
        )
        assert outcome.clean and [p.checkpoint_id for p in list_published(store)] == ["ck-next"]
        with pytest.raises(StaleCheckpointError):  # the dead coordinator's id can never come back
            remotes[0].prepare("ck-dead", time.time() + 30)
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait(10)
