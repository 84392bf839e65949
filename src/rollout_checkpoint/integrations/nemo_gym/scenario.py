"""One crash-and-resume run of Gym blackjack rollouts, checked against an uninterrupted run.

:func:`run_scenario` starts the deployment (:mod:`.deployment`), dispatches the rollouts to the
checkpointed gymnasium agent, holds each rollout's second model call at the scripted model's gate
(the rollouts stay mid-episode however fast or loaded the machine), checkpoints until a
published checkpoint lets a rollout continue, SIGKILLs the chosen server, restarts only it
(paused), aborts any open checkpoint, retires the attempts still live in the survivors, restores
the checkpoint everywhere, resumes, dispatches each rollout the plan continues as attempt N+1
(from its boundary) and each fresh one from its input, and waits for every result. It then
compares every rollout with :func:`reference_run` (Gym's blackjack and the same scripted policy,
in this process, never interrupted) and counts repeated model calls (the model's call log) and
repeated tool calls (the agent's step log) below each restored boundary.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from ...ids import ExecutionId
from ...reader import load_checkpoint
from ...registry import LiveExecutionRegistry
from .blackjack import PROMPT, BlackjackDeployment, GymServers
from .model import blackjack_move

__all__ = [
    "BlackjackDeployment",
    "GymServers",
    "ScenarioResult",
    "reference_run",
    "rollout_body",
    "run_scenario",
]

_RUN_TIMEOUT_S = 300.0


def rollout_body(
    rollout_id: str, attempt: int, seed: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A task row as Gym's agents receive it (``seed`` makes the blackjack deal reproducible)."""
    return {
        "responses_create_params": {"input": PROMPT},
        "_ng_rollout_id": rollout_id,
        "_ng_attempt_index": attempt,
        "seed": seed,
        **(extra or {}),
    }


def _texts(items: list[Any]) -> list[str]:
    out = []
    for item in items:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.append("".join(str(c.get("text", "")) for c in content if isinstance(c, dict)))
    return out


async def _reference(seed: int, rollout_seed: int, max_steps: int) -> dict[str, Any]:
    from nemo_gym.openai_utils import NeMoGymResponse

    from .seeded import SeededBlackjackEnv

    env = SeededBlackjackEnv.model_construct(session_state={})
    obs, _ = await env.reset({"seed": rollout_seed}, "s")
    items: list[Any] = [{"role": "user", "content": PROMPT}, {"role": "user", "content": obs}]
    outputs: list[Any] = []
    reward, info = 0.0, {}
    for _ in range(max_steps):
        text = blackjack_move(seed, [*items, *outputs])
        message = {
            "type": "message",
            "id": "m",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        outputs.append(message)
        response = NeMoGymResponse.model_validate(
            {
                "id": "r",
                "created_at": 0,
                "model": "scripted",
                "object": "response",
                "output": [message],
                "parallel_tool_calls": False,
                "tool_choice": "auto",
                "tools": [],
            }
        )
        obs, r, terminated, truncated, info = await env.step(response, {}, "s")
        reward += r
        if terminated or truncated:
            break
        if obs:
            outputs.append({"role": "user", "content": obs})
    return {"reward": reward, "texts": _texts(outputs), "info": info}


def reference_run(seed: int, rollout_seeds: dict[str, int], max_steps: int) -> dict[str, dict[str, Any]]:
    """Each rollout played by Gym's blackjack and the scripted policy in this process, uninterrupted."""
    import asyncio

    async def all_of() -> dict[str, dict[str, Any]]:
        return {r: await _reference(seed, s, max_steps) for r, s in rollout_seeds.items()}

    return asyncio.run(all_of())


@dataclass
class ScenarioResult:
    summary: dict[str, Any]
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class _Runner:
    def __init__(
        self, dep: BlackjackDeployment, rollouts: int, seed: int, extra: dict[str, Any] | None
    ) -> None:
        self.dep = dep
        self.extra = extra
        self.seeds = {f"bj{seed}-{i}": seed * 1000 + i for i in range(rollouts)}
        self.registry = LiveExecutionRegistry()
        self.pool = ThreadPoolExecutor(max_workers=max(4, rollouts * 2))
        self.futures: dict[ExecutionId, Future[dict[str, Any]]] = {}
        self.current: dict[str, ExecutionId] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.coordinator = dep.coordinator(self.registry)

    def _post_run(self, execution: ExecutionId) -> dict[str, Any]:
        body = rollout_body(
            execution.rollout_id, execution.attempt, self.seeds[execution.rollout_id], self.extra
        )
        try:
            with httpx.Client(timeout=_RUN_TIMEOUT_S, trust_env=False) as client:
                response = client.post(f"{self.dep.url('agent')}/run", json=body)
        except httpx.HTTPError as exc:  # the agent died under the request
            return {"status": 0, "error": f"{type(exc).__name__}: {exc}"}
        if response.status_code != 200:
            return {"status": response.status_code, "error": response.text[:500]}
        return {"status": 200, "body": response.json()}

    def dispatch(self, execution: ExecutionId) -> None:
        self.current[execution.rollout_id] = execution
        self.futures[execution] = self.pool.submit(self._post_run, execution)

    def harvest(self) -> None:
        """Hand off the results of current attempts that finished."""
        for rollout_id, execution in list(self.current.items()):
            future = self.futures[execution]
            if rollout_id in self.results or not future.done():
                continue
            outcome = future.result()
            if outcome["status"] != 200:
                continue  # a failed attempt: recovery (or the caller) decides
            body = outcome["body"]
            self.results[rollout_id] = {"attempt": execution.attempt, **body}
            try:
                self.registry.finish(execution)
                self.registry.hand_off(execution, {"reward": body["reward"]}, reward=float(body["reward"]))
            except Exception:
                pass

    def failed(self) -> str | None:
        for execution in self.running():
            future = self.futures[execution]
            if future.done() and future.result()["status"] != 200:
                return f"{execution}: {future.result()}"
        return None

    def running(self) -> list[ExecutionId]:
        return [e for r, e in self.current.items() if r not in self.results]


def run_scenario(
    servers: GymServers,
    *,
    rollouts: int = 4,
    kill: str | None = "resources",
    deadline_s: float = 240.0,
    task_extra: dict[str, Any] | None = None,
    compare: bool = True,
    want: str = "continue",
    max_checkpoints: int = 200,
    hold_wait_s: float = 60.0,
    supervised: bool = False,
) -> ScenarioResult:
    """See the module docstring. ``want`` is the disposition the published checkpoint must give
    at least one rollout before the kill (``fresh_dispatch`` for a restart-only server);
    ``compare=False`` skips the comparison with the blackjack reference (another game).
    The model holds each rollout's second call until the crash; the first checkpoint comes once
    every rollout finished or waits there (``hold_wait_s`` at most), so it finds them
    mid-episode. ``failures`` (and ``ok``) say whether the run is correct; the summary's
    ``demonstrated`` / ``not_demonstrated`` say what it showed (the crash, a rollout continued,
    one resumed mid-episode) apart from that. ``supervised``: the deployment's supervisor (the
    SDK launcher's loop) restarts the killed server, paused, instead of the scenario."""
    dep = servers.deployment()
    if supervised:
        dep.supervise()
    failures: list[str] = []
    pauses: list[float] = []
    plan_counts: dict[str, int] = {}
    restored_turns: dict[str, int] = {}
    stale_probe: int | None = None
    timings: list[dict[str, float]] = []
    unshown: dict[str, str] = {}  # why the run could not show what it set out to
    killed = False
    replacement_accepting: bool | None = None
    try:
        dep.start_all()
        runner = _Runner(dep, rollouts, servers.seed, task_extra)
        dispatched = []
        for rollout_id in runner.seeds:
            execution = runner.registry.dispatch(rollout_id)
            runner.registry.start(execution)
            dispatched.append(execution)
        # warm-up, not counted in the pauses: the coordinator's first-use costs (store, archive
        # writer) are paid once per process, before any rollout runs
        runner.coordinator.checkpoint(deadline_s=60)
        # each rollout's second and later model calls wait at the model's gate until the crash:
        # rollouts stay mid-episode (after their first step) however fast or loaded the machine
        dep.hold_model()
        for execution in dispatched:
            runner.dispatch(execution)
        end = time.monotonic() + deadline_s
        _wait_first_steps(dep, runner, min(end, time.monotonic() + hold_wait_s))
        checkpoint_id = None
        while checkpoint_id is None and time.monotonic() < end and len(pauses) < max_checkpoints:
            runner.harvest()
            broken = runner.failed()
            if broken:
                failures.append(f"a rollout failed before any crash: {broken}")
                break
            if not runner.running():
                break
            outcome = runner.coordinator.checkpoint(deadline_s=60)
            pauses.append(outcome.pause_seconds * 1000)
            timings.append({k: round(v * 1000, 1) for k, v in outcome.timings.items()})
            plan = load_checkpoint(servers.store, outcome.checkpoint_id)
            if plan.counts().get(want, 0) >= 1:
                checkpoint_id = outcome.checkpoint_id
            else:
                time.sleep(servers.model_delay_s / 2)  # the next checkpoint a little later
        if checkpoint_id is None:
            why = "every rollout finished first" if not runner.running() else "none before the deadline"
            unshown["checkpoint"] = f"no checkpoint had a rollout to {want} ({why})"
            dep.release_model()
        elif not kill:
            dep.release_model()
        else:
            dep.kill(kill)
            if supervised:
                dep.wait_restarted(kill)  # the supervisor restarts it alone, paused
            else:
                dep.restart(kill)
            replacement_accepting = dep.remote(kill).status().accepting  # paused: False
            runner.harvest()
            # abort what the crash left open, retire the live attempts, restore; the model's
            # held calls of retired attempts are refused, restored ones go on after the resume
            restored = dep.recover(
                runner.coordinator,
                runner.running(),
                checkpoint_id=checkpoint_id,
                deadline_s=120,
                resume=False,
            )
            dep.release_model()
            killed = True
            runner.coordinator.resume(restored.restore_id, deadline_s=60)
            plan = restored.plan
            plan_counts = {k: int(v) for k, v in plan.counts().items()}
            stale_probe = _probe_stale(dep, plan)
            for rollout_id, entry in plan.rollouts.items():
                if entry.disposition == "completed":
                    continue
                nxt = entry.execution.next_attempt()
                runner.results.pop(rollout_id, None)
                if entry.disposition == "fresh_dispatch":
                    runner.registry.start(nxt)
                runner.dispatch(nxt)
        while runner.running() and time.monotonic() < end:
            runner.harvest()
            for execution in runner.running():
                future = runner.futures[execution]
                if future.done() and future.result()["status"] != 200:
                    failures.append(f"{execution} failed: {future.result()}")
                    runner.results[execution.rollout_id] = {"attempt": execution.attempt, "failed": True}
            time.sleep(0.05)
        calls = dep.model_calls()
    finally:
        dep.stop()
    reference = reference_run(servers.seed, runner.seeds, servers.max_steps) if compare else None
    summary = _summarize(runner, reference, calls, plan_counts, pauses, kill, restored_turns, failures, want)
    summary.update(_demonstrated(summary, kill, killed, want, unshown))
    summary["stale_attempt_status"] = stale_probe
    summary["restarted"] = list(dep.restarts) if supervised else ([dep.name(kill)] if killed and kill else [])
    summary["replacement_accepting"] = replacement_accepting
    summary["checkpoint_timings_ms"] = timings
    return ScenarioResult(summary=summary, failures=failures)


def _probe_stale(dep: BlackjackDeployment, plan: Any) -> int | None:
    """A late request of a restored-over attempt: the resources server must refuse it (409)."""
    for entry in plan.rollouts.values():
        if entry.disposition != "continue":
            continue
        body = {
            "responses_create_params": {"input": PROMPT},
            "response": {
                "id": "late",
                "created_at": 0,
                "model": "scripted",
                "object": "response",
                "output": [],
                "parallel_tool_calls": False,
                "tool_choice": "auto",
                "tools": [],
            },
        }
        key = entry.execution.capture_key
        r = httpx.post(
            f"{dep.url('resources')}/ng-rollout/{key}/step", json=body, timeout=30, trust_env=False
        )
        return r.status_code
    return None


def _summarize(
    runner: _Runner,
    reference: dict[str, dict[str, Any]] | None,
    calls: list[dict[str, Any]],
    plan_counts: dict[str, int],
    pauses: list[float],
    kill: str | None,
    restored_turns: dict[str, int],
    failures: list[str],
    want: str,
) -> dict[str, Any]:
    completed = matches = repeated_tools = repeated_models = 0
    seen: set[tuple[str, int, str]] = set()
    for call in calls:
        key = (call["rollout_id"], call["attempt"], call["call_id"])
        if key in seen:
            repeated_models += 1
        seen.add(key)
    for rollout_id in runner.seeds:
        ref = None if reference is None else reference[rollout_id]
        result = runner.results.get(rollout_id)
        if not result or result.get("failed"):
            continue
        completed += 1
        meta = result.get("rollout_checkpoint") or {}
        restored_turn = meta.get("restored_turn")
        attempt = result["attempt"]
        if restored_turn is not None:
            restored_turns[rollout_id] = restored_turn
            repeated_tools += sum(
                1 for s in meta.get("steps", []) if s["attempt"] == attempt and s["turn"] <= restored_turn
            )
            repeated_models += sum(
                1
                for c in calls
                if c["rollout_id"] == rollout_id
                and c["attempt"] == attempt
                and int(str(c["call_id"]).rsplit("-", 1)[-1]) <= restored_turn
            )
        got = {
            "reward": result["reward"],
            "texts": _texts(result["response"]["output"]),
            "info": result.get("info"),
        }
        if ref is None or got == ref:
            matches += 1
        else:
            failures.append(f"{rollout_id} differs from the uninterrupted run: {got} != {ref}")
    lost = len(runner.seeds) - completed
    summary = {
        "rollouts": len(runner.seeds),
        "completed": completed,
        "continued": plan_counts.get("continue", 0),
        "fresh_dispatch": plan_counts.get("fresh_dispatch", 0),
        "completed_at_checkpoint": plan_counts.get("completed", 0),
        "repeated_model_calls": repeated_models,
        "repeated_tool_calls": repeated_tools,
        "lost_results": lost,
        "matches_uninterrupted": reference is not None and matches == len(reference),
        "compared": reference is not None,
        "pause_ms_p50": round(statistics.median(pauses), 1) if pauses else None,
        "checkpoints": len(pauses),
        "killed": kill,
        "restored_turns": restored_turns,
        # the turn each continued rollout resumed at (its restored boundary): 1 or later is mid-episode
        "resumed_at_turns": dict(restored_turns),
    }
    if lost:
        failures.append(f"{lost} rollouts have no result")
    if repeated_models or repeated_tools:
        failures.append(f"repeated model calls {repeated_models}, tool calls {repeated_tools}")
    return summary


def _wait_first_steps(dep: BlackjackDeployment, runner: _Runner, until: float) -> None:
    """Until every running rollout finished or waits at the model's gate (its second call held:
    it is at boundary 1, mid-episode), a rollout failed, or ``until``."""
    while time.monotonic() < until:
        runner.harvest()
        if runner.failed():
            return
        held = {(c["rollout_id"], c["attempt"]) for c in dep.held_calls()}
        if all((e.rollout_id, e.attempt) in held for e in runner.running()):
            return
        time.sleep(0.05)


def _demonstrated(
    summary: dict[str, Any], kill: str | None, killed: bool, want: str, unshown: dict[str, str]
) -> dict[str, Any]:
    """What the run showed, apart from whether it was correct: the crash, a rollout restored as
    ``want`` (continued, or dispatched afresh), and (when continuing) one resumed mid-episode."""
    shown: dict[str, bool] = {}
    why: dict[str, str] = {}

    def note(feature: str, yes: bool, reason: str) -> None:
        shown[feature] = yes
        if not yes:
            why[feature] = reason

    no_checkpoint = unshown.get("checkpoint")
    note("crash", killed, "no crash was asked for (--kill none)" if not kill else no_checkpoint or "")
    restored = "the run restored no checkpoint" if not killed else ""
    feature = "rollouts_continued" if want == "continue" else "rollouts_dispatched_afresh"
    note(
        feature,
        bool(summary.get("continued" if want == "continue" else "fresh_dispatch")),
        restored or no_checkpoint or f"the restored checkpoint had no rollout to {want}",
    )
    if want == "continue":
        turns = summary.get("resumed_at_turns") or {}
        note(
            "resumed_mid_episode",
            any(int(t) >= 1 for t in turns.values()),
            restored or no_checkpoint or "every continued rollout resumed before its first step (turn 0)",
        )
    return {"demonstrated": shown, "not_demonstrated": why}
