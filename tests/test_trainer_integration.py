"""The runnable trainer-integration example of docs/trainer-integration.md, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trainer_integration.py"


def test_the_trainer_integration_example_runs(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["trainer"] == {
        "trainer_step": 3,
        "trainer_checkpoint": "trainer/step-000003",
        "data_epoch": 0,
    }
    assert summary["decisions"] == {
        "keep_result": ["prompt-1"],
        "continue": ["prompt-2", "prompt-3", "prompt-4", "prompt-5"],
        "rerun_from_input": ["prompt-0"],
    }
    assert summary["continued"] == summary["decisions"]["continue"]
    assert summary["rerun"] == ["prompt-0"]
    assert summary["next_sequence"] == 2


def test_the_docs_page_shows_the_example() -> None:
    page = (EXAMPLE.parents[1] / "docs" / "trainer-integration.md").read_text()
    assert "examples/trainer_integration.py" in page
    for name in ("load_checkpoint", "RecoveryPlan", "RolloutPlan", "restore", "resume", "framework_state"):
        assert name in page, name
