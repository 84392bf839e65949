"""One execution's model lineage, and turning a checkpoint's model records back into chains.

A chain holds the delivered calls in order, the receipt of each, and at most one *pending cut*:
the undelivered call whose durable prefix the replacement attempt continues from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ...errors import CheckpointError, InvalidRecordError
from ...format.records import GenerationCut, ModelCallLineageRecord, Record, TokenStoreReceipt
from ...ids import ExecutionId
from ...protocol import restamp, wrong_kind
from ...tokens import TokenPutReceipt, TokenSource
from ..generation import InlinePrefix, StagedPrefix
from ._cuts import check_cut_evidence

__all__ = ["Chain", "Chains", "PendingCut", "chains_from_records", "ordered_chain"]


@dataclass(frozen=True)
class PendingCut:
    """A restored cut waiting for its call to be re-issued (inline or staged, never both)."""

    call_id: str
    policy_version: str
    cut: GenerationCut
    receipt: TokenPutReceipt
    prefix: InlinePrefix | StagedPrefix
    prompt: tuple[int, ...] | None = None  # the cut call's prompt, when read from the token store


@dataclass
class Chain:
    """One execution's token-free lineage, in delivery order."""

    calls: list[ModelCallLineageRecord] = field(default_factory=list)
    encoded: dict[str, bytes] = field(default_factory=dict)  # payloads built at delivery, by call id
    receipts: dict[str, TokenPutReceipt] = field(default_factory=dict)  # by call id
    inflight: set[str] = field(default_factory=set)
    pending: dict[str, PendingCut] = field(default_factory=dict)  # by call id
    receipt_snapshots: dict[str, str] = field(default_factory=dict)
    """Token key -> the snapshot id its receipt named when this process first exported it (kept,
    so an unchanged receipt is the same member at every checkpoint: format 2 refers to it)."""

    fragment: object = field(default=None, repr=False, compare=False)
    """What the last export took of this chain while it was quiet (the participant's
    ``Fragment``), reused while the chain stays quiet and does not grow."""

    def receipt_snapshot(self, key: str, snapshot_id: str) -> str:
        """The snapshot id the receipt of ``key`` names: the first one it was exported under."""
        return self.receipt_snapshots.setdefault(key, snapshot_id)

    @property
    def tip(self) -> str | None:
        """The last delivered call: parent of the next call and of every pending cut."""
        return self.calls[-1].call_id if self.calls else None


def ordered_chain(
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


def chains_from_records(
    records: Sequence[Record], *, delivery: str, token_source: TokenSource | None
) -> dict[ExecutionId, Chain]:
    """Validate a checkpoint's model records and build the chains of the next attempts.

    Every call needs its receipt and every receipt a call; the delivered calls form one chain and
    every cut call is a child of its tip, naming its receipt's digest and length. Each cut prefix
    is read from ``token_source`` and checked against its digest before anything is installed;
    ``delivery`` picks how the re-issued call receives it: ``inline`` (token ids materialized
    here) or ``staged`` (a key the backend reads). Raises ``InvalidRecordError`` /
    ``GenerationCutError`` / store errors.
    """
    calls: dict[ExecutionId, dict[str, ModelCallLineageRecord]] = {}
    receipts: dict[ExecutionId, dict[str, TokenStoreReceipt]] = {}
    for record in records:
        if isinstance(record, ModelCallLineageRecord):
            by_id = calls.setdefault(record.execution, {})
            if record.call_id in by_id:
                raise InvalidRecordError(f"model call {record.call_id} of {record.execution} appears twice")
            by_id[record.call_id] = record
        elif isinstance(record, TokenStoreReceipt):
            by_key = receipts.setdefault(record.execution, {})
            if record.key in by_key:
                raise InvalidRecordError(f"token receipt {record.key} of {record.execution} appears twice")
            by_key[record.key] = record
        else:
            raise wrong_kind(record, "model")
    chains: dict[ExecutionId, Chain] = {}
    for execution in set(calls) | set(receipts):
        nxt = execution.next_attempt()
        by_id = calls.get(execution, {})
        delivered = {c: r for c, r in by_id.items() if r.cut is None}
        chain = Chain()
        ordered = ordered_chain(execution, delivered) if delivered else []
        by_key = receipts.get(execution, {})
        if not by_id:
            raise InvalidRecordError(f"{execution} has token receipts but no model calls")
        used: set[str] = set()

        def receipt_of(
            lineage: ModelCallLineageRecord,
            by_key: Mapping[str, TokenStoreReceipt] = by_key,
            used: set[str] = used,
        ) -> TokenPutReceipt:
            receipt = by_key.get(lineage.token_key) if lineage.token_key else None
            if receipt is None:
                raise InvalidRecordError(
                    f"model call {lineage.call_id} of {lineage.execution} has no token receipt "
                    f"for {lineage.token_key!r}"
                )
            used.add(receipt.key)
            return TokenPutReceipt(key=receipt.key, digest=receipt.digest, length=receipt.length)

        for lineage in ordered:
            chain.receipts[lineage.call_id] = receipt_of(lineage)
            chain.calls.append(cast(ModelCallLineageRecord, restamp(lineage, nxt.attempt)))
        for call_id, lineage in sorted(by_id.items()):
            if lineage.cut is None:
                continue
            if lineage.parent_call_id != chain.tip:
                raise InvalidRecordError(
                    f"cut model call {call_id} of {execution} names parent {lineage.parent_call_id!r}, "
                    f"not the last delivered call {chain.tip!r}"
                )
            chain.pending[call_id] = _pending(
                execution, lineage, lineage.cut, receipt_of(lineage), delivery, token_source
            )
        if set(by_key) - used:
            raise InvalidRecordError(f"{execution} has token receipts no model call refers to")
        chains[nxt] = chain
    return chains


def _pending(
    execution: ExecutionId,
    lineage: ModelCallLineageRecord,
    cut: GenerationCut,
    receipt: TokenPutReceipt,
    delivery: str,
    token_source: TokenSource | None,
) -> PendingCut:
    where = f"cut of model call {lineage.call_id} of {execution}"
    if (receipt.digest, receipt.length) != (cut.receipt_digest, cut.receipt_length):
        raise InvalidRecordError(f"{where}: its receipt coordinates disagree with the token receipt")
    prefix: InlinePrefix | StagedPrefix
    prompt: tuple[int, ...] | None = None
    if token_source is None:
        if delivery == "inline":
            raise InvalidRecordError(
                f"{where}: inline delivery needs a token source to materialize the prefix"
            )
        prefix = StagedPrefix(cut.receipt_key, cut.prefix_token_count, cut.prefix_digest)
    else:
        try:
            entry = token_source.get(cut.receipt_key)
        except CheckpointError as exc:
            raise InvalidRecordError(
                f"{where}: prefix unreadable from the token store: {exc.message}"
            ) from exc
        check_cut_evidence(cut, entry, where)
        prompt = tuple(entry.prompt_token_ids)
        if delivery == "inline":
            prefix = InlinePrefix(
                tuple(entry.generation_token_ids), tuple(entry.generation_log_probs), cut.prefix_digest
            )
        else:
            prefix = StagedPrefix(cut.receipt_key, cut.prefix_token_count, cut.prefix_digest)
    return PendingCut(lineage.call_id, lineage.policy_version, cut, receipt, prefix, prompt)


class Chains(dict[ExecutionId, Chain]):
    """The participant's chains; ``touched`` collects every execution whose chain was added,
    removed or replaced (the participant adds those whose chain it changed), so the next export
    looks at those only."""

    def __init__(self) -> None:
        super().__init__()
        self.touched: set[ExecutionId] = set()

    def __setitem__(self, key: ExecutionId, value: Chain) -> None:
        self.touched.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: ExecutionId) -> None:
        self.touched.add(key)
        super().__delitem__(key)

    def pop(self, key: ExecutionId, *default: Any) -> Any:
        self.touched.add(key)
        return super().pop(key, *default)

    def popitem(self) -> tuple[ExecutionId, Chain]:
        key, value = super().popitem()
        self.touched.add(key)
        return key, value

    def clear(self) -> None:
        self.touched.update(self)
        super().clear()

    def setdefault(self, key: ExecutionId, default: Any = None) -> Any:
        self.touched.add(key)
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        other = dict(*args, **kwargs)
        self.touched.update(other)
        super().update(other)
