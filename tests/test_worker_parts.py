"""A worker group's component archive refers to the parts its workers wrote (format 2, "Parts").

Each worker writes its share once, as ``<component>/parts/<worker_id>``, incrementally against
its own previous part; the group's manifest stores nothing and refers to every member of every
part (one hop). Readers check every referenced byte; retention keeps the parts a retained
checkpoint refers to and collects the rest, crash-safely.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from _protocol_fakes import ScriptedParticipant
from rollout_checkpoint.archive import ArchiveWriter, RawArchiveReader
from rollout_checkpoint.cli._archive import inspect_store, verify_store
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.errors import CheckpointRejectedError, IntegrityError, InvalidRecordError
from rollout_checkpoint.format import ArchiveReader, layout
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.format.records import AgentBoundaryRecord, ResourceSnapshotRecord
from rollout_checkpoint.reader import load_checkpoint, verify_checkpoint
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.retention import collect_garbage
from rollout_checkpoint.server import WorkerGroup, checkpoint_router, serve_thread
from rollout_checkpoint.store import MemoryStore, ObjectStore

TOKEN = "tok-worker-parts-secret"
KIND, INSTANCE = "resources", "counter-0"
ROLLOUTS = [f"w{w}-r{j}" for w in range(2) for j in range(3)]


class Boom(RuntimeError):
    pass


def _snapshot(rollout_id: str, revision: int) -> ResourceSnapshotRecord:
    return ResourceSnapshotRecord(
        rollout_id=rollout_id, attempt=0, session_id="s", revision=revision, codec="json", state=b"{}"
    )


def _boundary(rollout_id: str, revision: int) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=rollout_id,
        attempt=0,
        boundary_index=revision,
        turn_index=revision,
        resource_revisions={INSTANCE: {"s": revision}},
    )


class World:
    """A worker group of two in-thread workers (each on its own Unix socket), an in-process
    agent, a registry and a coordinator: checkpoints go through the group's ``commit``."""

    def __init__(self, store: ObjectStore, stack: contextlib.ExitStack, sockets: Path) -> None:
        self.store = store
        self.group = WorkerGroup(store, expected_workers=2, token=TOKEN)
        self.workers = [ScriptedParticipant(KIND, INSTANCE) for _ in range(2)]
        self.agent = ScriptedParticipant("agent", "agent-0")
        registry = LiveExecutionRegistry()
        for i, worker in enumerate(self.workers):
            app = FastAPI()
            app.include_router(checkpoint_router(worker, token=TOKEN))
            sock = str(sockets / f"{uuid.uuid4().hex[:8]}.sock")
            stack.enter_context(serve_thread(app, uds=sock))
            self.group.register(f"w{i}", sock, os.getpid(), worker.capabilities())
        for rollout_id in ROLLOUTS:
            registry.start(registry.dispatch(rollout_id, input_digest=rollout_id))
            self.worker_of(rollout_id).add(_snapshot(rollout_id, 1))
            self.agent.add(_boundary(rollout_id, 1))
        self.coordinator = Coordinator(store, [self.agent, self.group], registry, run_id="test-run")
        stack.callback(self.close)

    def worker_of(self, rollout_id: str) -> ScriptedParticipant:
        return self.workers[int(rollout_id[1])]

    def move(self, rollout_id: str, revision: int) -> None:
        """One rollout takes a turn: its session and boundary change."""
        worker = self.worker_of(rollout_id)
        with worker._cond:
            worker.records[_ex(rollout_id)] = [_snapshot(rollout_id, revision)]
        with self.agent._cond:
            self.agent.records[_ex(rollout_id)] = [_boundary(rollout_id, revision)]

    def close(self) -> None:
        self.group.close()
        for p in (*self.workers, self.agent):
            p.close()


def _ex(rollout_id: str) -> object:
    from rollout_checkpoint.ids import ExecutionId

    return ExecutionId(rollout_id=rollout_id, attempt=0)


@contextlib.contextmanager
def world(store: ObjectStore, tmp_path: Path) -> Iterator[World]:
    with contextlib.ExitStack() as stack:
        yield World(store, stack, tmp_path)


def _three_checkpoints(store: ObjectStore, tmp_path: Path) -> list[str]:
    """ck-1 writes everything; ck-2 one moved rollout per worker; ck-3 nothing changed."""
    with world(store, tmp_path) as w:
        w.coordinator.checkpoint("ck-1")
        w.move("w0-r0", 2)
        w.move("w1-r2", 2)
        w.coordinator.checkpoint("ck-2")
        w.coordinator.checkpoint("ck-3")
    return ["ck-1", "ck-2", "ck-3"]


def _component(store: ObjectStore, cid: str) -> RawArchiveReader:
    return RawArchiveReader.open(store, layout.component_prefix(cid, KIND, INSTANCE))


def _part(cid: str, worker: str) -> str:
    return layout.component_part_prefix(cid, KIND, INSTANCE, worker)


def test_each_record_is_written_once_by_its_worker_and_increments_refer_to_earlier_parts(
    tmp_path: Path,
) -> None:
    store = MemoryStore(f"parts-{uuid.uuid4().hex}")
    _three_checkpoints(store, tmp_path)
    stored = {
        cid: {w: RawArchiveReader.open(store, _part(cid, w)).manifest.total_records for w in ("w0", "w1")}
        for cid in ("ck-1", "ck-2", "ck-3")
    }
    # ck-1: each worker stores its three sessions; ck-2: only the moved one; ck-3: nothing
    assert stored == {"ck-1": {"w0": 3, "w1": 3}, "ck-2": {"w0": 1, "w1": 1}, "ck-3": {"w0": 0, "w1": 0}}
    for cid in ("ck-1", "ck-2", "ck-3"):
        group = _component(store, cid)
        assert group.manifest.shards == [] and group.manifest.total_records == 0  # stores nothing
        members = sorted((m.rollout_id, m.revision) for m in group.members())
        moved = {"w0-r0", "w1-r2"} if cid != "ck-1" else set()
        assert members == sorted((r, 2 if r in moved else 1) for r in ROLLOUTS)
        # one hop: every base is a part (this checkpoint's or an earlier one's), never a group
        bases = [b.prefix for b in group.manifest.bases or []]
        assert {_part(cid, "w0"), _part(cid, "w1")} <= set(bases)
        assert all("/parts/" in b for b in bases)
        verify_checkpoint(store, cid)
    ck3 = _component(store, "ck-3")
    assert sorted(b.prefix for b in ck3.manifest.bases or []) == sorted(
        [_part(c, w) for c in ("ck-1", "ck-2", "ck-3") for w in ("w0", "w1")]
    )
    plan = load_checkpoint(store, verify=True)
    assert plan.checkpoint_id == "ck-3"
    assert store.list("_workers/") == []
    # inspect lists each part as an archive of its own, not as the group's unreferenced objects
    listed = inspect_store(store)["components"]
    assert all(c["unreferenced"] == [] and c["missing"] == [] for c in listed)
    assert {c["prefix"] for c in listed} >= {
        _part("ck-1", "w0"),
        layout.component_prefix("ck-1", KIND, INSTANCE),
    }
    assert all(f.ok for f in verify_store(store))


@pytest.mark.parametrize("how", ["delete", "alter"])
def test_a_damaged_part_rejects_every_checkpoint_that_refers_to_it(tmp_path: Path, how: str) -> None:
    store = MemoryStore(f"parts-{uuid.uuid4().hex}")
    _three_checkpoints(store, tmp_path)
    part = RawArchiveReader.open(store, _part("ck-2", "w1"))  # stores w1-r2 at revision 2
    key = part.key_of(part.manifest.shards[0].key)
    if how == "delete":
        store.delete(key)
    else:
        data = bytearray(store.get(key))
        data[len(data) // 2] ^= 0xFF
        store.put(key, bytes(data))
    for cid in ("ck-3", "ck-2"):  # ck-3 stores nothing of w1-r2: it refers into ck-2's part
        with pytest.raises(CheckpointRejectedError) as info:
            verify_checkpoint(store, cid)
        assert key in info.value.message
    plan = load_checkpoint(store, verify=True, fallback=True)
    assert plan.checkpoint_id == "ck-1"
    assert [s.checkpoint_id for s in plan.skipped] == ["ck-3", "ck-2"]
    assert all(key in s.reason for s in plan.skipped)


def _gc_world(tmp_path: Path) -> MemoryStore:
    """ck-1 full; ck-2 one moved rollout per worker; ck-3 every rollout moved; ck-4 none: ck-4
    refers to ck-3's parts only, nothing retained refers to ck-1's or ck-2's."""
    store = MemoryStore(f"parts-{uuid.uuid4().hex}")
    with world(store, tmp_path) as w:
        w.coordinator.checkpoint("ck-1")
        w.move("w0-r0", 2)
        w.move("w1-r2", 2)
        w.coordinator.checkpoint("ck-2")
        for rollout_id in ROLLOUTS:
            w.move(rollout_id, 3)
        w.coordinator.checkpoint("ck-3")
        w.coordinator.checkpoint("ck-4")
    return store


def test_gc_keeps_the_parts_a_retained_checkpoint_refers_to_and_dry_run_counts_match(tmp_path: Path) -> None:
    store = _gc_world(tmp_path)
    dry = collect_garbage(store, keep=1, min_age_s=0, dry_run=True)
    real = collect_garbage(store, keep=1, min_age_s=0)
    assert dry.deleted_objects == real.deleted_objects > 0
    assert dry.referenced_prefixes == real.referenced_prefixes
    group_kept = {p for p in real.referenced_prefixes if f"/components/{KIND}/" in p}
    assert group_kept == {_part("ck-3", w) for w in ("w0", "w1")}
    assert [p.checkpoint_id for p in list_published(store)] == ["ck-4"]
    verify_checkpoint(store, "ck-4")
    assert all(f.ok for f in verify_store(store))  # ck-3's parts: what they store
    # ck-3's own component manifest is gone, its parts stay; ck-1's and ck-2's parts are gone
    assert not store.exists(layout.component_prefix("ck-3", KIND, INSTANCE) + "/manifest.json")
    assert store.exists(_part("ck-3", "w0") + "/manifest.json")
    for cid in ("ck-1", "ck-2"):
        assert store.list(layout.component_prefix(cid, KIND, INSTANCE) + "/") == []


def test_a_crash_at_every_gc_step_leaves_the_retained_checkpoint_verifying(tmp_path: Path) -> None:
    template = _gc_world(tmp_path)
    steps: list[str] = []
    collect_garbage(_copy(template), keep=1, min_age_s=0, fault_hook=steps.append)
    assert any(s.startswith("delete:") and "/parts/" in s for s in steps)
    for k in range(len(steps)):
        store = _copy(template)
        seen: list[str] = []

        def hook(step: str, k: int = k, seen: list[str] = seen) -> None:
            seen.append(step)
            if len(seen) == k + 1:
                raise Boom(step)

        with pytest.raises(Boom):
            collect_garbage(store, keep=1, min_age_s=0, fault_hook=hook)
        # verify of the whole store (every published checkpoint end to end among it) passes
        findings = verify_store(store)
        assert findings and all(f.ok for f in findings), [f for f in findings if not f.ok]
        dry = collect_garbage(store, keep=1, min_age_s=0, dry_run=True)
        real = collect_garbage(store, keep=1, min_age_s=0)
        assert dry.deleted_objects == real.deleted_objects
        assert [p.checkpoint_id for p in list_published(store)] == ["ck-4"]
        verify_checkpoint(store, "ck-4")
        assert store.exists(_part("ck-3", "w1") + "/manifest.json")


def _copy(store: MemoryStore) -> MemoryStore:
    out = MemoryStore(f"parts-{uuid.uuid4().hex}")
    for info in store.list(""):
        out.put(info.key, store.get(info.key))
    return out


def test_a_parts_reference_columns_are_its_checked_references(tmp_path: Path) -> None:
    store = MemoryStore(f"parts-{uuid.uuid4().hex}")
    _three_checkpoints(store, tmp_path)
    part = RawArchiveReader.open(store, _part("ck-2", "w0"))  # version 2: refers into ck-1's part
    columns = part.reference_columns()
    assert columns[0] and [list(c) for c in zip(*part.references(), strict=True)] == columns
    assert part.manifest.references is not None
    key = part.key_of(part.manifest.references.key)
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0xFF
    store.put(key, bytes(data))
    fresh = RawArchiveReader.open(store, _part("ck-2", "w0"))
    with pytest.raises(IntegrityError, match="reference table is altered"):
        fresh.reference_columns()


def test_a_member_in_two_workers_parts_publishes_nothing(tmp_path: Path) -> None:
    store = MemoryStore(f"parts-{uuid.uuid4().hex}")
    with world(store, tmp_path) as w:
        w.workers[1].add(_snapshot("w0-r1", 1))  # the other worker holds it as well
        with pytest.raises(InvalidRecordError, match="1 members are in two workers' parts"):
            w.group.prepare("ck-dup", time.time() + 30)
            w.group.commit("ck-dup", store, time.time() + 30)
        assert not store.exists(layout.component_prefix("ck-dup", KIND, INSTANCE) + "/manifest.json")
        w.group.resume("ck-dup", time.time() + 30)


def _archive(store: ObjectStore, prefix: str, cid: str, *, instance: str = INSTANCE) -> ArchiveWriter:
    writer = ArchiveWriter(store, prefix, checkpoint_id=cid, participant_kind=KIND, instance=instance)
    writer.write(_snapshot("r0", 1))
    writer.commit()
    return writer


def _referring(store: ObjectStore, prefix: str, cid: str, base: ArchiveWriter) -> RawArchiveReader:
    """An archive at ``prefix`` that stores nothing and refers to ``base``'s one member."""
    member = next(RawArchiveReader.open(store, base.prefix).stored_members())
    refs = None if member.refs is None else json.dumps(member.refs, sort_keys=True)
    writer = ArchiveWriter(store, prefix, checkpoint_id=cid, participant_kind=KIND, instance=INSTANCE)
    columns = [[v] for v in ("resource_snapshot", "r0", 0, "s", member.revision, refs, 0, 0, 0, 0)]
    writer.refer([(base.prefix, base.manifest_ref)], columns)
    writer.commit()
    return RawArchiveReader.open(store, prefix)


@pytest.mark.parametrize(
    ("where", "cid", "valid"),
    [
        ("parts/p0", "ck-a", True),  # a part of this checkpoint's archive
        ("parts/p0", "ck-b", False),  # at a part's place, but another checkpoint's archive
        ("other/p0", "ck-a", False),  # this checkpoint's, but not a part
        ("parts/p0/deeper", "ck-a", False),  # not directly a part
    ],
)
def test_a_base_of_the_same_checkpoint_must_be_one_of_its_parts(where: str, cid: str, valid: bool) -> None:
    store = MemoryStore(f"parts-{uuid.uuid4().hex}")
    prefix = layout.component_prefix("ck-a", KIND, INSTANCE)
    base = _archive(store, f"{prefix}/{where}", cid)
    reader = _referring(store, prefix, "ck-a", base)
    if valid:
        assert reader.check() == []
        assert [r.payload for r in reader.iter_raw()] == [_snapshot("r0", 1).to_payload()]
    else:
        with pytest.raises(IntegrityError, match="neither an earlier archive nor a part"):
            reader.open_bases()
    # the part's own member index is what a reference row is matched against
    assert ArchiveReader.open(store, prefix).manifest.schema_version == 2
