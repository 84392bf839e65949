"""Status, resume and renew always answer (issue 18, D1): a pile of prepares that wait for a
boundary (their clients gave up) holds every blocking control thread, yet ``/status`` and
``/resume`` answer at once on their own threads, and the resume releases the parked prepares."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from _http import served
from _protocol_fakes import ScriptedParticipant, ex
from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX, control_app
from rollout_checkpoint.server._router import CONTROL_THREADS
from rollout_checkpoint.store import LocalStore

TOKEN = "tok-control-threads-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_status_and_resume_answer_while_prepares_hold_every_control_thread(tmp_path: Path) -> None:
    participant = ScriptedParticipant("agent", "agent-0")
    participant.track(ex("r"))
    participant.set_blockers(["r#0 never reaches a boundary"])
    app = control_app(participant, token=TOKEN, store=LocalStore(tmp_path / "store"))
    with served(app) as url:
        base = f"{url}{CHECKPOINT_ROUTE_PREFIX}"
        deadline = time.time() + 90

        def prepare() -> None:
            try:
                with httpx.Client(timeout=3) as client:  # the client gives up after 3 s
                    client.post(
                        f"{base}/prepare",
                        json={"checkpoint_id": "ck-1", "deadline_ts": deadline},
                        headers=AUTH,
                    )
            except httpx.HTTPError:
                pass

        clients = [threading.Thread(target=prepare) for _ in range(CONTROL_THREADS + 8)]
        for thread in clients:
            thread.start()
        end = time.monotonic() + 10
        while participant.status().checkpoint_id != "ck-1" and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(0.5)  # every blocking thread is now parked in a prepare
        with httpx.Client(timeout=5) as client:
            started = time.monotonic()
            status = client.get(f"{base}/status", headers=AUTH)
            assert status.status_code == 200 and status.json()["phase"] == "preparing"
            renew = client.post(
                f"{base}/renew", json={"checkpoint_id": "ck-1", "deadline_ts": deadline}, headers=AUTH
            )
            assert renew.status_code == 200, renew.text
            resume = client.post(
                f"{base}/resume", json={"checkpoint_id": "ck-1", "deadline_ts": deadline}, headers=AUTH
            )
            assert resume.status_code == 200, resume.text
            assert time.monotonic() - started < 5
        for thread in clients:
            thread.join(10)
        status_after = participant.status()
        assert status_after.phase.value == "idle" and status_after.accepting
