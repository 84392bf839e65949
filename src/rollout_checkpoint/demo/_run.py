"""The demo, start to finish: run, checkpoint mid-generation, crash, restore, finish, compare.

:func:`run_demo` runs N multi-turn rollouts (:mod:`._workload`) in one process, publishes a
checkpoint while generations are in flight (the run goes on), publishes a second one and
"crashes" right after its commit point (every in-memory object of that process is dropped and
can write nothing more), restores the second checkpoint into a new process, runs every rollout
to completion, then runs the same seed again without interruption and compares.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import JsonValue

from ..errors import CheckpointError
from ..format.manifests import new_checkpoint_id
from ..ids import ExecutionId
from ..protocol import ParticipantKind
from ..reader import RecoveryPlan, load_checkpoint
from ..store import MemoryStore, ObjectStore
from ._demonstrated import continuable_cuts
from ._workload import Crashed, DemoWorld, Ledger, RolloutSpec, rollout_specs, run_rollout

__all__ = ["DemoReport", "run_demo"]

Progress = Callable[[str], None]


class _CrashNow(BaseException):
    """Raised by the fault hook right after the commit point: the process dies there."""


@dataclass
class DemoReport:
    """What the demo measured; :meth:`to_json` is the ``--json`` line."""

    rollouts: int
    turns: int
    seed: int
    completed: int = 0
    continued: int = 0
    fresh_dispatch: int = 0
    completed_before_crash: int = 0
    checkpoints_published: int = 0
    checkpoint_ids: list[str] = field(default_factory=list)
    restore_id: str | None = None
    generation_cuts: int = 0
    generation_cuts_continued: int = 0
    repeated_model_calls: int = 0
    repeated_tool_calls: int = 0
    redone_by_fresh_dispatch: int = 0
    lost_results: int = 0
    matches_uninterrupted: bool = False
    mismatched: list[str] = field(default_factory=list)
    pause_ms: float = 0.0
    pause_ms_p50: float = 0.0
    pause_ms_max: float = 0.0
    errors: list[str] = field(default_factory=list)
    demonstrated: dict[str, bool] = field(default_factory=dict)
    not_demonstrated: dict[str, str] = field(default_factory=dict)

    def demonstrate(self, feature: str, shown: bool, reason: str) -> None:
        """Record whether the run showed ``feature``; ``reason`` says why not (kept only then).
        Not part of :meth:`failures`: a correct run that did not show a feature is still correct."""
        self.demonstrated[feature] = shown
        if shown:
            self.not_demonstrated.pop(feature, None)
        else:
            self.not_demonstrated[feature] = reason

    def judge(self, *, crashed: bool, no_crash: str, no_cut: str) -> None:
        """Fill :attr:`demonstrated` for :data:`FEATURES`: the crash (``no_crash`` says why it did
        not happen), rollouts continued from their boundary, generations continued from their
        cut (``no_cut`` says why none was, when the crash happened)."""
        self.demonstrate("crash", crashed, no_crash)
        self.demonstrate(
            "rollouts_continued",
            self.continued > 0,
            "the run restored no checkpoint"
            if not crashed or self.restore_id is None
            else "the restored checkpoint held no rollout to continue (each had finished, had not "
            "started, or plays a restart-only environment)",
        )
        self.demonstrate(
            "generation_cuts_continued",
            self.generation_cuts_continued > 0,
            "the run restored no checkpoint" if not crashed or self.restore_id is None else no_cut,
        )

    def failures(self) -> list[str]:
        """Why this is not a correct run (empty when it is); what it did not demonstrate is in
        :attr:`not_demonstrated`, not here."""
        out = [f"error: {e}" for e in self.errors]
        if self.completed != self.rollouts:
            out.append(f"only {self.completed} of {self.rollouts} rollouts completed")
        if self.lost_results:
            out.append(f"{self.lost_results} results lost")
        if self.repeated_model_calls or self.repeated_tool_calls:
            out.append(
                f"repeated completed operations: {self.repeated_model_calls} model, "
                f"{self.repeated_tool_calls} tool calls"
            )
        if not self.matches_uninterrupted:
            which = ", ".join(self.mismatched) or "missing results"
            out.append(f"differs from the uninterrupted run: {which}")
        return out

    @property
    def ok(self) -> bool:
        return not self.failures()

    def to_json(self) -> dict[str, JsonValue]:
        # why a run is not correct comes first: a reader (or a cut-off log line) sees it at once,
        # then what it demonstrated (apart from correctness)
        out: dict[str, JsonValue] = {
            "ok": self.ok,
            "failures": list(self.failures()),
            "demonstrated": dict(self.demonstrated),
            "not_demonstrated": dict(self.not_demonstrated),
        }
        out.update(asdict(self))
        # the newest checkpoint this run published (what a reader resolves to afterwards)
        out["checkpoint_id"] = self.checkpoint_ids[-1] if self.checkpoint_ids else None
        return out


def _threads(
    world: DemoWorld,
    jobs: list[tuple[RolloutSpec, ExecutionId, Any]],
    ledger: Ledger,
    errors: list[str],
    *,
    max_tokens: int,
    failures: list[CheckpointError] | None = None,
) -> list[threading.Thread]:
    failures = failures if failures is not None else []

    def body(spec: RolloutSpec, execution: ExecutionId, restored: Any) -> None:
        try:
            if restored is True:  # a continued rollout picks up its restored boundary first
                restored = world.agent.begin(execution)
            run_rollout(world, spec, execution, ledger, restored=restored, max_tokens=max_tokens)
        except Crashed:
            pass
        except Exception as exc:
            if not world.store.dead.is_set():
                errors.append(f"{execution}: {type(exc).__name__}: {exc}")
                if isinstance(exc, CheckpointError):
                    failures.append(exc)

    threads = [threading.Thread(target=body, args=job, name=f"demo-{job[1]}", daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    return threads


def _join(threads: list[threading.Thread], timeout: float) -> None:
    end = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))


def _cuts(world: DemoWorld) -> int:
    """Calls cut at a durable prefix so far: active prefixes and held completions."""
    stats = world.model.stats()
    return int(stats.get("cuts", 0)) + int(stats.get("completed", 0))


def _wait_for(
    ledger: Ledger,
    model_calls: int,
    exported: set[str],
    timeout: float,
    failures: Sequence[CheckpointError] = (),
) -> None:
    """Until ``model_calls`` results were consumed and a rollout of an exported environment is
    waiting on a generation (or every rollout finished, or ``timeout``). A typed error in any
    rollout (an unwritable store, say) ends the demo at once with that error."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if failures:
            raise failures[0]
        with ledger.lock:
            if sum(ledger.model.values()) >= model_calls and ledger.in_model & exported:
                return
            if all(r in ledger.results for r in exported):
                return
        time.sleep(0.002)


def run_demo(
    store: ObjectStore,
    *,
    rollouts: int = 6,
    turns: int = 4,
    seed: int = 7,
    token_delay: float = 0.004,
    max_tokens: int = 12,
    skip_restore: ParticipantKind | None = None,
    progress: Progress | None = None,
    timeout: float = 300.0,
    accept_unsafe_store: bool = False,
    crash_wait: float = 30.0,
) -> DemoReport:
    """Run the demo on ``store``; raises the restore's :class:`CheckpointError` (for example
    :class:`~rollout_checkpoint.coordinator.MissingParticipantError` with ``skip_restore``).

    The crash waits up to ``crash_wait`` seconds (the run goes on, checkpointed) for a checkpoint
    that holds a generation cut of a rollout it continues; past that it crashes anyway and
    :attr:`DemoReport.not_demonstrated` says why no generation was continued from a cut."""
    say = progress or (lambda _line: None)
    report = DemoReport(rollouts=rollouts, turns=turns, seed=seed)

    run_id = f"demo-{uuid.uuid4().hex[:12]}"

    def world(target: ObjectStore, **kwargs: Any) -> DemoWorld:
        return DemoWorld(
            target,
            seed=seed,
            token_delay=token_delay,
            concurrency=max(8, rollouts),
            accept_unsafe_store=accept_unsafe_store,
            run_id=run_id,
            **kwargs,
        )

    # the crash comes right after the commit point of a checkpoint that holds a generation cut
    # of a rollout it continues (or once ``crash_wait`` has passed): the fault hook looks at each
    # candidate once it is published; one it does not crash at is a checkpoint like any other
    candidate: dict[str, Any] = {"id": "", "decided": False, "crash": False}
    marks: dict[str, float] = {}  # the current checkpoint's steps: its pause, freeze to resume

    def hook(step: str) -> None:
        marks.setdefault(step, time.perf_counter())
        if not candidate["id"] or not step.startswith("resume:"):
            return
        if not candidate["decided"]:
            candidate["decided"] = True
            candidate["crash"] = crash_now(candidate["id"])
        if candidate["crash"]:
            raise _CrashNow(step)

    # -- 1. the first process: run, checkpoint while generating, checkpoint again and crash ------
    first = world(store, fault_hook=hook)
    # a run of its own: rollout ids (token-store keys) never repeat between runs in one store
    specs = rollout_specs(rollouts, turns, seed, first.envs, prefix=f"run{uuid.uuid4().hex[:8]}")
    before = Ledger()
    jobs: list[tuple[RolloutSpec, ExecutionId, Any]] = []
    for spec in specs:
        env = first.envs[spec.env]
        execution = first.registry.dispatch(
            spec.rollout_id, input_digest=spec.digest, restart_only=env.mode == "restart_only"
        )
        first.registry.start(execution)
        jobs.append((spec, execution, None))
    exported = {s.rollout_id for s in specs if first.envs[s.env].mode == "exported"}
    failed: list[CheckpointError] = []
    threads = _threads(first, jobs, before, report.errors, max_tokens=max_tokens, failures=failed)
    say(f"1. {rollouts} rollouts running ({', '.join(sorted({s.env for s in specs}))}), {turns} turns max")
    _wait_for(before, rollouts, exported, timeout, failed)
    outcome = first.coordinator.checkpoint(deadline_s=timeout)
    report.checkpoints_published += 1
    report.checkpoint_ids.append(outcome.checkpoint_id)
    pauses = [outcome.pause_seconds]
    cuts = _cuts(first)
    say(
        f"2. published {outcome.checkpoint_id} with generations in flight "
        f"(paused {outcome.pause_seconds * 1000:.1f} ms, {cuts} generation cuts); the run goes on"
    )
    crash_by = time.monotonic() + crash_wait
    no_cut = ""
    published_to = first.store

    def crash_now(checkpoint_id: str) -> bool:
        nonlocal no_cut
        with before.lock:
            finished = all(r in before.results for r in exported)
        try:
            cuts = continuable_cuts(load_checkpoint(published_to, checkpoint_id, verify=False))
        except CheckpointError:
            cuts = 0
        if cuts:
            return True
        if finished:
            no_cut = (
                "every rollout that could continue finished before a checkpoint held a generation "
                "cut of one (a slow or loaded machine; try more --turns)"
            )
            return True
        if time.monotonic() >= crash_by:
            no_cut = f"no checkpoint held a generation cut of a rollout to continue within {crash_wait:g} s"
            return True
        return False

    crash_id, crashed = "", False
    _wait_for(before, 2 * rollouts, exported, timeout, failed)
    while not crashed:
        crash_id = new_checkpoint_id()
        candidate.update(id=crash_id, decided=False, crash=False)
        marks.clear()
        marks["start"] = time.perf_counter()
        try:
            first.coordinator.checkpoint(crash_id, deadline_s=timeout)
        except _CrashNow:
            crashed = True
        started = marks.get("freeze", marks["start"])
        resumed = min((t for s, t in marks.items() if s.startswith("resume:")), default=time.perf_counter())
        pauses.append(resumed - started)
        report.checkpoints_published += 1
        report.checkpoint_ids.append(crash_id)
        if not crashed:  # the run goes on: wait for the next generation in flight
            with before.lock:
                consumed = sum(before.model.values())
            _wait_for(before, consumed + 1, exported, timeout, failed)
    report.generation_cuts = _cuts(first)
    first.crash(crash_id)
    _join(threads, timeout)
    report.completed_before_crash = len(before.results)
    say(
        f"3. published {crash_id} ({report.generation_cuts} generation cuts so far) and crashed "
        "right after its commit point: every in-memory object dropped"
    )
    del first, threads

    # -- 2. a new process restores the crash checkpoint and runs everything to completion --------
    second = world(store, skip=skip_restore)
    try:
        restored = second.coordinator.recover(checkpoint_id=crash_id, deadline_s=timeout)
    except CheckpointError:
        second.close()
        raise
    plan: RecoveryPlan = restored.plan
    report.restore_id = restored.restore_id
    report.continued, report.fresh_dispatch = len(plan.continued), len(plan.fresh)
    say(
        f"4. restored {crash_id} as {restored.restore_id}: {plan.counts()} "
        f"(fresh dispatch: {sorted({p.reason for p in plan.fresh})})"
    )
    after = Ledger()
    final: dict[str, dict[str, JsonValue]] = {}
    jobs = []
    by_id = {s.rollout_id: s for s in specs}
    for rollout_id, entry in plan.rollouts.items():
        spec = by_id[rollout_id]
        if entry.disposition == "completed":
            info = second.registry.get(rollout_id)
            if info.result is not None and isinstance(info.result.result, dict):
                final[rollout_id] = dict(info.result.result)
            continue
        nxt = entry.execution.next_attempt()
        if entry.disposition == "fresh_dispatch":
            second.registry.start(nxt)
            jobs.append((spec, nxt, None))
        else:
            jobs.append((spec, nxt, True))
    threads = _threads(second, jobs, after, report.errors, max_tokens=max_tokens)
    _join(threads, timeout)
    final.update(after.results)
    stats = second.model.stats()
    report.generation_cuts_continued = int(stats.get("cuts_continued", 0))
    continued = {p.rollout_id for p in plan.continued}
    for ledger_key in ("model", "tool"):
        done_before: Any = getattr(before, ledger_key)
        done_after: Any = getattr(after, ledger_key)
        repeats = sum(
            1 for key in done_after if key[0] in continued and (done_before[key] + done_after[key] > 1)
        )
        redone = sum(1 for key in done_after if key[0] not in continued and done_before[key])
        setattr(report, f"repeated_{ledger_key}_calls", repeats)
        report.redone_by_fresh_dispatch += redone
    report.completed = len(final)
    report.lost_results = rollouts - len(final)
    second.close()
    say(
        f"5. finished every rollout: {report.completed}/{rollouts} results, "
        f"{report.generation_cuts_continued} generations continued from their cut, "
        f"{report.repeated_model_calls} repeated model calls, "
        f"{report.repeated_tool_calls} repeated tool calls"
    )

    # -- 3. the same seed again, uninterrupted, for comparison ----------------------------------
    reference = world(MemoryStore(f"demo-reference-{uuid.uuid4().hex}"))
    straight = Ledger()
    jobs = []
    for spec in specs:
        env = reference.envs[spec.env]
        execution = reference.registry.dispatch(
            spec.rollout_id, input_digest=spec.digest, restart_only=env.mode == "restart_only"
        )
        reference.registry.start(execution)
        jobs.append((spec, execution, None))
    ref_errors: list[str] = []
    _join(_threads(reference, jobs, straight, ref_errors, max_tokens=max_tokens), timeout)
    reference.close()
    report.errors.extend(f"uninterrupted run: {e}" for e in ref_errors)
    report.mismatched = sorted(r for r in by_id if final.get(r) != straight.results.get(r))
    report.matches_uninterrupted = not report.mismatched and len(straight.results) == rollouts
    report.pause_ms = round(max(pauses) * 1000, 3)
    report.pause_ms_max = report.pause_ms
    report.pause_ms_p50 = round(statistics.median(pauses) * 1000, 3)
    report.judge(
        crashed=True,
        no_crash="",
        no_cut=no_cut
        or "the checkpoint the crash came after held a generation cut, but no continued rollout consumed it",
    )
    say(
        f"6. same seed uninterrupted: final environment states and rewards "
        f"{'match' if report.matches_uninterrupted else 'DIFFER for ' + ', '.join(report.mismatched)}"
    )
    return report
