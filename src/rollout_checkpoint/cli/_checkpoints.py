"""CLI commands for published checkpoints: ``list`` and ``classify``.

Also registers a verifier so ``rollout-checkpoint verify`` checks every published checkpoint
end to end (record, aggregate, components, token snapshot).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ..errors import CheckpointError
from ..manifests import list_published
from ..recovery import RecoveryPlan, load_checkpoint, verify_checkpoint
from ..store import ObjectInfo, ObjectStore
from ._archive import Finding, register_verifier
from ._common import EndpointOpt, JsonOpt, UrlArg, open_cli_store
from ._common import console as _console
from ._common import fail as _fail

__all__ = [
    "classify_command",
    "list_command",
    "register",
    "render_plan",
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
        listed = list_published(_open(url, endpoint_url))
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
                "created_at": record.created_at.isoformat() if record else None,
                "components": len(record.components) if record else None,
                "counts": record.counts if record else None,
                "token_snapshot": record.token_snapshot is not None if record else None,
                "error": item.error,
            }
        )
    if as_json:
        print(json.dumps({"ok": True, "url": url, "checkpoints": rows}))
        return
    console = _console()
    if not rows:
        console.print(f"no published checkpoint under {url}")
        return
    table = Table("", "checkpoint", "seq", "created (UTC)", "components", "registry states")
    for row in rows:
        states = ", ".join(f"{k}={v}" for k, v in (row["counts"] or {}).items())
        table.add_row(
            "latest" if row["latest"] else "",
            row["checkpoint_id"],
            str(row["sequence"] or "?"),
            row["created_at"] or f"[red]{row['error']}[/]",
            str(row["components"] or "?"),
            states,
        )
    console.print(table)


# -- classify --------------------------------------------------------------------------------------


def render_plan(plan: RecoveryPlan, console: Console, limit: int) -> None:
    counts = plan.counts()
    console.print(
        f"checkpoint [bold]{plan.checkpoint_id}[/] (sequence {plan.record.sequence}): "
        f"{len(plan.rollouts)} dispatched executions; read {plan.bytes_read} bytes "
        f"({plan.keys_read} objects) in {plan.seconds:.3f}s, no shard payload"
    )
    summary = Table("disposition", "rollouts")
    for name, n in counts.items():
        summary.add_row(name, str(n))
    console.print(summary)
    table = Table("rollout", "attempt", "disposition", "next attempt", "reason")
    for item in list(plan.rollouts.values())[:limit]:
        table.add_row(
            item.rollout_id, str(item.attempt), item.disposition, str(item.next_attempt), item.reason
        )
    console.print(table)
    if len(plan.rollouts) > limit:
        console.print(f"... {len(plan.rollouts) - limit} more (use --json for all)")


def classify_command(
    url: UrlArg,
    checkpoint: CheckpointOpt = None,
    endpoint_url: EndpointOpt = None,
    as_json: JsonOpt = False,
    limit: Annotated[int, typer.Option("--limit", help="Rows of the per-rollout table.")] = 50,
) -> None:
    """Classify every dispatched rollout of a published checkpoint: completed / continue / fresh_dispatch.

    Exit 1 with the reason when the checkpoint is rejected (or none is published).
    """
    try:
        plan = load_checkpoint(_open(url, endpoint_url), checkpoint)
    except CheckpointError as exc:
        raise _fail(exc, as_json) from None
    if as_json:
        print(json.dumps({"ok": True, **plan.to_json()}))
    else:
        render_plan(plan, _console(), limit)


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


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app`` and the published-checkpoint verifier to ``verify``."""
    register_verifier(verify_published_checkpoints)
    app.command("list")(list_command)
    app.command("classify")(classify_command)
