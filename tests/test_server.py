"""The HTTP control plane on real uvicorn servers (127.0.0.1): routes, authentication, error
shapes, malformed bodies, the remote participant the coordinator drives, concurrency."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from _http import served
from _protocol_fakes import Deployment, FakeTokens, ScriptedParticipant, ex
from rollout_checkpoint.coordinator import CheckpointNotReadyError, Coordinator
from rollout_checkpoint.errors import (
    CheckpointConflictError,
    DeadlineExceededError,
    InvalidPhaseError,
    InvalidValueError,
    StaleCheckpointError,
)
from rollout_checkpoint.protocol import Phase
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import (
    CHECKPOINT_ROUTE_PREFIX,
    MIN_TOKEN_LENGTH,
    ParticipantUnreachableError,
    RemoteParticipant,
    UnauthorizedError,
    control_app,
    install_participant,
)
from rollout_checkpoint.store import LocalStore

TOKEN = "tok-7f3a9c-not-for-logs"
ROUTES = ["status", "prepare", "renew", "commit", "collect", "restore", "resume", "abort-restore"]
ROUTES += ["retire", "forget"]


def _auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _soon(seconds: float = 30.0) -> float:
    return time.time() + seconds


@pytest.fixture()
def one(tmp_path: Path) -> Iterator[tuple[ScriptedParticipant, str, LocalStore]]:
    store = LocalStore(tmp_path / "store")
    participant = ScriptedParticipant("agent", "agent-0")
    with served(control_app(participant, token=TOKEN, store=store)) as url:
        yield participant, url, store
    participant.close()


def _post(url: str, route: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes | str) else json.dumps(body)
    return httpx.post(
        f"{url}{CHECKPOINT_ROUTE_PREFIX}/{route}",
        content=content,
        headers={"Content-Type": "application/json", **(headers if headers is not None else _auth())},
        timeout=30,
    )


# -- routes, OpenAPI ------------------------------------------------------------------------------------


def test_openapi_lists_every_route_with_the_bearer_scheme(one: Any) -> None:
    _, url, _ = one
    doc = httpx.get(f"{url}/openapi.json").json()
    paths = {
        p.rsplit("/", 1)[1]: ops for p, ops in doc["paths"].items() if p.startswith(CHECKPOINT_ROUTE_PREFIX)
    }
    assert sorted(paths) == sorted(ROUTES)
    assert list(paths["status"]) == ["get"]
    assert all(list(paths[r]) == ["post"] for r in ROUTES if r != "status")
    for ops in paths.values():
        (op,) = ops.values()
        assert op["security"] == [{"ControlToken": []}]
        assert {"401", "409", "422"} <= set(op["responses"])
    assert doc["components"]["securitySchemes"]["ControlToken"]["scheme"] == "bearer"
    commit = doc["components"]["schemas"]["CommitRequest"]
    assert commit["additionalProperties"] is False


def test_status_and_a_full_cycle_over_http(one: Any) -> None:
    participant, url, store = one
    status = httpx.get(f"{url}{CHECKPOINT_ROUTE_PREFIX}/status", headers=_auth()).json()
    assert status["capabilities"]["kind"] == "agent" and status["phase"] == "idle"
    participant.track(ex("r1"))
    deadline = _soon()
    report = _post(url, "prepare", {"checkpoint_id": "ck-1", "deadline_ts": deadline}).json()
    assert report["ready"] is True and report["phase"] == "prepared"
    assert _post(url, "renew", {"checkpoint_id": "ck-1", "deadline_ts": deadline}).status_code == 200
    reply = _post(url, "commit", {"checkpoint_id": "ck-1", "deadline_ts": deadline, "store": store.url})
    assert reply.status_code == 200, reply.text
    assert reply.json()["manifest_key"].endswith("manifest.json")
    assert store.exists(reply.json()["manifest_key"])
    resumed = _post(url, "resume", {"checkpoint_id": "ck-1", "deadline_ts": deadline}).json()
    assert resumed == {
        "checkpoint_id": "ck-1",
        "phase": "idle",
        "idempotent": False,
        "incarnation": participant.incarnation,
    }
    retire = _post(
        url, "retire", {"executions": [{"rollout_id": "r1", "attempt": 0}], "deadline_ts": deadline}
    )
    assert retire.json() == {"retired": 1}
    assert participant.refuses(ex("r1"))
    assert _post(url, "forget", {"rollout_ids": ["r1"]}).json() == {"forgotten": 1}
    assert not participant.refuses(ex("r1"))


def test_router_mounts_on_any_app_next_to_its_own_routes(tmp_path: Path) -> None:
    participant = ScriptedParticipant("resources", "res-0")
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"ok": "yes"}

    install_participant(app, participant, token=TOKEN, store=LocalStore(tmp_path))
    with served(app) as url:
        assert httpx.get(f"{url}/health").json() == {"ok": "yes"}
        assert httpx.get(f"{url}{CHECKPOINT_ROUTE_PREFIX}/status", headers=_auth()).status_code == 200
    participant.close()


# -- authentication ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer  x"},
    ],
    ids=["missing", "wrong", "longer", "basic", "no-scheme", "empty"],
)
def test_every_route_refuses_a_missing_or_wrong_token_and_applies_nothing(
    one: Any, headers: dict[str, str]
) -> None:
    participant, url, store = one
    participant.track(ex("r1"))
    bodies: dict[str, Any] = {
        "prepare": {"checkpoint_id": "ck-a", "deadline_ts": _soon()},
        "renew": {"checkpoint_id": "ck-a", "deadline_ts": _soon()},
        "commit": {"checkpoint_id": "ck-a", "deadline_ts": _soon(), "store": store.url},
        "restore": {"checkpoint_id": "rs", "source_checkpoint_id": "ck-a", "deadline_ts": _soon()},
        "resume": {"checkpoint_id": "ck-b", "deadline_ts": _soon()},
        "retire": {"executions": [{"rollout_id": "r1", "attempt": 0}], "deadline_ts": _soon()},
        "forget": {"rollout_ids": ["r1"]},
    }
    before = participant.status()
    responses = [httpx.get(f"{url}{CHECKPOINT_ROUTE_PREFIX}/status", headers=headers)]
    responses += [_post(url, route, body, headers) for route, body in bodies.items()]
    responses.append(_post(url, "prepare", b"{not json", headers))  # malformed AND unauthenticated
    for response in responses:
        assert response.status_code == 401
        assert response.json() == {
            "error": {"code": "unauthorized", "detail": "missing or wrong bearer token"}
        }
        assert response.headers["www-authenticate"] == "Bearer"
        assert TOKEN not in response.text
    assert participant.status() == before
    assert participant.accepting and not participant.refuses(ex("r1"))
    # and the id a refused resume named was not fenced: a real prepare of it still works
    assert _post(url, "prepare", {"checkpoint_id": "ck-b", "deadline_ts": _soon()}).json()["ready"]


def test_the_token_never_appears_in_logs(one: Any, caplog: pytest.LogCaptureFixture) -> None:
    _, url, _ = one
    caplog.set_level("DEBUG")
    _post(url, "prepare", {"checkpoint_id": "ck-1", "deadline_ts": _soon()}, {"Authorization": "Bearer nope"})
    _post(url, "prepare", {"checkpoint_id": "ck-1", "deadline_ts": _soon()})
    _post(url, "commit", {"checkpoint_id": "ck-1", "deadline_ts": _soon(), "store": "file:///elsewhere"})
    with RemoteParticipant(url, token=TOKEN) as remote:
        with pytest.raises(CheckpointConflictError) as info:
            remote.prepare("ck-2", _soon())
        assert TOKEN not in str(info.value) and TOKEN not in repr(remote)
    assert TOKEN not in caplog.text


# -- malformed bodies: 422 naming the field, never a 5xx ---------------------------------------------


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("prepare", {"checkpoint_id": "ck", "deadline_ts": 1e12, "extra": 1}, "body.extra"),
        ("prepare", {"checkpoint_id": "ck"}, "body.deadline_ts"),
        ("prepare", {"checkpoint_id": "../up", "deadline_ts": 1e9}, "body.checkpoint_id"),
        ("prepare", {"checkpoint_id": "ck", "deadline_ts": "soon"}, "body.deadline_ts"),
        ("prepare", {"checkpoint_id": "ck", "deadline_ts": True}, "body.deadline_ts"),
        ("prepare", {"checkpoint_id": "ck", "deadline_ts": 1e300}, "body.deadline_ts"),
        ("prepare", {"checkpoint_id": 5, "deadline_ts": 1e9}, "body.checkpoint_id"),
        (
            "commit",
            {"checkpoint_id": "ck", "deadline_ts": 1e9, "scope": [{"rollout_id": "r"}]},
            "body.scope.0.attempt",
        ),
        (
            "commit",
            {"checkpoint_id": "ck", "deadline_ts": 1e9, "scope": [{"rollout_id": "r", "attempt": -1}]},
            "attempt",
        ),
        ("restore", {"checkpoint_id": "ck", "deadline_ts": 1e9}, "body.source_checkpoint_id"),
        ("retire", {"executions": [], "deadline_ts": 1e9}, "body.executions"),
        ("forget", {"rollout_ids": "r1"}, "body.rollout_ids"),
        ("forget", [], "body"),
        ("resume", b"{", "body"),
        ("resume", b"", "body"),
        ("resume", b"\xff\xfe", "body"),
        ("resume", b"NaN", "body"),
        ("prepare", b'{"checkpoint_id": "ck", "deadline_ts": NaN}', "body.deadline_ts"),
        ("prepare", b'{"checkpoint_id": "ck", "deadline_ts": Infinity}', "body.deadline_ts"),
    ],
)
def test_malformed_bodies_get_422_naming_the_field(one: Any, route: str, body: Any, field: str) -> None:
    participant, url, _ = one
    response = _post(url, route, body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and field in error["detail"]
    assert participant.status().phase is Phase.IDLE and participant.accepting


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=12,
)
_field = st.sampled_from(
    [
        "checkpoint_id",
        "deadline_ts",
        "store",
        "scope",
        "source_checkpoint_id",
        "executions",
        "rollout_ids",
        "x",
    ]
)
_bodies = st.one_of(
    _json.map(json.dumps),
    st.dictionaries(_field, _json, max_size=6).map(json.dumps),
    st.binary(max_size=64),
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES[1:]), body=_bodies)
def test_no_body_produces_a_5xx(one: Any, route: str, body: str | bytes) -> None:
    participant, url, _ = one
    response = _post(url, route, body)
    assert response.status_code in (200, 409, 422), response.text
    if response.status_code != 200:
        assert set(response.json()) == {"error"} and set(response.json()["error"]) == {"code", "detail"}
    # whatever happened, end any checkpoint a random body may have started
    active = participant.status().checkpoint_id
    if active is not None:
        participant.resume(active, _soon())


# -- protocol refusals: 409 with the SDK's codes ---------------------------------------------------------


def test_protocol_refusals_are_409_with_stable_codes(one: Any) -> None:
    participant, url, _ = one
    participant.track(ex("r1"))
    d = _soon()

    def code(route: str, body: dict[str, Any]) -> tuple[int, str]:
        response = _post(url, route, body)
        return response.status_code, response.json()["error"]["code"]

    assert code("commit", {"checkpoint_id": "ck-1", "deadline_ts": d}) == (409, "invalid_phase")
    assert code("prepare", {"checkpoint_id": "ck-1", "deadline_ts": time.time() - 1}) == (
        409,
        "deadline_exceeded",
    )
    assert _post(url, "prepare", {"checkpoint_id": "ck-1", "deadline_ts": d}).status_code == 200
    assert code("prepare", {"checkpoint_id": "ck-2", "deadline_ts": d}) == (409, "checkpoint_conflict")
    assert code("commit", {"checkpoint_id": "ck-1", "deadline_ts": d, "store": "file:///tmp/other"}) == (
        409,
        "store_mismatch",
    )
    assert code("retire", {"executions": [{"rollout_id": "r1", "attempt": 0}], "deadline_ts": d}) == (
        409,
        "invalid_phase",
    )
    assert _post(url, "resume", {"checkpoint_id": "ck-1", "deadline_ts": d}).status_code == 200
    assert code("prepare", {"checkpoint_id": "ck-1", "deadline_ts": d}) == (409, "stale_checkpoint")
    participant.retire([ex("r1", 1)], d)
    assert code("retire", {"executions": [{"rollout_id": "r1", "attempt": 0}], "deadline_ts": d}) == (
        409,
        "stale_attempt",
    )


# -- the remote participant ------------------------------------------------------------------------------


def test_remote_errors_are_typed_and_name_the_participant(one: Any) -> None:
    participant, url, store = one
    with RemoteParticipant(url, token=TOKEN) as remote:
        assert remote.capabilities() == participant.capabilities()
        with pytest.raises(
            InvalidPhaseError, match=r"agent/agent-0 at http://127\.0\.0\.1:\d+: commit refused"
        ):
            remote.commit("ck-1", store, _soon())
        remote.resume("ck-9", _soon())
        with pytest.raises(StaleCheckpointError) as info:
            remote.prepare("ck-9", _soon())
        assert info.value.details["participant"].startswith("agent/agent-0 at ")
    with (
        RemoteParticipant(url, token="wrong") as intruder,
        pytest.raises(UnauthorizedError, match="missing or wrong bearer token"),
    ):
        intruder.status()


def test_remote_participant_retries_a_transient_failure(tmp_path: Path) -> None:
    participant = ScriptedParticipant("model", "policy-0")
    app = control_app(participant, token=TOKEN, store=LocalStore(tmp_path))
    seen: list[str] = []

    class FlakyOnce(BaseHTTPMiddleware):
        async def dispatch(self, request: Request, call_next: Any) -> Response:
            seen.append(request.url.path)
            if request.url.path.endswith("/prepare") and seen.count(request.url.path) == 1:
                return JSONResponse({"error": {"code": "x", "detail": "overloaded"}}, status_code=503)
            return await call_next(request)

    app.add_middleware(FlakyOnce)
    with served(app) as url, RemoteParticipant(url, token=TOKEN) as remote:
        report = remote.prepare("ck-1", _soon())
        assert report.ready
    assert seen.count(f"{CHECKPOINT_ROUTE_PREFIX}/prepare") == 2
    participant.close()


def test_an_unreachable_participant_is_named(tmp_path: Path) -> None:
    with served(FastAPI()) as url:
        pass  # the port is closed again: connections are refused
    remote = RemoteParticipant(url, token=TOKEN, attempts=3)
    with pytest.raises(ParticipantUnreachableError, match=f"{url}: prepare failed after 3 tries"):
        remote.prepare("ck-1", _soon())
    patient = RemoteParticipant(url, token=TOKEN, attempts=10_000)  # the deadline stops it first
    with pytest.raises(DeadlineExceededError, match="no answer to prepare before the deadline"):
        patient.prepare("ck-1", time.time() + 0.3)


@contextlib.contextmanager
def _http_deployment(store: LocalStore, dep: Deployment) -> Iterator[Coordinator]:
    """``dep``'s participants each behind a real server; a coordinator over remote participants."""
    with contextlib.ExitStack() as stack:
        remotes = []
        for participant in dep.participants:
            url = stack.enter_context(served(control_app(participant, token=TOKEN, store=store)))
            remotes.append(stack.enter_context(RemoteParticipant(url, token=TOKEN)))
        yield Coordinator(store, remotes, dep.registry, dep.coordinator.token_source, run_id="test-run")


def test_coordinator_checkpoints_and_restores_over_http(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    tokens = FakeTokens(store)
    dep = Deployment(store, token_source=tokens)
    dep.resumable("cont", tokens=tokens)
    dep.completed("done")
    with _http_deployment(store, dep) as coordinator:
        outcome = coordinator.checkpoint("ck-http", deadline_s=30)
        assert outcome.clean and dep.all_open()
    dep.close()
    plan = load_checkpoint(store, "ck-http")
    assert [p.execution for p in plan.continued] == [ex("cont")]
    fresh = Deployment(store, token_source=tokens)  # the crash: new, empty participants
    with _http_deployment(store, fresh) as coordinator:
        restored = coordinator.restore(restore_id="rs-1")
        assert restored.restored["agent/agent-0"] == (ex("cont", 1),)
        assert not fresh.all_open()
        coordinator.resume("rs-1")
        assert fresh.all_open()
        assert all(p.refuses(ex("cont", 0)) for p in fresh.participants)
    fresh.close()


def test_a_stage_of_two_is_prepared_concurrently(tmp_path: Path) -> None:
    """Resources A becomes ready only once B's prepare arrived: sequential calls would wait for
    A's deadline and fail; concurrent calls publish."""
    store = LocalStore(tmp_path / "store")
    a = ScriptedParticipant("resources", "res-a")
    b = ScriptedParticipant("resources", "res-b")
    a.set_blockers(["session-1 mid-mutation"])

    def release_a_when_b_closes() -> None:
        while b.accepting:  # bounded by the test timeout; B closes when its prepare arrives
            time.sleep(0.01)
        a.set_blockers([])

    registry = LiveExecutionRegistry()
    with contextlib.ExitStack() as stack:
        remotes = [
            stack.enter_context(
                RemoteParticipant(
                    stack.enter_context(served(control_app(p, token=TOKEN, store=store))), token=TOKEN
                )
            )
            for p in (a, b)
        ]
        coordinator = Coordinator(store, remotes, registry, run_id="test-run")
        waiter = threading.Thread(target=release_a_when_b_closes, daemon=True)
        waiter.start()
        outcome = coordinator.checkpoint("ck-1", deadline_s=20)
        assert outcome.clean
        waiter.join(5)
        # and a stage that never gets ready fails the checkpoint, naming the participant
        a.set_blockers(["stuck"])
        # a deadline a loaded machine's HTTP round trip cannot outrun (at 1 s, the prepare once
        # arrived after it had passed: deadline_exceeded, not the not-ready failure meant here)
        with pytest.raises(CheckpointNotReadyError, match="resources/res-a"):
            coordinator.checkpoint("ck-2", deadline_s=4)
        assert a.accepting and b.accepting
    a.close()
    b.close()


# -- authentication edge cases (issue 18, D3) ------------------------------------------------------


def test_two_authorization_headers_are_refused_even_right_then_wrong(
    one: tuple[ScriptedParticipant, str, LocalStore],
) -> None:
    _, url, _ = one
    headers = [("Authorization", f"Bearer {TOKEN}"), ("Authorization", "Bearer wrong-but-second")]
    with httpx.Client() as client:
        response = client.get(f"{url}{CHECKPOINT_ROUTE_PREFIX}/status", headers=headers)
        assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"
        good = client.get(f"{url}{CHECKPOINT_ROUTE_PREFIX}/status", headers=_auth())
        assert good.status_code == 200


@pytest.mark.parametrize("token", ["tok-\u00e9t\u00e9-0123456789", "short", "x", "with space 0123456789", ""])
def test_a_server_refuses_a_token_that_is_not_printable_ascii_or_too_short(token: str) -> None:
    with pytest.raises(InvalidValueError) as info:
        control_app(ScriptedParticipant("agent", "agent-0"), token=token)
    assert info.value.code == "invalid_value"
    assert len("tok-0123456789ab") == MIN_TOKEN_LENGTH
    control_app(ScriptedParticipant("agent", "agent-0"), token="tok-0123456789ab")


def test_a_client_refuses_a_token_it_cannot_send() -> None:
    with pytest.raises(InvalidValueError) as info:
        RemoteParticipant("http://127.0.0.1:9", token="tok-\u00e9t\u00e9-0123456789")
    assert info.value.code == "invalid_value"
