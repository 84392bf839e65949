"""Recovery classification: one test per rule, rejections, and the no-payload promise."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from _protocol_fakes import Deployment, FakeTokens, ex
from rollout_checkpoint.errors import CheckpointNotFoundError, CheckpointRejectedError
from rollout_checkpoint.format import layout
from rollout_checkpoint.format.commit_log import read_record
from rollout_checkpoint.reader import RecoveryPlan, list_checkpoints, load_checkpoint, verify_checkpoint
from rollout_checkpoint.store import LocalStore, ObjectStore
from rollout_checkpoint.store._counting import CountingStore


@pytest.fixture()
def store(local_store: LocalStore) -> ObjectStore:
    return local_store


@pytest.fixture()
def tokens(store: ObjectStore) -> FakeTokens:
    return FakeTokens(store)


@pytest.fixture()
def dep(store: ObjectStore, tokens: FakeTokens) -> Iterator[Deployment]:
    deployment = Deployment(store, token_source=tokens)
    yield deployment
    deployment.close()


def _plan(dep: Deployment) -> RecoveryPlan:
    outcome = dep.coordinator.checkpoint()
    assert outcome.clean
    return load_checkpoint(dep.store, outcome.checkpoint_id)


def _one(dep: Deployment, rollout_id: str) -> tuple[str, str]:
    plan = _plan(dep)
    item = plan.rollouts[rollout_id]
    return item.disposition, item.reason


def _check_partition(plan: RecoveryPlan, dispatched: set[str]) -> None:
    completed = {p.rollout_id for p in plan.completed}
    continued = {p.rollout_id for p in plan.continued}
    fresh = {p.rollout_id for p in plan.fresh}
    assert not completed & continued
    assert completed | continued | fresh == dispatched
    assert len(completed) + len(continued) + len(fresh) == len(dispatched)


# -- one test per rule ---------------------------------------------------------------------------


def test_complete_state_continues(dep: Deployment, tokens: FakeTokens) -> None:
    dep.resumable("r", tokens=tokens, parent="c0")
    disposition, _ = _one(dep, "r")
    assert disposition == "continue"


def test_acknowledged_result_is_completed(dep: Deployment) -> None:
    dep.completed("done")
    dep.completed("eaten", consume=True)
    plan = _plan(dep)
    assert plan.rollouts["done"].disposition == "completed"
    assert plan.rollouts["eaten"].disposition == "completed"


def test_completed_wins_over_a_full_continuation_state(dep: Deployment, tokens: FakeTokens) -> None:
    # The agent still holds a boundary of a rollout whose result the framework accepted:
    # never both completed and resumable.
    e = dep.resumable("r", tokens=tokens)
    dep.registry.finish(e)
    dep.registry.hand_off(e, "result")
    plan = _plan(dep)
    assert plan.rollouts["r"].disposition == "completed"
    assert plan.continued == []


def test_finished_but_not_acknowledged_is_not_completed(dep: Deployment) -> None:
    e = dep.running("r")
    dep.registry.finish(e)
    disposition, reason = _one(dep, "r")
    assert disposition == "fresh_dispatch" and reason == "no agent boundary"


def test_never_started_is_fresh(dep: Deployment) -> None:
    dep.dispatch("q")
    assert _one(dep, "q") == ("fresh_dispatch", "never started")


def test_restart_only_flag_is_fresh(dep: Deployment, tokens: FakeTokens) -> None:
    dep.running("r", restart_only=True)
    assert _one(dep, "r") == ("fresh_dispatch", "restart-only execution")


def test_participant_restart_is_fresh(dep: Deployment, tokens: FakeTokens) -> None:
    e = dep.resumable("r", tokens=tokens)
    dep.resources.restart.add(e)
    disposition, reason = _one(dep, "r")
    assert disposition == "fresh_dispatch" and "resources/res-0" in reason


def test_missing_boundary_is_fresh(dep: Deployment) -> None:
    dep.running("r")
    assert _one(dep, "r") == ("fresh_dispatch", "no agent boundary")


def test_resources_revision_mismatch_is_fresh(dep: Deployment, tokens: FakeTokens) -> None:
    dep.resumable("r", tokens=tokens, revision=3, boundary_revision=4)
    disposition, reason = _one(dep, "r")
    assert disposition == "fresh_dispatch" and "revision 4" in reason


def test_missing_resources_snapshot_is_fresh(dep: Deployment, tokens: FakeTokens) -> None:
    dep.resumable("r", tokens=tokens, with_resources=False)
    disposition, reason = _one(dep, "r")
    assert disposition == "fresh_dispatch" and "session 's1'" in reason


def test_missing_model_call_is_fresh(dep: Deployment, tokens: FakeTokens) -> None:
    dep.resumable("r", tokens=tokens, with_lineage=False, with_receipt=False)
    disposition, reason = _one(dep, "r")
    assert disposition == "fresh_dispatch" and "missing from lineage" in reason


def test_lineage_parent_missing_is_fresh(dep: Deployment, tokens: FakeTokens) -> None:
    e = dep.resumable("r", tokens=tokens)
    # a second call whose parent was never committed
    from rollout_checkpoint.format.records import ModelCallLineageRecord

    dep.model.add(
        ModelCallLineageRecord(
            rollout_id=e.rollout_id,
            attempt=e.attempt,
            call_id="c9",
            parent_call_id="ghost",
            policy_version="v",
        )
    )
    disposition, reason = _one(dep, "r")
    assert disposition == "fresh_dispatch" and "parent 'ghost'" in reason


def test_missing_token_receipt_is_fresh(dep: Deployment, tokens: FakeTokens) -> None:
    dep.resumable("r", tokens=tokens, with_receipt=False)
    disposition, reason = _one(dep, "r")
    assert disposition == "fresh_dispatch" and "no token receipt" in reason


def test_call_without_tokens_needs_no_receipt(dep: Deployment, tokens: FakeTokens) -> None:
    dep.resumable("r", token=False)
    assert _one(dep, "r")[0] == "continue"


def test_tombstoned_attempt_is_fresh(dep: Deployment, tokens: FakeTokens) -> None:
    # the participant retired attempt 0 (a stale attempt) while the registry still lists it
    e = dep.running("r")
    dep.agent.track(e)
    dep.agent.retire([e], deadline=2e9)
    dep.agent.track(ex("other"))
    assert _one(dep, "r") == ("fresh_dispatch", "attempt retired by a participant (tombstone 0)")


# -- rejections ------------------------------------------------------------------------------------


def test_receipt_disagreeing_with_snapshot_rejects(dep: Deployment, tokens: FakeTokens) -> None:
    dep.resumable("r", tokens=tokens, receipt_digest="f" * 64)
    cid = dep.coordinator.checkpoint().checkpoint_id
    with pytest.raises(CheckpointRejectedError, match="disagrees with token-store snapshot"):
        load_checkpoint(dep.store, cid)


def test_receipt_missing_from_snapshot_rejects(dep: Deployment, tokens: FakeTokens) -> None:
    dep.resumable("r", receipt_store=tokens.store.name)  # tokens the token store never received
    cid = dep.coordinator.checkpoint().checkpoint_id
    with pytest.raises(CheckpointRejectedError, match="missing from token-store snapshot"):
        load_checkpoint(dep.store, cid)


def test_receipts_without_any_snapshot_reject(store: ObjectStore) -> None:
    dep = Deployment(store)  # no token source
    dep.resumable("r")
    cid = dep.coordinator.checkpoint().checkpoint_id
    with pytest.raises(CheckpointRejectedError, match="no token-store snapshot"):
        load_checkpoint(store, cid)
    dep.close()


def test_unsafe_effect_rejects_whole_checkpoint(dep: Deployment, tokens: FakeTokens) -> None:
    e = dep.resumable("r", tokens=tokens)
    dep.completed("fine")
    dep.resources.declare_unsafe_effect(e, "sent an e-mail")
    cid = dep.coordinator.checkpoint().checkpoint_id
    with pytest.raises(CheckpointRejectedError, match="unsafe external effect") as info:
        load_checkpoint(dep.store, cid)
    assert info.value.code == "checkpoint_rejected" and "sent an e-mail" in info.value.details["reason"]


@pytest.mark.parametrize(
    "damage",
    [
        "record_garbage",
        "aggregate_truncated",
        "aggregate_missing",
        "manifest_altered",
        "manifest_missing",
        "index_truncated",
        "snapshot_altered",
    ],
)
def test_corrupt_or_missing_objects_reject(dep: Deployment, tokens: FakeTokens, damage: str) -> None:
    dep.resumable("r", tokens=tokens)
    cid = dep.coordinator.checkpoint().checkpoint_id
    store = dep.store
    record, _ = read_record(store, cid)
    agent = next(c for c in record.components if c.kind == "agent")
    index_key = next(i.key for i in store.list(agent.prefix + "/index-"))
    snapshot = record.token_snapshot
    assert snapshot is not None
    if damage == "record_garbage":
        store.put(layout.published_key(cid), b'{"type": "global_checkpoint"}')
    elif damage == "aggregate_truncated":
        store.put(record.aggregate.key, store.get(record.aggregate.key)[:-5])
    elif damage == "aggregate_missing":
        store.delete(record.aggregate.key)
    elif damage == "manifest_altered":
        store.put(agent.manifest.key, store.get(agent.manifest.key).replace(b"agent-0", b"agent-0 "))
    elif damage == "manifest_missing":
        store.delete(agent.manifest.key)
    elif damage == "index_truncated":
        store.put(index_key, store.get(index_key)[:-100])
    elif damage == "snapshot_altered":
        key = str(snapshot["key"])
        store.put(key, store.get(key) + b" ")
    with pytest.raises(CheckpointRejectedError):
        load_checkpoint(store, cid)


def test_corrupt_shard_fails_verify_but_not_classification(dep: Deployment, tokens: FakeTokens) -> None:
    dep.resumable("r", tokens=tokens)
    cid = dep.coordinator.checkpoint().checkpoint_id
    shard = next(
        i.key
        for i in dep.store.list(layout.checkpoint_prefix(cid))
        if "/agent/" in i.key and "/shards/" in i.key
    )
    data = bytearray(dep.store.get(shard))
    data[len(data) // 2] ^= 0xFF
    dep.store.put(shard, bytes(data))
    cheap = load_checkpoint(dep.store, cid, verify=False)  # the cheap plan reads indexes only
    assert cheap.rollouts["r"].disposition == "continue"
    assert cheap.unverified and any(n.startswith("unverified") for n in cheap.notes)
    with pytest.raises(CheckpointRejectedError, match="failed verification"):
        verify_checkpoint(dep.store, cid)
    with pytest.raises(CheckpointRejectedError, match="failed verification"):
        load_checkpoint(dep.store, cid)  # the default verifies: fail closed


# -- reading costs and selection ------------------------------------------------------------------


def test_plan_reads_no_shard_payload(dep: Deployment, tokens: FakeTokens) -> None:
    for i in range(20):
        dep.resumable(f"r{i}", tokens=tokens)
    for i in range(5):
        dep.completed(f"done{i}")
    cid = dep.coordinator.checkpoint().checkpoint_id
    counting = CountingStore(dep.store)
    plan = load_checkpoint(counting, cid, verify=False)
    assert plan.counts() == {"completed": 5, "continue": 20, "fresh_dispatch": 0}
    assert counting.keys_read, "the plan was read through the counting store"
    assert not [k for k in counting.keys_read if "/shards/" in k]
    assert plan.bytes_read == counting.bytes_read > 0
    payload = sum(i.size for i in dep.store.list(layout.checkpoint_prefix(cid)) if "/shards/" in i.key)
    assert payload > 0
    _check_partition(plan, {f"r{i}" for i in range(20)} | {f"done{i}" for i in range(5)})


def test_latest_and_listing(dep: Deployment, tokens: FakeTokens) -> None:
    with pytest.raises(CheckpointNotFoundError):
        load_checkpoint(dep.store)
    first = dep.coordinator.checkpoint().checkpoint_id
    dep.dispatch("x")
    second = dep.coordinator.checkpoint().checkpoint_id
    assert load_checkpoint(dep.store).checkpoint_id == second
    listed = list_checkpoints(dep.store)
    assert [p.checkpoint_id for p in listed] == [second, first]
    assert listed[0].latest and not listed[1].latest
    assert load_checkpoint(dep.store, first).rollouts == {}
    # the pointer lost (crash between commit point and pointer move): newest published wins
    dep.store.delete(layout.LATEST_KEY)
    assert load_checkpoint(dep.store).checkpoint_id == second


def test_plan_json_and_registry_rebuild(dep: Deployment, tokens: FakeTokens) -> None:
    dep.resumable("cont", tokens=tokens)
    dep.completed("done")
    dep.dispatch("q")
    plan = _plan(dep)
    data = plan.to_json()
    assert data["counts"] == {"completed": 1, "continue": 1, "fresh_dispatch": 1}
    entries, retired = plan.registry_entries()
    got = {e.rollout_id: (e.attempt, e.state, e.result is not None) for e in entries}
    assert got == {"cont": (1, "running", False), "done": (0, "handed_off", True), "q": (1, "queued", False)}
    assert retired == {"cont": 0, "q": 0}
