"""Asynchronous publication over the HTTP control plane, with real server processes on
127.0.0.1 (one process, and two worker processes behind one ``WorkerGroup``): every worker
freezes before the resume, sessions take work while the upload is held, state changed after the
freeze stays out, and a server killed mid-upload publishes nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _async_build import HOLD_ENV
from _procs import kill_group, start_group
from _protocol_fakes import ScriptedParticipant, latest_id
from conftest import _free_port
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.errors import ParticipantRestartedError
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.format.layout import component_prefix
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.protocol import Phase, PublicationFailedError
from rollout_checkpoint.reader import load_checkpoint, verify_checkpoint
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.retention import collect_garbage
from rollout_checkpoint.server import (
    CHECKPOINT_ROUTE_PREFIX,
    ParticipantUnreachableError,
    RemoteParticipant,
)
from rollout_checkpoint.store import LocalStore

TOKEN = "tok-async-secret"
HERE = Path(__file__).parent
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROLLOUTS = [f"r{i}" for i in range(4)]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@contextlib.contextmanager
def _server(store: Path, workers: int, hold: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (store.parent / f"server-{port}.log").open("wb")
    proc = start_group(
        [
            sys.executable,
            str(HERE / "_serve_main.py"),
            "_async_build:build",
            str(store),
            str(port),
            str(workers),
        ],
        env={**os.environ, "ROLLOUT_CHECKPOINT_TOKEN": TOKEN, HOLD_ENV: str(hold)},
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        end = time.monotonic() + 90
        while True:
            assert proc.poll() is None, Path(log.name).read_text()[-2000:]
            assert time.monotonic() < end, "the server did not get its workers"
            with contextlib.suppress(httpx.TransportError):
                got = httpx.get(f"{url}{CHECKPOINT_ROUTE_PREFIX}/status", headers=AUTH, timeout=30)
                if got.status_code == 200 and got.json()["workers"] == workers:
                    break
            time.sleep(0.1)
        yield url, proc
    finally:
        kill_group(proc)
        log.close()


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60, limits=httpx.Limits(max_keepalive_connections=0))


def _setup(url: str) -> tuple[Coordinator, RemoteParticipant, ScriptedParticipant]:
    registry = LiveExecutionRegistry()
    agent = ScriptedParticipant("agent", "agent-0")
    with _client(url) as client:
        for rollout_id in ROLLOUTS:
            registry.start(registry.dispatch(rollout_id, input_digest=rollout_id))
            assert client.post(f"/ng-rollout/{rollout_id}/sessions", json={"attempt": 0}).status_code == 200
            for _ in range(2):
                assert client.post(f"/ng-rollout/{rollout_id}/inc", json={"attempt": 0}).json()["n"] <= 2
            agent.add(
                AgentBoundaryRecord(
                    rollout_id=rollout_id,
                    attempt=0,
                    boundary_index=1,
                    turn_index=1,
                    resource_revisions={"counter-0": {"s": 2}},
                )
            )
    remote = RemoteParticipant(url, token=TOKEN)
    return Coordinator(url_store(url), [agent, remote], registry, run_id="test-run"), remote, agent


_STORES: dict[str, LocalStore] = {}


def url_store(url: str) -> LocalStore:
    return _STORES[url]


def _wait_held(hold: Path, count: int) -> None:
    end = time.monotonic() + 60
    while len(list(hold.parent.glob("held-*"))) < count:
        assert time.monotonic() < end, "the uploads never started"
        time.sleep(0.02)


def _revisions(store: LocalStore, cid: str) -> dict[str, int]:
    reader = ArchiveReader.open(store, component_prefix(cid, "resources", "counter-0"))
    return {m.rollout_id: int(m.revision or 0) for m in reader.members()}


@pytest.mark.parametrize("workers", [1, 2])
def test_async_checkpoint_over_http_resumes_before_the_upload(tmp_path: Path, workers: int) -> None:
    store_dir, hold = tmp_path / "store", tmp_path / "hold" / "upload.hold"
    hold.parent.mkdir()
    store = LocalStore(store_dir)
    with _server(store_dir, workers, hold) as (url, _):
        _STORES[url] = store
        coordinator, remote, agent = _setup(url)
        sync = coordinator.checkpoint("ck-sync", deadline_s=60)
        hold.touch()
        handle = coordinator.checkpoint_async("ck-async", deadline_s=120)
        _wait_held(hold, workers)  # every worker froze and its upload is held
        status = remote.status()
        assert status.phase is Phase.IDLE and status.accepting and status.uploading == ("ck-async",)
        assert not handle.done()
        with _client(url) as client:  # the sessions take work while the upload is held
            for rollout_id in ROLLOUTS:
                moved = client.post(f"/ng-rollout/{rollout_id}/inc", json={"attempt": 0})
                assert moved.status_code == 200 and moved.json()["n"] == 3, moved.text
            assert client.post("/ng-rollout/late/sessions", json={"attempt": 0}).status_code == 200
        assert not handle.done()
        hold.unlink()
        outcome = handle.result(timeout=120)
        assert outcome.clean and outcome.publication == "async"
        verify_checkpoint(store, "ck-async")
        plans = [load_checkpoint(store, cid, verify=True) for cid in ("ck-sync", "ck-async")]
        assert {r: p.disposition for r, p in plans[0].rollouts.items()} == {
            r: p.disposition for r, p in plans[1].rollouts.items()
        }
        assert all(p.disposition == "continue" for p in plans[1].rollouts.values())
        # the frozen state: revision 2 everywhere, no "late" session, both workers' owners
        assert _revisions(store, "ck-async") == dict.fromkeys(ROLLOUTS, 2) == _revisions(store, "ck-sync")
        manifest = ArchiveReader.open(store, component_prefix("ck-async", "resources", "counter-0")).manifest
        owners: Any = manifest.extra.get("session_owners", {})
        assert workers == 1 or len(owners) == 2
        assert latest_id(store) == "ck-async" and sync.record.sequence + 1 == outcome.record.sequence
        assert not (store_dir / "_workers").exists()  # nothing staged: each worker wrote its part once
        if workers == 2:  # the component refers to the parts the workers uploaded after the resume
            here = component_prefix("ck-async", "resources", "counter-0") + "/parts/"
            assert sum(b.prefix.startswith(here) for b in manifest.bases or []) == 2
        remote.close()
        agent.close()


def test_a_server_killed_during_the_background_upload_publishes_nothing(tmp_path: Path) -> None:
    store_dir, hold = tmp_path / "store", tmp_path / "hold" / "upload.hold"
    hold.parent.mkdir()
    store = LocalStore(store_dir)
    with _server(store_dir, 2, hold) as (url, proc):
        _STORES[url] = store
        coordinator, remote, agent = _setup(url)
        coordinator.checkpoint("ck-base", deadline_s=60)
        hold.touch()
        handle = coordinator.checkpoint_async("ck-killed", deadline_s=60)
        _wait_held(hold, 2)
        assert agent.accepting  # resumed before the upload
        os.killpg(proc.pid, signal.SIGKILL)  # the whole server, its workers mid-upload
        proc.wait(10)
        with pytest.raises((ParticipantUnreachableError, PublicationFailedError)):
            handle.result(timeout=120)
        assert [p.checkpoint_id for p in list_published(store)] == ["ck-base"]
        assert latest_id(store) == "ck-base" and load_checkpoint(store).checkpoint_id == "ck-base"
        assert not store.exists("checkpoints/ck-killed/aggregate.json")
        remote.close()
        agent.close()


def test_one_worker_killed_during_the_background_upload_publishes_nothing(tmp_path: Path) -> None:
    store_dir, hold = tmp_path / "store", tmp_path / "hold" / "upload.hold"
    hold.parent.mkdir()
    store = LocalStore(store_dir)
    with _server(store_dir, 2, hold) as (url, _):
        _STORES[url] = store
        coordinator, remote, agent = _setup(url)
        coordinator.checkpoint("ck-base", deadline_s=60)
        hold.touch()
        handle = coordinator.checkpoint_async("ck-worker-killed", deadline_s=60)
        _wait_held(hold, 2)
        victim = int(sorted(hold.parent.glob("held-*"))[0].name.split("-", 1)[1])
        os.kill(victim, signal.SIGKILL)  # one worker process dies mid-upload; the other is held
        with pytest.raises(PublicationFailedError) as info:
            handle.result(timeout=120)  # the group's merge cannot collect the dead worker's upload
        assert "publication_failed" in (info.value.code, info.value.details.get("cause"))
        hold.unlink()
        assert [p.checkpoint_id for p in list_published(store)] == ["ck-base"]
        assert latest_id(store) == "ck-base"
        assert not store.exists(
            component_prefix("ck-worker-killed", "resources", "counter-0") + "/manifest.json"
        )
        # the replacement worker registers: the group came back with a lost worker's sessions, a
        # new incarnation, so no checkpoint publishes over it until a recovery restored it
        end = time.monotonic() + 90
        while remote.status().workers != 2:
            assert time.monotonic() < end, "no replacement worker"
            time.sleep(0.1)
        with pytest.raises(ParticipantRestartedError):
            coordinator.checkpoint("ck-refused", deadline_s=60, publication="async")
        assert latest_id(store) == "ck-base"
        assert coordinator.recover(deadline_s=60).source_checkpoint_id == "ck-base"
        after = coordinator.checkpoint("ck-after", deadline_s=60, publication="async")
        assert after.clean and latest_id(store) == "ck-after"
        verify_checkpoint(store, "ck-after")
        # the failed attempt's parts are an unpublished checkpoint's leftovers: retention takes them
        collect_garbage(store, keep=1, min_age_s=0)
        assert store.list("checkpoints/ck-worker-killed/") == []
        verify_checkpoint(store, "ck-after")
        remote.close()
        agent.close()
