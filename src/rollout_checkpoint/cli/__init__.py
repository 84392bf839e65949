"""The ``rollout-checkpoint`` command line (typer).

One module per concept: ``_archive`` (inspect, verify), ``_checkpoints`` (list, classify and the
published-checkpoint verifier), ``_gc`` (retention), ``_demo`` (the demo command and deployment),
``_common`` (shared options and output); this module only assembles them.
"""

from __future__ import annotations

import typer

from . import _archive, _checkpoints, _demo, _gc, _serve

__all__ = ["app", "main"]

app = typer.Typer(
    name="rollout-checkpoint",
    help="Inspect, verify and classify crash-safe rollout checkpoints on any fsspec store.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_archive.register(app)
_checkpoints.register(app)
_gc.register(app)
_demo.register(app)
_serve.register(app)


def main() -> None:
    app()
