"""``rollout-checkpoint serve``: run a checkpointable server (one or several worker processes).

The control token is read from ``ROLLOUT_CHECKPOINT_TOKEN`` or ``--token-file``; there is no
option that takes the token itself, so it never shows in a process list, a shell history or
``--help``.

The server refuses (one line, code ``conditional_writes_unsupported``) to start on a store whose
conditional puts are not atomic unless ``--accept-unsafe-store`` is given; its worker processes
inherit the choice through the environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from ..errors import CheckpointError
from ._common import AcceptUnsafeOpt, EndpointOpt, fail

__all__ = ["register"]

TOKEN_ENV = "ROLLOUT_CHECKPOINT_TOKEN"
"""The control token's environment variable (``rollout_checkpoint.server.TOKEN_ENV``, named here
so that ``serve --help`` does not import the server stack)."""

KINDS: dict[str, str] = {
    "model": "rollout_checkpoint.demo._servers:build_model",
    "agent": "rollout_checkpoint.demo._servers:build_agent",
    "resources": "rollout_checkpoint.demo._servers:build_resources",
}
"""Reference servers by kind (``module:function`` builds); ``tokens`` is the token store."""


class TokenError(CheckpointError):
    """No usable control token was given."""

    code = "token_missing"


class ServeArgumentError(CheckpointError):
    """An unknown server kind or a build function that cannot be loaded."""

    code = "invalid_argument"


def read_token(token_file: Path | None) -> str:
    """The control token from ``--token-file`` (first line) or the environment variable."""
    if token_file is not None:
        try:
            text = token_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise TokenError(f"cannot read the token file {token_file}: {exc.strerror}") from None
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise TokenError(f"the token file {token_file} is empty")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise TokenError(f"no control token: set {TOKEN_ENV} or pass --token-file")
    return token


def serve_command(
    kind: Annotated[
        str,
        typer.Argument(
            help="tokens (the token store), a reference kind, or a build function 'package.module:function'.",
            show_default=False,
        ),
    ],
    store: Annotated[str, typer.Option("--store", help="Store URL the server checkpoints to.")],
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port to listen on.")],
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    workers: Annotated[int, typer.Option("--workers", min=1, max=64, help="uvicorn worker processes.")] = 1,
    worker_healthcheck_timeout: Annotated[
        int,
        typer.Option(
            "--worker-healthcheck-timeout",
            min=1,
            help="Seconds a worker process may leave uvicorn's health check unanswered (busy in a long"
            " commit) before it is replaced (with --workers > 1).",
        ),
    ] = 60,
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", help=f"File holding the control token (default: ${TOKEN_ENV})."),
    ] = None,
    endpoint_url: EndpointOpt = None,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "warning",
    accept_unsafe_store: AcceptUnsafeOpt = False,
    start_paused: Annotated[
        bool,
        typer.Option(
            "--start-paused",
            help="Admit no work until a coordinator restores this server or resumes it (a replacement).",
        ),
    ] = False,
) -> None:
    """Serve a participant's control routes (and its app) on HOST:PORT until interrupted."""
    from ..server import load_build, run_server, run_token_server  # FastAPI and uvicorn: only to serve

    try:
        token = read_token(token_file)
        if endpoint_url:
            os.environ["AWS_ENDPOINT_URL"] = endpoint_url  # worker processes open the store from the URL
        if kind == "tokens":
            if start_paused:
                raise ServeArgumentError(
                    "--start-paused is for participant servers; the token store admits no work"
                )
            run_token_server(
                store,
                host=host,
                port=port,
                token=token,
                workers=workers,
                log_level=log_level,
                accept_unsafe_store=accept_unsafe_store,
                worker_healthcheck_timeout=worker_healthcheck_timeout,
            )
            return
        build = KINDS.get(kind, kind)
        if ":" not in build:
            known = ", ".join(["tokens", *sorted(KINDS)])
            raise ServeArgumentError(
                f"unknown server kind {kind!r}: use one of {known} or 'package.module:function'"
            )
        try:
            load_build(build)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ServeArgumentError(f"cannot load the build function {build!r}: {exc}") from None
        run_server(
            build,
            store=store,
            host=host,
            port=port,
            token=token,
            workers=workers,
            log_level=log_level,
            accept_unsafe_store=accept_unsafe_store,
            start_paused=start_paused,
            worker_healthcheck_timeout=worker_healthcheck_timeout,
        )
    except CheckpointError as exc:
        raise fail(exc, as_json=False) from None


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
