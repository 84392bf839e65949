"""The columnar export path: every record kind's pre-encoded batch decodes to the same model as
the per-record path (payload, member key, revision, index refs), hypothesis-generated states
included; what the models validated is still refused, in bulk; and an export never changes
after ``_export`` returned, whatever the participant does next (no aliasing of live state)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_checkpoint.archive import ArchiveWriter
from rollout_checkpoint.errors import CheckpointError, InvalidRecordError
from rollout_checkpoint.format import ArchiveReader, layout
from rollout_checkpoint.format.chunks import assemble_boundaries, component_records
from rollout_checkpoint.format.columnar import RecordBatch, RecordBatches, encode_docs
from rollout_checkpoint.format.records import (
    AgentBoundaryRecord,
    CompletedResultRecord,
    DispatchRecord,
    GenerationCut,
    ModelCallLineageRecord,
    Record,
    ResourceSnapshotRecord,
    TokenStoreReceipt,
    decode_record,
)
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import AgentParticipant, PolicyModelParticipant, ResourcesParticipant
from rollout_checkpoint.participants._boundaries import SavedBoundary, boundary_batch
from rollout_checkpoint.participants.environments import BlackjackEnvironment, make_participant
from rollout_checkpoint.participants.model._export import lineage_batch, receipt_batch
from rollout_checkpoint.participants.resources import snapshot_batch, snapshot_payload
from rollout_checkpoint.protocol import Export, Participant
from rollout_checkpoint.protocol._component import write_component
from rollout_checkpoint.registry import LiveExecutionRegistry, RegistryEntry
from rollout_checkpoint.registry._entries import _Entry, registry_batches
from rollout_checkpoint.store import MemoryStore
from rollout_checkpoint.tokens import ObjectStoreTokenStore
from rollout_checkpoint.tokens._store import _canonical_json

H64 = "a" * 64


def ex(rollout: str, attempt: int = 0) -> ExecutionId:
    return ExecutionId(rollout_id=rollout, attempt=attempt)


def soon() -> float:
    return time.time() + 30


def assert_batch_matches(batch: RecordBatch, expected: Sequence[Record]) -> None:
    """Each member decodes to the per-record model, with the per-record path's key, revision, refs."""
    assert {batch.kind} == {r.kind for r in expected}
    assert len(batch) == len(expected)
    assert list(batch.records()) == list(expected)
    assert list(batch.keys) == [r.record_key for r in expected]
    assert list(batch.rollout_ids) == [r.rollout_id for r in expected]
    assert list(batch.attempts) == [r.attempt for r in expected]
    assert list(batch.revisions or [None] * len(batch)) == [r.index_revision() for r in expected]
    assert list(batch.refs or [None] * len(batch)) == [r.index_refs() for r in expected]
    for payload, record in zip(batch.payloads, expected, strict=True):
        # the same JSON document as the model writes (a null pending call may be left out)
        doc, model_doc = json.loads(payload), json.loads(record.to_payload())
        assert {**model_doc, **doc} == model_doc
        assert set(model_doc) - set(doc) <= {"pending_model_call_id"}


def members(store: MemoryStore, prefix: str) -> list[tuple[Any, ...]]:
    reader = ArchiveReader.open(store, prefix)
    reader.verify()
    return sorted(
        (m.kind, m.rollout_id, m.attempt, m.key, m.revision, json.dumps(m.refs, sort_keys=True))
        for m in reader.members()
    )


def archive_both_ways(records: Sequence[Record], batches: Sequence[RecordBatch]) -> None:
    """The per-record archive and the columnar one hold the same members and records."""
    store = MemoryStore(f"t-{time.time_ns()}")
    lock = threading.Condition()
    write_component(
        store, "c1", "agent", "per-record", list(records), {}, lock=lock, check_active=lambda: None
    )
    write_component(
        store, "c1", "agent", "columnar", RecordBatches(batches), {}, lock=lock, check_active=lambda: None
    )
    per_record = layout.component_prefix("c1", "agent", "per-record")
    columnar = layout.component_prefix("c1", "agent", "columnar")
    assert members(store, per_record) == members(store, columnar)
    key = lambda r: (r.kind, r.rollout_id, r.attempt, r.record_key)  # noqa: E731
    assert sorted(ArchiveReader.open(store, columnar).iter_records(), key=key) == sorted(records, key=key)


# -- every record kind, fixed examples ---------------------------------------------------------------


def test_agent_boundaries_round_trip_with_and_without_an_awaited_call() -> None:
    plain = AgentBoundaryRecord(
        rollout_id="r1",
        attempt=2,
        boundary_index=7,
        turn_index=3,
        last_model_call_id="call-6",
        resource_revisions={"env-a": {"s1": 3, "s2": 0}, "env-b": {}},
        output_items=[{"role": "assistant", "content": 'é "quoted" \n'}, 1.5, None, [True]],
        usage={"input_tokens": 10},
        cookies={"session": "abc"},
        agent_state=b"\x00\xff\xfe binary",
    )
    restored = plain.model_copy(update={"rollout_id": "r2", "pending_model_call_id": "old-call"})
    saved = [
        SavedBoundary.of(plain),
        SavedBoundary.of(plain),
        SavedBoundary.of(restored),
        SavedBoundary.of(restored),
    ]
    awaiting = [None, "call-7", None, "call-8"]
    batch = boundary_batch(list(zip(saved, awaiting, strict=True)))
    expected = [
        plain,
        plain.model_copy(update={"pending_model_call_id": "call-7"}),
        restored,
        restored.model_copy(update={"pending_model_call_id": "call-8"}),
    ]
    assert_batch_matches(batch, expected)
    assert [s.record() for s in saved] == [plain, plain, restored, restored]
    archive_both_ways(expected[:1] + expected[2:3], [boundary_batch([(saved[0], None), (saved[2], None)])])


def test_resource_snapshots_round_trip() -> None:
    sessions = [(ex("r1"), "s1", 0), (ex("r1", 3), "s2", 9)]
    states = [b'{"a":1}', bytes(range(256))]
    payloads = [snapshot_payload(e, s, r, "json", d) for (e, s, r), d in zip(sessions, states, strict=True)]
    batch = snapshot_batch("json", sessions, payloads)
    expected = [
        ResourceSnapshotRecord(
            rollout_id=e.rollout_id, attempt=e.attempt, session_id=s, revision=r, codec="json", state=d
        )
        for (e, s, r), d in zip(sessions, states, strict=True)
    ]
    assert_batch_matches(batch, expected)
    archive_both_ways(expected, [batch])


def _cut(count: int) -> GenerationCut:
    return GenerationCut(
        cut_kind="active_prefix",
        frozen_buffer_id=f"buf:{count}",
        prefix_token_count=count,
        prefix_digest=H64,
        receipt_key=f"r1/a0/call-{count}",
        receipt_digest="b" * 64,
        receipt_length=100 + count,
    )


def test_model_lineage_and_receipts_round_trip() -> None:
    delivered = ModelCallLineageRecord(
        rollout_id="r1", attempt=0, call_id="c1", policy_version="v1", token_key="r1/a0/c1"
    )
    continued = ModelCallLineageRecord(
        rollout_id="r1",
        attempt=1,
        call_id="c2",
        parent_call_id="c1",
        policy_version="v2",
        token_key="r1/a1/c2",
        continued_from=_cut(3),
    )
    pending = ModelCallLineageRecord(
        rollout_id="r1",
        attempt=1,
        call_id="call-4",
        parent_call_id="c2",
        policy_version="v2",
        token_key=_cut(4).receipt_key,
        cut=_cut(4),
    )
    calls = [delivered, continued, pending]
    # payloads built at delivery and built at export give the same members
    from rollout_checkpoint.participants.model._export import lineage_payload

    for encoded in ([None, None, None], [lineage_payload(delivered), lineage_payload(continued), None]):
        assert_batch_matches(lineage_batch(calls, encoded), calls)
    receipts = [(ex("r1"), "r1/a0/c1", H64, 12), (ex("r1", 1), "r1/a1/c2", "c" * 64, 0)]
    batch = receipt_batch("memory://tokens", "ckpt-1", receipts)
    expected = [
        TokenStoreReceipt(
            rollout_id=e.rollout_id,
            attempt=e.attempt,
            store="memory://tokens",
            snapshot_id="ckpt-1",
            key=k,
            digest=d,
            length=n,
        )
        for e, k, d, n in receipts
    ]
    assert_batch_matches(batch, expected)
    archive_both_ways(calls + expected, [lineage_batch(calls, [None] * 3), batch])


def test_registry_dispatch_and_results_round_trip() -> None:
    result = CompletedResultRecord(rollout_id="r1", attempt=0, result={"x": [1, 2.5, "é"]}, reward=0.25)
    entries = [
        _Entry("r1", 0, "handed_off", "digest-1", False, result),
        _Entry("r2", 3, "queued", None, True, None),
    ]
    dispatch, completed = registry_batches(entries)
    assert_batch_matches(
        dispatch,
        [
            DispatchRecord(rollout_id="r1", attempt=0, state="handed_off", input_digest="digest-1"),
            DispatchRecord(rollout_id="r2", attempt=3, state="queued", restart_only=True),
        ],
    )
    assert_batch_matches(completed, [result])


def test_registry_component_reads_back_as_the_registry() -> None:
    registry = LiveExecutionRegistry()
    e = registry.dispatch("r1", input_digest="in-1")
    registry.start(e)
    registry.finish(e)
    registry.hand_off(e, {"answer": 42}, reward=1.0)
    registry.dispatch("r2", restart_only=True)
    store = MemoryStore(f"t-{time.time_ns()}")
    _, ref = registry.write_component(store, "c1")
    reader = ArchiveReader.open(store, ref.key.rsplit("/", 1)[0])
    reader.verify()
    got = {(r.kind, r.rollout_id): r for r in reader.iter_records()}
    assert got[("dispatch", "r2")] == DispatchRecord(
        rollout_id="r2", attempt=0, state="queued", restart_only=True
    )
    assert got[("completed_result", "r1")] == CompletedResultRecord(
        rollout_id="r1", attempt=0, result={"answer": 42}, reward=1.0
    )
    assert {m.kind: m.refs for m in reader.members(kind="dispatch")}["dispatch"] is not None


def test_encoding_falls_back_to_json_for_integers_orjson_refuses() -> None:
    record = CompletedResultRecord(rollout_id="r1", attempt=0, result=[1 << 70])
    (payload,) = encode_docs([{"schema_version": 1, "rollout_id": "r1", "attempt": 0, "result": [1 << 70]}])
    assert decode_record("completed_result", payload) == record


def test_token_snapshot_bytes_are_the_canonical_json_of_before() -> None:
    body = {"b": {"é": 1, "a": [1, None, "x\n\u0001"]}, "a": "/tmp/ü"}
    legacy = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert _canonical_json(body) == legacy


# -- fail closed, in bulk ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: snapshot_batch("json", [(ex("r1"), "bad/id", 0)], [b"{}"]),
        lambda: snapshot_batch("json", [(ex("r1"), "s1", -1)], [b"{}"]),
        lambda: snapshot_batch("", [(ex("r1"), "s1", 0)], [b"{}"]),
        lambda: snapshot_batch("x" * 129, [(ex("r1"), "s1", 0)], [b"{}"]),
        lambda: receipt_batch("", "c1", [(ex("r1"), "k", H64, 1)]),
        lambda: receipt_batch("s", "bad id", [(ex("r1"), "k", H64, 1)]),
        lambda: receipt_batch("s", "c1", [(ex("r1"), "", H64, 1)]),
        lambda: receipt_batch("s", "c1", [(ex("r1"), "k" * 513, H64, 1)]),
        lambda: receipt_batch("s", "c1", [(ex("r1"), "k", "", 1)]),
        lambda: receipt_batch("s", "c1", [(ex("r1"), "k", H64, -1)]),
        lambda: receipt_batch("s", "c1", [(ex("r1"), "k", H64, True)]),
        lambda: boundary_batch(
            [
                (
                    SavedBoundary.of(
                        AgentBoundaryRecord(rollout_id="r", attempt=0, boundary_index=0, turn_index=0)
                    ),
                    "bad call",
                )
            ]
        ),
        lambda: RecordBatch(kind="nope", rollout_ids=(), attempts=(), keys=(), payloads=()),
        lambda: RecordBatch(
            kind="dispatch", rollout_ids=("r1",), attempts=(), keys=("k",), payloads=(b"{}",)
        ),
    ],
)
def test_bulk_checks_refuse_what_the_models_refuse(build: Any) -> None:
    with pytest.raises(CheckpointError):
        build()


def test_lineage_batch_refuses_bad_ids_and_versions() -> None:
    good = ModelCallLineageRecord(rollout_id="r1", attempt=0, call_id="c1", policy_version="v1")
    bad_version = good.model_copy(update={"policy_version": ""})  # model_copy does not validate
    bad_call = good.model_copy(update={"call_id": "../x"})
    for record in (bad_version, bad_call):
        with pytest.raises(CheckpointError):
            lineage_batch([record], [None])


def test_the_writer_still_refuses_a_bad_rollout_id_in_a_batch() -> None:
    batch = RecordBatch(
        kind="dispatch", rollout_ids=("../x",), attempts=(0,), keys=("dispatch",), payloads=(b"{}",)
    )
    store = MemoryStore(f"t-{time.time_ns()}")
    with pytest.raises(CheckpointError):
        write_component(
            store,
            "c1",
            "agent",
            "a",
            RecordBatches([batch]),
            {},
            lock=threading.Condition(),
            check_active=lambda: None,
        )
    writer = ArchiveWriter(store, "p", checkpoint_id="c1", participant_kind="agent", instance="a")
    with pytest.raises(InvalidRecordError):
        writer.write_columns("dispatch", ["r1"], [-1], ["dispatch"], [b"{}"])


def test_a_codec_error_still_fails_the_commit() -> None:
    class Broken:
        name = "broken"

        def encode(self, state: Any) -> bytes:
            raise ValueError("cannot")

        def decode(self, data: bytes) -> Any:
            return data

    resources = ResourcesParticipant("r", mode="exported", codec=Broken())
    resources.open_session(ex("r1"), "s1", {"a": 1})
    assert resources.prepare("c1", soon()).ready
    with pytest.raises(InvalidRecordError, match="cannot encode session s1"):
        resources.commit("c1", MemoryStore(f"t-{time.time_ns()}"), soon())


# -- hypothesis: generated states round-trip ---------------------------------------------------------

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,12}", fullmatch=True)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 80), max_value=1 << 80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
boundaries = st.builds(
    AgentBoundaryRecord,
    rollout_id=ids,
    attempt=st.integers(0, 5),
    boundary_index=st.integers(0, 10**9),
    turn_index=st.integers(0, 1000),
    last_model_call_id=st.none() | ids,
    pending_model_call_id=st.none() | ids,
    resource_revisions=st.dictionaries(
        ids, st.dictionaries(ids, st.integers(0, 10**6), max_size=3), max_size=3
    ),
    output_items=st.lists(json_values, max_size=4),
    usage=st.dictionaries(st.text(max_size=8), st.integers(-(1 << 40), 1 << 40), max_size=3),
    cookies=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    agent_state=st.none() | st.binary(max_size=64),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(boundaries, st.none() | ids), min_size=1, max_size=5))
def test_generated_agent_boundaries_round_trip(parked: list[tuple[AgentBoundaryRecord, str | None]]) -> None:
    batch = boundary_batch([(SavedBoundary.of(r), a) for r, a in parked])
    expected = [r if a is None else r.model_copy(update={"pending_model_call_id": a}) for r, a in parked]
    assert list(batch.records()) == expected
    assert list(batch.refs or ()) == [r.index_refs() for r in expected]
    assert list(batch.revisions or ()) == [r.index_revision() for r in expected]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(ids, st.integers(0, 5), ids, st.integers(0, 10**9), st.binary(max_size=200)),
        min_size=1,
        max_size=5,
    ),
    st.text(min_size=1, max_size=128),
)
def test_generated_resource_snapshots_round_trip(
    rows: list[tuple[str, int, str, int, bytes]], codec: str
) -> None:
    sessions = [(ex(r, a), s, v) for r, a, s, v, _ in rows]
    payloads = [snapshot_payload(ex(r, a), s, v, codec, d) for r, a, s, v, d in rows]
    batch = snapshot_batch(codec, sessions, payloads)
    assert list(batch.records()) == [
        ResourceSnapshotRecord(rollout_id=r, attempt=a, session_id=s, revision=v, codec=codec, state=d)
        for r, a, s, v, d in rows
    ]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            ids, st.integers(0, 3), ids, st.none() | ids, st.text(min_size=1, max_size=20), st.booleans()
        ),
        min_size=1,
        max_size=5,
    ),
    st.dictionaries(ids, json_values, max_size=3),
    st.none() | st.floats(allow_nan=False, allow_infinity=False),
)
def test_generated_lineage_receipts_and_results_round_trip(
    calls: list[tuple[str, int, str, str | None, str, bool]], result: dict[str, Any], reward: float | None
) -> None:
    lineage = [
        ModelCallLineageRecord(
            rollout_id=r,
            attempt=a,
            call_id=c,
            parent_call_id=p,
            policy_version=v,
            token_key=_cut(len(c)).receipt_key if cut else f"{r}/a{a}/{c}",
            cut=_cut(len(c)) if cut else None,
            continued_from=None if cut else _cut(a),
        )
        for r, a, c, p, v, cut in calls
    ]
    assert list(lineage_batch(lineage, [None] * len(lineage)).records()) == lineage
    receipts = [
        (ex(r, a), f"{r}/a{a}/{c}", hashlib.sha256(c.encode()).hexdigest(), len(v))
        for r, a, c, _, v, _ in calls
    ]
    assert list(receipt_batch("store", "snap-1", receipts).records()) == [
        TokenStoreReceipt(
            rollout_id=e.rollout_id,
            attempt=e.attempt,
            store="store",
            snapshot_id="snap-1",
            key=k,
            digest=d,
            length=n,
        )
        for e, k, d, n in receipts
    ]
    done = CompletedResultRecord(rollout_id=calls[0][0], attempt=calls[0][1], result=result, reward=reward)
    _, completed = registry_batches([_Entry(done.rollout_id, done.attempt, "handed_off", None, False, done)])
    assert list(completed.records()) == [done]


# -- the export never changes once taken ------------------------------------------------------------


def frozen_write_read(participant: Participant, mutate: Any) -> tuple[list[Record], list[Record]]:
    """Export under the lock (as commit does), resume, mutate the live state, then write the
    export and read it back; returns (records decoded at export, records read back)."""
    store = MemoryStore(f"t-{time.time_ns()}")
    assert participant.prepare("c1", soon()).ready
    with participant._cond:
        export: Export = participant._export(None)
    records = export.records
    if isinstance(records, RecordBatches):  # format 2: boundaries assembled from their chunks
        at_export = assemble_boundaries(
            (r, p) for b in records.batches for r, p in zip(b.records(), b.payloads, strict=True)
        )
    else:
        at_export = list(records)
    participant.resume("c1", soon())  # an asynchronous publication writes after the resume
    mutate()
    write_component(
        store,
        "c1",
        participant.kind,
        participant.instance,
        export.records,
        {},
        lock=participant._cond,
        check_active=lambda: None,
    )
    prefix = layout.component_prefix("c1", participant.kind, participant.instance)
    return at_export, component_records(ArchiveReader.open(store, prefix))


def test_agent_export_is_immune_to_later_state_changes() -> None:
    agent = AgentParticipant("a1")
    revisions = {"env": {"s1": 1}}
    first = AgentBoundaryRecord(
        rollout_id="r1",
        attempt=0,
        boundary_index=1,
        turn_index=1,
        resource_revisions=revisions,
        output_items=[{"k": [1]}],
        agent_state=b"one",
    )
    for name in ("r1", "r2"):
        agent.begin(ex(name))
    agent.boundary(ex("r1"), first)
    agent.boundary(ex("r2"), first.model_copy(update={"rollout_id": "r2"}))

    def mutate() -> None:
        first.resource_revisions["env"]["s1"] = 99  # the caller's dicts, changed in place
        first.output_items[0]["k"].append(2)
        agent.start_turn(ex("r1"))
        agent.boundary(ex("r1"), first.model_copy(update={"boundary_index": 2, "agent_state": b"two"}))
        agent.finish(ex("r2"))

    at_export, read = frozen_write_read(agent, mutate)
    assert read == at_export
    assert [(r.rollout_id, r.boundary_index, r.agent_state) for r in read] == [
        ("r1", 1, b"one"),
        ("r2", 1, b"one"),
    ]
    assert read[0].resource_revisions == {"env": {"s1": 1}}
    assert read[0].output_items == [{"k": [1]}]


def test_resources_export_is_immune_to_later_state_changes() -> None:
    resources = ResourcesParticipant("env", mode="exported")
    resources.open_session(ex("r1"), "s1", {"board": [0, 0]})
    resources.open_session(ex("r2"), "s1", {"board": [5]})

    def mutate() -> None:
        resources.mutate(ex("r1"), "s1", lambda s: {"board": [1, 1]})
        resources.end_session(ex("r2"), "s1")

    at_export, read = frozen_write_read(resources, mutate)
    assert read == at_export
    assert [(r.rollout_id, r.revision, json.loads(r.state)) for r in read] == [
        ("r1", 0, {"board": [0, 0]}),
        ("r2", 0, {"board": [5]}),
    ]


def test_environment_export_is_immune_to_later_state_changes() -> None:
    env = BlackjackEnvironment()
    participant = make_participant(env)
    state = env.reset(7)
    participant.open_session(ex("r1"), "table", state)

    def mutate() -> None:
        participant.mutate(ex("r1"), "table", lambda s: env.step(s, 0))

    at_export, read = frozen_write_read(participant, mutate)
    assert read == at_export
    assert participant.codec.decode(read[0].state) == state


def test_model_export_is_immune_to_later_state_changes() -> None:
    store = MemoryStore(f"t-{time.time_ns()}")
    tokens = ObjectStoreTokenStore(store)
    model = PolicyModelParticipant(tokens, "policy")

    def stage(execution: ExecutionId, call_id: str) -> None:
        with model.call(execution, call_id) as call:
            call.stage(prompt_token_ids=[1, 2], generation_token_ids=[3], generation_log_probs=[-0.5])

    stage(ex("r1"), "c1")
    stage(ex("r2"), "c1")
    lineage_before = model.lineage(ex("r1")) + model.lineage(ex("r2"))

    def mutate() -> None:
        stage(ex("r1"), "c2")
        model.finish(ex("r2"))

    at_export, read = frozen_write_read(model, mutate)
    assert read == at_export
    assert [r for r in read if isinstance(r, ModelCallLineageRecord)] == lineage_before
    assert sorted(r.key for r in read if isinstance(r, TokenStoreReceipt)) == ["r1/a0/c1", "r2/a0/c1"]


def test_an_export_of_record_models_is_copied() -> None:
    records: list[Record] = [DispatchRecord(rollout_id="r1", attempt=0, state="queued")]
    export = Export(records=records, executions=[ex("r1")])
    records.append(DispatchRecord(rollout_id="r2", attempt=0, state="queued"))
    assert len(export.records) == 1 and isinstance(export.records, tuple)


def test_registry_payloads_follow_every_state_change() -> None:
    registry = LiveExecutionRegistry()
    states = {}
    for name, steps in {"q": 0, "run": 1, "fin": 2, "hand": 3, "used": 4}.items():
        e = registry.dispatch(name, input_digest=f"in-{name}", restart_only=steps == 1)
        for step in [
            registry.start,
            registry.finish,
            lambda x, name=name: registry.hand_off(x, [name]),
            registry.consume,
        ][:steps]:
            step(e)
        states[name] = registry.get(name)
    store = MemoryStore(f"t-{time.time_ns()}")
    _, ref = registry.write_component(store, "c1")
    reader = ArchiveReader.open(store, ref.key.rsplit("/", 1)[0])
    got = {r.rollout_id: r for r in reader.iter_records(kind="dispatch")}
    for name, info in states.items():
        assert got[name] == DispatchRecord(
            rollout_id=name,
            attempt=0,
            state=info.state,
            input_digest=info.input_digest,
            restart_only=info.restart_only,
        )
    refs = {m.rollout_id: m.refs for m in reader.members(kind="dispatch")}
    assert refs == {n: {"state": i.state, "restart_only": i.restart_only} for n, i in states.items()}
    results = {r.rollout_id: r for r in reader.iter_records(kind="completed_result")}
    assert list(results) == ["hand"] and results["hand"].result == ["hand"]


def test_registry_snapshot_and_restored_entries_write_the_same_component() -> None:
    registry = LiveExecutionRegistry()
    for name in ("a", "b", "c"):
        e = registry.dispatch(name, input_digest=f"in-{name}")
        registry.start(e)
    registry.finish(ExecutionId(rollout_id="a", attempt=0))
    registry.hand_off(ExecutionId(rollout_id="a", attempt=0), {"x": 1}, reward=0.5)
    registry.retire(ExecutionId(rollout_id="c", attempt=0))
    copy = registry.snapshot()
    restored = LiveExecutionRegistry()  # entries installed lazily (encode=False), as a restore does
    restored.install(
        [
            RegistryEntry(i.rollout_id, i.attempt, i.state, i.input_digest, i.restart_only, i.result)
            for i in registry.executions()
        ],
        registry.retired(),
    )
    registry.finish(ExecutionId(rollout_id="b", attempt=0))  # the live registry moves on
    store = MemoryStore(f"t-{time.time_ns()}")
    prefixes = []
    for n, which in enumerate((copy, restored)):
        _, ref = which.write_component(store, f"c{n}")
        prefixes.append(ref.key.rsplit("/", 1)[0])
    readers = [ArchiveReader.open(store, prefix) for prefix in prefixes]
    assert list(readers[0].iter_records()) == list(readers[1].iter_records())
    assert readers[0].manifest.extra == readers[1].manifest.extra
    got = {r.rollout_id: r for r in readers[0].iter_records(kind="dispatch")}
    assert got["b"].state == "running" and set(got) == {"a", "b"}
    with copy.frozen("c9") as live:
        assert live == [ExecutionId(rollout_id="b", attempt=0)]
