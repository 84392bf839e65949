"""Gym's simple agent, checkpointed, in real processes: the checkpointed agent
(``CheckpointedSimpleAgent``), Gym's ``example_session_state_mgmt`` counter as the tool server
(checkpointed, every increment logged) and Gym's ``openai_model`` checkpointed as the policy model
(every delivered reply logged) in front of the SDK's deterministic backend. One deployment: an
uninterrupted episode, then rollouts held mid-episode at the model, a checkpoint, a SIGKILL of the
agent, recovery, a reply held across an open checkpoint, and every model and tool call counted
where it was served."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
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
from rollout_checkpoint.integrations.nemo_gym import GymDeployment, start_backend  # noqa: E402
from rollout_checkpoint.reader import load_checkpoint  # noqa: E402
from rollout_checkpoint.registry import LiveExecutionRegistry  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
TOOL_TURNS, MAX_STEPS = 5, 3  # the model would call 5 tools; Gym's max_steps stops it after 3 steps
INCREMENT = {
    "type": "function",
    "name": "increment_counter",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"count": {"type": "integer"}},
        "required": ["count"],
        "additionalProperties": False,
    },
}


@pytest.fixture(autouse=True)
def no_process_left(tmp_path: Path) -> Iterator[None]:
    yield
    left = kill_mentioning(str(tmp_path))
    assert left == [], f"processes left running: {left}"


def _config(work: Path, backend_url: str) -> dict[str, Any]:
    """The Gym config: three checkpointed servers (``checkpoint_class``), as ``ng_run`` reads it."""
    return {
        "dry_run": False,
        "observability_enabled": True,
        "model_call_capture_dir": str(work / "capture"),
        "policy_model": {
            "responses_api_models": {
                "openai_model": {
                    "entrypoint": "app.py",
                    "checkpoint_class": "rollout_checkpoint.integrations.nemo_gym:CheckpointedOpenAIModel",
                    "openai_base_url": backend_url,
                    "openai_api_key": "none",
                    "openai_model": "deterministic",
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


def _deployment(tmp_path: Path, backend_url: str = "") -> GymDeployment:
    work = tmp_path / "servers"
    work.mkdir()
    return GymDeployment(
        _config(work, backend_url),
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


def _session_activation(dep: GymDeployment) -> None:
    """Gym's agent-session path: a tool-server session, an agent session seeded with its
    ``episode_id`` and a direct tool access, then ``/v1/responses`` under the session cookie."""
    resources = f"{dep.url('resources')}/ng-rollout/sess"
    seeded = httpx.post(f"{resources}/seed_session", json={"initial_count": 0}, timeout=60, trust_env=False)
    access = {"kind": "direct_http", "name": "counter", "required": True, "base_url": resources}
    seed = {
        "agent_session_id": "s1",
        "episode_id": {"rollout_id": "sess", "attempt": 0},
        "task_id": {"taskset": "counter:t", "task_id": "1"},
        "tool_accesses": [{**access, "cookies": dict(seeded.cookies)}],
    }
    with httpx.Client(base_url=dep.url("agent"), timeout=180, trust_env=False) as client:
        assert client.post("/v1/agent_sessions", json=seed).status_code == 200
        with contextlib.suppress(httpx.HTTPError):  # the agent is killed under it
            client.post("/v1/responses", json={"input": "Count with the tool.", "tools": [INCREMENT]})


def _model_calls(dep: GymDeployment) -> list[tuple[str, int, str]]:
    """The replies the model delivered: (capture key, step, call id)."""
    return [
        (
            ExecutionId(rollout_id=c["rollout_id"], attempt=c["attempt"]).capture_key,
            int(str(c["call_id"]).rsplit("-", 1)[-1]),
            c["call_id"],
        )
        for c in _lines(dep.workdir / "model-calls.jsonl")
    ]


def _run_body(execution: ExecutionId, expected: int) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "Count with the tool.", "tools": [INCREMENT]},
        "_ng_rollout_id": execution.rollout_id,
        "_ng_attempt_index": execution.attempt,
        "initial_count": 0,
        "expected_count": expected,
    }


class _Runs:
    def __init__(self, url: str) -> None:
        self.url = url
        self.results: dict[ExecutionId, httpx.Response | Exception] = {}
        self.threads: list[threading.Thread] = []

    def dispatch(self, execution: ExecutionId, expected: int) -> None:
        def post() -> None:
            try:
                self.results[execution] = httpx.post(
                    f"{self.url}/run", json=_run_body(execution, expected), timeout=180, trust_env=False
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
    with start_backend(7, tool_turns=TOOL_TURNS) as backend:
        dep = _deployment(tmp_path, backend.base_url)
        store = str(dep.store)
        try:
            dep.start_all()
            registry = LiveExecutionRegistry()
            coordinator = dep.coordinator(registry)
            runs = _Runs(dep.url("agent"))
            # 1. an uninterrupted episode: Gym's loop, max_steps ends it; a terminal run is not kept
            whole = registry.dispatch("whole")
            registry.start(whole)
            runs.dispatch(whole, expected=0)
            reference = runs.result(whole)
            assert reference["rollout_checkpoint"] == {
                "attempt": 0,
                "restored_turn": None,
                "steps": [{"step": n, "attempt": 0} for n in range(1, MAX_STEPS + 1)],
            }
            assert len(_calls(reference["response"]["output"])) == 2 * MAX_STEPS
            counts = [c["count"] for c in _lines(dep.workdir / "tool-calls.jsonl") if c["key"] == "whole"]
            assert len(counts) == MAX_STEPS
            registry.finish(whole)
            registry.hand_off(whole, {"reward": reference["reward"]}, reward=reference["reward"])
            assert dep.remote("agent").status().live == 0  # the finished run is nowhere to export
            # Gym's /run never closes the counter's session: the framework retires the finished attempt
            assert dep.remote("resources").status().live == 1
            coordinator.retire([whole])
            assert dep.remote("resources").status().live == 0
            # the same loop behind Gym's direct route, /ng-rollout/<id>/v1/responses, its tools under
            # the session cookie /seed_session gave
            seeded = httpx.post(
                f"{dep.url('resources')}/ng-rollout/direct/seed_session",
                json={"initial_count": 0},
                timeout=60,
                trust_env=False,
            )
            assert seeded.status_code == 200, seeded.text
            direct = httpx.post(
                f"{dep.url('agent')}/ng-rollout/direct/v1/responses",
                json={"input": "Count with the tool.", "tools": [INCREMENT]},
                cookies=dict(seeded.cookies),
                timeout=120,
                trust_env=False,
            )
            assert direct.status_code == 200, direct.text
            assert _calls(direct.json()["output"]) == _calls(reference["response"]["output"])
            assert dep.remote("agent").status().live == 0
            coordinator.retire([ExecutionId(rollout_id="direct", attempt=0)])
            assert dep.remote("resources").status().live == 0

            # 2. rollouts held at their second model call (parked at boundary 1), a checkpoint
            (dep.workdir / "model-gate").touch()
            first = [registry.dispatch(r) for r in ("r0", "r1")]
            for execution in first:
                registry.start(execution)
                runs.dispatch(execution, expected=sum(counts))  # same conversation, so same calls
            # and an agent-session activation (Gym's in-memory session table: restart-only)
            session = registry.dispatch("sess")
            registry.start(session)
            threading.Thread(target=_session_activation, args=(dep,), daemon=True).start()
            _wait_until(lambda: _held(dep) >= {"r0", "r1", "sess"}, "the rollouts held")
            outcome = coordinator.checkpoint(deadline_s=60)
            plan = load_checkpoint(store, outcome.checkpoint_id)
            dispositions = {r: e.disposition for r, e in plan.rollouts.items()}
            assert dispositions == {
                "whole": "completed",
                "r0": "continue",
                "r1": "continue",
                "sess": "fresh_dispatch",
            }, {r: e.reason for r, e in plan.rollouts.items()}
            first.append(session)  # retired by the recovery below

            # 3. SIGKILL the agent; a paused replacement; recover; the continued rollouts as attempt 1
            dep.kill("agent")
            dep.restart("agent")
            restored = coordinator.recover(
                first, checkpoint_id=outcome.checkpoint_id, deadline_s=120, resume=False
            )
            coordinator.resume(restored.restore_id, deadline_s=60)
            second = [e.next_attempt() for e in first if e.rollout_id != "sess"]
            for execution in second:
                runs.dispatch(execution, expected=sum(counts))
            # 4. attempt 1's next model call is held too; a checkpoint opens at the agent while the
            # replies arrive: they wait there, no tool call runs until the checkpoint ends
            _wait_until(lambda: _held(dep) >= {"r0-a1", "r1-a1"}, "attempt 1 held")
            agent = dep.remote("agent")
            prepared = agent.prepare("ck-open", time.time() + 60)
            assert prepared.ready, prepared  # the runs are parked on the model
            (dep.workdir / "model-gate").unlink()
            _wait_until(
                lambda: {(k, n) for k, n, _ in _model_calls(dep)} >= {("r0-a1", 2), ("r1-a1", 2)},
                "the held replies delivered",
            )
            tool_calls = _lines(dep.workdir / "tool-calls.jsonl")
            assert [c for c in tool_calls if c["key"].endswith("-a1")] == []  # held at the agent
            agent.resume("ck-open", time.time() + 30)
            results = {e.rollout_id: runs.result(e) for e in second}
            tool_calls = _lines(dep.workdir / "tool-calls.jsonl")
            model_calls = _model_calls(dep)
        finally:
            dep.stop()
    for rollout_id, result in results.items():
        assert result["rollout_checkpoint"] == {
            "attempt": 1,
            "restored_turn": 1,
            "steps": [{"step": 1, "attempt": 0}, {"step": 2, "attempt": 1}, {"step": 3, "attempt": 1}],
        }
        assert result["reward"] == 1.0  # the restored counter plus steps 2 and 3's increments only
        assert _calls(result["response"]["output"]) == _calls(reference["response"]["output"])
        # at the tool server: each increment once, step 1 by attempt 0, steps 2 and 3 by attempt 1,
        # the uninterrupted run's values; max_steps held across the resume (no fourth step)
        tools = [(c["key"], c["count"]) for c in tool_calls if c["key"].startswith(rollout_id)]
        assert tools == [
            (rollout_id, counts[0]),
            (f"{rollout_id}-a1", counts[1]),
            (f"{rollout_id}-a1", counts[2]),
        ]
        # at the model: attempt 1 asked for steps 2 and 3 only (its boundary held step 1's reply);
        # attempt 0's held step-2 call was refused by the model once the attempt was retired
        calls = sorted((k, n) for k, n, _ in model_calls if k.startswith(rollout_id))
        assert calls == [(rollout_id, 1), (f"{rollout_id}-a1", 2), (f"{rollout_id}-a1", 3)]


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


def test_the_simple_agent_example_survives_a_killed_workplace_assistant_and_reports_one_json_object(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    done = subprocess.run(
        [
            *(sys.executable, str(REPO / "examples" / "nemo_gym_simple_agent.py"), "--rollouts", "2"),
            *("--env", "workplace_assistant", "--kill", "resources", "--store", str(store), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"] is True and summary["failures"] == []
    assert summary["completed"] == summary["rollouts"] == 2 and summary["lost_results"] == 0
    assert summary["killed"] == "resources" and summary["stale_attempt_status"] == 409
    assert summary["repeated_model_calls"] == 0 and summary["repeated_tool_calls"] == 0
    assert summary["matches_uninterrupted"] is True
    assert summary["demonstrated"] == {"crash": True, "rollouts_continued": True, "resumed_mid_episode": True}
    turns = summary["resumed_at_turns"]
    assert len(turns) == summary["continued"] >= 1 and all(t >= 1 for t in turns.values()), turns
    blackjack_keys = {
        "ok",
        "failures",
        "demonstrated",
        "not_demonstrated",
        "rollouts",
        "completed",
        "continued",
    }
    assert blackjack_keys <= set(summary)
