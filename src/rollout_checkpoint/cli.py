"""The ``rollout-checkpoint`` command line (typer).

Commands live next to the layer they drive: ``_cli_archive`` (inspect, verify) and
``_cli_protocol`` (list, classify, demo); this module only assembles them.
"""

from __future__ import annotations

import typer

from . import _cli_archive, _cli_protocol

__all__ = ["app", "main"]

app = typer.Typer(
    name="rollout-checkpoint",
    help="Inspect, verify and classify crash-safe rollout checkpoints on any fsspec store.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_cli_archive.register(app)
_cli_protocol.register(app)


def main() -> None:
    app()
