"""Helpers shared by the CLI command modules: consoles and typed-error exits."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from ..errors import CheckpointError, StoreError
from ..store import ObjectStore, open_store

__all__ = ["EndpointOpt", "JsonOpt", "UrlArg", "console", "fail", "open_cli_store"]

UrlArg = Annotated[str, typer.Argument(help="Store URL: a path, file://, memory:// or s3://bucket/prefix.")]
EndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url", envvar="AWS_ENDPOINT_URL", help="S3 endpoint (default: AWS_ENDPOINT_URL)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]


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


def open_cli_store(url: str, endpoint_url: str | None = None) -> ObjectStore:
    """Open ``url`` for a CLI command: ``endpoint_url`` (or ``AWS_ENDPOINT_URL``) applies to S3 only."""
    protocol, sep, rest = url.partition("://")
    if not sep or protocol.lower() in ("file", "local"):
        # a read-only command must not create the directory a mistyped path names
        path = os.path.expanduser(rest if sep else url)
        if not os.path.isdir(path):
            raise StoreError(f"{url}: no such directory", url=url)
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
    if url.lower().startswith(("s3://", "s3a://")) and endpoint:
        return open_store(url, endpoint_url=endpoint)
    return open_store(url)
