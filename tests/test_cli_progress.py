"""Progress bars: drawn for long store work on a terminal, never with --json or when piped."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

from rollout_checkpoint.demo import DemoDeployment

_CLI = [sys.executable, "-c", "from rollout_checkpoint.cli import main; main()"]


def _store(tmp_path: Path) -> str:
    url = str(tmp_path / "store")
    deployment = DemoDeployment(url)
    try:
        deployment.populate(20)
        deployment.checkpoint("ck-progress")
    finally:
        deployment.close()
    return url


def _on_a_terminal(*args: str) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; everything it drew."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen(
        [*_CLI, *args], stdout=follower, stderr=follower, stdin=subprocess.DEVNULL, env=env
    )
    os.close(follower)
    drawn = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    return proc.wait(30), drawn.decode("utf-8", "replace")


def test_verify_draws_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    url = _store(tmp_path)
    code, drawn = _on_a_terminal("verify", url)
    assert code == 0, drawn
    assert "verifying" in drawn and "requests" in drawn, drawn
    assert "checked intact" in drawn


def test_no_progress_when_piped_or_with_json(tmp_path: Path) -> None:
    url = _store(tmp_path)
    for args in (["verify", url], ["gc", url, "--dry-run"], ["classify", url, "--verify"]):
        piped = subprocess.run([*_CLI, *args], capture_output=True, text=True, timeout=120)
        assert piped.returncode == 0, piped.stderr
        assert "requests" not in piped.stdout + piped.stderr
    code, drawn = _on_a_terminal("verify", url, "--json")
    assert code == 0
    assert "requests" not in drawn
    assert json.loads(drawn.strip().splitlines()[-1])["ok"] is True


def test_the_demo_shows_its_steps_above_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    code, drawn = _on_a_terminal("demo", str(tmp_path / "demo"), "--in-process")
    assert code == 0, drawn
    assert "demo: 1." in drawn  # the bar names the latest step
    assert "6 rollouts running" in drawn and "matches_uninterrupted" in drawn
