"""The policy model participant: admitted calls, durable tokens, token-free lineage."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

from pydantic import JsonValue

from ..control import WorkerTopology
from ..control_plane import (
    DEFAULT_LEASE_GRACE_SECONDS,
    Export,
    Participant,
    Readiness,
    execution_key,
    restamp,
    wrong_kind,
)
from ..errors import (
    IdentityConflictError,
    InvalidPhaseError,
    InvalidRecordError,
    StaleAttemptError,
    UnknownExecutionError,
)
from ..ids import ExecutionId, validate_id
from ..records import GenerationCut, ModelCallLineageRecord, Record, TokenStoreReceipt
from ..tokens import LineageStore, TokenEntry, TokenPutReceipt, TokenSink

__all__ = ["ModelCall", "PolicyModelParticipant"]


@dataclass
class _Chain:
    """One execution's token-free lineage, in staging order."""

    calls: list[ModelCallLineageRecord] = field(default_factory=list)
    receipts: dict[str, TokenPutReceipt] = field(default_factory=dict)  # by call id
    inflight: set[str] = field(default_factory=set)


class ModelCall:
    """An admitted policy-model call; :meth:`stage` its tokens once generation is done (or cut)."""

    def __init__(
        self, participant: PolicyModelParticipant, execution: ExecutionId, call_id: str, policy_version: str
    ) -> None:
        self.participant = participant
        self.execution = execution
        self.call_id = call_id
        self.policy_version = policy_version
        self.lineage: ModelCallLineageRecord | None = None
        self._closed = False

    def stage(
        self,
        *,
        prompt_token_ids: Sequence[int],
        generation_token_ids: Sequence[int],
        generation_log_probs: Sequence[float],
        mask: Sequence[int] | None = None,
        cut: GenerationCut | None = None,
    ) -> ModelCallLineageRecord:
        """Store the tokens durably through the sink, then record lineage and the receipt.

        From here on the call no longer blocks prepare, even if its response is still being
        delivered. ``cut`` marks a generation cut at a durable prefix.
        """
        return self.participant._stage(
            self, prompt_token_ids, generation_token_ids, generation_log_probs, mask, cut
        )

    def close(self) -> None:
        """End the call; an unstaged call is dropped (the agent re-issues it from its boundary)."""
        if not self._closed:
            self._closed = True
            self.participant._close_call(self)


class PolicyModelParticipant(Participant):
    """The policy (training-token) model server.

    Integration: wrap each generation in ``with model.call(execution, call_id, policy_version=...)
    as call:`` and call ``call.stage(...)`` with its tokens. New calls are refused while admission
    is closed; admitted calls block prepare until they are staged (durable) or closed. Commits
    token-free lineage plus one ``TokenStoreReceipt`` per call (``snapshot_id`` = the checkpoint id:
    the coordinator snapshots the token store under the same id). After restore, the replacement
    attempt's first call gets the last restored call as parent.
    """

    def __init__(
        self,
        token_sink: TokenSink,
        instance: str = "policy",
        *,
        lineage_store: LineageStore | None = None,
        topology: WorkerTopology = "single_process",
        lease_grace_seconds: float = DEFAULT_LEASE_GRACE_SECONDS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(
            kind="model",
            instance=instance,
            mode="exported",
            topology=topology,
            concurrency="declared_safe",
            lease_grace_seconds=lease_grace_seconds,
            clock=clock,
        )
        self.token_sink = token_sink
        self.lineage_store = lineage_store
        self._chains: dict[ExecutionId, _Chain] = {}
        self._inflight: set[tuple[ExecutionId, str]] = set()  # admitted, not yet staged or closed

    @contextmanager
    def call(
        self, execution: ExecutionId, call_id: str, *, policy_version: str, wait: float = 0.0
    ) -> Iterator[ModelCall]:
        """Admit a model call (refused, or parked up to ``wait`` s, while closed) for its lifetime."""
        handle = self.admit(execution, call_id, policy_version=policy_version, wait=wait)
        try:
            yield handle
        finally:
            handle.close()

    def admit(
        self, execution: ExecutionId, call_id: str, *, policy_version: str, wait: float = 0.0
    ) -> ModelCall:
        """The non-context form of :meth:`call`: close the returned call when done."""
        validate_id(call_id, "call_id")
        with self._cond:
            self._admit(execution, wait=wait)
            chain = self._chains.get(execution)
            if chain is not None and (call_id in chain.receipts or call_id in chain.inflight):
                raise IdentityConflictError(f"model call {call_id} of {execution} was already admitted")
            if chain is None:
                self._register(execution)
                chain = self._chains[execution] = _Chain()
            chain.inflight.add(call_id)
            self._inflight.add((execution, call_id))
        return ModelCall(self, execution, call_id, policy_version)

    def finish(self, execution: ExecutionId) -> None:
        """The rollout is done with the model: drop its lineage (it is not exported again)."""
        with self._cond:
            self._require_live(execution)
            chain = self._chains.pop(execution)
            if chain.inflight:
                self._chains[execution] = chain
                raise InvalidPhaseError(f"{execution} still has {len(chain.inflight)} model calls in flight")
            self._unregister(execution)
            if self.lineage_store is not None:
                self.lineage_store.drop(execution)
            self._changed()

    def lineage(self, execution: ExecutionId) -> list[ModelCallLineageRecord]:
        with self._cond:
            chain = self._chains.get(execution)
            return list(chain.calls) if chain else []

    def _stage(
        self,
        call: ModelCall,
        prompt_token_ids: Sequence[int],
        generation_token_ids: Sequence[int],
        generation_log_probs: Sequence[float],
        mask: Sequence[int] | None,
        cut: GenerationCut | None,
    ) -> ModelCallLineageRecord:
        execution = call.execution
        with self._cond:
            self.fence.check(execution)
            chain = self._chains.get(execution)
            if chain is None or call.call_id not in chain.inflight or call._closed:
                raise UnknownExecutionError(f"model call {call.call_id} of {execution} is not in flight")
        entry = TokenEntry(
            rollout_id=execution.rollout_id,
            attempt=execution.attempt,
            call_id=call.call_id,
            prompt_token_ids=list(prompt_token_ids),
            generation_token_ids=list(generation_token_ids),
            generation_log_probs=list(generation_log_probs),
            mask=list(mask) if mask is not None else [1] * len(generation_token_ids),
        )
        receipt = self.token_sink.put(entry)  # durable before it counts; no lock held
        with self._cond:
            # A retire or restore while the tokens were staged voids the call: it never joins
            # the lineage, so a dead attempt cannot publish a winning model-call root.
            self.fence.check(execution)
            if self._chains.get(execution) is not chain or call.call_id not in chain.inflight:
                raise StaleAttemptError(f"model call {call.call_id} of {execution} was retired meanwhile")
            record = ModelCallLineageRecord(
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                call_id=call.call_id,
                parent_call_id=chain.calls[-1].call_id if chain.calls else None,
                policy_version=call.policy_version,
                token_key=receipt.key,
                cut=cut,
            )
            if self.lineage_store is not None:
                self.lineage_store.record(record)
            chain.calls.append(record)
            chain.receipts[call.call_id] = receipt
            chain.inflight.discard(call.call_id)
            self._inflight.discard((execution, call.call_id))
            call.lineage = record
            self._changed()
            return record

    def _close_call(self, call: ModelCall) -> None:
        with self._cond:
            chain = self._chains.get(call.execution)
            if chain is not None and call.call_id in chain.inflight:
                chain.inflight.discard(call.call_id)
                self._inflight.discard((call.execution, call.call_id))
                if not chain.calls and not chain.inflight:
                    # Nothing staged: the execution leaves no trace here.
                    del self._chains[call.execution]
                    self._unregister(call.execution)
                self._changed()

    # -- hooks ------------------------------------------------------------------------------
    def _readiness(self) -> Readiness:
        blockers = [f"{e}/{c}" for e, c in sorted(self._inflight, key=lambda k: (execution_key(k[0]), k[1]))]
        return Readiness(
            blockers=blockers,
            counts={"executions": len(self._chains), "inflight": len(blockers)},
        )

    def _manifest_extra(self) -> Mapping[str, JsonValue]:
        return {"token_store": self.token_sink.name}

    def _export(self, scope: frozenset[ExecutionId] | None) -> Export:
        snapshot_id = self._active
        if snapshot_id is None:  # commit exports only while its checkpoint is active
            raise InvalidPhaseError("model lineage is exported only during a commit")
        records: list[Record] = []
        executions: list[ExecutionId] = []
        for execution, chain in sorted(self._chains.items(), key=lambda item: execution_key(item[0])):
            if not chain.calls or not self._in_scope(execution, scope):
                continue
            executions.append(execution)
            for lineage in chain.calls:
                records.append(lineage)
                receipt = chain.receipts[lineage.call_id]
                records.append(
                    TokenStoreReceipt(
                        rollout_id=execution.rollout_id,
                        attempt=execution.attempt,
                        store=self.token_sink.name,
                        snapshot_id=snapshot_id,
                        key=receipt.key,
                        digest=receipt.digest,
                        length=receipt.length,
                    )
                )
        return Export(records=records, executions=executions)

    def _validate_restore(self, records: Sequence[Record]) -> Callable[[], list[ExecutionId]]:
        calls: dict[ExecutionId, dict[str, ModelCallLineageRecord]] = {}
        receipts: dict[ExecutionId, dict[str, TokenStoreReceipt]] = {}
        for record in records:
            if isinstance(record, ModelCallLineageRecord):
                by_id = calls.setdefault(record.execution, {})
                if record.call_id in by_id:
                    raise InvalidRecordError(
                        f"model call {record.call_id} of {record.execution} appears twice"
                    )
                by_id[record.call_id] = record
            elif isinstance(record, TokenStoreReceipt):
                by_key = receipts.setdefault(record.execution, {})
                if record.key in by_key:
                    raise InvalidRecordError(
                        f"token receipt {record.key} of {record.execution} appears twice"
                    )
                by_key[record.key] = record
            else:
                raise wrong_kind(record, "model")
        chains: dict[ExecutionId, _Chain] = {}
        for execution in set(calls) | set(receipts):
            ordered = _ordered_chain(execution, calls.get(execution, {}))
            by_key = receipts.get(execution, {})
            used: set[str] = set()
            chain = _Chain()
            for lineage in ordered:
                receipt = by_key.get(lineage.token_key) if lineage.token_key else None
                if receipt is None:
                    raise InvalidRecordError(
                        f"model call {lineage.call_id} of {execution} has no token receipt for "
                        f"{lineage.token_key!r}"
                    )
                used.add(receipt.key)
                nxt = execution.next_attempt()
                chain.calls.append(cast(ModelCallLineageRecord, restamp(lineage, nxt.attempt)))
                chain.receipts[lineage.call_id] = TokenPutReceipt(
                    key=receipt.key, digest=receipt.digest, length=receipt.length
                )
            if set(by_key) - used:
                raise InvalidRecordError(f"{execution} has token receipts no model call refers to")
            chains[execution.next_attempt()] = chain

        def install() -> list[ExecutionId]:
            for execution, chain in chains.items():
                self._chains[execution] = chain
                if self.lineage_store is not None:
                    for lineage in chain.calls:
                        self.lineage_store.record(lineage)
            return list(chains)

        return install

    def _retire_state(self, executions: Sequence[ExecutionId]) -> None:
        for execution in self._covered_live(executions):
            chain = self._chains.pop(execution, None)
            if chain is not None:
                self._inflight.difference_update((execution, c) for c in chain.inflight)
            if self.lineage_store is not None:
                self.lineage_store.drop(execution)


def _ordered_chain(
    execution: ExecutionId, calls: Mapping[str, ModelCallLineageRecord]
) -> list[ModelCallLineageRecord]:
    """The calls of one execution as one linear chain from its root, or ``InvalidRecordError``.

    A restored chain must have exactly one root and one tip, so that the replacement attempt's
    first call has exactly one parent to continue from.
    """
    if not calls:
        raise InvalidRecordError(f"{execution} has token receipts but no model calls")
    children: dict[str | None, list[str]] = {}
    for call in calls.values():
        if call.parent_call_id is not None and call.parent_call_id not in calls:
            raise InvalidRecordError(
                f"model call {call.call_id} of {execution} names parent {call.parent_call_id}, "
                "which is not in the checkpoint"
            )
        children.setdefault(call.parent_call_id, []).append(call.call_id)
    ordered: list[ModelCallLineageRecord] = []
    parent: str | None = None
    while True:
        nxt = children.get(parent, [])
        if len(nxt) > 1:
            raise InvalidRecordError(f"model lineage of {execution} branches after {parent!r}: {sorted(nxt)}")
        if not nxt:
            break
        parent = nxt[0]
        ordered.append(calls[parent])
    if len(ordered) != len(calls):
        raise InvalidRecordError(f"model lineage of {execution} is not one chain from a single root")
    return ordered
