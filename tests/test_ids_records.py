"""Identifier validation, execution identity and record models."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_checkpoint.errors import InvalidIdentifierError, InvalidRecordError, UnsupportedSchemaError
from rollout_checkpoint.format.layout import component_prefix, published_key
from rollout_checkpoint.format.records import (
    RECORD_SCHEMA_VERSION,
    RECORD_TYPES,
    AgentBoundaryRecord,
    CompletedResultRecord,
    DispatchRecord,
    ModelCallLineageRecord,
    OutputChunkRecord,
    ResourceSnapshotRecord,
    TokenStoreReceipt,
    decode_record,
)
from rollout_checkpoint.ids import ExecutionId, validate_id, validate_key

BAD_IDS = [
    "",
    "a/b",
    "..",
    "a..b",
    "-lead",
    ".hidden",
    "a\x00b",
    "tab\there",
    "x" * 129,
    "é",
    "a b",
    "a\\b",
    "trailing\n",
    "r1\r\n",
]


@pytest.mark.parametrize("value", BAD_IDS)
def test_bad_ids_refused(value: str) -> None:
    with pytest.raises(InvalidIdentifierError) as info:
        validate_id(value)
    assert info.value.code == "invalid_id"


@pytest.mark.parametrize("value", ["r1", "rollout-0.a_b", "A" * 128, "0"])
def test_good_ids_pass(value: str) -> None:
    assert validate_id(value) == value


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "a/./b", "trail/", "a\nb", "a\\b"])
def test_bad_keys_refused(key: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        validate_key(key)


def test_layout_validates_every_id() -> None:
    assert published_key("c1") == "published/c1.json"
    assert component_prefix("c1", "agent", "a0") == "checkpoints/c1/components/agent/a0"
    with pytest.raises(InvalidIdentifierError):
        published_key("../etc")
    with pytest.raises(InvalidIdentifierError):
        component_prefix("c1", "agent", "a/0")


def test_execution_identity() -> None:
    e = ExecutionId(rollout_id="r", attempt=0)
    assert e.capture_key == "r"
    n = e.next_attempt()
    assert (n.rollout_id, n.attempt, n.capture_key) == ("r", 1, "r-a1")
    with pytest.raises(ValueError):
        ExecutionId(rollout_id="r/x", attempt=0)
    with pytest.raises(ValueError):
        ExecutionId(rollout_id="r", attempt=-1)


def _samples() -> list:
    return [
        AgentBoundaryRecord(
            rollout_id="r",
            attempt=1,
            boundary_index=3,
            turn_index=2,
            last_model_call_id="c7",
            resource_revisions={"env": {"s": 4}},
            output_items=[{"role": "assistant", "content": "hi"}],
            usage={"input_tokens": 5},
            agent_state=b"\x00\xffstate",
        ),
        ResourceSnapshotRecord(
            rollout_id="r", attempt=1, session_id="s", revision=4, codec="json", state=b"{}"
        ),
        ModelCallLineageRecord(
            rollout_id="r", attempt=1, call_id="c7", parent_call_id="c6", policy_version="v3"
        ),
        TokenStoreReceipt(
            rollout_id="r", attempt=1, store="s3", snapshot_id="snap", key="k", digest="d", length=3
        ),
        CompletedResultRecord(rollout_id="r", attempt=0, result={"reward": 1.0}, reward=1.0),
        DispatchRecord(rollout_id="r", attempt=1, state="running", input_digest="abc"),
        OutputChunkRecord(rollout_id="r", attempt=1, first_item=3, items=[{"role": "user"}, "x"]),
    ]


@pytest.mark.parametrize("record", _samples(), ids=lambda r: r.kind)
def test_record_round_trip_and_newer_schema_refused(record) -> None:
    payload = record.to_payload()
    assert decode_record(record.kind, payload) == record
    data = json.loads(payload)
    data["schema_version"] = type(record).newest_schema_version + 1
    with pytest.raises(UnsupportedSchemaError) as info:
        decode_record(record.kind, json.dumps(data))
    assert info.value.code == "unsupported_schema"


def test_records_cover_every_kind_and_refuse_garbage() -> None:
    assert set(RECORD_TYPES) == {r.kind for r in _samples()}
    with pytest.raises(InvalidRecordError):
        decode_record("nope", b"{}")
    with pytest.raises(InvalidRecordError):
        decode_record("dispatch", b"not json")
    with pytest.raises(InvalidRecordError):
        decode_record("dispatch", b'{"rollout_id": "r", "attempt": 0, "state": "bogus"}')
    with pytest.raises(InvalidRecordError):
        decode_record("dispatch", b'{"rollout_id": "r", "attempt": 0, "state": "queued", "extra": 1}')


def test_index_refs_name_cross_component_references() -> None:
    boundary, snapshot, lineage, receipt, *_ = _samples()
    assert boundary.index_refs() == {
        "model_call": "c7",
        "pending_model_call": None,
        "resources": {"env": {"s": 4}},
    }
    assert boundary.index_revision() == 3
    assert snapshot.index_revision() == 4
    assert lineage.index_refs() == {"parent": "c6", "token_key": None}
    assert receipt.index_refs()["digest"] == "d"


@given(st.binary(max_size=256), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True))
def test_opaque_bytes_survive_json(state: bytes, session: str) -> None:
    if ".." in session:
        return
    rec = ResourceSnapshotRecord(
        rollout_id="r", attempt=0, session_id=session, revision=0, codec="raw", state=state
    )
    assert decode_record(rec.kind, rec.to_payload()).state == state  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", ['"2"', "2.0", str(RECORD_SCHEMA_VERSION + 7)])
def test_newer_schema_refused_whatever_its_json_type(version: str) -> None:
    # pydantic's lax mode would turn "2" or 2.0 into 2: a newer record must not slip through
    payload = '{"rollout_id": "r", "attempt": 0, "state": "queued", "schema_version": ' + version + "}"
    with pytest.raises(UnsupportedSchemaError):
        decode_record("dispatch", payload)


def test_records_are_json_never_pickles() -> None:
    import ast
    from pathlib import Path

    import rollout_checkpoint

    for record in _samples():
        payload = record.to_payload()
        assert isinstance(json.loads(payload), dict)  # plain JSON; bytes fields as base64 text
        assert not payload.startswith(b"\x80")  # no pickle protocol header
    boundary = _samples()[0]
    assert base64.b64decode(json.loads(boundary.to_payload())["agent_state"]) == boundary.agent_state
    # arbitrary Python objects are refused, not serialised some other way
    with pytest.raises(ValueError):
        AgentBoundaryRecord(
            rollout_id="r", attempt=0, boundary_index=0, turn_index=0, output_items=[object()]
        )
    with pytest.raises(ValueError):
        ResourceSnapshotRecord(
            rollout_id="r", attempt=0, session_id="s", revision=0, codec="c", state=object()
        )
    # and nothing in the package can unpickle
    banned = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
    src = Path(rollout_checkpoint.__file__).parent
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not {n.split(".")[0] for n in names} & banned, path


def test_deliberate_errors_are_checkpoint_errors_with_a_code() -> None:
    """Issue 18, item 9: a bad execution id and a duplicate participant are typed errors."""
    from _protocol_fakes import ScriptedParticipant, memory_store
    from rollout_checkpoint.coordinator import Coordinator
    from rollout_checkpoint.errors import CheckpointError
    from rollout_checkpoint.registry import LiveExecutionRegistry

    for data, code in [
        ({"rollout_id": "a/b", "attempt": 0}, "invalid_id"),
        ({"rollout_id": "a", "attempt": -1}, "invalid_value"),
    ]:
        with pytest.raises(CheckpointError) as info:
            ExecutionId(**data)
        assert info.value.code == code
    agent = ScriptedParticipant("agent", "agent-0")
    with pytest.raises(CheckpointError) as dup:
        Coordinator(memory_store("dup"), [agent, agent], LiveExecutionRegistry())
    assert dup.value.code == "invalid_argument" and "unique" in dup.value.message
