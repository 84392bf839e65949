"""Helpers shared by the CLI command modules: consoles and typed-error exits."""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer
from rich.console import Console, RenderableType
from rich.text import Text
from typer.core import TyperCommand

from ..errors import CheckpointError, StoreError
from ..store import ObjectStore, open_store, refuse_single_slash_scheme

__all__ = [
    "AcceptUnsafeOpt",
    "Command",
    "EndpointOpt",
    "JsonOpt",
    "UrlArg",
    "console",
    "fail",
    "open_cli_store",
    "open_demo_store",
    "print_table",
    "styled",
]

UrlArg = Annotated[
    str,
    typer.Argument(help="Store URL: a path, file://, memory:// or s3://bucket/prefix.", metavar="URL"),
]
EndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url", envvar="AWS_ENDPOINT_URL", help="S3 endpoint (default: AWS_ENDPOINT_URL)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
AcceptUnsafeOpt = Annotated[
    bool,
    typer.Option(
        "--accept-unsafe-store",
        help="Write even where the store cannot prove atomic create-only / compare-and-swap puts "
        "(an S3 endpoint that ignores If-None-Match / If-Match, a generic fsspec backend): "
        "a racing writer could then overwrite what this command writes.",
    ),
]


class Command(TyperCommand):
    """A command whose usage line names required arguments plainly (``URL``, not ``{URL}``)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [
            piece[1:-1] if piece.startswith("{") and piece.endswith("}") else piece
            for piece in super().collect_usage_pieces(ctx)
        ]


def console(stderr: bool = False) -> Console:
    """A rich console that prints every string literally (no markup, emoji codes or
    highlighting: paths, bucket names and error details may contain ``[...]``); styling is
    applied only through :func:`styled`. Print tables with :func:`print_table`: on a terminal
    (or with ``COLUMNS`` set) they fit it, elsewhere they are as wide as their content; plain
    lines are never folded, so object keys stay whole."""
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False, soft_wrap=True)


_UNBOUNDED = 1_000_000


def print_table(console: Console, table: RenderableType) -> None:
    """Print ``table``: on a terminal (or at the width ``COLUMNS`` sets) it fits that width
    (long cells fold or are cut with an ellipsis); into a pipe or a file every cell is printed
    whole, the table as wide as its content, so ids and keys can be copied and ``grep``ped."""
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        console.print(table)
        return
    natural = console.measure(table, options=console.options.update_width(_UNBOUNDED)).maximum
    width = console.width
    console.width = max(width, natural)
    try:
        console.print(table)
    finally:
        console.width = width


def styled(*parts: str | tuple[str, str]) -> Text:
    """Literal text with styled pieces: ``styled(("error", "red"), f" {message}")``."""
    return Text.assemble(*parts)


def fail(exc: CheckpointError, as_json: bool) -> typer.Exit:
    """Print a typed error (JSON ``{"ok": false, "error": {...}}`` with ``--json``); exit code 1."""
    if as_json:
        print(json.dumps({"ok": False, "error": exc.to_dict()}))
    else:
        console(stderr=True).print(styled(("error", "red"), f" ({exc.code}): {exc.message}"))
    return typer.Exit(1)


def open_cli_store(
    url: str, endpoint_url: str | None = None, *, accept_unsafe_store: bool = False
) -> ObjectStore:
    """Open ``url`` for a CLI command: ``endpoint_url`` (or ``AWS_ENDPOINT_URL``) applies to S3 only."""
    refuse_single_slash_scheme(url)
    protocol, sep, rest = url.partition("://")
    if not sep or protocol.lower() in ("file", "local"):
        # a read-only command must not create the directory a mistyped path names
        path = os.path.expanduser(rest if sep else url)
        if os.path.exists(path) and not os.path.isdir(path):
            raise StoreError(f"{url}: is a file, not a store (a store is a directory)", url=url)
        if not os.path.isdir(path):
            raise StoreError(f"{url}: no such directory", url=url)
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
    options: dict[str, object] = {"accept_unsafe_store": accept_unsafe_store} if accept_unsafe_store else {}
    if url.lower().startswith(("s3://", "s3a://")) and endpoint:
        options["endpoint_url"] = endpoint
    return open_store(url, **options)


def open_demo_store(
    url: str, endpoint_url: str | None = None, *, accept_unsafe_store: bool = False
) -> ObjectStore:
    """Open (creating a directory if needed) the store a demo writes to."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
    options: dict[str, object] = {"accept_unsafe_store": accept_unsafe_store} if accept_unsafe_store else {}
    if url.lower().startswith(("s3://", "s3a://")) and endpoint:
        options["endpoint_url"] = endpoint
    return open_store(url, **options)
