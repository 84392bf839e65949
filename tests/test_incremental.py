"""Format version 2: incremental checkpoints (member references and output-item chunks).

A checkpoint writes only the members that changed since the component's last published archive
and refers to the others; a growing history costs only its growth. Readers follow every
reference and check every referenced byte; retention keeps what a retained checkpoint refers to.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.errors import CheckpointRejectedError, IntegrityError
from rollout_checkpoint.format import ArchiveReader, layout
from rollout_checkpoint.format.chunks import component_records, read_boundary
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import AgentParticipant, ResourcesParticipant
from rollout_checkpoint.reader import load_checkpoint, verify_checkpoint
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.retention import collect_garbage
from rollout_checkpoint.store import CountingStore, MemoryStore, ObjectStore


class Boom(RuntimeError):
    pass


def _store() -> MemoryStore:
    return MemoryStore(f"inc-{uuid.uuid4().hex}")


class Run:
    """An agent and a resources participant; each turn grows every rollout's history by one item."""

    def __init__(
        self, store: ObjectStore, rollouts: int = 3, *, incremental: bool = True, max_chunks: int = 32
    ):
        self.store = store
        self.agent = AgentParticipant("agent-0")
        self.agent.max_chunks = max_chunks
        self.resources = ResourcesParticipant("res-0", mode="exported")
        self.registry = LiveExecutionRegistry()
        self.coordinator = Coordinator(store, [self.agent, self.resources], self.registry, run_id="test-run")
        for p in (self.agent, self.resources):
            p.incremental_commits = incremental
        self.coordinator.registry_catalog.enabled = incremental
        self.turn = 0
        self.executions: list[ExecutionId] = []
        for i in range(rollouts):
            e = self.registry.dispatch(f"r{i}", input_digest=f"in-{i}")
            self.registry.start(e)
            self.agent.begin(e)
            self.resources.open_session(e, "s", {"n": 0})
            self.agent.boundary(e, _boundary(e, 0, 0))  # parked, no history yet
            self.executions.append(e)

    def step(self, only: list[ExecutionId] | None = None) -> None:
        self.turn += 1
        for e in only if only is not None else self.executions:
            self.agent.start_turn(e)
            rev = self.resources.mutate(e, "s", lambda s: {"n": s["n"] + 1})
            self.agent.boundary(e, _boundary(e, self.turn, rev))

    def close(self) -> None:
        self.agent.close()
        self.resources.close()


def _boundary(e: ExecutionId, turn: int, rev: int) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=e.rollout_id,
        attempt=e.attempt,
        boundary_index=turn,
        turn_index=turn,
        resource_revisions={"res-0": {"s": rev}},
        output_items=[{"turn": t, "text": f"item {t} of {e.rollout_id}"} for t in range(1, turn + 1)],
    )


def _manifest(store: ObjectStore, cid: str, kind: str, instance: str) -> Any:
    return ArchiveReader.open(store, layout.component_prefix(cid, kind, instance)).manifest


def _dispositions(store: ObjectStore, cid: str) -> dict[str, tuple[str, int]]:
    return {r: (p.disposition, p.attempt) for r, p in load_checkpoint(store, cid).rollouts.items()}


# -- what an incremental checkpoint writes -------------------------------------------------------


def test_an_unchanged_checkpoint_writes_no_payload_and_classifies_like_the_full_one() -> None:
    store = _store()
    dep = DemoDeployment(store)
    dep.populate(20)
    first = dep.checkpoint("ck-0").checkpoint_id
    second = dep.checkpoint("ck-1").checkpoint_id
    dep.close()
    record = load_checkpoint(store, second).record
    for ref in record.components:
        manifest = ArchiveReader.open(store, ref.prefix).manifest
        assert manifest.schema_version == 2 and manifest.references is not None, ref.prefix
        assert manifest.references.rows > 0
        assert manifest.shards == [], ref.prefix  # nothing stored again, token receipts included
        if ref.kind == "model":
            assert {"model_lineage", "token_receipt"} <= set(manifest.references.counts)
        assert [b.prefix for b in manifest.bases or []] == [ref.prefix.replace(second, first)]
    verify_checkpoint(store, second)
    assert _dispositions(store, second) == _dispositions(store, first)
    # the first checkpoint of a process has no base: it is a plain version-1 checkpoint
    assert all(
        ArchiveReader.open(store, r.prefix).manifest.schema_version == 1
        for r in load_checkpoint(store, first).record.components
    )


def test_incremental_and_full_checkpoints_of_the_same_state_classify_and_restore_alike() -> None:
    stores = {mode: _store() for mode in ("full", "incremental")}
    restored: dict[str, Any] = {}
    for mode, store in stores.items():
        run = Run(store, 4, incremental=mode == "incremental")
        for turn in range(5):
            run.step(run.executions if turn % 2 == 0 else run.executions[:2])  # r2, r3 idle half the time
            run.coordinator.checkpoint(f"ck-{turn}")
        run.registry.finish(run.executions[3])
        run.coordinator.checkpoint("ck-5")
        run.close()
        fresh = Run(store, 0, incremental=mode == "incremental")
        outcome = fresh.coordinator.restore(verify=True)
        fresh.coordinator.resume(outcome.restore_id)
        restored[mode] = {e.rollout_id: fresh.agent.begin(e.next_attempt()) for e in run.executions[:3]}
        fresh.close()
    for i in range(6):
        assert _dispositions(stores["full"], f"ck-{i}") == _dispositions(stores["incremental"], f"ck-{i}")
        verify_checkpoint(stores["incremental"], f"ck-{i}")
    assert restored["full"] == restored["incremental"]
    assert [len(b.output_items) for b in restored["incremental"].values()] == [5, 5, 5]
    written = {
        mode: sum(
            s.bytes
            for p in list_published(store)
            for r in load_checkpoint(store, p.checkpoint_id).record.components
            for s in ArchiveReader.open(store, r.prefix).manifest.shards
        )
        for mode, store in stores.items()
    }
    assert written["incremental"] < written["full"]


def test_a_growing_history_is_written_once_in_chunks() -> None:
    store = _store()
    run = Run(store, 2)
    for turn in range(1, 5):
        run.step()
        run.coordinator.checkpoint(f"ck-{turn}")
    prefix = layout.component_prefix("ck-4", "agent", "agent-0")
    reader = ArchiveReader.open(store, prefix)
    stored = [m for m in reader.members() if m.base is None]
    referenced = [m for m in reader.members() if m.base is not None]
    # stored: each rollout's new boundary and the chunk of its one new item; referenced: the older chunks
    assert sorted((m.kind, m.rollout_id, m.key) for m in stored) == sorted(
        [("agent_boundary", r, "00000004") for r in ("r0", "r1")]
        + [("output_chunk", r, "00000003-00000004") for r in ("r0", "r1")]
    )
    assert sorted(m.key for m in referenced if m.rollout_id == "r0") == [
        "00000000-00000001",
        "00000001-00000002",
        "00000002-00000003",
    ]
    (boundary,) = [r for r in component_records(reader) if r.rollout_id == "r0"]
    assert boundary == _boundary(run.executions[0], 4, 4)
    run.close()


def test_the_chunk_list_is_bounded_by_a_full_rewrite() -> None:
    store = _store()
    run = Run(store, 1, max_chunks=3)
    for turn in range(1, 8):
        run.step()
        run.coordinator.checkpoint(f"ck-{turn}")
        reader = ArchiveReader.open(store, layout.component_prefix(f"ck-{turn}", "agent", "agent-0"))
        chunks = [m for m in reader.members("output_chunk")]
        assert len(chunks) == (turn - 1) % 3 + 1  # 1, 2, 3, then one chunk again
        (boundary,) = component_records(reader)
        assert boundary == _boundary(run.executions[0], turn, turn)
    # turn 4 would have needed a fourth chunk: the whole history went into one again
    keys = [
        m.key
        for m in ArchiveReader.open(store, layout.component_prefix("ck-4", "agent", "agent-0")).members(
            "output_chunk"
        )
    ]
    assert keys == ["00000000-00000004"]
    run.close()


def test_a_rewritten_history_is_chunked_afresh() -> None:
    store = _store()
    run = Run(store, 1)
    run.step()
    run.step()
    run.coordinator.checkpoint("ck-a")
    e = run.executions[0]
    run.agent.start_turn(e)
    edited = _boundary(e, 3, 3).model_copy(update={"output_items": [{"summary": "compacted"}]})
    run.agent.boundary(e, edited)
    run.coordinator.checkpoint("ck-b")
    (boundary,) = component_records(
        ArchiveReader.open(store, layout.component_prefix("ck-b", "agent", "agent-0"))
    )
    assert boundary.output_items == [{"summary": "compacted"}]
    verify_checkpoint(store, "ck-b")
    run.close()


def _four_checkpoints(store: ObjectStore) -> None:
    run = Run(store, 3)
    for turn in range(1, 5):
        run.step()
        run.coordinator.checkpoint(f"ck-{turn}")  # each stores one new chunk per rollout
    run.close()


def test_one_rollout_is_read_without_any_base_member_index() -> None:
    store = _store()
    _four_checkpoints(store)
    prefix = layout.component_prefix("ck-4", "agent", "agent-0")
    expected = {
        r.rollout_id: r
        for r in component_records(ArchiveReader.open(store, prefix))
        if r.kind == "agent_boundary"
    }
    counting = CountingStore(store)
    reader = ArchiveReader.open(counting, prefix)
    boundary = read_boundary(reader, "r1", 0, "00000004")
    assert boundary == expected["r1"] and len(boundary.output_items) == 4
    bases = [b.prefix for b in reader.manifest.bases or []]
    assert len(bases) == 3
    read = counting.keys_read
    assert not any(k.startswith(tuple(bases)) and "/index-" in k for k in read)
    # GETs: its manifest, index and reference table, then each base's manifest; ranged GETs: the
    # boundary's and the newest chunk's row groups here, then per base the shard footer and the
    # row group of the chunk it stores
    assert dict(counting.requests) == {"get": 3 + 3, "get_range": 2 + 2 * 3}


@pytest.mark.parametrize("how", ["delete", "alter"])
def test_one_rollout_read_rejects_a_damaged_or_missing_chunk(how: str) -> None:
    store = _store()
    _four_checkpoints(store)
    base = layout.component_prefix("ck-2", "agent", "agent-0")
    (shard,) = [s.key for s in ArchiveReader.open(store, base).manifest.shards]
    key = f"{base}/{shard}"
    if how == "delete":
        store.delete(key)
    else:  # one byte in the middle of the payload column's pages: they no longer decode, or differ
        data = bytearray(store.get(key))
        group = pq.ParquetFile(pa.BufferReader(bytes(data))).metadata.row_group(0)
        payload = next(
            group.column(c) for c in range(group.num_columns) if group.column(c).path_in_schema == "payload"
        )
        data[payload.data_page_offset + payload.total_compressed_size // 2] ^= 0x01
        store.put(key, bytes(data))
    reader = ArchiveReader.open(store, layout.component_prefix("ck-4", "agent", "agent-0"))
    with pytest.raises(IntegrityError) as info:
        read_boundary(reader, "r1", 0, "00000004")
    assert info.value.details["key"].startswith(f"{base}/")  # the shard, or the base it belongs to


def test_an_aborted_checkpoint_is_never_a_base() -> None:
    store = _store()
    run = Run(store, 2)
    run.step()
    run.coordinator.checkpoint("ck-0")

    def fail(step: str) -> None:
        if step == "publish":
            raise Boom(step)

    run.coordinator.fault_hook = fail
    with pytest.raises(Boom):
        run.coordinator.checkpoint("ck-aborted")
    run.coordinator.fault_hook = None
    run.coordinator.checkpoint("ck-1")
    for ref in load_checkpoint(store, "ck-1").record.components:
        bases = ArchiveReader.open(store, ref.prefix).manifest.bases or []
        assert all("/ck-aborted/" not in b.prefix for b in bases), ref.prefix
    verify_checkpoint(store, "ck-1")
    run.close()


# -- damaged or missing referenced objects -------------------------------------------------------


def _three_checkpoints(store: ObjectStore) -> list[str]:
    dep = DemoDeployment(store)
    ids = []
    for i in range(3):
        if i < 2:
            dep.populate(10, prefix=f"p{i}")  # ck-0 stores p0, ck-1 stores p1 (and refers to p0)
        ids.append(dep.checkpoint(f"ck-{i}").checkpoint_id)
    dep.close()
    return ids


@pytest.mark.parametrize(
    ("how", "component"),
    [
        ("delete", ("resources", "resources-0")),
        ("alter", ("resources", "resources-0")),
        ("delete", ("model", "policy-0")),  # the token receipts ck-2 refers to
        ("alter", ("model", "policy-0")),
    ],
)
def test_a_damaged_referenced_object_rejects_every_checkpoint_that_refers_to_it(
    how: str, component: tuple[str, str]
) -> None:
    store = _store()
    ck0, ck1, ck2 = _three_checkpoints(store)
    prefix = layout.component_prefix(ck1, *component)
    (shard,) = [s.key for s in ArchiveReader.open(store, prefix).manifest.shards]
    key = f"{prefix}/{shard}"
    if how == "delete":
        store.delete(key)
    else:
        data = bytearray(store.get(key))
        data[len(data) // 3] ^= 0xFF
        store.put(key, bytes(data))
    for cid in (ck2, ck1):  # ck-2 stores nothing of its own there: it refers into ck-1
        with pytest.raises(CheckpointRejectedError) as info:
            verify_checkpoint(store, cid)
        assert key in str(info.value.message)
    plan = load_checkpoint(store, verify=True, fallback=True)
    assert plan.checkpoint_id == ck0
    assert [s.checkpoint_id for s in plan.skipped] == [ck2, ck1]
    assert all(key in s.reason for s in plan.skipped)
    fresh = DemoDeployment(store)
    restored = fresh.coordinator.restore(verify=True, fallback=True)
    assert restored.source_checkpoint_id == ck0
    fresh.coordinator.resume(restored.restore_id)
    fresh.close()


def test_unchanged_token_receipts_are_referred_to_and_every_token_row_still_verified() -> None:
    store = _store()
    dep = DemoDeployment(store)
    dep.populate(10, prefix="p0")
    ck0 = dep.checkpoint("ck-0").checkpoint_id
    dep.populate(10, prefix="p1")
    ck1 = dep.checkpoint("ck-1").checkpoint_id
    dep.close()
    model = [r for r in load_checkpoint(store, ck1).record.components if r.kind == "model"]
    reader = ArchiveReader.open(store, model[0].prefix)
    stored = [m for m in reader.stored_members() if m.kind == "token_receipt"]
    referred = reader.references("token_receipt")
    assert stored and referred  # p1's receipts are new, p0's are referred to
    assert {m.rollout_id.split("-")[0] for m in stored} == {"p1"}
    assert {r.rollout_id.split("-")[0] for r in referred} == {"p0"}
    # a referred-to receipt still names the snapshot it was first exported under; the reader checks
    # it against ck-1's snapshot and, with verify, the token row itself
    (first,) = {
        r.snapshot_id
        for r in component_records(reader)
        if r.kind == "token_receipt" and r.rollout_id.startswith("p0")
    }
    assert first == ck0
    verify_checkpoint(store, ck1)
    # a token row a referred-to receipt depends on: its shard altered (one token changed), then gone
    entries = json.loads(store.get("tokens/snapshots/ck-1.json"))["entries"]
    shard = next(e["shard"] for k, e in entries.items() if k.startswith("p0-"))
    table = pq.read_table(pa.BufferReader(store.get(shard)))
    rows = table.to_pylist()
    rows[0]["generation_token_ids"] = [t + 1 for t in rows[0]["generation_token_ids"]]
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), sink)
    for damage in ("alter", "delete"):
        if damage == "alter":
            store.put(shard, sink.getvalue().to_pybytes())
        else:
            store.delete(shard)
        with pytest.raises(CheckpointRejectedError) as info:
            verify_checkpoint(store, ck1)
        assert rows[0]["key"] in info.value.message or shard in info.value.message


def test_a_missing_base_manifest_rejects_the_checkpoint_even_without_verify() -> None:
    store = _store()
    _, ck1, ck2 = _three_checkpoints(store)
    store.delete(layout.component_prefix(ck1, "agent", "agent-0") + "/manifest.json")
    with pytest.raises(CheckpointRejectedError, match="base archive manifest is missing"):
        load_checkpoint(store, ck2)


@pytest.mark.parametrize(
    ("how", "component"),
    [
        ("delete", ("agent", "agent-0")),
        ("alter", ("agent", "agent-0")),
        ("delete", ("framework", "registry")),
    ],
)
def test_a_base_that_vanished_or_changed_is_never_pinned(how: str, component: tuple[str, str]) -> None:
    store = _store()
    run = Run(store, 2)
    for turn in (1, 2):
        run.step()
        run.coordinator.checkpoint(f"ck-{turn}")  # ck-2 pins ck-1's archives
    key = layout.component_prefix("ck-1", *component) + "/manifest.json"
    if how == "delete":
        store.delete(key)
    else:
        store.put(key, store.get(key).replace(b'"instance"', b' "instance"'))  # same meaning, new bytes
    run.step()
    with pytest.raises(IntegrityError) as info:  # the publisher checks every pin of ck-3
        run.coordinator.checkpoint("ck-3")
    assert info.value.details["key"] == key
    assert sorted(_published(store)) == ["ck-1", "ck-2"]
    run.coordinator.checkpoint("ck-4")  # the catalogs named the aborted ck-3: a full checkpoint
    for ref in load_checkpoint(store, "ck-4").record.components:
        assert not ArchiveReader.open(store, ref.prefix).manifest.bases, ref.prefix
    verify_checkpoint(store, "ck-4")
    run.close()


def test_a_missing_chunk_never_yields_a_restorable_boundary() -> None:
    store = _store()
    run = Run(store, 1)
    for turn in range(1, 4):
        run.step()
        run.coordinator.checkpoint(f"ck-{turn}")
    run.close()
    # ck-2 stored chunk [1, 2); ck-3 refers to it: delete the shard that holds it
    prefix = layout.component_prefix("ck-2", "agent", "agent-0")
    for s in ArchiveReader.open(store, prefix).manifest.shards:
        store.delete(f"{prefix}/{s.key}")
    with pytest.raises(CheckpointRejectedError):
        verify_checkpoint(store, "ck-3")
    fresh = Run(store, 0)
    with pytest.raises(CheckpointRejectedError):
        fresh.coordinator.restore(verify=True)
    outcome = fresh.coordinator.restore(verify=True, fallback=True)
    assert outcome.source_checkpoint_id == "ck-1"
    assert [s.checkpoint_id for s in outcome.plan.skipped] == ["ck-3", "ck-2"]
    fresh.coordinator.resume(outcome.restore_id)
    fresh.close()


# -- a version-1 store upgraded in place ----------------------------------------------------------


def test_a_version_1_store_upgraded_in_place_reads_and_verifies_across_the_boundary() -> None:
    store = _store()
    run = Run(store, 3, incremental=False)
    for turn in range(1, 3):
        run.step()
        run.coordinator.checkpoint(f"v1-{turn}")
    for p in (run.agent, run.resources):
        p.incremental_commits = True
    run.coordinator.registry_catalog.enabled = True
    run.step(run.executions[:1])
    run.coordinator.checkpoint("v2-3")
    run.close()
    for ref in load_checkpoint(store, "v1-2").record.components:
        assert ArchiveReader.open(store, ref.prefix).manifest.schema_version == 1
    bases = {
        b.prefix
        for ref in load_checkpoint(store, "v2-3").record.components
        for b in ArchiveReader.open(store, ref.prefix).manifest.bases or []
    }
    assert bases and all("/v1-2/" in b for b in bases)  # refers into the full version-1 archives
    for cid in ("v1-1", "v1-2", "v2-3"):
        verify_checkpoint(store, cid)
    assert {r: d for r, (d, _) in _dispositions(store, "v2-3").items()} == {
        f"r{i}": "continue" for i in range(3)
    }
    collect_garbage(store, keep=1, min_age_s=0)
    verify_checkpoint(store, "v2-3")


# -- retention ------------------------------------------------------------------------------------


def _gc_world() -> MemoryStore:
    store = _store()
    run = Run(store, 3)
    for turn in range(1, 5):
        run.step(run.executions[: 1 + turn % 3])
        run.coordinator.checkpoint(f"ck-{turn}")
    run.close()
    return store


def _published(store: ObjectStore) -> list[str]:
    return [p.checkpoint_id for p in list_published(store)]


def test_gc_keeps_what_retained_checkpoints_refer_to_and_dry_run_counts_match() -> None:
    store = _gc_world()
    dry = collect_garbage(store, keep=1, min_age_s=0, dry_run=True)
    real = collect_garbage(store, keep=1, min_age_s=0)
    assert dry.deleted_objects == real.deleted_objects > 0
    assert dry.referenced_prefixes == real.referenced_prefixes != []
    assert _published(store) == ["ck-4"]
    verify_checkpoint(store, "ck-4")
    # once nothing retained refers to them any more, the kept archives go too
    run = Run(store, 0)
    outcome = run.coordinator.restore()
    run.coordinator.resume(outcome.restore_id)
    for e in list(run.registry.executions()):
        run.agent.begin(e.execution)
    run.coordinator.checkpoint("ck-fresh")  # a fresh process: a full checkpoint, no base
    run.close()
    collect_garbage(store, keep=1, min_age_s=0)
    collect_garbage(store, keep=1, min_age_s=0)
    left = {i.key.split("/")[1] for i in store.list(layout.CHECKPOINTS_PREFIX)}
    assert left == {"ck-fresh"}
    verify_checkpoint(store, "ck-fresh")


def test_a_crash_at_every_gc_step_leaves_every_retained_checkpoint_verifying() -> None:
    steps: list[str] = []
    collect_garbage(_gc_world(), keep=2, min_age_s=0, fault_hook=steps.append)
    assert any(s.startswith("delete:") for s in steps)
    for k in range(len(steps)):
        store = _gc_world()
        seen: list[str] = []

        def hook(step: str, k: int = k, seen: list[str] = seen) -> None:
            seen.append(step)
            if len(seen) == k + 1:
                raise Boom(step)

        with pytest.raises(Boom):
            collect_garbage(store, keep=2, min_age_s=0, fault_hook=hook)
        for cid in _published(store):
            verify_checkpoint(store, cid)
        dry = collect_garbage(store, keep=2, min_age_s=0, dry_run=True)
        real = collect_garbage(store, keep=2, min_age_s=0)
        assert dry.deleted_objects == real.deleted_objects
        assert sorted(_published(store)) == ["ck-3", "ck-4"]
        for cid in _published(store):
            verify_checkpoint(store, cid)


def test_stored_locations_are_the_stored_members_identities_and_locations() -> None:
    """The catalog of the last commit is built from ``stored_locations`` (columns, no member
    objects): the same identities and (shard, row group, row) as ``stored_members``, in order."""
    store = _store()
    dep = DemoDeployment(store)
    dep.populate(30, prefix="p0")
    ck0 = dep.checkpoint("ck-0").checkpoint_id
    dep.close()
    for ref in load_checkpoint(store, ck0).record.components:
        reader = ArchiveReader.open(store, ref.prefix)
        expected = [
            ((m.kind, m.rollout_id, m.attempt, m.key), m.shard, m.row_group, m.row)
            for m in reader.stored_members()
        ]
        assert expected
        assert list(reader.stored_locations()) == expected


def test_a_reported_boundary_is_sealed_when_reported_and_a_commit_seals_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Format 2 seals a run's new history into its chunk when the boundary is reported (outside
    any pause); a commit of a run that did not move since seals nothing, and what it writes is
    the same history, chunk after chunk."""
    from rollout_checkpoint.participants import agent as agent_module

    store = _store()
    run = Run(store, 3)
    run.step()
    run.coordinator.checkpoint("ck-1")
    run.step()
    run.step()  # two reports since ck-1: the second one's sealing is the one kept
    sealed: list[str] = []
    real = agent_module.seal_chunks

    def spy(saved: Any, chunks: Any, max_chunks: int) -> Any:
        out = real(saved, chunks, max_chunks)
        if out is not chunks:  # a new chunk was sealed (not: nothing new to seal)
            sealed.append(saved.rollout_id)
        return out

    monkeypatch.setattr(agent_module, "seal_chunks", spy)
    run.coordinator.checkpoint("ck-2")
    assert sealed == []
    run.step(only=[run.executions[0]])  # sealed on report, on top of the chunks ck-2 holds
    assert sealed == ["r0"]
    run.coordinator.checkpoint("ck-3")
    assert sealed == ["r0"]
    for cid, turn in (("ck-2", 3), ("ck-3", 4)):
        reader = ArchiveReader.open(store, layout.component_prefix(cid, "agent", "agent-0"))
        boundaries = {b.rollout_id: b for b in component_records(reader)}
        assert boundaries["r0"] == _boundary(run.executions[0], turn, turn)
        assert boundaries["r1"] == _boundary(run.executions[1], 3, 3)
    verify_checkpoint(store, "ck-3")
    run.close()


def test_member_columns_are_the_members_by_kind_stored_and_referenced() -> None:
    # what classification reads in bulk: every member of members(), grouped by kind, in order
    store = _store()
    _four_checkpoints(store)
    plan = load_checkpoint(store, "ck-4", verify=False)
    names = ("rollout_id", "attempt", "key", "revision", "refs")
    referenced = 0

    def canonical(text: str | None) -> str | None:
        return None if text is None else json.dumps(json.loads(text), sort_keys=True)

    for reader in plan.readers.values():
        expected: dict[str, dict[str, list[Any]]] = {}
        for m in reader.members():
            columns = expected.setdefault(m.kind, {name: [] for name in names})
            refs = None if m.refs is None else json.dumps(m.refs, sort_keys=True)
            for name, value in zip(names, (m.rollout_id, m.attempt, m.key, m.revision, refs), strict=True):
                columns[name].append(value)
            referenced += m.base is not None
        got = reader.member_columns(dict.fromkeys(expected, names))
        for columns in got.values():
            columns["refs"] = [canonical(t) for t in columns["refs"]]
        assert got == expected
        # a kind not asked for: its non-null refs texts only
        texts = reader.member_columns({})
        assert {k: [canonical(t) for t in c["refs"]] for k, c in texts.items()} == {
            k: [t for t in c["refs"] if t is not None] for k, c in expected.items()
        }
    assert referenced  # the later checkpoints refer to their bases' members
