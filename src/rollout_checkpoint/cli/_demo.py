"""``rollout-checkpoint demo``: the demo workload (:mod:`rollout_checkpoint.demo`) as a command."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, cast

import typer

from ..errors import CheckpointError
from ._common import AcceptUnsafeOpt, Command, EndpointOpt, JsonOpt, open_demo_store, styled
from ._common import console as _console
from ._common import fail as _fail
from ._progress import on_terminal, steps

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
    in_process: Annotated[
        bool, typer.Option("--in-process", help="Run every participant in this process (no servers).")
    ] = False,
    kill: Annotated[
        list[str] | None,
        typer.Option(
            "--kill",
            metavar="SERVER",
            help="SIGKILL this process mid-run and restart only it (model, agent, resources, tokens, "
            "coordinator; default model, 'none' for no crash); repeat for a second crash while the "
            "coordinator restores (every server then restarts).",
        ),
    ] = None,
    checkpoint_every: Annotated[
        float, typer.Option("--checkpoint-every", min=0.05, help="Seconds between checkpoints.")
    ] = 0.5,
    workers: Annotated[
        int,
        typer.Option("--workers", min=1, max=8, help="Worker processes of the agent and each environment."),
    ] = 2,
    endpoint_url: EndpointOpt = None,
    accept_unsafe_store: AcceptUnsafeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Multi-turn agents on real server processes: checkpoints, a SIGKILL, restore, finish, compare."""
    from ..demo import run_demo  # the demo and its servers load only when it runs
    from ..demo._cluster import KILLABLE, run_cluster_demo

    console = _console(stderr=as_json)
    if skip_restore is not None and skip_restore not in ("agent", "model", "resources"):
        console.print(
            styled(
                ("error", "red"), f": --skip-restore takes agent, model or resources, not {skip_restore!r}"
            )
        )
        raise typer.Exit(2)
    kills = ["model"] if kill is None and not in_process and skip_restore is None else list(kill or [])
    kills = [k for k in kills if k != "none"]
    for name in kills:
        if name not in KILLABLE:
            console.print(styled(("error", "red"), f": --kill takes {', '.join(KILLABLE)}, not {name!r}"))
            raise typer.Exit(2)
    if in_process and kill:
        console.print(styled(("error", "red"), ": --kill needs server processes; drop --in-process"))
        raise typer.Exit(2)
    extra: dict[str, Any] = {}
    with steps("demo", console, enabled=on_terminal(as_json)) as say:
        try:
            store = open_demo_store(directory, endpoint_url, accept_unsafe_store=accept_unsafe_store)
            if in_process:
                report = run_demo(
                    store,
                    rollouts=rollouts,
                    turns=turns,
                    seed=seed,
                    skip_restore=cast(SkipKind | None, skip_restore),
                    progress=say,
                    accept_unsafe_store=accept_unsafe_store,
                )
            else:
                report, extra = run_cluster_demo(
                    store,
                    rollouts=rollouts,
                    turns=turns,
                    seed=seed,
                    kill=kills,
                    checkpoint_every=checkpoint_every,
                    workers=workers,
                    skip_restore=skip_restore,
                    accept_unsafe_store=accept_unsafe_store,
                    progress=say,
                )
        except CheckpointError as exc:
            raise _fail(exc, as_json) from None
    summary = report.to_json()
    summary["url"] = store.url
    summary["mode"] = "in_process" if in_process else "processes"
    summary.update(
        {
            k: v
            for k, v in extra.items()
            if k
            in ("killed", "restarts", "restarted", "full_restarts", "restore_refused", "checkpoint_failures")
        }
    )
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
            "pause_ms_p50",
            "pause_ms_max",
        ):
            console.print(f"  {key:<26} {summary[key]}")
        shown = [feature for feature, yes in report.demonstrated.items() if yes]
        console.print(f"  {'demonstrated':<26} {', '.join(shown) or 'nothing'}")
        for feature, reason in report.not_demonstrated.items():
            console.print(styled(("not demonstrated", "yellow"), f": {feature}: {reason}"))
        for failure in report.failures():
            console.print(styled(("not a correct run", "red"), f": {failure}"))
    if not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``demo`` to ``app``."""
    app.command("demo", cls=Command)(demo_command)
