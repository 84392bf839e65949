"""The CLI starts at once: ``--version``, ``--help`` of every command and ``list`` on a local
store import only what they need (checked in fresh interpreters, never timed here: the times
are in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_checkpoint import __version__

HEAVY = ("fastapi", "uvicorn", "starlette", "httpx", "rollout_checkpoint.demo", "rollout_checkpoint.server")
"""What only ``serve`` and ``demo`` run."""

_RUN = """
import json, sys
sys.argv = ["rollout-checkpoint", *json.loads(sys.argv[1])]
from rollout_checkpoint.cli import main
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
watched = ("fastapi", "uvicorn", "starlette", "httpx", "typer", "click", "opentelemetry", "pydantic")
ours = ("rollout_checkpoint.demo", "rollout_checkpoint.server")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in watched or m.startswith(ours))
print(json.dumps({"code": code, "loaded": loaded}), file=sys.stderr)
"""


def _modules(*args: str) -> tuple[int, set[str], str]:
    out = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(list(args))], capture_output=True, text=True, timeout=120
    )
    report = json.loads(out.stderr.strip().splitlines()[-1])
    return int(report["code"] or 0), set(report["loaded"]), out.stdout


def test_version_imports_neither_typer_nor_any_command() -> None:
    code, loaded, stdout = _modules("--version")
    assert code == 0 and stdout.strip() == f"rollout-checkpoint {__version__}"
    assert not loaded, (
        loaded
    )  # no typer, click, pydantic or OpenTelemetry: a few ms over `import rollout_checkpoint`


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        *(
            [command, "--help"]
            for command in ("list", "classify", "verify", "inspect", "gc", "demo", "serve")
        ),
        ["gym", "collect", "--help"],
    ],
)
def test_help_of_every_command_loads_no_server_or_demo(args: list[str]) -> None:
    code, loaded, stdout = _modules(*args)
    assert code == 0 and "Usage" in stdout
    assert not [m for m in loaded if m.startswith(HEAVY)], loaded


def test_list_of_a_local_store_loads_no_server_or_demo(tmp_path: Path) -> None:
    code, loaded, stdout = _modules("list", str(tmp_path), "--json")
    assert code == 0, stdout
    assert json.loads(stdout)["ok"] is True
    assert not [m for m in loaded if m.startswith(HEAVY)], loaded
