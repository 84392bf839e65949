"""The demo with every server a real process on 127.0.0.1: a SIGKILL of each kind of process,
after which only the killed process restarts and the survivors take the restore; a second crash
while the coordinator restores (every server then restarts); the negative control; the store
checks that refuse a run before any process starts. Each run checks the previous issue's
correctness rules (every rollout completed, nothing lost, no completed turn redone, final states
and rewards equal to an uninterrupted run of the same seed), and that no process is left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _procs import kill_mentioning, processes_mentioning
from rollout_checkpoint.demo._cluster import counted, run_cluster_demo
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.store import LocalStore

CLI = shutil.which("rollout-checkpoint", path=str(Path(sys.executable).parent)) or "rollout-checkpoint"
ENVS = ("blackjack", "inventory", "live-stream")
ALL = ("tokens", "model", "agent", *ENVS, "coordinator")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(autouse=True)
def no_process_left(tmp_path: Path) -> Iterator[None]:
    """Every process a test started names ``tmp_path`` (store URL, work directory or TMPDIR):
    none may outlive the run; the finalizer SIGKILLs any that does, then fails the test."""
    yield
    left = kill_mentioning(str(tmp_path))
    assert left == [], f"processes left running: {left}"


def _run(tmp_path: Path, **options: Any) -> tuple[Any, dict[str, Any], LocalStore]:
    store = LocalStore(tmp_path / "store")
    report, extra = run_cluster_demo(
        store,
        rollouts=6,
        turns=4,
        seed=3,
        checkpoint_every=0.5,
        timeout=300,
        workdir=tmp_path / "work",
        **options,
    )
    assert processes_mentioning(str(tmp_path)) == []  # the demo stopped all of them itself
    return report, extra, store


def _assert_correct(report: Any) -> None:
    failures = report.failures()
    assert failures == [], failures
    assert report.ok and report.demonstrated["crash"] is True, report.not_demonstrated


def _assert_shown(report: Any, *features: str) -> None:
    """The run showed these features (the reason it did not, if not)."""
    assert all(report.demonstrated[f] for f in features), report.not_demonstrated


def _assert_only_restarted(extra: dict[str, Any], victim: str) -> None:
    assert extra["restarted"] == [[victim]] and extra["full_restarts"] == 0
    start, end = extra["pids_start"], extra["pids_end"]
    assert start[victim] != end[victim]
    assert {n: start[n] for n in ALL if n != victim} == {n: end[n] for n in ALL if n != victim}


def test_rollouts_continue_from_their_last_boundary_after_the_agent_server_is_killed(tmp_path: Path) -> None:
    report, extra, _ = _run(tmp_path, kill="agent")
    _assert_correct(report)
    assert extra["killed"] == ["agent"] and report.continued > 0
    _assert_shown(report, "rollouts_continued")
    _assert_only_restarted(extra, "agent")


def test_a_generation_cut_continues_from_its_prefix_across_a_killed_model_server(tmp_path: Path) -> None:
    report, extra, _ = _run(tmp_path, kill="model")
    _assert_correct(report)
    assert report.generation_cuts_continued > 0
    _assert_shown(report, "rollouts_continued", "generation_cuts_continued")
    _assert_only_restarted(extra, "model")


def test_a_killed_resources_server_is_replaced_and_its_sessions_restored(tmp_path: Path) -> None:
    report, extra, _ = _run(tmp_path, kill="resources")
    _assert_correct(report)
    assert report.continued > 0
    _assert_only_restarted(extra, "blackjack")


def test_a_killed_token_server_is_replaced_alone(tmp_path: Path) -> None:
    # no time to wait for a checkpoint worth crashing after: the kill comes at the first one
    # published, and the run is correct whatever it demonstrates
    report, extra, _ = _run(tmp_path, kill="tokens", crash_wait=0.0)
    _assert_correct(report)
    _assert_only_restarted(extra, "tokens")
    assert set(report.demonstrated) == {"crash", "rollouts_continued", "generation_cuts_continued"}
    assert set(report.not_demonstrated) == {f for f, shown in report.demonstrated.items() if not shown}


def test_a_second_crash_while_the_coordinator_restores_restarts_every_server(tmp_path: Path) -> None:
    report, extra, _ = _run(tmp_path, kill=["resources", "coordinator"])
    _assert_correct(report)
    assert extra["restarts"] == 2 and extra["full_restarts"] == 1
    assert extra["restarted"] == [["blackjack"], ["coordinator"], list(ALL)]
    assert extra["full_restart_reasons"] == ["a crash interrupted a restore before its next checkpoint"]


def test_restoring_without_the_resources_servers_is_refused_and_resumes_nothing(tmp_path: Path) -> None:
    report, extra, store = _run(tmp_path, skip_restore="resources")
    assert extra["restore_refused"] == "missing_participant"
    assert report.completed == 0 and report.restore_id is None
    assert not report.ok and report.to_json()["ok"] is False  # incorrect: the CLI exits 1
    assert report.not_demonstrated["rollouts_continued"] == "the run restored no checkpoint"
    assert any("resources/blackjack" in e for e in report.errors)
    assert list_published(store)  # the checkpoint exists; it is the restore that is refused


def _cli(tmp_path: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_CHECKPOINT_TOKEN"}
    env["TMPDIR"] = str(tmp_path)  # the demo's work directory: every child process names it
    return subprocess.run([CLI, "demo", *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_demo_command_kills_the_coordinator_on_a_store_that_needs_accept_unsafe_store(tmp_path: Path) -> None:
    # fsspec's "dir" filesystem over a local directory: shared by every process, but its
    # conditional puts are emulated, so publishing there needs the risk accepted
    url = f"dir::file://{tmp_path / 'store'}"
    (tmp_path / "store").mkdir()
    out = _cli(tmp_path, url, "--kill", "coordinator", "--accept-unsafe-store", "--json")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0, (summary, out.stderr[-2000:])
    assert summary["ok"] and summary["mode"] == "processes" and summary["killed"] == ["coordinator"]
    assert summary["demonstrated"]["crash"] is True
    assert summary["restarted"] == [["coordinator"]] and summary["full_restarts"] == 0
    assert summary["completed"] == summary["rollouts"] == 6 and summary["lost_results"] == 0
    assert summary["continued"] + summary["fresh_dispatch"] + summary["completed_before_crash"] <= 6
    assert summary["repeated_model_calls"] == summary["repeated_tool_calls"] == 0
    assert summary["matches_uninterrupted"] and summary["checkpoints_published"] >= 2
    assert summary["pause_ms_p50"] > 0 and summary["pause_ms_max"] >= summary["pause_ms_p50"]
    assert list_published(LocalStore(tmp_path / "store"))  # the dir:: store is that directory


def test_the_demo_says_one_checkpoint_in_the_singular() -> None:
    assert [counted(n, "checkpoint") for n in (0, 1, 2)] == ["0 checkpoints", "1 checkpoint", "2 checkpoints"]


def test_a_second_run_counts_its_own_checkpoints_and_leaves_no_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18, D5 and item 11: two runs into one store (the second takes it over); each counts
    only the checkpoints it published; no rc-workers-* folder of a server (the killed one never
    cleaned up after itself) is left in the temporary directory."""
    scratch = Path(tempfile.mkdtemp(prefix="rc-t-"))  # short: Unix socket paths live below it
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    store = LocalStore(tmp_path / "store")
    reports = []
    for i in range(2):
        report, _ = run_cluster_demo(
            store,
            rollouts=6,
            turns=4,
            seed=3,
            checkpoint_every=0.5,
            timeout=300,
            kill="agent",
            workdir=tmp_path / f"work{i}",
        )
        assert report.checkpoints_published > 0
        reports.append(report)
    total = len(list_published(store))
    assert reports[0].checkpoints_published + reports[1].checkpoints_published == total
    # nothing staged, nothing deleted during a run: no folder of the store is left empty (the
    # worker groups' staging left hundreds under _workers/ before their workers wrote parts)
    root = tmp_path / "store"
    assert not (root / "_workers").exists()
    assert [d for d in root.rglob("*") if d.is_dir() and not any(d.iterdir())] == []
    left = sorted(p.name for p in scratch.iterdir())
    shutil.rmtree(scratch, ignore_errors=True)
    assert left == []
