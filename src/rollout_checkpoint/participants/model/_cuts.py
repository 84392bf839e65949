"""Generation-cut inventories, acknowledgements and the coverage check preparation runs.

Closing admission freezes the accepted calls into a :class:`CutInventory` (one
:class:`CutTicket` per call, each naming the worker process that holds it). Every ticket must then
reach exactly one disposition, reported as a :class:`CutAcknowledgement`; each worker sends its
acknowledgements as a :class:`CutReport`. :func:`validate_cut_coverage` is pure (no I/O) and
takes reports from any number of workers, so one process and a multi-worker server use the same
check; :func:`check_cut_evidence` compares one acknowledgement with the entry the token store
holds for it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ...errors import DeadlineExceededError, GenerationCutError
from ...format.records import GenerationCut
from ...ids import Identifier
from ...tokens import TokenEntry, TokenPutReceipt, prefix_digest, token_key

__all__ = [
    "CutAcknowledgement",
    "CutDisposition",
    "CutInventory",
    "CutReport",
    "CutTicket",
    "check_cut_evidence",
    "cut_call_id",
    "validate_cut_coverage",
]

CutDisposition = Literal["never_started", "completed", "cut", "failed", "excluded"]
"""``never_started``: queued, no token generated (re-issued from scratch); ``completed``: the
generation finished and its tokens are durable, response not yet delivered; ``cut``: a durable
active prefix; ``failed``: a durable terminal failure (the cut could not be staged; the call is
regenerated); ``excluded``: explicitly not cut (e.g. constrained decoding; regenerated)."""

_DURABLE: frozenset[str] = frozenset({"completed", "cut"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CutTicket(_Model):
    """One accepted call of a frozen inventory."""

    worker: Identifier
    rollout_id: Identifier
    attempt: int = Field(ge=0)
    call_id: Identifier

    @property
    def ticket_id(self) -> str:
        return f"{self.worker}/{self.rollout_id}/a{self.attempt}/{self.call_id}"


class CutInventory(_Model):
    """The calls accepted when admission closed for ``checkpoint_id``, and the workers that hold them.

    ``workers`` lists every managed worker process: each must report, even with no calls.
    """

    checkpoint_id: Identifier
    instance: Identifier
    workers: tuple[Identifier, ...]
    tickets: tuple[CutTicket, ...]

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON of this inventory (tickets in ticket-id order)."""
        body = self.model_dump(mode="json")
        body["tickets"] = sorted(body["tickets"], key=lambda t: CutTicket(**t).ticket_id)
        body["workers"] = sorted(body["workers"])
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    @classmethod
    def merge(cls, inventories: Iterable[CutInventory]) -> CutInventory:
        """One inventory from every worker's own (same checkpoint and instance)."""
        parts = list(inventories)
        if not parts:
            raise GenerationCutError("no worker inventories to merge", problem="missing_worker")
        first = parts[0]
        for part in parts[1:]:
            if (part.checkpoint_id, part.instance) != (first.checkpoint_id, first.instance):
                raise GenerationCutError(
                    f"inventory of {part.instance}/{part.checkpoint_id} merged with "
                    f"{first.instance}/{first.checkpoint_id}",
                    problem="identity",
                )
        return cls(
            checkpoint_id=first.checkpoint_id,
            instance=first.instance,
            workers=tuple(w for p in parts for w in p.workers),
            tickets=tuple(t for p in parts for t in p.tickets),
        )


class CutAcknowledgement(_Model):
    """One call's disposition for one checkpoint, with the evidence a durable one needs.

    ``cut`` and ``completed`` carry all of: ``cut_kind``, ``frozen_buffer_id``,
    ``prefix_token_count``, ``prefix_digest``, ``policy_version`` and the token-store
    ``receipt``; the other dispositions carry none of them (``reason`` says why).
    """

    checkpoint_id: Identifier
    worker: Identifier
    rollout_id: Identifier
    attempt: int = Field(ge=0)
    call_id: Identifier
    disposition: CutDisposition
    cut_kind: Literal["active_prefix", "terminal_completion"] | None = None
    frozen_buffer_id: str | None = Field(
        default=None, min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
    )
    prefix_token_count: int | None = Field(default=None, ge=0)
    prefix_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    policy_version: str | None = Field(default=None, min_length=1, max_length=256)
    receipt: TokenPutReceipt | None = None
    reason: str | None = None
    acknowledged_at: float

    @property
    def ticket_id(self) -> str:
        return CutTicket(
            worker=self.worker, rollout_id=self.rollout_id, attempt=self.attempt, call_id=self.call_id
        ).ticket_id

    def generation_cut(self) -> GenerationCut:
        """The token-free cut coordinates a commit writes (durable dispositions only)."""
        if (
            self.disposition not in _DURABLE
            or self.cut_kind is None
            or self.frozen_buffer_id is None
            or self.prefix_token_count is None
            or self.prefix_digest is None
            or self.receipt is None
        ):
            raise GenerationCutError(f"{self.ticket_id}: no durable cut to record", problem="partial")
        return GenerationCut(
            cut_kind=self.cut_kind,
            frozen_buffer_id=self.frozen_buffer_id,
            prefix_token_count=self.prefix_token_count,
            prefix_digest=self.prefix_digest,
            receipt_key=self.receipt.key,
            receipt_digest=self.receipt.digest,
            receipt_length=self.receipt.length,
        )


class CutReport(_Model):
    """Everything one worker acknowledges for one checkpoint."""

    checkpoint_id: Identifier
    worker: Identifier
    acknowledgements: tuple[CutAcknowledgement, ...] = ()


def cut_call_id(call_id: str, prefix_token_count: int) -> str:
    """The token-store call id of a cut prefix: ``<call_id>.cut<count>`` (a call's own id names
    its complete generation, so a prefix needs a key of its own)."""
    return f"{call_id}.cut{prefix_token_count}"


def _expected_key(ack: CutAcknowledgement) -> str:
    count = ack.prefix_token_count or 0
    call = cut_call_id(ack.call_id, count) if ack.disposition == "cut" else ack.call_id
    return token_key(ack.rollout_id, ack.attempt, call)


def _fail(message: str, problem: str, **details: object) -> GenerationCutError:
    return GenerationCutError(message, problem=problem, **details)


def validate_cut_coverage(
    inventory: CutInventory,
    reports: Iterable[CutReport],
    *,
    deadline: float,
    now: float,
) -> dict[str, CutAcknowledgement]:
    """Check that the reports cover every ticket of ``inventory`` exactly once; ticket id -> ack.

    Refused (``GenerationCutError`` with ``problem``): a listed worker that did not report
    (``missing_worker``), a report or acknowledgement for another checkpoint or from an unlisted
    worker (``identity``), an acknowledgement for no ticket (``unknown``), two for one ticket
    (``duplicate``), a ticket without one (``missing``), a durable disposition without all its
    evidence or another one with evidence (``partial``), a receipt for another key
    (``receipt_mismatch``), a cut of kind inconsistent with its disposition (``partial``), one
    acknowledged after ``deadline`` (``late``). ``now`` past ``deadline`` is ``DeadlineExceededError``.
    """
    if now > deadline:
        raise DeadlineExceededError(
            f"generation cuts of {inventory.checkpoint_id}: deadline passed before coverage was checked",
            deadline=deadline,
        )
    cid = inventory.checkpoint_id
    tickets: dict[str, CutTicket] = {}
    for ticket in inventory.tickets:
        if ticket.worker not in inventory.workers:
            raise _fail(f"{cid}: ticket {ticket.ticket_id} names unlisted worker", "identity")
        if ticket.ticket_id in tickets:
            raise _fail(f"{cid}: the inventory lists {ticket.ticket_id} twice", "duplicate")
        tickets[ticket.ticket_id] = ticket
    reported: set[str] = set()
    acks: dict[str, CutAcknowledgement] = {}
    for report in reports:
        if report.checkpoint_id != cid or report.worker not in inventory.workers:
            raise _fail(
                f"{cid}: report of worker {report.worker} for {report.checkpoint_id} is not part of it",
                "identity",
            )
        if report.worker in reported:
            raise _fail(f"{cid}: worker {report.worker} reported twice", "duplicate")
        reported.add(report.worker)
        for ack in report.acknowledgements:
            _check_ack(cid, report.worker, ack, deadline)
            tid = ack.ticket_id
            if tid not in tickets:
                raise _fail(f"{cid}: acknowledgement of {tid}, which the inventory does not list", "unknown")
            if tid in acks:
                raise _fail(f"{cid}: {tid} is acknowledged twice", "duplicate")
            acks[tid] = ack
    missing_workers = sorted(set(inventory.workers) - reported)
    if missing_workers:
        raise _fail(
            f"{cid}: workers {missing_workers} did not report", "missing_worker", workers=missing_workers
        )
    missing = sorted(set(tickets) - set(acks))
    if missing:
        raise _fail(
            f"{cid}: {len(missing)} accepted calls have no acknowledgement: {missing[:5]}",
            "missing",
            tickets=missing[:20],
        )
    return acks


def _check_ack(cid: str, worker: str, ack: CutAcknowledgement, deadline: float) -> None:
    tid = ack.ticket_id
    if ack.checkpoint_id != cid or ack.worker != worker:
        raise _fail(f"{cid}: acknowledgement {tid} names {ack.worker}/{ack.checkpoint_id}", "identity")
    if ack.acknowledged_at > deadline:
        raise _fail(f"{cid}: {tid} was acknowledged after the deadline", "late")
    evidence = (
        ack.cut_kind,
        ack.frozen_buffer_id,
        ack.prefix_token_count,
        ack.prefix_digest,
        ack.policy_version,
        ack.receipt,
    )
    if ack.disposition in _DURABLE:
        if any(item is None for item in evidence):
            raise _fail(f"{cid}: {tid} is {ack.disposition} but its evidence is partial", "partial")
        wanted = "active_prefix" if ack.disposition == "cut" else "terminal_completion"
        if ack.cut_kind != wanted:
            raise _fail(f"{cid}: {tid} is {ack.disposition} with cut kind {ack.cut_kind}", "partial")
        assert ack.receipt is not None
        if ack.receipt.key != _expected_key(ack):
            raise _fail(
                f"{cid}: {tid}: receipt names {ack.receipt.key}, not {_expected_key(ack)}", "receipt_mismatch"
            )
    elif any(item is not None for item in evidence):
        raise _fail(f"{cid}: {tid} is {ack.disposition} yet carries cut evidence", "partial")


def check_cut_evidence(ack: CutAcknowledgement | GenerationCut, entry: TokenEntry, where: str = "") -> None:
    """Compare a durable cut with the entry the token store holds under its receipt key.

    ``receipt_mismatch``: the entry's own receipt (sha256 and length of its canonical bytes)
    differs from the one acknowledged; ``digest_mismatch``: its generation tokens are not
    ``prefix_token_count`` tokens hashing to ``prefix_digest``.
    """
    if isinstance(ack, CutAcknowledgement):
        cut = ack.generation_cut()
        where = where or ack.ticket_id
    else:
        cut = ack
    actual = entry.receipt()
    if (actual.key, actual.digest, actual.length) != (
        cut.receipt_key,
        cut.receipt_digest,
        cut.receipt_length,
    ):
        raise _fail(
            f"{where}: the token store holds {actual.key} with sha256 {actual.digest} ({actual.length} "
            f"bytes); the receipt says {cut.receipt_key} {cut.receipt_digest} ({cut.receipt_length} bytes)",
            "receipt_mismatch",
        )
    tokens = entry.generation_token_ids
    if len(tokens) != cut.prefix_token_count or prefix_digest(tokens) != cut.prefix_digest:
        raise _fail(
            f"{where}: the {len(tokens)} stored tokens do not match the cut "
            f"({cut.prefix_token_count} tokens, digest {cut.prefix_digest[:12]}...)",
            "digest_mismatch",
        )
