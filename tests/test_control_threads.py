"""Status, resume and renew always answer (issue 18, D1): a pile of prepares that wait for a
boundary holds every blocking control thread, yet ``/status`` and ``/resume`` answer on their own
threads; a prepare whose client went away stops waiting and frees its thread at once (a later
same-id prepare still works, and the lease still reopens admission); a deadline further ahead
than the participant accepts is refused before anything changes."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from _http import served
from _protocol_fakes import ScriptedParticipant, ex
from rollout_checkpoint.errors import DeadlineTooFarError
from rollout_checkpoint.protocol import MAX_DEADLINE_SECONDS, Cancellation
from rollout_checkpoint.server import (
    CHECKPOINT_ROUTE_PREFIX,
    ParticipantUnreachableError,
    RemoteParticipant,
    control_app,
)
from rollout_checkpoint.server._router import CONTROL_THREADS
from rollout_checkpoint.store import LocalStore

TOKEN = "tok-control-threads-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREPARES = CONTROL_THREADS + 8  # more than the blocking pool holds


def _blocked(**options: float) -> ScriptedParticipant:
    participant = ScriptedParticipant("agent", "agent-0", **options)
    participant.track(ex("r"))
    participant.set_blockers(["r#0 never reaches a boundary"])
    return participant


def _waiting_prepares() -> int:
    """Threads of this process parked inside a prepare's wait."""
    count = 0
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == "_wait_ready":
                count += 1
                break
            frame = frame.f_back  # type: ignore[assignment]
    return count


def _until(predicate: object, what: str, limit: float = 30.0) -> None:
    end = time.monotonic() + limit
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


@pytest.fixture()
def base(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, ScriptedParticipant]]:
    participant = _blocked(**getattr(request, "param", {}))
    with served(control_app(participant, token=TOKEN, store=LocalStore(tmp_path / "store"))) as url:
        yield f"{url}{CHECKPOINT_ROUTE_PREFIX}", participant
    participant.close()


def _prepare_in_threads(base: str, deadline: float, client_timeout: float) -> list[threading.Thread]:
    def prepare() -> None:
        try:
            with httpx.Client(timeout=client_timeout) as client:
                client.post(
                    f"{base}/prepare", json={"checkpoint_id": "ck-1", "deadline_ts": deadline}, headers=AUTH
                )
        except httpx.HTTPError:
            pass  # the client gave up

    clients = [threading.Thread(target=prepare) for _ in range(PREPARES)]
    for thread in clients:
        thread.start()
    return clients


def test_status_and_resume_answer_while_prepares_hold_every_control_thread(
    base: tuple[str, ScriptedParticipant],
) -> None:
    url, participant = base
    deadline = time.time() + 60  # far beyond the test: only the resume releases the prepares
    clients = _prepare_in_threads(url, deadline, client_timeout=60)
    _until(lambda: _waiting_prepares() == CONTROL_THREADS, "every blocking thread parked in a prepare")
    with httpx.Client(timeout=10) as client:
        status = client.get(f"{url}/status", headers=AUTH)
        assert status.status_code == 200 and status.json()["phase"] == "preparing"
        body = {"checkpoint_id": "ck-1", "deadline_ts": deadline}
        renew = client.post(f"{url}/renew", json=body, headers=AUTH)
        assert renew.status_code == 200, renew.text
        resume = client.post(f"{url}/resume", json=body, headers=AUTH)
        assert resume.status_code == 200, resume.text
    for thread in clients:
        thread.join(30)
    assert not any(t.is_alive() for t in clients)
    status_after = participant.status()
    assert status_after.phase.value == "idle" and status_after.accepting
    assert _waiting_prepares() == 0


def test_prepares_whose_clients_went_away_free_their_threads(base: tuple[str, ScriptedParticipant]) -> None:
    url, participant = base
    deadline = time.time() + 60  # without disconnect detection every thread stays parked a minute
    clients = _prepare_in_threads(url, deadline, client_timeout=0.5)
    for thread in clients:
        thread.join(30)
    # every prepare (the queued ones too, once they got a thread) noticed its client left
    _until(lambda: participant.events["prepare_cancelled"] == PREPARES, "every prepare cancelled")
    _until(lambda: _waiting_prepares() == 0, "no thread left waiting in a prepare")
    assert participant.events["prepare_not_ready"] == 0  # none waited to its deadline
    with httpx.Client(timeout=10) as client:
        status = client.get(f"{url}/status", headers=AUTH).json()
        # an abandoned prepare is a not-ready prepare: admission stays closed for the coordinator
        assert (status["phase"], status["checkpoint_id"], status["accepting"]) == ("preparing", "ck-1", False)
        participant.set_blockers([])
        again = client.post(
            f"{url}/prepare", json={"checkpoint_id": "ck-1", "deadline_ts": deadline}, headers=AUTH
        )
        assert again.status_code == 200 and again.json()["ready"] is True, again.text
        resume = client.post(
            f"{url}/resume", json={"checkpoint_id": "ck-1", "deadline_ts": deadline}, headers=AUTH
        )
        assert resume.status_code == 200, resume.text
    assert participant.is_open()


@pytest.mark.parametrize("base", [{"lease_grace_seconds": 0.0}], indirect=True)
def test_an_abandoned_prepare_reopens_admission_when_its_lease_ends(
    base: tuple[str, ScriptedParticipant],
) -> None:
    url, participant = base
    with httpx.Client(timeout=0.3) as client, pytest.raises(httpx.TimeoutException):
        client.post(
            f"{url}/prepare", json={"checkpoint_id": "ck-2", "deadline_ts": time.time() + 1.0}, headers=AUTH
        )
    _until(lambda: participant.events["prepare_cancelled"] == 1, "the prepare cancelled")
    assert not participant.is_open()  # closed until the deadline (+ grace 0) ...
    _until(participant.is_open, "admission reopened by the lease")  # ... and not beyond
    assert participant.events["lease_expired"] == 1


def test_a_deadline_too_far_ahead_is_refused_and_changes_nothing(
    base: tuple[str, ScriptedParticipant],
) -> None:
    url, participant = base
    too_far = time.time() + MAX_DEADLINE_SECONDS + 60
    with httpx.Client(timeout=10) as client:
        for op in ("prepare", "renew", "commit", "collect", "restore"):
            body: dict[str, object] = {"checkpoint_id": "ck-far", "deadline_ts": too_far}
            if op == "restore":
                body["source_checkpoint_id"] = "ck-0"
            reply = client.post(f"{url}/{op}", json=body, headers=AUTH)
            if op == "collect" and reply.status_code == 409:
                continue  # the scripted participant publishes synchronously only
            assert reply.status_code == 422, (op, reply.text)
            assert reply.json()["error"]["code"] == "deadline_too_far", (op, reply.text)
        # resume (the abort) takes any future deadline: it must always get through
        resume = client.post(
            f"{url}/resume", json={"checkpoint_id": "ck-far", "deadline_ts": too_far}, headers=AUTH
        )
        assert resume.status_code == 200, resume.text
    assert participant.is_open() and participant.events["prepare_cancelled"] == 0
    with pytest.raises(DeadlineTooFarError) as refused:
        participant.prepare("ck-far-2", time.time() + 2 * MAX_DEADLINE_SECONDS)
    assert refused.value.code == "deadline_too_far" and participant.is_open()
    tight = ScriptedParticipant("agent", "agent-1", max_deadline_seconds=5)
    with pytest.raises(DeadlineTooFarError):
        tight.prepare("ck-3", time.time() + 10)
    assert tight.prepare("ck-3", time.time() + 4).ready


def test_a_cancelled_prepare_answers_not_ready_at_once_in_process() -> None:
    participant = _blocked()
    cancel = Cancellation()
    answer: list[object] = []
    waiter = threading.Thread(
        target=lambda: answer.append(participant.prepare("ck-4", time.time() + 60, cancel=cancel))
    )
    waiter.start()
    _until(lambda: _waiting_prepares() == 1, "the prepare waits")
    cancel.cancel()
    waiter.join(10)
    [report] = answer
    assert report.ready is False and report.phase.value == "preparing"  # type: ignore[attr-defined]
    cancel.cancel()  # twice is a no-op
    late = Cancellation()
    late.cancel()  # cancelled before the prepare starts: it does not wait at all
    assert participant.prepare("ck-4", time.time() + 60, cancel=late).ready is False
    assert participant.events["prepare_cancelled"] == 2
    participant.close()


def test_a_cancellable_remote_prepare_waits_in_slices_and_lets_go(
    base: tuple[str, ScriptedParticipant],
) -> None:
    url, participant = base
    server = url[: -len(CHECKPOINT_ROUTE_PREFIX)]
    cancel = Cancellation()
    answer: list[object] = []
    with RemoteParticipant(server, token=TOKEN) as remote:
        waiter = threading.Thread(
            target=lambda: answer.append(remote.prepare("ck-5", time.time() + 60, cancel=cancel))
        )
        waiter.start()
        # the same prepare is repeated after every slice: the server saw more than one
        _until(lambda: participant.events["prepare_cancelled"] >= 2, "a second slice")
        assert participant.status().waiting == 1 and waiter.is_alive()
        cancel.cancel()
        waiter.join(10)
        [report] = answer
        assert report.ready is False and "cancelled" in report.blockers[0]  # type: ignore[attr-defined]
        _until(lambda: participant.status().waiting == 0, "the server's wait ended too")
        participant.set_blockers([])  # ready within a slice: the answer comes at once
        assert remote.prepare("ck-5", time.time() + 60, cancel=Cancellation()).ready


def test_a_cancellable_remote_prepare_to_a_dead_server_is_unreachable() -> None:
    with (
        RemoteParticipant("http://127.0.0.1:9", token=TOKEN, attempts=2) as remote,
        pytest.raises(ParticipantUnreachableError),
    ):
        remote.prepare("ck-6", time.time() + 60, cancel=Cancellation())  # no loop on a dead server
