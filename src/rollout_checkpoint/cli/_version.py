"""The version line, without importing typer, click or :mod:`importlib.metadata`."""

from __future__ import annotations

from .. import __version__

__all__ = ["version_line"]


def version_line() -> str:
    return f"rollout-checkpoint {__version__}"
