"""Aggregate manifest, global checkpoint record and latest pointer: create-only, CAS, parsing."""

from __future__ import annotations

import json
import re
import threading
from datetime import UTC, datetime, timedelta

import pytest

from _protocol_fakes import Deployment, memory_store, published_ids
from rollout_checkpoint.errors import (
    CheckpointNotFoundError,
    IntegrityError,
    InvalidRecordError,
    InvalidValueError,
    ManifestConflictError,
    UnsupportedSchemaError,
)
from rollout_checkpoint.format import layout
from rollout_checkpoint.format.commit_log import (
    advance_latest,
    list_published,
    publish_record,
    read_aggregate,
    read_latest,
    read_record,
    write_aggregate,
)
from rollout_checkpoint.format.manifests import (
    AggregateManifest,
    ComponentRef,
    GlobalCheckpointRecord,
    ObjectRef,
    canonical_json,
    new_checkpoint_id,
    new_commit_token,
)
from rollout_checkpoint.store import ObjectStore

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _component(cid: str, kind: str = "agent", instance: str = "a0") -> ComponentRef:
    prefix = layout.component_prefix(cid, kind, instance)
    return ComponentRef(
        kind=kind,
        instance=instance,
        role="participant",
        mode="exported",
        prefix=prefix,
        manifest=ObjectRef.of(f"{prefix}/manifest.json", b"{}"),
    )


def _record(
    cid: str, sequence: int = 1, *, token: str | None = None, at: datetime = T0
) -> GlobalCheckpointRecord:
    return GlobalCheckpointRecord(
        checkpoint_id=cid,
        sequence=sequence,
        created_at=at,
        commit_token=token or new_commit_token(),
        coordinator_id="c",
        aggregate=ObjectRef.of(layout.aggregate_key(cid), b"agg"),
        components=[_component(cid)],
        framework_state={"step": sequence},
    )


def test_canonical_json_is_sorted_and_compact() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == b'{"a":[1,{"c":3,"d":2}],"b":1}'


def test_checkpoint_id_format() -> None:
    cid = new_checkpoint_id(now=T0.timestamp())
    assert re.fullmatch(r"ckpt-20261129T120000-[0-9a-f]{8}", cid)
    assert new_checkpoint_id() != new_checkpoint_id()


def test_object_ref_detects_truncation_and_alteration() -> None:
    ref = ObjectRef.of("k", b"hello")
    ref.check(b"hello")
    with pytest.raises(IntegrityError):
        ref.check(b"hell")
    with pytest.raises(IntegrityError):
        ref.check(b"jello")


def test_record_refuses_keys_outside_its_prefix() -> None:
    with pytest.raises(ValueError, match="outside"):
        GlobalCheckpointRecord(
            checkpoint_id="ck-1",
            sequence=1,
            created_at=T0,
            commit_token="t",
            coordinator_id="c",
            aggregate=ObjectRef.of(layout.aggregate_key("ck-1"), b"x"),
            components=[_component("ck-2")],
        )


def test_publish_is_create_only_and_idempotent(memory_store: ObjectStore) -> None:
    record = _record("ck-1")
    ref = publish_record(memory_store, record)
    assert ref.key == layout.published_key("ck-1")
    # a retry whose first put landed (answer lost) finds identical bytes: success
    assert publish_record(memory_store, record) == ref
    # another coordinator's record (different commit token) loses and changes nothing
    with pytest.raises(ManifestConflictError):
        publish_record(memory_store, _record("ck-1"))
    loaded, loaded_ref = read_record(memory_store, "ck-1")
    assert loaded == record.sealed() and loaded_ref == ref


def test_read_record_errors(memory_store: ObjectStore) -> None:
    with pytest.raises(CheckpointNotFoundError):
        read_record(memory_store, "nope")
    memory_store.put(layout.published_key("bad"), b"{not json")
    with pytest.raises(InvalidRecordError):
        read_record(memory_store, "bad")
    newer = json.loads(_record("new").to_bytes())
    newer["schema_version"] = 99
    memory_store.put(layout.published_key("new"), canonical_json(newer))
    with pytest.raises(UnsupportedSchemaError):
        read_record(memory_store, "new")
    other = _record("other")
    memory_store.put(layout.published_key("renamed"), other.to_bytes())
    with pytest.raises(InvalidRecordError, match="names checkpoint"):
        read_record(memory_store, "renamed")


def test_aggregate_round_trip_and_conflict(memory_store: ObjectStore) -> None:
    agg = AggregateManifest(
        checkpoint_id="ck-1",
        commit_token="t1",
        created_at=T0,
        prepare_order=["agent"],
        components=[_component("ck-1")],
        dispatched=3,
    )
    ref = write_aggregate(memory_store, agg)
    assert read_aggregate(memory_store, ref) == agg
    with pytest.raises(ManifestConflictError):
        write_aggregate(memory_store, agg.model_copy(update={"commit_token": "t2"}))
    memory_store.put(ref.key, memory_store.get(ref.key)[:-3])
    with pytest.raises(IntegrityError):
        read_aggregate(memory_store, ref)


def test_aggregate_refuses_duplicate_components() -> None:
    with pytest.raises(ValueError, match="unique"):
        AggregateManifest(
            checkpoint_id="ck-1",
            commit_token="t",
            created_at=T0,
            prepare_order=[],
            components=[_component("ck-1"), _component("ck-1")],
            dispatched=0,
        )


@pytest.mark.parametrize("backend", ["memory_store", "local_store"])
def test_concurrent_publishers_exactly_one_wins(backend: str, request: pytest.FixtureRequest) -> None:
    store: ObjectStore = request.getfixturevalue(backend)
    records = [_record("race") for _ in range(8)]
    barrier = threading.Barrier(len(records))
    won: list[str] = []
    lost: list[str] = []

    def publish(record: GlobalCheckpointRecord) -> None:
        barrier.wait()
        try:
            publish_record(store, record)
            won.append(record.commit_token)
        except ManifestConflictError:
            lost.append(record.commit_token)

    threads = [threading.Thread(target=publish, args=(r,)) for r in records]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 7
    assert read_record(store, "race")[0].commit_token == won[0]


def test_latest_moves_forward_only(any_store: ObjectStore) -> None:
    assert read_latest(any_store) is None
    first, second = _record("ck-1", 1), _record("ck-2", 2, at=T0 + timedelta(seconds=1))
    r1, r2 = publish_record(any_store, first), publish_record(any_store, second)
    assert advance_latest(any_store, first, r1).moved
    assert advance_latest(any_store, second, r2).moved
    # an older checkpoint (a slow coordinator) never moves the pointer back
    update = advance_latest(any_store, first, r1)
    assert not update.moved and update.pointer.checkpoint_id == "ck-2"
    pointer = read_latest(any_store)
    assert pointer is not None and pointer[0].checkpoint_id == "ck-2" and pointer[0].record == r2


def test_latest_cas_race_ends_at_the_newest(local_store: ObjectStore) -> None:
    records = [_record(f"ck-{i}", i, at=T0 + timedelta(seconds=i)) for i in range(1, 9)]
    refs = [publish_record(local_store, r) for r in records]
    barrier = threading.Barrier(len(records))

    def move(i: int) -> None:
        barrier.wait()
        advance_latest(local_store, records[i], refs[i])

    threads = [threading.Thread(target=move, args=(i,)) for i in range(len(records))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pointer = read_latest(local_store)
    assert pointer is not None and pointer[0].checkpoint_id == "ck-8"


def test_equal_sequence_is_ordered_by_time(memory_store: ObjectStore) -> None:
    # version 1 stores (no sequence claims) can hold two records with one sequence: time decides
    early = _record("ck-a", 5).model_copy(update={"schema_version": 1})
    late = _record("ck-b", 5, at=T0 + timedelta(seconds=1)).model_copy(update={"schema_version": 1})
    advance_latest(memory_store, late, publish_record(memory_store, late))
    assert not advance_latest(memory_store, early, publish_record(memory_store, early)).moved


def test_unreadable_pointer_is_replaced(memory_store: ObjectStore) -> None:
    memory_store.put(layout.LATEST_KEY, b"garbage")
    record = _record("ck-1")
    assert advance_latest(memory_store, record, publish_record(memory_store, record)).moved
    pointer = read_latest(memory_store)
    assert pointer is not None and pointer[0].checkpoint_id == "ck-1"


def test_list_published_newest_first(memory_store: ObjectStore) -> None:
    for i in (2, 1, 3):
        rec = _record(f"ck-{i}", i, at=T0 + timedelta(seconds=i))
        ref = publish_record(memory_store, rec)
        if i == 2:
            advance_latest(memory_store, rec, ref)
    memory_store.put(layout.published_key("broken"), b"{}")
    listed = list_published(memory_store)
    assert [p.checkpoint_id for p in listed] == ["ck-3", "ck-2", "ck-1", "broken"]
    assert [p.latest for p in listed] == [False, True, False, False]
    assert listed[-1].record is None and listed[-1].error


@pytest.mark.parametrize("version", [99, 99.0, "99"])
def test_newer_schema_refused_whatever_its_json_type(memory_store: ObjectStore, version: object) -> None:
    """Global record and component manifest alike: pydantic's lax mode must not let a newer
    schema written as a float or a string through as an int."""
    from rollout_checkpoint.archive import parse_component_manifest

    newer = json.loads(_record("new").to_bytes())
    newer["schema_version"] = version
    memory_store.put(layout.published_key("new"), canonical_json(newer))
    with pytest.raises(UnsupportedSchemaError):
        read_record(memory_store, "new")
    with pytest.raises(UnsupportedSchemaError):
        parse_component_manifest(json.dumps({"schema_version": version}).encode())


def test_record_base_is_abstract() -> None:
    from rollout_checkpoint.format.records import Record

    with pytest.raises(TypeError):
        Record(rollout_id="r", attempt=0)  # type: ignore[abstract]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused_wherever_canonical_json_is_written(bad: float) -> None:
    """Issue 18, item 8: not JSON, so never written (and a checkpoint carrying one publishes nothing)."""
    with pytest.raises(InvalidValueError) as info:
        canonical_json({"x": bad})
    assert info.value.code == "invalid_value"
    dep = Deployment(memory_store("nan"))
    dep.completed("done")
    with pytest.raises(InvalidValueError):
        dep.coordinator.checkpoint(framework_state={"x": bad})
    assert published_ids(dep.store) == [] and dep.all_open()
    dep.close()
