"""CLI commands for published checkpoints: ``list`` and ``classify``.

Also registers a verifier so ``rollout-checkpoint verify`` checks every published checkpoint
end to end (record, aggregate, components, token snapshot).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from ..errors import CheckpointError, CheckpointNotFoundError, IntegrityError, ObjectNotFoundError
from ..format import layout
from ..format.commit_log import iter_candidates, list_published, pointer_note, read_latest, read_pointer_hint
from ..reader import RecoveryPlan, load_checkpoint, verify_checkpoint
from ..store import ObjectInfo, ObjectStore
from ._archive import Finding, refuse_folder_of_stores, register_verifier
from ._common import Command, EndpointOpt, JsonOpt, UrlArg, open_cli_store, print_table, styled
from ._common import console as _console
from ._common import fail as _fail
from ._progress import on_terminal, watched

__all__ = [
    "classify_command",
    "list_command",
    "register",
    "render_plan",
    "verify_latest_pointer",
    "verify_published_checkpoints",
]

CheckpointOpt = Annotated[
    str | None, typer.Option("--checkpoint", help="Checkpoint id (default: the latest published).")
]


def _open(url: str, endpoint_url: str | None) -> ObjectStore:
    return open_cli_store(url, endpoint_url)


# -- list ------------------------------------------------------------------------------------------


def list_command(url: UrlArg, endpoint_url: EndpointOpt = None, as_json: JsonOpt = False) -> None:
    """List published checkpoints under URL, newest first (the latest pointer's target marked)."""
    try:
        store = _open(url, endpoint_url)
        listed = list_published(store)
        if not listed:
            refuse_folder_of_stores(store)  # a folder of stores is not an empty store
        note = pointer_note(read_pointer_hint(store), next(iter_candidates(store), None)) if listed else None
    except CheckpointError as exc:
        raise _fail(exc, as_json) from None
    rows: list[dict[str, Any]] = []
    for item in listed:
        record = item.record
        rows.append(
            {
                "checkpoint_id": item.checkpoint_id,
                "latest": item.latest,
                "sequence": record.sequence if record else None,
                "run_id": record.run_id if record else None,
                "epoch": record.epoch if record else None,
                "created_at": record.created_at.isoformat() if record else None,
                "components": len(record.components) if record else None,
                "counts": record.counts if record else None,
                "token_snapshot": record.token_snapshot is not None if record else None,
                "error": item.error,
            }
        )
    if as_json:
        print(json.dumps({"ok": True, "url": url, "checkpoints": rows, "note": note}))
        return
    console = _console()
    if not rows:
        console.print(f"no published checkpoint under {url}")
        return
    # ids and times never wrap; the registry states fold into what is left of the terminal
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, caption="* = named by latest.json")
    table.add_column("", no_wrap=True)
    table.add_column("seq", justify="right", no_wrap=True)
    table.add_column("checkpoint", no_wrap=True)
    table.add_column("run/epoch", no_wrap=True)
    table.add_column("created (UTC)", no_wrap=True)
    table.add_column("states", overflow="fold", ratio=1)
    for row in rows:
        states = ", ".join(f"{k}={v}" for k, v in (row["counts"] or {}).items())
        created = row["created_at"][:19].replace("T", " ") if row["created_at"] else None
        table.add_row(
            "*" if row["latest"] else "",
            str(row["sequence"] or "?"),
            row["checkpoint_id"],
            f"{row['run_id']}/{row['epoch']}" if row["epoch"] else "-",
            created or styled(("unreadable", "red")),
            states or styled((str(row["error"] or "-"), "red")),
        )
    print_table(console, table)
    if note is not None:
        console.print(styled(("note", "yellow"), f" {note}"))


# -- classify --------------------------------------------------------------------------------------


def render_plan(plan: RecoveryPlan, console: Console, limit: int) -> None:
    counts = plan.counts()
    for skipped in plan.skipped:
        console.print(
            styled(("skipped", "yellow"), f" {skipped.checkpoint_id} ({skipped.code}): {skipped.reason}")
        )
    for note in plan.notes:
        console.print(styled(("note", "yellow"), f" {note}"))
    checked = (
        f"verified {plan.verified.objects} objects ({plan.verified.bytes_verified} bytes)"
        if plan.verified is not None
        else "no shard payload"
    )
    console.print(
        styled(
            "checkpoint ",
            (plan.checkpoint_id, "bold"),
            f" (sequence {plan.record.sequence}"
            + (f", run {plan.record.run_id} epoch {plan.record.epoch}" if plan.record.epoch else "")
            + f"): {len(plan.rollouts)} dispatched executions; "
            f"read {plan.bytes_read} bytes ({plan.keys_read} objects) in {plan.seconds:.3f}s, {checked}",
        )
    )
    summary = Table("disposition", "rollouts")
    for name, n in counts.items():
        summary.add_row(name, str(n))
    print_table(console, summary)
    shown = list(plan.rollouts.values())[: max(limit, 0)]
    if shown:  # no empty frame: --limit 0 (or no rollout) prints the summary alone
        table = Table("rollout", "attempt", "disposition", "next attempt", "reason")
        for item in shown:
            table.add_row(
                item.rollout_id, str(item.attempt), item.disposition, str(item.next_attempt), item.reason
            )
        print_table(console, table)
    hidden = len(plan.rollouts) - len(shown)
    if hidden:
        more = "more " if shown else ""
        console.print(f"... {hidden} {more}rollout(s) not listed (--limit N or -1 for all, or --json)")


def classify_command(
    url: UrlArg,
    checkpoint: CheckpointOpt = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Also check the length and sha256 of every object the plan depends on (shards, "
            "indexes, token data); exit 1 naming anything missing or altered.",
        ),
    ] = False,
    fallback: Annotated[
        bool,
        typer.Option(
            "--fallback",
            help="When the checkpoint is rejected as damaged, use the newest older one that loads "
            "(with --verify: that verifies) and say which were skipped and why.",
        ),
    ] = False,
    endpoint_url: EndpointOpt = None,
    as_json: JsonOpt = False,
    limit: Annotated[
        int, typer.Option("--limit", help="Rows of the per-rollout table (-1: all of them).")
    ] = 50,
) -> None:
    """Classify every dispatched rollout of a published checkpoint: completed / continue / fresh_dispatch.

    Exit 1 with the reason when the checkpoint is rejected, fails --verify, or none is published.
    """
    try:
        shown = verify and on_terminal(as_json)  # without --verify only manifests and indexes are read
        with watched(_open(url, endpoint_url), "verifying", enabled=shown) as store:
            try:
                plan = load_checkpoint(store, checkpoint, verify=verify, fallback=fallback)
            except CheckpointNotFoundError:
                if not store.list(layout.PUBLISHED_PREFIX):  # a folder of stores says so
                    refuse_folder_of_stores(store)
                raise
    except CheckpointError as exc:
        raise _fail(exc, as_json) from None
    if as_json:
        print(json.dumps({"ok": True, **plan.to_json()}))
    else:
        render_plan(plan, _console(), len(plan.rollouts) if limit < 0 else limit)


# -- verify: published checkpoints -------------------------------------------------------------------


def verify_published_checkpoints(store: ObjectStore, listing: Sequence[ObjectInfo]) -> Iterator[Finding]:
    """Every published checkpoint loads, classifies and passes full digest verification."""
    ids = sorted(
        info.key[len("published/") : -len(".json")]
        for info in listing
        if info.key.startswith("published/") and info.key.endswith(".json") and info.key.count("/") == 1
    )
    for cid in ids:
        subject = f"published/{cid}.json"
        try:
            report = verify_checkpoint(store, cid)
        except CheckpointError as exc:
            yield Finding(subject, False, exc.message, exc.code, dict(exc.details))
        else:
            counts = ", ".join(f"{k} {v}" for k, v in report.counts.items())
            yield Finding(
                subject,
                True,
                f"checkpoint {cid}: {report.components} components, "
                f"{report.objects} objects intact ({counts})",
            )


def verify_latest_pointer(store: ObjectStore, listing: Sequence[ObjectInfo]) -> Iterator[Finding]:
    """``latest.json``: it parses, names a published checkpoint, and pins exactly that record's
    bytes. A stale pointer (an older checkpoint than the newest published) is reported but not
    a failure: readers order by the sequence claims, the pointer is only a hint."""
    keys = {info.key for info in listing}
    if layout.LATEST_KEY not in keys:
        if any(key.startswith("published/") for key in keys):  # noted, as classify notes it
            yield Finding(
                layout.LATEST_KEY,
                True,
                f"{layout.LATEST_KEY} is missing: a hint only (readers order by the sequence claims); "
                "the next checkpoint writes it again",
            )
        return
    subject = layout.LATEST_KEY
    try:
        found = read_latest(store)
    except CheckpointError as exc:
        if exc.code not in ("invalid_record", "unsupported_schema"):
            raise
        yield Finding(subject, False, exc.message, exc.code, dict(exc.details))
        return
    if found is None:
        return
    pointer = found[0]
    try:
        data = store.get(pointer.record.key)
    except ObjectNotFoundError:
        yield Finding(
            subject, False, f"names {pointer.checkpoint_id}, which is not published", "integrity_error"
        )
        return
    try:
        if pointer.record.key != layout.published_key(pointer.checkpoint_id):
            raise IntegrityError(f"names {pointer.checkpoint_id} but points at {pointer.record.key}")
        pointer.record.check(data)
    except CheckpointError as exc:
        yield Finding(subject, False, f"does not match the record it names: {exc.message}", exc.code)
        return
    newest = next(iter_candidates(store), None)
    if newest is not None and newest.checkpoint_id != pointer.checkpoint_id:
        yield Finding(
            subject,
            True,
            f"a stale hint: names {pointer.checkpoint_id} (sequence {pointer.sequence}); the newest "
            f"published is {newest.checkpoint_id} (sequence {newest.sequence}), which readers use",
        )
        return
    yield Finding(subject, True, f"names {pointer.checkpoint_id} (sequence {pointer.sequence}), intact")


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app`` and the published-checkpoint verifier to ``verify``."""
    register_verifier(verify_published_checkpoints)
    register_verifier(verify_latest_pointer)
    app.command("list", cls=Command)(list_command)
    app.command("classify", cls=Command)(classify_command)
