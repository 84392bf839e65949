"""CLI commands for the archive layer: ``inspect`` and ``verify``.

``verify`` runs every function in :data:`VERIFIERS` over one listing of the store; later layers
(aggregate manifests, published records, the latest pointer) add theirs with
:func:`register_verifier` instead of editing this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from ..archive import component_prefixes
from ..errors import CheckpointError, IntegrityError, NotAStoreError, ObjectNotFoundError
from ..format.layout import (
    CHECKPOINTS_PREFIX,
    LATEST_KEY,
    MANIFEST_NAME,
    PARTS_DIR,
    PUBLISHED_PREFIX,
    SEQUENCE_PREFIX,
)
from ..format.record_reader import ArchiveReader
from ..store import ObjectInfo, ObjectStore
from ._common import Command, EndpointOpt, JsonOpt, UrlArg, open_cli_store, print_table, styled
from ._common import console as _console
from ._common import fail as _fail
from ._progress import on_terminal, watched

__all__ = [
    "VERIFIERS",
    "Finding",
    "Verifier",
    "inspect_store",
    "register",
    "refuse_folder_of_stores",
    "register_verifier",
    "stores_within",
    "verify_component_archives",
    "verify_store",
]


@dataclass(frozen=True)
class Finding:
    """One verification result: ``subject`` is the object key (or archive prefix) it is about."""

    subject: str
    ok: bool
    message: str
    code: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


Verifier = Callable[[ObjectStore, Sequence[ObjectInfo]], Iterable[Finding]]
"""Checks one store, given one fresh listing of it; yields a finding per thing it checked."""


def _component_keys(reader: ArchiveReader) -> set[str]:
    keys = {reader.key_of(MANIFEST_NAME), reader.key_of(reader.manifest.index.key)}
    keys.update(reader.key_of(s.key) for s in reader.manifest.shards)
    if reader.manifest.references is not None:  # format 2: the reference table
        keys.add(reader.key_of(reader.manifest.references.key))
    return keys


def _under(prefix: str, key: str) -> bool:
    return not prefix or key.startswith(prefix + "/")


def _published_ids(listing: Sequence[ObjectInfo]) -> set[str]:
    return {
        info.key[len(PUBLISHED_PREFIX) : -len(".json")]
        for info in listing
        if info.key.startswith(PUBLISHED_PREFIX) and info.key.endswith(".json") and info.key.count("/") == 1
    }


def _unpublished_checkpoint(prefix: str, published: set[str]) -> str | None:
    """The checkpoint id when archive ``prefix`` lies under ``checkpoints/<id>/`` of a checkpoint
    that is not published (a base kept for a published one, or a leftover); else ``None``."""
    if not prefix.startswith(CHECKPOINTS_PREFIX):
        return None
    cid = prefix[len(CHECKPOINTS_PREFIX) :].split("/", 1)[0]
    return None if cid in published else cid


def _stored_problems(reader: ArchiveReader) -> list[IntegrityError]:
    """The problems of what an archive stores itself: shards, member index, reference table."""
    problems = reader.check_stored()
    if reader.manifest.references is not None and not problems:
        try:
            reader.references()  # the table's length and SHA-256, its rows against the manifest
        except IntegrityError as exc:
            problems.append(exc)
    return problems


def _collected_meanwhile(subject: str) -> Finding:
    """An unpublished archive whose manifest went after the listing: a collection (``gc``) running
    beside this ``verify`` deleted it, manifest first; not damage."""
    return Finding(subject, True, "deleted while verify ran (a collection in progress): not checked")


def verify_component_archives(store: ObjectStore, listing: Sequence[ObjectInfo]) -> Iterator[Finding]:
    """Every component archive: its manifest parses, every shard and the index match their
    recorded length and SHA-256 (streamed), and the index agrees with the manifest.

    An archive of a published checkpoint (or one outside ``checkpoints/``) is checked whole, the
    bases it refers into included. An archive under an unpublished checkpoint's prefix (a base
    retention keeps because a retained archive refers into it, or a leftover of a cycle that
    never published) is checked for what it stores itself: no reader reads it but through a
    published checkpoint, which reads only those objects of it (references are flattened), so
    its own bases may be gone (``docs/format.md``, "What retention keeps and what verify checks").
    """
    published = _published_ids(listing)
    for prefix in component_prefixes(info.key for info in listing):
        subject = f"{prefix}/{MANIFEST_NAME}" if prefix else MANIFEST_NAME
        unpublished = _unpublished_checkpoint(prefix, published)
        try:
            reader = ArchiveReader.open(store, prefix)
        except CheckpointError as exc:
            if unpublished is not None and isinstance(exc, ObjectNotFoundError):
                yield _collected_meanwhile(subject)
                continue
            yield Finding(subject, False, exc.message, exc.code, exc.details)
            continue
        problems = reader.check() if unpublished is None else _stored_problems(reader)
        if problems and unpublished is not None and not store.exists(subject):
            yield _collected_meanwhile(subject)  # a collection deleted it after its manifest
            continue
        for problem in problems:
            key = str(problem.details.get("key", subject))
            yield Finding(key, False, problem.message, problem.code, problem.details)
        if not problems:
            m = reader.manifest
            note = "" if unpublished is None else " (not published: the objects it stores, not its bases)"
            yield Finding(
                subject,
                True,
                f"{m.participant_kind}/{m.instance} of {m.checkpoint_id}: {len(m.shards)} shards, "
                f"{m.total_records} records, {m.total_bytes} bytes intact{note}",
            )


VERIFIERS: list[Verifier] = [verify_component_archives]


def register_verifier(verifier: Verifier) -> Verifier:
    """Add a check to ``rollout-checkpoint verify`` (usable as a decorator)."""
    if verifier not in VERIFIERS:
        VERIFIERS.append(verifier)
    return verifier


_STORE_TOP = (CHECKPOINTS_PREFIX, PUBLISHED_PREFIX, SEQUENCE_PREFIX)


def stores_within(keys: Iterable[str]) -> list[str]:
    """Folders among ``keys`` that are checkpoint stores themselves, when the root is not one:
    a folder is a store when it holds ``latest.json``, ``published/<id>.json`` or
    ``sequence/<n>.json``; nested stores (a store inside a store's folder) are not listed.
    Empty when the root is a store, or when no store lies below it."""
    roots: set[str] = set()
    for key in keys:
        if key == LATEST_KEY or key.startswith(_STORE_TOP):
            return []  # the root is a store (or what is left of one)
        parts = key.split("/")
        for i in range(1, len(parts)):
            rest = parts[i:]
            if rest == [LATEST_KEY] or (
                len(rest) == 2
                and f"{rest[0]}/" in (PUBLISHED_PREFIX, SEQUENCE_PREFIX)
                and rest[1].endswith(".json")
            ):
                roots.add("/".join(parts[:i]))
                break
    return sorted(r for r in roots if not any(r.startswith(o + "/") for o in roots))


def refuse_folder_of_stores(store: ObjectStore, listing: Sequence[ObjectInfo] | None = None) -> None:
    """``NotAStoreError`` naming the stores when ``store`` is a folder that holds stores
    (``listing``: the whole store's, when the caller has it)."""
    stores = stores_within(info.key for info in (store.list("") if listing is None else listing))
    if stores:
        shown = ", ".join(f"{name}/" for name in stores[:_NAMED_STORES])
        more = f" and {len(stores) - _NAMED_STORES} more" if len(stores) > _NAMED_STORES else ""
        raise NotAStoreError(
            f"{store.url}: not a checkpoint store; it holds the stores {shown}{more} (name one of them)",
            url=store.url,
            stores=stores,
        )


_NAMED_STORES = 8


def verify_store(store: ObjectStore) -> list[Finding]:
    """Run every registered verifier over one listing of ``store`` (``NotAStoreError`` when it
    is a folder that holds checkpoint stores rather than a store)."""
    listing = store.list("")
    refuse_folder_of_stores(store, listing)
    findings: list[Finding] = []
    for verifier in VERIFIERS:
        findings.extend(verifier(store, listing))
    return findings


def inspect_store(store: ObjectStore) -> dict[str, Any]:
    """What is stored: each component archive (from its manifest) and every other object."""
    listing = store.list("")
    sizes = {info.key: info.size for info in listing}
    claimed: set[str] = set()
    components: list[dict[str, Any]] = []
    prefixes = component_prefixes(info.key for info in listing)
    known = set(prefixes)

    def nested(prefix: str, key: str) -> bool:
        """``key`` belongs to one of ``prefix``'s parts (an archive of its own), not to ``prefix``."""
        head = f"{prefix}/{PARTS_DIR}/" if prefix else f"{PARTS_DIR}/"
        return key.startswith(head) and head + key[len(head) :].split("/", 1)[0] in known

    for prefix in prefixes:
        entry: dict[str, Any] = {"prefix": prefix, "manifest_key": f"{prefix}/{MANIFEST_NAME}".lstrip("/")}
        try:
            reader = ArchiveReader.open(store, prefix)
        except CheckpointError as exc:
            entry["error"] = exc.to_dict()
            claimed.add(entry["manifest_key"])
            components.append(entry)
            continue
        m = reader.manifest
        referenced = _component_keys(reader)
        claimed.update(referenced)
        unreferenced = [
            k
            for k in sizes
            if _under(prefix, k) and k not in referenced and k != MANIFEST_NAME and not nested(prefix, k)
        ]
        entry.update(
            checkpoint_id=m.checkpoint_id,
            participant_kind=m.participant_kind,
            instance=m.instance,
            writer_id=m.writer_id,
            created_at=m.created_at,
            manifest_bytes=reader.manifest_ref.bytes,
            manifest_sha256=reader.manifest_ref.sha256,
            shards=[
                {
                    "key": reader.key_of(s.key),
                    "bytes": s.bytes,
                    "records": s.records,
                    "row_groups": s.row_groups,
                }
                for s in m.shards
            ],
            shard_bytes=sum(s.bytes for s in m.shards),
            index={"key": reader.key_of(m.index.key), "bytes": m.index.bytes, "rows": m.index.rows},
            records=m.total_records,
            record_counts=m.record_counts,
            missing=sorted(k for k in referenced if k not in sizes),
            unreferenced=sorted(unreferenced),
            extra_keys=sorted(m.extra),
            error=None,
        )
        claimed.update(unreferenced)
        components.append(entry)
    others = [{"key": k, "size": v} for k, v in sizes.items() if k not in claimed]
    return {
        "url": store.url,
        "objects": len(listing),
        "bytes": sum(sizes.values()),
        "components": components,
        "other_objects": others,
    }


# -- rendering ---------------------------------------------------------------------------------


def _fmt_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _render_inspect(report: dict[str, Any], console: Console) -> None:
    console.print(
        styled((report["url"], "bold"), f": {report['objects']} objects, {_fmt_bytes(report['bytes'])}")
    )
    # One table per folder of archives (``checkpoints/<id>/components``), naming each archive by
    # its last two path segments, so no column holds a long key and the table fits the terminal.
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in report["components"]:
        head, _, tail = c["prefix"].rpartition("/")
        head, _, kind = head.rpartition("/")
        groups.setdefault(head, []).append({**c, "_name": f"{kind}/{tail}".strip("/") or "(root)"})
    for head, members in groups.items():
        table = Table(
            title=f"Component archives under {head or '(root)'}/", title_justify="left", box=box.SIMPLE_HEAD
        )
        table.add_column("archive", overflow="fold")
        for col in ("shards", "records", "size"):
            table.add_column(col, justify="right", no_wrap=True)
        table.add_column("record counts", overflow="fold", ratio=1)
        for c in members:
            if c.get("error"):
                table.add_row(c["_name"], "-", "-", "-", styled((c["error"]["message"], "red")))
                continue
            counts = ", ".join(f"{k}={v}" for k, v in c["record_counts"].items()) or "-"
            notes: list[str | tuple[str, str]] = [counts]
            if c["missing"]:
                notes.append((f"; {len(c['missing'])} missing", "red"))
            if c["unreferenced"]:
                notes.append((f"; {len(c['unreferenced'])} unreferenced", "yellow"))
            table.add_row(
                c["_name"],
                str(len(c["shards"])),
                str(c["records"]),
                _fmt_bytes(c["shard_bytes"] + c["index"]["bytes"] + c["manifest_bytes"]),
                styled(*notes),
            )
        print_table(console, table)
    if report["other_objects"]:
        table = Table(title="Other objects", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("key", overflow="fold")
        table.add_column("size", justify="right")
        for o in report["other_objects"]:
            table.add_row(o["key"], _fmt_bytes(o["size"]))
        print_table(console, table)
    if not report["components"] and not report["other_objects"]:
        console.print("nothing stored here")


def inspect_command(url: UrlArg, endpoint_url: EndpointOpt = None, as_json: JsonOpt = False) -> None:
    """Show what is stored under URL: component archives (shards, sizes, counts) and other objects."""
    try:
        with watched(open_cli_store(url, endpoint_url), "inspecting", enabled=on_terminal(as_json)) as store:
            report = inspect_store(store)
    except CheckpointError as exc:
        raise _fail(exc, as_json) from None
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _render_inspect(report, _console())


def verify_command(url: UrlArg, endpoint_url: EndpointOpt = None, as_json: JsonOpt = False) -> None:
    """Verify every manifest and digest under URL; exit 1 naming any missing, truncated or altered object."""
    try:
        with watched(open_cli_store(url, endpoint_url), "verifying", enabled=on_terminal(as_json)) as store:
            findings = verify_store(store)
    except CheckpointError as exc:
        raise _fail(exc, as_json) from None
    bad = [f for f in findings if not f.ok]
    ok = bool(findings) and not bad
    if as_json:
        print(json.dumps({"ok": ok, "checked": len(findings), "findings": [asdict(f) for f in findings]}))
    else:
        console = _console()
        err = _console(stderr=True)
        for f in findings:
            if f.ok:
                console.print(styled(("ok", "green"), f"     {f.subject}: {f.message}"))
            else:
                text = f.message if f.message.startswith(f.subject) else f"{f.subject}: {f.message}"
                err.print(styled(("FAILED", "red"), f" {text}"))
        if not findings:
            err.print(styled(("FAILED", "red"), f" nothing to verify under {url}: no manifest found"))
        elif bad:
            err.print(styled((f"{len(bad)} problem(s)", "red")))
        else:
            console.print(f"all {len(findings)} checked intact")
    if not ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("inspect", cls=Command)(inspect_command)
    app.command("verify", cls=Command)(verify_command)
