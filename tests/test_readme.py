"""The README's quickstart code runs as written, so it stays true."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _quickstart() -> str:
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README has no python block under '## Quickstart'"
    return match.group(1)


def test_quickstart_runs() -> None:
    code = _quickstart()
    assert len(code.strip().splitlines()) <= 30
    namespace: dict[str, object] = {"__name__": "readme_quickstart"}
    exec(compile(code, str(README), "exec"), namespace)
    plan = namespace["plan"]
    assert plan.rollouts["rollout-1"].disposition == "continue"  # type: ignore[attr-defined]


def test_readme_names_the_two_commands_and_ci_runs_the_test_command() -> None:
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    test_command = re.search(r"(python3 -m venv \.venv && .*pytest -q[^\n`]*)", text)
    assert test_command is not None
    assert test_command.group(1) in ci
    assert "rollout-checkpoint demo" in text
