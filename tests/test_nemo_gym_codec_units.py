"""The tool-server codecs, the binary snapshot payload and the spec-safety refusals, in process
(Gym's real classes and apps; the real-process tests are in ``test_nemo_gym_tool_servers.py``)."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from _gym import require_gym

require_gym()

from resources_servers.example_session_state_mgmt.app import StatefulCounterResourcesServer  # noqa: E402
from resources_servers.workplace_assistant.app import WorkbenchResourcesServer  # noqa: E402
from resources_servers.workplace_assistant.utils import get_tools  # noqa: E402
from responses_api_agents.gymnasium_agent.app import GymnasiumAgent  # noqa: E402

from _gym_specs import WORKPLACE_VERIFY_AS_READ  # noqa: E402
from rollout_checkpoint.errors import InvalidArgumentError, InvalidRecordError  # noqa: E402
from rollout_checkpoint.format.binary_payloads import MAGIC, binary_payload  # noqa: E402
from rollout_checkpoint.format.records import ResourceSnapshotRecord, decode_record  # noqa: E402
from rollout_checkpoint.integrations.nemo_gym import (  # noqa: E402
    WorkplaceAssistantCodec,
    attach,
    checkpointed,
    is_checkpointed,
)
from rollout_checkpoint.integrations.nemo_gym.codecs import JsonEnvironmentCodec, MultiTurnCodec  # noqa: E402
from rollout_checkpoint.integrations.nemo_gym.model import ScriptedResponsesModel  # noqa: E402

TOOLKITS = ["email", "calendar", "analytics", "project_management", "customer_relationship_manager"]


def _cells(frame: Any) -> dict[str, list[Any]]:
    """Every cell with its exact type (``None`` and ``NaN`` apart)."""
    return {
        str(c): [
            ("nan",) if isinstance(v, float) and math.isnan(v) else (type(v).__name__, v) for v in frame[c]
        ]
        for c in frame.columns
    }


def test_workplace_sessions_round_trip_exactly_through_parquet_and_gyms_factory() -> None:
    codec = WorkplaceAssistantCodec()
    env = get_tools(TOOLKITS)
    f = env["functions"]
    f["email_send_email"](recipient="a@atlas.com", subject="s", body="b")
    f["calendar_create_event"](
        event_name="e", participant_email="a@atlas.com", event_start="2023-12-01 10:00:00", duration="30"
    )  # calendar concatenates without ignore_index: index 0 twice
    f["customer_relationship_manager_add_customer"](
        customer_name="Z", assigned_to_email="a@atlas.com"
    )  # None cells
    crm = env["containers"]["customer_relationship_manager"]._crm_data
    crm["notes"] = crm["notes"].astype(object)
    crm.loc[0, "notes"] = 42  # a cell that is not a string: kept as JSON text, back as an int
    data = codec.encode(env)
    head, _, body = data.partition(b"\n")
    assert body.startswith(b"PAR1") and len(head) < 2000  # Parquet files after a short header, no JSON data
    back = codec.decode(data)
    for tool, container in env["containers"].items():
        for attr, frame in vars(container).items():
            restored = getattr(back["containers"][tool], attr)
            assert list(restored.dtypes) == list(frame.dtypes), (tool, attr)
            assert restored.index.equals(frame.index) and type(restored.index) is type(frame.index)
            assert _cells(restored) == _cells(frame), (tool, attr)
    assert codec.encode(back) == data  # deterministic
    # the functions are Gym's bound methods of the rebuilt tools
    assert back["functions"]["email_search_emails"].__self__ is back["containers"]["email"]
    assert back["functions"]["calendar_search_events"](query="e") == f["calendar_search_events"](query="e")
    assert len(data) * 3 < len(
        json.dumps(
            {t: {a: v.to_dict("split") for a, v in vars(c).items()} for t, c in env["containers"].items()},
            default=str,
        )
    )


def test_the_workplace_codec_refuses_state_gym_does_not_keep() -> None:
    codec = WorkplaceAssistantCodec()
    env = get_tools(TOOLKITS)
    data = codec.encode(env)
    env["containers"]["email"].cache = {}  # a Gym whose tool grew state nobody audited
    with pytest.raises(ValueError, match="holds"):
        codec.encode(env)
    head, _, body = data.partition(b"\n")
    for bad in (data[:-10], b"{}\n" + body, head.replace(b"parquet-1", b"parquet-9") + b"\n" + body, body):
        with pytest.raises(ValueError):
            codec.decode(bad)


def test_multi_turn_and_json_environment_codecs_refuse_what_they_would_not_restore_exactly() -> None:
    turns = MultiTurnCodec()
    assert turns.decode(turns.encode(3)) == 3
    for bad in (b'{"turn": -1}', b'{"turn": 1, "x": 2}', b'{"turn": "1"}'):
        with pytest.raises(ValueError):
            turns.decode(bad)
    env = JsonEnvironmentCodec("ipi")
    state = {"patients": {"P2": {"notes": "a"}, "P1": {}}, "messages": [1.5, None, True]}
    back = env.decode(env.encode(state))
    assert back == state and list(back["patients"]) == ["P2", "P1"]  # key order kept
    for bad_state in ({"s": {1, 2}}, {"t": (1,)}, {"n": math.nan}, {1: "x"}):
        with pytest.raises((TypeError, ValueError)):
            env.encode(bad_state)


def test_a_binary_snapshot_payload_decodes_to_the_same_record_and_malformed_ones_are_refused() -> None:
    header = {
        "schema_version": 1,
        "rollout_id": "r1",
        "attempt": 0,
        "session_id": "s1",
        "revision": 4,
        "codec": "c",
    }
    raw = b"\x00PAR1\xff raw bytes"
    payload = binary_payload("resource_snapshot", header, raw)
    assert payload.startswith(MAGIC)
    record = decode_record("resource_snapshot", payload)
    assert record == ResourceSnapshotRecord(**header, state=raw)
    assert decode_record("resource_snapshot", record.to_payload()) == record  # the JSON form still reads
    for bad in (payload[:8], MAGIC + b"\x00\x00\x00\x02{}", MAGIC + b"\xff\xff\xff\xff{}"):
        with pytest.raises(InvalidRecordError):
            decode_record("resource_snapshot", bad)
    with pytest.raises(InvalidRecordError):
        decode_record("agent_boundary", payload)  # no binary form for other kinds
    with pytest.raises(ValueError):
        binary_payload("agent_boundary", header, raw)


def _workplace_app(store: str, spec: Any = True) -> tuple[Any, Any, Any]:
    from fastapi.testclient import TestClient

    server = WorkbenchResourcesServer.model_construct(
        session_id_to_tool_env={}, config=SimpleNamespace(name="wa")
    )
    app = server.setup_webserver()
    participant = attach(server, app, token="workplace-test-token-0123456789", store=store, spec=spec)
    return server, participant, TestClient(app)


def test_attaching_twice_or_checkpointing_a_checkpointed_class_is_refused(tmp_path: Path) -> None:
    server, _, _ = _workplace_app(str(tmp_path))
    app = server.setup_webserver()
    attach(server, app, token="workplace-test-token-0123456789", store=str(tmp_path))
    with pytest.raises(InvalidArgumentError, match="already has a checkpoint participant"):
        attach(server, app, token="workplace-test-token-0123456789", store=str(tmp_path))
    once = checkpointed(StatefulCounterResourcesServer)
    assert is_checkpointed(once) and not is_checkpointed(StatefulCounterResourcesServer)
    with pytest.raises(InvalidArgumentError, match="already checkpointed"):
        checkpointed(once)


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        (GymnasiumAgent, "CheckpointedGymnasiumAgent"),
        (GymnasiumAgent, "CheckpointedSimpleAgent"),
        (ScriptedResponsesModel, "checkpointed policy model server"),
    ],
)
def test_agents_and_model_servers_are_refused_naming_what_checkpoints_them(
    tmp_path: Path, cls: Any, names: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=names):
        checkpointed(cls)
    with pytest.raises(InvalidArgumentError, match=names):
        attach(cls.model_construct(), object(), token="t" * 32, store=str(tmp_path))


def test_a_read_route_that_drops_the_session_ends_it_with_a_warning_naming_the_route(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = str(tmp_path / "store")
    server, participant, client = _workplace_app(store, spec=WORKPLACE_VERIFY_AS_READ)
    base = "/ng-rollout/v1"
    assert client.post(f"{base}/seed_session", json={}).status_code == 200
    sent = client.post(
        f"{base}/email_send_email", json={"recipient": "a@atlas.com", "subject": "s", "body": "b"}
    )
    assert sent.headers["x-rc-revision"] == "1"
    body = {
        "responses_create_params": {"input": "x"},
        "ground_truth": [],
        "id": 1,
        "category": "email",
        "environment_name": "workbench",
        "response": {
            "id": "r",
            "created_at": 0,
            "model": "m",
            "object": "response",
            "output": [],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
        },
    }
    with caplog.at_level(logging.WARNING):
        assert client.post(f"{base}/verify", json=body).status_code == 200  # Gym's verify pops the session
    assert "read route /verify dropped session" in caplog.text
    assert server.session_id_to_tool_env == {}
    deadline = time.time() + 30
    assert participant.prepare("ck-v", deadline).ready
    reply = participant.commit("ck-v", store, deadline)
    assert reply.executions == () and reply.restarts == ()  # nothing to continue: the session ended
    participant.resume("ck-v", deadline)
