"""``rollout-checkpoint demo``: the demo workload (:mod:`rollout_checkpoint.demo`) as a command."""

from __future__ import annotations

import json
from typing import Annotated, Literal, cast

import typer

from ..demo import run_demo
from ..errors import CheckpointError
from ._common import AcceptUnsafeOpt, Command, EndpointOpt, JsonOpt, open_demo_store, styled
from ._common import console as _console
from ._common import fail as _fail

__all__ = ["DEFAULT_DEMO_DIR", "demo_command", "register"]

DEFAULT_DEMO_DIR = "./demo-checkpoints"

SkipKind = Literal["agent", "model", "resources"]


def demo_command(
    directory: Annotated[
        str, typer.Argument(help="Store URL or directory for the demo checkpoints.", metavar="DIRECTORY")
    ] = DEFAULT_DEMO_DIR,
    rollouts: Annotated[int, typer.Option("--rollouts", min=1, max=512, help="Rollouts to run.")] = 6,
    turns: Annotated[int, typer.Option("--turns", min=1, max=64, help="Turns per rollout at most.")] = 4,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the whole run.")] = 7,
    skip_restore: Annotated[
        str | None,
        typer.Option(
            "--skip-restore",
            metavar="KIND",
            help="Negative control: restore without this participant kind (agent, model, resources).",
        ),
    ] = None,
    endpoint_url: EndpointOpt = None,
    accept_unsafe_store: AcceptUnsafeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Multi-turn agents, a checkpoint mid-generation, a crash, restore, finish, compare."""
    console = _console(stderr=as_json)
    if skip_restore is not None and skip_restore not in ("agent", "model", "resources"):
        console.print(
            styled(
                ("error", "red"), f": --skip-restore takes agent, model or resources, not {skip_restore!r}"
            )
        )
        raise typer.Exit(2)
    try:
        store = open_demo_store(directory, endpoint_url, accept_unsafe_store=accept_unsafe_store)
        report = run_demo(
            store,
            rollouts=rollouts,
            turns=turns,
            seed=seed,
            skip_restore=cast(SkipKind | None, skip_restore),
            progress=console.print,
            accept_unsafe_store=accept_unsafe_store,
        )
    except CheckpointError as exc:
        raise _fail(exc, as_json) from None
    summary = report.to_json()
    summary["url"] = store.url
    if as_json:
        print(json.dumps(summary))
    else:
        for key in (
            "rollouts",
            "completed",
            "continued",
            "fresh_dispatch",
            "checkpoints_published",
            "generation_cuts_continued",
            "repeated_model_calls",
            "repeated_tool_calls",
            "lost_results",
            "matches_uninterrupted",
            "pause_ms",
        ):
            console.print(f"  {key:<26} {summary[key]}")
        for failure in report.failures():
            console.print(styled(("not a correct run", "red"), f": {failure}"))
    if not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``demo`` to ``app``."""
    app.command("demo", cls=Command)(demo_command)
