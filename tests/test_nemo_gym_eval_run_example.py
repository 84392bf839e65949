"""``examples/nemo_gym_eval_run.py``: the SDK launcher on the shipped configs (Gym's head server,
its relay, a local Ray cluster), Gym's collection through ``rollout-checkpoint gym collect``, the
model server SIGKILLed mid-episode (the launcher restarts it paused, the collector exits 75), the
same command again, and every row as in an uninterrupted play; and a Gym ``simple_agent``
environment preempted, against an uninterrupted collection."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _gym import require_gym
from _procs import kill_mentioning

require_gym()

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
KEYS = ("ok", "failures", "demonstrated", "not_demonstrated", "rollouts", "completed", "continued",
        "resumed_at_turns", "fresh_dispatch", "repeated_model_calls", "repeated_tool_calls", "lost_results",
        "matches_uninterrupted", "pause_ms_p50", "killed", "stale_attempt_status", "checkpoint_timings_ms",
        "exit_75_seen")  # fmt: skip


def _run_example(*args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run the example with ``args`` (and ``--json``): the process and its summary (last line)."""
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "nemo_gym_eval_run.py"), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return out, json.loads(out.stdout.strip().splitlines()[-1])


def test_a_killed_model_server_under_gyms_collection_ends_as_uninterrupted() -> None:
    out, summary = _run_example("--kill", "model", "--rollouts", "4")
    workdir = summary["workdir"]
    try:
        assert out.returncode == 0 and summary["ok"], (summary, out.stderr[-2000:])
        assert set(KEYS) <= set(summary)
        assert summary["exit_75_seen"] is True and summary["killed"] == "model"
        assert summary["completed"] == summary["rollouts"] == 4 and summary["lost_results"] == 0
        assert summary["matches_uninterrupted"] is True and summary["continued"] >= 1
        assert summary["repeated_model_calls"] == 0 and summary["repeated_tool_calls"] == 0
        assert all(t >= 1 for t in summary["resumed_at_turns"].values())  # resumed mid-episode
    finally:
        left = kill_mentioning(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
        assert left == [], f"processes left running: {left}"


def test_gyms_simple_agent_preempted_under_gyms_collection_ends_as_the_uninterrupted_collection() -> None:
    """A ``simple_agent`` env (the counter: its ``/verify`` leaves the tool session open): the
    checkpointed simple agent, Gym's ``openai_model`` over the deterministic backend and the tool
    server; an uninterrupted collection first, then the collection SIGTERMed mid-episode (exit 75)
    and the same command again, which restores only because the first collection retired its
    handed-off rows at the servers; every row as in the uninterrupted collection."""
    out, summary = _run_example("--env", "example_session_state_mgmt", "--kill", "sigterm", "--rollouts", "2")
    workdir = summary["workdir"]
    try:
        assert out.returncode == 0 and summary["ok"], (summary, out.stderr[-2000:])
        assert summary["exit_75_seen"] is True and summary["killed"] == "sigterm"
        assert summary["completed"] == summary["rollouts"] == 2 and summary["lost_results"] == 0
        assert summary["matches_uninterrupted"] is True and summary["continued"] == 2
        assert summary["repeated_model_calls"] == 0 and summary["repeated_tool_calls"] == 0
        assert sorted(summary["resumed_at_turns"].values()) == [1, 1]  # after a model call and its tools
    finally:
        left = kill_mentioning(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
        assert left == [], f"processes left running: {left}"
