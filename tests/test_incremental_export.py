"""Incremental export (issue 26): a participant's freeze looks only at what changed since its
previous export, and what it commits is exactly what a full export of the same state commits."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from rollout_checkpoint.archive import RawArchiveReader
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.format import ArchiveReader, layout
from rollout_checkpoint.format.chunks import component_records
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import AgentParticipant, PolicyModelParticipant, ResourcesParticipant
from rollout_checkpoint.participants.model import _participant as model_module
from rollout_checkpoint.reader import load_checkpoint, verify_checkpoint
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.store import MemoryStore
from rollout_checkpoint.tokens import ObjectStoreTokenStore, TokenEntry


def _boundary(e: ExecutionId, turn: int) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=e.rollout_id,
        attempt=e.attempt,
        boundary_index=turn,
        turn_index=turn,
        last_model_call_id=f"call-{turn}",
        resource_revisions={"res-0": {"env": turn}},
        output_items=[{"turn": t} for t in range(1, turn + 1)],
        agent_state=f"state {turn} of {e.rollout_id}".encode(),
    )


class Deployment:
    """Agent, policy model and resources participants: every rollout has a boundary, one
    delivered model call per turn and one session, moved turn by turn."""

    def __init__(self, rollouts: int) -> None:
        self.name = f"incx-{uuid.uuid4().hex}"
        self.store = MemoryStore(self.name)
        self.tokens = ObjectStoreTokenStore(self.store)
        self.agent = AgentParticipant("agent-0")
        self.model = PolicyModelParticipant(self.tokens, "policy-0")
        self.resources = ResourcesParticipant("res-0", mode="exported")
        self.registry = LiveExecutionRegistry()
        self.coordinator = Coordinator(
            self.store, [self.agent, self.model, self.resources], self.registry, self.tokens, run_id="t"
        )
        self.turns: dict[ExecutionId, int] = {}
        for i in range(rollouts):
            self.add(f"r{i:03d}")

    def add(self, rollout_id: str) -> ExecutionId:
        e = self.registry.dispatch(rollout_id, input_digest=f"in-{rollout_id}")
        self.registry.start(e)
        self.agent.begin(e)
        self.resources.open_session(e, "env", {"turn": 0})
        self.turns[e] = 0
        self.move([e])
        return e

    def move(self, executions: list[ExecutionId]) -> None:
        for e in executions:
            turn = self.turns[e] = self.turns[e] + 1
            if turn > 1:
                self.agent.start_turn(e)
            call_id = f"call-{turn}"
            self.tokens.put_many(
                [
                    TokenEntry(
                        rollout_id=e.rollout_id,
                        attempt=e.attempt,
                        call_id=call_id,
                        prompt_token_ids=[1, 2],
                        generation_token_ids=[3],
                        generation_log_probs=[-0.5],
                        mask=[1],
                    )
                ]
            )
            with self.model.call(e, call_id, policy_version="v1") as call:
                call.stage(prompt_token_ids=[1, 2], generation_token_ids=[3], generation_log_probs=[-0.5])
            self.resources.mutate(e, "env", lambda s, t=turn: {"turn": t})
            self.agent.boundary(e, _boundary(e, turn))

    def finish(self, e: ExecutionId) -> None:
        self.agent.finish(e)
        self.model.finish(e)
        self.resources.end_session(e, "env")
        self.registry.forget([e.rollout_id])
        del self.turns[e]

    def forget_export_caches(self) -> None:
        """Make every participant's next export a full one (what a fresh process would do)."""
        self.agent._rows_chunked = None
        for chain in self.model._chains.values():
            chain.fragment = None
        self.model._rows_built = False
        self.resources._rows.clear()
        self.resources._dirty = set(self.resources._sessions)

    def close(self) -> None:
        for p in (self.agent, self.model, self.resources):
            p.close()


def _records(store: MemoryStore, cid: str) -> dict[str, list[tuple[str, str, int, str, bytes]]]:
    """Every component's members as committed (references resolved), in a comparable form."""
    out: dict[str, list[tuple[str, str, int, str, bytes]]] = {}
    for ref in load_checkpoint(store, cid).record.components:
        reader = RawArchiveReader.open(store, ref.prefix)
        rows = [(raw.kind, raw.rollout_id, raw.attempt, raw.key, raw.payload) for raw in reader.iter_raw()]
        component_records(reader)  # assembles (and so checks) every boundary's chunks
        out[f"{ref.kind}/{ref.instance}"] = sorted(rows)
    return out


def _same_store(dep: Deployment, cid: str) -> dict[str, list[tuple[str, str, int, str, bytes]]]:
    """The records of ``cid``, the deployment's own store name (in token receipts) made neutral."""
    name = dep.name.encode()
    return {
        k: [(*row[:4], row[4].replace(name, b"<store>")) for row in rows]
        for k, rows in _records(dep.store, cid).items()
    }


def _dispositions(store: MemoryStore, cid: str) -> dict[str, Any]:
    return {r: (p.disposition, p.attempt) for r, p in load_checkpoint(store, cid).rollouts.items()}


@pytest.mark.parametrize("publication", ["sync", "async"])
def test_an_incremental_export_commits_what_a_full_export_of_the_same_state_commits(publication: str) -> None:
    dep = Deployment(12)
    try:
        dep.coordinator.checkpoint("ck-0", publication=publication)
        executions = sorted(dep.turns, key=lambda e: e.rollout_id)
        dep.move(executions[:3])
        dep.finish(executions[3])  # one leaves, one arrives: the order is rebuilt
        dep.add("r100")
        dep.coordinator.checkpoint("ck-1", publication=publication)
        dep.forget_export_caches()
        dep.coordinator.checkpoint("ck-2", publication=publication)  # the same state, exported in full
        incremental, full = _records(dep.store, "ck-1"), _records(dep.store, "ck-2")
        assert incremental == full
        assert {row[1] for row in incremental["agent/agent-0"]} == {e.rollout_id for e in dep.turns}
        assert _dispositions(dep.store, "ck-1") == _dispositions(dep.store, "ck-2")
        verify_checkpoint(dep.store, "ck-1")
        # the incremental manifest lists the same executions as the full one
        for kind, instance in (("agent", "agent-0"), ("model", "policy-0"), ("resources", "res-0")):
            one = ArchiveReader.open(dep.store, layout.component_prefix("ck-1", kind, instance)).manifest
            two = ArchiveReader.open(dep.store, layout.component_prefix("ck-2", kind, instance)).manifest
            assert (
                one.extra["executions"]
                == two.extra["executions"]
                == sorted([[e.rollout_id, e.attempt] for e in dep.turns])
            )
    finally:
        dep.close()


def test_the_freeze_rebuilds_only_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    dep = Deployment(20)
    built = {"agent": 0, "model": 0}
    chunked = dep.agent._chunked
    fragment = model_module.chain_fragment

    def count_chunked(run: Any) -> Any:
        built["agent"] += 1
        return chunked(run)

    def count_fragment(*args: Any) -> Any:
        built["model"] += 1
        return fragment(*args)

    monkeypatch.setattr(dep.agent, "_chunked", count_chunked)
    monkeypatch.setattr(model_module, "chain_fragment", count_fragment)
    try:
        dep.coordinator.checkpoint("ck-0")
        assert built == {"agent": 20, "model": 20}  # the first export builds every row
        moved = sorted(dep.turns, key=lambda e: e.rollout_id)[5:8]
        dep.move(moved)
        assert len(dep.resources._dirty) == 3
        built.update(agent=0, model=0)
        dep.coordinator.checkpoint("ck-1", publication="async")
        assert built == {"agent": 3, "model": 3}
        assert not dep.resources._dirty
        built.update(agent=0, model=0)
        dep.coordinator.checkpoint("ck-2")  # nothing moved: nothing rebuilt
        assert built == {"agent": 0, "model": 0}
        assert _dispositions(dep.store, "ck-2") == _dispositions(dep.store, "ck-1")
        # and what ck-1 holds for the moved rollouts is their new turn
        boundaries = {
            r.rollout_id: r
            for r in component_records(
                RawArchiveReader.open(dep.store, layout.component_prefix("ck-1", "agent", "agent-0"))
            )
            if isinstance(r, AgentBoundaryRecord)
        }
        assert {e.rollout_id: boundaries[e.rollout_id].boundary_index for e in moved} == {
            e.rollout_id: 2 for e in moved
        }
    finally:
        dep.close()


def test_a_session_that_cannot_be_encoded_fails_every_commit_until_it_changes() -> None:
    dep = Deployment(3)
    try:
        dep.coordinator.checkpoint("ck-0")
        e = sorted(dep.turns, key=lambda x: x.rollout_id)[0]
        dep.resources.mutate(e, "env", lambda s: {"bad": {1, 2}})  # a set: JSON cannot encode it
        for cid in ("ck-1", "ck-2"):  # refused again: the broken session stays dirty
            with pytest.raises(Exception, match="cannot encode session env"):
                dep.coordinator.checkpoint(cid)
        dep.resources.mutate(e, "env", lambda s: {"turn": 9})
        dep.coordinator.checkpoint("ck-3")
        verify_checkpoint(dep.store, "ck-3")
    finally:
        dep.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_incremental_exports_over_many_checkpoints_match_full_ones(seed: int) -> None:
    """Two deployments driven alike: one exports incrementally at every checkpoint, the other
    in full; moves, arrivals, departures and calls admitted and closed undelivered (a chain
    touched without changing) between checkpoints, in both publication modes."""
    rng = random.Random(seed)
    incremental, full = Deployment(10), Deployment(10)
    try:
        for n in range(6):
            live = sorted(incremental.turns, key=lambda e: e.rollout_id)
            moved = rng.sample(live, 3)
            gone = rng.choice([e for e in live if e not in moved])
            touched = rng.choice(live)
            for dep in (incremental, full):
                dep.move(moved)
                dep.finish(gone)
                dep.add(f"n{n:02d}")
                if touched != gone:
                    dep.model.admit(touched, f"undelivered-{n}").close()
            if n % 2:
                full.forget_export_caches()
            else:  # the other way round too: a full export between incremental ones
                incremental.forget_export_caches() if n == 4 else full.forget_export_caches()
            publication = "async" if n % 3 else "sync"
            for dep in (incremental, full):
                dep.coordinator.checkpoint(f"ck-{n}", publication=publication)
            assert _same_store(incremental, f"ck-{n}") == _same_store(full, f"ck-{n}")
            assert _dispositions(incremental.store, f"ck-{n}") == _dispositions(full.store, f"ck-{n}")
    finally:
        incremental.close()
        full.close()
