"""Issue 18, D1, on a server with two worker processes: prepares whose clients gave up stop
waiting everywhere (the worker frontend, the group, each worker), so none is left parked
(``status.waiting`` sums the prepares waiting in every worker) and the abort still works."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import httpx
import pytest

from _procs import worker_server
from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX

TOKEN = "tok-control-threads-workers-01"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREPARES = 12

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _status(client: httpx.Client) -> dict[str, object]:
    response = client.get(f"{CHECKPOINT_ROUTE_PREFIX}/status", headers=AUTH)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _until(predicate: object, what: str, limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.1)


def _wait_in_flight(client: httpx.Client) -> None:
    """Until a prepare finds the held mutation in flight (each probe is resumed again)."""
    for probe in range(600):
        body = {"checkpoint_id": f"probe-{probe}", "deadline_ts": time.time() + 1.0}
        report = client.post(f"{CHECKPOINT_ROUTE_PREFIX}/prepare", json=body, headers=AUTH)
        assert report.status_code == 200, report.text
        body["deadline_ts"] = time.time() + 30
        assert client.post(f"{CHECKPOINT_ROUTE_PREFIX}/resume", json=body, headers=AUTH).status_code == 200
        if not report.json()["ready"]:
            return
        time.sleep(0.05)
    raise AssertionError("the held mutation never started")


def test_abandoned_prepares_stop_waiting_in_every_worker(tmp_path: Path) -> None:
    with worker_server(tmp_path / "store", 2, token=TOKEN) as server:
        client = httpx.Client(base_url=server.url, timeout=30)
        assert client.post("/ng-rollout/r1/sessions", json={"attempt": 0}).status_code == 200

        def hold() -> None:  # a mutation in flight for far longer than the test: r1 never ready
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(f"{server.url}/ng-rollout/r1/inc", json={"attempt": 0, "hold_s": 150}, timeout=200)

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        _wait_in_flight(client)
        deadline = time.time() + 120  # without cancellation every prepare would wait two minutes

        def prepare() -> None:
            with contextlib.suppress(httpx.HTTPError), httpx.Client(timeout=0.5) as giving_up:
                giving_up.post(
                    f"{server.url}{CHECKPOINT_ROUTE_PREFIX}/prepare",
                    json={"checkpoint_id": "ck-1", "deadline_ts": deadline},
                    headers=AUTH,
                )

        clients = [threading.Thread(target=prepare) for _ in range(PREPARES)]
        for thread in clients:
            thread.start()
        _until(lambda: int(_status(client)["waiting"]) > 0, "prepares parked in the workers")  # type: ignore[call-overload]
        for thread in clients:
            thread.join(30)
        _until(lambda: _status(client)["waiting"] == 0, "no prepare left waiting in any worker")
        status = _status(client)
        assert (status["phase"], status["checkpoint_id"], status["accepting"], status["workers"]) == (
            "preparing",
            "ck-1",
            False,
            2,
        )
        resume = client.post(
            f"{CHECKPOINT_ROUTE_PREFIX}/resume",
            json={"checkpoint_id": "ck-1", "deadline_ts": deadline},
            headers=AUTH,
        )
        assert resume.status_code == 200, resume.text
        status = _status(client)
        assert (status["phase"], status["accepting"], status["waiting"]) == ("idle", True, 0)
        client.close()
