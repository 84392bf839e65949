"""The worker group's internal hop: the scope in compact form (``scope_ids``), brief commit
replies, and the executions the group reads from its workers' part manifests instead.

Bad input is a typed error (422 ``invalid_request`` over HTTP) and changes nothing; a part whose
manifest lists malformed executions publishes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from _http import served
from _protocol_fakes import ScriptedParticipant, ex
from rollout_checkpoint.archive import ArchiveWriter
from rollout_checkpoint.errors import (
    CheckpointError,
    IntegrityError,
    InvalidIdentifierError,
    InvalidValueError,
)
from rollout_checkpoint.format import layout
from rollout_checkpoint.format.records import ResourceSnapshotRecord
from rollout_checkpoint.ids import (
    PackedExecutions,
    check_packed_text,
    checked_pairs,
    execution_ids,
    pack_executions,
    pack_text,
    unpack_executions,
)
from rollout_checkpoint.protocol import Capabilities, CommitReply, Phase, new_incarnation
from rollout_checkpoint.server import (
    CHECKPOINT_ROUTE_PREFIX,
    RemoteParticipant,
    WorkerGroup,
    checkpoint_router,
    control_app,
    serve_thread,
)
from rollout_checkpoint.server._merge import commit_parts
from rollout_checkpoint.store import LocalStore, MemoryStore

TOKEN = "tok-worker-wire-secret"

# -- the compact form ------------------------------------------------------------------------------


def test_a_packed_scope_round_trips_in_order() -> None:
    executions = [ex("r-2", 3), ex("a.b_c", 0), ex("r-1", 12), ex("x" * 128, 7)]
    packed = pack_executions(executions)
    assert packed == ["r-2#3", "a.b_c#0", "r-1#12", f"{'x' * 128}#7"]
    unpacked = unpack_executions(packed)
    assert unpacked == executions and [hash(e) for e in unpacked] == [hash(e) for e in executions]
    assert unpack_executions([]) == []
    with pytest.raises(ValidationError):  # built without validation, frozen all the same
        unpacked[0].attempt = 4


def test_a_scope_text_round_trips_and_is_checked_in_one_pass() -> None:
    executions = (ex("r-2", 3), ex("a.b_c", 0), ex("x" * 128, 7))
    text = pack_text(executions)
    assert text == f"r-2#3\na.b_c#0\n{'x' * 128}#7\n" and pack_text(executions) is text  # one tuple, once
    check_packed_text(text)
    packed = PackedExecutions(text=text)
    assert (
        len(packed) == 3 and packed.packed == pack_executions(executions) and list(packed) == list(executions)
    )
    assert pack_text(packed) is text and pack_text(PackedExecutions(packed.packed)) == text
    assert pack_text([]) == "" and len(PackedExecutions(text="")) == 0
    check_packed_text("")
    for bad in ("r1#0\nr2#0", "r1#0\n\n", "\n", "a..b#0\n", f"{'x' * 129}#0\n", "r1#01\n", "r1#0\r\n"):
        with pytest.raises(InvalidIdentifierError):
            check_packed_text(bad)
    with pytest.raises(InvalidIdentifierError):
        check_packed_text(["r1#0"])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PackedExecutions()


def test_unpacked_executions_are_kept_and_shared_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_checkpoint.ids import _compact

    first = unpack_executions(["keep-1#0", "keep-2#5"])
    again = unpack_executions(["keep-1#0", "keep-2#5"])
    assert [a is b for a, b in zip(first, again, strict=True)] == [True, True]  # no model built again
    assert execution_ids([("keep-2", 5)])[0] is first[1]
    monkeypatch.setattr(_compact, "INTERNED_MAX", 3)
    monkeypatch.setattr(_compact, "_largest", 0)
    for i in range(8):  # scopes of one: the bound is INTERNED_MAX
        assert unpack_executions([f"bound-{i}#1"]) == [ex(f"bound-{i}", 1)]
        assert len(_compact._INTERNED) <= 3  # started again instead of growing
    assert unpack_executions(["keep-1#0"]) == [ex("keep-1", 0)]  # rebuilt after the reset
    # a scope larger than the bound stays whole between two unpacks (twice the largest is kept)
    scope = [f"big-{i}#0" for i in range(10)]
    many = unpack_executions(scope)
    assert many == [ex(f"big-{i}", 0) for i in range(10)]
    assert all(a is b for a, b in zip(many, unpack_executions(scope), strict=True))
    assert len(_compact._INTERNED) <= 20


def test_a_packed_scope_is_forwarded_as_it_came_and_unpacked_when_read() -> None:
    packed = [f"fw-{i}#{i % 2}" for i in range(5)]
    scope = PackedExecutions(packed)
    assert len(scope) == 5 and scope._items is None  # counted without unpacking
    assert pack_executions(scope) is packed  # a forwarding hop sends the same strings
    assert scope._items is None
    assert list(scope) == [ex(f"fw-{i}", i % 2) for i in range(5)] and scope[4] == ex("fw-4", 0)
    assert frozenset(scope) == {ex(f"fw-{i}", i % 2) for i in range(5)}


@pytest.mark.parametrize(
    ("items", "problem"),
    [
        (["r1#0", "r2"], "scope[1]"),  # no attempt
        (["r1#-1"], "scope[0]"),  # a negative attempt
        (["r1#01"], "scope[0]"),  # not a canonical decimal
        (["r1#1.0"], "scope[0]"),
        (["#0"], "must not be empty"),
        (["../up#0"], "scope[0] rollout id"),
        (["a..b#0"], "not allowed"),
        (["r1#0\nr2#0"], "scope[0]"),  # two entries in one
        ([f"{'x' * 129}#0"], "129 characters"),
        (["r 1#0"], "not allowed"),
        (["r1#0", 5], "got int"),
    ],
)
def test_a_bad_packed_entry_is_a_typed_error_naming_it(items: list[Any], problem: str) -> None:
    with pytest.raises(InvalidIdentifierError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        unpack_executions(items)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("r1", InvalidValueError),
        ([["r1", 0], ["r2"]], InvalidValueError),
        ([["r1", -1]], InvalidValueError),
        ([["r1", True]], InvalidValueError),
        ([["r1", "0"]], InvalidValueError),
        ([("r1", 0)], InvalidValueError),
        ([["r1", 0], ["../x", 0]], InvalidIdentifierError),
        ([["a\nb", 0]], InvalidIdentifierError),
    ],
)
def test_malformed_manifest_execution_lists_are_typed_errors(raw: Any, error: type[CheckpointError]) -> None:
    with pytest.raises(error):
        checked_pairs(raw, "extra 'executions'")
    assert checked_pairs([["r1", 0], ["r-2", 4]], "x") == [("r1", 0), ("r-2", 4)]


# -- over HTTP: scope_ids and brief replies ---------------------------------------------------------


@pytest.fixture()
def served_one(tmp_path: Path) -> Iterator[tuple[ScriptedParticipant, str, LocalStore]]:
    store = LocalStore(tmp_path / "store")
    participant = ScriptedParticipant("resources", "res-0")
    for rollout_id in ("r1", "r2", "r3"):
        participant.add(_snapshot(rollout_id))
    with served(control_app(participant, token=TOKEN, store=store)) as url:
        yield participant, url, store
    participant.close()


def _post(url: str, route: str, body: Any) -> httpx.Response:
    return httpx.post(
        f"{url}{CHECKPOINT_ROUTE_PREFIX}/{route}",
        content=json.dumps(body),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )


def test_a_remote_commit_sends_the_scope_packed_and_a_brief_reply_lists_no_executions(
    served_one: Any,
) -> None:
    participant, url, store = served_one
    deadline = time.time() + 30
    with RemoteParticipant(url, token=TOKEN) as remote:
        assert remote.prepare("ck-1", deadline).ready
        reply = remote.commit("ck-1", store, deadline, [ex("r1"), ex("r3"), ex("gone")], brief=True)
        assert reply.phase is Phase.COMMITTED and reply.executions == () and reply.restarts == ()
        # the lists are in the manifest the reply pins; the scope limited the export
        manifest = json.loads(store.get(reply.manifest_key or ""))
        assert manifest["extra"]["executions"] == [["r1", 0], ["r3", 0]]
        again = remote.commit("ck-1", store, deadline, [ex("r1"), ex("r3")])  # idempotent, full reply
        assert again.executions == (ex("r1"), ex("r3")) and again.manifest_key == reply.manifest_key
        remote.resume("ck-1", deadline)
    assert participant.is_open()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"scope_ids": ["r1#0", "../x#0"]}, "body.scope_ids"),
        ({"scope_ids": ["r1"]}, "body.scope_ids"),
        ({"scope_ids": "r1#0"}, "body.scope_ids"),
        ({"scope_ids": [1]}, "body.scope_ids"),
        ({"scope_ids": ["r1#0"], "scope": [{"rollout_id": "r1", "attempt": 0}]}, "name the scope once"),
        ({"scope_text": "r1#0\n../x#0\n"}, "body.scope_text"),
        ({"scope_text": "r1#0\nr2#0"}, "body.scope_text"),  # the last entry has no newline
        ({"scope_text": "r1#0\n\n"}, "body.scope_text"),  # an empty entry
        ({"scope_text": "r1\n"}, "body.scope_text"),
        ({"scope_text": "r1#-1\n"}, "body.scope_text"),
        ({"scope_text": ["r1#0"]}, "body.scope_text"),
        ({"scope_text": "r1#0\n", "scope_ids": ["r1#0"]}, "name the scope once"),
        ({"brief": "yes"}, "body.brief"),
    ],
)
def test_a_bad_compact_scope_or_brief_flag_is_422_and_changes_nothing(
    served_one: Any, body: dict[str, Any], field: str
) -> None:
    participant, url, store = served_one
    deadline = time.time() + 30
    assert _post(url, "prepare", {"checkpoint_id": "ck-1", "deadline_ts": deadline}).json()["ready"]
    response = _post(url, "commit", {"checkpoint_id": "ck-1", "deadline_ts": deadline, **body})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and field in error["detail"]
    assert participant.status().phase is Phase.PREPARED  # nothing committed
    assert not store.exists(layout.component_prefix("ck-1", "resources", "res-0") + "/manifest.json")
    _post(url, "resume", {"checkpoint_id": "ck-1", "deadline_ts": deadline})


def test_a_remote_commit_sends_the_scope_as_one_text(
    served_one: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    participant, url, store = served_one
    seen: list[Any] = []
    commit = participant.commit

    def spied(checkpoint_id: str, store_: Any, deadline: float, scope: Any = None, **kwargs: Any) -> Any:
        seen.append(scope)
        return commit(checkpoint_id, store_, deadline, scope, **kwargs)

    monkeypatch.setattr(participant, "commit", spied)
    deadline = time.time() + 30
    with RemoteParticipant(url, token=TOKEN) as remote:
        assert remote.prepare("ck-1", deadline).ready
        reply = remote.commit("ck-1", store, deadline, [ex("r3"), ex("r1", 0)])
        assert reply.executions == (ex("r1"), ex("r3"))
        remote.resume("ck-1", deadline)
    (scope,) = seen
    assert isinstance(scope, PackedExecutions) and scope.text == "r3#0\nr1#0\n" and len(scope) == 2
    assert list(scope) == [ex("r3"), ex("r1")]


def test_a_server_that_refuses_scope_text_is_sent_scope_ids(tmp_path: Path) -> None:
    """A server of an older version forbids the unknown field (422 ``invalid_request`` naming
    ``body.scope_text``, nothing applied): the client asks again with ``scope_ids``, and keeps
    doing so for that server."""
    store = LocalStore(tmp_path / "store")
    participant = ScriptedParticipant("resources", "res-0")
    participant.add(_snapshot("r1"))
    bodies: list[dict[str, Any]] = []
    app = control_app(participant, token=TOKEN, store=store)

    @app.middleware("http")
    async def older_server(request: Any, call_next: Any) -> Any:
        if request.url.path.endswith("/commit"):
            body = json.loads(await request.body())
            bodies.append(body)
            if "scope_text" in body:
                from fastapi.responses import JSONResponse

                detail = "body.scope_text: Extra inputs are not permitted"
                return JSONResponse({"error": {"code": "invalid_request", "detail": detail}}, status_code=422)
        return await call_next(request)

    with served(app) as url, RemoteParticipant(url, token=TOKEN) as remote:
        for cid in ("ck-1", "ck-2"):
            deadline = time.time() + 30
            assert remote.prepare(cid, deadline).ready
            reply = remote.commit(cid, store, deadline, [ex("r1")])
            assert reply.phase is Phase.COMMITTED and reply.executions == (ex("r1"),)
            remote.resume(cid, deadline)
    assert [sorted(k for k in b if k.startswith("scope")) for b in bodies] == [
        ["scope_text"],
        ["scope_ids"],
        ["scope_ids"],  # remembered: the second checkpoint asks once
    ]
    participant.close()


def test_a_worker_group_over_http_answers_briefly_when_asked_and_lists_in_its_manifest(
    tmp_path: Path,
) -> None:
    """coordinator -> group (router over the group) -> workers: brief on every hop when asked;
    the lists are in the component manifest, and a full reply is still one call away."""
    store = LocalStore(tmp_path / "store")
    group = WorkerGroup(store, expected_workers=2, token=TOKEN)
    workers = [ScriptedParticipant("resources", "res-0") for _ in range(2)]
    with contextlib.ExitStack() as stack:
        for i, worker in enumerate(workers):
            worker.add(_snapshot(f"w{i}-r"))
            app = FastAPI()
            app.include_router(checkpoint_router(worker, token=TOKEN))
            sock = str(tmp_path / f"w{i}.sock")
            stack.enter_context(serve_thread(app, uds=sock))
            group.register(f"w{i}", sock, os.getpid(), worker.capabilities())
        url = stack.enter_context(served(control_app(group, token=TOKEN, store=store)))
        brief = stack.enter_context(RemoteParticipant(url, token=TOKEN, brief_commits=True))
        full = stack.enter_context(RemoteParticipant(url, token=TOKEN))
        deadline = time.time() + 30
        assert brief.prepare("ck-1", deadline).ready
        reply = brief.commit("ck-1", store, deadline, [ex("w0-r"), ex("w1-r")])
        assert reply.phase is Phase.COMMITTED and reply.executions == ()
        extra = json.loads(store.get(reply.manifest_key or ""))["extra"]
        assert extra["executions"] == [["w0-r", 0], ["w1-r", 0]]
        assert extra["session_owners"] == {"w0": [["w0-r", 0]], "w1": [["w1-r", 0]]}
        again = full.commit("ck-1", store, deadline, [ex("w0-r"), ex("w1-r")])
        assert again.executions == (ex("w0-r"), ex("w1-r")) and again.manifest_key == reply.manifest_key
        brief.resume("ck-1", deadline)
        group.close()
    for worker in workers:
        worker.close()


# -- the group reads the executions from its parts' manifests ---------------------------------------

CAPS = Capabilities(kind="resources", instance="res-0", mode="exported", topology="coordinated_workers")


def _snapshot(rollout_id: str) -> ResourceSnapshotRecord:
    return ResourceSnapshotRecord(
        rollout_id=rollout_id, attempt=0, session_id="s", revision=1, codec="json", state=b"{}"
    )


def _part(store: MemoryStore, worker: str, extra: dict[str, Any]) -> CommitReply:
    prefix = layout.component_part_prefix("ck-1", "resources", "res-0", worker)
    writer = ArchiveWriter(
        store, prefix, checkpoint_id="ck-1", participant_kind="resources", instance="res-0"
    )
    writer.write(_snapshot(f"{worker}-r"))
    writer.commit(extra=extra)
    ref = writer.manifest_ref
    return CommitReply(
        checkpoint_id="ck-1",
        phase=Phase.COMMITTED,
        kind="resources",
        instance="res-0",
        manifest_key=ref.key,
        manifest_sha256=ref.sha256,
        manifest_bytes=ref.bytes,
        incarnation=new_incarnation(),
    )


def _commit(store: MemoryStore, replies: dict[str, CommitReply]) -> Any:
    return commit_parts(store, "ck-1", CAPS, replies, lambda: None, threading.Condition())


def test_the_group_takes_executions_and_owners_from_the_parts_manifests() -> None:
    store = MemoryStore("worker-wire-ok")
    replies = {
        "w0": _part(store, "w0", {"executions": [["w0-r", 0]], "restarts": [["z", 1]]}),
        "w1": _part(store, "w1", {"executions": [["w1-r", 0]], "restarts": []}),
    }
    parts = _commit(store, replies)
    assert parts.executions == [("w0-r", 0), ("w1-r", 0)] and parts.restarts == [("z", 1)]
    extra = json.loads(store.get(parts.ref.key))["extra"]
    assert extra["executions"] == [["w0-r", 0], ["w1-r", 0]] and extra["restarts"] == [["z", 1]]
    assert extra["session_owners"] == {"w0": [["w0-r", 0], ["z", 1]], "w1": [["w1-r", 0]]}


@pytest.mark.parametrize(
    "extra",
    [
        {"restarts": []},  # no executions list
        {"executions": [["w1-r", 0]]},  # no restarts list
        {"executions": [["../w1-r", 0]], "restarts": []},
        {"executions": [["w1-r", -1]], "restarts": []},
        {"executions": "w1-r#0", "restarts": []},
    ],
)
def test_a_part_listing_malformed_executions_publishes_nothing(extra: dict[str, Any]) -> None:
    store = MemoryStore(f"worker-wire-{abs(hash(json.dumps(extra)))}")
    replies = {
        "w0": _part(store, "w0", {"executions": [["w0-r", 0]], "restarts": []}),
        "w1": _part(store, "w1", extra),
    }
    with pytest.raises(IntegrityError, match="parts/w1: extra"):
        _commit(store, replies)
    assert not store.exists(layout.component_prefix("ck-1", "resources", "res-0") + "/manifest.json")
