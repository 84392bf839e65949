"""Generation cuts through the public API: a checkpoint taken while generations run cuts them at
a durable prefix; after a crash the re-issued call continues from it (inline or staged) and
produces exactly the uninterrupted tokens. Every negative control is refused."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from _telemetry import telemetry, total
from rollout_checkpoint import (
    AgentBoundaryRecord,
    AgentParticipant,
    CheckpointError,
    Coordinator,
    CutAcknowledgement,
    CutInventory,
    CutReport,
    CutTicket,
    ExecutionId,
    FakeGenerationBackend,
    GenerationResult,
    LiveExecutionRegistry,
    ObjectStoreTokenStore,
    PolicyModelParticipant,
    load_checkpoint,
    validate_cut_coverage,
    verify_checkpoint,
)
from rollout_checkpoint.archive import ArchiveWriter
from rollout_checkpoint.errors import (
    CheckpointRejectedError,
    DeadlineExceededError,
    GenerationCutError,
    StaleAttemptError,
    TransientStoreError,
)
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.format.records import ModelCallLineageRecord
from rollout_checkpoint.protocol import Export
from rollout_checkpoint.store import MemoryStore, ObjectStore
from rollout_checkpoint.telemetry import Attr, Metric, Span
from rollout_checkpoint.tokens import TokenEntry, TokenPutReceipt, prefix_digest, token_key

PROMPT = [3, 1, 4, 1, 5]
MAX = 80
DELAY = 0.002


def ex(rollout: str = "r1", attempt: int = 0) -> ExecutionId:
    return ExecutionId(rollout_id=rollout, attempt=attempt)


def soon(seconds: float = 30.0) -> float:
    return time.time() + seconds


class Background:
    """Runs ``model.generate`` calls in threads and collects what each returns or raises."""

    def __init__(self) -> None:
        self.results: dict[str, GenerationResult] = {}
        self.errors: dict[str, BaseException] = {}
        self.threads: list[threading.Thread] = []

    def start(self, name: str, fn: Callable[[], GenerationResult]) -> None:
        def run() -> None:
            try:
                self.results[name] = fn()
            except BaseException as exc:
                self.errors[name] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(30)
            assert not thread.is_alive()


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.002)


HOLD = 20


class GatedBackend(FakeGenerationBackend):
    """Once armed, every generation stops after ``HOLD`` tokens until released, so a checkpoint
    finds it mid-generation deterministically (each generation runs in a thread of its own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gate = threading.Event()
        self._gate.set()
        self._counts: dict[int, int] = {}
        self._held = 0
        self._waiters = threading.Condition()

    def arm(self) -> None:
        with self._waiters:
            self._counts.clear()
            self._held = 0
            self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def wait_held(self, n: int = 1) -> None:
        with self._waiters:
            assert self._waiters.wait_for(lambda: self._held >= n, 10), "generations not held"

    def _token(self, state: bytes) -> tuple[int, float]:
        if not self._gate.is_set():
            with self._waiters:
                thread = threading.get_ident()
                self._counts[thread] = self._counts.get(thread, 0) + 1
                hold = self._counts[thread] > HOLD
                if hold:
                    self._held += 1
                    self._waiters.notify_all()
            if hold:
                self._gate.wait(30)
        return super()._token(state)


class World:
    """An agent parked at its boundary, the policy model with the fake backend, a coordinator."""

    def __init__(
        self,
        store: ObjectStore,
        delivery: str = "inline",
        model_cls: type[PolicyModelParticipant] = PolicyModelParticipant,
        **backend: Any,
    ) -> None:
        self.tokens = ObjectStoreTokenStore(store)
        self.backend = GatedBackend(seed=7, token_delay=DELAY, token_source=self.tokens, **backend)
        self.agent = AgentParticipant("agent-0")
        self.model = model_cls(
            self.tokens,
            "policy-0",
            backend=self.backend,
            delivery=delivery,  # type: ignore[arg-type]
        )
        self.registry = LiveExecutionRegistry()
        self.coordinator = Coordinator(
            store, [self.agent, self.model], self.registry, self.tokens, run_id="test-run"
        )

    def close(self) -> None:
        self.agent.close()
        self.model.close()

    def call(self, execution: ExecutionId, call_id: str) -> GenerationResult:
        """The next turn's model call, the run parked on it while it waits."""
        self.agent.start_turn(execution)
        with self.agent.awaiting_model(execution, call_id):
            return self.model.generate(execution, call_id, PROMPT, max_tokens=MAX)

    def at_boundary(self, rollout: str) -> ExecutionId:
        """Dispatch, one delivered call ``c0``, the agent parks after it (``c1`` is next)."""
        execution = self.registry.dispatch(rollout, input_digest=rollout)
        self.registry.start(execution)
        self.agent.begin(execution)
        self.model.generate(execution, "c0", PROMPT, max_tokens=4)
        self.agent.boundary(
            execution,
            AgentBoundaryRecord(
                rollout_id=rollout,
                attempt=execution.attempt,
                boundary_index=1,
                turn_index=1,
                last_model_call_id="c0",
            ),
        )
        return execution


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    yield MemoryStore(f"cuts-{time.monotonic_ns()}")


@pytest.mark.parametrize("delivery", ["inline", "staged"])
def test_crash_mid_generation_continues_from_the_exact_prefix(store: MemoryStore, delivery: str) -> None:
    reference = FakeGenerationBackend(seed=7).generate(PROMPT, MAX)
    world = World(store, delivery)
    execution = world.at_boundary("r1")
    calls = Background()
    world.backend.arm()
    calls.start("c1", lambda: world.call(execution, "c1"))
    world.backend.wait_held()
    outcome = world.coordinator.checkpoint()
    report = world.model.stats()
    assert report["cuts"] == 1, report
    # the crash: the in-flight response is lost with the process (its thread is abandoned)
    world.backend.release()
    world.close()

    plan = load_checkpoint(store, outcome.checkpoint_id)
    assert [p.rollout_id for p in plan.continued] == ["r1"]
    members = {m.key: m.refs for m in plan.readers[("model", "policy-0")].members(kind="model_lineage")}
    cut = members["c1"]["cut"]  # type: ignore[index]
    assert members["c1"]["parent"] == "c0" and cut["kind"] == "active_prefix"  # type: ignore[index]
    assert cut["count"] == HOLD

    fresh = World(store, delivery)
    restored = fresh.coordinator.restore(outcome.checkpoint_id)
    assert fresh.model.phase.value == "restored"  # paused until resume
    fresh.coordinator.resume(restored.restore_id)
    nxt = execution.next_attempt()
    boundary = fresh.agent.begin(nxt)
    assert boundary is not None and boundary.last_model_call_id == "c0"
    assert {c: k.cut_kind for c, k in fresh.model.pending_cuts(nxt).items()} == {"c1": "active_prefix"}
    result = fresh.model.generate(nxt, "c1", PROMPT, max_tokens=MAX)
    assert result.token_ids == reference.token_ids and result.log_probs == reference.log_probs
    assert result.continued_from is not None and result.prefix_token_count == cut["count"]
    assert result.lineage.parent_call_id == "c0" and result.lineage.continued_from == result.continued_from
    stats = fresh.model.stats()
    assert stats["cuts_continued"] == 1 and stats["prefix_tokens_reused"] == cut["count"]
    assert stats["tokens_generated"] == MAX - cut["count"]
    assert fresh.backend.completed_calls() == [("r1", 1, "c1")]
    fresh.close()


def test_without_a_crash_the_cut_call_completes_after_resume(store: MemoryStore) -> None:
    world = World(store)
    execution = world.at_boundary("r1")
    calls = Background()
    world.backend.arm()
    calls.start("c1", lambda: world.call(execution, "c1"))
    world.backend.wait_held()
    world.coordinator.checkpoint()
    world.backend.release()
    calls.join()
    assert calls.results["c1"].token_ids == FakeGenerationBackend(seed=7).generate(PROMPT, MAX).token_ids
    assert world.model.stats()["cuts"] == 1
    assert [c.call_id for c in world.model.lineage(execution)] == ["c0", "c1"]


def test_response_is_held_until_resume_and_dispositions_cover_every_call(store: MemoryStore) -> None:
    """One running call (cut), one queued for a backend slot (never started), one excluded."""
    world = World(store, concurrency=2)
    a, b, c = (world.at_boundary(r) for r in ("r1", "r2", "r3"))
    calls = Background()
    world.backend.arm()
    calls.start("a", lambda: world.model.generate(a, "c1", PROMPT, max_tokens=MAX))
    calls.start("b", lambda: world.model.generate(b, "c1", PROMPT, max_tokens=MAX, cuttable=False))
    world.backend.wait_held(2)  # both slots busy
    calls.start("c", lambda: world.model.generate(c, "c1", PROMPT, max_tokens=MAX))
    wait_for(lambda: world.model.stats()["inflight"] == 3)
    otel = telemetry()
    otel.spans.clear()
    with otel.delta() as points:
        report = world.model.prepare("ck-1", soon())
    assert report.ready
    frozen = world.model.cut_report()
    assert frozen is not None
    inventory, acks = frozen
    assert len(inventory.tickets) == 3
    assert {a.rollout_id: a.disposition for a in acks.acknowledgements} == {
        "r1": "cut",
        "r2": "excluded",
        "r3": "never_started",
    }
    # the metrics count the same dispositions; the cutter's span joins the prepare's trace
    for disposition in ("cut", "excluded", "never_started"):
        assert total(points, Metric.GENERATION_CUTS, {Attr.CUT_DISPOSITION: disposition}) == 1
    (prepare,) = [x for x in otel.finished() if x.name == Span.participant("prepare")]
    (cutter,) = [x for x in otel.finished() if x.name == Span.participant("generation_cut")]
    assert cutter.context.trace_id == prepare.context.trace_id
    world.backend.release()
    wait_for(lambda: len(world.backend.completed_calls()) == 5)  # 3 boundary calls + a and b
    assert not calls.results  # finished, but the responses are held
    assert world.model.stats()["generations_started"] == 5  # c never started
    world.model.commit("ck-1", store, soon())
    world.model.resume("ck-1", soon())
    calls.join()
    assert sorted(calls.results) == ["a", "b", "c"] and not calls.errors


class GatedSink:
    """Token sink whose puts of completions wait for a gate (a slow durable write)."""

    def __init__(self, inner: ObjectStoreTokenStore) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.waiting = threading.Event()

    @property
    def name(self) -> str:
        return self.inner.name

    def put(self, entry: TokenEntry) -> TokenPutReceipt:
        if entry.call_id == "slow":
            self.waiting.set()
            self.gate.wait(30)
        return self.inner.put(entry)


def test_a_call_finishing_during_prepare_keeps_its_durable_completion(store: MemoryStore) -> None:
    tokens = ObjectStoreTokenStore(store)
    sink = GatedSink(tokens)
    backend = FakeGenerationBackend(seed=7)
    model = PolicyModelParticipant(sink, "policy-0", backend=backend, token_source=tokens)
    calls = Background()
    calls.start("slow", lambda: model.generate(ex(), "slow", PROMPT, max_tokens=12))
    sink.waiting.wait(10)  # the generation finished; its tokens are being made durable
    done: list[Any] = []
    waiter = threading.Thread(target=lambda: done.append(model.prepare("ck-1", soon())))
    waiter.start()
    wait_for(lambda: model.cut_report() is not None)
    assert not done  # prepare waits for the completion's custody
    sink.gate.set()
    waiter.join(30)
    assert done[0].ready
    _, acks = model.cut_report() or (None, None)
    assert acks is not None and [a.disposition for a in acks.acknowledgements] == ["completed"]
    reply = model.commit("ck-1", store, soon())
    reader = ArchiveReader.open(store, reply.manifest_key.rsplit("/", 1)[0])
    (record,) = [r for r in reader.iter_records(kind="model_lineage")]
    assert isinstance(record, ModelCallLineageRecord) and record.cut is not None
    assert record.cut.cut_kind == "terminal_completion" and record.cut.prefix_token_count == 12
    model.resume("ck-1", soon())
    calls.join()
    assert calls.results["slow"].token_ids == backend.generate(PROMPT, 12).token_ids


def test_a_held_completion_is_acknowledged_by_the_next_round_too(store: MemoryStore) -> None:
    """A call completed during checkpoint 1 (response held until resume); checkpoint 1 resumes
    and checkpoint 2 closes admission before the held call's thread runs again: the next round
    acknowledges the durable completion at once (it used to wait for an acknowledgement that
    thread would never send, so prepare stayed not ready until its deadline)."""
    tokens = ObjectStoreTokenStore(store)
    sink = GatedSink(tokens)
    backend = FakeGenerationBackend(seed=7)
    model = PolicyModelParticipant(sink, "policy-0", backend=backend, token_source=tokens)
    calls = Background()
    calls.start("slow", lambda: model.generate(ex(), "slow", PROMPT, max_tokens=12))
    sink.waiting.wait(10)
    waiter = threading.Thread(target=lambda: model.prepare("ck-1", soon()))
    waiter.start()
    wait_for(lambda: model.cut_report() is not None)
    sink.gate.set()
    waiter.join(30)
    with model._cond:  # the held call cannot look at admission between the two operations
        model.resume("ck-1", soon())
        report = model.prepare("ck-2", time.time() + 2)
    assert report.ready, report
    _, acks = model.cut_report() or (None, None)
    assert acks is not None and [a.disposition for a in acks.acknowledgements] == ["completed"]
    assert acks.acknowledgements[0].checkpoint_id == "ck-2"
    model.resume("ck-2", soon())
    calls.join()
    assert calls.results["slow"].token_ids == backend.generate(PROMPT, 12).token_ids


# -- negative controls --------------------------------------------------------------------------


class LyingSink:
    """Returns a receipt whose digest is not the one of the stored bytes."""

    def __init__(self, inner: ObjectStoreTokenStore) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    def put(self, entry: TokenEntry) -> TokenPutReceipt:
        receipt = self.inner.put(entry)
        if ".cut" not in entry.call_id:
            return receipt
        return receipt.model_copy(update={"digest": "0" * 64})


class LyingBackend(GatedBackend):
    """Reports a digest that does not describe the frozen tokens."""

    def _digest(self, tokens: Any) -> str:
        return prefix_digest([*tokens, 1])


@pytest.mark.parametrize("liar", ["sink", "backend"])
def test_prepare_fails_when_a_cut_receipt_or_digest_disagrees(store: MemoryStore, liar: str) -> None:
    tokens = ObjectStoreTokenStore(store)
    if liar == "sink":
        backend: GatedBackend = GatedBackend(seed=7, token_delay=DELAY)
        model = PolicyModelParticipant(LyingSink(tokens), backend=backend, token_source=tokens)
    else:
        backend = LyingBackend(seed=7, token_delay=DELAY)
        model = PolicyModelParticipant(tokens, backend=backend)
    calls = Background()
    backend.arm()
    calls.start("c1", lambda: model.generate(ex(), "c1", PROMPT, max_tokens=MAX))
    backend.wait_held()
    with pytest.raises(GenerationCutError) as info:
        model.prepare("ck-1", soon())
    assert info.value.details["problem"] == ("receipt_mismatch" if liar == "sink" else "digest_mismatch")
    assert model.accepting and model.phase.value == "idle"  # the failed prepare reopened admission
    backend.release()
    calls.join()
    assert "c1" in calls.results  # the call itself was never harmed


def test_prepare_is_not_ready_when_its_deadline_expires_before_the_cut(store: MemoryStore) -> None:
    class SlowSink(LyingSink):
        def put(self, entry: TokenEntry) -> TokenPutReceipt:
            if ".cut" in entry.call_id:
                time.sleep(0.3)
            return self.inner.put(entry)

    tokens = ObjectStoreTokenStore(store)
    backend = GatedBackend(seed=7, token_delay=DELAY)
    model = PolicyModelParticipant(SlowSink(tokens), backend=backend, token_source=tokens)
    calls = Background()
    backend.arm()
    calls.start("c1", lambda: model.generate(ex(), "c1", PROMPT, max_tokens=MAX))
    backend.wait_held()
    report = model.prepare("ck-1", soon(0.05))
    assert not report.ready and report.blockers == ("cut w0/r1/a0/c1",)
    assert not model.accepting  # not ready is an answer: admission stays closed until resume
    assert model.prepare("ck-1", soon()).ready  # a retry with a later deadline may wait for it
    model.resume("ck-1", soon())
    backend.release()
    calls.join()
    assert "c1" in calls.results


def _ticket(call: str, worker: str = "w0") -> CutTicket:
    return CutTicket(worker=worker, rollout_id="r1", attempt=0, call_id=call)


def _ack(call: str, disposition: str = "cut", worker: str = "w0", **changes: Any) -> CutAcknowledgement:
    tokens = [1, 2, 3]
    key = token_key("r1", 0, f"{call}.cut3" if disposition == "cut" else call)
    fields: dict[str, Any] = {
        "checkpoint_id": "ck",
        "worker": worker,
        "rollout_id": "r1",
        "attempt": 0,
        "call_id": call,
        "disposition": disposition,
        "acknowledged_at": 100.0,
    }
    if disposition in ("cut", "completed"):
        fields |= {
            "cut_kind": "active_prefix" if disposition == "cut" else "terminal_completion",
            "frozen_buffer_id": f"gen-{call}.b0",
            "prefix_token_count": 3,
            "prefix_digest": prefix_digest(tokens),
            "policy_version": "v1",
            "receipt": TokenPutReceipt(key=key, digest="a" * 64, length=10),
        }
    return CutAcknowledgement(**(fields | changes))


INVENTORY = CutInventory(
    checkpoint_id="ck",
    instance="policy",
    workers=("w0", "w1"),
    tickets=(_ticket("c1"), _ticket("c2"), _ticket("c3", "w1")),
)


def _check(*reports: CutReport, deadline: float = 200.0, now: float = 150.0) -> dict[str, CutAcknowledgement]:
    return validate_cut_coverage(INVENTORY, reports, deadline=deadline, now=now)


def _reports(w0: list[CutAcknowledgement], w1: list[CutAcknowledgement] | None = None) -> list[CutReport]:
    out = [CutReport(checkpoint_id="ck", worker="w0", acknowledgements=tuple(w0))]
    if w1 is not None:
        out.append(CutReport(checkpoint_id="ck", worker="w1", acknowledgements=tuple(w1)))
    return out


def test_coverage_accepts_every_call_acknowledged_exactly_once_across_workers() -> None:
    acks = _check(*_reports([_ack("c1"), _ack("c2", "never_started")], [_ack("c3", "completed", "w1")]))
    assert sorted(acks) == ["w0/r1/a0/c1", "w0/r1/a0/c2", "w1/r1/a0/c3"]
    merged = CutInventory.merge(
        [
            CutInventory(
                checkpoint_id="ck", instance="policy", workers=("w0",), tickets=INVENTORY.tickets[:2]
            ),
            CutInventory(
                checkpoint_id="ck", instance="policy", workers=("w1",), tickets=INVENTORY.tickets[2:]
            ),
        ]
    )
    assert merged.digest == INVENTORY.digest


@pytest.mark.parametrize(
    ("reports", "problem"),
    [
        (_reports([_ack("c1"), _ack("c2")]), "missing_worker"),
        (_reports([_ack("c1")], [_ack("c3", "cut", "w1")]), "missing"),
        (_reports([_ack("c1"), _ack("c2"), _ack("c1")], [_ack("c3", "cut", "w1")]), "duplicate"),
        (_reports([_ack("c1"), _ack("c2"), _ack("c9")], [_ack("c3", "cut", "w1")]), "unknown"),
        (_reports([_ack("c1", prefix_digest=None), _ack("c2")], [_ack("c3", "cut", "w1")]), "partial"),
        (_reports([_ack("c1", receipt=None), _ack("c2")], [_ack("c3", "cut", "w1")]), "partial"),
        (
            _reports(
                [_ack("c1", "failed", reason="x", prefix_token_count=3), _ack("c2")],
                [_ack("c3", "cut", "w1")],
            ),
            "partial",
        ),
        (
            _reports(
                [
                    _ack("c1", receipt=TokenPutReceipt(key="r1/a0/c2.cut3", digest="a" * 64, length=1)),
                    _ack("c2"),
                ],
                [_ack("c3", "cut", "w1")],
            ),
            "receipt_mismatch",
        ),
        (_reports([_ack("c1", acknowledged_at=300.0), _ack("c2")], [_ack("c3", "cut", "w1")]), "late"),
        (_reports([_ack("c1", checkpoint_id="other"), _ack("c2")], [_ack("c3", "cut", "w1")]), "identity"),
        (_reports([_ack("c1"), _ack("c2")], [_ack("c3", "cut", "w0")]), "identity"),
    ],
)
def test_coverage_refuses_every_gap(reports: list[CutReport], problem: str) -> None:
    with pytest.raises(GenerationCutError) as info:
        _check(*reports)
    assert info.value.details["problem"] == problem and info.value.code == "generation_cut_invalid"


def test_coverage_refuses_an_expired_deadline() -> None:
    with pytest.raises(DeadlineExceededError):
        _check(*_reports([_ack("c1"), _ack("c2")], [_ack("c3", "cut", "w1")]), now=201.0)


# -- restore-side checks and stale attempts ------------------------------------------------------------


def _checkpoint_with_a_cut(
    store: MemoryStore, model_cls: type[PolicyModelParticipant] = PolicyModelParticipant
) -> tuple[str, ExecutionId]:
    world = World(store, model_cls=model_cls)
    execution = world.at_boundary("r1")
    calls = Background()
    world.backend.arm()
    calls.start("c1", lambda: world.call(execution, "c1"))
    world.backend.wait_held()
    outcome = world.coordinator.checkpoint()
    world.backend.release()
    calls.join()
    world.close()
    return outcome.checkpoint_id, execution


def _rewrite_model_component(
    store: MemoryStore, cid: str, edit: Callable[[ModelCallLineageRecord], Any]
) -> None:
    prefix = f"checkpoints/{cid}/components/model/policy-0"
    reader = ArchiveReader.open(store, prefix)
    records = list(reader.iter_records())
    extra = dict(reader.manifest.extra)
    for info in store.list(prefix + "/"):
        store.delete(info.key)
    writer = ArchiveWriter(store, prefix, checkpoint_id=cid, participant_kind="model", instance="policy-0")
    for record in records:
        if isinstance(record, ModelCallLineageRecord) and record.cut is not None:
            record = edit(record)
        writer.write(record)
    writer.commit(extra=extra)


def test_restore_refuses_a_cut_whose_digest_does_not_match_its_tokens(store: MemoryStore) -> None:
    cid, _ = _checkpoint_with_a_cut(store)

    def wrong_digest(record: ModelCallLineageRecord) -> ModelCallLineageRecord:
        assert record.cut is not None
        cut = record.cut.model_copy(update={"prefix_digest": prefix_digest([9, 9, 9])})
        return record.model_copy(update={"cut": cut})

    _rewrite_model_component(store, cid, wrong_digest)
    fresh = World(store)
    with pytest.raises(CheckpointError) as info:
        fresh.model.restore("restore-1", cid, store, soon())
    assert info.value.details.get("problem") == "digest_mismatch"
    assert fresh.model.status().live == 0 and fresh.model.accepting  # nothing installed


def test_a_stale_attempts_late_call_never_joins_a_lineage(store: MemoryStore) -> None:
    cid, execution = _checkpoint_with_a_cut(store)
    fresh = World(store)
    restored = fresh.coordinator.restore(cid)
    fresh.coordinator.resume(restored.restore_id)
    with pytest.raises(StaleAttemptError):  # attempt N's late call reaches the restored server
        fresh.model.generate(execution, "c1", PROMPT, max_tokens=MAX)
    with pytest.raises(StaleAttemptError):
        fresh.model.generate(execution, "c-new", PROMPT, max_tokens=MAX)
    nxt = execution.next_attempt()
    assert [c.call_id for c in fresh.model.lineage(nxt)] == ["c0"]
    assert fresh.model.lineage(execution) == []


def test_retire_during_a_generation_voids_the_late_delivery(store: MemoryStore) -> None:
    world = World(store)
    execution = world.at_boundary("r1")
    calls = Background()
    world.backend.arm()
    calls.start("c1", lambda: world.call(execution, "c1"))
    world.backend.wait_held()
    world.coordinator.retire([execution])
    world.backend.release()
    calls.join()
    assert isinstance(calls.errors["c1"], StaleAttemptError)
    assert world.model.lineage(execution) == [] and world.model.stats()["inflight"] == 0
    assert world.backend.completed_calls() == [("r1", 0, "c0")]  # the retired generation stopped early


def _tampering(
    edit: Callable[[ModelCallLineageRecord], ModelCallLineageRecord],
) -> type[PolicyModelParticipant]:
    """A model participant whose commit writes cut records changed by ``edit`` (a buggy server)."""

    class Tampering(PolicyModelParticipant):
        def _export(self, scope: frozenset[ExecutionId] | None) -> Export:
            export = super()._export(scope)
            records = [
                edit(r) if isinstance(r, ModelCallLineageRecord) and r.cut is not None else r
                for r in export.records
            ]
            return Export(records=records, executions=export.executions)

    return Tampering


def _with_cut(**changes: Any) -> Callable[[ModelCallLineageRecord], ModelCallLineageRecord]:
    def edit(record: ModelCallLineageRecord) -> ModelCallLineageRecord:
        assert record.cut is not None
        return record.model_copy(update={"cut": record.cut.model_copy(update=changes)})

    return edit


def test_reader_rejects_a_cut_that_disagrees_with_its_token_receipt(store: MemoryStore) -> None:
    cid, _ = _checkpoint_with_a_cut(store, _tampering(_with_cut(receipt_digest="f" * 64)))
    with pytest.raises(CheckpointRejectedError) as info:
        load_checkpoint(store, cid)
    assert "token receipt digest" in info.value.message


def test_verify_rejects_a_cut_whose_digest_does_not_match_the_stored_tokens(store: MemoryStore) -> None:
    cid, _ = _checkpoint_with_a_cut(store, _tampering(_with_cut(prefix_digest=prefix_digest([1, 2]))))
    assert [p.rollout_id for p in load_checkpoint(store, cid, verify=False).continued] == ["r1"]  # index-only
    with pytest.raises(CheckpointRejectedError) as info:
        verify_checkpoint(store, cid)
    assert "do not match its coordinates" in info.value.message
    fresh = World(store)
    with pytest.raises(CheckpointError):  # and the restore refuses it before installing anything
        fresh.coordinator.restore(cid)
    assert fresh.model.status().live == 0


def test_reader_does_not_continue_a_cut_that_is_not_a_child_of_the_last_delivered_call(
    store: MemoryStore,
) -> None:
    def orphan(record: ModelCallLineageRecord) -> ModelCallLineageRecord:
        return record.model_copy(update={"parent_call_id": None})

    cid, _ = _checkpoint_with_a_cut(store, _tampering(orphan))
    (item,) = load_checkpoint(store, cid).fresh
    assert item.rollout_id == "r1" and "'c1'" in item.reason  # the orphaned cut call is named


class FailingCutSink(LyingSink):
    """The token store cannot take cut prefixes (down, full...): every cut fails durably."""

    def put(self, entry: TokenEntry) -> TokenPutReceipt:
        if ".cut" in entry.call_id:
            raise TransientStoreError("token store unavailable")
        return self.inner.put(entry)


def test_a_cut_that_cannot_be_staged_is_a_durable_failure_and_regenerates(store: MemoryStore) -> None:
    tokens = ObjectStoreTokenStore(store)
    backend = GatedBackend(seed=7, token_delay=DELAY)
    agent = AgentParticipant("agent-0")
    model = PolicyModelParticipant(FailingCutSink(tokens), "policy-0", backend=backend, token_source=tokens)
    registry = LiveExecutionRegistry()
    coordinator = Coordinator(store, [agent, model], registry, tokens, run_id="test-run")
    execution = registry.dispatch("r1", input_digest="r1")
    registry.start(execution)
    agent.begin(execution)
    agent.boundary(execution, AgentBoundaryRecord(rollout_id="r1", attempt=0, boundary_index=1, turn_index=1))
    agent.start_turn(execution)
    calls = Background()

    def call() -> GenerationResult:
        with agent.awaiting_model(execution, "c1"):
            return model.generate(execution, "c1", PROMPT, max_tokens=MAX)

    backend.arm()
    calls.start("c1", call)
    backend.wait_held()
    outcome = coordinator.checkpoint()  # a failed cut never blocks the checkpoint
    backend.release()
    assert model.stats()["failed"] == 1 and model.stats()["cuts"] == 0
    plan = load_checkpoint(store, outcome.checkpoint_id)
    assert [p.rollout_id for p in plan.continued] == ["r1"]
    extra = plan.readers[("model", "policy-0")].manifest.extra
    assert extra["generation_cuts"]["dispositions"] == {"failed": 1}  # type: ignore[index,call-overload]
    assert list(plan.readers[("model", "policy-0")].members(kind="model_lineage")) == []
    calls.join()

    fresh = World(store)
    restored = fresh.coordinator.restore(outcome.checkpoint_id)
    fresh.coordinator.resume(restored.restore_id)
    nxt = execution.next_attempt()
    assert fresh.agent.begin(nxt) is not None and fresh.model.pending_cuts(nxt) == {}
    result = fresh.model.generate(nxt, "c1", PROMPT, max_tokens=MAX)  # regenerated from scratch
    assert result.continued_from is None
    assert result.token_ids == FakeGenerationBackend(seed=7).generate(PROMPT, MAX).token_ids


def test_agenerate_serves_an_event_loop(store: MemoryStore) -> None:
    import asyncio

    model = PolicyModelParticipant(ObjectStoreTokenStore(store), backend=FakeGenerationBackend(seed=2))

    async def two_calls() -> list[GenerationResult]:
        return list(
            await asyncio.gather(
                model.agenerate(ex("r1"), "c1", PROMPT, max_tokens=6),
                model.agenerate(ex("r2"), "c1", PROMPT, max_tokens=6),
            )
        )

    first, second = asyncio.run(two_calls())
    assert first.token_ids == second.token_ids == FakeGenerationBackend(seed=2).generate(PROMPT, 6).token_ids


def test_a_frozen_call_whose_completion_cannot_be_staged_is_a_failure_not_a_blocker(
    store: MemoryStore,
) -> None:
    class FailingGate(GatedSink):
        def put(self, entry: TokenEntry) -> TokenPutReceipt:
            if entry.call_id == "slow":
                self.waiting.set()
                self.gate.wait(30)
                raise TransientStoreError("token store unavailable")
            return self.inner.put(entry)

    tokens = ObjectStoreTokenStore(store)
    sink = FailingGate(tokens)
    model = PolicyModelParticipant(sink, backend=FakeGenerationBackend(seed=7), token_source=tokens)
    calls = Background()
    calls.start("slow", lambda: model.generate(ex(), "slow", PROMPT, max_tokens=12))
    sink.waiting.wait(10)
    done: list[Any] = []
    waiter = threading.Thread(target=lambda: done.append(model.prepare("ck-1", soon())))
    waiter.start()
    wait_for(lambda: model.cut_report() is not None)
    sink.gate.set()
    waiter.join(30)
    assert done[0].ready  # the failure is the call's disposition: prepare does not wait for it
    _, acks = model.cut_report() or (None, None)
    assert acks is not None and [a.disposition for a in acks.acknowledgements] == ["failed"]
    calls.join()
    assert isinstance(calls.errors["slow"], TransientStoreError)
    model.resume("ck-1", soon())


def test_a_reissued_call_with_another_prompt_is_regenerated_not_continued(store: MemoryStore) -> None:
    cid, execution = _checkpoint_with_a_cut(store)
    fresh = World(store)
    restored = fresh.coordinator.restore(cid)
    fresh.coordinator.resume(restored.restore_id)
    nxt = execution.next_attempt()
    fresh.agent.begin(nxt)
    other = [*PROMPT, 9]
    result = fresh.model.generate(nxt, "c1", other, max_tokens=MAX)
    assert result.continued_from is None and result.prefix_token_count == 0
    assert result.token_ids == FakeGenerationBackend(seed=7).generate(other, MAX).token_ids
    assert fresh.model.stats()["cuts_discarded"] == 1 and fresh.model.stats()["cuts_continued"] == 0


def test_worker_reports_merge_into_one_coverage_check(store: MemoryStore) -> None:
    """Two worker processes of one model server (here two participants with worker ids): their
    inventories merge and their reports are checked together; a silent worker fails the check."""
    tokens = ObjectStoreTokenStore(store)
    workers = [
        PolicyModelParticipant(
            tokens, "policy", backend=GatedBackend(seed=7, token_delay=DELAY), worker=f"w{i}"
        )
        for i in range(2)
    ]
    gates = [w.backend for w in workers if isinstance(w.backend, GatedBackend)]
    for gate in gates:
        gate.arm()
    calls = Background()
    for i, worker in enumerate(workers):
        calls.start(f"w{i}", functools.partial(worker.generate, ex(f"r{i}"), "c1", PROMPT, max_tokens=MAX))
    for gate in gates:
        gate.wait_held()
    for worker in workers:
        assert worker.prepare("ck-1", soon()).ready
    frozen = [w.cut_report() for w in workers]
    assert all(f is not None for f in frozen)
    inventory = CutInventory.merge([f[0] for f in frozen if f is not None])
    reports = [f[1] for f in frozen if f is not None]
    acks = validate_cut_coverage(inventory, reports, deadline=soon(), now=time.time())
    assert sorted(acks) == ["w0/r0/a0/c1", "w1/r1/a0/c1"]
    assert {a.disposition for a in acks.values()} == {"cut"}
    with pytest.raises(GenerationCutError) as info:
        validate_cut_coverage(inventory, reports[:1], deadline=soon(), now=time.time())
    assert info.value.details["problem"] == "missing_worker"
    for worker in workers:
        worker.resume("ck-1", soon())
    for gate in gates:
        gate.release()
    calls.join()
    assert calls.results["w0"].token_ids == calls.results["w1"].token_ids


def test_a_restored_cut_survives_a_second_crash_before_it_is_reissued(store: MemoryStore) -> None:
    cid, execution = _checkpoint_with_a_cut(store)
    second = World(store)
    restored = second.coordinator.restore(cid)
    second.coordinator.resume(restored.restore_id)
    assert second.agent.begin(execution.next_attempt()) is not None
    again = second.coordinator.checkpoint()  # the cut is not re-issued yet: it is committed again
    second.close()

    third = World(store)
    restored = third.coordinator.restore(again.checkpoint_id)
    third.coordinator.resume(restored.restore_id)
    nxt = execution.next_attempt().next_attempt()
    assert third.agent.begin(nxt) is not None
    assert list(third.model.pending_cuts(nxt)) == ["c1"]
    result = third.model.generate(nxt, "c1", PROMPT, max_tokens=MAX)
    assert result.prefix_token_count == HOLD and result.lineage.parent_call_id == "c0"
    assert result.token_ids == FakeGenerationBackend(seed=7).generate(PROMPT, MAX).token_ids
