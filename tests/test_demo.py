"""``rollout-checkpoint demo``: the real workload end to end, and its negative control."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollout_checkpoint.cli import app
from rollout_checkpoint.coordinator import MissingParticipantError
from rollout_checkpoint.demo import run_demo
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.reader import load_checkpoint, verify_checkpoint
from rollout_checkpoint.store import LocalStore

runner = CliRunner()

KEYS = {
    "rollouts",
    "completed",
    "continued",
    "fresh_dispatch",
    "checkpoints_published",
    "generation_cuts_continued",
    "repeated_model_calls",
    "repeated_tool_calls",
    "lost_results",
    "matches_uninterrupted",
    "pause_ms",
    "demonstrated",
    "not_demonstrated",
}
ALL_SHOWN = {"crash": True, "rollouts_continued": True, "generation_cuts_continued": True}


def test_demo_runs_checkpoints_crashes_restores_and_matches_the_uninterrupted_run(tmp_path: Path) -> None:
    target = tmp_path / "demo"
    result = runner.invoke(
        app, ["demo", str(target), "--in-process", "--rollouts", "9", "--turns", "5", "--seed", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(summary) >= KEYS
    assert summary["ok"] and summary["rollouts"] == summary["completed"] == 9
    assert summary["lost_results"] == 0
    assert summary["repeated_model_calls"] == summary["repeated_tool_calls"] == 0
    assert summary["generation_cuts_continued"] > 0
    assert summary["demonstrated"] == ALL_SHOWN and summary["not_demonstrated"] == {}
    assert summary["matches_uninterrupted"] is True
    # the crash came after the first checkpoint that held a cut of a rollout to continue
    assert summary["checkpoints_published"] >= 2 and summary["pause_ms"] > 0
    # a third of the rollouts play the restart-only environment: fresh dispatches, by design
    assert summary["fresh_dispatch"] == 3 and summary["continued"] + summary["completed_before_crash"] >= 1
    # the checkpoints it published are real ones: listed, classified, verified
    store = LocalStore(target)
    published = {p.checkpoint_id for p in list_published(store)}
    assert published == set(summary["checkpoint_ids"])
    for cid in published:
        verify_checkpoint(store, cid)
    crash = load_checkpoint(store, summary["checkpoint_ids"][-1])
    assert crash.counts()["continue"] == summary["continued"]
    assert {p.reason for p in crash.fresh} == {"restart-only execution"}


def test_a_correct_run_that_demonstrated_nothing_exits_0_and_says_why(tmp_path: Path) -> None:
    """One turn per rollout: every rollout has finished (or restarts: a restart-only environment)
    by the crash checkpoint, so nothing continues; the run is still correct."""
    result = runner.invoke(
        app, ["demo", str(tmp_path / "d"), "--in-process", "--turns", "1", "--seed", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["ok"] is True and summary["failures"] == []
    assert summary["completed"] == 6 and summary["matches_uninterrupted"] is True
    assert summary["demonstrated"] == {
        "crash": True,
        "rollouts_continued": False,
        "generation_cuts_continued": False,
    }
    reasons = summary["not_demonstrated"]
    assert set(reasons) == {"rollouts_continued", "generation_cuts_continued"}
    assert "no rollout to continue" in reasons["rollouts_continued"]
    assert "finished before a checkpoint held a generation cut" in reasons["generation_cuts_continued"]
    text = runner.invoke(app, ["demo", str(tmp_path / "t"), "--in-process", "--turns", "1"])
    assert text.exit_code == 0 and "not demonstrated: generation_cuts_continued: every" in text.stdout


def test_the_crash_waits_bounded_for_a_checkpoint_worth_crashing_after(tmp_path: Path) -> None:
    """With no time to wait the crash comes at the first candidate checkpoint anyway: a correct
    run, and a cut continued or the reason none was."""
    report = run_demo(LocalStore(tmp_path / "s"), rollouts=3, turns=3, crash_wait=0.0)
    assert report.ok, report.failures()
    assert report.checkpoints_published == 2  # no candidate was passed over
    if not report.demonstrated["generation_cuts_continued"]:
        assert report.not_demonstrated["generation_cuts_continued"].startswith(
            ("no checkpoint held a generation cut", "every rollout that could continue")
        )


def test_demo_default_command_prints_progress_and_summary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    result = runner.invoke(app, ["demo", str(tmp_path / "d"), "--in-process"])
    assert result.exit_code == 0, result.output
    for line in (
        "1. ",
        "3. ",
        "crashed",
        "5. finished every rollout",
        "matches_uninterrupted      True",
        "demonstrated               crash, rollouts_continued, generation_cuts_continued",
    ):
        assert line in result.stdout
    # the simulated crash fails every resume on purpose: no warning about it reaches the user
    assert "also failed" not in result.output + caplog.text


@pytest.mark.parametrize("kind", ["resources", "agent", "model"])
def test_skip_restore_is_refused_naming_the_missing_participant(tmp_path: Path, kind: str) -> None:
    result = runner.invoke(
        app, ["demo", str(tmp_path / kind), "--in-process", "--skip-restore", kind, "--json"]
    )
    assert result.exit_code == 1, result.output
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert error["code"] == "missing_participant"
    assert all(name.startswith(f"{kind}/") for name in error["details"]["missing"])
    assert f"{kind}/" in error["message"] and "nothing was restored or resumed" in error["message"]


def test_skip_restore_in_process_resumes_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    with pytest.raises(MissingParticipantError) as info:
        run_demo(
            LocalStore(tmp_path / "s"), rollouts=3, turns=3, skip_restore="resources", progress=lines.append
        )
    assert "resources/blackjack" in info.value.message
    assert not any(line.startswith("4.") for line in lines)  # never got to run a restored rollout


def test_skip_restore_takes_a_known_kind(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", str(tmp_path / "x"), "--skip-restore", "bogus"])
    assert result.exit_code == 2 and "agent, model or resources" in result.output


def test_demo_runs_again_in_the_same_store(tmp_path: Path) -> None:
    """The README's first command, run twice: each run's rollouts are its own (no token-key clash)."""
    target = tmp_path / "again"
    counted = 0
    for seed in ("1", "2"):
        args = ["--in-process", "--rollouts", "3", "--turns", "3", "--seed", seed, "--json"]
        result = runner.invoke(app, ["demo", str(target), *args])
        assert result.exit_code == 0, result.output
        counted += json.loads(result.stdout.strip().splitlines()[-1])["checkpoints_published"]
    store = LocalStore(target)
    published = list_published(store)
    assert len(published) == counted >= 4
    for item in published:
        verify_checkpoint(store, item.checkpoint_id)
