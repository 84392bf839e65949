"""The ``rollout-checkpoint`` command line (typer).

One module per concept: ``_archive`` (inspect, verify), ``_checkpoints`` (list, classify and the
published-checkpoint verifier), ``_gc`` (retention), ``_demo`` (the demo command and deployment),
``_serve`` (run a server), ``_common`` (shared options and output), ``_progress`` (progress bars
on a terminal); ``_app`` assembles them.

Start-up is kept short: ``rollout-checkpoint --version`` imports neither typer nor the commands,
and the commands import what they run (the demo, the servers and FastAPI) only when they run.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["app", "main"]


def main() -> None:
    """The console script."""
    if sys.argv[1:] == ["--version"]:
        from ._version import version_line

        print(version_line())
        return
    from ._app import app

    app()


def __getattr__(name: str) -> Any:
    if name == "app":  # built on first use: typer and the command modules load here
        from ._app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
