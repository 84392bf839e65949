"""``rollout-checkpoint gym collect``: NeMo Gym's ``ng_collect_rollouts``, checkpointed and
resumable (``rollout_checkpoint.integrations.nemo_gym.collect``). Gym is imported only when the
command runs, so ``--help`` stays fast and works without Gym."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import CheckpointError, InvalidArgumentError
from ._common import fail

__all__ = ["register"]

gym_app = typer.Typer(
    name="gym",
    help="Checkpoint NeMo Gym runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@gym_app.command(
    "collect",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def collect_command(
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="ng_collect_rollouts' Hydra overrides, e.g. +input_jsonl_fpath=in.jsonl "
            "+output_jsonl_fpath=out.jsonl +agent_name=AGENT +rollout_checkpoint.store=URL",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Collect rollouts like ng_collect_rollouts, checkpointing every checkpoint_every_s, on SIGUSR1
    (and going on) and on SIGTERM (then exiting 75); the same command again resumes."""
    if not overrides:
        raise fail(
            InvalidArgumentError("no overrides: give ng_collect_rollouts' +key=value overrides"), False
        )
    try:
        from ..integrations.nemo_gym import GymNotInstalledError
        from ..integrations.nemo_gym.collect import main
    except ImportError as exc:
        raise fail(InvalidArgumentError(f"NeMo Gym cannot be imported: {exc}"), False) from None
    try:
        code = main(list(overrides))
    except GymNotInstalledError as exc:
        raise fail(InvalidArgumentError(str(exc)), False) from None
    except CheckpointError as exc:
        raise fail(exc, False) from None
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.add_typer(gym_app, name="gym")
