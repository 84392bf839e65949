"""The columnar write path (write_columns / write_records), iter_dicts, streamed shards, lazy imports."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import pytest

from rollout_checkpoint.archive import ArchiveStateError, ArchiveWriter
from rollout_checkpoint.errors import (
    IntegrityError,
    InvalidIdentifierError,
    InvalidRecordError,
    ObjectNotFoundError,
    StoreError,
)
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.format.binary_payloads import MAGIC, binary_payload
from rollout_checkpoint.format.records import (
    AgentBoundaryRecord,
    DispatchRecord,
    Record,
    ResourceSnapshotRecord,
)
from rollout_checkpoint.store import LocalStore, MemoryStore, ObjectStore

PREFIX = "checkpoints/c/components/agent/a0"
ROOT = Path(__file__).resolve().parent.parent


def boundaries(n: int, start: int = 0) -> list[AgentBoundaryRecord]:
    return [
        AgentBoundaryRecord(
            rollout_id=f"r{i:05d}",
            attempt=i % 2,
            boundary_index=i % 7,
            turn_index=i % 7,
            last_model_call_id=f"call-{i}",
            resource_revisions={"env-0": {"env": i}},
            output_items=[{"text": "turn " * (i % 9)}, {"ids": list(range(i % 5))}],
            usage={"tokens": i},
            agent_state=None if i % 3 else b"\x00state",
        )
        for i in range(start, start + n)
    ]


def new_writer(store: ObjectStore, **kwargs: Any) -> ArchiveWriter:
    return ArchiveWriter(store, PREFIX, checkpoint_id="c", participant_kind="agent", instance="a0", **kwargs)


def write_as_records(writer: ArchiveWriter, records: list[AgentBoundaryRecord]) -> None:
    writer.write_records(
        "agent_boundary",
        [r.model_dump(mode="json") for r in records],
        key=lambda d: f"{d['boundary_index']:08d}",
        revision="boundary_index",
        refs=lambda d: {
            "model_call": d["last_model_call_id"],
            "pending_model_call": d["pending_model_call_id"],
            "resources": d["resource_revisions"],
        },
    )


@pytest.mark.parametrize("stream", [True, False])
def test_bulk_and_per_record_writes_mix_in_order(stream: bool, local_store: ObjectStore) -> None:
    first, second, third = boundaries(30), boundaries(500, 30), boundaries(40, 530)
    dispatch = [DispatchRecord(rollout_id=f"r{i:05d}", attempt=0, state="running") for i in range(50)]
    writer = new_writer(local_store, target_shard_bytes=64 << 10, row_group_rows=64, stream_shards=stream)
    for rec in first:
        writer.write(rec)
    write_as_records(writer, second)
    writer.write_columns(
        "dispatch",
        [d.rollout_id for d in dispatch],
        [d.attempt for d in dispatch],
        [d.record_key for d in dispatch],
        [d.to_payload() for d in dispatch],
        refs=[d.index_refs() for d in dispatch],
    )
    for rec in third:
        writer.write(rec)
    manifest = writer.commit()
    expected: list[Record] = [*first, *second, *dispatch, *third]
    assert len(manifest.shards) > 2 and manifest.record_counts == {"agent_boundary": 570, "dispatch": 50}
    reader = ArchiveReader.open(local_store, PREFIX)
    reader.verify()
    assert list(reader.iter_records()) == expected
    # the index holds what write() would have put there, whichever path wrote the member
    for ref, rec in zip(reader.members(), expected, strict=True):
        assert (ref.kind, ref.rollout_id, ref.attempt, ref.key) == (
            rec.kind,
            rec.rollout_id,
            rec.attempt,
            rec.record_key,
        )
        assert ref.revision == rec.index_revision() and ref.refs == rec.index_refs()
    for rec in (second[0], second[257], dispatch[49], third[-1]):
        assert reader.get(rec.kind, rec.rollout_id, rec.attempt, rec.record_key) == rec
    assert list(reader.iter_dicts("dispatch")) == [json.loads(d.to_payload()) for d in dispatch]
    assert len(list(reader.iter_dicts())) == len(expected)


def test_bulk_writes_cut_row_groups_and_shards_like_per_record_writes(local_store: ObjectStore) -> None:
    records = boundaries(700)
    layouts = []
    for bulk in (False, True):
        prefix = f"{PREFIX}-{int(bulk)}"
        writer = ArchiveWriter(
            local_store,
            prefix,
            checkpoint_id="c",
            participant_kind="agent",
            instance="a0",
            target_shard_bytes=48 << 10,
            row_group_rows=50,
            row_group_bytes=5 << 10,
        )
        if bulk:
            for i in range(0, len(records), 97):
                write_as_records(writer, records[i : i + 97])
        else:
            for rec in records:
                writer.write_raw(
                    rec.kind,
                    rec.rollout_id,
                    rec.attempt,
                    rec.record_key,
                    orjson.dumps(rec.model_dump(mode="json")),  # the bytes write_records stores
                    rec.index_revision(),
                    rec.index_refs(),
                )
        manifest = writer.commit()
        reader = ArchiveReader.open(local_store, prefix)
        layouts.append(
            (
                [(s.records, s.row_groups) for s in manifest.shards],
                [(m.shard, m.row_group, m.row) for m in reader.members()],
            )
        )
    assert len(layouts[0][0]) > 3 and layouts[0] == layouts[1]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"rollout_ids": ["ok", "bad/id"]}, InvalidIdentifierError),
        ({"rollout_ids": ["ok", "a..b"]}, InvalidIdentifierError),
        ({"attempts": [0, -1]}, InvalidRecordError),
        ({"attempts": [0, True]}, InvalidRecordError),
        ({"keys": ["k", ""]}, InvalidRecordError),
        ({"keys": ["k", "k" * 1025]}, InvalidRecordError),
        ({"payloads": [b"{}", "not bytes"]}, InvalidRecordError),
        ({"revisions": [1, "2"]}, InvalidRecordError),
        ({"keys": ["k"]}, InvalidRecordError),  # columns of different lengths
        ({"rollout_ids": ["same", "same"], "keys": ["k", "k"]}, InvalidRecordError),  # duplicate
    ],
)
def test_a_bad_batch_is_refused_whole(change: dict[str, Any], error: type[Exception]) -> None:
    store = MemoryStore(f"bulk-bad-{uuid.uuid4().hex}")
    writer = new_writer(store)
    writer.write_columns("blob", ["r0"], [0], ["k"], [b"{}"])
    columns: dict[str, Any] = {
        "rollout_ids": ["ok", "ok2"],
        "attempts": [0, 0],
        "keys": ["k", "k"],
        "payloads": [b"{}", b"{}"],
        "revisions": [1, 2],
    }
    columns.update(change)
    revisions = columns.pop("revisions")
    with pytest.raises(error):
        writer.write_columns("blob", **columns, revisions=revisions)
    assert writer.records_written == 1  # nothing of the batch was taken; the writer goes on
    writer.write_columns("blob", ["r1"], [0], ["k"], [b"{}"])
    assert writer.commit().index.rows == 2


def test_a_duplicate_of_an_earlier_member_is_refused_at_commit() -> None:
    store = MemoryStore(f"bulk-dup-{uuid.uuid4().hex}")
    writer = new_writer(store, row_group_rows=8)
    writer.write_columns("blob", [f"r{i}" for i in range(20)], [0] * 20, ["k"] * 20, [b"{}"] * 20)
    with pytest.raises(InvalidRecordError):  # still in the open row group: refused at once
        writer.write_columns("blob", ["r19"], [0], ["k"], [b"{}"])
    writer.write_columns("blob", ["r3"], [0], ["k"], [b"{}"])  # its row group is encoded already
    with pytest.raises(InvalidRecordError, match="duplicate member blob/r3#0/k"):
        writer.commit()
    with pytest.raises(ObjectNotFoundError):
        ArchiveReader.open(store, PREFIX)


def test_iter_dicts_gives_a_binary_payload_as_its_json_form_and_damage_as_integrity_error() -> None:
    """A resource snapshot stored in the binary form (docs/format.md) reads, through
    iter_dicts, as the dict its JSON form parses to, beside JSON members of the same row group;
    a payload that is neither is damage, never skipped."""
    store = MemoryStore(f"bulk-binary-{uuid.uuid4().hex}")
    snaps = [
        ResourceSnapshotRecord(
            rollout_id=f"r{i}",
            attempt=0,
            session_id=f"s{i}",
            revision=i,
            codec="c",
            state=bytes([251, 255, i]),
        )
        for i in range(6)
    ]
    writer = new_writer(store)
    for i, rec in enumerate(snaps):
        if i % 2:
            writer.write(rec)  # JSON
        else:
            header = {k: v for k, v in rec.model_dump(mode="json").items() if k != "state"}
            payload = binary_payload("resource_snapshot", header, rec.state)
            writer.write_raw(
                rec.kind, rec.rollout_id, rec.attempt, rec.record_key, payload, revision=rec.revision
            )
    writer.commit()
    reader = ArchiveReader.open(store, PREFIX)
    assert list(reader.iter_records()) == snaps
    assert list(reader.iter_dicts()) == [json.loads(rec.to_payload()) for rec in snaps]

    damaged = MemoryStore(f"bulk-binary-bad-{uuid.uuid4().hex}")
    writer = new_writer(damaged)
    writer.write(snaps[1])
    writer.write_raw("resource_snapshot", "r9", 0, "s9", MAGIC + b"\x00\x00\xff\xff{}")
    writer.commit()
    with pytest.raises(IntegrityError, match="neither JSON nor a valid binary payload"):
        list(ArchiveReader.open(damaged, PREFIX).iter_dicts())


def test_write_records_refuses_what_is_not_json() -> None:
    writer = new_writer(MemoryStore(f"bulk-json-{uuid.uuid4().hex}"))
    with pytest.raises(InvalidRecordError, match="not JSON"):
        writer.write_records("blob", [{"rollout_id": "r", "attempt": 0, "x": b"raw"}], key=lambda d: "k")
    with pytest.raises(InvalidRecordError, match="rollout_id"):
        writer.write_records("blob", [{"attempt": 0}], key=lambda d: "k")


class FailingShardStreams(LocalStore):
    """Local disk whose shard streams fail after ``fail_after`` writes (the first write is the
    shard's leading magic; the encoded row groups follow in a few large writes)."""

    fail_after = 1

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        with super().open_write(key) as fh:
            if "/shards/" not in key:
                yield fh
                return
            store = self

            class Failing:
                writes = 0

                def write(self, data: Any) -> int:
                    Failing.writes += 1
                    if Failing.writes > store.fail_after:
                        raise StoreError("injected shard stream failure", key=key)
                    return fh.write(data)

            yield Failing()  # type: ignore[misc]


def test_a_failed_shard_stream_breaks_the_writer_and_publishes_nothing(tmp_path: Path) -> None:
    store = FailingShardStreams(str(tmp_path))
    writer = new_writer(store, target_shard_bytes=32 << 10, row_group_rows=16)
    assert writer.stream_shards
    with pytest.raises(ArchiveStateError) as info:
        for i in range(0, 2000, 50):
            write_as_records(writer, boundaries(50, i))
        writer.commit()
    assert isinstance(info.value.__cause__, StoreError)
    with pytest.raises(ArchiveStateError):
        writer.commit()
    writer.abort()
    with pytest.raises(ObjectNotFoundError):
        ArchiveReader.open(store, PREFIX)
    # the failed stream was discarded: no partial shard object, no temp file left behind
    shards = [p for p in tmp_path.rglob("*") if p.is_file() and "shards" in p.parts]
    listed = [i.key for i in store.list(PREFIX) if "/shards/" in i.key]
    assert len(shards) == len(listed)  # only whole, finished shards (unreferenced garbage)


def test_importing_the_package_loads_no_s3_or_cli_stack() -> None:
    code = (
        "import sys, rollout_checkpoint, rollout_checkpoint.archive\n"
        "heavy = ['s3fs', 'aiobotocore', 'botocore', 'typer', 'rich', 'fsspec', 'pyarrow.compute']\n"
        "print([m for m in heavy if m in sys.modules])\n"
        "rollout_checkpoint.Coordinator, rollout_checkpoint.MemoryStore\n"
        "print(sorted(m for m in ('fsspec', 's3fs') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out == ["[]", "['fsspec']"]  # a memory store needs fsspec; S3 is still not loaded


@pytest.mark.slow
def test_peer_store_benchmark_runs_quick(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "peer_store.py")
    proc = subprocess.run(
        [sys.executable, script, "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for key in (
        "write_ratio",
        "rss_ratio",
        "disk_ratio",
        "lookup_speedup",
        "read_all_ratio",
        "sdk_peak_rss_mb",
        "baseline_peak_rss_mb",
    ):
        assert isinstance(result[key], float | int), key
    assert set(result["local"]["500"]) >= {"sdk", "baseline", "write_ratio"}


def test_the_write_path_imports_no_pydantic_parquet_module_or_compute_kernels(tmp_path: Path) -> None:
    """Imports count in the writer's peak memory (issue 9): streaming a batch loads neither the
    record models (pydantic), nor ``pyarrow.parquet`` (and with it pyarrow's S3/GCS/Azure
    bindings), nor Arrow's compute kernels; commit then loads the manifest models only."""
    # pyarrow itself imports pandas (and with it Arrow's compute kernels) on its first Python
    # conversion whenever pandas is installed, as it is beside NeMo Gym; hide pandas so the check
    # is about what the SDK's write path loads, whatever else the environment holds.
    code = (
        "import sys\n"
        "class NoPandas:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pandas':\n"
        "            raise ImportError('pandas hidden by the test')\n"
        "sys.meta_path.insert(0, NoPandas())\n"
        "from rollout_checkpoint.archive import ArchiveWriter\n"
        "from rollout_checkpoint.store import LocalStore\n"
        f"w = ArchiveWriter(LocalStore({str(tmp_path)!r}), 'p', checkpoint_id='c', "
        "participant_kind='agent', instance='a0', row_group_rows=64)\n"
        "recs = [{'rollout_id': f'r{i}', 'attempt': 0, 'text': 'x' * i} for i in range(500)]\n"
        "w.write_records('agent_boundary', recs, key=lambda r: 'k', refs=lambda r: {'m': r['rollout_id']})\n"
        "w.write_raw('dispatch', 'r1', 0, 'k', b'{}')\n"
        "heavy = ['pydantic', 'pyarrow.parquet', 'pyarrow.fs', 'pyarrow._compute',"
        " 'rollout_checkpoint.format.records']\n"
        "print([m for m in heavy if m in sys.modules])\n"
        "w.commit()\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out == ["[]", "['pydantic']"]


def test_the_private_parquet_writer_writes_the_public_writers_bytes() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rollout_checkpoint.archive._parquet_io import open_parquet_writer, read_footer_metadata
    from rollout_checkpoint.archive._schema import (
        SHARD_DICTIONARY_COLUMNS,
        SHARD_SCHEMA,
        SHARD_STATISTICS_COLUMNS,
    )

    n = 300
    table = pa.Table.from_pydict(
        {
            "kind": ["agent_boundary"] * n,
            "rollout_id": [f"r{i}" for i in range(n)],
            "attempt": list(range(n)),
            "key": [f"{i % 7:08d}" for i in range(n)],
            "schema_version": [1] * n,
            "revision": [None if i % 3 else i for i in range(n)],
            "refs": [None if i % 2 else '{"m":"c"}' for i in range(n)],
            "payload": [orjson.dumps({"i": i, "t": "w" * (i % 50)}) for i in range(n)],
        },
        schema=SHARD_SCHEMA,
    )
    options: dict[str, Any] = {
        "compression": "zstd",
        "compression_level": 1,
        "use_dictionary": SHARD_DICTIONARY_COLUMNS,
        "write_statistics": SHARD_STATISTICS_COLUMNS,
        "write_page_index": False,
    }
    outputs = []
    for make in (open_parquet_writer, pq.ParquetWriter):
        sink = pa.BufferOutputStream()
        writer = make(sink, SHARD_SCHEMA, **options)
        writer.write_table(table, row_group_size=128)
        writer.close()
        outputs.append(sink.getvalue().to_pybytes())
    assert outputs[0] == outputs[1]
    metadata = read_footer_metadata(pa.BufferReader(outputs[0]))
    assert (metadata.num_rows, metadata.num_row_groups) == (n, 3)


def test_colliding_positions_agree_in_python_and_arrow() -> None:
    from array import array

    from rollout_checkpoint.archive._index_stream import _colliding_positions_arrow, colliding_positions

    for values in ([], [5], [1, 2, 3], [7, -3, 7, 9, -3, 7, 0], [*range(1000), 999, -(2**63)]):
        hashes = array("q", values)
        if len(values) > 1:
            assert colliding_positions(hashes) == _colliding_positions_arrow(hashes)
        expected = [i for i, v in enumerate(values) if values.count(v) > 1]
        assert colliding_positions(hashes) == expected


def test_packed_payloads_keep_each_payload_and_slice_without_copies() -> None:
    from rollout_checkpoint.archive._bulk import encode_records
    from rollout_checkpoint.archive._schema import RECORD_SCHEMA_VERSION as WRITER_DEFAULT
    from rollout_checkpoint.format.records import RECORD_SCHEMA_VERSION

    assert WRITER_DEFAULT == RECORD_SCHEMA_VERSION
    records = [{"rollout_id": f"r{i}", "attempt": 0, "s": "é" * i} for i in range(20)]
    _, _, _, payloads, _, _ = encode_records(records, "rollout_id", None, None)
    assert len(payloads) == 20
    assert [payloads[i] for i in range(20)] == [orjson.dumps(r) for r in records]
    assert payloads[3:6] == [orjson.dumps(r) for r in records[3:6]]
    assert payloads.arrow(5, 9).to_pylist() == [orjson.dumps(r) for r in records[5:9]]


def test_a_refs_column_encodes_a_shared_object_once_and_each_object_as_itself() -> None:
    from rollout_checkpoint.archive import _bulk

    shared = {"state": "dispatched", "restart_only": False}
    column = [shared, None, {"b": 1, "a": [True]}, shared, {"state": "dispatched", "restart_only": 0}]
    calls: list[object] = []
    real = _bulk.encode_refs

    def spy(refs: object) -> object:
        calls.append(refs)
        return real(refs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_bulk, "encode_refs", spy)
        out = _bulk.encode_refs_column(column)
    assert out == [real(r) for r in column]
    assert out[4] == '{"restart_only":0,"state":"dispatched"}' != out[0]  # equal dicts, other JSON
    assert sum(1 for c in calls if c is shared) == 1
