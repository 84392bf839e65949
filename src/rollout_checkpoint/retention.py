"""Retention: keep the last K published checkpoints and collect garbage crash-safely.

Two rules make every interruption harmless (``docs/protocol.md``, "Retention and garbage
collection"):

* **unpublish first, delete after**: an old checkpoint loses ``published/<id>.json`` before any
  of its objects go, so a crash in between leaves an unpublished leftover, never a published
  checkpoint with holes. The checkpoint ``latest.json`` names is never unpublished.
* **leftovers age before they go**: objects under ``checkpoints/<id>/`` with no published
  record may belong to a cycle still in flight. They are deleted only once this collector
  has seen them unpublished for ``min_age_s`` (recorded in ``gc/leftovers.json``, so the age
  survives restarts). A coordinator never publishes after its cycle deadline, so
  ``min_age_s`` longer than any deadline (plus clock skew) cannot delete a checkpoint that
  will still publish.

A published checkpoint references only objects under its own prefix (the global record's
schema enforces it), so deleting whole prefixes of unpublished ids never removes an object a
published checkpoint needs. The token store (``tokens/``) is not touched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import layout
from .errors import ObjectExistsError, ObjectNotFoundError, VersionChangedError
from .manifests import canonical_json, read_latest
from .published import list_published
from .store import ObjectStore, open_store

__all__ = ["DEFAULT_MIN_AGE_S", "GcReport", "collect_garbage"]

DEFAULT_MIN_AGE_S = 6 * 3600.0
"""Default age an unpublished leftover must reach before it is deleted (far above any cycle)."""


@dataclass
class GcReport:
    """What one :func:`collect_garbage` run did (or, with ``dry_run``, would do)."""

    kept: list[str] = field(default_factory=list)
    unpublished: list[str] = field(default_factory=list)
    deleted_prefixes: list[str] = field(default_factory=list)
    deleted_objects: int = 0
    leftovers_waiting: dict[str, float] = field(default_factory=dict)
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "unpublished": self.unpublished,
            "deleted_prefixes": self.deleted_prefixes,
            "deleted_objects": self.deleted_objects,
            "leftovers_waiting": self.leftovers_waiting,
            "dry_run": self.dry_run,
        }


def _checkpoint_ids(store: ObjectStore) -> set[str]:
    ids: set[str] = set()
    for info in store.list(layout.CHECKPOINTS_PREFIX):
        rest = info.key[len(layout.CHECKPOINTS_PREFIX) :]
        if "/" in rest:
            ids.add(rest.split("/", 1)[0])
    return ids


def _read_ledger(store: ObjectStore) -> tuple[dict[str, float], str | None, bool]:
    """``first_seen`` per leftover id, the version read, and whether the ledger exists."""
    try:
        info = store.stat(layout.GC_LEDGER_KEY)
        data = store.get(layout.GC_LEDGER_KEY)
    except ObjectNotFoundError:
        return {}, None, False
    try:
        body = json.loads(data)
        seen = {str(k): float(v) for k, v in body["first_seen"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        seen = {}  # an unreadable ledger restarts every clock: only ever later deletion
    return seen, info.version, True


def _write_ledger(store: ObjectStore, seen: dict[str, float], version: str | None, exists: bool) -> bool:
    data = canonical_json({"schema_version": 1, "first_seen": dict(sorted(seen.items()))})
    try:
        if exists:
            store.put_if_match(layout.GC_LEDGER_KEY, data, version or "")
        else:
            store.put_if_absent(layout.GC_LEDGER_KEY, data)
    except (VersionChangedError, ObjectExistsError, ObjectNotFoundError):
        return False  # another collector moved it: this run deletes nothing by age
    return True


def collect_garbage(
    url_or_store: str | ObjectStore,
    *,
    keep: int = 2,
    min_age_s: float = DEFAULT_MIN_AGE_S,
    now: Callable[[], float] = time.time,
    dry_run: bool = False,
    fault_hook: Callable[[str], None] | None = None,
    **storage_options: Any,
) -> GcReport:
    """Keep the newest ``keep`` published checkpoints (and the one ``latest`` names), unpublish
    and delete the rest, and delete unpublished leftovers older than ``min_age_s``.

    ``fault_hook(step)`` runs before every delete and ledger write (crash tests).
    """
    if keep < 1:
        raise ValueError("keep must be at least 1")
    store = open_store(url_or_store, **storage_options)
    report = GcReport(dry_run=dry_run)

    def step(name: str) -> None:
        if fault_hook is not None:
            fault_hook(name)

    def delete_prefix(checkpoint_id: str) -> None:
        objects = store.list(layout.checkpoint_prefix(checkpoint_id) + "/")
        for info in objects:
            if not dry_run:
                step(f"delete:{info.key}")
                store.delete(info.key)
        report.deleted_objects += len(objects)
        report.deleted_prefixes.append(checkpoint_id)

    # 1. old published checkpoints: unpublish first, then delete their objects
    published = list_published(store)
    pointer = read_latest(store)
    latest_id = pointer[0].checkpoint_id if pointer is not None else None
    readable = [p for p in published if p.record is not None]
    keep_ids = {p.checkpoint_id for p in readable[:keep]}
    if latest_id is not None:
        keep_ids.add(latest_id)
    keep_ids.update(p.checkpoint_id for p in published if p.record is None)  # never guess
    report.kept = [p.checkpoint_id for p in published if p.checkpoint_id in keep_ids]
    for item in readable:
        if item.checkpoint_id in keep_ids:
            continue
        if not dry_run:
            step(f"unpublish:{item.checkpoint_id}")
            store.delete(layout.published_key(item.checkpoint_id))
        report.unpublished.append(item.checkpoint_id)
        delete_prefix(item.checkpoint_id)

    # 2. unpublished leftovers (crashed or aborted cycles; maybe a cycle in flight): age them
    published_now = {p.checkpoint_id for p in list_published(store)} if not dry_run else keep_ids
    leftovers = _checkpoint_ids(store) - published_now - set(report.deleted_prefixes)
    seen, version, exists = _read_ledger(store)
    clock = now()
    ledger = {cid: seen.get(cid, clock) for cid in sorted(leftovers)}
    due = sorted(cid for cid, first in ledger.items() if clock - first >= min_age_s)
    if dry_run:
        report.deleted_prefixes.extend(due)
        report.leftovers_waiting = {c: clock - t for c, t in ledger.items() if c not in due}
        return report
    if ledger != seen:
        step("ledger")
        if not _write_ledger(store, ledger, version, exists):
            report.leftovers_waiting = {c: clock - t for c, t in ledger.items()}
            return report
    for cid in due:
        if store.exists(layout.published_key(cid)):
            continue  # published meanwhile: it is not garbage
        delete_prefix(cid)
        del ledger[cid]
    report.leftovers_waiting = {c: clock - t for c, t in ledger.items()}
    if due:
        seen2, version2, exists2 = _read_ledger(store)
        remaining = {c: t for c, t in seen2.items() if c not in set(due)}
        step("ledger")
        _write_ledger(store, remaining, version2, exists2)
    return report
