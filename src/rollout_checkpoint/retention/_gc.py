"""Retention: keep the last K published checkpoints and collect garbage crash-safely.

Three rules make every interruption harmless (``docs/protocol.md``, "Retention and garbage
collection"):

* **unpublish first, delete after**: an old checkpoint loses ``published/<id>.json`` before any
  of its objects go, so a crash in between leaves an unpublished leftover, never a published
  checkpoint with holes. The checkpoint ``latest.json`` names is never unpublished. Within a
  checkpoint every archive's ``manifest.json`` goes before the objects it names, so a crash
  leaves whole archives or objects no manifest claims, and ``verify`` still passes.
* **leftovers age before they go**: objects under ``checkpoints/<id>/`` with no published
  record may belong to a cycle still in flight. They are deleted only once this collector
  has seen them unpublished for ``min_age_s`` (recorded in ``gc/leftovers.json``, so the age
  survives restarts). A coordinator never publishes after its cycle deadline, so
  ``min_age_s`` longer than any deadline (plus clock skew) cannot delete a checkpoint that
  will still publish.
* **token data goes only when nothing retained can need it**: a checkpoint's token snapshot
  (``tokens/snapshots/<id>.json``) goes with the checkpoint; a token shard goes once no
  retained snapshot lists it, gc has seen it unlisted for ``min_age_s``, *and* a retained
  snapshot taken after gc first saw it unlisted exists (the token store indexed it and left it
  out, so it is not a shard written for the next checkpoint).

A published checkpoint references only objects under its own prefix plus its token snapshot,
the token shards that snapshot lists and one hop of base archives (``_reachability``), so none
of them is ever deleted while it is kept. A kept base's own bases are not kept for it: nothing
reads them, and ``verify`` checks an unpublished archive for what it stores only
(``docs/format.md``, "What retention keeps and what verify checks").
Sequence claims (``sequence/<n>.json``) of checkpoints that are gone are deleted too, except
the highest, which the next publish counts from.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import CheckpointError, ObjectExistsError, ObjectNotFoundError, VersionChangedError
from ..format import layout
from ..format.commit_log import claimed_sequences, list_published, read_claim, read_pointer_hint
from ..format.manifests import canonical_json
from ..store import ObjectStore, open_store
from ._reachability import referenced_prefixes, under_protected

__all__ = ["DEFAULT_MIN_AGE_S", "LEDGER_SCHEMA_VERSION", "GcReport", "collect_garbage"]

DEFAULT_MIN_AGE_S = 6 * 3600.0
"""Default age an unpublished leftover must reach before it is deleted (far above any cycle)."""

LEDGER_SCHEMA_VERSION = 2
"""``gc/leftovers.json``: 2 added ``token_shards``; a version 1 ledger is read as well."""


@dataclass
class GcReport:
    """What one :func:`collect_garbage` run did (or, with ``dry_run``, would do).

    ``deleted_objects`` counts every object deleted (checkpoint objects, token snapshots, token
    shards, sequence claims, records), the same in a dry run as in the real run that follows.
    """

    kept: list[str] = field(default_factory=list)
    unpublished: list[str] = field(default_factory=list)
    deleted_prefixes: list[str] = field(default_factory=list)
    deleted_objects: int = 0
    deleted_token_snapshots: list[str] = field(default_factory=list)
    deleted_token_shards: list[str] = field(default_factory=list)
    deleted_claims: list[int] = field(default_factory=list)
    leftovers_waiting: dict[str, float] = field(default_factory=dict)
    token_shards_waiting: dict[str, float] = field(default_factory=dict)
    referenced_prefixes: list[str] = field(default_factory=list)
    """Component archives of deleted checkpoints kept because a retained archive refers into
    them (format 2); they go once nothing retained names them."""
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "unpublished": self.unpublished,
            "deleted_prefixes": self.deleted_prefixes,
            "deleted_objects": self.deleted_objects,
            "deleted_token_snapshots": self.deleted_token_snapshots,
            "deleted_token_shards": self.deleted_token_shards,
            "deleted_claims": self.deleted_claims,
            "leftovers_waiting": self.leftovers_waiting,
            "token_shards_waiting": self.token_shards_waiting,
            "referenced_prefixes": self.referenced_prefixes,
            "dry_run": self.dry_run,
        }


@dataclass
class _Ledger:
    first_seen: dict[str, float]
    token_shards: dict[str, float]
    version: str | None
    exists: bool


def _checkpoint_ids(store: ObjectStore) -> set[str]:
    ids: set[str] = set()
    for info in store.list(layout.CHECKPOINTS_PREFIX):
        rest = info.key[len(layout.CHECKPOINTS_PREFIX) :]
        if "/" in rest:
            ids.add(rest.split("/", 1)[0])
    return ids


def _manifests_first(key: str) -> tuple[bool, int, str]:
    """Deletion order under a checkpoint prefix: every ``manifest.json`` first, outermost first
    (a component's manifest before its parts'), then every other object."""
    return (not key.endswith("/" + layout.MANIFEST_NAME), key.count("/"), key)


def _read_ledger(store: ObjectStore) -> _Ledger:
    try:
        info = store.stat(layout.GC_LEDGER_KEY)
        data = store.get(layout.GC_LEDGER_KEY)
    except ObjectNotFoundError:
        return _Ledger({}, {}, None, False)
    try:
        body = json.loads(data)
        seen = {str(k): float(v) for k, v in body["first_seen"].items()}
        shards = {str(k): float(v) for k, v in (body.get("token_shards") or {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        seen, shards = {}, {}  # an unreadable ledger restarts every clock: only ever later deletion
    return _Ledger(seen, shards, info.version, True)


def _write_ledger(store: ObjectStore, ledger: _Ledger) -> bool:
    data = canonical_json(
        {
            "schema_version": LEDGER_SCHEMA_VERSION,
            "first_seen": dict(sorted(ledger.first_seen.items())),
            "token_shards": dict(sorted(ledger.token_shards.items())),
        }
    )
    try:
        if ledger.exists:
            store.put_if_match(layout.GC_LEDGER_KEY, data, ledger.version or "")
        else:
            store.put_if_absent(layout.GC_LEDGER_KEY, data)
    except (VersionChangedError, ObjectExistsError, ObjectNotFoundError):
        return False  # another collector moved it: this run deletes nothing by age
    return True


def _snapshot_ids(store: ObjectStore, tokens_prefix: str) -> dict[str, str]:
    """checkpoint id -> key of every token snapshot manifest."""
    root = f"{tokens_prefix}/snapshots/"
    out: dict[str, str] = {}
    for info in store.list(root):
        name = info.key[len(root) :]
        if "/" not in name and name.endswith(".json"):
            out[name[: -len(".json")]] = info.key
    return out


def _shards_listed(store: ObjectStore, key: str) -> set[str] | None:
    """Token shards a snapshot lists; ``None`` when it cannot be read (then nothing is deleted)."""
    try:
        body = json.loads(store.get(key))
        return {str(e["shard"]) for e in body["entries"].values() if e.get("shard")}
    except ObjectNotFoundError:
        return set()
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def collect_garbage(
    url_or_store: str | ObjectStore,
    *,
    keep: int = 2,
    min_age_s: float = DEFAULT_MIN_AGE_S,
    now: Callable[[], float] = time.time,
    dry_run: bool = False,
    fault_hook: Callable[[str], None] | None = None,
    tokens_prefix: str = layout.TOKENS_PREFIX,
    **storage_options: Any,
) -> GcReport:
    """Keep the newest ``keep`` published checkpoints (and the one ``latest`` names), unpublish
    and delete the rest with their token snapshots, delete unpublished leftovers older than
    ``min_age_s``, token shards no retained snapshot lists, sequence claims of deleted
    checkpoints, and (on local disk) the folders left empty.

    ``fault_hook(step)`` runs before every delete and ledger write (crash tests). A dry run
    makes the same decisions and counts without changing anything.
    """
    if keep < 1:
        raise ValueError("keep must be at least 1")
    store = open_store(url_or_store, **storage_options)
    report = GcReport(dry_run=dry_run)
    tokens_prefix = tokens_prefix.strip("/")
    snapshots = _snapshot_ids(store, tokens_prefix)

    def step(name: str) -> None:
        if fault_hook is not None:
            fault_hook(name)

    def delete(keys: list[str]) -> None:
        for key in keys:
            if not dry_run:
                step(f"delete:{key}")
                store.delete(key)
        report.deleted_objects += len(keys)

    def delete_checkpoint(checkpoint_id: str) -> None:
        prefix = layout.checkpoint_prefix(checkpoint_id)
        keys = [info.key for info in store.list(prefix + "/")]
        kept = [k for k in keys if protected is None or under_protected(k, protected)]
        # every archive's manifest before the objects it names: a crash in between leaves objects
        # no manifest claims (a leftover the next collection deletes), never an archive with holes
        delete(sorted((k for k in keys if k not in set(kept)), key=_manifests_first))
        if kept:
            report.referenced_prefixes.extend(
                sorted({p for p in protected or () if p.startswith(prefix + "/")})
                or [prefix]  # nothing could be read: everything stays
            )
        if checkpoint_id in snapshots:
            delete([snapshots[checkpoint_id]])
            report.deleted_token_snapshots.append(checkpoint_id)
        if not dry_run:
            store.remove_empty_folders(prefix)
        report.deleted_prefixes.append(checkpoint_id)

    # 1. old published checkpoints: unpublish first, then delete their objects
    published = list_published(store)
    pointer = read_pointer_hint(store).pointer
    readable = [p for p in published if p.record is not None]
    keep_ids = {p.checkpoint_id for p in readable[:keep]}
    if pointer is not None:
        keep_ids.add(pointer.checkpoint_id)
    keep_ids.update(p.checkpoint_id for p in published if p.record is None)  # never guess
    report.kept = [p.checkpoint_id for p in published if p.checkpoint_id in keep_ids]
    # format 2: archives a retained (or possibly in-flight: a leftover not yet due) archive
    # refers into stay, whatever checkpoint they belong to; ``None`` (a manifest unreadable)
    # keeps every checkpoint object this run
    unpublished_ids = _checkpoint_ids(store) - {p.checkpoint_id for p in published}
    seen_before = _read_ledger(store).first_seen
    at = now()
    waiting_ids = {c for c in unpublished_ids if at - seen_before.get(c, at) < min_age_s}
    protected = referenced_prefixes(store, keep_ids | waiting_ids)
    for item in readable:
        if item.checkpoint_id in keep_ids:
            continue
        if not dry_run:
            step(f"unpublish:{item.checkpoint_id}")
            store.delete(layout.published_key(item.checkpoint_id))
        report.deleted_objects += 1
        report.unpublished.append(item.checkpoint_id)
        delete_checkpoint(item.checkpoint_id)

    # 2. unpublished leftovers (crashed or aborted cycles; maybe a cycle in flight): age them
    published_now = {p.checkpoint_id for p in list_published(store)} if not dry_run else keep_ids
    gone = set(report.deleted_prefixes)
    leftovers = (_checkpoint_ids(store) | set(snapshots)) - published_now - gone
    ledger = _read_ledger(store)
    clock = now()
    first_seen = {cid: ledger.first_seen.get(cid, clock) for cid in sorted(leftovers)}
    due = sorted(cid for cid, first in first_seen.items() if clock - first >= min_age_s)

    # 3. token shards no retained snapshot lists (retained: published or still-waiting leftovers)
    retained = (published_now | leftovers) - set(due)
    listed: set[str] | None = set()
    for cid in sorted(retained):
        if cid in snapshots and listed is not None:
            shards = _shards_listed(store, snapshots[cid])
            listed = None if shards is None else listed | shards
    newest_snapshot = max(
        (p.record.created_at.timestamp() for p in published if p.record and p.checkpoint_id in retained),
        default=float("-inf"),
    )
    shard_seen: dict[str, float] = {}
    if listed is not None:
        for info in store.list(f"{tokens_prefix}/shards/"):
            if info.key.endswith(".parquet") and info.key not in listed:
                shard_seen[info.key] = ledger.token_shards.get(info.key, clock)
    shards_due = sorted(
        s for s, first in shard_seen.items() if clock - first >= min_age_s and newest_snapshot > first
    )

    new_ledger = _Ledger(first_seen, shard_seen, ledger.version, ledger.exists)
    if not dry_run and (first_seen != ledger.first_seen or shard_seen != ledger.token_shards):
        step("ledger")
        if not _write_ledger(store, new_ledger):
            report.leftovers_waiting = {c: clock - t for c, t in first_seen.items()}
            report.token_shards_waiting = {s: clock - t for s, t in shard_seen.items()}
            return report
    for cid in due:
        if not dry_run and store.exists(layout.published_key(cid)):
            continue  # published meanwhile: it is not garbage
        delete_checkpoint(cid)
        del first_seen[cid]
    delete(shards_due)
    report.deleted_token_shards = shards_due
    for shard in shards_due:
        del shard_seen[shard]
    report.leftovers_waiting = {c: clock - t for c, t in first_seen.items()}
    report.token_shards_waiting = {s: clock - t for s, t in shard_seen.items()}

    # 4. sequence claims of checkpoints that are gone (never the highest: the next publish counts on it)
    claimed = claimed_sequences(store)
    alive = published_now | set(first_seen)
    for sequence in claimed[:-1]:
        try:
            claim = read_claim(store, sequence)
        except CheckpointError:
            continue  # unreadable: never guess
        if claim is not None and claim.checkpoint_id not in alive:
            delete([layout.sequence_key(sequence)])
            report.deleted_claims.append(sequence)

    if not dry_run and (due or shards_due):
        latest = _read_ledger(store)
        latest.first_seen = {c: t for c, t in latest.first_seen.items() if c not in set(due)}
        latest.token_shards = {s: t for s, t in latest.token_shards.items() if s not in set(shards_due)}
        step("ledger")
        _write_ledger(store, latest)
    return report
