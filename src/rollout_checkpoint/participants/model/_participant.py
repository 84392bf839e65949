"""The policy model participant: generations, generation cuts, durable tokens, token-free lineage."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Literal, cast

from pydantic import JsonValue

from ...errors import (
    GenerationCutError,
    IdentityConflictError,
    InvalidArgumentError,
    InvalidPhaseError,
    StaleAttemptError,
    UnknownExecutionError,
)
from ...format.records import GenerationCut, ModelCallLineageRecord, Record
from ...ids import ExecutionId, validate_id
from ...protocol import (
    DEFAULT_LEASE_GRACE_SECONDS,
    DeferredBatches,
    Export,
    ExportRows,
    Readiness,
    RecordBatch,
    RowsExport,
    ScopeSource,
    WorkerTopology,
    execution_key,
)
from ...tokens import LineageStore, TokenEntry, TokenPutReceipt, TokenSink, TokenSource
from ..generation import FakeGenerationBackend
from ._calls import (
    CutRound,
    GenerationResult,
    ModelCall,
    Ticket,
    check_call_id,
    check_policy_version,
    check_token_ids,
    token_entry,
)
from ._chain import Chain, Chains, chains_from_records
from ._cutting import CutRounds
from ._export import (
    NO_PENDING,
    Fragment,
    ReceiptColumns,
    chain_fragment,
    lineage_batch,
    lineage_payload,
    pending_calls,
)

__all__ = ["Delivery", "GenerationResult", "ModelCall", "PolicyModelParticipant"]

Delivery = Literal["inline", "staged"]


class PolicyModelParticipant(RowsExport, CutRounds):
    """The policy (training-token) model server.

    With a ``backend``, :meth:`generate` runs a generation and returns once its response is
    delivered. When a checkpoint closes admission, the accepted calls are frozen into an
    inventory and each reaches one disposition (``docs/protocol.md``, "Generation cuts"): an
    active generation is cut (the backend swaps its buffer; the frozen prefix is staged in the
    token store), a finished one keeps its durable completion, a queued one never starts until
    resume. Responses are held until resume. Commit writes token-free lineage (delivered calls)
    and the cut coordinates of undelivered ones; after a restore, re-issuing such a call with the
    same ``call_id`` continues from its prefix, delivered ``inline`` (token ids materialized and
    checked) or ``staged`` (the backend reads the token store).

    Without a backend, :meth:`call` / :meth:`admit` give a :class:`ModelCall` whose tokens the
    integration stages itself; such a call blocks prepare until staged or closed.
    """

    def __init__(
        self,
        token_sink: TokenSink,
        instance: str = "policy",
        *,
        backend: FakeGenerationBackend | None = None,
        delivery: Delivery = "inline",
        token_source: TokenSource | None = None,
        policy_version: str = "v1",
        worker: str = "w0",
        lineage_store: LineageStore | None = None,
        topology: WorkerTopology = "single_process",
        lease_grace_seconds: float = DEFAULT_LEASE_GRACE_SECONDS,
        clock: Callable[[], float] | None = None,
        start_paused: bool = False,
    ) -> None:
        super().__init__(
            kind="model",
            instance=instance,
            mode="exported",
            topology=topology,
            concurrency="declared_safe",
            lease_grace_seconds=lease_grace_seconds,
            clock=clock,
            start_paused=start_paused,
        )
        if delivery not in ("inline", "staged"):
            raise InvalidArgumentError(f"delivery must be 'inline' or 'staged', got {delivery!r}")
        if token_source is None and isinstance(token_sink, TokenSource):
            token_source = token_sink
        if backend is not None and delivery == "staged" and backend.token_source is None:
            raise InvalidArgumentError("staged delivery needs a backend with a token_source")
        if backend is not None and delivery == "inline" and token_source is None:
            raise InvalidArgumentError("inline delivery needs a token_source to materialize prefixes")
        self.token_sink = token_sink
        self.token_source = token_source
        self.backend = backend
        self.delivery: Delivery = delivery
        self.policy_version = check_policy_version(policy_version)
        self.worker = validate_id(worker, "worker")
        self.lineage_store = lineage_store
        self._chains: dict[ExecutionId, Chain] = Chains()
        # The export, kept up to date incrementally (see ``_export``): each exported chain's
        # fragment, and the chains that were not quiet at the last export (looked at again).
        self._rows: ExportRows[ExecutionId, Fragment] = ExportRows(execution_key)
        self._rows_built = False
        self._nonquiet: set[ExecutionId] = set()
        self._inflight: set[tuple[ExecutionId, str]] = set()  # external calls not yet staged or closed
        self._tickets: dict[tuple[ExecutionId, str], Ticket] = {}
        self._round: CutRound | None = None
        self._prepare_deadline = 0.0
        self._stats: Counter[str] = Counter()

    # -- generations ------------------------------------------------------------------------------
    def generate(
        self,
        execution: ExecutionId,
        call_id: str,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int = 32,
        policy_version: str | None = None,
        wait: float = 30.0,
        cuttable: bool = True,
    ) -> GenerationResult:
        """Run one policy call to its delivered response (blocking).

        Parks up to ``wait`` s while admission is closed. ``cuttable=False`` (constrained
        decoding, say) excludes the call from cuts: a crash regenerates it. The same ``call_id``
        re-issued by the next attempt after a restore continues from the restored cut.
        """
        backend = self.backend
        if backend is None:
            raise InvalidPhaseError(f"model/{self.instance} has no generation backend; use call()/admit()")
        version = check_policy_version(policy_version) if policy_version is not None else self.policy_version
        check_call_id(call_id)
        prompt = check_token_ids(prompt_token_ids, "prompt_token_ids")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        with self._cond:
            self._admit(execution, wait=wait)
            chain = self._claim(execution, call_id)
            pending = chain.pending.pop(call_id, None)
            self._touch(execution)
            if pending is not None and pending.prompt not in (None, prompt):
                # the same call id with another request: its prefix belongs to another
                # generation, so it is regenerated from scratch rather than continued
                self._stats["cuts_discarded"] += 1
                pending = None
            ticket = Ticket(execution, call_id, version, bool(cuttable), chain, prompt, pending)
            self._tickets[ticket.key] = ticket
        try:
            return self._serve(backend, ticket, max_tokens)
        except BaseException as exc:
            with self._cond:
                if self._tickets.get(ticket.key) is ticket:
                    # a frozen call that ends without a durable result still gets its disposition
                    self._fail_in_round(ticket, f"the call failed: {type(exc).__name__}")
                    self._drop_ticket(ticket)
            raise

    async def agenerate(
        self,
        execution: ExecutionId,
        call_id: str,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int = 32,
        policy_version: str | None = None,
        wait: float = 30.0,
        cuttable: bool = True,
    ) -> GenerationResult:
        """:meth:`generate` for an event loop (runs in a worker thread)."""
        return await asyncio.to_thread(
            self.generate,
            execution,
            call_id,
            prompt_token_ids,
            max_tokens=max_tokens,
            policy_version=policy_version,
            wait=wait,
            cuttable=cuttable,
        )

    def _serve(self, backend: FakeGenerationBackend, ticket: Ticket, max_tokens: int) -> GenerationResult:
        execution, call_id = ticket.key
        prefix = ticket.pending.prefix if ticket.pending is not None else None
        generation = backend.open(
            (execution.rollout_id, execution.attempt, call_id), ticket.prompt, max_tokens, prefix=prefix
        )
        with backend.slot():
            with self._cond:
                while True:  # a call frozen as never started stays unstarted until resume
                    self._check_ticket(ticket)
                    if ticket.frozen_as is None or ticket.frozen_as != self._active:
                        break
                    self._cond.wait(self._wait_slice(None))
                    self._check_lease()
                ticket.frozen_as = None
                ticket.generation = generation
                ticket.state = "running"
                generation.begin()
            output = generation.run()
        if output.finish_reason == "cancelled":
            raise StaleAttemptError(f"model call {call_id} of {execution} was retired while generating")
        entry = token_entry(execution, call_id, ticket.prompt, output.token_ids, output.log_probs)
        with self._cond:
            self._check_ticket(ticket)
            ticket.state = "staging"
        receipt = self._put(entry)  # durable before it counts; no lock held
        with self._cond:
            self._check_ticket(ticket)
            ticket.completion, ticket.completed_entry = receipt, entry
            self._acknowledge_completion(ticket, generation, entry, receipt)
            while not self._accepting:  # the response is held until resume
                self._cond.wait(self._wait_slice(None))
                self._check_lease()
            self._check_ticket(ticket)
            continued = ticket.pending.cut if ticket.pending is not None else None
            record = ModelCallLineageRecord(
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                call_id=call_id,
                parent_call_id=ticket.chain.tip,
                policy_version=ticket.policy_version,
                token_key=receipt.key,
                continued_from=continued,
            )
            self._deliver(ticket.chain, record, receipt)
            self._drop_ticket(ticket)
            self._stats["calls_completed"] += 1
            if continued is not None:
                self._stats["cuts_continued"] += 1
        return GenerationResult(
            token_ids=output.token_ids,
            log_probs=output.log_probs,
            finish_reason=output.finish_reason,
            lineage=record,
            continued_from=continued,
            prefix_token_count=output.prefix_token_count,
        )

    def _put(self, entry: TokenEntry) -> TokenPutReceipt:
        receipt = self.token_sink.put(entry)
        if receipt != entry.receipt():
            raise GenerationCutError(
                f"token sink {self.token_sink.name} returned receipt {receipt.key} {receipt.digest} "
                f"({receipt.length} bytes) for an entry that is {entry.key} {entry.receipt().digest}",
                problem="receipt_mismatch",
            )
        return receipt

    def _check_ticket(self, ticket: Ticket) -> None:
        """Lock held: the ticket's attempt is still current here (not retired, restored or finished)."""
        self.fence.check(ticket.execution)
        if (
            self._tickets.get(ticket.key) is not ticket
            or self._chains.get(ticket.execution) is not ticket.chain
        ):
            raise StaleAttemptError(
                f"model call {ticket.call_id} of {ticket.execution} was retired meanwhile"
            )

    def _drop_ticket(self, ticket: Ticket) -> None:
        self._tickets.pop(ticket.key, None)
        ticket.chain.inflight.discard(ticket.call_id)
        self._touch(ticket.execution)
        self._forget_if_empty(ticket.execution, ticket.chain)
        self._changed()

    # -- external calls -------------------------------------------------------------------------
    @contextmanager
    def call(
        self, execution: ExecutionId, call_id: str, *, policy_version: str | None = None, wait: float = 0.0
    ) -> Iterator[ModelCall]:
        """Admit a model call (refused, or parked up to ``wait`` s, while closed) for its lifetime."""
        handle = self.admit(execution, call_id, policy_version=policy_version, wait=wait)
        try:
            yield handle
        finally:
            handle.close()

    def admit(
        self, execution: ExecutionId, call_id: str, *, policy_version: str | None = None, wait: float = 0.0
    ) -> ModelCall:
        """The non-context form of :meth:`call`: close the returned call when done."""
        version = check_policy_version(policy_version) if policy_version is not None else self.policy_version
        check_call_id(call_id)
        with self._cond:
            self._admit(execution, wait=wait)
            self._claim(execution, call_id)
            self._inflight.add((execution, call_id))
        return ModelCall(self, execution, call_id, version)

    def _claim(self, execution: ExecutionId, call_id: str) -> Chain:
        """Lock held, admitted: reserve ``call_id`` in the execution's chain (created if new)."""
        chain = self._chains.get(execution)
        if chain is not None and (call_id in chain.receipts or call_id in chain.inflight):
            raise IdentityConflictError(f"model call {call_id} of {execution} was already admitted")
        if chain is None:
            self._register(execution)
            chain = self._chains[execution] = Chain()
        chain.inflight.add(call_id)
        self._touch(execution)
        return chain

    def _stage(
        self,
        call: ModelCall,
        prompt_token_ids: Sequence[int],
        generation_token_ids: Sequence[int],
        generation_log_probs: Sequence[float],
        mask: Sequence[int] | None,
    ) -> ModelCallLineageRecord:
        execution = call.execution
        with self._cond:
            self.fence.check(execution)
            chain = self._chains.get(execution)
            if chain is None or (execution, call.call_id) not in self._inflight or call._closed:
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
            if self._chains.get(execution) is not chain or (execution, call.call_id) not in self._inflight:
                raise StaleAttemptError(f"model call {call.call_id} of {execution} was retired meanwhile")
            record = ModelCallLineageRecord(
                rollout_id=execution.rollout_id,
                attempt=execution.attempt,
                call_id=call.call_id,
                parent_call_id=chain.tip,
                policy_version=call.policy_version,
                token_key=receipt.key,
            )
            self._deliver(chain, record, receipt)
            self._inflight.discard((execution, call.call_id))
            call.lineage = record
            self._changed()
            return record

    def _close_call(self, call: ModelCall) -> None:
        with self._cond:
            chain = self._chains.get(call.execution)
            if (call.execution, call.call_id) in self._inflight:
                self._inflight.discard((call.execution, call.call_id))
                if chain is not None:
                    chain.inflight.discard(call.call_id)
                    self._touch(call.execution)
                    self._forget_if_empty(call.execution, chain)
                self._changed()

    # -- lineage ------------------------------------------------------------------------------------
    def _deliver(self, chain: Chain, record: ModelCallLineageRecord, receipt: TokenPutReceipt) -> None:
        """Lock held: ``record`` joins the lineage (the call's response is being delivered)."""
        if self.lineage_store is not None:
            self.lineage_store.record(record)
        chain.calls.append(record)
        self._touch(record.execution)
        chain.encoded[record.call_id] = lineage_payload(record)  # not inside a checkpoint's pause
        chain.receipts[record.call_id] = receipt
        chain.inflight.discard(record.call_id)
        # A restored cut whose call was not re-issued before the lineage moved on is void.
        self._stats["cuts_discarded"] += len(chain.pending)
        chain.pending.clear()
        self._changed()

    def _touch(self, execution: ExecutionId) -> None:
        """Lock held: the chain of ``execution`` changed; the next export looks at it again."""
        cast(Chains, self._chains).touched.add(execution)

    def _forget_if_empty(self, execution: ExecutionId, chain: Chain) -> None:
        if self._chains.get(execution) is chain and not (chain.calls or chain.inflight or chain.pending):
            del self._chains[execution]  # nothing delivered: the execution leaves no trace here
            self._unregister(execution)

    def finish(self, execution: ExecutionId) -> None:
        """The rollout is done with the model: drop its lineage (it is not exported again)."""
        with self._cond:
            self._require_live(execution)
            chain = self._chains[execution]
            if chain.inflight:
                raise InvalidPhaseError(f"{execution} still has {len(chain.inflight)} model calls in flight")
            del self._chains[execution]
            self._unregister(execution)
            if self.lineage_store is not None:
                self.lineage_store.drop(execution)
            self._changed()

    def lineage(self, execution: ExecutionId) -> list[ModelCallLineageRecord]:
        with self._cond:
            chain = self._chains.get(execution)
            return list(chain.calls) if chain else []

    def pending_cuts(self, execution: ExecutionId) -> dict[str, GenerationCut]:
        """The restored cuts of ``execution`` still waiting for their call to be re-issued, by call id."""
        with self._cond:
            chain = self._chains.get(execution)
            return {c: p.cut for c, p in sorted(chain.pending.items())} if chain else {}

    def stats(self) -> dict[str, int]:
        """Counters: calls_completed, cuts (durable active prefixes), completed / never_started /
        excluded / failed dispositions, cuts_continued, inflight, and the backend's counters."""
        with self._cond:
            out = {
                "calls_completed": self._stats["calls_completed"],
                "cuts": self._stats["cut"],
                "completed": self._stats["completed"],
                "never_started": self._stats["never_started"],
                "excluded": self._stats["excluded"],
                "failed": self._stats["failed"],
                "cuts_continued": self._stats["cuts_continued"],
                "cuts_discarded": self._stats["cuts_discarded"],
                "inflight": len(self._tickets) + len(self._inflight),
            }
        if self.backend is not None:
            backend = self.backend.stats()
            out["generations_started"] = backend["generations_started"]
            out["tokens_generated"] = backend["tokens_generated"]
            out["prefix_tokens_reused"] = backend["prefix_tokens_reused"]
        return out

    # -- hooks --------------------------------------------------------------------------------------
    def _readiness(self) -> Readiness:
        blockers = [f"{e}/{c}" for e, c in sorted(self._inflight, key=lambda k: (execution_key(k[0]), k[1]))]
        blockers += self._cut_blockers(not blockers)
        return Readiness(
            blockers=blockers,
            counts={"executions": len(self._chains), "inflight": len(self._inflight) + len(self._tickets)},
        )

    def _manifest_extra(self) -> Mapping[str, JsonValue]:
        extra: dict[str, JsonValue] = {"token_store": self.token_sink.name}
        extra.update(self._cut_extra())
        return extra

    def _export_rows(self, scope: ScopeSource) -> Export:
        """Incremental: a *quiet* chain (no call in flight, no pending cut) that did not grow
        since the last export reuses the fragment that export built (its calls are append-only,
        each call's receipt and payload are set with it, and a receipt's snapshot id is fixed
        when it is first exported, so the fragment is still exactly what it would build now).
        Other chains are built afresh, their undelivered calls checked here as before. The
        batches are built from the fragments after the freeze (:class:`DeferredBatches`)."""
        snapshot_id = self._active
        if snapshot_id is None:  # commit exports only while its checkpoint is active
            raise InvalidPhaseError("model lineage is exported only during a commit")
        durable = self._durable_cuts()
        chains = cast(Chains, self._chains)
        rows = self._rows
        examine: list[tuple[ExecutionId, Chain | None]]
        if self._rows_built:  # what changed since the last export, and what was not quiet then
            get = chains.get
            examine = [(e, get(e)) for e in chains.touched | self._nonquiet]
        else:
            examine = list(chains.items())
            rows.clear()
        nonquiet: list[tuple[ExecutionId, Chain]] = []
        for execution, chain in examine:
            if chain is None:  # retired, or emptied
                rows.discard(execution)
            elif chain.pending or chain.inflight:
                nonquiet.append((execution, chain))
            else:
                fragment: Fragment | None = chain.fragment  # type: ignore[assignment]
                if fragment is None or fragment[1] != len(chain.calls):
                    if not chain.calls:
                        rows.discard(execution)
                        continue
                    fragment = chain.fragment = chain_fragment(execution, chain, snapshot_id, NO_PENDING)
                rows.set(execution, fragment)
        nonquiet.sort(key=lambda p: execution_key(p[0]))  # an undelivered call's error: the first
        for execution, chain in nonquiet:
            pending = pending_calls(execution, chain, self._tickets, durable)
            if not chain.calls and not pending:
                rows.discard(execution)
            else:
                rows.set(execution, chain_fragment(execution, chain, snapshot_id, pending))
        chains.touched = set()
        self._nonquiet = {execution for execution, _ in nonquiet}
        self._rows_built = True
        frozen = rows.freeze(scope)  # sorted and filtered by scope when first used
        sink = self.token_sink.name

        def build() -> list[RecordBatch]:
            lineage: list[ModelCallLineageRecord] = []
            encoded: list[bytes | None] = []
            receipts = ReceiptColumns()
            for fragment in frozen.kept()[1]:
                lineage.extend(fragment[2])
                encoded.extend(fragment[3])
                for row in fragment[4]:
                    receipts.add(*row)
            return [lineage_batch(lineage, encoded), receipts.batch(sink)]

        return Export(records=DeferredBatches(build), executions=frozen.executions(), sorted_unique=True)

    def _validate_restore(self, records: Sequence[Record]) -> Callable[[], list[ExecutionId]]:
        chains = chains_from_records(records, delivery=self.delivery, token_source=self.token_source)

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
                for call_id in chain.inflight:
                    ticket = self._tickets.pop((execution, call_id), None)
                    if ticket is not None and ticket.generation is not None:
                        ticket.generation.cancel()
            if self.lineage_store is not None:
                self.lineage_store.drop(execution)
