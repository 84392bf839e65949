"""The demo with every server a real process on 127.0.0.1: SIGKILLs of each kind of process,
a second crash before the replacement got going, and the negative control. Each run checks
the previous issue's correctness rules (every rollout completed, nothing lost, no completed turn
redone, final states and rewards equal to an uninterrupted run of the same seed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_checkpoint.demo._cluster import run_cluster_demo
from rollout_checkpoint.published import list_published
from rollout_checkpoint.store import LocalStore

CLI = shutil.which("rollout-checkpoint", path=str(Path(sys.executable).parent)) or "rollout-checkpoint"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _run(tmp_path: Path, **options: object) -> tuple[object, dict[str, object], LocalStore]:
    store = LocalStore(tmp_path / "store")
    report, extra = run_cluster_demo(
        store, rollouts=6, turns=4, seed=3, checkpoint_every=0.5, timeout=300, **options
    )
    return report, extra, store


def _assert_correct(report: object) -> None:
    failures = report.failures()  # type: ignore[attr-defined]
    assert failures == [], failures


def test_rollouts_continue_from_their_last_boundary_after_the_agent_server_is_killed(tmp_path: Path) -> None:
    report, extra, _ = _run(tmp_path, kill="agent")
    _assert_correct(report)
    assert extra["killed"] == ["agent"] and report.continued > 0  # type: ignore[attr-defined]


def test_a_generation_cut_continues_from_its_prefix_across_a_killed_model_server(tmp_path: Path) -> None:
    report, _, _ = _run(tmp_path, kill="model")
    _assert_correct(report)
    assert report.generation_cuts_continued > 0  # type: ignore[attr-defined]


def test_a_second_crash_before_the_replacement_starts(tmp_path: Path) -> None:
    report, extra, _ = _run(tmp_path, kill=["resources", "coordinator"])
    _assert_correct(report)
    assert extra["restarts"] == 2


def test_restoring_without_the_resources_servers_is_refused_and_resumes_nothing(tmp_path: Path) -> None:
    report, extra, store = _run(tmp_path, skip_restore="resources")
    assert extra["restore_refused"] == "missing_participant"
    assert report.completed == 0 and report.restore_id is None  # type: ignore[attr-defined]
    assert any("resources/blackjack" in e for e in report.errors)  # type: ignore[attr-defined]
    assert list_published(store)  # the checkpoint exists; it is the restore that is refused


def test_demo_command_kills_the_token_server_and_prints_the_summary(tmp_path: Path) -> None:
    out = subprocess.run(
        [CLI, "demo", str(tmp_path / "store"), "--kill", "tokens", "--json"],
        capture_output=True,
        text=True,
        timeout=400,
        env={k: v for k, v in os.environ.items() if k != "ROLLOUT_CHECKPOINT_TOKEN"},
    )
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0, summary
    assert summary["ok"] and summary["mode"] == "processes" and summary["killed"] == ["tokens"]
    assert summary["completed"] == summary["rollouts"] and summary["lost_results"] == 0
    assert summary["pause_ms_p50"] > 0 and summary["pause_ms_max"] >= summary["pause_ms_p50"]
