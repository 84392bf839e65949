"""Gym 0.7.0's tool servers with their built-in specs, as real processes on 127.0.0.1: each test
drives the server's own routes (seed, tool calls), checkpoints, SIGKILLs it, restores into a
fresh process, and checks that the further tool calls answer exactly what an uninterrupted
session answers (the same calls on a session that never crashed, in this process, through
Gym's own code). Plus the spec-safety refusals of the launcher, in real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _gym import require_gym
from _procs import kill_mentioning

require_gym()

from rollout_checkpoint.integrations.nemo_gym import GymDeployment, GymServers  # noqa: E402
from rollout_checkpoint.protocol import CommitReply  # noqa: E402
from rollout_checkpoint.store import open_store  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TESTS_PATH = {"PYTHONPATH": str(REPO / "tests")}
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def no_process_left(tmp_path: Path) -> Iterator[None]:
    yield
    left = kill_mentioning(str(tmp_path))
    assert left == [], f"processes left running: {left}"


def _deployment(tmp_path: Path, resources_class: str, **kwargs: Any) -> GymDeployment:
    servers = GymServers(
        store=str(tmp_path / "store"), workdir=tmp_path / "servers", resources_class=resources_class, **kwargs
    )
    dep = servers.deployment()
    dep.start("resources")
    dep.wait_ready("resources")
    return dep


def _checkpoint(dep: GymDeployment, checkpoint_id: str) -> CommitReply:
    remote = dep.remote("resources")
    deadline = time.time() + 60
    assert remote.prepare(checkpoint_id, deadline).ready
    reply = remote.commit(checkpoint_id, open_store(dep.store), deadline)
    remote.resume(checkpoint_id, deadline)
    return reply


def _crash_and_restore(dep: GymDeployment, checkpoint_id: str) -> list[tuple[str, int]]:
    """SIGKILL the server, start a paused replacement, restore ``checkpoint_id`` into it."""
    dep.kill("resources")
    dep.restart("resources")
    remote = dep.remote("resources")
    restored = remote.restore(f"rs-{checkpoint_id}", checkpoint_id, open_store(dep.store), time.time() + 60)
    remote.resume(f"rs-{checkpoint_id}", time.time() + 60)
    return [(e.rollout_id, e.attempt) for e in restored.restored]


# -- workplace_assistant ----------------------------------------------------------------------

WORKPLACE = "resources_servers.workplace_assistant.app:WorkbenchResourcesServer"
TOOLKITS = ["email", "calendar", "analytics", "project_management", "customer_relationship_manager"]
LEAD = "lena.schmidt@atlas.com"
BEFORE = [
    ("email_send_email", {"recipient": LEAD, "subject": "Quarterly numbers", "body": "Draft attached"}),
    (
        "calendar_create_event",
        {
            "event_name": "Quarterly review",
            "participant_email": LEAD,
            "event_start": "2023-12-04 10:00:00",
            "duration": "60",
        },
    ),
    ("customer_relationship_manager_add_customer", {"customer_name": "Zed Quill", "assigned_to_email": LEAD}),
    (
        "analytics_create_plot",
        {
            "time_min": "2023-10-22",
            "time_max": "2023-10-25",
            "value_to_plot": "total_visits",
            "plot_type": "bar",
        },
    ),
]
LOST = [
    ("project_management_update_task", {"task_id": "00000000", "field": "board", "new_value": "Back end"})
]
AFTER = [
    ("email_search_emails", {"query": "quarterly"}),
    ("calendar_search_events", {"query": "quarterly"}),
    ("customer_relationship_manager_search_customers", {"customer_name": "Zed"}),
    ("project_management_get_task_information_by_id", {"task_id": "00000000", "field": "board"}),
    ("email_forward_email", {"email_id": "500", "recipient": "raj.patel@atlas.com"}),
    ("email_search_emails", {"query": "quarterly"}),
    ("calendar_delete_event", {"event_id": "00000300"}),
    ("calendar_search_events", {"query": "quarterly"}),
]


def _uninterrupted(calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """What Gym's workplace_assistant answers to ``calls`` on a fresh session (its own factory
    and response model, in this process)."""
    from resources_servers.workplace_assistant.app import WorkbenchResponse
    from resources_servers.workplace_assistant.utils import get_tools

    env = get_tools(TOOLKITS)
    out = []
    for name, args in calls:
        try:
            result = env["functions"][name](**args)
        except Exception as exc:
            result = f"Error executing tool '{name}': {exc}"
        out.append(json.loads(WorkbenchResponse(output=result).model_dump_json())["output"])
    return out


def _tool(client: httpx.Client, base: str, name: str, args: dict[str, Any]) -> httpx.Response:
    reply = client.post(f"{base}/{name}", json=args)
    assert reply.status_code == 200, reply.text
    return reply


def test_workplace_assistant_dataframes_survive_a_sigkill_and_later_tools_answer_as_uninterrupted(
    tmp_path: Path,
) -> None:
    dep = _deployment(tmp_path, WORKPLACE)
    url = dep.url("resources")
    try:
        with httpx.Client(timeout=60, trust_env=False) as client:
            seeded = client.post(f"{url}/ng-rollout/w1/seed_session", json={})
            assert seeded.status_code == 200 and seeded.headers["x-rc-revision"] == "0"
            for n, (name, args) in enumerate(BEFORE, start=1):
                assert _tool(client, f"{url}/ng-rollout/w1", name, args).headers["x-rc-revision"] == str(n)
            reply = _checkpoint(dep, "ck-wa")
            assert [(e.rollout_id, e.attempt) for e in reply.executions] == [("w1", 0)]
            assert reply.restarts == ()
            _assert_stored_as_parquet(dep, reply)
            for name, args in LOST:  # after the checkpoint: lost in the crash
                _tool(client, f"{url}/ng-rollout/w1", name, args)
            assert _crash_and_restore(dep, "ck-wa") == [("w1", 1)]
            base = f"{url}/ng-rollout/w1-a1"  # the restored attempt, same session cookie
            got = [_tool(client, base, name, args).json()["output"] for name, args in AFTER]
            assert got == _uninterrupted(BEFORE + AFTER)[len(BEFORE) :]
            late = client.post(f"{url}/ng-rollout/w1/email_search_emails", json={"query": "x"})
            assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"
            verify = client.post(f"{base}/verify", json=_verify_body())
            assert verify.status_code == 200 and "x-rc-revision" not in verify.headers  # the session ended
            gone = client.post(f"{base}/email_search_emails", json={"query": "x"})
            assert gone.status_code == 409 and gone.json()["error"]["code"] == "unknown_execution"
    finally:
        dep.stop()


def _assert_stored_as_parquet(dep: GymDeployment, reply: CommitReply) -> None:
    """The archive holds the session as a binary snapshot whose state is Parquet files."""
    from rollout_checkpoint.format import ArchiveReader
    from rollout_checkpoint.format.binary_payloads import MAGIC

    assert reply.manifest_key is not None
    reader = ArchiveReader.open(open_store(dep.store), reply.manifest_key.rsplit("/", 1)[0])
    [raw] = list(reader.iter_raw("resource_snapshot"))
    assert raw.payload.startswith(MAGIC)
    [record] = list(reader.iter_records("resource_snapshot"))
    head, _, frames = record.state.partition(b"\n")
    assert frames.startswith(b"PAR1") and json.loads(head)["format"] == "nemo-gym-workplace-parquet-1"


def _verify_body() -> dict[str, Any]:
    response = {
        "id": "r",
        "created_at": 0,
        "model": "scripted",
        "object": "response",
        "output": [],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }
    return {
        "responses_create_params": {"input": "send it"},
        "response": response,
        "ground_truth": [],
        "id": 1,
        "category": "email",
        "environment_name": "workbench",
    }


# -- example_multi_turn_gymnasium -------------------------------------------------------------

MULTI_TURN = "resources_servers.example_multi_turn_gymnasium.app:ExampleMultiTurnEnv"
FOLLOW_UPS = {"follow_ups": ["one", "two", "three", "four"], "expected_answer": "done"}


def _step(text: str) -> dict[str, Any]:
    message = {
        "type": "message",
        "id": "m",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
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
    return {"responses_create_params": {"input": "hi"}, "response": response, **FOLLOW_UPS}


def test_multi_turn_gymnasium_resumes_at_its_follow_up_after_a_sigkill(tmp_path: Path) -> None:
    dep = _deployment(tmp_path, MULTI_TURN)
    url = dep.url("resources")
    try:
        with httpx.Client(timeout=60, trust_env=False) as client:
            reset = client.post(
                f"{url}/ng-rollout/m1/reset", json={"responses_create_params": {"input": "hi"}}
            )
            assert reset.status_code == 200 and reset.headers["x-rc-revision"] == "0"
            first = [client.post(f"{url}/ng-rollout/m1/step", json=_step("ok")).json() for _ in range(2)]
            assert [s["observation"] for s in first] == ["one", "two"]
            assert _checkpoint(dep, "ck-mt").executions[0].rollout_id == "m1"
            client.post(f"{url}/ng-rollout/m1/step", json=_step("ok"))  # lost in the crash
            assert _crash_and_restore(dep, "ck-mt") == [("m1", 1)]
            base = f"{url}/ng-rollout/m1-a1"
            rest = [client.post(f"{base}/step", json=_step(t)) for t in ("ok", "ok", "done")]
            # uninterrupted: the third and fourth follow-ups, then the graded end
            assert [r.json()["observation"] for r in rest] == ["three", "four", None]
            assert rest[-1].json()["terminated"] is True and rest[-1].json()["reward"] == 1.0
            assert "x-rc-revision" not in rest[-1].headers  # Gym dropped the session: it ended
    finally:
        dep.stop()


# -- indirect_prompt_injection -----------------------------------------------------------------

IPI = "resources_servers.indirect_prompt_injection.app:IPIResourcesServer"


def _ipi_row() -> dict[str, Any]:
    import resources_servers.indirect_prompt_injection.app as ipi

    path = Path(ipi.__file__).parent / "data" / "example.jsonl"
    row: dict[str, Any] = json.loads(path.read_text().splitlines()[0])
    assert row["domain"] == "healthcare"
    return row


def test_indirect_prompt_injection_environment_survives_a_sigkill(tmp_path: Path) -> None:
    from resources_servers.indirect_prompt_injection.app import TOOL_HANDLERS

    row = _ipi_row()
    patient = next(iter(row["environment"]["patients"]))
    before = [
        ("update_patient_chart", {"patient_id": patient, "notes": "checkpointed note"}),
        ("send_message", {"recipient": "dr.lee@clinic.example", "subject": "s", "body": "b"}),
    ]
    after = [("get_patient_record", {"patient_id": patient}), ("get_messages", {})]
    dep = _deployment(tmp_path, IPI)
    url = dep.url("resources")
    try:
        with httpx.Client(timeout=60, trust_env=False) as client:
            seeded = client.post(
                f"{url}/ng-rollout/p1/seed_session", json={"environment": row["environment"]}
            )
            assert seeded.status_code == 200
            for name, args in before:
                assert client.post(f"{url}/ng-rollout/p1/{name}", json=args).status_code == 200
            _checkpoint(dep, "ck-ipi")
            client.post(
                f"{url}/ng-rollout/p1/update_patient_chart", json={"patient_id": patient, "notes": "lost"}
            )
            assert _crash_and_restore(dep, "ck-ipi") == [("p1", 1)]
            got = [client.post(f"{url}/ng-rollout/p1-a1/{n}", json=a).json()["output"] for n, a in after]
        env = json.loads(json.dumps(row["environment"]))  # Gym deep-copies the row's environment
        expected = []
        for name, args in before + after:
            result = TOOL_HANDLERS[name](env, **args)
            expected.append(result if isinstance(result, str) else json.dumps(result))
        assert got == expected[len(before) :] and "checkpointed note" in got[0] and "lost" not in got[0]
    finally:
        dep.stop()


# -- spec safety in real processes -------------------------------------------------------------


def _launch(
    tmp_path: Path, resources_class: str, workers: int, *extra: str
) -> subprocess.CompletedProcess[str]:
    servers = GymServers(
        store=str(tmp_path / "store"),
        workdir=tmp_path / f"w{workers}",
        resources_class=resources_class,
        workers=workers,
        extra_env=TESTS_PATH,
    )
    env = servers.deployment().environment("resources")
    args = [
        sys.executable,
        "-m",
        "rollout_checkpoint.integrations.nemo_gym.launch",
        "resources",
        resources_class,
    ]
    return subprocess.run([*args, *extra], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_launcher_refuses_an_already_checkpointed_class_with_one_line(
    tmp_path: Path, workers: int
) -> None:
    done = _launch(tmp_path, "_gym_specs:CheckpointedCounter", workers)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "already checkpointed" in lines[0] and "Traceback" not in done.stderr, (
        done.stderr
    )


@pytest.mark.parametrize(
    ("target", "names"),
    [
        ("responses_api_agents.gymnasium_agent.app:GymnasiumAgent", "CheckpointedSimpleAgent"),
        ("rollout_checkpoint.integrations.nemo_gym.model:ScriptedResponsesModel", "model server"),
    ],
)
def test_the_launcher_refuses_an_agent_or_model_class_naming_what_to_use(
    tmp_path: Path, target: str, names: str
) -> None:
    done = _launch(tmp_path, target, 2)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and names in lines[0], done.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_the_launcher_takes_a_custom_spec_and_a_misdeclared_read_fails_closed(
    tmp_path: Path, workers: int
) -> None:
    bad = _launch(
        tmp_path,
        "resources_servers.example_session_state_mgmt.app:StatefulCounterResourcesServer",
        workers,
        "--spec",
        "_gym_specs:NOT_THERE",
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "NOT_THERE" in bad.stderr
    # the same spec through the deployment (the component root's checkpoint_spec)
    servers = GymServers(
        store=str(tmp_path / "store"),
        workdir=tmp_path / "servers",
        resources_class="resources_servers.example_session_state_mgmt.app:StatefulCounterResourcesServer",
        resources_spec="_gym_specs:COUNTER_MISDECLARED",
        workers=workers,
        extra_env=TESTS_PATH,
    )
    dep = servers.deployment()
    dep.start("resources")
    try:
        dep.wait_ready("resources")
        url = dep.url("resources")
        with (
            httpx.Client(base_url=f"{url}/ng-rollout/c1", timeout=60, trust_env=False) as one,
            httpx.Client(base_url=f"{url}/ng-rollout/c2", timeout=60, trust_env=False) as two,
        ):
            assert one.post("/seed_session", json={"initial_count": 3}).status_code == 200
            assert two.post("/seed_session", json={"initial_count": 5}).status_code == 200
            # declared a read, but it changes c1's counter: c1 must restart from its input
            assert one.post("/increment_counter", json={"count": 2}).status_code == 200
            reply = _checkpoint(dep, "ck-mis")
            assert [(e.rollout_id, e.attempt) for e in reply.executions] == [("c2", 0)]
            assert [(e.rollout_id, e.attempt) for e in reply.restarts] == [("c1", 0)]
        text = dep.log_path("resources").read_text()
        assert "read route /increment_counter changed session" in text, text
    finally:
        dep.stop()
