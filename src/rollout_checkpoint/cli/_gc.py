"""CLI command for retention: ``gc``."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..errors import CheckpointError
from ..format.layout import PUBLISHED_PREFIX
from ..retention import DEFAULT_MIN_AGE_S, collect_garbage
from ._archive import refuse_folder_of_stores
from ._common import AcceptUnsafeOpt, Command, EndpointOpt, JsonOpt, UrlArg, open_cli_store
from ._common import console as _console
from ._common import fail as _fail
from ._progress import on_terminal, watched

__all__ = ["gc_command", "register"]


# -- gc --------------------------------------------------------------------------------------------


def gc_command(
    url: UrlArg,
    keep: Annotated[int, typer.Option("--keep", min=1, help="Published checkpoints to keep.")] = 2,
    min_age: Annotated[
        float,
        typer.Option(
            "--min-age",
            min=0.0,
            help="Seconds an unpublished leftover must have been seen by gc before it is deleted "
            "(keep it far above any checkpoint cycle's deadline).",
        ),
    ] = DEFAULT_MIN_AGE_S,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be deleted; change nothing.")
    ] = False,
    endpoint_url: EndpointOpt = None,
    accept_unsafe_store: AcceptUnsafeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Keep the newest K published checkpoints; unpublish, then delete, the rest and old leftovers.

    Never deletes the checkpoint the latest pointer names or any object a kept checkpoint
    references. Unpublished leftovers are deleted only once gc has seen them for --min-age seconds.
    """
    try:
        opened = open_cli_store(url, endpoint_url, accept_unsafe_store=accept_unsafe_store)
        with watched(opened, "collecting garbage", enabled=on_terminal(as_json)) as store:
            if not store.list(PUBLISHED_PREFIX):
                refuse_folder_of_stores(store)  # a folder of stores: say so, never a silent no-op
            report = collect_garbage(store, keep=keep, min_age_s=min_age, dry_run=dry_run)
    except CheckpointError as exc:
        raise _fail(exc, as_json) from None
    if as_json:
        print(json.dumps({"ok": True, "url": url, **report.to_json()}))
        return
    console = _console()
    verb = "would delete" if dry_run else "deleted"
    console.print(f"kept: {', '.join(report.kept) or '-'}")
    console.print(f"unpublished: {', '.join(report.unpublished) or '-'}")
    console.print(
        f"{verb} {len(report.deleted_prefixes)} checkpoint prefix(es), "
        f"{len(report.deleted_token_snapshots)} token snapshot(s), "
        f"{len(report.deleted_token_shards)} token shard(s), {len(report.deleted_claims)} sequence "
        f"claim(s): {report.deleted_objects} object(s) in all"
    )
    for cid, age in sorted(report.leftovers_waiting.items()):
        console.print(f"leftover {cid}: seen {age:.0f} s ago, deleted after {min_age:.0f} s")
    for shard, age in sorted(report.token_shards_waiting.items()):
        console.print(f"unlisted token shard {shard}: seen {age:.0f} s ago")


def register(app: typer.Typer) -> None:
    """Add ``gc`` to ``app``."""
    app.command("gc", cls=Command)(gc_command)
