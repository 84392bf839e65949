"""Test helpers for the protocol layer: a scripted participant on the real control plane and
builders that give each recovery rule a checkpoint to classify.

``ScriptedParticipant`` subclasses :class:`rollout_checkpoint.protocol.Participant`, so the
phases, fencing, idempotency and lease are the production ones; only *what* it exports is set by
the test (any records, restarts, blockers).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.format.commit_log import list_published, read_latest
from rollout_checkpoint.format.records import (
    AgentBoundaryRecord,
    ModelCallLineageRecord,
    Record,
    ResourceSnapshotRecord,
    TokenStoreReceipt,
)
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.protocol import CheckpointMode, Export, Participant, ParticipantKind, Phase, Readiness
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.store import MemoryStore, ObjectStore


def ex(rollout_id: str, attempt: int = 0) -> ExecutionId:
    return ExecutionId(rollout_id=rollout_id, attempt=attempt)


class ScriptedParticipant(Participant):
    """Exports exactly the records a test adds; restores them under attempt N+1."""

    def __init__(
        self,
        kind: ParticipantKind,
        instance: str,
        mode: CheckpointMode = "exported",
        **options: Any,
    ) -> None:
        super().__init__(kind=kind, instance=instance, mode=mode, **options)
        self.records: dict[ExecutionId, list[Record]] = {}
        self.blockers: list[str] = []
        self.restart: set[ExecutionId] = set()
        self.installed: list[ExecutionId] = []

    def add(self, *records: Record) -> None:
        with self._cond:
            for record in records:
                execution = record.execution
                if execution.rollout_id not in self._live:
                    self._admit(execution)
                    self._register(execution)
                self.records.setdefault(execution, []).append(record)
            self._changed()

    def track(self, execution: ExecutionId, *, restart: bool = False) -> None:
        """Track a live execution without records (a restart-only or stateless one)."""
        with self._cond:
            self._admit(execution)
            self._register(execution)
            self.records.setdefault(execution, [])
            if restart:
                self.restart.add(execution)
            self._changed()

    def set_blockers(self, blockers: Sequence[str]) -> None:
        with self._cond:
            self.blockers = list(blockers)
            self._changed()

    def live(self) -> dict[str, ExecutionId]:
        with self._cond:
            return dict(self._live)

    def refuses(self, execution: ExecutionId) -> bool:
        return self.fence.is_retired(execution)

    def is_open(self) -> bool:
        status = self.status()
        return status.accepting and status.phase is Phase.IDLE

    # -- hooks ---------------------------------------------------------------------------------
    def _readiness(self) -> Readiness:
        restarts = [e for e in self.restart if self._live.get(e.rollout_id) == e]
        return Readiness(blockers=list(self.blockers), counts={"live": len(self._live)}, restarts=restarts)

    def _export(self, scope: frozenset[ExecutionId] | None) -> Export:
        executions = [
            e
            for e in self.records
            if self._in_scope(e, scope) and self._live.get(e.rollout_id) == e and e not in self.restart
        ]
        restarts = [e for e in self.restart if self._in_scope(e, scope) and self._live.get(e.rollout_id) == e]
        records = [r for e in executions for r in self.records[e]]
        return Export(records=records, executions=executions, restarts=restarts)

    def _validate_restore(self, records: Sequence[Record]) -> Callable[[], list[ExecutionId]]:
        grouped: dict[ExecutionId, list[Record]] = {}
        for record in records:
            grouped.setdefault(record.execution, []).append(record)

        def install() -> list[ExecutionId]:
            out = []
            for execution, recs in grouped.items():
                nxt = execution.next_attempt()
                self.records[nxt] = [r.model_copy(update={"attempt": nxt.attempt}) for r in recs]
                out.append(nxt)
            self.installed = out
            return out

        return install

    def _retire_state(self, executions: Sequence[ExecutionId]) -> None:
        for execution in executions:
            for known in list(self.records):
                if known.rollout_id == execution.rollout_id and known.attempt <= execution.attempt:
                    del self.records[known]
            self.restart = {
                e
                for e in self.restart
                if not (e.rollout_id == execution.rollout_id and e.attempt <= execution.attempt)
            }


def digest_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Deployment:
    """Three scripted participants (agent, model, resources), a registry, a coordinator."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        token_source: Any = None,
        fault_hook: Callable[[str], None] | None = None,
        token_snapshot_loader: Any = None,
        lease_grace_seconds: float = 600.0,
        stable_incarnations: bool = False,
    ) -> None:
        self.store = store
        self.agent = ScriptedParticipant("agent", "agent-0", lease_grace_seconds=lease_grace_seconds)
        self.model = ScriptedParticipant("model", "policy-0", lease_grace_seconds=lease_grace_seconds)
        self.resources = ScriptedParticipant("resources", "res-0", lease_grace_seconds=lease_grace_seconds)
        self.participants = [self.agent, self.model, self.resources]
        if stable_incarnations:
            # a test process that rebuilds the same participants' state deterministically (the
            # crash workers' populate()) stands for the same participants, not replacements: the
            # incarnation a real participant draws at build is fixed here, or a coordinator would
            # rightly refuse to publish over "restarted" participants without a restore
            for participant in self.participants:
                name = f"{participant.kind}/{participant.instance}"
                participant._incarnation = hashlib.sha256(name.encode()).hexdigest()[:32]
        self.registry = LiveExecutionRegistry()
        self.coordinator = Coordinator(
            store,
            self.participants,
            self.registry,
            token_source,
            fault_hook=fault_hook,
            token_snapshot_loader=token_snapshot_loader,
            run_id="test-run",  # every coordinator a test builds on one store is the same run
        )

    def close(self) -> None:
        for participant in self.participants:
            participant.close()

    def all_open(self) -> bool:
        return all(p.is_open() for p in self.participants)

    # -- building rollouts ------------------------------------------------------------------------
    def dispatch(self, rollout_id: str, *, restart_only: bool = False) -> ExecutionId:
        return self.registry.dispatch(
            rollout_id, input_digest=digest_of(rollout_id), restart_only=restart_only
        )

    def running(self, rollout_id: str, *, restart_only: bool = False) -> ExecutionId:
        execution = self.dispatch(rollout_id, restart_only=restart_only)
        self.registry.start(execution)
        return execution

    def resumable(
        self,
        rollout_id: str,
        *,
        session: str = "s1",
        revision: int = 3,
        boundary_revision: int | None = None,
        call: str | None = "c1",
        parent: str | None = None,
        token: bool = True,
        receipt_digest: str | None = None,
        with_resources: bool = True,
        with_lineage: bool = True,
        with_receipt: bool = True,
        tokens: Any = None,
        receipt_store: str = "tokens",
    ) -> ExecutionId:
        """A running rollout with a complete, agreeing continuation state (unless told otherwise)."""
        execution = self.running(rollout_id)
        r, a = execution.rollout_id, execution.attempt
        self.agent.add(
            AgentBoundaryRecord(
                rollout_id=r,
                attempt=a,
                boundary_index=1,
                turn_index=1,
                last_model_call_id=call,
                resource_revisions={
                    "res-0": {session: revision if boundary_revision is None else boundary_revision}
                },
                agent_state=b"agent-state",
            )
        )
        if with_resources:
            self.resources.add(
                ResourceSnapshotRecord(
                    rollout_id=r, attempt=a, session_id=session, revision=revision, codec="json", state=b"{}"
                )
            )
        token_key = f"{r}/a{a}/{call}" if (token and call is not None) else None
        if with_lineage and call is not None:
            records: list[Record] = []
            if parent is not None:
                records.append(
                    ModelCallLineageRecord(rollout_id=r, attempt=a, call_id=parent, policy_version="v1")
                )
            records.append(
                ModelCallLineageRecord(
                    rollout_id=r,
                    attempt=a,
                    call_id=call,
                    parent_call_id=parent,
                    policy_version="v1",
                    token_key=token_key,
                )
            )
            self.model.add(*records)
        if token_key is not None and with_receipt:
            digest, length = receipt_digest or "0" * 64, 10
            if tokens is not None:
                digest, length = tokens.put_call(r, a, call)
                if receipt_digest is not None:
                    digest = receipt_digest
            self.model.add(
                TokenStoreReceipt(
                    rollout_id=r,
                    attempt=a,
                    store=tokens.store.name if tokens is not None else receipt_store,
                    snapshot_id="staging",
                    key=token_key,
                    digest=digest,
                    length=length,
                )
            )
        return execution

    def completed(self, rollout_id: str, *, consume: bool = False) -> ExecutionId:
        execution = self.running(rollout_id)
        self.registry.finish(execution)
        self.registry.hand_off(execution, {"answer": rollout_id}, reward=1.0)
        if consume:
            self.registry.consume(execution)
        return execution


class FakeTokens:
    """A token source whose snapshot the test controls (digest/length per key)."""

    def __init__(self, store: ObjectStore) -> None:
        from rollout_checkpoint.tokens import ObjectStoreTokenStore

        self.store = ObjectStoreTokenStore(store)

    def put_call(self, rollout_id: str, attempt: int, call_id: str) -> tuple[str, int]:
        from rollout_checkpoint.tokens import TokenEntry

        entry = TokenEntry(
            rollout_id=rollout_id,
            attempt=attempt,
            call_id=call_id,
            prompt_token_ids=[1, 2, 3],
            generation_token_ids=[4, 5],
            generation_log_probs=[-0.1, -0.2],
            mask=[1, 1],
        )
        receipt = self.store.put(entry)
        return receipt.digest, receipt.length

    def snapshot(self, checkpoint_id: str) -> Any:
        return self.store.snapshot(checkpoint_id)


def executions(items: Iterable[ExecutionId]) -> list[tuple[str, int]]:
    return sorted((e.rollout_id, e.attempt) for e in items)


class InjectedFault(RuntimeError):
    """What a test's fault hook raises."""


def memory_store(prefix: str) -> MemoryStore:
    """A memory store of its own (fsspec's memory filesystem is shared by name)."""
    return MemoryStore(f"{prefix}-{uuid.uuid4().hex}")


def populate(dep: Deployment, tokens: FakeTokens | None, *, queued: bool = True) -> None:
    """The standard mix: a resumable rollout, a completed one, a dispatched one that never ran
    (unless ``queued`` is False) and a restart-only one."""
    dep.resumable("cont", tokens=tokens)
    dep.completed("done")
    if queued:
        dep.dispatch("queued")
    dep.running("ronly", restart_only=True)


def published_ids(store: ObjectStore) -> list[str]:
    return sorted(p.checkpoint_id for p in list_published(store))


def latest_id(store: ObjectStore) -> str | None:
    pointer = read_latest(store)
    return None if pointer is None else pointer[0].checkpoint_id
