"""Property: any sequence of records (every kind, random ids and payloads, any shard / row-group
sizes) reads back identically, as records, as members and by point lookup."""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_checkpoint.archive import ArchiveWriter
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
from rollout_checkpoint.store import MemoryStore

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,12}(\.[A-Za-z0-9_-]{1,4})?", fullmatch=True)
attempts = st.integers(min_value=0, max_value=3)
blobs = st.binary(max_size=600)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)

records = st.one_of(
    st.builds(
        AgentBoundaryRecord,
        rollout_id=ids,
        attempt=attempts,
        boundary_index=st.integers(0, 10**6),
        turn_index=st.integers(0, 1000),
        last_model_call_id=st.none() | ids,
        resource_revisions=st.dictionaries(
            ids, st.dictionaries(ids, st.integers(0, 1000), max_size=3), max_size=2
        ),
        output_items=st.lists(json_values, max_size=3),
        usage=st.dictionaries(st.text(max_size=8), st.integers(0, 10**6), max_size=3),
        agent_state=st.none() | blobs,
    ),
    st.builds(
        ResourceSnapshotRecord,
        rollout_id=ids,
        attempt=attempts,
        session_id=ids,
        revision=st.integers(0, 1000),
        codec=st.text(min_size=1, max_size=12),
        state=blobs,
    ),
    st.builds(
        ModelCallLineageRecord,
        rollout_id=ids,
        attempt=attempts,
        call_id=ids,
        parent_call_id=st.none() | ids,
        policy_version=st.text(min_size=1, max_size=12),
        token_key=st.none() | st.text(max_size=30),
    ),
    st.builds(
        lambda r, a, c, cut: ModelCallLineageRecord(
            rollout_id=r, attempt=a, call_id=c, policy_version="v1", token_key=cut.receipt_key, cut=cut
        ),
        ids,
        attempts,
        ids,
        st.builds(
            GenerationCut,
            cut_kind=st.sampled_from(["active_prefix", "terminal_completion"]),
            frozen_buffer_id=ids,
            prefix_token_count=st.integers(0, 10**5),
            prefix_digest=st.text("0123456789abcdef", min_size=64, max_size=64),
            receipt_key=st.text(min_size=1, max_size=30),
            receipt_digest=st.text("0123456789abcdef", min_size=64, max_size=64),
            receipt_length=st.integers(0, 10**6),
        ),
    ),
    st.builds(
        TokenStoreReceipt,
        rollout_id=ids,
        attempt=attempts,
        store=st.text(min_size=1, max_size=10),
        snapshot_id=ids,
        key=st.text(min_size=1, max_size=40),
        digest=st.text(min_size=1, max_size=16),
        length=st.integers(0, 10**9),
    ),
    st.builds(
        CompletedResultRecord,
        rollout_id=ids,
        attempt=attempts,
        result=json_values,
        reward=st.none() | st.floats(allow_nan=False, allow_infinity=False),
        acknowledged=st.booleans(),
    ),
    st.builds(
        DispatchRecord,
        rollout_id=ids,
        attempt=attempts,
        state=st.sampled_from(["queued", "running", "finished", "handed_off", "consumed"]),
        input_digest=st.none() | st.text(max_size=16),
        restart_only=st.booleans(),
    ),
)


def _ident(rec: Record) -> tuple[str, str, int, str]:
    return (rec.kind, rec.rollout_id, rec.attempt, rec.record_key)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.lists(records, max_size=60, unique_by=_ident),
    target=st.integers(min_value=512, max_value=16 << 10),
    row_group_rows=st.integers(min_value=1, max_value=12),
)
def test_any_records_read_back_identically(batch: list[Record], target: int, row_group_rows: int) -> None:
    store = MemoryStore(f"prop-{uuid.uuid4().hex}")
    writer = ArchiveWriter(
        store,
        "arch",
        checkpoint_id="ck",
        participant_kind="agent",
        instance="i",
        target_shard_bytes=target,
        row_group_rows=row_group_rows,
    )
    for rec in batch:
        writer.write(rec)
    manifest = writer.commit()
    reader = ArchiveReader.open(store, "arch")
    reader.verify()
    assert list(reader.iter_records()) == batch
    members = list(reader.members())
    assert [(m.kind, m.rollout_id, m.attempt, m.key) for m in members] == [_ident(r) for r in batch]
    assert [(m.revision, m.refs) for m in members] == [(r.index_revision(), r.index_refs()) for r in batch]
    for rec in batch:
        assert reader.get(*_ident(rec)) == rec
    assert sum(manifest.record_counts.values()) == len(batch)
