"""uvicorn's worker health check and a worker busy in a long commit (issue 26).

uvicorn's supervisor kills a worker process that leaves its health-check ping unanswered for
``timeout_worker_healthcheck`` seconds. A commit that holds the interpreter in one native call
(the GIL: the answering thread cannot run) for longer than uvicorn's own default (5 s) must not
cost the worker its life and its state: ``run_server`` allows ``WORKER_HEALTHCHECK_TIMEOUT_S``
(60 s) by default. A worker that stays unresponsive beyond the configured timeout is still
replaced, and the coordinator refuses to publish over its replacement.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from _procs import WorkerServer, processes_mentioning, worker_server
from _protocol_fakes import published_ids
from rollout_checkpoint import CheckpointError, ParticipantRestartedError
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.errors import InvalidArgumentError
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import WORKER_HEALTHCHECK_TIMEOUT_S, RemoteParticipant, run_server
from rollout_checkpoint.store import LocalStore

TOKEN = "tok-healthcheck-secret"
BUILD = "_slow_commit_build:build"


def _server(tmp_path: Path, hold: Path, *args: str) -> WorkerServer:
    env = {"TMPDIR": str(tmp_path), "ROLLOUT_CHECKPOINT_TEST_HOLD_FILE": str(hold)}
    return WorkerServer(tmp_path / "store", 2, token=TOKEN, build=BUILD, env=env, args=args)


def _workers(store_dir: Path, server: WorkerServer) -> set[int]:
    return set(processes_mentioning(str(store_dir))) - {server.proc.pid}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_worker_holding_the_interpreter_past_uvicorns_default_is_not_replaced(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.write_text("7")  # > uvicorn's default of 5 s (and its 0.5 s ping period)
    srv = _server(tmp_path, hold)
    remote = RemoteParticipant(srv.url, token=TOKEN)
    try:
        before = remote.status().incarnation
        workers = _workers(tmp_path / "store", srv)
        store = LocalStore(tmp_path / "store")
        coordinator = Coordinator(store, [remote], LiveExecutionRegistry(), run_id="r")
        assert coordinator.checkpoint("ck-1").clean
        assert published_ids(store) == ["ck-1"]
        assert remote.status().incarnation == before  # no worker was restarted
        assert _workers(tmp_path / "store", srv) == workers
    finally:
        remote.close()
        srv.kill()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_worker_unresponsive_beyond_the_timeout_is_replaced_and_refused(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.write_text("0")
    store = LocalStore(tmp_path / "store")
    with worker_server(
        tmp_path / "store",
        2,
        token=TOKEN,
        build=BUILD,
        env={"TMPDIR": str(tmp_path), "ROLLOUT_CHECKPOINT_TEST_HOLD_FILE": str(hold)},
        args=["4"],  # seconds; less makes a starting replacement miss pings on a loaded host
    ) as srv:
        remote = RemoteParticipant(srv.url, token=TOKEN)
        try:
            coordinator = Coordinator(store, [remote], LiveExecutionRegistry(), run_id="r")
            assert coordinator.checkpoint("ck-1").clean
            before = remote.status().incarnation
            hold.write_text("8")  # > the 4 s configured: taken for hung, killed, replaced
            with pytest.raises(CheckpointError):
                coordinator.checkpoint("ck-2")
            hold.write_text("0")

            def replaced() -> bool:  # a new worker registered in the place of a killed one
                status = srv.status()
                return status.get("workers") == 2 and status.get("incarnation") not in (None, before)

            end = time.monotonic() + 120
            while not replaced():
                assert time.monotonic() < end, "the unresponsive worker was never replaced"
                time.sleep(0.1)
            with pytest.raises(ParticipantRestartedError):
                coordinator.checkpoint("ck-3")
            assert published_ids(store) == ["ck-1"]
        finally:
            remote.close()


@pytest.mark.parametrize("seconds", [0, -1, True, 2.5])
def test_the_timeout_must_be_whole_seconds_of_at_least_one(tmp_path: Path, seconds: object) -> None:
    with pytest.raises(InvalidArgumentError, match="worker_healthcheck_timeout"):
        run_server(
            "_slow_commit_build:build",
            store=str(tmp_path),
            host="127.0.0.1",
            port=1,
            token=TOKEN,
            workers=2,
            worker_healthcheck_timeout=seconds,  # type: ignore[arg-type]
        )
    assert not list(tmp_path.iterdir())  # refused before anything started


def test_serve_defaults_to_the_same_timeout() -> None:
    import inspect

    from rollout_checkpoint.cli._serve import serve_command

    default = inspect.signature(serve_command).parameters["worker_healthcheck_timeout"].default
    assert default == WORKER_HEALTHCHECK_TIMEOUT_S == 60
