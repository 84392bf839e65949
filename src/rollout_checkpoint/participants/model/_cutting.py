"""Cut rounds: when admission closes, freeze the accepted calls and bring each to one disposition.

:class:`CutRounds` is the half of :class:`~._participant.PolicyModelParticipant` that runs a
round: the inventory is frozen in the admission hook, a cutter thread swaps the buffers of
running generations and stages their frozen prefixes durably, the calls' own threads acknowledge
completions, and readiness checks coverage (:func:`~._cuts.validate_cut_coverage`) once every
ticket is acknowledged.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from pydantic import JsonValue

from ...errors import CheckpointError, GenerationCutError
from ...ids import ExecutionId
from ...protocol import Cancellation, Participant, Phase, PrepareReport, execution_key
from ...telemetry import Attr, Span, bound, instruments, operation
from ...tokens import TokenEntry, TokenPutReceipt, TokenSink, prefix_digest
from ..generation import FrozenBuffer, Generation
from ._calls import CutRound, Ticket, token_entry
from ._cuts import (
    CutAcknowledgement,
    CutDisposition,
    CutInventory,
    CutReport,
    CutTicket,
    check_cut_evidence,
    cut_call_id,
    validate_cut_coverage,
)

__all__ = ["CutRounds"]


class CutRounds(Participant):
    """Generation-cut rounds (see the module docstring); the policy model participant's base."""

    token_sink: TokenSink
    worker: str
    delivery: Literal["inline", "staged"]
    _tickets: dict[tuple[ExecutionId, str], Ticket]
    _round: CutRound | None
    _prepare_deadline: float
    _stats: Counter[str]

    # -- generation cuts ---------------------------------------------------------------------------
    def prepare(
        self, checkpoint_id: str, deadline: float, *, cancel: Cancellation | None = None
    ) -> PrepareReport:
        with self._cond:
            if self._active is None:
                self._prepare_deadline = deadline  # the cut round's deadline
            elif self._active == checkpoint_id and self._round is not None:
                self._round.deadline = max(self._round.deadline, deadline)  # a repeat waits longer
            return super().prepare(checkpoint_id, deadline, cancel=cancel)

    def _on_admission(self, accepting: bool) -> None:
        if accepting:
            self._round = None  # the checkpoint ended: its inventory and acknowledgements go
        elif self._phase is Phase.PREPARING and self._active is not None:
            self._freeze(self._active)

    def _freeze(self, checkpoint_id: str) -> None:
        """Admission just closed: freeze the accepted calls and give each its disposition."""
        tickets = sorted(self._tickets.values(), key=lambda t: (execution_key(t.execution), t.call_id))
        by_id: dict[str, Ticket] = {}
        for ticket in tickets:
            by_id[self._cut_ticket(ticket).ticket_id] = ticket
        inventory = CutInventory(
            checkpoint_id=checkpoint_id,
            instance=self.instance,
            workers=(self.worker,),
            tickets=tuple(self._cut_ticket(t) for t in tickets),
        )
        round_ = self._round = CutRound(inventory, self._prepare_deadline, by_id)
        to_cut: list[Ticket] = []
        for ticket in tickets:
            if ticket.state == "queued":
                ticket.frozen_as = checkpoint_id
                self._record(
                    round_, self._plain_ack(ticket, "never_started", "not started when admission closed")
                )
            elif not ticket.cuttable:
                self._record(round_, self._plain_ack(ticket, "excluded", "the call is not cuttable"))
            elif ticket.state == "running":
                to_cut.append(ticket)
            elif ticket.completion is not None:
                # durable, its response held since an earlier round: its thread acknowledged that
                # round and now only waits for admission, so this round is acknowledged here
                assert ticket.generation is not None and ticket.completed_entry is not None
                self._acknowledge_completion(
                    ticket, ticket.generation, ticket.completed_entry, ticket.completion
                )
            # "staging" without a completion yet: its own thread acknowledges it once durable
        if to_cut:
            threading.Thread(  # under the prepare's trace context: the cut span joins its trace
                target=bound(self._cut_all), args=(round_, to_cut), name=f"cut-{self.instance}", daemon=True
            ).start()

    def _cut_all(self, round_: CutRound, tickets: Sequence[Ticket]) -> None:
        """The cutter: swap each running generation's buffer, stage the frozen prefix durably."""
        checkpoint_id = round_.inventory.checkpoint_id
        attributes: dict[str, str | int] = {Attr.CHECKPOINT_ID: checkpoint_id, Attr.CALLS: len(tickets)}
        with operation(Span.participant("generation_cut"), attributes=attributes):
            self._cut_each(round_, tickets)

    def _cut_each(self, round_: CutRound, tickets: Sequence[Ticket]) -> None:
        for ticket in tickets:
            generation = ticket.generation
            frozen = generation.cut() if generation is not None else None
            if frozen is None:
                continue  # finished meanwhile: its own thread acknowledges the completion
            try:
                ack = self._stage_cut(round_, ticket, frozen)
            except GenerationCutError as exc:
                with self._cond:
                    round_.errors.append(exc)
                    self._changed()
                continue
            except (CheckpointError, OSError) as exc:  # could not be made durable: regenerate
                ack = self._plain_ack(ticket, "failed", f"cut not staged: {exc}", round_)
            with self._cond:
                self._record(round_, ack)

    def _stage_cut(self, round_: CutRound, ticket: Ticket, frozen: FrozenBuffer) -> CutAcknowledgement:
        execution = ticket.execution
        entry = token_entry(
            execution,
            cut_call_id(ticket.call_id, frozen.boundary),
            ticket.prompt,
            frozen.token_ids,
            frozen.log_probs,
        )
        receipt = self.token_sink.put(entry)
        ack = CutAcknowledgement(
            checkpoint_id=round_.inventory.checkpoint_id,
            worker=self.worker,
            rollout_id=execution.rollout_id,
            attempt=execution.attempt,
            call_id=ticket.call_id,
            disposition="cut",
            cut_kind="active_prefix",
            frozen_buffer_id=frozen.buffer_id,
            prefix_token_count=frozen.boundary,
            prefix_digest=frozen.digest,
            policy_version=ticket.policy_version,
            receipt=receipt,
            acknowledged_at=self._clock(),
        )
        check_cut_evidence(ack, entry)  # the receipt and digest must describe what was staged
        return ack

    def _acknowledge_completion(
        self, ticket: Ticket, generation: Generation, entry: TokenEntry, receipt: TokenPutReceipt
    ) -> None:
        """Lock held: a frozen call finished before it was cut; its durable completion is its disposition."""
        round_ = self._round
        if round_ is None:
            return
        ack = CutAcknowledgement(
            checkpoint_id=round_.inventory.checkpoint_id,
            worker=self.worker,
            rollout_id=ticket.execution.rollout_id,
            attempt=ticket.execution.attempt,
            call_id=ticket.call_id,
            disposition="completed",
            cut_kind="terminal_completion",
            frozen_buffer_id=f"{generation.generation_id}.final",
            prefix_token_count=len(entry.generation_token_ids),
            prefix_digest=prefix_digest(entry.generation_token_ids),
            policy_version=ticket.policy_version,
            receipt=receipt,
            acknowledged_at=self._clock(),
        )
        self._record(round_, ack)

    def _plain_ack(
        self, ticket: Ticket, disposition: CutDisposition, reason: str, round_: CutRound | None = None
    ) -> CutAcknowledgement:
        round_ = round_ or self._round
        assert round_ is not None
        return CutAcknowledgement(
            checkpoint_id=round_.inventory.checkpoint_id,
            worker=self.worker,
            rollout_id=ticket.execution.rollout_id,
            attempt=ticket.execution.attempt,
            call_id=ticket.call_id,
            disposition=disposition,
            reason=reason,
            acknowledged_at=self._clock(),
        )

    def _fail_in_round(self, ticket: Ticket, reason: str) -> None:
        """Lock held: ``ticket`` ends without a durable result; if frozen, that is its disposition."""
        round_ = self._round
        if round_ is not None:
            self._record(round_, self._plain_ack(ticket, "failed", reason, round_))

    def _record(self, round_: CutRound, ack: CutAcknowledgement) -> None:
        """Lock held: the first acknowledgement of a ticket in a still-running round wins."""
        tid = ack.ticket_id
        if self._round is not round_ or tid not in round_.tickets or tid in round_.acks:
            return
        round_.acks[tid] = ack
        self._stats[ack.disposition] += 1
        instruments().generation_cuts.add(1, {Attr.CUT_DISPOSITION: ack.disposition})
        self._changed()

    def _cut_ticket(self, ticket: Ticket) -> CutTicket:
        return CutTicket(
            worker=self.worker,
            rollout_id=ticket.execution.rollout_id,
            attempt=ticket.execution.attempt,
            call_id=ticket.call_id,
        )

    def cut_report(self) -> tuple[CutInventory, CutReport] | None:
        """The active checkpoint's frozen inventory and this worker's acknowledgements so far."""
        with self._cond:
            round_ = self._round
            if round_ is None:
                return None
            acks = tuple(round_.acks[t] for t in sorted(round_.acks))
            return round_.inventory, CutReport(
                checkpoint_id=round_.inventory.checkpoint_id, worker=self.worker, acknowledgements=acks
            )

    def _cut_blockers(self, others_ready: bool) -> list[str]:
        """Lock held: the frozen calls not yet acknowledged. Once none is left (and nothing else
        blocks) while preparing, coverage is checked once; a failed cut or check raises."""
        round_ = self._round
        if round_ is None:
            return []
        if round_.errors:
            raise round_.errors[0]
        blockers = [f"cut {tid}" for tid in sorted(round_.tickets) if tid not in round_.acks]
        if others_ready and not blockers and not round_.validated and self._phase is Phase.PREPARING:
            report = CutReport(
                checkpoint_id=round_.inventory.checkpoint_id,
                worker=self.worker,
                acknowledgements=tuple(round_.acks.values()),
            )
            validate_cut_coverage(round_.inventory, [report], deadline=round_.deadline, now=self._clock())
            round_.validated = True
        return blockers

    def _cut_extra(self) -> dict[str, JsonValue]:
        """Lock held: the round's summary for the component manifest's ``extra``."""
        round_ = self._round
        if round_ is None:
            return {}
        counts = Counter(a.disposition for a in round_.acks.values())
        return {
            "generation_cuts": {
                "delivery": self.delivery,
                "workers": list(round_.inventory.workers),
                "inventory_digest": round_.inventory.digest,
                "dispositions": dict(sorted(counts.items())),
            }
        }

    def _durable_cuts(self) -> dict[tuple[ExecutionId, str], CutAcknowledgement]:
        """Lock held: the round's cut and completed acknowledgements, by (execution, call id)."""
        round_ = self._round
        if round_ is None:
            return {}
        return {
            round_.tickets[tid].key: ack
            for tid, ack in round_.acks.items()
            if ack.disposition in ("cut", "completed")
        }
