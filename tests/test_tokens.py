"""Token store contracts and the object-store reference implementation (local disk and S3)."""

from __future__ import annotations

import json

import pytest

from rollout_checkpoint.errors import (
    IntegrityError,
    InvalidRecordError,
    ObjectExistsError,
    ObjectNotFoundError,
)
from rollout_checkpoint.format.records import ModelCallLineageRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.store import ObjectStore
from rollout_checkpoint.tokens import (
    InMemoryLineageStore,
    LineageStore,
    ObjectStoreTokenStore,
    TokenEntry,
    TokenSink,
    TokenSource,
    load_snapshot,
)


def entry(call: str, rollout: str = "r1", attempt: int = 0, n: int = 3) -> TokenEntry:
    return TokenEntry(
        rollout_id=rollout,
        attempt=attempt,
        call_id=call,
        prompt_token_ids=[1, 2, 3, 4],
        generation_token_ids=list(range(10, 10 + n)),
        generation_log_probs=[-0.1 * (i + 1) / 3 for i in range(n)],  # not float32-exact
        mask=[1] * (n - 1) + [0],
    )


def shards(store: ObjectStore) -> list[str]:
    return [i.key for i in store.list("tokens/shards/")]


@pytest.mark.parametrize(
    "changes",
    [
        {"generation_log_probs": [-0.1]},
        {"mask": [1, 1]},
        {"mask": [1, 2, 1]},
        {"generation_token_ids": [1, -2, 3]},
        {"generation_log_probs": [0.0, float("nan"), 0.0]},
        {"call_id": "../x"},
    ],
)
def test_token_entry_validates_alignment_and_values(changes: dict[str, object]) -> None:
    fields = entry("c0").model_dump() | changes
    with pytest.raises(InvalidRecordError) as info:  # a typed error, pydantic's detail kept
        TokenEntry(**fields)
    assert info.value.code == "invalid_record" and "[type=" in info.value.message


def test_reference_implementations_satisfy_the_protocols(local_store: ObjectStore) -> None:
    tokens = ObjectStoreTokenStore(local_store)
    assert isinstance(tokens, TokenSink) and isinstance(tokens, TokenSource)
    assert isinstance(InMemoryLineageStore(), LineageStore)


@pytest.fixture(params=["local", "s3"])
def token_backend(request: pytest.FixtureRequest) -> ObjectStore:
    return request.getfixturevalue(f"{request.param}_store")  # type: ignore[no-any-return]


def test_round_trip_snapshot_and_verification(token_backend: ObjectStore) -> None:
    tokens = ObjectStoreTokenStore(token_backend)
    receipts = [tokens.put(entry(f"c{i}")) for i in range(3)]
    receipts += tokens.put_many([entry("c3", attempt=1), entry("c4", rollout="r2")])
    assert len(shards(token_backend)) == 4  # one per put, one for the batch
    for i, receipt in enumerate(receipts[:3]):
        assert receipt.key == f"r1/a0/c{i}"
        assert tokens.get(receipt.key) == entry(f"c{i}")

    snap = tokens.snapshot("ckpt-1")
    assert (snap.checkpoint_id, snap.snapshot_id, snap.entries) == ("ckpt-1", "ckpt-1", 5)
    assert snap.key == "tokens/snapshots/ckpt-1.json"
    listed = load_snapshot(token_backend, snap)
    assert {k: (e.digest, e.length) for k, e in listed.items()} == {
        r.key: (r.digest, r.length) for r in receipts
    }
    # A second process sees the same entries (it indexes shards it did not write).
    other = ObjectStoreTokenStore(token_backend)
    assert other.get("r2/a0/c4") == entry("c4", rollout="r2")
    # Manifests hold digests, never token arrays.
    assert b"prompt_token_ids" not in token_backend.get(snap.key)


def test_put_is_idempotent_per_call_id(local_store: ObjectStore) -> None:
    tokens = ObjectStoreTokenStore(local_store)
    first = tokens.put(entry("c0"))
    assert tokens.put(entry("c0")) == first
    assert len(shards(local_store)) == 1
    with pytest.raises(ObjectExistsError):
        tokens.put(entry("c0", n=4))  # same call id, different tokens
    with pytest.raises(ObjectExistsError):
        tokens.put_many([entry("c1"), entry("c1", n=5)])
    assert len(shards(local_store)) == 1


def test_conflicting_duplicates_across_processes_are_detected(local_store: ObjectStore) -> None:
    ObjectStoreTokenStore(local_store).put(entry("c0"))
    ObjectStoreTokenStore(local_store).put(entry("c0", n=5))
    with pytest.raises(IntegrityError):
        ObjectStoreTokenStore(local_store).snapshot("ckpt-1")


def test_snapshot_is_create_only_and_the_first_one_wins(local_store: ObjectStore) -> None:
    tokens = ObjectStoreTokenStore(local_store)
    tokens.put(entry("c0"))
    first = tokens.snapshot("ckpt-1")
    tokens.put(entry("c1"))
    assert tokens.snapshot("ckpt-1") == first  # a retry after a lost answer
    assert tokens.snapshot("ckpt-2").entries == 2


def test_tampered_truncated_or_missing_snapshot_is_detected(local_store: ObjectStore) -> None:
    tokens = ObjectStoreTokenStore(local_store)
    tokens.put(entry("c0"))
    receipt = tokens.snapshot("ckpt-1")
    data = local_store.get(receipt.key)
    body = json.loads(data)
    body["entries"]["r1/a0/c0"]["digest"] = "0" * 64
    tampered = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert len(tampered) == len(data)
    local_store.put(receipt.key, tampered)
    with pytest.raises(IntegrityError, match="altered"):
        load_snapshot(local_store, receipt)
    local_store.put(receipt.key, data[:-10])
    with pytest.raises(IntegrityError, match="bytes"):
        load_snapshot(local_store, receipt)
    local_store.delete(receipt.key)
    with pytest.raises(IntegrityError, match="missing"):
        load_snapshot(local_store, receipt)


def test_a_tampered_shard_fails_its_digest_on_read(local_store: ObjectStore) -> None:
    writer = ObjectStoreTokenStore(local_store)
    receipt = writer.put(entry("c0"))
    [shard] = shards(local_store)
    reader = ObjectStoreTokenStore(local_store)
    altered = entry("c0").model_copy(update={"generation_token_ids": [99, 98, 97]})
    forged = ObjectStoreTokenStore(local_store)._encode([(altered, receipt)])
    local_store.put(shard, forged)
    with pytest.raises(IntegrityError, match="altered"):
        reader.get(receipt.key)
    with pytest.raises(ObjectNotFoundError):
        reader.get("r1/a0/nothing")


def test_in_memory_lineage_store() -> None:
    store = InMemoryLineageStore()
    execution = ExecutionId(rollout_id="r1", attempt=0)
    row = ModelCallLineageRecord(rollout_id="r1", attempt=0, call_id="c0", policy_version="v1")
    store.record(row)
    store.record(row)
    assert store.lineage(execution) == [row]
    with pytest.raises(ObjectExistsError):
        store.record(row.model_copy(update={"policy_version": "v2"}))
    store.drop(execution)
    assert store.lineage(execution) == []


def test_batching_sink_groups_concurrent_puts_and_returns_only_durable_receipts(
    memory_store: ObjectStore,
) -> None:
    import threading

    from rollout_checkpoint.tokens import BatchingTokenSink

    tokens = ObjectStoreTokenStore(memory_store)
    sink = BatchingTokenSink(tokens, linger=0.02)
    receipts: dict[str, object] = {}
    durable: dict[str, bool] = {}

    def put(i: int) -> None:
        receipt = sink.put(entry(f"c{i}"))
        receipts[f"c{i}"] = receipt
        # durable when returned: a store instance that never saw the write reads it back
        durable[f"c{i}"] = ObjectStoreTokenStore(memory_store).get(receipt.key) == entry(f"c{i}")

    threads = [threading.Thread(target=put, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(durable.values()) and len(durable) == 16
    assert receipts["c3"] == entry("c3").receipt()
    assert sink.batches < 16 and len(shards(memory_store)) == sink.batches


def test_batching_sink_fails_only_the_caller_whose_entry_conflicts(memory_store: ObjectStore) -> None:
    import threading

    from rollout_checkpoint.tokens import BatchingTokenSink

    tokens = ObjectStoreTokenStore(memory_store)
    tokens.put(entry("taken", n=2))
    sink = BatchingTokenSink(tokens, linger=0.02)
    errors: dict[str, BaseException] = {}

    def put(name: str, n: int) -> None:
        try:
            sink.put(entry(name, n=n))
        except BaseException as exc:
            errors[name] = exc

    threads = [threading.Thread(target=put, args=(name, 3)) for name in ("taken", "free-1", "free-2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(errors) == {"taken"} and isinstance(errors["taken"], ObjectExistsError)
    assert tokens.get(entry("free-1").key) == entry("free-1")
