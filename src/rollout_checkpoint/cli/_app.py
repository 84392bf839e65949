"""The typer application: the command modules assembled (built on first use by
:mod:`rollout_checkpoint.cli`, never for ``--version``)."""

from __future__ import annotations

from typing import Annotated

import typer

from . import _archive, _checkpoints, _demo, _gc, _gym, _serve
from ._version import version_line

__all__ = ["app"]

app = typer.Typer(
    name="rollout-checkpoint",
    help="Inspect, verify and classify crash-safe rollout checkpoints on any fsspec store.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: no "<bool>" type column, user text never parsed as markup
)


def _version(value: bool) -> None:
    if value:
        print(version_line())
        raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Inspect, verify and classify crash-safe rollout checkpoints on any fsspec store."""


_archive.register(app)
_checkpoints.register(app)
_gc.register(app)
_demo.register(app)
_serve.register(app)
_gym.register(app)
