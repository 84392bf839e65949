"""Archive round trips, lookups, commit semantics and refusals (integrity: test_archive_integrity)."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import random
import tracemalloc
import uuid
from collections.abc import Iterator
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from rollout_checkpoint.archive import (
    ArchiveStateError,
    ArchiveWriter,
    ComponentManifest,
    ManifestRef,
    MemberNotFoundError,
    find_component_prefixes,
    manifest_to_bytes,
    parse_component_manifest,
)
from rollout_checkpoint.archive._shard import encoding_pool
from rollout_checkpoint.errors import (
    IntegrityError,
    InvalidIdentifierError,
    InvalidRecordError,
    ManifestConflictError,
    ObjectNotFoundError,
    StoreError,
    TransientStoreError,
    UnsupportedSchemaError,
)
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.format.records import (
    AgentBoundaryRecord,
    CompletedResultRecord,
    DispatchRecord,
    GenerationCut,
    ModelCallLineageRecord,
    Record,
    ResourceSnapshotRecord,
    TokenStoreReceipt,
)
from rollout_checkpoint.store import CountingStore, MemoryStore, ObjectInfo, ObjectStore, PutResult

PREFIX = "checkpoints/ck-1/components/agent/a0"


def make_records(n: int, seed: int = 0, payload_bytes: int = 200) -> list[Record]:
    """``n`` records of every kind with unique member identities and varied payload sizes."""
    rng = random.Random(seed)
    out: list[Record] = []
    for i in range(n):
        rid = f"r{i // 6:05d}"
        attempt = (i // 12) % 2
        blob = rng.randbytes(rng.randrange(payload_bytes))
        kind = i % 6
        rec: Record
        if kind == 0:
            rec = AgentBoundaryRecord(
                rollout_id=rid,
                attempt=attempt,
                boundary_index=i,
                turn_index=i % 7,
                last_model_call_id=f"call-{i}",
                resource_revisions={"res": {"env": i}},
                output_items=[{"text": "x" * rng.randrange(50)}, i],
                agent_state=blob,
            )
        elif kind == 1:
            rec = ResourceSnapshotRecord(
                rollout_id=rid, attempt=attempt, session_id=f"s{i}", revision=i, codec="raw", state=blob
            )
        elif kind == 2:
            rec = ModelCallLineageRecord(
                rollout_id=rid,
                attempt=attempt,
                call_id=f"call-{i}",
                parent_call_id=f"call-{i - 1}" if i else None,
                policy_version="v1",
                token_key=f"tok/{i}",
                cut=GenerationCut(
                    cut_kind="active_prefix",
                    frozen_buffer_id=f"gen{i}.b0",
                    prefix_token_count=i,
                    prefix_digest="d" * 64,
                    receipt_key=f"tok/{i}",
                    receipt_digest="e" * 64,
                    receipt_length=i,
                ),
            )
        elif kind == 3:
            rec = TokenStoreReceipt(
                rollout_id=rid,
                attempt=attempt,
                store="s",
                snapshot_id="snap",
                key=f"tok/{i}",
                digest="ab",
                length=i,
            )
        elif kind == 4:
            rec = CompletedResultRecord(rollout_id=rid, attempt=attempt, result={"ok": i}, reward=0.5)
        else:
            rec = DispatchRecord(
                rollout_id=rid, attempt=attempt, state="running", input_digest=blob.hex()[:16]
            )
        out.append(rec)
    return out


def write_archive(
    store: ObjectStore, records: list[Record], prefix: str = PREFIX, **kwargs: Any
) -> tuple[ArchiveWriter, ComponentManifest]:
    writer = ArchiveWriter(
        store, prefix, checkpoint_id="ck-1", participant_kind="agent", instance="a0", **kwargs
    )
    for rec in records:
        writer.write(rec)
    return writer, writer.commit(extra={"executions": [["r1", 0]]})


def ident(rec: Record) -> tuple[str, str, int, str]:
    return (rec.kind, rec.rollout_id, rec.attempt, rec.record_key)


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest) -> ObjectStore:
    return request.getfixturevalue(f"{request.param}_store")  # type: ignore[no-any-return]


# -- round trips -------------------------------------------------------------------------------


def _round_trip(store: ObjectStore) -> None:
    records = make_records(300)
    writer, manifest = write_archive(store, records, target_shard_bytes=16 << 10, row_group_rows=32)
    assert len(manifest.shards) > 1
    assert manifest.record_counts == {k: 50 for k in {r.kind for r in records}}
    assert manifest.extra == {"executions": [["r1", 0]]}
    assert (manifest.checkpoint_id, manifest.participant_kind, manifest.instance) == ("ck-1", "agent", "a0")
    # the manifest's own digests (never ETags) describe the stored bytes exactly
    for entry in [*manifest.shards, manifest.index]:
        data = store.get(f"{PREFIX}/{entry.key}")
        assert (entry.bytes, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())

    reader = ArchiveReader.open(store, PREFIX, expected_sha256=writer.manifest_ref.sha256)
    assert reader.manifest == manifest
    assert reader.manifest_ref == writer.manifest_ref
    reader.verify()
    assert list(reader.iter_records()) == records
    assert [(m.kind, m.rollout_id, m.attempt, m.key) for m in reader.members()] == [ident(r) for r in records]
    for rec in random.Random(1).sample(records, 40):
        assert reader.get(*ident(rec)) == rec


def test_round_trip_local_and_memory(store: ObjectStore) -> None:
    _round_trip(store)


@pytest.mark.s3
def test_round_trip_s3(s3_store: ObjectStore) -> None:
    _round_trip(s3_store)


def test_members_carry_index_revision_and_refs(memory_store: MemoryStore) -> None:
    records = make_records(60)
    write_archive(memory_store, records)
    reader = ArchiveReader.open(memory_store, PREFIX)
    by_ident = {ident(r): r for r in records}
    members = list(reader.members())
    assert len(members) == len(records)
    for m in members:
        rec = by_ident[(m.kind, m.rollout_id, m.attempt, m.key)]
        assert m.revision == rec.index_revision()
        assert m.refs == rec.index_refs()
    boundaries = list(reader.members("agent_boundary"))
    assert {m.kind for m in boundaries} == {"agent_boundary"} and len(boundaries) == 10


def test_iter_records_by_kind_keeps_order(memory_store: MemoryStore) -> None:
    records = make_records(120)
    write_archive(memory_store, records, target_shard_bytes=8 << 10, row_group_rows=16)
    reader = ArchiveReader.open(memory_store, PREFIX)
    for kind in {r.kind for r in records}:
        assert list(reader.iter_records(kind)) == [r for r in records if r.kind == kind]
    raw = list(reader.iter_raw("dispatch"))
    assert raw and all(json.loads(r.payload)["state"] == "running" for r in raw)


def test_many_shards_and_row_group_boundaries(local_store: ObjectStore) -> None:
    records = make_records(1000, payload_bytes=600)
    _, manifest = write_archive(local_store, records, target_shard_bytes=32 << 10, row_group_rows=7)
    assert len(manifest.shards) >= 5
    assert all(s.row_groups >= 2 for s in manifest.shards[:-1])
    reader = ArchiveReader.open(local_store, PREFIX)
    members = list(reader.members())
    # every row-group boundary member (first and last row of each row group) reads back
    by_ident = {ident(r): r for r in records}
    rg_sizes: dict[tuple[int, int], int] = {}
    for m in members:
        rg_sizes[(m.shard, m.row_group)] = max(rg_sizes.get((m.shard, m.row_group), 0), m.row + 1)
    edges = [m for m in members if m.row in (0, rg_sizes[(m.shard, m.row_group)] - 1)]
    assert len(edges) > 100
    for m in edges:
        assert (
            reader.get(m.kind, m.rollout_id, m.attempt, m.key)
            == by_ident[(m.kind, m.rollout_id, m.attempt, m.key)]
        )
    assert sum(s.records for s in manifest.shards) == len(records)
    assert list(reader.iter_records()) == records


class CountingReads(MemoryStore):
    """Counts ranged and whole reads so a lookup's cost is asserted, not timed."""

    def __init__(self) -> None:
        super().__init__(f"count-{uuid.uuid4().hex}")
        self.gets: list[str] = []
        self.ranges: list[tuple[str, int, int]] = []

    def get(self, key: str) -> bytes:
        self.gets.append(key)
        return super().get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self.ranges.append((key, start, end))
        return super().get_range(key, start, end)


def test_lookup_is_index_plus_one_ranged_read() -> None:
    store = CountingReads()
    records = make_records(400)
    _, manifest = write_archive(store, records, target_shard_bytes=16 << 10, row_group_rows=20)
    counting = CountingStore(store)  # counts every operation, open_read and stat included
    reader = ArchiveReader.open(counting, PREFIX)
    store.gets.clear()
    counting.reset()
    sample = random.Random(3).sample(records, 25)
    for rec in sample:
        assert reader.get(*ident(rec)) == rec
    # the index once (then cached), and one ranged read per lookup, never a whole shard
    assert store.gets == [f"{PREFIX}/{manifest.index.key}"]
    assert len(store.ranges) == len(sample)
    assert dict(counting.requests) == {"get": 1, "get_range": len(sample)}
    biggest = max(s.bytes for s in manifest.shards)
    assert all(end - start < biggest for _, start, end in store.ranges)
    # each ranged read is exactly the member's row group, as the index records it
    members = {(m.kind, m.rollout_id, m.attempt, m.key): m for m in reader.members()}
    spans = reader._member_index().spans
    for rec, (key, start, end) in zip(sample, store.ranges, strict=True):
        m = members[ident(rec)]
        span = spans[m.shard][m.row_group]
        assert (key, start, end) == (
            f"{PREFIX}/{manifest.shards[m.shard].key}",
            span.offset,
            span.offset + span.length,
        )


def test_get_missing_member(memory_store: MemoryStore) -> None:
    records = make_records(12)
    write_archive(memory_store, records)
    reader = ArchiveReader.open(memory_store, PREFIX)
    with pytest.raises(MemberNotFoundError) as info:
        reader.get("agent_boundary", "nobody", 0, "00000000")
    assert info.value.code == "member_not_found"
    assert isinstance(info.value, KeyError)
    assert "nobody" in str(info.value)


def test_empty_archive(any_store: ObjectStore) -> None:
    writer, manifest = write_archive(any_store, [])
    assert manifest.shards == [] and manifest.index.rows == 0 and manifest.record_counts == {}
    reader = ArchiveReader.open(any_store, PREFIX)
    reader.verify()
    assert list(reader.members()) == [] and list(reader.iter_records()) == []
    with pytest.raises(MemberNotFoundError):
        reader.get("dispatch", "r", 0, "dispatch")
    keys = [i.key for i in any_store.list(PREFIX)]
    assert keys == [f"{PREFIX}/{manifest.index.key}", writer.manifest_key]


def test_archive_at_store_root(memory_store: MemoryStore) -> None:
    records = make_records(10)
    write_archive(memory_store, records, prefix="")
    assert find_component_prefixes(memory_store) == [""]
    reader = ArchiveReader.open(memory_store, "")
    reader.verify()
    assert list(reader.iter_records()) == records


def test_write_raw_round_trip(memory_store: MemoryStore) -> None:
    writer = ArchiveWriter(memory_store, PREFIX, checkpoint_id="c", participant_kind="agent", instance="i")
    rec = DispatchRecord(rollout_id="r1", attempt=2, state="queued")
    writer.write_raw(
        rec.kind, rec.rollout_id, rec.attempt, rec.record_key, rec.to_payload(), refs=rec.index_refs()
    )
    writer.write_raw("custom-kind", "r1", 0, "some/key", bytearray(b"\x00\x01opaque"), revision=7)
    writer.commit()
    reader = ArchiveReader.open(memory_store, PREFIX)
    assert reader.get(rec.kind, "r1", 2, "dispatch") == rec
    raw = reader.get_raw("custom-kind", "r1", 0, "some/key")
    assert raw.payload == b"\x00\x01opaque" and raw.revision == 7 and raw.schema_version == 1
    refs = {m.kind: m.refs for m in reader.members()}
    assert refs == {"dispatch": {"state": "queued", "restart_only": False}, "custom-kind": None}


# -- commit semantics --------------------------------------------------------------------------


def test_commit_twice_is_idempotent(memory_store: MemoryStore) -> None:
    writer, manifest = write_archive(memory_store, make_records(30))
    before = {i.key: i.size for i in memory_store.list(PREFIX)}
    assert writer.commit(extra={"executions": [["r1", 0]]}) is manifest
    assert writer.commit() is manifest
    assert {i.key: i.size for i in memory_store.list(PREFIX)} == before
    with pytest.raises(ManifestConflictError):
        writer.commit(extra={"other": 1})
    with pytest.raises(ArchiveStateError):
        writer.write(make_records(1)[0])


def test_second_writer_conflicts(memory_store: MemoryStore) -> None:
    first, _ = write_archive(memory_store, make_records(6))
    second = ArchiveWriter(
        memory_store, PREFIX, checkpoint_id="ck-1", participant_kind="agent", instance="a0"
    )
    second.write(make_records(7)[6])
    with pytest.raises(ManifestConflictError) as info:
        second.commit()
    assert info.value.code == "manifest_conflict" and "manifest.json" in info.value.message
    # the first archive is untouched: its manifest and every object it references
    reader = ArchiveReader.open(memory_store, PREFIX)
    assert reader.manifest_ref == first.manifest_ref
    reader.verify()
    assert list(reader.iter_records()) == make_records(6)


class FlakyPuts(MemoryStore):
    """Fails the next ``fail`` plain puts, then behaves."""

    def __init__(self) -> None:
        super().__init__(f"flaky-{uuid.uuid4().hex}")
        self.fail = 0

    def put(self, key: str, data: bytes) -> ObjectInfo:
        if self.fail:
            self.fail -= 1
            raise StoreError("injected failure", key=key)
        return super().put(key, data)


def test_failed_upload_is_retried_and_no_record_is_lost_or_doubled() -> None:
    store = FlakyPuts()
    records = make_records(200, payload_bytes=400)
    writer = ArchiveWriter(
        store, PREFIX, checkpoint_id="c", participant_kind="agent", instance="i", target_shard_bytes=8 << 10
    )
    failures = 0
    for rec in records:
        store.fail = 1 if failures < 3 else 0  # fails only when a shard upload is due
        while True:
            try:
                writer.write(rec)
                break
            except StoreError:
                failures += 1  # the record was not taken: write it again
        store.fail = 0
    assert failures == 3
    store.fail = 1
    with pytest.raises(StoreError):
        writer.commit()
    manifest = writer.commit()
    reader = ArchiveReader.open(store, PREFIX)
    reader.verify()
    assert list(reader.iter_records()) == records
    assert manifest.index.rows == len(records)


class FlakyStream(MemoryStore):
    """A store that streams for real and whose ``open_write`` files fail on a chosen write
    (``fail_at_write``) or when the object is finished (``fail_at_close``), once each."""

    def __init__(self) -> None:
        super().__init__(f"stream-{uuid.uuid4().hex}")
        self.fail_at_write: int | None = None
        self.fail_at_close = 0
        self.opened: list[str] = []

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        self.opened.append(key)
        store = self
        buffer = io.BytesIO()

        class Failing(io.RawIOBase):
            writes = 0

            def writable(self) -> bool:
                return True

            def write(self, data: Any) -> int:
                Failing.writes += 1
                if store.fail_at_write is not None and Failing.writes >= store.fail_at_write:
                    store.fail_at_write = None
                    raise StoreError("injected stream failure", key=key)
                return buffer.write(data)

        yield Failing()  # type: ignore[misc]
        if self.fail_at_close:
            self.fail_at_close -= 1
            raise StoreError("injected failure finishing the upload", key=key)
        self.put(key, buffer.getvalue())


@pytest.mark.parametrize("fail_at_write", [1, 3, 1000])
def test_index_stream_failure_is_rebuilt_from_the_shards(
    fail_at_write: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # small index row groups, so that index rows go to the stream while shards are written
    monkeypatch.setattr("rollout_checkpoint.archive._index.INDEX_FLUSH_ROWS", 64)
    # and a small native buffer in front of the stream, so that it writes many times
    monkeypatch.setattr("rollout_checkpoint.archive._index._INDEX_BUFFER_BYTES", 256)
    store = FlakyStream()
    store.fail_at_write = fail_at_write
    records = make_records(400, payload_bytes=400)
    _, manifest = write_archive(store, records, target_shard_bytes=8 << 10, row_group_rows=32)
    assert len(manifest.shards) > 3
    assert (store.fail_at_write is None) == (fail_at_write < 1000)  # the failure happened
    if fail_at_write == 1000:
        store.opened.append(store.opened[0])  # no failure: nothing rebuilt
    assert store.opened == [f"{PREFIX}/{manifest.index.key}"] * 2  # the first stream, the rebuild
    reader = ArchiveReader.open(store, PREFIX)
    reader.verify()
    assert list(reader.iter_records()) == records
    assert reader.get(*ident(records[123])) == records[123]
    assert len(store.list(PREFIX)) == len(manifest.shards) + 2


def test_commit_retried_after_the_index_upload_failed() -> None:
    store = FlakyStream()
    store.fail_at_close = 1
    records = make_records(300, payload_bytes=400)
    writer = ArchiveWriter(
        store, PREFIX, checkpoint_id="c", participant_kind="agent", instance="i", target_shard_bytes=8 << 10
    )
    for rec in records:
        writer.write(rec)
    with pytest.raises(StoreError, match="finishing the upload"):
        writer.commit()
    assert not store.exists(writer.manifest_key)
    with pytest.raises(ArchiveStateError):
        writer.write(make_records(301)[300])  # commit has started: the index is being closed
    manifest = writer.commit()
    reader = ArchiveReader.open(store, PREFIX)
    reader.verify()
    assert list(reader.iter_records()) == records and manifest.index.rows == len(records)


def test_index_is_streamed_not_built_at_commit(local_store: ObjectStore) -> None:
    # the index object is opened with the first shard and fed shard by shard
    store = CountingStore(local_store)
    records = make_records(300, payload_bytes=400)
    writer = ArchiveWriter(
        store, PREFIX, checkpoint_id="c", participant_kind="agent", instance="i", target_shard_bytes=8 << 10
    )
    for rec in records:
        writer.write(rec)
    assert writer._index.writer is not None and writer._index.writer.shards > 3
    manifest = writer.commit()
    # one streamed index object; on local disk each shard is streamed into its object too
    assert writer.stream_shards
    assert store.requests["open_write"] == 1 + len(manifest.shards) and store.requests["put"] == 0
    index_bytes = local_store.get(f"{PREFIX}/{manifest.index.key}")
    assert len(index_bytes) == manifest.index.bytes
    assert hashlib.sha256(index_bytes).hexdigest() == manifest.index.sha256
    reader = ArchiveReader.open(local_store, PREFIX)
    reader.verify()
    assert [m.key for m in reader.members()] == [r.record_key for r in records]


def test_exception_in_context_writes_no_manifest(memory_store: MemoryStore) -> None:
    with (
        pytest.raises(RuntimeError),
        ArchiveWriter(
            memory_store,
            PREFIX,
            checkpoint_id="c",
            participant_kind="agent",
            instance="i",
            target_shard_bytes=4 << 10,
        ) as writer,
    ):
        for rec in make_records(100, payload_bytes=300):
            writer.write(rec)
        raise RuntimeError("participant crashed")
    keys = [i.key for i in memory_store.list(PREFIX)]
    assert keys and all("/shards/" in k for k in keys)  # unreferenced garbage only
    with pytest.raises(ObjectNotFoundError):
        ArchiveReader.open(memory_store, PREFIX)
    with pytest.raises(ArchiveStateError):
        writer.commit()


def test_clean_context_exit_commits(memory_store: MemoryStore) -> None:
    records = make_records(9)
    with ArchiveWriter(
        memory_store, PREFIX, checkpoint_id="c", participant_kind="agent", instance="i"
    ) as writer:
        for rec in records:
            writer.write(rec)
    assert writer.committed
    assert list(ArchiveReader.open(memory_store, PREFIX).iter_records()) == records


def test_manifest_ref_before_commit_refused(memory_store: MemoryStore) -> None:
    writer = ArchiveWriter(memory_store, PREFIX, checkpoint_id="c", participant_kind="agent", instance="i")
    with pytest.raises(ArchiveStateError):
        _ = writer.manifest_ref


def test_manifest_bytes_are_canonical(memory_store: MemoryStore) -> None:
    writer, manifest = write_archive(memory_store, make_records(12))
    data = memory_store.get(writer.manifest_key)
    assert data == manifest_to_bytes(manifest)
    assert parse_component_manifest(data) == manifest
    assert ManifestRef.of(writer.manifest_key, data) == writer.manifest_ref
    loaded = json.loads(data)
    assert list(loaded) == sorted(loaded) and b" " not in data.replace(b"ck-1", b"")
    assert loaded["schema_version"] == 1 and loaded["digest_algorithm"] == "sha256"
    assert loaded["created_at"].endswith("Z")


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["checkpoint_id", "participant_kind", "instance"])
@pytest.mark.parametrize("bad", ["", "../x", "a/b", "-lead", "x" * 129, "a..b"])
def test_invalid_writer_ids_refused(memory_store: MemoryStore, field: str, bad: str) -> None:
    kwargs = {"checkpoint_id": "c", "participant_kind": "agent", "instance": "i", field: bad}
    with pytest.raises(InvalidIdentifierError):
        ArchiveWriter(memory_store, PREFIX, **kwargs)


def test_invalid_raw_members_refused(memory_store: MemoryStore) -> None:
    writer = ArchiveWriter(memory_store, PREFIX, checkpoint_id="c", participant_kind="agent", instance="i")
    with pytest.raises(InvalidIdentifierError):
        writer.write_raw("dispatch", "../etc", 0, "k", b"{}")
    with pytest.raises(InvalidIdentifierError):
        writer.write_raw("bad kind", "r", 0, "k", b"{}")
    with pytest.raises(InvalidRecordError):
        writer.write_raw("dispatch", "r", -1, "k", b"{}")
    with pytest.raises(InvalidRecordError):
        writer.write_raw("dispatch", "r", True, "k", b"{}")
    with pytest.raises(InvalidRecordError):
        writer.write_raw("dispatch", "r", 0, "", b"{}")
    with pytest.raises(InvalidRecordError):
        writer.write_raw("dispatch", "r", 0, "k", "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidRecordError):
        writer.write_raw("dispatch", "r", 0, "k", b"{}", revision="3")  # type: ignore[arg-type]
    assert writer.commit().index.rows == 0


def test_duplicate_in_open_row_group_refused_at_write(memory_store: MemoryStore) -> None:
    writer = ArchiveWriter(memory_store, PREFIX, checkpoint_id="c", participant_kind="agent", instance="i")
    records = make_records(50, payload_bytes=300)
    for rec in records:
        writer.write(rec)
    # the first copies are still in the open row group: refused at once, the writer goes on
    for rec in (records[0], records[-1]):
        with pytest.raises(InvalidRecordError, match="duplicate member"):
            writer.write(rec)
    with pytest.raises(InvalidRecordError, match="duplicate member"):
        writer.write_raw(*ident(records[5]), b"{}")
    # same key, other attempt: a different member
    writer.write_raw(records[0].kind, records[0].rollout_id, 9, records[0].record_key, b"{}")
    assert writer.commit().index.rows == len(records) + 1


@pytest.mark.parametrize("position", [0, 100, 180])
def test_duplicate_of_an_earlier_row_group_fails_commit(memory_store: MemoryStore, position: int) -> None:
    writer = ArchiveWriter(
        memory_store,
        PREFIX,
        checkpoint_id="c",
        participant_kind="agent",
        instance="i",
        target_shard_bytes=4 << 10,
        row_group_rows=16,
    )
    records = make_records(200, payload_bytes=300)
    for rec in records:
        writer.write(rec)
    writer.write(records[position])  # its first copy is in an uploaded shard or an older row group
    writer.write_raw(records[0].kind, records[0].rollout_id, 9, records[0].record_key, b"{}")
    with pytest.raises(InvalidRecordError, match="duplicate member") as info:
        writer.commit()
    assert info.value.details["key"] == records[position].record_key
    # no manifest: the archive does not exist for readers, and it never will
    with pytest.raises(ObjectNotFoundError):
        ArchiveReader.open(memory_store, PREFIX)
    with pytest.raises(InvalidRecordError, match="duplicate member"):
        writer.commit()
    with pytest.raises(ArchiveStateError):
        writer.write(make_records(201)[200])
    assert not memory_store.exists(writer.manifest_key)


def test_hash_collision_between_distinct_members_is_not_a_duplicate(memory_store: MemoryStore) -> None:
    writer = ArchiveWriter(
        memory_store,
        PREFIX,
        checkpoint_id="c",
        participant_kind="agent",
        instance="i",
        target_shard_bytes=4 << 10,
    )
    records = make_records(120, payload_bytes=300)
    for rec in records:
        writer.write(rec)
    # force 64-bit hash collisions between distinct members: the exact check reads them back
    hashes = writer._hashes
    hashes[3] = hashes[70] = hashes[119]
    manifest = writer.commit()
    assert manifest.index.rows == len(records)
    assert list(ArchiveReader.open(memory_store, PREFIX).iter_records()) == records


def test_manifest_extra_holds_json_values_only(memory_store: MemoryStore) -> None:
    writer, _ = write_archive(memory_store, make_records(3))
    loaded = json.loads(memory_store.get(writer.manifest_key))
    loaded["extra"] = {"executions": [["r1", 0], ["r2", 3]], "nested": {"a": [1.5, None, True]}}
    parsed = parse_component_manifest(json.dumps(loaded))
    assert parsed.extra == loaded["extra"]  # parsed JSON needs no walk: it holds nothing else
    for bad in ({"executions": (("r1", 0),)}, {"blob": b"x"}, {"k": {1: "int key"}}):
        with pytest.raises(ValidationError):  # built in Python, every value is checked
            ComponentManifest.model_validate({**loaded, "extra": bad})
    for not_object in ([["r1", 0]], "x", None):
        with pytest.raises(InvalidRecordError):
            parse_component_manifest(json.dumps({**loaded, "extra": not_object}))


def test_newer_manifest_schema_refused(memory_store: MemoryStore) -> None:
    writer, _ = write_archive(memory_store, make_records(3))
    loaded = json.loads(memory_store.get(writer.manifest_key))
    loaded["schema_version"] = 3  # newer than format version 2
    memory_store.put(writer.manifest_key, json.dumps(loaded).encode())
    with pytest.raises(UnsupportedSchemaError):
        ArchiveReader.open(memory_store, PREFIX)
    with pytest.raises(UnsupportedSchemaError):
        parse_component_manifest(json.dumps(loaded))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda m: m.pop("index"),
        lambda m: m.update(unexpected=1),
        lambda m: m.update(record_counts={"dispatch": 999}),
        lambda m: m["shards"][0].update(key="../../etc/passwd"),
        lambda m: m["shards"][0].update(sha256="nope"),
    ],
)
def test_invalid_manifest_refused(memory_store: MemoryStore, mutate: Any) -> None:
    writer, _ = write_archive(memory_store, make_records(8))
    loaded = json.loads(memory_store.get(writer.manifest_key))
    mutate(loaded)
    with pytest.raises(InvalidRecordError):
        parse_component_manifest(json.dumps(loaded).encode())
    memory_store.put(writer.manifest_key, json.dumps(loaded).encode())
    with pytest.raises(IntegrityError, match=r"manifest\.json"):
        ArchiveReader.open(memory_store, PREFIX)


def test_newer_record_schema_refused(memory_store: MemoryStore) -> None:
    rec = DispatchRecord(rollout_id="r", attempt=0, state="queued")
    payload = json.loads(rec.to_payload())
    payload["schema_version"] = 99
    writer = ArchiveWriter(memory_store, PREFIX, checkpoint_id="c", participant_kind="agent", instance="i")
    writer.write_raw("dispatch", "r", 0, "dispatch", json.dumps(payload).encode(), schema_version=99)
    writer.commit()
    reader = ArchiveReader.open(memory_store, PREFIX)
    reader.verify()  # the bytes are intact; decoding them is what a reader refuses
    assert reader.get_raw("dispatch", "r", 0, "dispatch").schema_version == 99
    with pytest.raises(UnsupportedSchemaError):
        reader.get("dispatch", "r", 0, "dispatch")
    with pytest.raises(UnsupportedSchemaError):
        list(reader.iter_records())


def test_open_missing_manifest(memory_store: MemoryStore) -> None:
    with pytest.raises(ObjectNotFoundError):
        ArchiveReader.open(memory_store, "nothing/here")


def test_open_with_wrong_expected_digest(memory_store: MemoryStore) -> None:
    write_archive(memory_store, make_records(3))
    with pytest.raises(IntegrityError, match=r"manifest\.json"):
        ArchiveReader.open(memory_store, PREFIX, expected_sha256="0" * 64)


# -- memory --------------------------------------------------------------------------------------


def test_buffered_bytes_stay_bounded_by_target(memory_store: MemoryStore) -> None:
    target = 64 << 10
    writer = ArchiveWriter(
        memory_store,
        PREFIX,
        checkpoint_id="c",
        participant_kind="agent",
        instance="i",
        target_shard_bytes=target,
    )
    rng = random.Random(5)
    biggest = 0
    peak = 0
    for i in range(3000):
        payload = rng.randbytes(rng.randrange(1, 3000))
        biggest = max(biggest, len(payload))
        writer.write_raw("blob", f"r{i}", 0, "k", payload)
        peak = max(peak, writer.buffered_bytes)
    manifest = writer.commit()
    total = sum(s.bytes for s in manifest.shards)
    assert total > 20 * target  # far more than one shard went through the writer
    # one row group of Parquet overhead on top of target + one record
    assert target // 2 < peak <= target + biggest + (8 << 10)
    assert all(s.bytes <= target + biggest + (8 << 10) for s in manifest.shards)


# -- open data -----------------------------------------------------------------------------------


def test_shards_are_plain_parquet_for_pyarrow_dataset(local_store: ObjectStore) -> None:
    records = make_records(240)
    _, manifest = write_archive(local_store, records, target_shard_bytes=8 << 10)
    root = local_store.root / PREFIX  # type: ignore[attr-defined]
    paths = [str(root / s.key) for s in manifest.shards]
    # the query docs/format.md shows
    dataset = ds.dataset(paths, format="parquet")
    table = dataset.to_table(
        columns=["rollout_id", "attempt", "key", "revision"],
        filter=(ds.field("kind") == "agent_boundary") & (ds.field("attempt") == 1),
        use_threads=False,  # no Arrow pool threads left to race interpreter exit (arrow#39862)
    )
    expected = sorted(
        (r.rollout_id, r.attempt, r.record_key, r.index_revision())
        for r in records
        if r.kind == "agent_boundary" and r.attempt == 1
    )
    assert (
        expected and sorted(zip(*(table[c].to_pylist() for c in table.column_names), strict=True)) == expected
    )
    kinds = dataset.to_table(columns=["kind"], use_threads=False)
    counts = kinds.group_by("kind").aggregate([("kind", "count")])
    assert dict(zip(counts["kind"].to_pylist(), counts["kind_count"].to_pylist(), strict=True)) == (
        manifest.record_counts
    )
    # and the member index is plain Parquet too
    index = pq.read_table(root / manifest.index.key, use_threads=False)
    assert index.num_rows == len(records) and index.schema.field("shard").type == pa.int32()
    del dataset, table, kinds, counts, index
    gc.collect()  # drop the scanner while Arrow is fully alive


# -- upload order, object count, streaming verification, memory -----------------------------------


class RecordingStore(MemoryStore):
    """Logs every write as (operation, key); optionally loses the answer of the first manifest put."""

    def __init__(self, lose_manifest_answer: bool = False) -> None:
        super().__init__(f"rec-{uuid.uuid4().hex}")
        self.writes: list[tuple[str, str]] = []
        self.lose_manifest_answer = lose_manifest_answer

    def put(self, key: str, data: bytes) -> ObjectInfo:
        self.writes.append(("put", key))
        return super().put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        self.writes.append(("put_if_absent", key))
        result = super().put_if_absent(key, data)
        if self.lose_manifest_answer:
            self.lose_manifest_answer = False
            raise TransientStoreError("the put landed but its answer was lost", key=key)
        return result

    def delete(self, key: str) -> None:
        self.writes.append(("delete", key))
        super().delete(key)


def test_shards_then_index_then_manifest_last_each_written_once() -> None:
    store = RecordingStore()
    writer, manifest = write_archive(store, make_records(300), target_shard_bytes=16 << 10)
    shard_keys = [f"{PREFIX}/{s.key}" for s in manifest.shards]
    assert len(shard_keys) > 2
    # one whole-object put per shard under its unique final name (no temp-then-rename, no
    # overwrite, no delete), then the index, then the create-only manifest: the commit point
    assert store.writes == [
        *(("put", k) for k in shard_keys),
        ("put", f"{PREFIX}/{manifest.index.key}"),
        ("put_if_absent", writer.manifest_key),
    ]
    assert all(writer.writer_id in k for k in shard_keys)
    assert len(store.list(PREFIX)) == len(manifest.shards) + 2
    # shards are zstd-compressed Parquet
    pf = pq.ParquetFile(io.BytesIO(store.get(shard_keys[0])))
    rg = pf.metadata.row_group(0)
    assert {rg.column(c).compression for c in range(rg.num_columns)} == {"ZSTD"}


def test_commit_whose_manifest_answer_was_lost_is_idempotent() -> None:
    store = RecordingStore(lose_manifest_answer=True)
    records = make_records(40)
    writer = ArchiveWriter(store, PREFIX, checkpoint_id="ck-1", participant_kind="agent", instance="a0")
    for rec in records:
        writer.write(rec)
    with pytest.raises(TransientStoreError):
        writer.commit(extra={"k": 1})
    manifest_bytes = store.get(writer.manifest_key)  # the first put landed
    manifest = writer.commit(extra={"k": 1})  # the retry resends the same bytes: success
    assert store.get(writer.manifest_key) == manifest_bytes
    assert writer.manifest_ref == ManifestRef.of(writer.manifest_key, manifest_bytes)
    assert manifest == parse_component_manifest(manifest_bytes)
    assert [op for op, _ in store.writes].count("put_if_absent") == 2
    reader = ArchiveReader.open(store, PREFIX, expected_sha256=writer.manifest_ref.sha256)
    reader.verify()
    assert list(reader.iter_records()) == records


class ChunkSpy(MemoryStore):
    """Records the size of every read made on ``open_read`` files, and forbids whole-object
    ``get`` of shards (verify must stream them)."""

    def __init__(self) -> None:
        super().__init__(f"spy-{uuid.uuid4().hex}")
        self.read_sizes: list[int] = []
        self.opened: list[str] = []

    def get(self, key: str) -> bytes:
        if "/shards/" in key and getattr(self, "forbid_shard_get", False):
            raise AssertionError(f"whole-object get of shard {key}")
        return super().get(key)

    def open_read(self, key: str) -> BinaryIO:
        self.opened.append(key)
        raw = super().open_read(key)
        spy = self

        class Spy(io.RawIOBase):
            def readable(self) -> bool:
                return True

            def readinto(self, buffer: Any) -> int:
                data = raw.read(len(buffer))
                spy.read_sizes.append(len(data))
                buffer[: len(data)] = data
                return len(data)

            def close(self) -> None:
                raw.close()
                super().close()

        return Spy()  # type: ignore[return-value]


def test_verify_streams_shards_in_bounded_chunks() -> None:
    store = ChunkSpy()
    rng = random.Random(7)
    writer = ArchiveWriter(
        store, PREFIX, checkpoint_id="c", participant_kind="agent", instance="i", target_shard_bytes=8 << 20
    )
    for i in range(5):
        writer.write_raw("blob", f"r{i}", 0, "k", rng.randbytes(600 << 10))  # incompressible
    manifest = writer.commit()
    (shard,) = manifest.shards
    assert shard.bytes > 2 << 20  # several chunks' worth
    store.forbid_shard_get = True  # type: ignore[attr-defined]
    ArchiveReader.open(store, PREFIX).verify()
    assert store.opened == [f"{PREFIX}/{shard.key}"]
    assert sum(store.read_sizes) == shard.bytes
    assert max(store.read_sizes) <= 1 << 20  # never more than one 1 MiB chunk at a time


class DiscardingStore(MemoryStore):
    """Keeps uploaded shards as empty objects, so only the writer's own memory is measured."""

    def __init__(self) -> None:
        super().__init__(f"discard-{uuid.uuid4().hex}")

    def put(self, key: str, data: bytes) -> ObjectInfo:
        super().put(key, b"")
        return ObjectInfo(key=key, size=len(data), version="v")

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        class Sink(io.RawIOBase):
            def writable(self) -> bool:
                return True

            def write(self, data: Any) -> int:
                return memoryview(data).nbytes

        yield Sink()  # type: ignore[misc]
        super().put(key, b"")


def _arrow_bytes() -> int:
    """Bytes held by Arrow: the default pool plus the writer's encoding pool, if another."""
    pool = encoding_pool()
    extra = 0 if pool.backend_name == pa.default_memory_pool().backend_name else pool.bytes_allocated()
    return int(pa.total_allocated_bytes()) + int(extra)


def _writer_peak_bytes(
    records: int,
    payload_bytes: int,
    target: int,
    per_rollout: int = 1,
    stream: bool = False,
    source_bytes: int = 1 << 16,
) -> int:
    """Peak of Python (tracemalloc) plus Arrow-pool memory while writing ``records`` members
    (``per_rollout`` members per rollout id)."""
    writer = ArchiveWriter(
        DiscardingStore(),
        "p",
        checkpoint_id="c",
        participant_kind="a",
        instance="i",
        target_shard_bytes=target,
        stream_shards=stream,
    )
    source = random.Random(11).randbytes(source_bytes)  # incompressible payload bytes
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0] + _arrow_bytes()
        peak = 0
        for i in range(records):
            off = (i * 7919) % (len(source) - payload_bytes)
            writer.write_raw(
                "blob", f"r{i // per_rollout}", 0, f"k{i % per_rollout}", source[off : off + payload_bytes]
            )
            if i % 25 == 0:
                peak = max(peak, tracemalloc.get_traced_memory()[0] + _arrow_bytes() - base)
        writer.commit()
    finally:
        tracemalloc.stop()
    return peak


def test_writer_memory_does_not_grow_with_payload_volume() -> None:
    # Same number of members, 40x the payload bytes: the per-member index state is the same in
    # both runs, so any difference is payload the writer holds. It must stay within a small
    # multiple of the target shard size (a writer keeping uploaded shards would hold ~16 MiB more).
    target = 256 << 10
    small = _writer_peak_bytes(4000, 100, target)
    large = _writer_peak_bytes(4000, 4000, target)
    assert large - small <= 4 * target, (small, large)


def test_streamed_writer_memory_does_not_grow_with_the_shard_size() -> None:
    # 16 MB of incompressible payload, once into 4 MiB shards and once into one 64 MiB shard
    # (1 MiB row groups both times): a streamed shard goes out row group by row group, so the
    # writer holds about the same either way (holding its open shard would cost ~12 MiB more).
    fresh = 32 << 20  # no payload repeats another, so zstd cannot shrink the shard
    small = _writer_peak_bytes(4000, 4000, 4 << 20, stream=True, source_bytes=fresh)
    large = _writer_peak_bytes(4000, 4000, 64 << 20, stream=True, source_bytes=fresh)
    assert large - small <= 4 << 20, (small, large)
    buffered = _writer_peak_bytes(4000, 4000, 64 << 20, stream=False, source_bytes=fresh)
    assert buffered - large >= 8 << 20, (large, buffered)  # the measurement can tell the two apart


def test_writer_memory_does_not_grow_with_the_number_of_members() -> None:
    # 10x the members of 50 bytes each: the index is streamed and the duplicate check keeps
    # 8 bytes per member, so 180,000 more members may cost ~1.4 MiB (plus the per-shard footers),
    # not the ~270 bytes per member (~46 MiB) a writer that keeps the index in memory would.
    # (10 members per rollout id, as participants write them: the writer's id-validation cache is
    # bounded, but it does hold more distinct ids in the larger run.)
    target = 1 << 20
    few = _writer_peak_bytes(20_000, 50, target, per_rollout=10)
    many = _writer_peak_bytes(200_000, 50, target, per_rollout=10)
    assert many - few <= 8 << 20, (few, many)


@pytest.mark.parametrize("single_kind", [True, False])
def test_member_counts_read_from_statistics_agree_with_the_column(
    memory_store: MemoryStore, single_kind: bool
) -> None:
    """A cold open checks the index's counts per kind against the manifest: from the row groups'
    statistics when every group holds one kind, else by counting the decoded column; both
    agree with the manifest."""
    records = make_records(240)
    if single_kind:
        records = [r for r in records if r.kind == "agent_boundary"]
    _, manifest = write_archive(memory_store, records, row_group_rows=8)
    index = ArchiveReader.open(memory_store, PREFIX)._member_index()
    from_stats = index._counts_from_statistics()
    counted: dict[str, int] = {}
    for kind in index.column("kind").to_pylist():
        counted[kind] = counted.get(kind, 0) + 1
    assert counted == manifest.record_counts == index.counts()
    if single_kind:
        assert from_stats == counted  # no column decoded for the check
    else:
        assert from_stats is None or from_stats == counted
