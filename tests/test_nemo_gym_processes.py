"""Real NeMo Gym servers as processes on 127.0.0.1, started through Gym's own start-up: the
scripted policy model, Gym's blackjack with the participant attached, Gym's gymnasium agent in
its checkpointed form. Each crash test SIGKILLs one server, restarts only it, restores the
checkpoint taken while rollouts waited on the model, and checks every rollout against an
uninterrupted run (``run_scenario``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from _gym import require_gym
from _procs import kill_mentioning

require_gym()

from rollout_checkpoint.integrations.nemo_gym import GymServers, run_scenario  # noqa: E402
from rollout_checkpoint.store import open_store  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROMPT = "You are playing blackjack."  # the scenario's task prompt
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def no_process_left(tmp_path: Path) -> Iterator[None]:
    yield
    left = kill_mentioning(str(tmp_path))  # every server process has TMPDIR under tmp_path
    assert left == [], f"processes left running: {left}"


def _servers(tmp_path: Path, **kwargs: object) -> GymServers:
    return GymServers(store=str(tmp_path / "store"), workdir=tmp_path / "servers", **kwargs)  # type: ignore[arg-type]


def _assert_correct(summary: dict[str, object], failures: list[str], rollouts: int) -> None:
    assert failures == [], (failures, summary)
    assert summary["completed"] == summary["rollouts"] == rollouts and summary["lost_results"] == 0
    assert summary["continued"] >= 1 and summary["matches_uninterrupted"] is True
    assert summary["repeated_model_calls"] == 0 and summary["repeated_tool_calls"] == 0
    assert summary["stale_attempt_status"] == 409  # a late request of the restored-over attempt
    # the model held each game's second call until the crash: every continued rollout resumes
    # mid-episode, after its first step
    assert summary["demonstrated"] == {"crash": True, "rollouts_continued": True, "resumed_mid_episode": True}
    assert summary["not_demonstrated"] == {}
    turns = summary["resumed_at_turns"]
    assert len(turns) == summary["continued"] and all(t >= 1 for t in turns.values()), turns


@pytest.mark.parametrize("kill", ["agent", "resources"])
def test_a_killed_gym_server_is_restored_and_every_rollout_ends_as_if_uninterrupted(
    tmp_path: Path, kill: str
) -> None:
    result = run_scenario(_servers(tmp_path), rollouts=4, kill=kill)
    _assert_correct(result.summary, result.failures, 4)
    assert result.summary["killed"] == kill


@pytest.mark.parametrize("kill", ["resources", "agent", "model"])
def test_under_the_launcher_only_the_killed_server_restarts_paused_and_recover_loses_nothing(
    tmp_path: Path, kill: str
) -> None:
    # the deployment's supervisor (GymLauncher's loop) notices the SIGKILL and restarts that
    # server alone, paused; Coordinator.recover() then restores survivors and replacement
    result = run_scenario(_servers(tmp_path), rollouts=3, kill=kill, supervised=True)
    _assert_correct(result.summary, result.failures, 3)
    name = {"resources": "blackjack", "agent": "blackjack_agent", "model": "policy_model"}[kill]
    assert result.summary["restarted"] == [name]  # only the dead server, once
    assert result.summary["replacement_accepting"] is False  # it admitted nothing before the restore


def test_the_example_survives_a_killed_model_server_and_reports_one_json_object(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "nemo_gym_blackjack.py"), "--store", str(tmp_path / "store"),
         "--rollouts", "4", "--seed", "3", "--kill", "model", "--json"],
        capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and summary["ok"], (summary, out.stderr[-2000:])
    _assert_correct(summary, summary["failures"], 4)
    for key in ("rollouts", "completed", "continued", "fresh_dispatch", "repeated_model_calls",
                "repeated_tool_calls", "lost_results", "matches_uninterrupted", "pause_ms_p50"):  # fmt: skip
        assert key in summary
    assert "killed the model server" in out.stdout


def test_the_example_without_a_crash_is_correct_and_says_what_it_did_not_show(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "nemo_gym_blackjack.py"), "--store", str(tmp_path / "store"),
         "--rollouts", "2", "--kill", "none", "--json"],
        capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and summary["ok"] and summary["failures"] == [], (summary, out.stderr[-2000:])
    assert summary["completed"] == 2 and summary["matches_uninterrupted"] is True
    assert summary["killed"] is None and summary["demonstrated"]["crash"] is False
    assert summary["not_demonstrated"]["crash"] == "no crash was asked for (--kill none)"
    assert "killed None" not in out.stdout and "no crash (--kill none)" in out.stdout


def test_a_resources_server_on_two_workers_is_checkpointed_through_the_worker_group(tmp_path: Path) -> None:
    result = run_scenario(_servers(tmp_path, workers=2), rollouts=4, kill="resources")
    _assert_correct(result.summary, result.failures, 4)


@pytest.mark.s3
def test_the_gym_deployment_checkpoints_to_moto_s3(
    tmp_path: Path, s3_bucket: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # the coordinator here and every server
    # a model with no delay at all: the games would end before any checkpoint on a loaded machine
    # (the test failed that way at load 27); the model's gate holds them mid-episode instead
    servers = GymServers(store=f"s3://{s3_bucket}/gym", workdir=tmp_path / "servers", model_delay_s=0.0)
    result = run_scenario(servers, rollouts=3, kill="agent")
    _assert_correct(result.summary, result.failures, 3)


def test_a_gym_server_without_a_spec_is_restart_only_its_rollouts_are_dispatched_afresh(
    tmp_path: Path,
) -> None:
    servers = _servers(
        tmp_path, resources_class="resources_servers.example_multi_turn_gymnasium.app:ExampleMultiTurnEnv"
    )
    result = run_scenario(
        servers,
        rollouts=3,
        kill="resources",
        compare=False,
        want="fresh_dispatch",
        task_extra={"follow_ups": ["one", "two", "three", "four"], "expected_answer": "stand"},
    )
    summary = result.summary
    assert result.failures == [], (result.failures, summary)
    assert summary["continued"] == 0 and summary["fresh_dispatch"] >= 1  # never continue
    assert summary["demonstrated"] == {"crash": True, "rollouts_dispatched_afresh": True}
    assert summary["completed"] == 3 and summary["lost_results"] == 0


def _wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "the condition was not reached in time"
        time.sleep(0.02)


def _step_body(**extra: object) -> dict[str, object]:
    message = {
        "type": "message",
        "id": "m",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "<action>hit</action>", "annotations": []}],
    }
    response = {
        "id": "r",
        "created_at": 0,
        "model": "scripted",
        "object": "response",
        "output": [message],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }
    return {"responses_create_params": {"input": PROMPT}, "response": response, **extra}


def test_a_gym_step_in_flight_keeps_prepare_not_ready_and_new_steps_park_until_resume(tmp_path: Path) -> None:
    servers = _servers(
        tmp_path,
        resources_class="_gym_slow:SlowStepBlackjackEnv",
        extra_env={"PYTHONPATH": str(REPO / "tests")},
    )
    dep = servers.deployment()
    try:
        dep.start("resources")
        dep.wait_ready("resources")
        remote = dep.remote("resources")
        base = f"{dep.url('resources')}/ng-rollout/r1"
        with httpx.Client(timeout=60, trust_env=False) as client:
            reset = client.post(
                f"{base}/reset", json={"responses_create_params": {"input": PROMPT}, "seed": 12}
            )
            assert reset.status_code == 200 and reset.headers["x-rc-revision"] == "0"
            replies: list[httpx.Response] = []
            mark = tmp_path / "slow-step"
            body = _step_body(mark=str(mark))  # the step goes on once {mark}.go exists
            slow = threading.Thread(target=lambda: replies.append(client.post(f"{base}/step", json=body)))
            slow.start()
            _wait_until(lambda: Path(f"{mark}.started").exists() or not slow.is_alive())
            early = remote.prepare("ck-slow", time.time() + 0.5)
            assert not early.ready and early.blocker_count == 1, early  # the step in flight
            Path(f"{mark}.go").touch()
            ready = remote.prepare("ck-slow", time.time() + 60)
            assert ready.ready and Path(f"{mark}.ended").exists()  # prepare waited for the step to end
            slow.join(30)  # its reply may still be on the wire when the step's work ended
            assert replies and replies[0].status_code == 200
            parked: list[httpx.Response] = []
            if replies[0].json()["terminated"] is False:
                late = threading.Thread(
                    target=lambda: parked.append(client.post(f"{base}/step", json=_step_body()))
                )
                late.start()
                time.sleep(0.5)
                assert late.is_alive()  # admission closed: the step waits, it is not refused
                remote.resume("ck-slow", time.time() + 10)
                late.join(30)
                assert parked and parked[0].status_code == 200
            else:
                remote.resume("ck-slow", time.time() + 10)
    finally:
        dep.stop()


def test_a_gym_deployment_without_rollout_identity_fails_closed_naming_the_setting(tmp_path: Path) -> None:
    dep = _servers(tmp_path, observability=False).deployment()
    try:
        dep.start_all()
        direct = httpx.post(
            f"{dep.url('resources')}/reset",
            json={"responses_create_params": {"input": PROMPT}},
            trust_env=False,
        )
        assert direct.status_code == 400
        error = direct.json()["error"]
        assert error["code"] == "rollout_id_required" and "observability_enabled: true" in error["detail"]
        body = {"responses_create_params": {"input": PROMPT}, "_ng_rollout_id": "r1", "seed": 1}
        run = httpx.post(f"{dep.url('agent')}/run", json=body, timeout=60, trust_env=False)
        assert run.status_code == 400 and run.json()["error"]["code"] == "rollout_id_required"
        status = dep.remote("resources").status()
        assert status.live == 0  # nothing was served into state that could not be restored
    finally:
        dep.stop()


def test_gyms_counter_server_keyed_by_typed_episode_ids_restores_its_counter_after_a_sigkill(
    tmp_path: Path,
) -> None:
    servers = _servers(
        tmp_path,
        resources_class="resources_servers.example_session_state_mgmt.app:StatefulCounterResourcesServer",
        observability=False,  # no /ng-rollout/ prefix: the identity comes from the bodies
    )
    dep = servers.deployment()
    first, second = {"rollout_id": "c1", "attempt": 0}, {"rollout_id": "c1", "attempt": 1}
    try:
        dep.start("resources")
        dep.wait_ready("resources")
        url = dep.url("resources")
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
            seeded = client.post("/seed_session", json={"initial_count": 3, "episode_id": first})
            assert seeded.status_code == 200 and seeded.headers["x-rc-revision"] == "0"
            bumped = client.post("/increment_counter", json={"count": 2, "episode_id": first})
            assert bumped.headers["x-rc-revision"] == "1"
            remote = dep.remote("resources")
            deadline = time.time() + 30
            assert remote.prepare("ck-counter", deadline).ready
            reply = remote.commit("ck-counter", open_store(servers.store), deadline)
            assert [(e.rollout_id, e.attempt) for e in reply.executions] == [("c1", 0)]
            remote.resume("ck-counter", deadline)
            client.post("/increment_counter", json={"count": 10, "episode_id": first})  # lost in the crash
            dep.kill("resources")
            dep.restart("resources")  # paused until restored
            remote = dep.remote("resources")
            restored = remote.restore("rs-counter", "ck-counter", open_store(servers.store), time.time() + 30)
            assert [(e.rollout_id, e.attempt) for e in restored.restored] == [("c1", 1)]
            remote.resume("rs-counter", time.time() + 30)
            # the cookie issued before the crash still names the session; Gym's dict holds the state
            value = client.post("/get_counter_value", json={"episode_id": second})
            assert value.status_code == 200 and value.json() == {"count": 5}
            late = client.post("/increment_counter", json={"count": 1, "episode_id": first})
            assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"
            anonymous = client.post("/increment_counter", json={"count": 1})
            assert anonymous.status_code == 400 and anonymous.json()["error"]["code"] == "rollout_id_required"
            assert client.post("/get_counter_value", json={"episode_id": second}).json() == {"count": 5}
    finally:
        dep.stop()
