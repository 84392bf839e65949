"""Archives written by earlier format versions still read and verify (tests/data/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.format.records import LEGACY_RESOURCES_INSTANCE, AgentBoundaryRecord, decode_record
from rollout_checkpoint.store import LocalStore

DATA = Path(__file__).resolve().parent / "data"
V1_PREFIX = "checkpoints/ck-v1/components/agent/agent-0"


def test_a_version_1_archive_reads_and_verifies(tmp_path: Path) -> None:
    shutil.copytree(DATA / "archive-v1", tmp_path / "v1")
    lines = [json.loads(line) for line in (DATA / "archive-v1.expected.jsonl").read_text().splitlines()]
    expected = [decode_record(line["kind"], json.dumps(line["record"])) for line in lines]
    store = LocalStore(str(tmp_path / "v1"))
    reader = ArchiveReader.open(store, V1_PREFIX)
    # it really is a version-1 archive (written before format version 2)
    shard = pq.ParquetFile(str(tmp_path / "v1" / V1_PREFIX / reader.manifest.shards[0].key))
    assert shard.schema_arrow.metadata[b"rollout_checkpoint.shard"] == b'{"format": 1}'
    reader.verify()
    assert reader.manifest.total_records == len(expected) == 60
    assert list(reader.iter_records()) == expected
    assert [m.rollout_id for m in reader.members()] == [r.rollout_id for r in expected]
    for rec in (expected[0], expected[31], expected[-1]):
        assert reader.get(rec.kind, rec.rollout_id, rec.attempt, rec.record_key) == rec
    dicts = [d for d in reader.iter_dicts()]
    # iter_dicts gives the payloads as stored: the boundaries' pre-instance resource revisions
    # (``{session: revision}``) as written; records read them under the legacy instance
    assert dicts == [line["record"] for line in lines]
    boundary = next(r for r in expected if isinstance(r, AgentBoundaryRecord))
    assert set(boundary.resource_revisions) == {LEGACY_RESOURCES_INSTANCE}
