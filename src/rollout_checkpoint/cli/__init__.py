"""The ``rollout-checkpoint`` command line (typer).

One module per concept: ``_archive`` (inspect, verify), ``_checkpoints`` (list, classify and the
published-checkpoint verifier), ``_gc`` (retention), ``_demo`` (the demo command and deployment),
``_serve`` (run a server), ``_common`` (shared options and output); this module only assembles them.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from . import _archive, _checkpoints, _demo, _gc, _serve

__all__ = ["app", "main"]

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
        try:
            print(f"rollout-checkpoint {version('rollout-checkpoint')}")
        except PackageNotFoundError:  # running from a source tree that was never installed
            print("rollout-checkpoint (not installed)")
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


def main() -> None:
    app()
