"""Helpers shared by the CLI command modules: consoles and typed-error exits."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console

from .errors import CheckpointError

__all__ = ["console", "fail"]


def console(stderr: bool = False) -> Console:
    """A rich console; when output is not a terminal, don't fold long object keys at 80 columns."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, width=None if stream.isatty() else 200)


def fail(exc: CheckpointError, as_json: bool) -> typer.Exit:
    """Print a typed error (JSON ``{"ok": false, "error": {...}}`` with ``--json``); exit code 1."""
    if as_json:
        print(json.dumps({"ok": False, "error": exc.to_dict()}))
    else:
        console(stderr=True).print(f"[red]error[/] ({exc.code}): {exc.message}")
    return typer.Exit(1)
