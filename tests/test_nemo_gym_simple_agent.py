"""Gym's simple agent, checkpointed, in real processes: the checkpointed agent
(``CheckpointedSimpleAgent``), Gym's ``example_session_state_mgmt`` counter as the tool server
(checkpointed, every increment logged) and a tool-calling Gym model server (every delivered reply
logged). One deployment: an uninterrupted episode, then rollouts held mid-episode at the model,
a checkpoint, a SIGKILL of the agent, recovery, a reply held across an open checkpoint, and every
model and tool call counted where it was served."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _gym import require_gym
from _procs import kill_mentioning

require_gym()

from rollout_checkpoint.ids import ExecutionId  # noqa: E402
from rollout_checkpoint.integrations.nemo_gym import GymDeployment  # noqa: E402
from rollout_checkpoint.reader import load_checkpoint  # noqa: E402
from rollout_checkpoint.registry import LiveExecutionRegistry  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
INCREMENTS, MAX_STEPS = 5, 3  # the model would call 5 tools; Gym's max_steps stops it after 3 steps
EXPECTED = sum(range(1, MAX_STEPS + 1))  # increments of 1, 2, 3


@pytest.fixture(autouse=True)
def no_process_left(tmp_path: Path) -> Iterator[None]:
    yield
    left = kill_mentioning(str(tmp_path))
    assert left == [], f"processes left running: {left}"


def _config(work: Path) -> dict[str, Any]:
    """The Gym config: three checkpointed servers (``checkpoint_class``), as ``ng_run`` reads it."""
    return {
        "dry_run": False,
        "observability_enabled": True,
        "model_call_capture_dir": str(work / "capture"),
        "policy_model": {
            "responses_api_models": {
                "tool_model": {
                    "entrypoint": "app.py",
                    "checkpoint_class": "_gym_simple:ToolCallingModel",
                    "increments": INCREMENTS,
                    "call_log": str(work / "model-calls.jsonl"),
                    "hold_file": str(work / "model-gate"),
                    "hold_log": str(work / "model-held.jsonl"),
                }
            }
        },
        "counter": {
            "resources_servers": {
                "example_session_state_mgmt": {
                    "entrypoint": "app.py",
                    "domain": "other",
                    "checkpoint_class": "_gym_simple:LoggedCounter",
                }
            }
        },
        "simple_agent": {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "checkpoint_class": "rollout_checkpoint.integrations.nemo_gym:CheckpointedSimpleAgent",
                    "resources_server": {"type": "resources_servers", "name": "counter"},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                    "max_steps": MAX_STEPS,
                }
            }
        },
    }


def _deployment(tmp_path: Path) -> GymDeployment:
    work = tmp_path / "servers"
    work.mkdir()
    return GymDeployment(
        _config(work),
        workdir=work,
        store=str(tmp_path / "store"),
        env={
            "PYTHONPATH": str(REPO / "tests"),
            "RC_TEST_TOOL_LOG": str(work / "tool-calls.jsonl"),
            "TMPDIR": str(work),
        },
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):  # a line still being appended
            out.append(json.loads(line))
    return out


def _held(dep: GymDeployment) -> set[str]:
    """The capture keys whose model call waits at the gate."""
    return {
        ExecutionId(rollout_id=c["rollout_id"], attempt=c["attempt"]).capture_key
        for c in _lines(dep.workdir / "model-held.jsonl")
    }


def _wait_until(condition: Callable[[], bool], what: str = "", timeout: float = 90.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or condition}")


def _run_body(execution: ExecutionId) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "Count with the tool."},
        "_ng_rollout_id": execution.rollout_id,
        "_ng_attempt_index": execution.attempt,
        "initial_count": 0,
        "expected_count": EXPECTED,
    }


class _Runs:
    def __init__(self, url: str) -> None:
        self.url = url
        self.results: dict[ExecutionId, httpx.Response | Exception] = {}
        self.threads: list[threading.Thread] = []

    def dispatch(self, execution: ExecutionId) -> None:
        def post() -> None:
            try:
                self.results[execution] = httpx.post(
                    f"{self.url}/run", json=_run_body(execution), timeout=180, trust_env=False
                )
            except Exception as exc:  # the agent died under the request
                self.results[execution] = exc

        thread = threading.Thread(target=post, daemon=True)
        thread.start()
        self.threads.append(thread)

    def result(self, execution: ExecutionId) -> dict[str, Any]:
        _wait_until(lambda: execution in self.results, f"the result of {execution}", timeout=180)
        reply = self.results[execution]
        assert isinstance(reply, httpx.Response) and reply.status_code == 200, reply
        body: dict[str, Any] = reply.json()
        return body


def _calls(output: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The episode as Gym returns it: each tool call and each tool output, in order."""
    return [
        (i["type"], i.get("name"), i.get("arguments"), i["call_id"], i.get("output"))
        for i in output
        if i["type"] in ("function_call", "function_call_output")
    ]


def test_a_simple_agent_killed_mid_episode_resumes_without_repeating_a_model_or_tool_call(
    tmp_path: Path,
) -> None:
    dep = _deployment(tmp_path)
    store = str(dep.store)
    try:
        dep.start_all()
        registry = LiveExecutionRegistry()
        coordinator = dep.coordinator(registry)
        runs = _Runs(dep.url("agent"))
        # 1. an uninterrupted episode: Gym's loop, max_steps ends it; a terminal run is not kept
        whole = registry.dispatch("whole")
        registry.start(whole)
        runs.dispatch(whole)
        reference = runs.result(whole)
        assert reference["reward"] == 1.0  # the counter holds 1 + 2 + 3
        assert reference["rollout_checkpoint"] == {"attempt": 0, "restored_turn": None}
        assert len(_calls(reference["response"]["output"])) == 2 * MAX_STEPS
        registry.finish(whole)
        registry.hand_off(whole, {"reward": 1.0}, reward=1.0)
        assert dep.remote("agent").status().live == 0  # the finished run is nowhere to export
        # Gym's /run never closes the counter's session: the framework retires the finished attempt
        assert dep.remote("resources").status().live == 1
        coordinator.retire([whole])
        assert dep.remote("resources").status().live == 0

        # 2. rollouts held at their second model call (parked at boundary 1), a checkpoint
        (dep.workdir / "model-gate").touch()
        first = [registry.dispatch(r) for r in ("r0", "r1")]
        for execution in first:
            registry.start(execution)
            runs.dispatch(execution)
        _wait_until(lambda: _held(dep) >= {"r0", "r1"}, "both rollouts held")
        outcome = coordinator.checkpoint(deadline_s=60)
        plan = load_checkpoint(store, outcome.checkpoint_id)
        dispositions = {r: e.disposition for r, e in plan.rollouts.items()}
        assert dispositions == {"whole": "completed", "r0": "continue", "r1": "continue"}, {
            r: e.reason for r, e in plan.rollouts.items()
        }

        # 3. SIGKILL the agent; a paused replacement; recover; the continued rollouts as attempt 1
        dep.kill("agent")
        dep.restart("agent")
        restored = coordinator.recover(
            first, checkpoint_id=outcome.checkpoint_id, deadline_s=120, resume=False
        )
        coordinator.resume(restored.restore_id, deadline_s=60)
        second = [e.next_attempt() for e in first]
        for execution in second:
            runs.dispatch(execution)
        # 4. attempt 1's next model call is held too; a checkpoint opens at the agent while the
        # replies arrive: they wait there, no tool call runs until the checkpoint ends
        _wait_until(lambda: _held(dep) >= {"r0-a1", "r1-a1"}, "attempt 1 held")
        agent = dep.remote("agent")
        prepared = agent.prepare("ck-open", time.time() + 60)
        assert prepared.ready, prepared  # the runs are parked on the model
        (dep.workdir / "model-gate").unlink()
        _wait_until(
            lambda: (
                {(c["key"], c["step"]) for c in _lines(dep.workdir / "model-calls.jsonl")}
                >= {("r0-a1", 2), ("r1-a1", 2)}
            ),
            "the held replies delivered",
        )
        assert [
            c for c in _lines(dep.workdir / "tool-calls.jsonl") if c["key"].endswith("-a1")
        ] == []  # held at the agent
        agent.resume("ck-open", time.time() + 30)
        results = {e.rollout_id: runs.result(e) for e in second}
        tool_calls = _lines(dep.workdir / "tool-calls.jsonl")
        model_calls = _lines(dep.workdir / "model-calls.jsonl")
    finally:
        dep.stop()
    for rollout_id, result in results.items():
        assert result["rollout_checkpoint"] == {"attempt": 1, "restored_turn": 1}
        assert result["reward"] == 1.0  # the restored counter plus steps 2 and 3 only
        assert _calls(result["response"]["output"]) == _calls(reference["response"]["output"])
        # at the tool server: each increment once, step 1 by attempt 0, steps 2 and 3 by attempt 1;
        # max_steps held across the resume (no fourth step)
        tools = sorted((c["key"], c["count"]) for c in tool_calls if c["key"].startswith(rollout_id))
        assert tools == [(rollout_id, 1), (f"{rollout_id}-a1", 2), (f"{rollout_id}-a1", 3)]
        # at the model: attempt 1 asked for steps 2 and 3 only (its boundary held step 1's reply);
        # attempt 0's held step-2 call was refused by the model once the attempt was retired
        calls = sorted((c["key"], c["step"]) for c in model_calls if c["key"].startswith(rollout_id))
        assert calls == [(rollout_id, 1), (f"{rollout_id}-a1", 2), (f"{rollout_id}-a1", 3)]
        assert {c["call_id"] for c in model_calls if c["key"] == f"{rollout_id}-a1"} == {"step-2", "step-3"}


def test_a_run_without_a_rollout_identity_is_refused_naming_the_fields(tmp_path: Path) -> None:
    dep = _deployment(tmp_path)
    try:
        dep.start("agent")
        dep.wait_ready("agent")
        run = httpx.post(
            f"{dep.url('agent')}/run",
            json={"responses_create_params": {"input": "x"}, "initial_count": 0, "expected_count": 0},
            timeout=60,
            trust_env=False,
        )
        assert run.status_code == 400, run.text
        error = run.json()["error"]
        assert error["code"] == "rollout_id_required" and "_ng_rollout_id" in error["detail"]
        direct = httpx.post(
            f"{dep.url('agent')}/v1/responses", json={"input": "x"}, timeout=60, trust_env=False
        )
        assert (
            direct.status_code == 400
            and "/ng-rollout/<rollout id>/v1/responses" in direct.json()["error"]["detail"]
        )
        assert dep.remote("agent").status().live == 0
    finally:
        dep.stop()
    assert json.dumps(error)  # the refusal is the control plane's one error shape
