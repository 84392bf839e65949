"""The policy model's commit in columns: lineage and token-receipt members encoded in bulk.

Payloads are orjson of the record models' JSON shape built from plain dicts (the lineage records
are validated, frozen models already; receipts are built from the sink's receipts), and what
``ModelCallLineageRecord`` / ``TokenStoreReceipt`` validate is checked per column, so a bad value
still fails the commit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ...errors import InvalidRecordError
from ...format.columnar import RecordBatch, check_ids, check_lengths, check_non_negative, encode_docs
from ...format.records import RECORD_SCHEMA_VERSION, GenerationCut, ModelCallLineageRecord, TokenStoreReceipt
from ...ids import ExecutionId
from ._calls import Ticket
from ._chain import Chain
from ._cuts import CutAcknowledgement

__all__ = [
    "NO_PENDING",
    "Fragment",
    "ReceiptColumns",
    "chain_fragment",
    "lineage_batch",
    "lineage_doc",
    "lineage_payload",
    "pending_calls",
    "receipt_batch",
]


def _cut(cut: GenerationCut | None) -> dict[str, Any] | None:
    return None if cut is None else cut.model_dump(mode="json")


def lineage_doc(call: ModelCallLineageRecord) -> dict[str, Any]:
    """The record's JSON shape as a plain dict."""
    return {
        "schema_version": call.schema_version,
        "rollout_id": call.rollout_id,
        "attempt": call.attempt,
        "call_id": call.call_id,
        "parent_call_id": call.parent_call_id,
        "policy_version": call.policy_version,
        "token_key": call.token_key,
        "cut": _cut(call.cut),
        "continued_from": _cut(call.continued_from),
    }


def lineage_payload(call: ModelCallLineageRecord) -> bytes:
    """One lineage record's payload (a delivered call's is built once, when it is delivered)."""
    return encode_docs([lineage_doc(call)])[0]


def lineage_batch(calls: Sequence[ModelCallLineageRecord], encoded: Sequence[bytes | None]) -> RecordBatch:
    """``model_lineage`` members of (validated) lineage records; ``encoded[i]`` is the payload
    of ``calls[i]`` built when it was delivered, or ``None`` (encoded here, in bulk)."""
    check_ids((c.call_id for c in calls), "call_id")
    check_ids((c.parent_call_id for c in calls if c.parent_call_id is not None), "parent_call_id")
    check_lengths((c.policy_version for c in calls), "policy_version", 1, 256)
    for call in calls:
        if call.cut is not None and call.token_key != call.cut.receipt_key:
            raise InvalidRecordError(f"model call {call.call_id}: token_key is not its cut's receipt_key")
    payloads = list(encoded)
    missing = [i for i, p in enumerate(payloads) if p is None]
    for i, payload in zip(missing, encode_docs([lineage_doc(calls[i]) for i in missing]), strict=True):
        payloads[i] = payload
    refs: list[dict[str, Any]] = []
    for call in calls:
        ref: dict[str, Any] = {"parent": call.parent_call_id, "token_key": call.token_key}
        if call.cut is not None:  # absent (not null) for delivered calls, as index_refs() gives
            ref["cut"] = call.cut.index_refs()
        refs.append(ref)
    return RecordBatch(
        kind=ModelCallLineageRecord.kind,
        rollout_ids=tuple(c.rollout_id for c in calls),
        attempts=tuple(c.attempt for c in calls),
        keys=tuple(c.call_id for c in calls),
        payloads=tuple(p for p in payloads if p is not None),
        refs=tuple(refs),
    )


def receipt_batch(
    store: str, snapshot_id: str, receipts: Sequence[tuple[ExecutionId, str, str, int]]
) -> RecordBatch:
    """``token_receipt`` members of ``(execution, key, digest, length)`` from the token sink,
    every one naming ``snapshot_id``."""
    columns = ReceiptColumns()
    for execution, key, digest, length in receipts:
        columns.add(execution, key, digest, length, snapshot_id)
    return columns.batch(store)


class ReceiptColumns:
    """The token receipts of an export gathered as columns (no object per receipt).

    Each receipt names the snapshot of the checkpoint that exported it **first** (the model
    participant remembers it per token key): an unchanged receipt is then the same payload at
    every checkpoint, and an incremental commit refers to it instead of writing it again.
    """

    def __init__(self) -> None:
        self.executions: list[ExecutionId] = []
        self.keys: list[str] = []
        self.digests: list[str] = []
        self.lengths: list[int] = []
        self.snapshot_ids: list[str] = []

    def add(self, execution: ExecutionId, key: str, digest: str, length: int, snapshot_id: str) -> None:
        self.executions.append(execution)
        self.keys.append(key)
        self.digests.append(digest)
        self.lengths.append(length)
        self.snapshot_ids.append(snapshot_id)

    def batch(self, store: str) -> RecordBatch:
        """The ``token_receipt`` members, checked per column as :func:`receipt_batch` does."""
        check_lengths([store], "token store name", 1, 256)
        check_ids(set(self.snapshot_ids), "snapshot_id")
        check_lengths(self.keys, "token key", 1, 512)
        check_lengths(self.digests, "token digest", 1, None)
        check_non_negative(self.lengths, "token length")
        docs = [
            {
                "schema_version": RECORD_SCHEMA_VERSION,
                "rollout_id": e.rollout_id,
                "attempt": e.attempt,
                "store": store,
                "snapshot_id": snapshot_id,
                "key": key,
                "digest": digest,
                "length": length,
            }
            for e, key, digest, length, snapshot_id in zip(
                self.executions, self.keys, self.digests, self.lengths, self.snapshot_ids, strict=True
            )
        ]
        return RecordBatch(
            kind=TokenStoreReceipt.kind,
            rollout_ids=tuple(e.rollout_id for e in self.executions),
            attempts=tuple(e.attempt for e in self.executions),
            keys=tuple(self.keys),
            payloads=tuple(encode_docs(docs)),
            refs=tuple(
                {"store": store, "snapshot_id": snapshot_id, "digest": digest, "length": length}
                for digest, length, snapshot_id in zip(
                    self.digests, self.lengths, self.snapshot_ids, strict=True
                )
            ),
        )


Pending = Mapping[str, tuple[str, GenerationCut, GenerationCut | None]]
NO_PENDING: Pending = MappingProxyType({})


def pending_calls(
    execution: ExecutionId,
    chain: Chain,
    tickets: Mapping[tuple[ExecutionId, str], Ticket],
    durable: Mapping[tuple[ExecutionId, str], CutAcknowledgement],
) -> Pending:
    """The undelivered calls an export writes as cuts: restored cuts not re-issued, and the
    calls this checkpoint froze and made durable (call id -> version, cut, continued from)."""
    pending: dict[str, tuple[str, GenerationCut, GenerationCut | None]] = {
        c: (p.policy_version, p.cut, None) for c, p in chain.pending.items()
    }
    for call_id in chain.inflight:
        ticket = tickets.get((execution, call_id))
        if ticket is None:
            continue
        done = durable.get(ticket.key)
        old = ticket.pending.cut if ticket.pending is not None else None
        if done is not None:
            pending[call_id] = (ticket.policy_version, done.generation_cut(), old)
        elif ticket.pending is not None:  # not cut again: its restored cut still stands
            pending[call_id] = (ticket.policy_version, ticket.pending.cut, None)
    return pending


Fragment = tuple[
    Chain,
    int,
    tuple[ModelCallLineageRecord, ...],
    tuple[bytes | None, ...],
    tuple[tuple[ExecutionId, str, str, int, str], ...],
]
"""What an export takes of one chain: ``(chain, calls at the time, lineage records, their
payloads (``None``: encoded with the batch), token receipts (execution, key, digest, length,
snapshot id))``, all immutable."""


def chain_fragment(execution: ExecutionId, chain: Chain, snapshot_id: str, pending: Pending) -> Fragment:
    """The chain's fragment now. Its delivered calls are append-only and what an export takes
    of each is fixed when first taken, so a quiet fragment the chain kept (``chain.fragment``)
    is a prefix of it: only the calls delivered since are read (a long chain that grew by one
    call costs one call, not its length)."""
    base: Fragment | None = chain.fragment  # type: ignore[assignment]
    if base is None or base[0] is not chain or base[1] > len(chain.calls):
        base = None
    done = 0 if base is None else base[1]
    lineage: list[ModelCallLineageRecord] = [] if base is None else list(base[2])
    encoded: list[bytes | None] = [] if base is None else list(base[3])
    receipts: list[tuple[ExecutionId, str, str, int, str]] = [] if base is None else list(base[4])
    for call in chain.calls[done:] if done else chain.calls:
        put = chain.receipts[call.call_id]
        lineage.append(call)
        encoded.append(chain.encoded.get(call.call_id))
        receipts.append(
            (execution, put.key, put.digest, put.length, chain.receipt_snapshot(put.key, snapshot_id))
        )
    for call_id, (version, cut, continued) in sorted(pending.items()):
        lineage.append(
            ModelCallLineageRecord(  # few (undelivered calls): built and checked as a model
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                call_id=call_id,
                parent_call_id=chain.tip,
                policy_version=version,
                token_key=cut.receipt_key,
                cut=cut,
                continued_from=continued,
            )
        )
        encoded.append(None)
        receipts.append(
            (
                execution,
                cut.receipt_key,
                cut.receipt_digest,
                cut.receipt_length,
                chain.receipt_snapshot(cut.receipt_key, snapshot_id),
            )
        )
    return (chain, len(chain.calls), tuple(lineage), tuple(encoded), tuple(receipts))
